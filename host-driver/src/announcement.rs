//! What a host sends through its new IOC after a move so that the LAN learns it at once
//! (docs/protocol.md 6.5), as bonding and QEMU's announce-self do on a failover: a
//! gratuitous ARP per IPv4 address of sd0, an unsolicited neighbour advertisement per IPv6
//! one, a RARP for sd0's MAC and for each bridged MAC the IOC now holds for the host, and
//! membership reports of sd0's multicast groups for the LAN's snooping switches;
//! `announce_count` rounds, `announce_interval_ms` apart.

use splitnet_netif::{announce, groups, membership, netdev};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// The rounds of announcements still to send after a move.
#[derive(Debug)]
pub struct Announce {
    left: u32,
    next: Instant,
    interval: Duration,
    /// The bridged MACs the new IOC holds for the host (its Activate reply).
    bridged: Vec<[u8; 6]>,
}

impl Announce {
    /// `count` rounds `interval` apart from `now`, for the bridged MACs named in the new
    /// IOC's Activate reply `reply`; `None` for no round.
    pub fn new(count: u32, interval: Duration, now: Instant, reply: &[u8]) -> Option<Announce> {
        (count > 0).then(|| Announce {
            left: count,
            next: now,
            interval,
            bridged: bridged_macs(reply),
        })
    }

    /// When the next round is due.
    pub fn next(&self) -> Instant {
        self.next
    }

    /// The bridged MACs of a round due at `now` (the round counted), or `None` if none is
    /// due; `last` says it was the last round.
    pub fn due(&mut self, now: Instant) -> Option<(&[[u8; 6]], bool)> {
        if self.next > now || self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.next = now + self.interval;
        Some((&self.bridged, self.left == 0))
    }
}

/// The bridged MACs an Activate reply names (docs/protocol.md 3.2): 6 bytes each, at most
/// 64; a reply of another length names none (logged).
fn bridged_macs(data: &[u8]) -> Vec<[u8; 6]> {
    if !data.len().is_multiple_of(6) || data.len() > 64 * 6 {
        warn!(
            len = data.len(),
            "the new IOC's Activate reply is not a list of MACs; its bridged MACs are not announced"
        );
        return Vec::new();
    }
    data.chunks_exact(6)
        .filter_map(|m| <[u8; 6]>::try_from(m).ok())
        .collect()
}

/// One round's frames for interface `name` and the `bridged` MACs behind it.
pub fn frames(name: &str, bridged: &[[u8; 6]]) -> io::Result<Vec<Vec<u8>>> {
    let mac = netdev::mac(name)?;
    let (v4, v6) = netdev::addresses(name)?;
    let mut frames: Vec<Vec<u8>> = v4
        .iter()
        .map(|ip| announce::gratuitous_arp(mac, *ip))
        .chain(v6.iter().map(|ip| announce::unsolicited_na(mac, *ip)))
        .chain(
            std::iter::once(&mac)
                .chain(bridged)
                .map(|m| announce::rarp_announce(*m)),
        )
        .collect();
    match groups::ipv4(name) {
        Ok((version, g)) => {
            let src = v4.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED);
            frames.extend(membership::igmp_reports(mac, src, version, &g));
        }
        Err(e) => debug!("cannot read {name}'s IPv4 groups to report them: {e}"),
    }
    match groups::ipv6(name) {
        Ok(g) => {
            // MLD speaks from the link-local address (RFC 3810 section 5), or :: without.
            let src = v6
                .iter()
                .copied()
                .find(|a| a.segments()[0] & 0xffc0 == 0xfe80)
                .unwrap_or(Ipv6Addr::UNSPECIFIED);
            frames.extend(membership::mld_reports(mac, src, &g));
        }
        Err(e) => debug!("cannot read {name}'s IPv6 groups to report them: {e}"),
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_come_count_times_interval_apart_with_the_replys_macs() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let reply = [2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        let mut a = Announce::new(2, ms(100), t0, &reply).unwrap();
        let (macs, last) = a.due(t0).unwrap();
        assert_eq!(macs, [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]]);
        assert!(!last);
        assert!(a.due(t0 + ms(99)).is_none(), "not before the interval");
        assert_eq!(a.next(), t0 + ms(100));
        assert!(a.due(t0 + ms(100)).unwrap().1, "the second is the last");
        assert!(a.due(t0 + ms(500)).is_none());
        assert!(Announce::new(0, ms(100), t0, &[]).is_none());
    }

    #[test]
    fn a_reply_that_is_not_a_list_of_macs_names_none() {
        assert!(bridged_macs(&[1, 2, 3]).is_empty());
        assert!(bridged_macs(&[0; 65 * 6]).is_empty());
        assert_eq!(bridged_macs(&[]), Vec::<[u8; 6]>::new());
        assert_eq!(bridged_macs(&[0; 64 * 6]).len(), 64);
    }

    /// A round is built from what the kernel says of the interface (here loopback): a
    /// RARP for its MAC, then one per bridged MAC.
    #[test]
    fn loopbacks_round_holds_a_rarp_for_its_mac_and_one_per_bridged_mac() {
        let f = frames("lo", &[[2, 0, 0, 0, 0, 9]]).unwrap();
        let rarps: Vec<&Vec<u8>> = f.iter().filter(|f| f[12..14] == [0x80, 0x35]).collect();
        assert_eq!(rarps.len(), 2);
        assert_eq!(rarps[1][6..12], [2, 0, 0, 0, 0, 9]);
    }
}
