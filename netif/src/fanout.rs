//! Steering received frames among the packet sockets of a `PACKET_FANOUT` group with a
//! classic BPF program: a frame whose destination MAC is in a table goes to the socket the
//! table names; any other frame (broadcast, multicast, an unknown MAC) by the flow hash
//! the kernel computed (`SKF_AD_RXHASH`), which the kernel takes modulo the group's size.
//!
//! Written by hand (see [`super::bpf`]).

use super::bpf::{insn, match_dst, Insn, LD_W_ABS, RET_A, RET_K, SKF_AD_RXHASH};

/// Most MACs a program holds (5 instructions each, within the 4,096 the kernel allows).
pub const MAX_ENTRIES: usize = 800;

/// The program sending frames for each `(mac, socket)` of `table` to that socket (the
/// first [`MAX_ENTRIES`]), every other frame by its flow hash.
pub fn steering_program(table: &[([u8; 6], u32)]) -> Vec<Insn> {
    let mut p = Vec::with_capacity(table.len().min(MAX_ENTRIES) * 5 + 2);
    for (mac, socket) in table.iter().take(MAX_ENTRIES) {
        match_dst(&mut p, mac, 1);
        p.push(insn(RET_K, 0, 0, *socket));
    }
    p.push(insn(LD_W_ABS, 0, 0, SKF_AD_RXHASH as u32));
    p.push(insn(RET_A, 0, 0, 0));
    p
}

#[cfg(test)]
mod tests {
    use super::super::bpf::{frame, Meta};
    use super::*;
    use proptest::prelude::*;

    fn run(prog: &[Insn], frame: &[u8], hash: u32) -> Option<u32> {
        super::super::bpf::run(prog, frame, Meta { hash, vlan: false })
    }

    #[test]
    fn frames_go_to_the_socket_of_their_destination_else_by_hash() {
        let a = [2, 0, 0, 0xaa, 0xbb, 0xcc];
        let b = [2, 0, 0, 0xaa, 0xbb, 0xcd];
        let p = steering_program(&[(a, 1), (b, 0)]);
        assert_eq!(run(&p, &frame(a), 7), Some(1));
        assert_eq!(run(&p, &frame(b), 7), Some(0));
        // Same low word, other high half; broadcast; unknown: the hash.
        assert_eq!(run(&p, &frame([3, 0, 0, 0xaa, 0xbb, 0xcc]), 7), Some(7));
        assert_eq!(run(&p, &frame([0xff; 6]), 9), Some(9));
        assert_eq!(run(&steering_program(&[]), &frame(a), 5), Some(5));
    }

    #[test]
    fn the_table_is_bounded() {
        let table: Vec<([u8; 6], u32)> = (0..MAX_ENTRIES as u32 + 10)
            .map(|i| {
                let b = i.to_be_bytes();
                ([2, 0, b[0], b[1], b[2], b[3]], 1)
            })
            .collect();
        let p = steering_program(&table);
        assert!(p.len() <= 4096);
        assert_eq!(run(&p, &frame(table[MAX_ENTRIES - 1].0), 0), Some(1));
        assert_eq!(run(&p, &frame(table[MAX_ENTRIES].0), 0), Some(0));
    }

    proptest! {
        /// Every MAC of a table goes to its socket, whatever the others; a MAC outside it
        /// goes by the hash.
        #[test]
        fn every_mac_reaches_its_socket(
            table in proptest::collection::hash_map(any::<[u8; 6]>(), 0u32..64, 0..40),
            other in any::<[u8; 6]>(),
            hash in any::<u32>(),
        ) {
            let t: Vec<([u8; 6], u32)> = table.iter().map(|(m, s)| (*m, *s)).collect();
            let p = steering_program(&t);
            for (m, s) in &t {
                prop_assert_eq!(run(&p, &frame(*m), hash), Some(*s));
            }
            if !table.contains_key(&other) {
                prop_assert_eq!(run(&p, &frame(other), hash), Some(hash));
            }
        }
    }
}
