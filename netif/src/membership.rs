//! Multicast membership reports a host sends after moving to another IOC, so that the LAN's
//! snooping switches and multicast routers forward its groups to the new port at once
//! rather than at their next query: IGMP reports (RFC 2236, RFC 3376) for IPv4 groups and
//! MLDv2 reports (RFC 3810) for IPv6 ones, as the kernel sends when bonding asks it to
//! rejoin (`resend_igmp`). Pure: each function builds whole Ethernet frames, without FCS.

use crate::announce::{ethernet, fold, icmpv6_checksum, sum_words};
use crate::groups::IgmpVersion;
use std::net::{Ipv4Addr, Ipv6Addr};

/// IGMPv3 reports go to all IGMPv3-capable routers (RFC 3376 section 4.2.14).
const IGMPV3_ROUTERS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 22);
/// MLDv2 reports go to all MLDv2-capable routers (RFC 3810 section 5.2.14).
const MLDV2_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16);
const ALL_HOSTS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 1);
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_IGMP: u8 = 2;
const IPPROTO_ICMPV6: u8 = 58;
/// An IPv4 header with the 4-byte Router Alert option (RFC 2113), as IGMP requires.
const IPV4_RA_HLEN: usize = 24;
const IPV6_HLEN: usize = 40;
/// A Hop-by-Hop Options header holding Router Alert (RFC 2711) for MLD, padded to 8.
const HOP_BY_HOP_RA: [u8; 8] = [IPPROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
const IGMP_V1_REPORT: u8 = 0x12;
const IGMP_V2_REPORT: u8 = 0x16;
const IGMP_V3_REPORT: u8 = 0x22;
const MLD_V2_REPORT: u8 = 143;
/// A Current-State Record saying the host receives the group from every source.
const MODE_IS_EXCLUDE: u8 = 2;
/// An IGMPv3 group record without sources; an MLDv2 one.
const IGMPV3_RECORD: usize = 8;
const MLDV2_RECORD: usize = 20;
/// The records one report carries, so that a frame fits a 1,500-byte MTU.
const IGMPV3_PER_FRAME: usize = (1500 - IPV4_RA_HLEN - 8) / IGMPV3_RECORD;
const MLDV2_PER_FRAME: usize = (1500 - IPV6_HLEN - 8 - 8) / MLDV2_RECORD;

/// The IGMP reports from `mac` and `src` (an address of the interface, or 0.0.0.0) for
/// `groups`, in the kernel's `version`: one frame per group for IGMPv1 and v2 (sent to the
/// group), IGMPv3 records in as few frames as fit (to 224.0.0.22). All-hosts (224.0.0.1)
/// and any non-multicast address are never reported.
pub fn igmp_reports(
    mac: [u8; 6],
    src: Ipv4Addr,
    version: IgmpVersion,
    groups: &[Ipv4Addr],
) -> Vec<Vec<u8>> {
    let groups: Vec<Ipv4Addr> = groups
        .iter()
        .copied()
        .filter(|g| g.is_multicast() && *g != ALL_HOSTS)
        .collect();
    let kind = match version {
        IgmpVersion::V1 => IGMP_V1_REPORT,
        IgmpVersion::V2 => IGMP_V2_REPORT,
        IgmpVersion::V3 => {
            return groups
                .chunks(IGMPV3_PER_FRAME)
                .map(|chunk| {
                    let mut msg = vec![IGMP_V3_REPORT, 0, 0, 0, 0, 0];
                    msg.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
                    for g in chunk {
                        msg.extend_from_slice(&[MODE_IS_EXCLUDE, 0, 0, 0]);
                        msg.extend_from_slice(&g.octets());
                    }
                    ipv4_frame(mac, src, IGMPV3_ROUTERS, msg)
                })
                .collect();
        }
    };
    groups
        .iter()
        .map(|g| {
            let mut msg = vec![kind, 0, 0, 0];
            msg.extend_from_slice(&g.octets());
            ipv4_frame(mac, src, *g, msg)
        })
        .collect()
}

/// The MLDv2 reports from `mac` and `src` (the interface's link-local address, or ::) for
/// `groups`, in as few frames as fit, to ff02::16. Groups of node-local scope and
/// all-nodes (ff02::1) are never reported (RFC 3810 section 6).
pub fn mld_reports(mac: [u8; 6], src: Ipv6Addr, groups: &[Ipv6Addr]) -> Vec<Vec<u8>> {
    let groups: Vec<Ipv6Addr> = groups
        .iter()
        .copied()
        .filter(|g| g.is_multicast() && g.octets()[1] & 0x0f > 1)
        .filter(|g| *g != Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1))
        .collect();
    groups
        .chunks(MLDV2_PER_FRAME)
        .map(|chunk| {
            let mut msg = vec![MLD_V2_REPORT, 0, 0, 0, 0, 0];
            msg.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            for g in chunk {
                msg.extend_from_slice(&[MODE_IS_EXCLUDE, 0, 0, 0]);
                msg.extend_from_slice(&g.octets());
            }
            let sum = icmpv6_checksum(&src, &MLDV2_ROUTERS, &msg);
            msg[2..4].copy_from_slice(&sum.to_be_bytes());
            let payload = HOP_BY_HOP_RA.len() + msg.len();
            let mut f = ethernet(
                ipv6_group_mac(&MLDV2_ROUTERS),
                mac,
                ETH_P_IPV6,
                14 + IPV6_HLEN + payload,
            );
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(payload as u16).to_be_bytes());
            // Next header Hop-by-Hop Options, hop limit 1.
            f.extend_from_slice(&[0, 1]);
            f.extend_from_slice(&src.octets());
            f.extend_from_slice(&MLDV2_ROUTERS.octets());
            f.extend_from_slice(&HOP_BY_HOP_RA);
            f.extend_from_slice(&msg);
            f
        })
        .collect()
}

/// An IGMP message `msg` (its checksum filled in here) in an IPv4 packet from `src` to
/// `dst` with TTL 1, TOS 0xc0 and Router Alert, as Linux sends it.
fn ipv4_frame(mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, mut msg: Vec<u8>) -> Vec<u8> {
    let sum = !fold(sum_words(&msg));
    msg[2..4].copy_from_slice(&sum.to_be_bytes());
    let total = IPV4_RA_HLEN + msg.len();
    let mut ip = vec![0x46, 0xc0];
    ip.extend_from_slice(&(total as u16).to_be_bytes());
    // Identification 0, Don't Fragment, TTL 1, IGMP, checksum (below).
    ip.extend_from_slice(&[0, 0, 0x40, 0, 1, IPPROTO_IGMP, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&[0x94, 0x04, 0, 0]);
    let sum = !fold(sum_words(&ip));
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut f = ethernet(ipv4_group_mac(dst), mac, ETH_P_IP, 14 + total);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&msg);
    f
}

/// The Ethernet group of an IPv4 group (RFC 1112 section 6.4): 01:00:5e and its low 23 bits.
fn ipv4_group_mac(g: Ipv4Addr) -> [u8; 6] {
    let o = g.octets();
    [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
}

/// The Ethernet group of an IPv6 group (RFC 2464 section 7): 33:33 and its low 32 bits.
fn ipv6_group_mac(g: &Ipv6Addr) -> [u8; 6] {
    let o = g.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAC: [u8; 6] = [0x02, 0x5d, 0, 0, 1, 1];

    fn u16_at(f: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([f[at], f[at + 1]])
    }

    /// The Internet checksum over `b` verifies (sums to all ones), summed with a carry at
    /// each step, unlike the module.
    fn verifies(b: &[u8]) -> bool {
        let mut sum: u16 = 0;
        for pair in b.chunks(2) {
            let (s, carry) = sum.overflowing_add(u16::from_be_bytes([pair[0], pair[1]]));
            sum = s + u16::from(carry);
        }
        sum == 0xffff
    }

    /// An IPv4 IGMP frame's groups, checking its headers and checksums on the way.
    fn igmp_groups(f: &[u8], src: Ipv4Addr) -> (u8, Vec<Ipv4Addr>) {
        assert_eq!(u16_at(f, 12), 0x0800);
        let ip = &f[14..38];
        assert_eq!((ip[0], ip[1], ip[8], ip[9]), (0x46, 0xc0, 1, 2));
        assert_eq!(&ip[20..24], &[0x94, 4, 0, 0], "Router Alert");
        assert_eq!(usize::from(u16_at(ip, 2)), f.len() - 14);
        assert_eq!(&ip[12..16], &src.octets());
        assert!(verifies(ip), "IPv4 header checksum");
        let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        assert_eq!(
            &f[0..6],
            &ipv4_group_mac(dst),
            "the destination's Ethernet group"
        );
        let msg = &f[38..];
        assert!(verifies(msg), "IGMP checksum");
        if msg[0] == IGMP_V3_REPORT {
            assert_eq!(dst, IGMPV3_ROUTERS);
            let n = usize::from(u16_at(msg, 6));
            assert_eq!(msg.len(), 8 + n * 8);
            let groups = msg[8..]
                .chunks(8)
                .map(|r| {
                    assert_eq!(&r[..4], &[MODE_IS_EXCLUDE, 0, 0, 0]);
                    Ipv4Addr::new(r[4], r[5], r[6], r[7])
                })
                .collect();
            return (msg[0], groups);
        }
        assert_eq!(msg.len(), 8);
        let g = Ipv4Addr::new(msg[4], msg[5], msg[6], msg[7]);
        assert_eq!(dst, g, "a v1/v2 report goes to its group");
        (msg[0], vec![g])
    }

    #[test]
    fn igmpv3_reports_every_group_but_all_hosts_in_one_frame() {
        let src = Ipv4Addr::new(10, 50, 0, 1);
        let groups = [
            Ipv4Addr::new(224, 0, 0, 1),
            Ipv4Addr::new(239, 1, 2, 3),
            Ipv4Addr::new(224, 0, 0, 251),
            Ipv4Addr::new(10, 0, 0, 1),
        ];
        let f = igmp_reports(MAC, src, IgmpVersion::V3, &groups);
        assert_eq!(f.len(), 1);
        assert_eq!(&f[0][0..6], &[0x01, 0, 0x5e, 0, 0, 0x16]);
        assert_eq!(&f[0][6..12], &MAC);
        assert_eq!(igmp_groups(&f[0], src), (0x22, vec![groups[1], groups[2]]));
    }

    #[test]
    fn igmpv2_and_v1_report_each_group_to_itself() {
        let g = [Ipv4Addr::new(239, 129, 2, 3), Ipv4Addr::new(224, 0, 0, 251)];
        for (v, kind) in [(IgmpVersion::V2, 0x16), (IgmpVersion::V1, 0x12)] {
            let f = igmp_reports(MAC, Ipv4Addr::UNSPECIFIED, v, &g);
            assert_eq!(f.len(), 2);
            assert_eq!(
                igmp_groups(&f[0], Ipv4Addr::UNSPECIFIED),
                (kind, vec![g[0]])
            );
            // 239.129.2.3's Ethernet group drops the 24th bit.
            assert_eq!(&f[0][0..6], &[0x01, 0, 0x5e, 0x01, 2, 3]);
            assert_eq!(
                igmp_groups(&f[1], Ipv4Addr::UNSPECIFIED),
                (kind, vec![g[1]])
            );
        }
    }

    #[test]
    fn mldv2_reports_carry_router_alert_and_a_checksum() {
        let src: Ipv6Addr = "fe80::5d:ff:fe00:101".parse().unwrap();
        let groups: Vec<Ipv6Addr> = ["ff02::1", "ff01::1", "ff02::1:ff00:101", "ff0e::42"]
            .iter()
            .map(|g| g.parse().unwrap())
            .collect();
        let f = mld_reports(MAC, src, &groups);
        assert_eq!(f.len(), 1);
        let f = &f[0];
        assert_eq!(&f[0..6], &[0x33, 0x33, 0, 0, 0, 0x16]);
        assert_eq!(u16_at(f, 12), 0x86dd);
        assert_eq!((f[20], f[21]), (0, 1), "Hop-by-Hop next, hop limit 1");
        assert_eq!(&f[54..62], &HOP_BY_HOP_RA);
        let msg = &f[62..];
        assert_eq!(usize::from(u16_at(f, 18)), 8 + msg.len(), "payload length");
        assert_eq!((msg[0], u16_at(msg, 6)), (143, 2));
        assert_eq!(&msg[12..28], &groups[2].octets());
        assert_eq!(&msg[32..48], &groups[3].octets());
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&f[22..54]);
        pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        pseudo.extend_from_slice(msg);
        assert!(verifies(&pseudo), "ICMPv6 checksum");
    }

    #[test]
    fn nothing_to_report_sends_nothing() {
        let all = [Ipv4Addr::new(224, 0, 0, 1)];
        assert!(igmp_reports(MAC, Ipv4Addr::UNSPECIFIED, IgmpVersion::V3, &all).is_empty());
        assert!(mld_reports(MAC, Ipv6Addr::UNSPECIFIED, &["ff02::1".parse().unwrap()]).is_empty());
    }

    proptest! {
        #[test]
        fn igmpv3_frames_fit_the_mtu_and_carry_every_group(
            n in 0usize..600, src in any::<Ipv4Addr>(),
        ) {
            let groups: Vec<Ipv4Addr> =
                (0..n as u32).map(|i| Ipv4Addr::from(0xef00_0000 | i)).collect();
            let frames = igmp_reports(MAC, src, IgmpVersion::V3, &groups);
            let mut got = Vec::new();
            for f in &frames {
                prop_assert!(f.len() <= 1514);
                got.extend(igmp_groups(f, src).1);
            }
            prop_assert_eq!(got, groups);
        }

        #[test]
        fn mldv2_frames_fit_the_mtu_and_carry_every_group(n in 0usize..300) {
            let groups: Vec<Ipv6Addr> =
                (0..n as u128).map(|i| Ipv6Addr::from((0xff0e << 112) | i)).collect();
            let frames = mld_reports(MAC, Ipv6Addr::UNSPECIFIED, &groups);
            let mut got = Vec::new();
            for f in &frames {
                prop_assert!(f.len() <= 1514);
                let msg = &f[62..];
                prop_assert_eq!(msg.len(), 8 + 20 * usize::from(u16_at(msg, 6)));
                got.extend(msg[8..].chunks(20).map(|r| {
                    Ipv6Addr::from(<[u8; 16]>::try_from(&r[4..]).unwrap())
                }));
            }
            prop_assert_eq!(got, groups);
        }
    }
}
