//! Two endpoints driven by arbitrary sequences of actions: frames both ways, hostile raw
//! messages and operations injected on either channel, flushes and teardown.
//!
//! Small pools and buffers keep a run cheap. Invariants, from docs/protocol.md:
//! - every session error carries the code of its row in the section 7 table (the document
//!   is read, not restated), and its Goodbye reaches the peer on the control channel;
//! - nothing a peer sends grows state beyond the configured bounds;
//! - a write through a flushed (stale) or foreign handle never places a byte: it is a
//!   protection error (row E3), and a foreign region keeps its contents;
//! - well-formed traffic alone arrives intact and in order.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::{Channel, Op, Payload};
use splitnet_messaging::endpoint::{LinkError, LinkEvent};
use splitnet_messaging::memory::{Access, DomainId, Handle, RegionSpec};
use splitnet_messaging::testing::{doc_error_codes, small_config, Outcome, Pair, Side, Sizes};
use std::sync::OnceLock;

const SIZES: Sizes = Sizes {
    pipe: 16 << 10,
    max_send: 4096,
    send_buf: 4096,
};
/// A region of a third domain in each peer's registry: no write may ever change it.
const FOREIGN: DomainId = DomainId(99);
const SENTINEL: u8 = 0x5a;

#[derive(Debug, Arbitrary)]
enum Target {
    /// A handle the receiver advertised (live or flushed since).
    Seen(u8),
    /// The receiver's region of another domain.
    Foreign,
    Raw(u64),
}

#[derive(Debug, Arbitrary)]
enum Action {
    Frame {
        from_b: bool,
        len: u16,
        seed: u8,
    },
    RawMessage {
        from_b: bool,
        control: bool,
        bytes: Vec<u8>,
    },
    RawWrite {
        from_b: bool,
        control: bool,
        to: Target,
        element: u8,
        imm: Option<u32>,
        len: u8,
    },
    Flush {
        from_b: bool,
    },
    Drive,
}

fn doc() -> &'static [(String, Option<u16>)] {
    static DOC: OnceLock<Vec<(String, Option<u16>)>> = OnceLock::new();
    DOC.get_or_init(|| doc_error_codes(include_str!("../../docs/protocol.md")))
}

/// The error's code is its row's; the peer hears it in a Goodbye on the control channel.
fn check_error(p: &mut Pair, side: Side, e: &LinkError) {
    let row = e
        .row()
        .expect("the in-process pipe never fails as a transport");
    let documented = doc().iter().find(|(id, _)| id == row).map(|r| r.1);
    let code = e.code().map(|c| c.to_u16());
    assert_eq!(
        documented,
        Some(code),
        "{e}: code {code:?}, the document's row {row} says {documented:?}"
    );
    let (me, peer) = match side {
        Side::A => (&mut p.a, &mut p.b),
        Side::B => (&mut p.b, &mut p.a),
    };
    let sent = me
        .link
        .fail(e)
        .expect("a session error is told to the peer");
    if me.link.pending() > 0 {
        return; // the pipe is full: the Goodbye waits behind what the peer has not read
    }
    peer.events.clear();
    let mut events = Vec::new();
    let (reg, link) = (&mut peer.reg, &mut peer.link);
    // The peer reads its control channel: whatever came before, the Goodbye is there
    // unless the peer fails first on something hostile queued ahead of it.
    let r = link.poll(
        reg,
        splitnet_messaging::endpoint::Lane::Control,
        1 << 16,
        &mut |_| {},
        &mut events,
    );
    if r.is_ok() {
        assert!(
            events.contains(&LinkEvent::Goodbye(sent)),
            "{e}: no Goodbye({sent:?}) on channel 0: {events:?}"
        );
    }
}

/// Nothing a peer sends grows state beyond the configured bounds.
fn check_bounds(p: &Pair) {
    for peer in [&p.a, &p.b] {
        let s = peer.link.session();
        let cfg = small_config(0);
        assert!(s.target().live_pools() <= cfg.target.max_pools.max(cfg.advertise.len()));
        assert!(s.target().granted_bytes() <= cfg.target.max_granted_bytes);
        assert!(s.initiator().pools().count() <= cfg.initiator.max_pools);
        assert!(s.initiator().retired() <= cfg.initiator.max_pools);
        // Our pools, and the foreign region.
        assert!(peer.reg.stats().regions as usize <= cfg.target.max_pools + 1);
        assert!(peer.reg.stats().bytes <= cfg.target.max_granted_bytes + 256);
    }
}

fn foreign_intact(p: &Pair, foreign: [Handle; 2]) {
    for (peer, h) in [(&p.a, foreign[0]), (&p.b, foreign[1])] {
        let bytes = peer
            .reg
            .element(h, 0, 256)
            .expect("foreign region stays registered");
        assert!(
            bytes.iter().all(|&b| b == SENTINEL),
            "a write reached another domain's region"
        );
    }
}

fuzz_target!(|actions: Vec<Action>| {
    let mut p = Pair::sized(small_config(64), small_config(64), SIZES);
    let mut foreign = [Handle::from_u64(0); 2];
    for (i, peer) in [&mut p.a, &mut p.b].into_iter().enumerate() {
        let spec = RegionSpec {
            domain: FOREIGN,
            access: Access::REMOTE_WRITE,
            element_size: 256,
            element_count: 1,
            single_use: false,
        };
        let h = peer
            .reg
            .register(spec)
            .expect("room for the foreign region");
        peer.reg.grant(h, 0).expect("grant");
        peer.reg.element_mut(h, 0).expect("element").fill(SENTINEL);
        foreign[i] = h;
    }
    if let Err((side, e)) = p.drive() {
        check_error(&mut p, side, &e);
        return;
    }
    // Handles each side advertised, as its peer saw them (index: receiver).
    let mut seen: [Vec<(u64, u64)>; 2] = [Vec::new(), Vec::new()];
    let mut sent = [Vec::new(), Vec::new()];
    let mut hostile = false;
    for a in actions.into_iter().take(64) {
        for (rx, sender) in [(0usize, &p.b), (1, &p.a)] {
            for e in sender.link.session().initiator().pools() {
                if !seen[rx].iter().any(|s| s.0 == e.handle) && seen[rx].len() < 32 {
                    seen[rx].push((e.handle, e.address));
                }
            }
        }
        let mut must_protect = None;
        match a {
            Action::Frame { from_b, len, seed } => {
                let side = if from_b { Side::B } else { Side::A };
                let len = usize::from(len) % 2600;
                let frame: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
                if matches!(p.send(side, &frame), Outcome::Inline | Outcome::Rdma) {
                    sent[usize::from(from_b)].push(frame);
                }
            }
            Action::RawMessage {
                from_b,
                control,
                bytes,
            } => {
                hostile = true;
                let peer = if from_b { &mut p.b } else { &mut p.a };
                let ch = if control {
                    peer.link.control_channel_mut()
                } else {
                    peer.link.data_channel_mut()
                };
                ch.post(Op::Send, &[], Payload::Bytes(bytes));
            }
            Action::RawWrite {
                from_b,
                control,
                to,
                element,
                imm,
                len,
            } => {
                hostile = true;
                // Everything before it settles first, so its own outcome can be judged.
                if let Err((side, e)) = p.drive() {
                    check_error(&mut p, side, &e);
                    foreign_intact(&p, foreign);
                    return;
                }
                let rx = usize::from(!from_b);
                let receiver = if from_b { &p.a } else { &p.b };
                let receiver_domain = if from_b { DomainId(1) } else { DomainId(2) };
                let live = receiver.reg.regions_of(receiver_domain);
                let (handle, addr) = match to {
                    Target::Seen(i) if !seen[rx].is_empty() => {
                        let (h, a) = seen[rx][usize::from(i) % seen[rx].len()];
                        if !live.contains(&Handle::from_u64(h)) {
                            must_protect = Some(rx); // flushed: stale
                        }
                        (h, a + u64::from(element) * 256)
                    }
                    Target::Foreign => {
                        must_protect = Some(rx);
                        (
                            foreign[rx].to_u64(),
                            splitnet_messaging::memory::Registry::base_address(foreign[rx]),
                        )
                    }
                    Target::Seen(_) | Target::Raw(_) => {
                        let h = if let Target::Raw(h) = to { h } else { 0 };
                        (h, u64::from(element) << 8)
                    }
                };
                let op = match imm {
                    Some(imm) => Op::WriteImm { handle, addr, imm },
                    None => Op::Write { handle, addr },
                };
                let peer = if from_b { &mut p.b } else { &mut p.a };
                let ch = if control {
                    peer.link.control_channel_mut()
                } else {
                    peer.link.data_channel_mut()
                };
                ch.post(op, &[], Payload::Bytes(vec![0xAA; usize::from(len)]));
                if control {
                    must_protect = Some(rx); // no write on channel 0 (row E4)
                }
            }
            Action::Flush { from_b } => {
                let peer = if from_b { &mut p.b } else { &mut p.a };
                peer.link.session_mut().start_flush(&mut peer.reg);
                hostile = true; // frames after a flush may be refused
            }
            Action::Drive => {}
        }
        let driven = p.drive();
        if let Some(rx) = must_protect {
            let rx_side = if rx == 0 { Side::A } else { Side::B };
            match &driven {
                Err((side, e)) => {
                    assert_eq!(*side, rx_side, "the writer's peer refuses: {e}");
                    assert!(
                        e.is_protection(),
                        "a stale, foreign or channel-0 write is a protection error: {e}"
                    );
                }
                Ok(()) => panic!("a stale, foreign or channel-0 write was accepted"),
            }
        }
        if let Err((side, e)) = driven {
            check_error(&mut p, side, &e);
            foreign_intact(&p, foreign);
            return;
        }
        check_bounds(&p);
    }
    // Nothing but a write could change the foreign regions: checking once, at the end,
    // covers every action (and keeps a run cheap).
    foreign_intact(&p, foreign);
    if let Err((side, e)) = p.drive() {
        check_error(&mut p, side, &e);
        return;
    }
    if !hostile {
        assert_eq!(p.b.received, sent[0]);
        assert_eq!(p.a.received, sent[1]);
    }
});
