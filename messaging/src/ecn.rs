//! Explicit Congestion Notification (RFC 3168): a queue that must shed marks an
//! ECN-capable packet Congestion Experienced instead of dropping it, and the flow's
//! receiver echoes the mark back so the sender slows down as it would for a loss, without
//! one.
//!
//! Written by hand: a two-bit rewrite and an incremental IPv4 header checksum update
//! (RFC 1624) on frames as the daemons carry them (virtio-net header, Ethernet, up to two
//! VLAN tags), for which no crate works in place on these buffers.

use crate::vnet::{self, VNET_HDR_LEN};

/// The ECN field's codepoints (the two low bits of the IPv4 TOS or IPv6 traffic class).
const NOT_ECT: u8 = 0b00;
const CE: u8 = 0b11;

/// What [`mark_ce`] did to a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Its packet was ECN-capable (ECT(0) or ECT(1)) and now carries CE.
    Marked,
    /// Its packet already carried CE.
    AlreadyMarked,
    /// Not an IPv4 or IPv6 packet of an ECN-capable transport: left as it was.
    NotCapable,
}

/// Marks the IP packet in `frame` (a virtio-net header, then Ethernet) Congestion
/// Experienced when it is ECN-capable, keeping an IPv4 header's checksum right. A GSO
/// super-frame's header is copied into each of its segments, so all of them carry the
/// mark. Any bytes are accepted; a frame too short or not IP is left alone.
pub fn mark_ce(frame: &mut [u8]) -> Mark {
    let Some(eth) = frame.get_mut(VNET_HDR_LEN..) else {
        return Mark::NotCapable;
    };
    let l2 = vnet::l2_len(eth);
    let ethertype = match eth.get(l2 - 2..l2) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        _ => return Mark::NotCapable,
    };
    let at = l2.min(eth.len());
    let l3 = &mut eth[at..];
    match ethertype {
        0x0800 => mark_ipv4(l3),
        0x86dd => mark_ipv6(l3),
        _ => Mark::NotCapable,
    }
}

fn mark_ipv4(ip: &mut [u8]) -> Mark {
    let Some(&ver_ihl) = ip.first() else {
        return Mark::NotCapable;
    };
    let ihl = usize::from(ver_ihl & 0x0f) * 4;
    if ver_ihl >> 4 != 4 || ihl < 20 || ip.len() < ihl {
        return Mark::NotCapable;
    }
    match ip[1] & CE {
        NOT_ECT => return Mark::NotCapable,
        CE => return Mark::AlreadyMarked,
        _ => {}
    }
    let old = u16::from_be_bytes([ip[0], ip[1]]);
    ip[1] |= CE;
    let new = u16::from_be_bytes([ip[0], ip[1]]);
    let check = u16::from_be_bytes([ip[10], ip[11]]);
    ip[10..12].copy_from_slice(&checksum_update(check, old, new).to_be_bytes());
    Mark::Marked
}

fn mark_ipv6(ip: &mut [u8]) -> Mark {
    // Version (4 bits), traffic class (8), flow label (20): the ECN field is bits 4-5 of
    // the second byte.
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Mark::NotCapable;
    }
    match (ip[1] >> 4) & CE {
        NOT_ECT => Mark::NotCapable,
        CE => Mark::AlreadyMarked,
        _ => {
            ip[1] |= CE << 4;
            Mark::Marked
        }
    }
}

/// The ones' complement checksum `check` after one 16-bit word it covers changed from `old`
/// to `new` (RFC 1624, equation 3: HC' = ~(~HC + ~m + m')).
fn checksum_update(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!check) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The IPv4 header checksum computed from scratch (its field taken as zero).
    fn ipv4_checksum(h: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for (i, w) in h.chunks(2).enumerate() {
            if i != 5 {
                sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
            }
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// A frame with `tags` VLAN tags around an IPv4 header of TOS `tos` (checksum right).
    fn v4(tos: u8, tags: usize) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR_LEN + 12];
        for _ in 0..tags {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let ip = f.len();
        f.extend_from_slice(&[0x45, tos, 0x05, 0xdc, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 50, 0, 2]);
        let c = ipv4_checksum(&f[ip..ip + 20]);
        f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        f.resize(f.len() + 40, 0xab);
        f
    }

    fn v6(tc: u8) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR_LEN + 12];
        f.extend_from_slice(&[0x86, 0xdd]);
        f.extend_from_slice(&[0x60 | (tc >> 4), (tc << 4) | 0x0a, 0xbc, 0xde]);
        f.resize(f.len() + 36 + 20, 0);
        f
    }

    #[test]
    fn ect_ipv4_gets_ce_with_a_right_checksum() {
        for (ect, tags) in [(0b10, 0), (0b01, 1), (0b10, 2)] {
            let mut f = v4(0xb8 | ect, tags);
            let ip = VNET_HDR_LEN + 14 + 4 * tags;
            assert_eq!(mark_ce(&mut f), Mark::Marked);
            assert_eq!(f[ip + 1], 0xb8 | CE, "DSCP kept");
            let check = u16::from_be_bytes([f[ip + 10], f[ip + 11]]);
            assert_eq!(check, ipv4_checksum(&f[ip..ip + 20]));
            assert_eq!(mark_ce(&mut f), Mark::AlreadyMarked);
        }
    }

    #[test]
    fn ect_ipv6_gets_ce_and_keeps_its_flow_label() {
        let mut f = v6(0xb8 | 0b10);
        let ip = VNET_HDR_LEN + 14;
        assert_eq!(mark_ce(&mut f), Mark::Marked);
        assert_eq!(f[ip..ip + 4], [0x6b, 0xba, 0xbc, 0xde]);
        assert_eq!((f[ip] & 0x0f) << 4 | f[ip + 1] >> 4, 0xb8 | CE);
        assert_eq!(mark_ce(&mut f), Mark::AlreadyMarked);
    }

    #[test]
    fn what_is_not_ecn_capable_is_left_alone() {
        for mut f in [
            v4(0xb8, 0),
            v6(0xb8),
            vec![0u8; 5],
            vec![0u8; VNET_HDR_LEN + 13],
        ] {
            let before = f.clone();
            assert_eq!(mark_ce(&mut f), Mark::NotCapable);
            assert_eq!(f, before);
        }
        // ARP; an IPv4 header cut short; a bad IHL.
        let mut arp = v4(0b10, 0);
        arp[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14].copy_from_slice(&[0x08, 0x06]);
        let mut short = v4(0b10, 0);
        short.truncate(VNET_HDR_LEN + 14 + 19);
        let mut ihl = v4(0b10, 0);
        ihl[VNET_HDR_LEN + 14] = 0x44;
        for mut f in [arp, short, ihl] {
            let before = f.clone();
            assert_eq!(mark_ce(&mut f), Mark::NotCapable);
            assert_eq!(f, before);
        }
    }

    proptest! {
        /// For any IPv4 header with a right checksum, marking keeps it right and changes
        /// nothing but the ECN field and the checksum.
        #[test]
        fn the_checksum_stays_right(head in proptest::array::uniform20(any::<u8>()), ihl in 5u8..16) {
            let mut h = head;
            h[0] = 0x40 | ihl;
            let c = ipv4_checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            let mut f = vec![0u8; VNET_HDR_LEN + 12];
            f.extend_from_slice(&[0x08, 0x00]);
            f.extend_from_slice(&h);
            f.resize(VNET_HDR_LEN + 14 + usize::from(ihl) * 4, 0);
            let before = f.clone();
            let m = mark_ce(&mut f);
            let ip = VNET_HDR_LEN + 14;
            prop_assert_eq!(m == Mark::Marked, matches!(h[1] & 3, 1 | 2));
            let check = u16::from_be_bytes([f[ip + 10], f[ip + 11]]);
            let mut h2: [u8; 20] = f[ip..ip + 20].try_into().unwrap();
            prop_assert_eq!(ipv4_checksum(&h2), check);
            h2[1] = before[ip + 1];
            h2[10..12].copy_from_slice(&before[ip + 10..ip + 12]);
            prop_assert_eq!(&h2[..], &before[ip..ip + 20]);
            prop_assert_eq!(&f[ip + 20..], &before[ip + 20..]);
        }

        /// Any bytes: no panic, and a frame left alone is unchanged.
        #[test]
        fn any_bytes(mut f in proptest::collection::vec(any::<u8>(), 0..120)) {
            let before = f.clone();
            if mark_ce(&mut f) != Mark::Marked {
                prop_assert_eq!(f, before);
            }
        }
    }
}
