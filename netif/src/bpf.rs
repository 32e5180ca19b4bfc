//! The few classic BPF instructions the IOC's programs use: the fanout group's steering
//! ([`super::fanout`]) and the packet sockets' receive filters ([`super::filter`]).
//!
//! Written by hand: each program is a short linear table of a few instructions per MAC,
//! and no crate builds classic BPF for `PACKET_FANOUT_DATA` or `SO_ATTACH_FILTER`.

/// One classic BPF instruction (`struct sock_filter`).
pub type Insn = libc::sock_filter;

const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_ALU: u16 = 0x04;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_MISC: u16 = 0x07;
const BPF_TXA: u16 = 0x80;
const BPF_W: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_IMM: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_ADD: u16 = 0x00;
const BPF_AND: u16 = 0x50;
const BPF_MOD: u16 = 0x90;
const BPF_JA: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;
const BPF_JGT: u16 = 0x20;
const BPF_JGE: u16 = 0x30;
const BPF_K: u16 = 0x00;
const BPF_X: u16 = 0x08;
const BPF_A: u16 = 0x10;
/// Offsets from this base are relative to the frame's MAC header (`SKF_LL_OFF`): where
/// the fanout runs, the frame's data may start at its network header.
pub const SKF_LL_OFF: i32 = -0x0020_0000;
/// Ancillary loads (`SKF_AD_OFF`).
const SKF_AD_OFF: i32 = -0x1000;
/// Loads the flow hash the kernel computed.
pub const SKF_AD_RXHASH: i32 = SKF_AD_OFF + 32;
/// Loads 1 when the kernel took a VLAN tag out of the frame (into its metadata), else 0.
pub const SKF_AD_VLAN_TAG_PRESENT: i32 = SKF_AD_OFF + 48;
/// Loads the TCI of the VLAN tag the kernel took out of the frame.
pub const SKF_AD_VLAN_TAG: i32 = SKF_AD_OFF + 44;

/// Loads a 16-bit word from offset `k`.
pub const LD_H_ABS: u16 = BPF_LD | BPF_H | BPF_ABS;
/// Loads a 32-bit word from offset `k`.
pub const LD_W_ABS: u16 = BPF_LD | BPF_W | BPF_ABS;
/// Jump if A equals `k`.
pub const JEQ_K: u16 = BPF_JMP | BPF_JEQ | BPF_K;
/// Jump if A is greater than `k`.
pub const JGT_K: u16 = BPF_JMP | BPF_JGT | BPF_K;
/// Jump if A is at least `k`.
pub const JGE_K: u16 = BPF_JMP | BPF_JGE | BPF_K;
/// The most instructions a program may have (`BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;
/// X = `k`.
pub const LDX_IMM: u16 = BPF_LDX | BPF_W | BPF_IMM;
/// A = A % `k` (`k` not 0).
pub const MOD_K: u16 = BPF_ALU | BPF_MOD | BPF_K;
/// A = A + X.
pub const ADD_X: u16 = BPF_ALU | BPF_ADD | BPF_X;
/// A = A + `k`.
pub const ADD_K: u16 = BPF_ALU | BPF_ADD | BPF_K;
/// A = A & `k`.
pub const AND_K: u16 = BPF_ALU | BPF_AND | BPF_K;
/// A = X.
pub const TXA: u16 = BPF_MISC | BPF_TXA;
/// Jump `k` instructions forward.
pub const JA: u16 = BPF_JMP | BPF_JA;
/// Return `k`.
pub const RET_K: u16 = BPF_RET | BPF_K;
/// Return A.
pub const RET_A: u16 = BPF_RET | BPF_A;

/// One instruction.
pub fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// Appends the test "the destination MAC is `mac`": falls through when it is, else
/// jumps `skip` instructions past the test's last (4 instructions).
pub fn match_dst(p: &mut Vec<Insn>, mac: &[u8; 6], skip: u8) {
    let hi = u32::from(u16::from_be_bytes([mac[0], mac[1]]));
    let lo = u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]);
    p.push(insn(LD_H_ABS, 0, 0, SKF_LL_OFF as u32));
    p.push(insn(JEQ_K, 0, skip.saturating_add(2), hi));
    p.push(insn(LD_W_ABS, 0, 0, (SKF_LL_OFF + 2) as u32));
    p.push(insn(JEQ_K, 0, skip, lo));
}

/// What the kernel knows of a frame besides its bytes, for [`run`].
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta {
    /// Its flow hash.
    pub hash: u32,
    /// A VLAN tag was taken out of it.
    pub vlan: bool,
    /// That tag's TCI.
    pub tci: u16,
}

/// Whether the kernel would take `prog` (`bpf_check_classic`, for the instructions above):
/// 1 to 4,096 instructions, every jump inside, the last a return.
#[cfg(test)]
pub fn valid(prog: &[Insn]) -> bool {
    let n = prog.len();
    let jumps_inside = prog.iter().enumerate().all(|(i, x)| match x.code {
        JEQ_K | JGT_K | JGE_K => i + 1 + usize::from(x.jt) < n && i + 1 + usize::from(x.jf) < n,
        JA => i + 1 + (x.k as usize) < n,
        _ => true,
    });
    let no_mod_zero = prog.iter().all(|x| x.code != MOD_K || x.k != 0);
    (1..=MAX_INSNS).contains(&n)
        && jumps_inside
        && no_mod_zero
        && matches!(prog.last().map(|x| x.code), Some(RET_K | RET_A))
}

/// Runs `prog` over an Ethernet frame as the kernel would for the instructions above;
/// `None` for anything else (a program the kernel would refuse, see [`valid`]) or a load
/// beyond the frame.
#[cfg(test)]
pub fn run(prog: &[Insn], frame: &[u8], meta: Meta) -> Option<u32> {
    if !valid(prog) {
        return None;
    }
    let (mut a, mut x): (u32, u32) = (0, 0);
    let mut pc = 0usize;
    let load = |k: u32, n: usize| -> Option<u32> {
        let k = k as i32;
        match (k, n) {
            (SKF_AD_RXHASH, 4) => return Some(meta.hash),
            (SKF_AD_VLAN_TAG_PRESENT, 4) => return Some(u32::from(meta.vlan)),
            (SKF_AD_VLAN_TAG, 4) => return Some(u32::from(meta.tci)),
            _ => {}
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
            JGT_K => pc += usize::from(if a > i.k { i.jt } else { i.jf }),
            JGE_K => pc += usize::from(if a >= i.k { i.jt } else { i.jf }),
            JA => pc += i.k as usize,
            LDX_IMM => x = i.k,
            MOD_K => a %= i.k,
            ADD_X => a = a.wrapping_add(x),
            ADD_K => a = a.wrapping_add(i.k),
            AND_K => a &= i.k,
            TXA => a = x,
            RET_K => return Some(i.k),
            RET_A => return Some(a),
            _ => return None,
        }
    }
}

/// An Ethernet frame to `dst` (an IPv4 packet's first byte after its header), for tests.
#[cfg(test)]
pub fn frame(dst: [u8; 6]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&[2, 0, 0, 0, 0, 9, 0x08, 0x00, 0x45]);
    f
}
