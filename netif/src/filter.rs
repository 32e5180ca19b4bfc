//! Receive filters (`SO_ATTACH_FILTER`) that split a NIC's unicast frames between packet
//! sockets, so that the kernel sorts them before any copy: a host whose pools are shared
//! memory gets a socket of its own receiving only the frames for its MAC on its VLAN
//! ([`only_to`]), read straight into its elements, and the IOC's general sockets stop
//! receiving those frames ([`all_but`]). The kernel takes a frame's VLAN tag out into its
//! metadata: an untagged host's socket takes untagged frames, an access host's those whose
//! tag names its VLAN (it receives them untagged, as an access port does); every other
//! tagged frame stays on the general sockets, which put the tag back.
//!
//! The kernel runs a socket's filter before it queues a frame, so a frame a filter refuses
//! costs that socket neither a copy nor room in its buffer.

use super::bpf::{
    insn, match_dst, Insn, AND_K, JEQ_K, LD_W_ABS, RET_K, SKF_AD_VLAN_TAG, SKF_AD_VLAN_TAG_PRESENT,
};

/// Most MACs [`all_but`] holds (at most 10 instructions each, within the 4,096 the kernel
/// allows).
pub const MAX_EXCLUDED: usize = 400;
/// A filter's verdict taking the whole frame.
const ACCEPT: u32 = u32::MAX;
/// A filter's verdict dropping the frame.
const DROP: u32 = 0;

/// Which of a MAC's frames a host's own socket takes, by the VLAN tag the kernel took out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Tagged {
    /// Frames that came without a tag.
    #[default]
    No,
    /// Frames whose tag names this VLAN (1 to 4094), of either TPID.
    Vlan(u16),
}

/// Appends the test "the frame came as `t` says": falls through when it did, else jumps
/// `skip` instructions past the test's last.
fn tagged(p: &mut Vec<Insn>, t: Tagged, skip: u8) {
    p.push(insn(LD_W_ABS, 0, 0, SKF_AD_VLAN_TAG_PRESENT as u32));
    match t {
        Tagged::No => p.push(insn(JEQ_K, 0, skip, 0)),
        Tagged::Vlan(vid) => {
            p.push(insn(JEQ_K, 0, skip.saturating_add(3), 1));
            p.push(insn(LD_W_ABS, 0, 0, SKF_AD_VLAN_TAG as u32));
            p.push(insn(AND_K, 0, 0, 0x0fff));
            p.push(insn(JEQ_K, 0, skip, u32::from(vid)));
        }
    }
}

/// The filter of a host's own socket: the frames whose destination is `mac` that came as
/// `t` says, nothing else.
pub fn only_to(mac: &[u8; 6], t: Tagged) -> Vec<Insn> {
    let mut p = Vec::with_capacity(11);
    tagged(&mut p, t, 5);
    match_dst(&mut p, mac, 1);
    p.push(insn(RET_K, 0, 0, ACCEPT));
    p.push(insn(RET_K, 0, 0, DROP));
    p
}

/// The filter of a socket that takes nothing more (the frames it holds stay).
pub fn nothing() -> Vec<Insn> {
    vec![insn(RET_K, 0, 0, DROP)]
}

/// The filter of a general socket: every frame but those the own sockets of `macs` take
/// ([`only_to`]; the first [`MAX_EXCLUDED`]; the caller keeps within it).
pub fn all_but(macs: &[([u8; 6], Tagged)]) -> Vec<Insn> {
    let mut p = Vec::with_capacity(macs.len().min(MAX_EXCLUDED) * 10 + 1);
    for &(mac, t) in macs.iter().take(MAX_EXCLUDED) {
        // Not this one: on to the next MAC, past the test of its destination and the drop.
        tagged(&mut p, t, 5);
        match_dst(&mut p, &mac, 1);
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
        let p = only_to(&mac, Tagged::No);
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
        let p = only_to(&mac, Tagged::Vlan(10));
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
        let p = all_but(&[(a, Tagged::No), (b, Tagged::Vlan(7))]);
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
    fn the_exclusions_are_bounded() {
        let macs: Vec<([u8; 6], Tagged)> = (0..MAX_EXCLUDED as u32 + 10)
            .map(|i| {
                let b = i.to_be_bytes();
                ([2, 0, b[0], b[1], b[2], b[3]], Tagged::Vlan(4094))
            })
            .collect();
        let p = all_but(&macs);
        assert!(p.len() <= 4096);
        assert!(!takes(&p, macs[MAX_EXCLUDED - 1].0, tag(4094)));
        assert!(takes(&p, macs[MAX_EXCLUDED].0, tag(4094)));
    }

    proptest! {
        /// Every unicast frame is taken by exactly one of the sockets: its host's when the
        /// host has one for the way it came (untagged, or tagged with the host's VLAN),
        /// else the general socket.
        #[test]
        fn each_frame_lands_in_exactly_one_socket(
            placed in proptest::collection::hash_map(any::<[u8; 6]>(), proptest::option::of(1u16..4, ), 0..20),
            dst in any::<[u8; 6]>(),
            pick in any::<proptest::sample::Index>(),
            vid in proptest::option::of(0u16..5),
        ) {
            let placed: Vec<([u8; 6], Tagged)> = placed
                .into_iter()
                .map(|(m, v)| (m, v.map_or(Tagged::No, Tagged::Vlan)))
                .collect();
            let meta = vid.map_or(UNTAGGED, tag);
            // Half the time, a frame for one of the placed MACs.
            let dst = if placed.is_empty() || pick.index(2) == 0 { dst } else { pick.get(&placed).0 };
            let general = takes(&all_but(&placed), dst, meta);
            let hosts = placed.iter().filter(|(m, t)| takes(&only_to(m, *t), dst, meta)).count();
            prop_assert_eq!(usize::from(general) + hosts, 1);
            let own = placed.iter().any(|&(m, t)| m == dst && match t {
                Tagged::No => vid.is_none(),
                Tagged::Vlan(v) => vid == Some(v),
            });
            prop_assert_eq!(hosts == 1, own);
        }
    }
}
