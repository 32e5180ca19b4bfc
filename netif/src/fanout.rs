//! Steering received frames among the packet sockets of a `PACKET_FANOUT` group with a
//! classic BPF program. The group holds `queues` sockets per worker, worker `w`'s at
//! `w * queues ..`: a frame whose destination MAC is in a table goes to one of the sockets
//! of the worker the table names, by the flow hash the frame carries (`SKF_AD_RXHASH`), as
//! a NIC's receive-side scaling spreads flows over its queues; any other frame (broadcast,
//! multicast, an unknown MAC) by that hash alone, which the kernel takes modulo the group's
//! size. The fanout does not compute a hash: a frame carries the one its NIC's RSS or its
//! sender's socket set, and frames of no flow (ICMP, ARP, neighbour discovery between
//! namespaces) carry none. With several queues those go to the worker's first, and every
//! flow with a hash to the others, so a ping's reply never waits behind a bulk flow's
//! backlog.
//!
//! Written by hand (see [`super::bpf`]).

use super::bpf::{
    insn, match_dst, Insn, ADD_K, ADD_X, JA, JEQ_K, LDX_IMM, LD_W_ABS, MOD_K, RET_A, RET_K,
    SKF_AD_RXHASH, TXA,
};

/// Most MACs a program holds within the 4,096 instructions the kernel allows: 5 each with
/// one queue per worker, 6 with several (and a tail of 8).
pub fn max_entries(queues: u32) -> usize {
    if queues > 1 {
        680
    } else {
        800
    }
}

/// The program sending frames for each `(mac, worker)` of `table` (the first
/// [`max_entries`]) to socket `worker * queues`, the worker's first, when they carry no flow
/// hash, else to `worker * queues + 1 + hash % (queues - 1)` (with one queue: `worker`),
/// every other frame by its flow hash. `queues` is at least 1.
pub fn steering_program(table: &[([u8; 6], u32)], queues: u32) -> Vec<Insn> {
    let queues = queues.max(1);
    let entries = table.len().min(max_entries(queues));
    let mut p = Vec::with_capacity(entries * 6 + 6);
    for (i, (mac, worker)) in table.iter().take(entries).enumerate() {
        match_dst(&mut p, mac, 1 + u8::from(queues > 1));
        if queues == 1 {
            p.push(insn(RET_K, 0, 0, *worker));
        } else {
            // X = the worker's first socket; on to the tail, past the other entries (6
            // instructions each) and the hash-only return (2).
            p.push(insn(LDX_IMM, 0, 0, worker.saturating_mul(queues)));
            p.push(insn(JA, 0, 0, ((entries - 1 - i) * 6 + 2) as u32));
        }
    }
    p.push(insn(LD_W_ABS, 0, 0, SKF_AD_RXHASH as u32));
    p.push(insn(RET_A, 0, 0, 0));
    if queues > 1 {
        // The tail, X the worker's first socket: no hash, that socket; else one of the
        // others by the hash.
        p.push(insn(LD_W_ABS, 0, 0, SKF_AD_RXHASH as u32));
        p.push(insn(JEQ_K, 4, 0, 0));
        p.push(insn(MOD_K, 0, 0, queues - 1));
        p.push(insn(ADD_K, 0, 0, 1));
        p.push(insn(ADD_X, 0, 0, 0));
        p.push(insn(RET_A, 0, 0, 0));
        p.push(insn(TXA, 0, 0, 0));
        p.push(insn(RET_A, 0, 0, 0));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::super::bpf::{frame, Meta};
    use super::*;
    use proptest::prelude::*;

    /// The socket worker `w`'s frame of flow hash `hash` belongs on, with `queues` each.
    fn queue(w: u32, queues: u32, hash: u32) -> u32 {
        match (queues, hash) {
            (1, _) => w,
            (_, 0) => w * queues,
            _ => w * queues + 1 + hash % (queues - 1),
        }
    }

    fn run(prog: &[Insn], frame: &[u8], hash: u32) -> Option<u32> {
        super::super::bpf::run(
            prog,
            frame,
            Meta {
                hash,
                vlan: false,
                tci: 0,
            },
        )
    }

    #[test]
    fn frames_go_to_the_socket_of_their_destination_else_by_hash() {
        let a = [2, 0, 0, 0xaa, 0xbb, 0xcc];
        let b = [2, 0, 0, 0xaa, 0xbb, 0xcd];
        let p = steering_program(&[(a, 1), (b, 0)], 1);
        assert_eq!(run(&p, &frame(a), 7), Some(1));
        assert_eq!(run(&p, &frame(b), 7), Some(0));
        // Same low word, other high half; broadcast; unknown: the hash.
        assert_eq!(run(&p, &frame([3, 0, 0, 0xaa, 0xbb, 0xcc]), 7), Some(7));
        assert_eq!(run(&p, &frame([0xff; 6]), 9), Some(9));
        assert_eq!(run(&steering_program(&[], 1), &frame(a), 5), Some(5));
    }

    #[test]
    fn the_table_is_bounded() {
        let table: Vec<([u8; 6], u32)> = (0..max_entries(1) as u32 + 10)
            .map(|i| {
                let b = i.to_be_bytes();
                ([2, 0, b[0], b[1], b[2], b[3]], 1)
            })
            .collect();
        for queues in [1, 2, 16] {
            let (p, most) = (steering_program(&table, queues), max_entries(queues));
            assert!(p.len() <= 4096);
            let last = run(&p, &frame(table[most - 1].0), 3);
            assert_eq!(last, Some(queue(1, queues, 3)));
            assert_eq!(run(&p, &frame(table[most].0), 3), Some(3));
        }
    }

    #[test]
    fn a_workers_frames_spread_over_its_queues_by_hash() {
        let a = [2, 0, 0, 0xaa, 0xbb, 0xcc];
        let b = [2, 0, 0, 0xaa, 0xbb, 0xcd];
        let p = steering_program(&[(a, 0), (b, 2)], 4);
        let sockets =
            |mac| -> Vec<u32> { (0..7).map(|h| run(&p, &frame(mac), h).unwrap()).collect() };
        // Hash 0 (a frame of no flow) to the worker's first queue, flows over the others.
        assert_eq!(sockets(a), [0, 2, 3, 1, 2, 3, 1]);
        assert_eq!(sockets(b), [8, 10, 11, 9, 10, 11, 9]);
        assert_eq!(
            run(&p, &frame([0xff; 6]), 13),
            Some(13),
            "the rest by the hash"
        );
    }

    proptest! {
        /// Every MAC of a table goes to a socket of its worker by the hash, whatever the
        /// others; a MAC outside it goes by the hash alone.
        #[test]
        fn every_mac_reaches_its_socket(
            table in proptest::collection::hash_map(any::<[u8; 6]>(), 0u32..64, 0..40),
            other in any::<[u8; 6]>(),
            hash in any::<u32>(),
            queues in 1u32..=16,
        ) {
            let t: Vec<([u8; 6], u32)> = table.iter().map(|(m, s)| (*m, *s)).collect();
            let p = steering_program(&t, queues);
            for (m, w) in &t {
                prop_assert_eq!(run(&p, &frame(*m), hash), Some(queue(*w, queues, hash)));
                prop_assert_eq!(run(&p, &frame(*m), 0), Some(w * queues), "no hash: the first");
            }
            if !table.contains_key(&other) {
                prop_assert_eq!(run(&p, &frame(other), hash), Some(hash));
            }
        }
    }
}
