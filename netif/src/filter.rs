//! Receive filters (`SO_ATTACH_FILTER`) that split a NIC's unicast frames between packet
//! sockets, so that the kernel sorts them before any copy: a host whose pools are shared
//! memory gets a socket of its own receiving only the frames for its MAC
//! ([`only_to`]), read straight into its elements, and the IOC's general sockets stop
//! receiving those frames ([`all_but`]). A frame that came with a VLAN tag (which the kernel
//! takes out into its metadata) stays on the general sockets, which put the tag back.
//!
//! The kernel runs a socket's filter before it queues a frame, so a frame a filter refuses
//! costs that socket neither a copy nor room in its buffer.

use super::bpf::{insn, match_dst, Insn, JEQ_K, LD_W_ABS, RET_K, SKF_AD_VLAN_TAG_PRESENT};

/// Most MACs [`all_but`] holds (5 instructions each, within the 4,096 the kernel allows).
pub const MAX_EXCLUDED: usize = 800;
/// A filter's verdict taking the whole frame.
const ACCEPT: u32 = u32::MAX;
/// A filter's verdict dropping the frame.
const DROP: u32 = 0;

/// The test "the frame came without a VLAN tag": falls through when it did, else jumps
/// `skip` instructions.
fn untagged(p: &mut Vec<Insn>, skip: u8) {
    p.push(insn(LD_W_ABS, 0, 0, SKF_AD_VLAN_TAG_PRESENT as u32));
    p.push(insn(JEQ_K, 0, skip, 0));
}

/// The filter of a host's own socket: untagged frames whose destination is `mac`, nothing
/// else.
pub fn only_to(mac: &[u8; 6]) -> Vec<Insn> {
    let mut p = Vec::with_capacity(8);
    untagged(&mut p, 5);
    match_dst(&mut p, mac, 1);
    p.push(insn(RET_K, 0, 0, ACCEPT));
    p.push(insn(RET_K, 0, 0, DROP));
    p
}

/// The filter of a socket that takes nothing more (the frames it holds stay).
pub fn nothing() -> Vec<Insn> {
    vec![insn(RET_K, 0, 0, DROP)]
}

/// The filter of a general socket: every frame but the untagged ones for a MAC of `macs`
/// (the first [`MAX_EXCLUDED`]; the caller keeps within it).
pub fn all_but(macs: &[[u8; 6]]) -> Vec<Insn> {
    let mut p = Vec::with_capacity(macs.len().min(MAX_EXCLUDED) * 5 + 3);
    untagged(&mut p, 0);
    // Tagged: taken.
    p[1].jt = 1;
    p.push(insn(RET_K, 0, 0, ACCEPT));
    for mac in macs.iter().take(MAX_EXCLUDED) {
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
    };
    const TAGGED: Meta = Meta {
        hash: 0,
        vlan: true,
    };

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
        let p = only_to(&mac);
        assert!(p.len() <= 8);
        assert!(takes(&p, mac, UNTAGGED));
        assert!(!takes(&p, mac, TAGGED));
        assert!(!takes(&p, [2, 0, 0, 0xaa, 0xbb, 0xcd], UNTAGGED));
        assert!(!takes(&p, [3, 0, 0, 0xaa, 0xbb, 0xcc], UNTAGGED));
        assert!(!takes(&p, [0xff; 6], UNTAGGED));
    }

    #[test]
    fn a_general_socket_takes_everything_else() {
        let (a, b) = ([2, 0, 0, 0xaa, 0xbb, 0xcc], [2, 0, 0, 0, 0, 1]);
        let p = all_but(&[a, b]);
        assert!(!takes(&p, a, UNTAGGED));
        assert!(!takes(&p, b, UNTAGGED));
        assert!(takes(&p, a, TAGGED));
        assert!(takes(&p, [0xff; 6], UNTAGGED));
        assert!(takes(&p, [2, 0, 0, 0xaa, 0xbb, 0xcd], UNTAGGED));
        assert!(takes(&all_but(&[]), a, UNTAGGED));
    }

    #[test]
    fn the_exclusions_are_bounded() {
        let macs: Vec<[u8; 6]> = (0..MAX_EXCLUDED as u32 + 10)
            .map(|i| {
                let b = i.to_be_bytes();
                [2, 0, b[0], b[1], b[2], b[3]]
            })
            .collect();
        let p = all_but(&macs);
        assert!(p.len() <= 4096);
        assert!(!takes(&p, macs[MAX_EXCLUDED - 1], UNTAGGED));
        assert!(takes(&p, macs[MAX_EXCLUDED], UNTAGGED));
    }

    proptest! {
        /// Every untagged unicast frame is taken by exactly one of the sockets: its host's
        /// when the host has one, else the general socket; a tagged frame by the general
        /// socket alone.
        #[test]
        fn each_frame_lands_in_exactly_one_socket(
            placed in proptest::collection::hash_set(any::<[u8; 6]>(), 0..20),
            dst in any::<[u8; 6]>(),
            pick in any::<proptest::sample::Index>(),
            vlan in any::<bool>(),
        ) {
            let placed: Vec<[u8; 6]> = placed.into_iter().collect();
            let meta = Meta { hash: 0, vlan };
            // Half the time, a frame for one of the placed MACs.
            let dst = if placed.is_empty() || pick.index(2) == 0 { dst } else { *pick.get(&placed) };
            let general = takes(&all_but(&placed), dst, meta);
            let hosts = placed.iter().filter(|m| takes(&only_to(m), dst, meta)).count();
            prop_assert_eq!(usize::from(general) + hosts, 1);
            prop_assert_eq!(hosts == 1, !vlan && placed.contains(&dst));
        }
    }
}
