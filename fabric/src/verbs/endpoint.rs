//! The set-up message of a data channel over RDMA verbs: what each side tells the other of
//! its queue pair and pool arena (docs/protocol.md section 10). Sans-IO; fuzzed
//! (`verbs_endpoint`).
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `SNVB` |
//! | 4 | 2 | version (1) |
//! | 6 | 2 | reserved, zero |
//! | 8 | 4 | queue pair number (24 bits) |
//! | 12 | 4 | first packet sequence number (24 bits) |
//! | 16 | 16 | GID of the sender's port |
//! | 32 | 4 | active MTU of the sender's port (`enum ibv_mtu`, 1..=5) |
//! | 36 | 4 | reserved, 0 (each pool's key comes in a key notice; ignored) |
//! | 40 | 8 | address of the arena's first byte |
//! | 48 | 8 | bytes of the arena |
//! | 56 | 4 | bytes of each posted receive (the largest SEND the sender takes) |
//! | 60 | 4 | receives the sender keeps posted |
//!
//! All fields big-endian, as everywhere in the protocol.

use thiserror::Error;

/// Bytes of an [`Endpoint`] on the wire.
pub const ENDPOINT_LEN: usize = 64;
/// Its magic.
pub const MAGIC: [u8; 4] = *b"SNVB";
/// Its version.
pub const VERSION: u16 = 1;
/// Smallest receive buffer a side may announce: room for any data-channel message but the
/// largest credit updates (which the sender then refuses to send).
pub const MIN_RECV_BUF: u32 = 1024;
/// Largest receive buffer a side may announce.
pub const MAX_RECV_BUF: u32 = 1 << 20;
/// Most receives a side may say it keeps posted.
pub const MAX_RECV_DEPTH: u32 = 4096;

/// One side's queue pair and pool arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number this side sends.
    pub psn: u32,
    /// GID of this side's port.
    pub gid: [u8; 16],
    /// Active MTU of this side's port (`enum ibv_mtu`).
    pub mtu: u32,
    /// Reserved, 0: each pool's key comes in a key notice (`KeyNotice`); a receiver
    /// ignores it.
    pub rkey: u32,
    /// Address of the arena's first byte.
    pub arena_addr: u64,
    /// Bytes of the arena.
    pub arena_len: u64,
    /// Bytes of each posted receive.
    pub recv_buf: u32,
    /// Receives kept posted.
    pub recv_depth: u32,
}

/// A set-up message this side refuses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointError {
    /// Not `ENDPOINT_LEN` bytes.
    #[error("RDMA set-up of {0} bytes, not {ENDPOINT_LEN}")]
    Length(usize),
    /// Wrong magic.
    #[error("not an RDMA set-up (magic {0:02x?})")]
    Magic([u8; 4]),
    /// A version this side does not speak.
    #[error("RDMA set-up version {0}, this side speaks {VERSION}")]
    Version(u16),
    /// A field out of its range.
    #[error("RDMA set-up field {field} = {value} is out of range")]
    Field {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

impl Endpoint {
    /// Encodes the message.
    pub fn emit(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b[32..36].copy_from_slice(&self.mtu.to_be_bytes());
        b[36..40].copy_from_slice(&self.rkey.to_be_bytes());
        b[40..48].copy_from_slice(&self.arena_addr.to_be_bytes());
        b[48..56].copy_from_slice(&self.arena_len.to_be_bytes());
        b[56..60].copy_from_slice(&self.recv_buf.to_be_bytes());
        b[60..64].copy_from_slice(&self.recv_depth.to_be_bytes());
        b
    }

    /// Decodes and checks a message; `max_arena` is the most arena bytes this side accepts.
    pub fn parse(b: &[u8], max_arena: u64) -> Result<Endpoint, EndpointError> {
        if b.len() != ENDPOINT_LEN {
            return Err(EndpointError::Length(b.len()));
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&b[0..4]);
        if magic != MAGIC {
            return Err(EndpointError::Magic(magic));
        }
        let version = u16::from_be_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(EndpointError::Version(version));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let e = Endpoint {
            qpn: be32(b, 8),
            psn: be32(b, 12),
            gid,
            mtu: be32(b, 32),
            rkey: be32(b, 36),
            arena_addr: be64(b, 40),
            arena_len: be64(b, 48),
            recv_buf: be32(b, 56),
            recv_depth: be32(b, 60),
        };
        let field = |field, value: u64| Err(EndpointError::Field { field, value });
        let reserved = u16::from_be_bytes([b[6], b[7]]);
        if reserved != 0 {
            return field("reserved", reserved.into());
        }
        if e.qpn >= 1 << 24 {
            return field("qpn", e.qpn.into());
        }
        if e.psn >= 1 << 24 {
            return field("psn", e.psn.into());
        }
        if !(1..=5).contains(&e.mtu) {
            return field("mtu", e.mtu.into());
        }
        if e.arena_len == 0 || e.arena_len > max_arena {
            return field("arena_len", e.arena_len);
        }
        if e.arena_addr.checked_add(e.arena_len).is_none() {
            return field("arena_addr", e.arena_addr);
        }
        if !(MIN_RECV_BUF..=MAX_RECV_BUF).contains(&e.recv_buf) {
            return field("recv_buf", e.recv_buf.into());
        }
        if !(1..=MAX_RECV_DEPTH).contains(&e.recv_depth) {
            return field("recv_depth", e.recv_depth.into());
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Endpoint {
        Endpoint {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: std::net::Ipv4Addr::new(10, 201, 0, 1)
                .to_ipv6_mapped()
                .octets(),
            mtu: 3,
            rkey: 0x1234,
            arena_addr: 0x7f00_0000_0000,
            arena_len: 1 << 24,
            recv_buf: 8192,
            recv_depth: 256,
        }
    }

    #[test]
    fn an_endpoint_round_trips() {
        let e = sample();
        assert_eq!(Endpoint::parse(&e.emit(), 1 << 24), Ok(e));
    }

    #[test]
    fn every_field_out_of_range_is_refused_by_name() {
        let max = 1 << 24;
        type Change = fn(&mut Endpoint);
        let cases: [(&str, Change); 9] = [
            ("qpn", |e| e.qpn = 1 << 24),
            ("psn", |e| e.psn = 1 << 24),
            ("mtu", |e| e.mtu = 0),
            ("mtu", |e| e.mtu = 6),
            ("arena_len", |e| e.arena_len = 0),
            ("arena_len", |e| e.arena_len = (1 << 24) + 1),
            ("arena_addr", |e| e.arena_addr = u64::MAX - 10),
            ("recv_buf", |e| e.recv_buf = MIN_RECV_BUF - 1),
            ("recv_depth", |e| e.recv_depth = MAX_RECV_DEPTH + 1),
        ];
        for (name, change) in cases {
            let mut e = sample();
            change(&mut e);
            match Endpoint::parse(&e.emit(), max) {
                Err(EndpointError::Field { field, .. }) => assert_eq!(field, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        let mut b = sample().emit();
        b[6] = 1;
        assert!(matches!(
            Endpoint::parse(&b, max),
            Err(EndpointError::Field {
                field: "reserved",
                ..
            })
        ));
        let mut b = sample().emit();
        b[0] = b'X';
        assert!(matches!(
            Endpoint::parse(&b, max),
            Err(EndpointError::Magic(_))
        ));
        let mut b = sample().emit();
        b[5] = 2;
        assert_eq!(Endpoint::parse(&b, max), Err(EndpointError::Version(2)));
        assert_eq!(
            Endpoint::parse(&b[..63], max),
            Err(EndpointError::Length(63))
        );
    }

    proptest! {
        /// Any bytes: refused or accepted within every limit, never a panic.
        #[test]
        fn any_bytes_are_refused_or_within_limits(b in proptest::collection::vec(any::<u8>(), 0..80), max in 1u64..u64::MAX) {
            if let Ok(e) = Endpoint::parse(&b, max) {
                prop_assert!(e.arena_len <= max && e.qpn < 1 << 24 && e.psn < 1 << 24);
                prop_assert!((MIN_RECV_BUF..=MAX_RECV_BUF).contains(&e.recv_buf));
                prop_assert_eq!(Endpoint::parse(&e.emit(), max), Ok(e));
            }
        }
    }
}
