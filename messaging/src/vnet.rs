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

use std::hash::BuildHasher;
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
    check_head(frame, frame.len())
}

/// As [`check_frame`], for a frame of `len` bytes of which `head` is a private copy of the
/// first (at least the virtio-net header): the frame's header is checked from that copy
/// alone, which is then what the kernel must be given.
pub fn check_head(head: &[u8], len: usize) -> Result<VnetHdr, FrameError> {
    let Some(hdr) = head.first_chunk::<VNET_HDR_LEN>() else {
        return Err(FrameError::Runt(len));
    };
    if len < VNET_HDR_LEN + ETH_HDR_LEN {
        return Err(FrameError::Runt(len));
    }
    let h = VnetHdr::parse(hdr);
    let len = len - VNET_HDR_LEN;
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
        if h.gso_size == 0
            || usize::from(h.gso_size) > len
            || usize::from(h.hdr_len) > len
            || h.flags & F_NEEDS_CSUM == 0
        {
            return Err(bad);
        }
    }
    Ok(h)
}

/// The negotiated features (`wire::features`) a frame with header `h` relies on: a partial
/// checksum needs CSUM, a super-frame the segmentation offload of its kind, an ECN flag ECN.
/// UFO (GSO_UDP) has no feature bit: no peer may send it, so it asks for a bit no one has.
pub fn features_used(h: &VnetHdr) -> u64 {
    use crate::wire::features::{CSUM, ECN, TSO4, TSO6, USO};
    let mut f = 0;
    if h.flags & F_NEEDS_CSUM != 0 {
        f |= CSUM;
    }
    if h.gso_type & GSO_ECN != 0 {
        f |= ECN;
    }
    f | match h.gso_type & !GSO_ECN {
        GSO_TCPV4 => TSO4,
        GSO_TCPV6 => TSO6,
        GSO_UDP_L4 => USO,
        GSO_UDP => 1 << 63,
        _ => 0,
    }
}

/// Bytes of the network-layer packet of a non-segmented frame: what the MTU bounds (the
/// Ethernet header and up to two VLAN tags are not counted).
pub fn l3_len(frame: &[u8]) -> usize {
    l3_len_of(frame, frame.len())
}

/// As [`l3_len`], for a frame of `len` bytes of which `head` holds the first (at least the
/// Ethernet header and its tags, or the whole frame).
pub fn l3_len_of(head: &[u8], len: usize) -> usize {
    let eth = head.get(VNET_HDR_LEN..).unwrap_or(&[]);
    len.saturating_sub(VNET_HDR_LEN).saturating_sub(l2_len(eth))
}

/// Bytes of the Ethernet header at the start of `eth`: the MAC addresses, up to two VLAN
/// tags (802.1Q, 802.1ad), and the EtherType.
pub(crate) fn l2_len(eth: &[u8]) -> usize {
    let mut at = 12;
    while at < 20 && matches!(eth.get(at..at + 2), Some([0x81, 0x00] | [0x88, 0xa8])) {
        at += 4;
    }
    at + 2
}

/// The layer-3 length of each segment the kernel will cut a GSO frame `h` into: its network
/// and transport headers, replicated in every segment, and `gso_size` bytes of payload, so
/// that it can be held to the MTU. `head` holds the frame's first bytes (virtio-net header
/// included). The transport header starts at `csum_start`; a TCP header's length is read
/// from it (20 bytes when `head` does not reach it), a UDP header is 8. A frame without a
/// checksum start, or UFO (whose fragments carry no transport header), counts `gso_size`
/// alone.
pub fn gso_segment_l3_len(head: &[u8], h: &VnetHdr) -> usize {
    let payload = usize::from(h.gso_size);
    if h.flags & F_NEEDS_CSUM == 0 {
        return payload;
    }
    let eth = head.get(VNET_HDR_LEN..).unwrap_or(&[]);
    let l2 = l2_len(eth);
    let l4 = usize::from(h.csum_start);
    let l4_header = match h.gso_type & !GSO_ECN {
        GSO_TCPV4 | GSO_TCPV6 => eth
            .get(l4 + 12)
            .map_or(20, |&off| usize::from(off >> 4) * 4)
            .max(20),
        GSO_UDP_L4 => 8,
        _ => return payload,
    };
    l4.saturating_sub(l2) + l4_header + payload
}

/// Bytes of an 802.1Q (or 802.1ad) tag: TPID then TCI.
pub const VLAN_TAG_LEN: usize = 4;
/// Where the tag goes in a frame: after the virtio-net header and both MAC addresses.
pub const VLAN_TAG_AT: usize = VNET_HDR_LEN + 12;

/// Puts back the VLAN tag that the kernel took out of a frame it received (an `AF_PACKET`
/// socket sees the outermost tag only in `PACKET_AUXDATA`): `buf[..len]` holds a virtio-net
/// header and the untagged frame; afterwards `buf[..len + 4]` holds the frame with the tag
/// (`tpid`, `tci`) after the MAC addresses, as it was on the wire, and the header's checksum
/// start and header length count the tag. Returns the new length, or `None` (nothing
/// changed) when `buf` has no room for the tag, `len` is beyond `buf`, the frame is shorter
/// than its MAC addresses, or the moved offsets would not fit their 16 bits.
pub fn insert_vlan(buf: &mut [u8], len: usize, tpid: u16, tci: u16) -> Option<usize> {
    let grown = len.checked_add(VLAN_TAG_LEN)?;
    if len < VLAN_TAG_AT || grown > buf.len() {
        return None;
    }
    let h = tagged_hdr(buf.first_chunk()?)?;
    buf[..VNET_HDR_LEN].copy_from_slice(&h.emit());
    buf.copy_within(VLAN_TAG_AT..len, VLAN_TAG_AT + VLAN_TAG_LEN);
    put_tag(buf, tpid, tci);
    Some(grown)
}

/// As [`insert_vlan`], for a frame copied to `buf[VLAN_TAG_LEN..VLAN_TAG_LEN + len]`, 4 bytes
/// in: only its virtio-net header and MAC addresses move (to the front), never its payload.
/// Returns the tagged frame's length (at `buf[..]`), or `None` (nothing changed) as
/// [`insert_vlan`] does.
pub fn insert_vlan_ahead(buf: &mut [u8], len: usize, tpid: u16, tci: u16) -> Option<usize> {
    let grown = len.checked_add(VLAN_TAG_LEN)?;
    if len < VLAN_TAG_AT || grown > buf.len() {
        return None;
    }
    let h = tagged_hdr(buf[VLAN_TAG_LEN..].first_chunk()?)?;
    buf.copy_within(
        VLAN_TAG_LEN + VNET_HDR_LEN..VLAN_TAG_LEN + VLAN_TAG_AT,
        VNET_HDR_LEN,
    );
    buf[..VNET_HDR_LEN].copy_from_slice(&h.emit());
    put_tag(buf, tpid, tci);
    Some(grown)
}

/// The virtio-net header `hdr` of a frame that gets a tag, as bytes (see [`tagged_hdr`]).
pub fn tagged_header(hdr: &[u8; VNET_HDR_LEN]) -> Option<[u8; VNET_HDR_LEN]> {
    tagged_hdr(hdr).map(|h| h.emit())
}

/// The 4 bytes of a VLAN tag: `tpid` then `tci`, in network order.
pub fn tag_bytes(tpid: u16, tci: u16) -> [u8; VLAN_TAG_LEN] {
    let (p, c) = (tpid.to_be_bytes(), tci.to_be_bytes());
    [p[0], p[1], c[0], c[1]]
}

/// The virtio-net header `hdr` of a frame that gets a tag: its checksum start and header
/// length count the tag; `None` when they would not fit their 16 bits.
fn tagged_hdr(hdr: &[u8; VNET_HDR_LEN]) -> Option<VnetHdr> {
    let mut h = VnetHdr::parse(hdr);
    let tag = VLAN_TAG_LEN as u16;
    if h.flags & F_NEEDS_CSUM != 0 {
        h.csum_start = h.csum_start.checked_add(tag)?;
    }
    if h.hdr_len != 0 {
        h.hdr_len = h.hdr_len.checked_add(tag)?;
    }
    Some(h)
}

/// Writes the tag (`tpid`, `tci`) after the MAC addresses of the frame in `buf`.
fn put_tag(buf: &mut [u8], tpid: u16, tci: u16) {
    buf[VLAN_TAG_AT..VLAN_TAG_AT + VLAN_TAG_LEN].copy_from_slice(&tag_bytes(tpid, tci));
}

/// The outer VLAN tag of a frame (virtio-net header first), TPID and TCI: the 4 bytes after
/// the MAC addresses when they start with 802.1Q's (0x8100) or 802.1ad's (0x88a8) TPID.
pub fn outer_tag(frame: &[u8]) -> Option<(u16, u16)> {
    let t = frame.get(VLAN_TAG_AT..VLAN_TAG_AT + VLAN_TAG_LEN)?;
    let tpid = u16::from_be_bytes([t[0], t[1]]);
    matches!(tpid, 0x8100 | 0x88a8).then(|| (tpid, u16::from_be_bytes([t[2], t[3]])))
}

/// The VLAN a frame travels on: its outer tag's VLAN id, `None` for an untagged frame and a
/// priority-tagged one (VLAN id 0, which 802.1Q classifies as untagged). A priority tag
/// in front of another tag gives way to that one, as Linux takes such a frame: a VLAN id 0
/// never hides the VLAN behind it.
pub fn vlan_of(frame: &[u8]) -> Option<u16> {
    let (_, tci) = outer_tag(frame)?;
    match tci & 0x0fff {
        0 => {
            let inner = frame.get(VLAN_TAG_AT + VLAN_TAG_LEN..VLAN_TAG_AT + 2 * VLAN_TAG_LEN)?;
            let tpid = u16::from_be_bytes([inner[0], inner[1]]);
            let vid = u16::from_be_bytes([inner[2], inner[3]]) & 0x0fff;
            (matches!(tpid, 0x8100 | 0x88a8) && vid != 0).then_some(vid)
        }
        vid => Some(vid),
    }
}

/// Takes the outer VLAN tag out of `buf[..len]` (a virtio-net header and a frame whose
/// [`outer_tag`] is one), the inverse of [`insert_vlan`]: the bytes after the tag move up
/// over it and the header's checksum start and header length stop counting it. Returns the
/// new length, or `None` (nothing changed) when the frame has no such tag, `len` is beyond
/// `buf`, an offset would fall inside or before the tag, or what is left would not be a
/// frame (no EtherType; a GSO frame's segment size beyond its length).
pub fn strip_vlan(buf: &mut [u8], len: usize) -> Option<usize> {
    let frame = buf.get(..len)?;
    outer_tag(frame)?;
    // What is left must still be an Ethernet frame (an EtherType after the MACs), and a
    // GSO frame's segments no longer than it.
    let left = len.checked_sub(VNET_HDR_LEN + VLAN_TAG_LEN)?;
    if left < ETH_HDR_LEN {
        return None;
    }
    let hdr: &[u8; VNET_HDR_LEN] = frame.first_chunk()?;
    let mut h = VnetHdr::parse(hdr);
    if h.is_gso() && usize::from(h.gso_size) > left {
        return None;
    }
    // Offsets count from the Ethernet header's start: past the tag, at least the MACs, the
    // tag and an EtherType.
    let past = (12 + VLAN_TAG_LEN + 2) as u16;
    let tag = VLAN_TAG_LEN as u16;
    if h.flags & F_NEEDS_CSUM != 0 {
        if h.csum_start < past {
            return None;
        }
        h.csum_start -= tag;
    }
    if h.hdr_len != 0 {
        if h.hdr_len < past {
            return None;
        }
        h.hdr_len -= tag;
    }
    buf[..VNET_HDR_LEN].copy_from_slice(&h.emit());
    buf.copy_within(VLAN_TAG_AT + VLAN_TAG_LEN..len, VLAN_TAG_AT);
    Some(len - VLAN_TAG_LEN)
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

/// Longest flow key: two IPv6 addresses, the protocol and two ports.
const FLOW_KEY_MAX: usize = 16 + 16 + 1 + 4;

/// The flow a frame belongs to, hashed with `keys` (a keyed hash, so that traffic from the
/// LAN cannot choose which queue it lands on): IPv4 or IPv6 addresses, the protocol, and
/// for TCP and UDP the ports; addresses only for fragments and IPv6 extension headers, so
/// every fragment of a datagram hashes alike; 0 for anything else. One VLAN tag is skipped.
/// Spreads frames over a host's queues while keeping each flow on one queue, in order.
pub fn flow_hash(frame: &[u8], keys: &impl BuildHasher) -> u64 {
    let mut key = [0u8; FLOW_KEY_MAX];
    let n = flow_key(frame.get(VNET_HDR_LEN..).unwrap_or(&[]), &mut key);
    if n == 0 {
        return 0;
    }
    keys.hash_one(&key[..n])
}

/// Writes the flow key of Ethernet frame `eth` into `key`; returns its length (0: no flow).
fn flow_key(eth: &[u8], key: &mut [u8; FLOW_KEY_MAX]) -> usize {
    let be16 = |b: &[u8], at: usize| b.get(at..at + 2).map(|x| u16::from_be_bytes([x[0], x[1]]));
    let mut at = 12;
    let mut ethertype = be16(eth, at);
    if matches!(ethertype, Some(0x8100 | 0x88a8)) {
        at += 4;
        ethertype = be16(eth, at);
    }
    let l3 = &eth[(at + 2).min(eth.len())..];
    let (addrs, proto, l4) = match ethertype {
        Some(0x0800) => {
            let Some(&ver_ihl) = l3.first() else { return 0 };
            let ihl = usize::from(ver_ihl & 0x0f) * 4;
            if ver_ihl >> 4 != 4 || ihl < 20 || l3.len() < ihl {
                return 0;
            }
            let fragment = be16(l3, 6).unwrap_or(0) & 0x3fff != 0;
            (&l3[12..20], l3[9], (!fragment).then(|| &l3[ihl..]))
        }
        Some(0x86dd) => {
            if l3.len() < 40 || l3[0] >> 4 != 6 {
                return 0;
            }
            (&l3[8..40], l3[6], Some(&l3[40..]))
        }
        _ => return 0,
    };
    key[..addrs.len()].copy_from_slice(addrs);
    let mut n = addrs.len();
    key[n] = proto;
    n += 1;
    // TCP, UDP, UDP-Lite and SCTP put their ports first; other protocols (and IPv6 extension
    // headers) hash by addresses.
    if let Some(ports) = l4
        .filter(|_| matches!(proto, 6 | 17 | 132 | 136))
        .and_then(|l| l.get(..4))
    {
        key[n..n + 4].copy_from_slice(ports);
        n += 4;
    }
    n
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

    /// The header of a TCPv4 super-frame with an MSS of 1448.
    fn tso() -> VnetHdr {
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        }
    }

    #[test]
    fn tso_frame_passes() {
        let h = tso();
        assert_eq!(check_frame(&frame(h, 60_000)), Ok(h));
    }

    /// Issue 30: a TSO frame's segments are its headers and `gso_size` each, held to the MTU
    /// with the headers counted.
    #[test]
    fn a_gso_segment_counts_its_headers() {
        // IPv4 (20 bytes) and TCP with timestamps (32 bytes), MSS 1448: 1500-byte segments.
        let mut f = vec![0u8; VNET_HDR_LEN + 14 + 20 + 32];
        f[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14].copy_from_slice(&[0x08, 0x00]);
        f[VNET_HDR_LEN + 14 + 20 + 12] = 8 << 4;
        let h = tso();
        assert_eq!(gso_segment_l3_len(&f, &h), 1500);
        // Behind an 802.1Q tag, the same.
        let mut tagged = f[..VNET_HDR_LEN + 12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0, 7]);
        tagged.extend_from_slice(&f[VNET_HDR_LEN + 12..]);
        let h4 = VnetHdr {
            csum_start: 38,
            ..h
        };
        assert_eq!(gso_segment_l3_len(&tagged, &h4), 1500);
        // A head that stops before the TCP header: its smallest length.
        assert_eq!(
            gso_segment_l3_len(&f[..VNET_HDR_LEN + 40], &h),
            20 + 20 + 1448
        );
        // USO: 8 bytes of UDP header; UFO and frames without a checksum start: gso_size.
        let uso = VnetHdr {
            gso_type: GSO_UDP_L4,
            gso_size: 1472,
            ..h
        };
        assert_eq!(gso_segment_l3_len(&f, &uso), 20 + 8 + 1472);
        let ufo = VnetHdr {
            gso_type: GSO_UDP,
            ..h
        };
        assert_eq!(gso_segment_l3_len(&f, &ufo), 1448);
        assert_eq!(gso_segment_l3_len(&f, &VnetHdr { flags: 0, ..h }), 1448);
    }

    #[test]
    fn gso_size_beyond_the_frame_is_refused() {
        let h = VnetHdr {
            gso_size: 1449,
            ..tso()
        };
        assert!(matches!(
            check_frame(&frame(h, 1448)),
            Err(FrameError::Gso { .. })
        ));
        assert!(check_frame(&frame(h, 1449)).is_ok());
    }

    #[test]
    fn features_used_name_each_offload() {
        use crate::wire::features::{CSUM, ECN, TSO4, TSO6, USO};
        let csum = VnetHdr {
            flags: F_NEEDS_CSUM,
            ..VnetHdr::default()
        };
        assert_eq!(features_used(&VnetHdr::default()), 0);
        assert_eq!(features_used(&csum), CSUM);
        let with = |gso_type| VnetHdr { gso_type, ..csum };
        assert_eq!(features_used(&with(GSO_TCPV4)), CSUM | TSO4);
        assert_eq!(features_used(&with(GSO_TCPV6 | GSO_ECN)), CSUM | TSO6 | ECN);
        assert_eq!(features_used(&with(GSO_UDP_L4)), CSUM | USO);
        let all = CSUM | TSO4 | TSO6 | USO | ECN;
        assert_ne!(
            features_used(&with(GSO_UDP)) & !all,
            0,
            "UFO is never negotiated"
        );
    }

    #[test]
    fn l3_len_skips_ethernet_and_vlan_tags() {
        let mut f = frame(VnetHdr::default(), 14 + 1500);
        f[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(l3_len(&f), 1500);
        let mut tagged = frame(VnetHdr::default(), 22 + 1500);
        tagged[VNET_HDR_LEN + 12..VNET_HDR_LEN + 22]
            .copy_from_slice(&[0x88, 0xa8, 0, 1, 0x81, 0x00, 0, 2, 0x08, 0x00]);
        assert_eq!(l3_len(&tagged), 1500);
        assert_eq!(l3_len(&[0; 5]), 0);
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

    /// A frame: no offloads, Ethernet (with `vlan` tag if given), then `l3` of `ethertype`.
    fn ip_frame(vlan: Option<u16>, ethertype: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = VnetHdr::default().emit().to_vec();
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
        if let Some(tag) = vlan {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&tag.to_be_bytes());
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    /// IPv4 header (20 bytes) of `proto` with fragment field `frag`, then `l4`.
    fn ipv4(src: u8, proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
        let mut h = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, src, 10, 0, 0, 9,
        ];
        h[6..8].copy_from_slice(&frag.to_be_bytes());
        h.extend_from_slice(l4);
        h
    }

    /// IPv6 header (40 bytes) with next header `next`, then `l4`.
    fn ipv6(src: u8, next: u8, l4: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; 40];
        h[0] = 0x60;
        h[6] = next;
        h[23] = src;
        h[39] = 9;
        h.extend_from_slice(l4);
        h
    }

    #[test]
    fn flow_hash_keeps_a_flow_together_and_tells_flows_apart() {
        let keys = std::collections::hash_map::RandomState::new();
        let h = |f: &[u8]| flow_hash(f, &keys);
        let tcp = |sport: u16, payload: u8| {
            let mut l4 = sport.to_be_bytes().to_vec();
            l4.extend_from_slice(&[0x14, 0x51, payload, payload]);
            l4
        };
        // One TCP flow hashes alike whatever the payload or a VLAN tag; another port,
        // another source address or another protocol is another flow.
        let a = h(&ip_frame(None, 0x0800, &ipv4(1, 6, 0, &tcp(40000, 1))));
        assert_ne!(a, 0);
        assert_eq!(
            a,
            h(&ip_frame(None, 0x0800, &ipv4(1, 6, 0, &tcp(40000, 2))))
        );
        assert_eq!(
            a,
            h(&ip_frame(Some(7), 0x0800, &ipv4(1, 6, 0, &tcp(40000, 3))))
        );
        assert_ne!(
            a,
            h(&ip_frame(None, 0x0800, &ipv4(1, 6, 0, &tcp(40001, 1))))
        );
        assert_ne!(
            a,
            h(&ip_frame(None, 0x0800, &ipv4(2, 6, 0, &tcp(40000, 1))))
        );
        assert_ne!(
            a,
            h(&ip_frame(None, 0x0800, &ipv4(1, 17, 0, &tcp(40000, 1))))
        );
        // Every fragment of a datagram hashes alike: the first (ports present) as the rest.
        let first = h(&ip_frame(
            None,
            0x0800,
            &ipv4(1, 17, 0x2000, &tcp(40000, 1)),
        ));
        let later = h(&ip_frame(None, 0x0800, &ipv4(1, 17, 185, &[9; 8])));
        assert_eq!(first, later);
        assert_ne!(first, 0);
        // IPv6 likewise, ports included for TCP and UDP.
        let v6 = h(&ip_frame(None, 0x86dd, &ipv6(1, 17, &tcp(5000, 1))));
        assert_ne!(v6, 0);
        assert_eq!(v6, h(&ip_frame(None, 0x86dd, &ipv6(1, 17, &tcp(5000, 2)))));
        assert_ne!(v6, h(&ip_frame(None, 0x86dd, &ipv6(1, 17, &tcp(5001, 1)))));
        // Not IP, or IP too short to have addresses: no flow (queue 0).
        assert_eq!(h(&ip_frame(None, 0x0806, &[0; 28])), 0);
        assert_eq!(h(&ip_frame(None, 0x0800, &[0x45, 0, 0])), 0);
        assert_eq!(h(&ip_frame(None, 0x86dd, &[0x60; 39])), 0);
        assert_eq!(h(&ip_frame(None, 0x0800, &ipv4(1, 6, 0, &[])[..19])), 0);
        assert_eq!(h(&[]), 0);
    }

    #[test]
    fn flow_hash_spreads_flows_over_queues() {
        let keys = std::collections::hash_map::RandomState::new();
        let mut per_queue = [0u32; 4];
        for port in 0..400u16 {
            let mut l4 = (30000 + port).to_be_bytes().to_vec();
            l4.extend_from_slice(&[0x14, 0x51]);
            let f = ip_frame(None, 0x0800, &ipv4(1, 6, 0, &l4));
            per_queue[(flow_hash(&f, &keys) % 4) as usize] += 1;
        }
        // 400 flows over 4 queues: each gets a share (100 expected; 40 is > 6 sigma off).
        assert!(per_queue.iter().all(|&n| n > 40), "{per_queue:?}");
    }

    #[test]
    fn a_priority_tag_never_hides_the_vlan_behind_it() {
        let mut f = frame(VnetHdr::default(), 60);
        let n = f.len();
        f.resize(n + 8, 0);
        let n = insert_vlan(&mut f, n, 0x8100, 0x000a).unwrap();
        assert_eq!(vlan_of(&f[..n]), Some(10));
        let n = insert_vlan(&mut f, n, 0x8100, 0xe000).unwrap();
        assert_eq!(outer_tag(&f[..n]), Some((0x8100, 0xe000)));
        assert_eq!(vlan_of(&f[..n]), Some(10), "the priority tag gives way");
        let mut p = frame(VnetHdr::default(), 60);
        let m = p.len();
        p.resize(m + 4, 0);
        let m = insert_vlan(&mut p, m, 0x8100, 0xe000).unwrap();
        assert_eq!(vlan_of(&p[..m]), None, "a priority tag alone is untagged");
    }

    /// Found by the fuzzer: a tag with a single byte after it; stripped, no EtherType is
    /// left, so the frame stays as it is.
    #[test]
    fn a_tag_with_no_ethertype_after_it_is_not_stripped() {
        let mut f = vec![
            2, 0, 0, 1, 16, 8, 23, 251, 0, 0, 0, 10, 49, 2, 0, 0, 0, 0, 52, 84, 0, 122, 129, 0, 0,
            0, 0,
        ];
        assert!(check_frame(&f).is_ok());
        let before = f.clone();
        assert_eq!(strip_vlan(&mut f, before.len()), None);
        assert_eq!(f, before);
    }

    #[test]
    fn vlan_tag_goes_back_after_the_macs_and_moves_the_offsets() {
        let h = tso();
        let mut buf = frame(h, 2000);
        buf[VNET_HDR_LEN..VLAN_TAG_AT].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        buf[VLAN_TAG_AT..VLAN_TAG_AT + 2].copy_from_slice(&[0x08, 0x00]);
        let len = buf.len();
        buf.resize(len + 4, 0);
        assert_eq!(insert_vlan(&mut buf, len, 0x88a8, 0x2064), Some(len + 4));
        let moved = VnetHdr::parse(buf.first_chunk().unwrap());
        assert_eq!(moved.csum_start, 38);
        assert_eq!(moved.hdr_len, 70);
        assert_eq!((moved.gso_size, moved.csum_offset), (1448, 16));
        assert_eq!(
            &buf[VNET_HDR_LEN..VLAN_TAG_AT],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
        );
        assert_eq!(
            &buf[VLAN_TAG_AT..VLAN_TAG_AT + 6],
            &[0x88, 0xa8, 0x20, 0x64, 0x08, 0x00]
        );
        assert!(check_frame(&buf).is_ok());
        // No room, or no MAC addresses: nothing changes.
        let mut full = frame(VnetHdr::default(), 60);
        let before = full.clone();
        assert_eq!(insert_vlan(&mut full, before.len(), 0x8100, 1), None);
        assert_eq!(insert_vlan(&mut full, 11, 0x8100, 1), None);
        assert_eq!(insert_vlan(&mut full, usize::MAX, 0x8100, 1), None);
        assert_eq!(full, before);
        // An offset that would overflow its 16 bits.
        let far = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: u16::MAX - 1,
            ..VnetHdr::default()
        };
        let mut f = frame(far, 60);
        let n = f.len();
        f.resize(n + 4, 0);
        assert_eq!(insert_vlan(&mut f, n, 0x8100, 1), None);
    }

    proptest! {
        /// The re-inserted tag sits after the MAC addresses, everything else keeps its bytes
        /// and order, and only the offsets that count from the frame start move.
        #[test]
        fn vlan_insertion_keeps_the_frame(
            body in proptest::collection::vec(any::<u8>(), 0..300),
            room in 0usize..8,
            tpid in any::<u16>(),
            tci in any::<u16>(),
        ) {
            let len = body.len();
            let mut buf = body.clone();
            buf.resize(len + room, 0x5a);
            match insert_vlan(&mut buf, len, tpid, tci) {
                None => prop_assert_eq!(&buf[..len], &body[..]),
                Some(n) => {
                    prop_assert!(room >= 4 && len >= VLAN_TAG_AT);
                    prop_assert_eq!(n, len + 4);
                    let (old, new) = (
                        VnetHdr::parse(body.first_chunk().unwrap()),
                        VnetHdr::parse(buf.first_chunk().unwrap()),
                    );
                    let moved = |a: u16, b: u16, on: bool| if on { b == a + 4 } else { b == a };
                    prop_assert!(moved(old.csum_start, new.csum_start, old.flags & F_NEEDS_CSUM != 0));
                    prop_assert!(moved(old.hdr_len, new.hdr_len, old.hdr_len != 0));
                    prop_assert_eq!((old.flags, old.gso_type, old.gso_size, old.csum_offset),
                        (new.flags, new.gso_type, new.gso_size, new.csum_offset));
                    prop_assert_eq!(&buf[VNET_HDR_LEN..VLAN_TAG_AT], &body[VNET_HDR_LEN..VLAN_TAG_AT]);
                    prop_assert_eq!(&buf[VLAN_TAG_AT..VLAN_TAG_AT + 2], &tpid.to_be_bytes()[..]);
                    prop_assert_eq!(&buf[VLAN_TAG_AT + 2..VLAN_TAG_AT + 4], &tci.to_be_bytes()[..]);
                    prop_assert_eq!(&buf[VLAN_TAG_AT + 4..n], &body[VLAN_TAG_AT..]);
                }
            }
        }

        /// A frame copied 4 bytes in and tagged ahead is the frame [`insert_vlan`] tags in
        /// place, and both refuse the same frames.
        #[test]
        fn tagging_ahead_is_tagging_in_place(
            body in proptest::collection::vec(any::<u8>(), 0..300),
            room in 0usize..8,
            tci in any::<u16>(),
        ) {
            let len = body.len();
            let mut in_place = body.clone();
            in_place.resize(len + room, 0);
            let mut ahead = vec![0u8; VLAN_TAG_LEN];
            ahead.extend_from_slice(&body);
            ahead.resize(len + room.max(VLAN_TAG_LEN), 0);
            ahead.truncate(len + room);
            let a = insert_vlan(&mut in_place, len, 0x8100, tci);
            if ahead.len() >= VLAN_TAG_LEN + len {
                let b = insert_vlan_ahead(&mut ahead, len, 0x8100, tci);
                prop_assert_eq!(a, b);
                if let Some(n) = a {
                    prop_assert_eq!(&in_place[..n], &ahead[..n]);
                }
            }
        }

        /// Stripping the tag [`insert_vlan`] put in gives the frame back, byte for byte, and
        /// the VLAN it was on is the tag's (none for a priority tag).
        #[test]
        fn a_stripped_tag_gives_the_frame_back(
            mut body in proptest::collection::vec(any::<u8>(), VLAN_TAG_AT + 2..300),
            outer in prop_oneof![Just(0x8100u16), Just(0x88a8u16)],
            tci in any::<u16>(),
        ) {
            // A frame with a plain header (offsets are the header's proptests' business) and
            // an EtherType after its MACs.
            body[..VNET_HDR_LEN].fill(0);
            let len = body.len();
            let mut buf = body.clone();
            buf.resize(len + 4, 0);
            if let Some(n) = insert_vlan(&mut buf, len, outer, tci) {
                prop_assert_eq!(outer_tag(&buf[..n]), Some((outer, tci)));
                let vid = tci & 0x0fff;
                prop_assert_eq!(vlan_of(&buf[..n]), (vid != 0).then_some(vid));
                prop_assert_eq!(strip_vlan(&mut buf, n), Some(len));
                prop_assert_eq!(&buf[..len], &body[..]);
            }
        }

        /// Stripping any bytes never panics, changes nothing when it refuses, and keeps a
        /// valid frame valid.
        #[test]
        fn stripping_arbitrary_bytes_is_safe(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut buf = b.clone();
            match strip_vlan(&mut buf, b.len()) {
                None => prop_assert_eq!(&buf, &b),
                Some(n) => {
                    prop_assert_eq!(n + 4, b.len());
                    if check_frame(&b).is_ok() {
                        prop_assert!(check_frame(&buf[..n]).is_ok());
                    }
                }
            }
        }

        #[test]
        fn arbitrary_frames_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let keys = std::collections::hash_map::RandomState::new();
            let _ = flow_hash(&b, &keys);
            if let Ok(h) = check_frame(&b) {
                let len = b.len() - VNET_HDR_LEN;
                if h.flags & F_NEEDS_CSUM != 0 {
                    prop_assert!(usize::from(h.csum_start) + usize::from(h.csum_offset) + 2 <= len);
                }
            }
        }
    }
}
