//! The messages of the verbs binding besides the protocol's own (docs/protocol.md section
//! 10): what each side tells the other of its pool arena and receives on the channel's TCP
//! connection ([`Endpoint`]), the private data of the host's connection request
//! ([`Request`]), and the key notice of a pool ([`KeyNotice`]). Sans-IO; fuzzed
//! (`verbs_endpoint`).
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `SNVB` |
//! | 4 | 2 | version (2) |
//! | 6 | 2 | reserved, zero |
//! | 8 | 16 | connection token: the IOC's, for the host's connection request; zero from the host |
//! | 24 | 16 | reserved, zero |
//! | 40 | 8 | address of the arena's first byte (0: no arena, a control channel) |
//! | 48 | 8 | bytes of the arena (0: none) |
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
pub const VERSION: u16 = 2;
/// Smallest receive buffer a side may announce: room for any data-channel message but the
/// largest credit updates (which the sender then refuses to send).
pub const MIN_RECV_BUF: u32 = 1024;
/// Largest receive buffer a side may announce.
pub const MAX_RECV_BUF: u32 = 1 << 20;
/// Most receives a side may say it keeps posted.
pub const MAX_RECV_DEPTH: u32 = 4096;
/// Bytes of a connection token.
pub const TOKEN_LEN: usize = 16;
/// A connection token: what ties a connection request to the set-up on TCP that expects it.
pub type Token = [u8; TOKEN_LEN];
/// Magic of a connection request's private data.
pub const REQUEST_MAGIC: [u8; 4] = *b"SNVC";
/// Bytes of a connection request's private data.
pub const REQUEST_LEN: usize = 4 + TOKEN_LEN;

/// One side's pool arena and receives, and (from the IOC) the token its connection request
/// must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The IOC's connection token; zero from the host.
    pub token: Token,
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

/// The private data of the host's connection request: `SNVC` and the IOC's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The token the IOC sent in its endpoint.
    pub token: Token,
}

impl Request {
    /// Encodes it.
    pub fn emit(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..4].copy_from_slice(&REQUEST_MAGIC);
        b[4..].copy_from_slice(&self.token);
        b
    }

    /// Decodes the private data of a connection request (which a fabric may pad with
    /// zeros): `None` if it is not one.
    pub fn parse(b: &[u8]) -> Option<Request> {
        if b.len() < REQUEST_LEN || b[..4] != REQUEST_MAGIC {
            return None;
        }
        let mut token = [0u8; TOKEN_LEN];
        token.copy_from_slice(&b[4..REQUEST_LEN]);
        Some(Request { token })
    }
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
        b[8..24].copy_from_slice(&self.token);
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
        let mut token = [0u8; TOKEN_LEN];
        token.copy_from_slice(&b[8..24]);
        let e = Endpoint {
            token,
            arena_addr: be64(b, 40),
            arena_len: be64(b, 48),
            recv_buf: be32(b, 56),
            recv_depth: be32(b, 60),
        };
        let field = |field, value: u64| Err(EndpointError::Field { field, value });
        if b[6..8].iter().chain(&b[24..40]).any(|&x| x != 0) {
            return field("reserved", 0);
        }
        // No arena (a control channel's): length and address 0.
        if e.arena_len > max_arena || (e.arena_len == 0 && e.arena_addr != 0) {
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

/// Bytes of a key notice: the pool's offset in the sender's arena (u64), its length (u64)
/// and its remote key (u32), big-endian.
pub const KEY_NOTICE_LEN: usize = 20;

/// A key notice: one of the sender's pools, where it lies in its arena and its remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyNotice {
    /// Offset of the pool in the sender's arena.
    pub off: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
}

impl KeyNotice {
    /// Encodes the notice.
    pub fn emit(&self) -> [u8; KEY_NOTICE_LEN] {
        let mut b = [0u8; KEY_NOTICE_LEN];
        b[0..8].copy_from_slice(&self.off.to_be_bytes());
        b[8..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b
    }

    /// Decodes a notice of a pool inside an arena of `arena_len` bytes; `None` for anything
    /// else (not 20 bytes, empty, outside the arena).
    pub fn parse(b: &[u8], arena_len: u64) -> Option<KeyNotice> {
        let b: &[u8; KEY_NOTICE_LEN] = b.try_into().ok()?;
        let n = KeyNotice {
            off: u64::from_be_bytes(b[0..8].try_into().ok()?),
            len: u64::from_be_bytes(b[8..16].try_into().ok()?),
            rkey: u32::from_be_bytes(b[16..20].try_into().ok()?),
        };
        (n.len > 0 && n.off.checked_add(n.len)? <= arena_len).then_some(n)
    }

    /// Decodes a SEND of one or more notices back to back; `None` unless every one is a
    /// notice [`KeyNotice::parse`] takes (an empty SEND or a partial notice included).
    pub fn parse_list(b: &[u8], arena_len: u64) -> Option<Vec<KeyNotice>> {
        if b.is_empty() || !b.len().is_multiple_of(KEY_NOTICE_LEN) {
            return None;
        }
        b.chunks_exact(KEY_NOTICE_LEN)
            .map(|c| KeyNotice::parse(c, arena_len))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Endpoint {
        Endpoint {
            token: *b"0123456789abcdef",
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
        // A control channel's: no arena.
        let none = Endpoint {
            arena_addr: 0,
            arena_len: 0,
            ..e
        };
        assert_eq!(Endpoint::parse(&none.emit(), 1 << 24), Ok(none));
    }

    #[test]
    fn every_field_out_of_range_is_refused_by_name() {
        let max = 1 << 24;
        type Change = fn(&mut Endpoint);
        let cases: [(&str, Change); 6] = [
            ("arena_len", |e| e.arena_len = 0),
            ("arena_len", |e| e.arena_len = u64::MAX),
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
        for at in [6, 7, 24, 39] {
            let mut b = sample().emit();
            b[at] = 1;
            assert!(
                matches!(
                    Endpoint::parse(&b, max),
                    Err(EndpointError::Field {
                        field: "reserved",
                        ..
                    })
                ),
                "byte {at}"
            );
        }
        let mut b = sample().emit();
        b[0] = b'X';
        assert!(matches!(
            Endpoint::parse(&b, max),
            Err(EndpointError::Magic(_))
        ));
        let mut b = sample().emit();
        b[5] = 1;
        assert_eq!(Endpoint::parse(&b, max), Err(EndpointError::Version(1)));
        assert_eq!(
            Endpoint::parse(&b[..63], max),
            Err(EndpointError::Length(63))
        );
    }

    #[test]
    fn a_key_notice_round_trips_and_must_name_a_pool_of_the_arena() {
        let n = KeyNotice {
            off: 4096,
            len: 8192,
            rkey: 0xabcd,
        };
        assert_eq!(KeyNotice::parse(&n.emit(), 12288), Some(n));
        // One byte past the arena, empty, or not 20 bytes: refused.
        assert_eq!(KeyNotice::parse(&n.emit(), 12287), None);
        let empty = KeyNotice { len: 0, ..n };
        assert_eq!(KeyNotice::parse(&empty.emit(), 1 << 20), None);
        let wraps = KeyNotice {
            off: u64::MAX - 10,
            ..n
        };
        assert_eq!(KeyNotice::parse(&wraps.emit(), u64::MAX), None);
        assert_eq!(KeyNotice::parse(&n.emit()[..19], 1 << 20), None);
    }

    #[test]
    fn a_list_of_notices_is_taken_whole_or_not_at_all() {
        let a = KeyNotice {
            off: 0,
            len: 2048,
            rkey: 1,
        };
        let b = KeyNotice {
            off: 2048,
            len: 2048,
            rkey: 2,
        };
        let mut bytes = [a.emit(), b.emit()].concat();
        assert_eq!(KeyNotice::parse_list(&bytes, 4096), Some(vec![a, b]));
        // The second outside the arena, a partial third, none: refused.
        assert_eq!(KeyNotice::parse_list(&bytes, 4095), None);
        bytes.push(0);
        assert_eq!(KeyNotice::parse_list(&bytes, 4096), None);
        assert_eq!(KeyNotice::parse_list(&[], 4096), None);
    }

    proptest! {
        /// Any bytes: no notice, or one inside the arena that round-trips.
        #[test]
        fn any_key_notice_is_refused_or_inside_the_arena(b in proptest::collection::vec(any::<u8>(), 0..24), arena in 1u64..u64::MAX) {
            if let Some(n) = KeyNotice::parse(&b, arena) {
                prop_assert!(n.len > 0 && n.off + n.len <= arena);
                prop_assert_eq!(&n.emit()[..], &b[..]);
            }
        }
    }

    proptest! {
        /// Any bytes: refused or accepted within every limit, never a panic.
        #[test]
        fn any_bytes_are_refused_or_within_limits(b in proptest::collection::vec(any::<u8>(), 0..80), max in 1u64..u64::MAX) {
            if let Ok(e) = Endpoint::parse(&b, max) {
                prop_assert!(e.arena_len <= max && (e.arena_len > 0 || e.arena_addr == 0));
                prop_assert!((MIN_RECV_BUF..=MAX_RECV_BUF).contains(&e.recv_buf));
                prop_assert_eq!(&e.emit()[..], &b[..]);
            }
        }

        /// Any private data: a request whose token is the bytes after the magic, or none.
        #[test]
        fn any_private_data_is_a_request_or_none(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            match Request::parse(&b) {
                Some(r) => {
                    prop_assert_eq!(&b[..4], &REQUEST_MAGIC[..]);
                    prop_assert_eq!(&r.emit()[..], &b[..REQUEST_LEN]);
                }
                None => prop_assert!(b.len() < REQUEST_LEN || b[..4] != REQUEST_MAGIC),
            }
        }
    }

    #[test]
    fn a_request_padded_with_zeros_keeps_its_token() {
        let r = Request {
            token: [7; TOKEN_LEN],
        };
        let mut b = r.emit().to_vec();
        b.resize(56, 0);
        assert_eq!(Request::parse(&b), Some(r));
        assert_eq!(Request::parse(&b[..REQUEST_LEN - 1]), None);
        b[0] = b'X';
        assert_eq!(Request::parse(&b), None);
    }
}
