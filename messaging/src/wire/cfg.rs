//! CfgUtil request codes and the layouts of their data.

use super::error::WireError;
use super::header::Reader;

/// What a CfgUtilRequest asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CfgCode {
    /// The MAC address assigned to the host (reply: 6 bytes).
    GetMac,
    /// Use this MAC address for the host (request: 6 bytes).
    SetMac,
    /// MTU (reply: [`Mtu`]).
    GetMtu,
    /// Set the MTU (request: u32).
    SetMtu,
    /// Link state of the NIC (reply: u8, 1 = up).
    GetLink,
    /// NIC and link statistics (reply: [`Stats`]).
    GetStats,
    /// Promiscuous mode (request: u8).
    SetPromisc,
    /// Multicast MAC addresses the host subscribes to (request: n x 6 bytes, n <= 256).
    SetMulticast,
    /// Offload features of the peer (reply: u64 of [`features`] bits).
    GetFeatures,
    /// Offload features the sender will use (request: u64 of [`features`] bits).
    SetFeatures,
    /// IOC to host notification: link state and MTU changed (request: [`LinkChange`]).
    LinkChange,
    /// Host to IOC: a standby session becomes the host's active one (no data; reply Ok or
    /// Refused). Only on a session whose handshake agreed [`super::HelloReply::STANDBY`].
    Activate,
    /// A code this implementation does not know (answered with `Unsupported`).
    Other(u16),
}

impl CfgCode {
    /// Wire value.
    pub fn to_u16(self) -> u16 {
        match self {
            CfgCode::GetMac => 1,
            CfgCode::SetMac => 2,
            CfgCode::GetMtu => 3,
            CfgCode::SetMtu => 4,
            CfgCode::GetLink => 5,
            CfgCode::GetStats => 6,
            CfgCode::SetPromisc => 7,
            CfgCode::SetMulticast => 8,
            CfgCode::GetFeatures => 9,
            CfgCode::SetFeatures => 10,
            CfgCode::LinkChange => 11,
            CfgCode::Activate => 12,
            CfgCode::Other(v) => v,
        }
    }

    /// Decodes a wire value; unknown values become [`CfgCode::Other`].
    pub fn from_u16(v: u16) -> CfgCode {
        match v {
            1 => CfgCode::GetMac,
            2 => CfgCode::SetMac,
            3 => CfgCode::GetMtu,
            4 => CfgCode::SetMtu,
            5 => CfgCode::GetLink,
            6 => CfgCode::GetStats,
            7 => CfgCode::SetPromisc,
            8 => CfgCode::SetMulticast,
            9 => CfgCode::GetFeatures,
            10 => CfgCode::SetFeatures,
            11 => CfgCode::LinkChange,
            12 => CfgCode::Activate,
            v => CfgCode::Other(v),
        }
    }
}

/// Offload feature bits (GetFeatures / SetFeatures).
pub mod features {
    /// Frames carry a 10-byte virtio_net_hdr in front (little-endian, virtio 1.0).
    pub const VNET_HDR: u64 = 1 << 0;
    /// Partial checksums may be left for the receiver's kernel or NIC.
    pub const CSUM: u64 = 1 << 1;
    /// TCPv4 segmentation offload (super-frames up to 64 KiB).
    pub const TSO4: u64 = 1 << 2;
    /// TCPv6 segmentation offload.
    pub const TSO6: u64 = 1 << 3;
    /// UDP segmentation offload.
    pub const USO: u64 = 1 << 4;
    /// ECN bit in TSO frames.
    pub const ECN: u64 = 1 << 5;
    /// The express lane: the sender may send frames of sparse flows as SendData on the
    /// control channel, ahead of the bulk on the data channel (docs/protocol.md 6.6). Not
    /// an offload: a receiver takes such frames whatever it agreed.
    pub const EXPRESS: u64 = 1 << 6;

    /// The name of every bit, in bit order.
    pub const NAMES: [(u64, &str); 7] = [
        (VNET_HDR, "vnet_hdr"),
        (CSUM, "csum"),
        (TSO4, "tso4"),
        (TSO6, "tso6"),
        (USO, "uso"),
        (ECN, "ecn"),
        (EXPRESS, "express"),
    ];

    /// The names of the bits set in `bits` (unknown bits are left out).
    pub fn names(bits: u64) -> Vec<&'static str> {
        NAMES
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Parses a 6-byte MAC address.
pub fn parse_mac(data: &[u8]) -> Result<[u8; 6], WireError> {
    let mut r = Reader::new(data);
    let mut mac = [0u8; 6];
    mac.copy_from_slice(r.bytes(6)?);
    r.finish()?;
    Ok(mac)
}

/// Parses a single u8.
pub fn parse_u8(data: &[u8]) -> Result<u8, WireError> {
    let mut r = Reader::new(data);
    let v = r.u8()?;
    r.finish()?;
    Ok(v)
}

/// Parses a single big-endian u32.
pub fn parse_u32(data: &[u8]) -> Result<u32, WireError> {
    let mut r = Reader::new(data);
    let v = r.u32()?;
    r.finish()?;
    Ok(v)
}

/// Parses a single big-endian u64.
pub fn parse_u64(data: &[u8]) -> Result<u64, WireError> {
    let mut r = Reader::new(data);
    let v = r.u64()?;
    r.finish()?;
    Ok(v)
}

/// Most multicast addresses in one SetMulticast.
pub const MAX_MULTICAST: usize = 256;

/// Parses a SetMulticast list.
pub fn parse_multicast(data: &[u8]) -> Result<Vec<[u8; 6]>, WireError> {
    if !data.len().is_multiple_of(6) {
        return Err(WireError::LengthMismatch {
            declared: data.len() / 6 * 6,
            actual: data.len(),
        });
    }
    let n = data.len() / 6;
    if n > MAX_MULTICAST {
        return Err(WireError::TooMany {
            count: n,
            max: MAX_MULTICAST,
        });
    }
    Ok(data
        .chunks_exact(6)
        .map(|c| {
            let mut m = [0u8; 6];
            m.copy_from_slice(c);
            m
        })
        .collect())
}

/// GetMtu reply: current and largest MTU of the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mtu {
    /// Current MTU.
    pub current: u32,
    /// Largest MTU the IOC accepts for this host.
    pub max: u32,
}

impl Mtu {
    /// Encodes (8 bytes).
    pub fn emit(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&self.current.to_be_bytes());
        b[4..].copy_from_slice(&self.max.to_be_bytes());
        b
    }

    /// Decodes.
    pub fn parse(data: &[u8]) -> Result<Mtu, WireError> {
        let mut r = Reader::new(data);
        let m = Mtu {
            current: r.u32()?,
            max: r.u32()?,
        };
        r.finish()?;
        Ok(m)
    }
}

/// LinkChange notification: link state and MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkChange {
    /// Link up.
    pub up: bool,
    /// MTU now.
    pub mtu: u32,
}

impl LinkChange {
    /// Encodes (5 bytes).
    pub fn emit(&self) -> [u8; 5] {
        let mut b = [0u8; 5];
        b[0] = u8::from(self.up);
        b[1..].copy_from_slice(&self.mtu.to_be_bytes());
        b
    }

    /// Decodes.
    pub fn parse(data: &[u8]) -> Result<LinkChange, WireError> {
        let mut r = Reader::new(data);
        let up = match r.u8()? {
            0 => false,
            1 => true,
            v => {
                return Err(WireError::BadField {
                    field: "link state",
                    value: v.into(),
                })
            }
        };
        let c = LinkChange { up, mtu: r.u32()? };
        r.finish()?;
        Ok(c)
    }
}

/// GetStats reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames received from the LAN for this host.
    pub rx_frames: u64,
    /// Bytes received from the LAN for this host.
    pub rx_bytes: u64,
    /// Frames sent to the LAN from this host.
    pub tx_frames: u64,
    /// Bytes sent to the LAN from this host.
    pub tx_bytes: u64,
    /// Frames for this host dropped (no credit, no buffer).
    pub rx_dropped: u64,
    /// Frames from this host dropped (NIC refused, invalid offload metadata).
    pub tx_dropped: u64,
    /// Protocol errors seen on the fabric.
    pub protocol_errors: u64,
    /// Protection errors seen on the fabric.
    pub protection_errors: u64,
}

impl std::ops::AddAssign for Stats {
    /// Adds another host's counters (totals over hosts).
    fn add_assign(&mut self, o: Stats) {
        self.rx_frames += o.rx_frames;
        self.rx_bytes += o.rx_bytes;
        self.tx_frames += o.tx_frames;
        self.tx_bytes += o.tx_bytes;
        self.rx_dropped += o.rx_dropped;
        self.tx_dropped += o.tx_dropped;
        self.protocol_errors += o.protocol_errors;
        self.protection_errors += o.protection_errors;
    }
}

impl Stats {
    /// Bytes of the encoding.
    pub const LEN: usize = 64;

    /// Encodes.
    pub fn emit(&self) -> [u8; Stats::LEN] {
        let mut b = [0u8; Stats::LEN];
        let v = [
            self.rx_frames,
            self.rx_bytes,
            self.tx_frames,
            self.tx_bytes,
            self.rx_dropped,
            self.tx_dropped,
            self.protocol_errors,
            self.protection_errors,
        ];
        for (chunk, x) in b.chunks_exact_mut(8).zip(v) {
            chunk.copy_from_slice(&x.to_be_bytes());
        }
        b
    }

    /// Decodes.
    pub fn parse(data: &[u8]) -> Result<Stats, WireError> {
        let mut r = Reader::new(data);
        let s = Stats {
            rx_frames: r.u64()?,
            rx_bytes: r.u64()?,
            tx_frames: r.u64()?,
            tx_bytes: r.u64()?,
            rx_dropped: r.u64()?,
            tx_dropped: r.u64()?,
            protocol_errors: r.u64()?,
            protection_errors: r.u64()?,
        };
        r.finish()?;
        Ok(s)
    }
}
