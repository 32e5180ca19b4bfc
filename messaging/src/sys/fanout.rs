//! Steering received frames among the packet sockets of a `PACKET_FANOUT` group with a
//! classic BPF program: a frame whose destination MAC is in a table goes to the socket the
//! table names; any other frame (broadcast, multicast, an unknown MAC) by the flow hash
//! the kernel computed (`SKF_AD_RXHASH`), which the kernel takes modulo the group's size.
//!
//! Written by hand: the program is a linear table of a few instructions per MAC, and no
//! crate builds classic BPF for `PACKET_FANOUT_DATA`.

/// One classic BPF instruction (`struct sock_filter`).
pub type Insn = libc::sock_filter;

/// Most MACs a program holds (5 instructions each, within the 4,096 the kernel allows).
pub const MAX_ENTRIES: usize = 800;

const BPF_LD: u16 = 0x00;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_ABS: u16 = 0x20;
const BPF_JEQ: u16 = 0x10;
const BPF_K: u16 = 0x00;
const BPF_A: u16 = 0x10;
/// Offsets from this base are relative to the frame's MAC header (`SKF_LL_OFF`): where
/// the fanout runs, the frame's data may start at its network header.
pub const SKF_LL_OFF: i32 = -0x0020_0000;
/// Loads the flow hash (`SKF_AD_OFF + SKF_AD_RXHASH`).
pub const SKF_AD_RXHASH: i32 = -0x1000 + 32;

/// Loads a 16-bit word from offset `k`.
pub const LD_H_ABS: u16 = BPF_LD | BPF_H | BPF_ABS;
/// Loads a 32-bit word from offset `k`.
pub const LD_W_ABS: u16 = BPF_LD | BPF_W | BPF_ABS;
/// Jump if A equals `k`.
pub const JEQ_K: u16 = BPF_JMP | BPF_JEQ | BPF_K;
/// Return `k`.
pub const RET_K: u16 = BPF_RET | BPF_K;
/// Return A.
pub const RET_A: u16 = BPF_RET | BPF_A;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// The program sending frames for each `(mac, socket)` of `table` to that socket (the
/// first [`MAX_ENTRIES`]), every other frame by its flow hash.
pub fn steering_program(table: &[([u8; 6], u32)]) -> Vec<Insn> {
    let mut p = Vec::with_capacity(table.len().min(MAX_ENTRIES) * 5 + 2);
    for (mac, socket) in table.iter().take(MAX_ENTRIES) {
        let hi = u32::from(u16::from_be_bytes([mac[0], mac[1]]));
        let lo = u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]);
        p.push(insn(LD_H_ABS, 0, 0, SKF_LL_OFF as u32));
        p.push(insn(JEQ_K, 0, 3, hi));
        p.push(insn(LD_W_ABS, 0, 0, (SKF_LL_OFF + 2) as u32));
        p.push(insn(JEQ_K, 0, 1, lo));
        p.push(insn(RET_K, 0, 0, *socket));
    }
    p.push(insn(LD_W_ABS, 0, 0, SKF_AD_RXHASH as u32));
    p.push(insn(RET_A, 0, 0, 0));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `prog` over an Ethernet frame with flow hash `hash`, as the kernel would for
    /// the instructions [`steering_program`] uses; `None` for anything else (a bad program).
    fn run(prog: &[Insn], frame: &[u8], hash: u32) -> Option<u32> {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        let load = |k: u32, n: usize| -> Option<u32> {
            let k = k as i32;
            if k == SKF_AD_RXHASH && n == 4 {
                return Some(hash);
            }
            let off = usize::try_from(k.checked_sub(SKF_LL_OFF)?).ok()?;
            let b = frame.get(off..off + n)?;
            Some(b.iter().fold(0u32, |v, x| (v << 8) | u32::from(*x)))
        };
        loop {
            let i = prog.get(pc)?;
            pc += 1;
            match i.code {
                LD_H_ABS => a = load(i.k, 2)?,
                LD_W_ABS => a = load(i.k, 4)?,
                JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                RET_K => return Some(i.k),
                RET_A => return Some(a),
                _ => return None,
            }
        }
    }

    fn frame(dst: [u8; 6]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&[2, 0, 0, 0, 0, 9, 0x08, 0x00, 0x45]);
        f
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
