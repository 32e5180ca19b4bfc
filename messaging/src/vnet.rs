//! The virtio-net header that travels in front of every frame, and checks of the Ethernet
//! frame behind it.
//!
//! Both daemons hand the kernel frames that came from the other machine: their offload
//! metadata is untrusted input. [`check_frame`] rejects a header the kernel should never
//! see (checksum start or offset beyond the frame, a segmentation size of zero or larger
//! than the frame, unknown flags or GSO types) before it is written to a TAP or a NIC.
//!
//! Layout (10 bytes, little-endian as virtio 1.0 and Linux on little-endian hosts):
//! flags u8, gso_type u8, hdr_len u16, gso_size u16, csum_start u16, csum_offset u16.

use thiserror::Error;

/// Bytes of the header.
pub const VNET_HDR_LEN: usize = 10;
/// Bytes of an Ethernet header.
pub const ETH_HDR_LEN: usize = 14;

const F_NEEDS_CSUM: u8 = 1;
const F_DATA_VALID: u8 = 2;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_UDP: u8 = 3;
const GSO_TCPV6: u8 = 4;
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;

/// A parsed virtio-net header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*` flags.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*` type.
    pub gso_type: u8,
    /// Length of the headers to replicate in each segment.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where checksumming starts.
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub csum_offset: u16,
}

/// Why a frame from the other side is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FrameError {
    /// Shorter than the virtio-net and Ethernet headers.
    #[error("frame of {0} bytes is shorter than its headers")]
    Runt(usize),
    /// Flags other than NEEDS_CSUM and DATA_VALID.
    #[error("unknown virtio-net flags {0:#x}")]
    Flags(u8),
    /// An unknown GSO type.
    #[error("unknown GSO type {0:#x}")]
    GsoType(u8),
    /// The checksum field lies outside the frame.
    #[error("checksum at {start}+{offset} lies outside a {len}-byte frame")]
    Csum {
        /// csum_start.
        start: u16,
        /// csum_offset.
        offset: u16,
        /// Frame length after the virtio-net header.
        len: usize,
    },
    /// Segmentation metadata that cannot describe this frame.
    #[error("GSO size {gso_size} (headers {hdr_len}) does not fit a {len}-byte frame")]
    Gso {
        /// gso_size.
        gso_size: u16,
        /// hdr_len.
        hdr_len: u16,
        /// Frame length after the virtio-net header.
        len: usize,
    },
}

impl VnetHdr {
    /// Parses the first [`VNET_HDR_LEN`] bytes.
    pub fn parse(b: &[u8; VNET_HDR_LEN]) -> VnetHdr {
        let u16le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16le(2),
            gso_size: u16le(4),
            csum_start: u16le(6),
            csum_offset: u16le(8),
        }
    }

    /// Encodes.
    pub fn emit(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b
    }

    /// True for a segmentation (super-)frame.
    pub fn is_gso(&self) -> bool {
        self.gso_type & !GSO_ECN != GSO_NONE
    }
}

/// Checks a frame from the fabric (virtio-net header, then Ethernet) before it reaches the
/// kernel; returns the parsed header.
pub fn check_frame(frame: &[u8]) -> Result<VnetHdr, FrameError> {
    let Some((hdr, eth)) = frame.split_first_chunk::<VNET_HDR_LEN>() else {
        return Err(FrameError::Runt(frame.len()));
    };
    if eth.len() < ETH_HDR_LEN {
        return Err(FrameError::Runt(frame.len()));
    }
    let h = VnetHdr::parse(hdr);
    let len = eth.len();
    if h.flags & !(F_NEEDS_CSUM | F_DATA_VALID) != 0 {
        return Err(FrameError::Flags(h.flags));
    }
    if !matches!(
        h.gso_type & !GSO_ECN,
        GSO_NONE | GSO_TCPV4 | GSO_UDP | GSO_TCPV6 | GSO_UDP_L4
    ) {
        return Err(FrameError::GsoType(h.gso_type));
    }
    if h.flags & F_NEEDS_CSUM != 0 {
        let end = usize::from(h.csum_start) + usize::from(h.csum_offset) + 2;
        if usize::from(h.csum_start) < ETH_HDR_LEN || end > len {
            return Err(FrameError::Csum {
                start: h.csum_start,
                offset: h.csum_offset,
                len,
            });
        }
    }
    if h.is_gso() {
        let bad = FrameError::Gso {
            gso_size: h.gso_size,
            hdr_len: h.hdr_len,
            len,
        };
        if h.gso_size == 0 || usize::from(h.hdr_len) > len || h.flags & F_NEEDS_CSUM == 0 {
            return Err(bad);
        }
    }
    Ok(h)
}

/// Destination MAC of a frame that passed [`check_frame`].
pub fn dst_mac(frame: &[u8]) -> [u8; 6] {
    let mut m = [0u8; 6];
    if let Some(d) = frame.get(VNET_HDR_LEN..VNET_HDR_LEN + 6) {
        m.copy_from_slice(d);
    }
    m
}

/// Source MAC of a frame that passed [`check_frame`].
pub fn src_mac(frame: &[u8]) -> [u8; 6] {
    let mut m = [0u8; 6];
    if let Some(d) = frame.get(VNET_HDR_LEN + 6..VNET_HDR_LEN + 12) {
        m.copy_from_slice(d);
    }
    m
}

/// True for broadcast and multicast addresses (group bit set).
pub fn is_group(mac: &[u8; 6]) -> bool {
    mac[0] & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(h: VnetHdr, len: usize) -> Vec<u8> {
        let mut f = h.emit().to_vec();
        f.resize(VNET_HDR_LEN + len, 0xab);
        f
    }

    #[test]
    fn plain_frame_passes() {
        let f = frame(VnetHdr::default(), 60);
        assert_eq!(check_frame(&f), Ok(VnetHdr::default()));
        assert_eq!(dst_mac(&f), [0xab; 6]);
        assert!(is_group(&dst_mac(&f)));
    }

    #[test]
    fn tso_frame_passes() {
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        assert_eq!(check_frame(&frame(h, 60_000)), Ok(h));
    }

    #[test]
    fn hostile_headers_are_refused() {
        assert!(matches!(check_frame(&[0; 20]), Err(FrameError::Runt(20))));
        let csum = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 50,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        assert!(matches!(
            check_frame(&frame(csum, 60)),
            Err(FrameError::Csum { .. })
        ));
        let gso0 = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV6,
            csum_start: 54,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        assert!(matches!(
            check_frame(&frame(gso0, 2000)),
            Err(FrameError::Gso { .. })
        ));
        let unknown = VnetHdr {
            gso_type: 9,
            ..VnetHdr::default()
        };
        assert_eq!(
            check_frame(&frame(unknown, 60)),
            Err(FrameError::GsoType(9))
        );
        let flags = VnetHdr {
            flags: 0x40,
            ..VnetHdr::default()
        };
        assert_eq!(check_frame(&frame(flags, 60)), Err(FrameError::Flags(0x40)));
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(h) = check_frame(&b) {
                let len = b.len() - VNET_HDR_LEN;
                if h.flags & F_NEEDS_CSUM != 0 {
                    prop_assert!(usize::from(h.csum_start) + usize::from(h.csum_offset) + 2 <= len);
                }
            }
        }
    }
}
