//! Receive filters (`SO_ATTACH_FILTER`) that split a NIC's unicast frames between packet
//! sockets, so that the kernel sorts them before any copy: a host whose pools are shared
//! memory gets a socket of its own receiving only the frames for its MAC on its VLAN
//! ([`only_to`]), read straight into its elements, and the IOC's general sockets stop
//! receiving those frames ([`all_but`]). The kernel takes a frame's VLAN tag out into its
//! metadata: an untagged host's socket takes untagged frames, an access host's those whose
//! tag names its VLAN (it receives them untagged, as an access port does), a trunk host's
//! those whose tag names one of its VLANs (and the reader puts the tag back,
//! [`crate::packet::PacketSocket::recv_batch_tagged_into`]); every other tagged frame stays
//! on the general sockets, which put the tag back too.
//!
//! The kernel runs a socket's filter before it queues a frame, so a frame a filter refuses
//! costs that socket neither a copy nor room in its buffer.

use super::bpf::{
    insn, match_dst, Insn, AND_K, JA, JEQ_K, JGE_K, JGT_K, LD_W_ABS, MAX_INSNS, RET_K,
    SKF_AD_VLAN_TAG, SKF_AD_VLAN_TAG_PRESENT,
};

/// Most ranges of VLANs one [`Tagged`] holds: its test jumps past them, and a conditional
/// jump reaches 255 instructions at most (the test is at most 4 + 2 * 64).
pub const MAX_VLAN_RANGES: usize = 64;
/// A filter's verdict taking the whole frame.
const ACCEPT: u32 = u32::MAX;
/// A filter's verdict dropping the frame.
const DROP: u32 = 0;
/// Instructions [`only_to`] and [`all_but`] spend on an entry beside its [`Tagged`] test:
/// the destination's (4) and a verdict.
const PER_MAC: usize = 5;

/// Which of a MAC's frames a host's own socket takes, by the VLAN tag the kernel took out:
/// those that came untagged, those whose tag names one of some VLANs (of either TPID), or
/// both. A priority tag (VLAN 0) is neither: such frames keep the general path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Tagged {
    untagged: bool,
    /// Ranges of VLAN ids, inclusive, ascending and apart, within 1 to 4094.
    vlans: Vec<(u16, u16)>,
}

impl Tagged {
    /// The frames that came untagged.
    pub fn untagged() -> Tagged {
        Tagged {
            untagged: true,
            vlans: Vec::new(),
        }
    }

    /// The frames tagged with VLAN `vid` (1 to 4094; any other takes nothing).
    pub fn vlan(vid: u16) -> Tagged {
        Tagged::of(false, [vid]).unwrap_or_default()
    }

    /// The untagged frames when `untagged`, and those tagged with one of `vids` (0 and
    /// 4095, which no VLAN is, left out); `None` when `vids` make more than
    /// [`MAX_VLAN_RANGES`] ranges.
    pub fn of(untagged: bool, vids: impl IntoIterator<Item = u16>) -> Option<Tagged> {
        let mut ids: Vec<u16> = vids.into_iter().filter(|v| (1..4095).contains(v)).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut vlans: Vec<(u16, u16)> = Vec::new();
        for v in ids {
            match vlans.last_mut() {
                Some(r) if r.1 + 1 == v => r.1 = v,
                _ => vlans.push((v, v)),
            }
        }
        (vlans.len() <= MAX_VLAN_RANGES).then_some(Tagged { untagged, vlans })
    }

    /// Whether it takes untagged frames.
    pub fn takes_untagged(&self) -> bool {
        self.untagged
    }

    /// Whether it takes tagged frames (of some VLAN).
    pub fn takes_tagged(&self) -> bool {
        !self.vlans.is_empty()
    }

    /// The same without its untagged frames.
    pub fn tagged_only(&self) -> Tagged {
        Tagged {
            untagged: false,
            vlans: self.vlans.clone(),
        }
    }

    /// Whether it takes a frame that came with the tag of `vlan` (`None`: untagged; the
    /// TCI's priority and DEI bits aside).
    pub fn takes(&self, vlan: Option<u16>) -> bool {
        match vlan {
            None => self.untagged,
            Some(tci) => {
                let v = tci & 0x0fff;
                self.vlans.iter().any(|&(lo, hi)| (lo..=hi).contains(&v))
            }
        }
    }

    /// Instructions of its test ([`Tagged::test`]).
    fn len(&self) -> usize {
        match (self.untagged, self.vlans.is_empty()) {
            (false, true) => 1,
            (true, true) => 2,
            _ => {
                4 + self
                    .vlans
                    .iter()
                    .map(|&(lo, hi)| 1 + usize::from(lo != hi))
                    .sum::<usize>()
            }
        }
    }

    /// Appends the test "the frame came as this says": falls through when it did, else
    /// jumps `skip` instructions past the test's last.
    fn test(&self, p: &mut Vec<Insn>, skip: u8) {
        if self.vlans.is_empty() {
            if self.untagged {
                p.push(insn(LD_W_ABS, 0, 0, SKF_AD_VLAN_TAG_PRESENT as u32));
                p.push(insn(JEQ_K, 0, skip, 0));
            } else {
                p.push(insn(JA, 0, 0, u32::from(skip)));
            }
            return;
        }
        let matched = p.len() + self.len();
        let failed = matched + usize::from(skip);
        // Each jump lands inside the test or `skip` past it: within a jump's reach for
        // MAX_VLAN_RANGES ranges and the small `skip` of this module's callers.
        let to = |target: usize, from: usize| {
            debug_assert!(
                target - from - 1 <= usize::from(u8::MAX),
                "a jump beyond reach"
            );
            u8::try_from(target - from - 1).unwrap_or(u8::MAX)
        };
        p.push(insn(LD_W_ABS, 0, 0, SKF_AD_VLAN_TAG_PRESENT as u32));
        let at = p.len();
        match self.untagged {
            true => p.push(insn(JEQ_K, to(matched, at), 0, 0)),
            false => p.push(insn(JEQ_K, to(failed, at), 0, 0)),
        }
        p.push(insn(LD_W_ABS, 0, 0, SKF_AD_VLAN_TAG as u32));
        p.push(insn(AND_K, 0, 0, 0x0fff));
        for (i, &(lo, hi)) in self.vlans.iter().enumerate() {
            let last = i + 1 == self.vlans.len();
            let at = p.len();
            // Not in this range: on to the next, or past the test after the last.
            match (lo == hi, last) {
                (true, false) => p.push(insn(JEQ_K, to(matched, at), 0, u32::from(lo))),
                (true, true) => p.push(insn(JEQ_K, 0, skip, u32::from(lo))),
                (false, false) => {
                    p.push(insn(JGE_K, 0, 1, u32::from(lo)));
                    p.push(insn(JGT_K, 0, to(matched, at + 1), u32::from(hi)));
                }
                (false, true) => {
                    p.push(insn(JGE_K, 0, to(failed, at), u32::from(lo)));
                    p.push(insn(JGT_K, skip, 0, u32::from(hi)));
                }
            }
        }
        debug_assert_eq!(p.len(), matched);
    }
}

/// The filter of a host's own socket: the frames whose destination is `mac` that came as
/// `t` says, nothing else.
pub fn only_to(mac: &[u8; 6], t: &Tagged) -> Vec<Insn> {
    let mut p = Vec::with_capacity(t.len() + PER_MAC + 1);
    t.test(&mut p, 5);
    match_dst(&mut p, mac, 1);
    p.push(insn(RET_K, 0, 0, ACCEPT));
    p.push(insn(RET_K, 0, 0, DROP));
    p
}

/// The filter of a socket that takes nothing more (the frames it holds stay).
pub fn nothing() -> Vec<Insn> {
    vec![insn(RET_K, 0, 0, DROP)]
}

/// Whether [`all_but`] holds every one of `macs` within the instructions the kernel
/// allows: 7 each for an untagged host (585 of them), 10 for an access host (409), 9 and
/// one or two per VLAN range for a trunk (56 of 64 ranges).
pub fn fits(macs: &[([u8; 6], Tagged)]) -> bool {
    // Their tests and the final verdict.
    macs.iter().map(|(_, t)| t.len() + PER_MAC).sum::<usize>() < MAX_INSNS
}

/// The filter of a general socket: every frame but those the own sockets of `macs` take
/// ([`only_to`]); the first of them that [`fits`] (the caller keeps within it).
pub fn all_but(macs: &[([u8; 6], Tagged)]) -> Vec<Insn> {
    let mut p = Vec::new();
    for (mac, t) in macs {
        if p.len() + t.len() + PER_MAC + 1 > MAX_INSNS {
            break;
        }
        // Not this one: on to the next MAC, past the test of its destination and the drop.
        t.test(&mut p, 5);
        match_dst(&mut p, mac, 1);
        p.push(insn(RET_K, 0, 0, DROP));
    }
    p.push(insn(RET_K, 0, 0, ACCEPT));
    p
}

#[cfg(test)]
mod tests {
    use super::super::bpf::{frame, run, Meta};
    use super::*;
    use proptest::prelude::*;

    const UNTAGGED: Meta = Meta {
        hash: 0,
        vlan: false,
        tci: 0,
    };
    /// Tagged with VLAN `vid` (and a priority, which the filters ignore).
    const fn tag(vid: u16) -> Meta {
        Meta {
            hash: 0,
            vlan: true,
            tci: 0xa000 | vid,
        }
    }

    fn takes(prog: &[Insn], dst: [u8; 6], meta: Meta) -> bool {
        match run(prog, &frame(dst), meta) {
            Some(ACCEPT) => true,
            Some(DROP) => false,
            other => panic!("verdict {other:?}"),
        }
    }

    #[test]
    fn a_hosts_socket_takes_its_untagged_unicast_alone() {
        let mac = [2, 0, 0, 0xaa, 0xbb, 0xcc];
        let p = only_to(&mac, &Tagged::untagged());
        assert!(p.len() <= 8);
        assert!(takes(&p, mac, UNTAGGED));
        assert!(!takes(&p, mac, tag(10)));
        assert!(!takes(&p, [2, 0, 0, 0xaa, 0xbb, 0xcd], UNTAGGED));
        assert!(!takes(&p, [3, 0, 0, 0xaa, 0xbb, 0xcc], UNTAGGED));
        assert!(!takes(&p, [0xff; 6], UNTAGGED));
    }

    #[test]
    fn an_access_hosts_socket_takes_its_vlans_unicast_alone() {
        let mac = [2, 0, 0, 0xaa, 0xbb, 0xcc];
        let p = only_to(&mac, &Tagged::vlan(10));
        assert!(takes(&p, mac, tag(10)));
        assert!(!takes(&p, mac, tag(20)));
        assert!(!takes(&p, mac, UNTAGGED));
        assert!(
            takes(&p, mac, tag(10 | 0x1000)),
            "the DEI bit is not the VLAN's"
        );
        assert!(!takes(&p, [2, 0, 0, 0xaa, 0xbb, 0xcd], tag(10)));
    }

    #[test]
    fn a_general_socket_takes_everything_else() {
        let (a, b) = ([2, 0, 0, 0xaa, 0xbb, 0xcc], [2, 0, 0, 0, 0, 1]);
        let p = all_but(&[(a, Tagged::untagged()), (b, Tagged::vlan(7))]);
        assert!(!takes(&p, a, UNTAGGED));
        assert!(!takes(&p, b, tag(7)));
        assert!(takes(&p, a, tag(7)));
        assert!(takes(&p, b, UNTAGGED));
        assert!(takes(&p, b, tag(8)));
        assert!(takes(&p, [0xff; 6], UNTAGGED));
        assert!(takes(&p, [2, 0, 0, 0xaa, 0xbb, 0xcd], UNTAGGED));
        assert!(takes(&all_but(&[]), a, UNTAGGED));
    }

    #[test]
    fn a_trunk_hosts_socket_takes_its_vlans_and_untagged_where_it_says() {
        let mac = [2, 0, 0, 0xaa, 0xbb, 0xcc];
        let vids = [10, 11, 12, 20, 4094, 0, 4095];
        for untagged in [false, true] {
            let t = Tagged::of(untagged, vids).unwrap();
            let p = only_to(&mac, &t);
            for v in [10, 11, 12, 20, 4094] {
                assert!(takes(&p, mac, tag(v)), "VLAN {v}");
            }
            for v in [0, 1, 9, 13, 19, 21, 4093] {
                assert!(!takes(&p, mac, tag(v)), "VLAN {v}");
            }
            assert_eq!(takes(&p, mac, UNTAGGED), untagged);
            assert!(!takes(&p, [2, 0, 0, 0xaa, 0xbb, 0xcd], tag(10)));
            assert!(t.takes_tagged() && t.takes_untagged() == untagged);
            assert!(!t.tagged_only().takes(None) && t.tagged_only().takes(Some(12)));
        }
        assert_eq!(Tagged::of(false, [0, 4095]).unwrap(), Tagged::default());
        assert!(!takes(&only_to(&mac, &Tagged::default()), mac, UNTAGGED));
    }

    #[test]
    fn a_trunk_of_too_many_ranges_has_no_socket() {
        let every_other = (1..4095).step_by(2);
        assert_eq!(
            Tagged::of(false, every_other.clone().take(MAX_VLAN_RANGES)).map(|t| t.vlans.len()),
            Some(MAX_VLAN_RANGES)
        );
        assert!(Tagged::of(false, every_other.take(MAX_VLAN_RANGES + 1)).is_none());
        // One range of them all.
        let all = Tagged::of(true, 0..4096).unwrap();
        assert_eq!(all.vlans, vec![(1, 4094)]);
        // The longest test still jumps within reach.
        let widest = Tagged::of(
            true,
            (1..4095)
                .step_by(3)
                .take(MAX_VLAN_RANGES)
                .flat_map(|v| [v, v + 1]),
        )
        .unwrap();
        let p = only_to(&[2, 0, 0, 0, 0, 1], &widest);
        assert!(super::super::bpf::valid(&p));
        assert!(takes(&p, [2, 0, 0, 0, 0, 1], tag(1 + 3 * 63 + 1)));
        assert!(!takes(&p, [2, 0, 0, 0, 0, 1], tag(1 + 3 * 63 + 2)));
    }

    #[test]
    fn the_exclusions_are_bounded() {
        let macs: Vec<([u8; 6], Tagged)> = (0..420u32)
            .map(|i| {
                let b = i.to_be_bytes();
                ([2, 0, b[0], b[1], b[2], b[3]], Tagged::vlan(4094))
            })
            .collect();
        let held = (1..macs.len())
            .take_while(|&n| fits(&macs[..n]))
            .last()
            .unwrap();
        assert!(held >= 400, "{held} access hosts");
        let p = all_but(&macs);
        assert!(p.len() <= MAX_INSNS);
        assert!(!takes(&p, macs[held - 1].0, tag(4094)));
        assert!(
            takes(&p, macs[held].0, tag(4094)),
            "beyond: the general path"
        );
        // Trunk hosts of many ranges cost more each.
        let wide = Tagged::of(true, (1..4095).step_by(2).take(MAX_VLAN_RANGES)).unwrap();
        let trunks: Vec<_> = macs.iter().map(|(m, _)| (*m, wide.clone())).collect();
        assert!(
            fits(&trunks[..56]) && !fits(&trunks[..57]),
            "73 instructions each"
        );
        assert!(all_but(&trunks).len() <= MAX_INSNS);
    }

    /// A host's own socket as the proptest makes it: untagged, access, or trunk.
    fn arb_tagged() -> impl Strategy<Value = Tagged> {
        prop_oneof![
            Just(Tagged::untagged()),
            (1u16..5).prop_map(Tagged::vlan),
            (any::<bool>(), proptest::collection::vec(0u16..8, 1..6))
                .prop_map(|(u, v)| Tagged::of(u, v).unwrap()),
        ]
    }

    proptest! {
        /// Every unicast frame is taken by exactly one of the sockets: its host's when the
        /// host has one for the way it came (untagged, or tagged with one of the host's
        /// VLANs), else the general socket.
        #[test]
        fn each_frame_lands_in_exactly_one_socket(
            placed in proptest::collection::hash_map(any::<[u8; 6]>(), arb_tagged(), 0..20),
            dst in any::<[u8; 6]>(),
            pick in any::<proptest::sample::Index>(),
            vid in proptest::option::of(0u16..9),
        ) {
            let placed: Vec<([u8; 6], Tagged)> = placed.into_iter().collect();
            let meta = vid.map_or(UNTAGGED, tag);
            // Half the time, a frame for one of the placed MACs.
            let dst = if placed.is_empty() || pick.index(2) == 0 { dst } else { pick.get(&placed).0 };
            prop_assert!(fits(&placed));
            let general = takes(&all_but(&placed), dst, meta);
            // A trunk that takes both kinds has a socket for each (`crate::trunk`).
            let sockets = |t: &Tagged| match t.takes_untagged() && t.takes_tagged() {
                true => vec![t.tagged_only(), Tagged::untagged()],
                false => vec![t.clone()],
            };
            let hosts = placed
                .iter()
                .flat_map(|(m, t)| sockets(t).into_iter().map(move |s| (m, s)))
                .filter(|(m, s)| takes(&only_to(m, s), dst, meta))
                .count();
            prop_assert_eq!(usize::from(general) + hosts, 1);
            let own = placed.iter().any(|(m, t)| *m == dst && t.takes(vid));
            prop_assert_eq!(hosts == 1, own);
        }
    }
}
