//! The frames a NIC driver sends after a failover so that the LAN's switches and neighbours
//! learn where a MAC now lives: a gratuitous ARP per IPv4 address and an unsolicited
//! Neighbor Advertisement per IPv6 address (as Linux bonding sends), and QEMU's
//! announce-self RARP for a MAC whose addresses are not known. Pure: each function builds
//! one whole Ethernet frame, without FCS, for the caller to send.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Ethernet's shortest frame without FCS; ARP and RARP frames are padded to it.
const MIN_FRAME: usize = 60;
/// An Ethernet header: destination, source, ethertype.
const ETH_HLEN: usize = 14;
const BROADCAST: [u8; 6] = [0xff; 6];
/// The Ethernet group of ff02::1, all IPv6 nodes (RFC 2464 section 7).
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_RARP: u16 = 0x8035;
const ETH_P_IPV6: u16 = 0x86dd;
const ARPHRD_ETHER: u16 = 1;
const ETH_P_IP: u16 = 0x0800;
const ARPOP_REQUEST: u16 = 1;
const ARPOP_RREQUEST: u16 = 3;
/// An IPv6 header without extensions.
const IPV6_HLEN: usize = 40;
const IPPROTO_ICMPV6: u8 = 58;
const ND_NEIGHBOR_ADVERT: u8 = 136;
const ND_NA_FLAG_OVERRIDE: u32 = 0x2000_0000;
const ND_OPT_TARGET_LINKADDR: u8 = 2;
/// A Neighbor Advertisement: type, code, checksum (4), flags (4), target (16) and one
/// Target Link-Layer Address option of 8 bytes.
const NA_LEN: usize = 32;

/// A gratuitous ARP announcing that `ip` is at `mac` (RFC 5227 section 3, as Linux
/// bonding sends on failover): a broadcast ARP request whose sender and target IP are both
/// `ip`, the target MAC zero, padded to 60 bytes.
pub fn gratuitous_arp(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    arp(ETH_P_ARP, ARPOP_REQUEST, mac, ip, [0; 6], ip)
}

/// QEMU's announce-self frame for `mac` (`announce_self_create`): a broadcast RARP
/// reverse request (RFC 903) whose sender and target MAC are both `mac` and whose IPs are
/// zero, padded to 60 bytes. It needs no address, so any MAC can be announced.
pub fn rarp_announce(mac: [u8; 6]) -> Vec<u8> {
    let zero = Ipv4Addr::UNSPECIFIED;
    arp(ETH_P_RARP, ARPOP_RREQUEST, mac, zero, mac, zero)
}

/// An unsolicited Neighbor Advertisement announcing that `ip` is at `mac` (RFC 4861
/// section 7.2.6): from `ip` to ff02::1 (Ethernet 33:33:00:00:00:01), hop limit 255, the
/// Override flag set and Router and Solicited clear, with a Target Link-Layer Address
/// option of `mac`.
pub fn unsolicited_na(mac: [u8; 6], ip: Ipv6Addr) -> Vec<u8> {
    let mut msg = Vec::with_capacity(NA_LEN);
    msg.extend_from_slice(&[ND_NEIGHBOR_ADVERT, 0, 0, 0]);
    msg.extend_from_slice(&ND_NA_FLAG_OVERRIDE.to_be_bytes());
    msg.extend_from_slice(&ip.octets());
    msg.extend_from_slice(&[ND_OPT_TARGET_LINKADDR, 1]);
    msg.extend_from_slice(&mac);
    let sum = icmpv6_checksum(&ip, &ALL_NODES, &msg);
    msg[2..4].copy_from_slice(&sum.to_be_bytes());

    let mut f = ethernet(
        ALL_NODES_MAC,
        mac,
        ETH_P_IPV6,
        ETH_HLEN + IPV6_HLEN + NA_LEN,
    );
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(NA_LEN as u16).to_be_bytes());
    f.extend_from_slice(&[IPPROTO_ICMPV6, 255]);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&ALL_NODES.octets());
    f.extend_from_slice(&msg);
    f
}

/// An Ethernet header, in a buffer with room for `cap` bytes.
pub(crate) fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, cap: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(cap);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A broadcast ARP or RARP frame for Ethernet and IPv4 from `mac`, padded to
/// [`MIN_FRAME`].
fn arp(
    ethertype: u16,
    op: u16,
    mac: [u8; 6],
    sender_ip: Ipv4Addr,
    target_mac: [u8; 6],
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    let mut f = ethernet(BROADCAST, mac, ethertype, MIN_FRAME);
    f.extend_from_slice(&ARPHRD_ETHER.to_be_bytes());
    f.extend_from_slice(&ETH_P_IP.to_be_bytes());
    f.extend_from_slice(&[6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&mac);
    f.extend_from_slice(&sender_ip.octets());
    f.extend_from_slice(&target_mac);
    f.extend_from_slice(&target_ip.octets());
    f.resize(MIN_FRAME, 0);
    f
}

/// The ICMPv6 checksum of `msg` (its checksum field zero) from `src` to `dst`: the
/// Internet checksum (RFC 1071) over the IPv6 pseudo-header and `msg` (RFC 4443
/// section 2.3).
pub(crate) fn icmpv6_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, msg: &[u8]) -> u16 {
    let len = (msg.len() as u32).to_be_bytes();
    let pseudo = [0, 0, 0, IPPROTO_ICMPV6];
    let words = [&src.octets()[..], &dst.octets(), &len, &pseudo, msg]
        .into_iter()
        .map(sum_words)
        .sum::<u64>();
    !fold(words)
}

/// The sum of `b` as big-endian 16-bit words, an odd last byte padded with zero.
pub(crate) fn sum_words(b: &[u8]) -> u64 {
    b.chunks(2)
        .map(|w| u64::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum()
}

/// `sum` folded to 16 bits with end-around carry.
pub(crate) fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30];

    fn u16_at(f: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([f[at], f[at + 1]])
    }

    fn mac_at(f: &[u8], at: usize) -> [u8; 6] {
        f[at..at + 6].try_into().unwrap()
    }

    fn v4_at(f: &[u8], at: usize) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&f[at..at + 4]).unwrap())
    }

    fn v6_at(f: &[u8], at: usize) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap())
    }

    /// An NA's checksum verifies when the one's-complement sum of the pseudo-header (built
    /// from the frame's own IPv6 header) and the message, checksum included, is all ones.
    /// Summed here byte pair by byte pair with a carry at each step, unlike the module.
    fn na_checksum_verifies(f: &[u8]) -> bool {
        let ip = &f[14..54];
        let msg = &f[54..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&ip[8..40]);
        pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, ip[6]]);
        let mut sum: u16 = 0;
        for pair in pseudo.chunks(2).chain(msg.chunks(2)) {
            let w = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            let (s, carry) = sum.overflowing_add(w);
            sum = s + u16::from(carry);
        }
        sum == 0xffff
    }

    fn check_arp(f: &[u8], ethertype: u16, op: u16, mac: [u8; 6]) {
        assert_eq!(f.len(), 60);
        assert_eq!(mac_at(f, 0), [0xff; 6]);
        assert_eq!(mac_at(f, 6), mac);
        assert_eq!(u16_at(f, 12), ethertype);
        assert_eq!(u16_at(f, 14), 1, "htype Ethernet");
        assert_eq!(u16_at(f, 16), 0x0800, "ptype IPv4");
        assert_eq!((f[18], f[19]), (6, 4));
        assert_eq!(u16_at(f, 20), op);
        assert_eq!(mac_at(f, 22), mac, "sender MAC");
        assert!(f[42..].iter().all(|&b| b == 0), "padding");
    }

    #[test]
    fn a_gratuitous_arp_is_a_broadcast_request_for_its_own_address() {
        let ip = Ipv4Addr::new(192, 0, 2, 7);
        let f = gratuitous_arp(MAC, ip);
        check_arp(&f, 0x0806, 1, MAC);
        assert_eq!(v4_at(&f, 28), ip, "sender IP");
        assert_eq!(mac_at(&f, 32), [0; 6], "target MAC");
        assert_eq!(v4_at(&f, 38), ip, "target IP");
    }

    #[test]
    fn a_rarp_announce_is_qemus_reverse_request() {
        let f = rarp_announce(MAC);
        check_arp(&f, 0x8035, 3, MAC);
        assert_eq!(v4_at(&f, 28), Ipv4Addr::UNSPECIFIED, "sender IP");
        assert_eq!(mac_at(&f, 32), MAC, "target MAC");
        assert_eq!(v4_at(&f, 38), Ipv4Addr::UNSPECIFIED, "target IP");
    }

    #[test]
    fn an_unsolicited_na_overrides_to_all_nodes() {
        let ip: Ipv6Addr = "2001:db8::42".parse().unwrap();
        let f = unsolicited_na(MAC, ip);
        assert_eq!(f.len(), 14 + 40 + 32);
        // Ethernet.
        assert_eq!(mac_at(&f, 0), [0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(mac_at(&f, 6), MAC);
        assert_eq!(u16_at(&f, 12), 0x86dd);
        // IPv6: version 6, traffic class and flow 0.
        assert_eq!(&f[14..18], &[0x60, 0, 0, 0]);
        assert_eq!(u16_at(&f, 18), 32, "payload length");
        assert_eq!((f[20], f[21]), (58, 255), "next header, hop limit");
        assert_eq!(v6_at(&f, 22), ip);
        assert_eq!(v6_at(&f, 38), "ff02::1".parse::<Ipv6Addr>().unwrap());
        // ICMPv6 Neighbor Advertisement.
        assert_eq!((f[54], f[55]), (136, 0), "type, code");
        assert!(na_checksum_verifies(&f));
        assert_eq!(&f[58..62], &[0x20, 0, 0, 0], "Override alone");
        assert_eq!(v6_at(&f, 62), ip, "target");
        assert_eq!((f[78], f[79]), (2, 1), "Target Link-Layer Address, 8 bytes");
        assert_eq!(mac_at(&f, 80), MAC);
    }

    #[test]
    fn a_link_local_nas_checksum_is_the_known_one() {
        // Worked out apart from this crate (a short Python sum): fe80::1 at
        // 02:00:00:00:00:01.
        let f = unsolicited_na([2, 0, 0, 0, 0, 1], "fe80::1".parse().unwrap());
        assert_eq!(u16_at(&f, 56), 0x579b);
        assert!(na_checksum_verifies(&f));
        let mut damaged = f.clone();
        damaged[85] ^= 1;
        assert!(!na_checksum_verifies(&damaged));
    }

    #[test]
    fn the_internet_checksum_folds_carries_and_pads_odd_bytes() {
        assert_eq!(sum_words(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
        assert_eq!(fold(0x1_fffe), 0xffff);
        assert_eq!(fold(0xffff_ffff_ffff), 0xffff);
        assert_eq!(fold(0), 0);
    }

    proptest! {
        #[test]
        fn every_frame_carries_its_inputs(
            mac in any::<[u8; 6]>(),
            v4 in any::<Ipv4Addr>(),
            v6 in any::<Ipv6Addr>(),
        ) {
            let a = gratuitous_arp(mac, v4);
            prop_assert_eq!(a.len(), 60);
            prop_assert_eq!(u16_at(&a, 12), 0x0806);
            prop_assert_eq!(mac_at(&a, 6), mac);
            prop_assert_eq!(mac_at(&a, 22), mac);
            prop_assert_eq!(v4_at(&a, 28), v4);
            prop_assert_eq!(v4_at(&a, 38), v4);

            let r = rarp_announce(mac);
            prop_assert_eq!(r.len(), 60);
            prop_assert_eq!(u16_at(&r, 12), 0x8035);
            prop_assert_eq!(mac_at(&r, 6), mac);
            prop_assert_eq!(mac_at(&r, 22), mac);
            prop_assert_eq!(mac_at(&r, 32), mac);

            let n = unsolicited_na(mac, v6);
            prop_assert_eq!(n.len(), 86);
            prop_assert_eq!(u16_at(&n, 12), 0x86dd);
            prop_assert_eq!(mac_at(&n, 6), mac);
            prop_assert_eq!(v6_at(&n, 22), v6);
            prop_assert_eq!(v6_at(&n, 62), v6);
            prop_assert_eq!(mac_at(&n, 80), mac);
            prop_assert!(na_checksum_verifies(&n));
        }
    }
}
