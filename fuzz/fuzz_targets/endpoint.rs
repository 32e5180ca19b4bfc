//! Two endpoints driven by arbitrary sequences of actions: frames both ways, hostile raw
//! messages and operations injected on either channel, flushes and teardown. Never panics;
//! a session that fails does so with an error; well-formed traffic arrives intact.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::{Channel, Op, Payload};
use splitnet_messaging::testing::{config, Outcome, Pair, Side};

#[derive(Debug, Arbitrary)]
enum Action {
    Frame { from_b: bool, len: u16, seed: u8 },
    RawMessage { from_b: bool, bytes: Vec<u8> },
    RawWrite { from_b: bool, handle: u64, addr: u64, imm: Option<u32>, len: u8 },
    Flush { from_b: bool },
    Drive,
}

fuzz_target!(|actions: Vec<Action>| {
    let mut p = Pair::new(config(64), config(64), 1 << 18);
    if p.drive().is_err() {
        return;
    }
    let mut sent = [Vec::new(), Vec::new()];
    let mut hostile = false;
    for a in actions.into_iter().take(64) {
        match a {
            Action::Frame { from_b, len, seed } => {
                let side = if from_b { Side::B } else { Side::A };
                let frame: Vec<u8> = (0..usize::from(len)).map(|i| (i as u8) ^ seed).collect();
                if matches!(p.send(side, &frame), Outcome::Inline | Outcome::Rdma) {
                    sent[usize::from(from_b)].push(frame);
                }
            }
            Action::RawMessage { from_b, bytes } => {
                hostile = true;
                let peer = if from_b { &mut p.b } else { &mut p.a };
                peer.link.data_channel_mut().post(Op::Send, &[], Payload::Bytes(bytes));
            }
            Action::RawWrite { from_b, handle, addr, imm, len } => {
                hostile = true;
                let peer = if from_b { &mut p.b } else { &mut p.a };
                let op = match imm {
                    Some(imm) => Op::WriteImm { handle, addr, imm },
                    None => Op::Write { handle, addr },
                };
                peer.link.data_channel_mut().post(op, &[], Payload::Bytes(vec![0xAA; usize::from(len)]));
            }
            Action::Flush { from_b } => {
                let peer = if from_b { &mut p.b } else { &mut p.a };
                peer.link.session_mut().start_flush(&mut peer.reg);
                hostile = true; // frames after a flush may be refused
            }
            Action::Drive => {
                if p.drive().is_err() {
                    return;
                }
            }
        }
    }
    if p.drive().is_err() {
        return;
    }
    if !hostile {
        assert_eq!(p.b.received, sent[0]);
        assert_eq!(p.a.received, sent[1]);
    }
});
