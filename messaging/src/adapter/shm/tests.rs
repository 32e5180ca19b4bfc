//! Tests of the shared-memory ring: unit cases, properties (delivery, the doorbell protocol
//! under every interleaving, a scribbling peer) and real two-thread transfers.

use super::harness::{payload, transfer};
use super::ring::*;
use crate::memory::{HeapShared, SharedMem};
use proptest::prelude::*;
use std::collections::VecDeque;

const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const OFF_WAKE: usize = 132;
const OFF_SPACE: usize = 72;

fn cfg(data: u32, max_record: u32) -> RingConfig {
    RingConfig::new(data, max_record, 3).unwrap()
}

/// A fresh ring whose counters start at `start`, and both its ends.
fn ring(cfg: RingConfig, start: u32) -> (Producer<HeapShared>, Consumer<HeapShared>) {
    let mem = HeapShared::new(cfg.region_len());
    cfg.init(&mem).unwrap();
    mem.store_u32(OFF_HEAD, start).unwrap();
    mem.store_u32(OFF_TAIL, start).unwrap();
    let p = Producer::attach(mem.clone(), cfg).unwrap();
    let c = Consumer::attach(mem, cfg).unwrap();
    (p, c)
}

fn raw_record(mem: &HeapShared, data_off: usize, len: u32, kind: u32) {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&len.to_le_bytes());
    h[4..].copy_from_slice(&kind.to_le_bytes());
    mem.write(HEADER_LEN + data_off, &h).unwrap();
}

#[test]
fn config_is_validated() {
    assert_eq!(RingConfig::new(100, 8, 1), Err(ConfigError::DataSize(100)));
    assert_eq!(RingConfig::new(32, 8, 1), Err(ConfigError::DataSize(32)));
    assert_eq!(
        RingConfig::new(1 << 31, 8, 1),
        Err(ConfigError::DataSize(1 << 31))
    );
    assert!(matches!(
        RingConfig::new(256, 121, 1),
        Err(ConfigError::MaxRecord { .. })
    ));
    assert!(matches!(
        RingConfig::new(256, u32::MAX, 1),
        Err(ConfigError::MaxRecord { .. })
    ));
    assert_eq!(RingConfig::new(256, 8, 0), Err(ConfigError::MaxKind));
    let c = RingConfig::new(256, 120, 2).unwrap();
    assert_eq!((c.data_size(), c.max_record(), c.max_kind()), (256, 120, 2));
    assert_eq!(c.region_len(), HEADER_LEN + 256);
}

#[test]
fn header_is_checked_on_attach() {
    let c = cfg(256, 64);
    let short = HeapShared::new(c.region_len() - 4);
    assert!(matches!(c.init(&short), Err(RingError::Mem(_))));
    let mem = HeapShared::new(c.region_len());
    assert!(matches!(
        Consumer::attach(mem.clone(), c),
        Err(RingError::Header { field: "magic", .. })
    ));
    c.init(&mem).unwrap();
    let mut b = [0u8; 4];
    mem.read(0, &mut b).unwrap();
    assert_eq!(&b, b"SNRG");
    let other = cfg(512, 64);
    assert!(matches!(
        Producer::attach(mem.clone(), cfg(256, 32)),
        Err(RingError::Header {
            field: "max_record",
            ..
        })
    ));
    assert!(matches!(
        Producer::attach(HeapShared::new(other.region_len()), other).map(|_| ()),
        Err(RingError::Header { .. })
    ));
    mem.store_u32(OFF_HEAD, 12).unwrap();
    assert!(matches!(
        Producer::attach(mem.clone(), c),
        Err(RingError::Indices { .. })
    ));
    mem.store_u32(OFF_TAIL, 4).unwrap();
    assert!(matches!(
        Consumer::attach(mem, c),
        Err(RingError::Indices { .. })
    ));
}

#[test]
fn records_round_trip_with_parts() {
    let (mut p, mut c) = ring(cfg(1024, 256), 0);
    let mut buf = Vec::new();
    assert_eq!(c.pop(&mut buf), Ok(None));
    let _ = p.push(1, &[b"hello ", b"", b"world"]).unwrap();
    let _ = p.push(2, &[]).unwrap();
    let _ = p.push(3, &[&[7u8; 256]]).unwrap();
    assert_eq!(c.pop(&mut buf), Ok(Some(Record { kind: 1, len: 11 })));
    assert_eq!(buf, b"hello world");
    assert_eq!(c.pop(&mut buf), Ok(Some(Record { kind: 2, len: 0 })));
    assert!(buf.is_empty());
    assert_eq!(c.pop(&mut buf), Ok(Some(Record { kind: 3, len: 256 })));
    assert_eq!(buf, [7u8; 256]);
    assert_eq!(c.pop(&mut buf), Ok(None));
}

#[test]
fn push_refuses_bad_records() {
    let (mut p, _c) = ring(cfg(1024, 256), 0);
    assert_eq!(p.push(KIND_PAD, &[b"x"]), Err(PushError::BadKind(0)));
    assert_eq!(p.push(4, &[b"x"]), Err(PushError::BadKind(4)));
    assert_eq!(
        p.push(1, &[&[0; 200], &[0; 57]]),
        Err(PushError::TooLarge { len: 257, max: 256 })
    );
    assert_eq!(p.free(), 1024);
}

#[test]
fn pad_fills_the_end_and_the_record_starts_at_zero() {
    let (mut p, mut c) = ring(cfg(256, 100), 0);
    let mut buf = Vec::new();
    // 3 records of 8 + 64 bytes: offsets 0, 72, 144; the next (72 bytes) does not fit in
    // the 40 bytes left, so a PAD of 40 precedes it at offset 0.
    for i in 0..3 {
        let _ = p.push(1, &[&payload(i, 64)]).unwrap();
    }
    for i in 0..3 {
        assert_eq!(c.pop(&mut buf).unwrap().unwrap().len, 64);
        assert_eq!(buf, payload(i, 64));
    }
    let _ = p.push(2, &[&payload(9, 61)]).unwrap();
    let mut h = [0u8; 8];
    p.memory().read(HEADER_LEN + 216, &mut h).unwrap();
    assert_eq!(
        h,
        [32, 0, 0, 0, 0, 0, 0, 0],
        "PAD of 40 bytes (len 32) at offset 216"
    );
    p.memory().read(HEADER_LEN, &mut h).unwrap();
    assert_eq!(h, [61, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(p.memory().load_u32(OFF_HEAD).unwrap(), 216 + 40 + 72);
    assert_eq!(c.pop(&mut buf), Ok(Some(Record { kind: 2, len: 61 })));
    assert_eq!(buf, payload(9, 61));
    assert_eq!(c.memory().load_u32(OFF_TAIL).unwrap(), 328);
}

#[test]
fn full_ring_refuses_until_the_consumer_frees_space() {
    let (mut p, mut c) = ring(cfg(256, 100), 0);
    let mut buf = Vec::new();
    for _ in 0..4 {
        let _ = p.push(1, &[&[1; 56]]).unwrap();
    }
    assert_eq!(p.free(), 0);
    assert_eq!(p.push(1, &[]), Err(PushError::Full));
    assert!(c.pop(&mut buf).unwrap().is_some());
    let _ = p.push(1, &[&[2; 56]]).unwrap();
    assert_eq!(p.push(1, &[]), Err(PushError::Full));
    // A Full push changed nothing: the next records are the ones pushed.
    let mut n = 0;
    while let Some(r) = c.pop(&mut buf).unwrap() {
        assert_eq!(r.len, 56);
        n += 1;
    }
    assert_eq!(n, 4);
    assert_eq!(buf, [2; 56]);
}

#[test]
fn a_peeked_record_is_read_in_place_and_held_until_consumed() {
    let (mut p, mut c) = ring(cfg(256, 100), 0);
    let mem = c.memory().clone();
    assert!(!c.pending());
    assert_eq!(c.peek(), Ok(None));
    let mut b = [0u8; 4];
    assert!(c.read(0, &mut b).is_err(), "nothing is held");
    for i in 0..4u8 {
        let _ = p.push(1, &[&[i; 56]]).unwrap();
    }
    assert_eq!(p.push(1, &[]), Err(PushError::Full));
    assert!(c.pending(), "published records are seen without popping");
    let rec = c.peek().unwrap().unwrap();
    assert_eq!(rec, Record { kind: 1, len: 56 });
    // The header was read once: the peer rewriting it changes nothing held.
    mem.write(HEADER_LEN, &[0xff; 8]).unwrap();
    assert_eq!(c.peek(), Ok(Some(rec)));
    let mut part = [0u8; 16];
    c.read(40, &mut part).unwrap();
    assert_eq!(part, [0; 16]);
    assert!(c.read(41, &mut part).is_err(), "past the payload");
    assert!(c.read(usize::MAX, &mut part).is_err());
    assert!(!c.prepare_sleep(), "a held record is not consumed");
    assert_eq!(
        p.push(1, &[]),
        Err(PushError::Full),
        "held space stays taken"
    );
    c.consume().unwrap();
    c.consume().unwrap();
    let _ = p.push(1, &[&[9; 56]]).unwrap();
    let mut buf = Vec::new();
    let firsts: Vec<u8> = std::iter::from_fn(|| c.pop(&mut buf).unwrap().map(|_| buf[0])).collect();
    assert_eq!(firsts, [1, 2, 3, 9]);
    assert!(!c.pending());
    // A broken ring is "pending": the caller pops and learns why.
    mem.store_u32(OFF_HEAD, 3).unwrap();
    assert!(c.pending());
    assert!(c.pop(&mut buf).is_err());
    assert!(c.pending());
}

#[test]
fn counters_wrap_around() {
    let start = u32::MAX - 255; // 8-aligned, 256 bytes before the wrap
    let (mut p, mut c) = ring(cfg(256, 100), start);
    let mut buf = Vec::new();
    for i in 0..50u64 {
        let len = (i as usize * 13) % 101;
        let _ = p.push(1 + (i % 3) as u32, &[&payload(i, len)]).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap().unwrap().len, len);
        assert_eq!(buf, payload(i, len));
    }
    assert!(p.memory().load_u32(OFF_HEAD).unwrap() < start);
}

#[test]
fn doorbell_is_requested_once_per_sleep() {
    let (mut p, mut c) = ring(cfg(1024, 100), 0);
    let mut buf = Vec::new();
    assert_eq!(
        p.push(1, &[b"a"]),
        Ok(Pushed { notify: false }),
        "not armed"
    );
    assert!(!c.prepare_sleep(), "a record is waiting");
    assert_eq!(p.memory().load_u32(OFF_WAKE).unwrap() & 1, 0, "withdrawn");
    assert!(c.pop(&mut buf).unwrap().is_some());
    assert!(c.prepare_sleep());
    assert_eq!(
        p.memory().load_u32(OFF_WAKE).unwrap(),
        16 | 1,
        "armed at the tail"
    );
    assert_eq!(p.push(1, &[b"b"]), Ok(Pushed { notify: true }));
    assert_eq!(
        p.push(1, &[b"c"]),
        Ok(Pushed { notify: false }),
        "already rung"
    );
    c.wake();
    assert_eq!(p.push(1, &[b"d"]), Ok(Pushed { notify: false }), "awake");
    while c.pop(&mut buf).unwrap().is_some() {}
    assert!(c.prepare_sleep());
    // Staged records are published together: one doorbell.
    p.stage(1, &[b"e"]).unwrap();
    p.stage(2, &[b"f"]).unwrap();
    assert_eq!(c.pop(&mut buf), Ok(None), "staged records are not visible");
    assert_eq!(p.publish(), Ok(Pushed { notify: true }));
    assert_eq!(p.publish(), Ok(Pushed { notify: false }), "nothing staged");
    assert_eq!(c.pop(&mut buf), Ok(Some(Record { kind: 1, len: 1 })));
    assert_eq!(c.pop(&mut buf), Ok(Some(Record { kind: 2, len: 1 })));
}

#[test]
fn space_doorbell_is_requested_once_when_a_full_ring_drains() {
    let (mut p, mut c) = ring(cfg(256, 100), 0);
    let mut buf = Vec::new();
    assert!(!c.space_requested(), "nothing consumed");
    for _ in 0..4 {
        let _ = p.push(1, &[&[1; 56]]).unwrap();
    }
    assert_eq!(p.push(1, &[]), Err(PushError::Full));
    assert!(p.prepare_wait_space());
    assert_eq!(
        c.memory().load_u32(OFF_SPACE).unwrap(),
        1,
        "armed at tail 0"
    );
    assert!(c.pop(&mut buf).unwrap().is_some());
    assert!(c.space_requested(), "the first consumption rings");
    assert!(c.pop(&mut buf).unwrap().is_some());
    assert!(!c.space_requested(), "already rung");
    p.wake_space();
    assert_eq!(c.memory().load_u32(OFF_SPACE).unwrap() & 1, 0, "withdrawn");
    // Space freed before the producer looked again: it does not sleep.
    let _ = p.push(1, &[&[2; 56]]).unwrap();
    let _ = p.push(1, &[&[3; 56]]).unwrap();
    assert_eq!(p.push(1, &[]), Err(PushError::Full));
    assert!(c.pop(&mut buf).unwrap().is_some());
    assert!(!p.prepare_wait_space(), "the consumer moved meanwhile");
    assert_eq!(c.memory().load_u32(OFF_SPACE).unwrap() & 1, 0, "withdrawn");
    assert!(!c.space_requested(), "not armed when it consumed");
}

/// The space doorbell's interleavings: the producer pushes `n` records of `size` into a
/// 256-byte ring, and when it is full (a push that reloaded `tail`) arms `space`, then
/// (fence) loads `tail` again, then sleeps; the consumer pops (storing `tail`), then (fence) loads `space`, and rings. Each
/// step is one shared-memory access, chosen by `choices` (`true`: the producer), then
/// round-robin. Returns an error if the producer ends up asleep before the consumer has
/// emptied the ring.
fn space_model(choices: &[bool], n: usize, size: usize, recheck: bool) -> Result<(), String> {
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum P {
        Pushing,
        Full,
        Armed,
        Sleeping,
    }
    let (mut p, mut c) = ring(cfg(256, 100), 0);
    let mut buf = Vec::new();
    let (mut pushed, mut popped, mut doorbell) = (0usize, 0usize, false);
    let (mut state, mut check) = (P::Pushing, false);
    let mut choice = choices.iter().copied();
    let mut turn = false;
    for _ in 0..10_000 {
        let prod_can = pushed < n && (state != P::Sleeping || doorbell);
        let cons_can = check || popped < pushed;
        if !prod_can && !cons_can {
            return if pushed == n && popped == n {
                Ok(())
            } else {
                Err(format!("lost wake-up: {pushed} of {n} pushed, asleep"))
            };
        }
        let producer = match (prod_can, cons_can) {
            (true, true) => choice.next().unwrap_or_else(|| {
                turn = !turn;
                turn
            }),
            (p_, _) => p_,
        };
        if producer {
            match state {
                P::Pushing => match p.push(1, &[&payload(pushed as u64, size)]) {
                    Ok(_) => pushed += 1,
                    Err(PushError::Full) => state = P::Full,
                    Err(e) => return Err(e.to_string()),
                },
                P::Full => {
                    p.arm_space().map_err(|e| e.to_string())?;
                    state = if recheck { P::Armed } else { P::Sleeping };
                }
                P::Armed => {
                    if p.recheck_space() {
                        state = P::Sleeping;
                    } else {
                        p.wake_space();
                        state = P::Pushing;
                    }
                }
                P::Sleeping => {
                    doorbell = false;
                    p.wake_space();
                    state = P::Pushing;
                }
            }
        } else if check {
            check = false;
            if c.space_requested() {
                doorbell = true;
            }
        } else {
            c.pop(&mut buf).map_err(|e| e.to_string())?;
            popped += 1;
            check = true;
        }
    }
    Err("no quiescence".into())
}

#[test]
fn space_model_never_loses_a_wake_up_exhaustively() {
    for bits in 0u32..1 << 16 {
        let choices: Vec<bool> = (0..16).map(|i| bits >> i & 1 == 1).collect();
        space_model(&choices, 7, 56, true).unwrap();
        // Records that need PAD records at the end of the data area.
        space_model(&choices, 6, 100, true).unwrap();
    }
}

#[test]
fn space_model_catches_a_missing_recheck() {
    let found = (0u32..1 << 12).any(|bits| {
        let choices: Vec<bool> = (0..12).map(|i| bits >> i & 1 == 1).collect();
        space_model(&choices, 6, 56, false).is_err()
    });
    assert!(found, "sleeping without the recheck not caught");
}

/// Each malformed ring is refused with its error, which then sticks.
#[test]
fn consumer_refuses_malformed_rings() {
    let c256 = cfg(256, 100);
    type Setup = fn(&HeapShared);
    let cases: [(Setup, RingError); 9] = [
        (
            |m| m.store_u32(OFF_HEAD, 4).unwrap(),
            RingError::Indices { head: 4, tail: 0 },
        ),
        (
            |m| m.store_u32(OFF_HEAD, 264).unwrap(),
            RingError::Indices { head: 264, tail: 0 },
        ),
        (
            |m| m.store_u32(OFF_HEAD, u32::MAX - 7).unwrap(),
            RingError::Indices {
                head: u32::MAX - 7,
                tail: 0,
            },
        ),
        (
            |m| {
                raw_record(m, 0, 1, 4);
                m.store_u32(OFF_HEAD, 16).unwrap();
            },
            RingError::UnknownKind(4),
        ),
        (
            |m| {
                raw_record(m, 0, 101, 1);
                m.store_u32(OFF_HEAD, 256).unwrap();
            },
            RingError::TooLong { len: 101, max: 100 },
        ),
        (
            |m| {
                raw_record(m, 0, 9, 1);
                m.store_u32(OFF_HEAD, 16).unwrap();
            },
            RingError::Truncated {
                total: 24,
                avail: 16,
            },
        ),
        (
            |m| {
                raw_record(m, 0, 248, KIND_PAD);
                m.store_u32(OFF_HEAD, 256).unwrap();
            },
            RingError::BadPad { off: 0, len: 248 },
        ),
        (
            |m| {
                raw_record(m, 0, 0, 1);
                raw_record(m, 8, 232, KIND_PAD);
                m.store_u32(OFF_HEAD, 256).unwrap();
            },
            RingError::BadPad { off: 8, len: 232 },
        ),
        (
            |m| {
                raw_record(m, 0, 0, 1);
                raw_record(m, 8, 240, KIND_PAD);
                m.store_u32(OFF_HEAD, 16).unwrap();
            },
            RingError::Truncated {
                total: 248,
                avail: 8,
            },
        ),
    ];
    for (i, (setup, want)) in cases.into_iter().enumerate() {
        let (_p, mut c) = ring(c256, 0);
        setup(c.memory());
        let mut buf = Vec::new();
        let mut got = c.pop(&mut buf);
        if got == Ok(Some(Record { kind: 1, len: 0 })) {
            got = c.pop(&mut buf);
        }
        assert_eq!(got, Err(want), "case {i}");
        c.memory().store_u32(OFF_HEAD, 0).unwrap();
        assert_eq!(c.pop(&mut buf), Err(want), "case {i}: the error sticks");
        assert!(!c.prepare_sleep());
    }
}

#[test]
fn consumer_refuses_a_straddling_record() {
    let (mut p, mut c) = ring(cfg(256, 100), 0);
    let mut buf = Vec::new();
    for _ in 0..3 {
        let _ = p.push(1, &[&[0; 64]]).unwrap();
        c.pop(&mut buf).unwrap().unwrap();
    }
    // At offset 216, 40 bytes before the end: a 48-byte record straddles it.
    raw_record(c.memory(), 216, 40, 1);
    c.memory().store_u32(OFF_HEAD, 216 + 48).unwrap();
    assert_eq!(
        c.pop(&mut buf),
        Err(RingError::Straddles {
            off: 216,
            total: 48
        })
    );
}

#[test]
fn producer_refuses_a_bad_tail() {
    for bad in [4u32, 64, u32::MAX - 7] {
        let (mut p, _c) = ring(cfg(256, 100), 0);
        for _ in 0..4 {
            let _ = p.push(1, &[&[0; 56]]).unwrap();
        }
        // Not a multiple of 8, past the published head, or more than a ring behind.
        let tail = if bad == 64 { 256 + 64 } else { bad };
        p.memory().store_u32(OFF_TAIL, tail).unwrap();
        assert!(matches!(
            p.push(1, &[]),
            Err(PushError::Peer(RingError::Indices { .. }))
        ));
        assert!(matches!(p.push(1, &[]), Err(PushError::Peer(_))), "sticks");
        assert!(p.publish().is_err());
    }
}

/// The free space the layout specification gives for pushing a record of `len` bytes at
/// `head`: `(bytes needed with any PAD, fits)`.
fn spec_need(data: u32, head: u32, tail: u32, len: usize) -> (u32, bool) {
    let total = 8 + (len as u32).next_multiple_of(8);
    let to_end = data - (head & (data - 1));
    let need = if total > to_end {
        to_end + total
    } else {
        total
    };
    (need, need <= data - head.wrapping_sub(tail))
}

#[derive(Debug, Clone)]
enum Op {
    Push(u32, Vec<usize>),
    Stage(u32, usize),
    Publish,
    Pop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..=3, proptest::collection::vec(0usize..=40, 0..4)).prop_map(|(k, v)| Op::Push(k, v)),
        1 => (1u32..=3, 0usize..=120).prop_map(|(k, l)| Op::Stage(k, l)),
        1 => Just(Op::Publish),
        4 => Just(Op::Pop),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any interleaving of pushes and pops of any sizes (wrapping the data area and the
    /// counters, with PAD records) delivers exactly the pushed bytes in order, and a push is
    /// refused as Full exactly when the specification says it does not fit.
    #[test]
    fn delivers_exactly_what_was_pushed(
        start in prop_oneof![Just(0u32), Just(u32::MAX - 511), (0u32..1 << 29).prop_map(|x| x * 8)],
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let data = 256;
        let (mut p, mut c) = ring(cfg(data, 120), start);
        let (mut head, mut tail, mut published) = (start, start, start);
        let mut staged: VecDeque<(u32, Vec<u8>, u32)> = VecDeque::new();
        let mut visible: VecDeque<(u32, Vec<u8>, u32)> = VecDeque::new();
        let mut seq = 0u64;
        let mut buf = Vec::new();
        for op in ops {
            match op {
                Op::Push(kind, sizes) => {
                    let bytes: Vec<Vec<u8>> = sizes.iter().map(|&n| { seq += 1; payload(seq, n) }).collect();
                    let parts: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
                    let (need, fits) = spec_need(data, head, tail, bytes.iter().map(Vec::len).sum());
                    match p.push(kind, &parts) {
                        Ok(_) => {
                            prop_assert!(fits);
                            head = head.wrapping_add(need);
                            staged.push_back((kind, bytes.concat(), need));
                            published = head;
                            visible.append(&mut staged);
                        }
                        Err(e) => {
                            prop_assert_eq!(e, PushError::Full);
                            prop_assert!(!fits);
                        }
                    }
                }
                Op::Stage(kind, len) => {
                    seq += 1;
                    let bytes = payload(seq, len);
                    let (need, fits) = spec_need(data, head, tail, len);
                    match p.stage(kind, &[&bytes]) {
                        Ok(()) => {
                            prop_assert!(fits);
                            head = head.wrapping_add(need);
                            staged.push_back((kind, bytes, need));
                        }
                        Err(e) => {
                            prop_assert_eq!(e, PushError::Full);
                            prop_assert!(!fits);
                        }
                    }
                }
                Op::Publish => {
                    let _ = p.publish().unwrap();
                    published = head;
                    visible.append(&mut staged);
                }
                Op::Pop => match c.pop(&mut buf).unwrap() {
                    Some(r) => {
                        let (kind, bytes, need) = visible.pop_front().unwrap();
                        prop_assert_eq!(r, Record { kind, len: bytes.len() });
                        prop_assert_eq!(&buf, &bytes);
                        tail = tail.wrapping_add(need);
                    }
                    None => prop_assert!(visible.is_empty()),
                },
            }
            prop_assert_eq!(c.memory().load_u32(OFF_HEAD).unwrap(), published);
        }
        let _ = p.publish().unwrap();
        visible.append(&mut staged);
        while let Some(r) = c.pop(&mut buf).unwrap() {
            let (kind, bytes, _) = visible.pop_front().unwrap();
            prop_assert_eq!(r, Record { kind, len: bytes.len() });
            prop_assert_eq!(&buf, &bytes);
        }
        prop_assert!(visible.is_empty());
    }
}

/// Deliberate mistakes the doorbell model must catch (so the model can fail).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bug {
    None,
    /// The consumer sleeps right after arming, without looking at `head` again.
    NoRecheck,
    /// The producer looks at `wake` before publishing `head`.
    CheckBeforePublish,
}

/// Runs the producer (pushing `sizes`) and the consumer step by step, in the interleaving
/// chosen by `choices` (`true`: the producer steps when both can), then round-robin. Each
/// step is one shared-memory access of the protocol; a single thread is sequentially
/// consistent, which is what the two fences give the real code. Returns an error if the
/// consumer ends up asleep with records it was never woken for.
fn doorbell_model(choices: &[bool], sizes: &[usize], bug: Bug) -> Result<(), String> {
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum C {
        Popping,
        Empty,
        Armed,
        Sleeping,
    }
    let (mut p, mut c) = ring(cfg(256, 100), 0);
    let mut buf = Vec::new();
    let (mut next, mut pending_check, mut early_notify) = (0usize, None::<u32>, None::<bool>);
    let (mut doorbell, mut rung, mut arms, mut received) = (false, 0u32, 0u32, 0usize);
    let mut state = C::Popping;
    let mut choice = choices.iter().copied();
    let mut turn = false;
    for _ in 0..10_000 {
        let prod_can = next < sizes.len() || pending_check.is_some();
        let cons_can = state != C::Sleeping || doorbell;
        if !prod_can && !cons_can {
            return if received == sizes.len() {
                if rung > arms {
                    Err(format!("{rung} doorbells for {arms} sleeps"))
                } else {
                    Ok(())
                }
            } else {
                Err(format!(
                    "lost wake-up: asleep with {} records waiting",
                    sizes.len() - received
                ))
            };
        }
        let producer = match (prod_can, cons_can) {
            (true, true) => choice.next().unwrap_or_else(|| {
                turn = !turn;
                turn
            }),
            (p_, _) => p_,
        };
        if producer {
            if let Some(old) = pending_check.take() {
                // Step 2: (fence) load `wake`.
                if p.wake_requested(old).map_err(|e| e.to_string())? {
                    doorbell = true;
                    rung += 1;
                }
            } else if bug == Bug::CheckBeforePublish && early_notify.is_none() {
                // The broken order's step 1: load `wake` first.
                early_notify = Some(c.memory().load_u32(OFF_WAKE).unwrap() & 1 != 0);
            } else {
                // Step 1: write the record and store `head`.
                match p.stage(1, &[&payload(next as u64, sizes[next])]) {
                    Ok(()) => {
                        let old = p.publish_head().map_err(|e| e.to_string())?;
                        next += 1;
                        match early_notify.take() {
                            Some(notify) => {
                                if notify {
                                    doorbell = true;
                                    rung += 1;
                                }
                            }
                            None => pending_check = old,
                        }
                    }
                    Err(PushError::Full) => early_notify = None, // retried at its next step
                    Err(e) => return Err(e.to_string()),
                }
            }
        } else {
            match state {
                C::Popping => match c.pop(&mut buf).map_err(|e| e.to_string())? {
                    Some(_) => received += 1,
                    None => state = C::Empty,
                },
                C::Empty => {
                    c.arm().map_err(|e| e.to_string())?;
                    arms += 1;
                    state = if bug == Bug::NoRecheck {
                        C::Sleeping
                    } else {
                        C::Armed
                    };
                }
                // (fence) load `head` again.
                C::Armed => {
                    if c.recheck().map_err(|e| e.to_string())? {
                        state = C::Sleeping;
                    } else {
                        c.wake();
                        state = C::Popping;
                    }
                }
                C::Sleeping => {
                    doorbell = false;
                    c.wake();
                    state = C::Popping;
                }
            }
        }
    }
    Err("no quiescence".into())
}

#[test]
fn doorbell_model_never_loses_a_wake_up_exhaustively() {
    // Every interleaving of three pushes with the consumer's steps.
    for bits in 0u32..1 << 16 {
        let choices: Vec<bool> = (0..16).map(|i| bits >> i & 1 == 1).collect();
        doorbell_model(&choices, &[8, 100, 0], Bug::None).unwrap();
    }
}

#[test]
fn doorbell_model_catches_broken_orderings() {
    for bug in [Bug::NoRecheck, Bug::CheckBeforePublish] {
        let found = (0u32..1 << 10).any(|bits| {
            let choices: Vec<bool> = (0..10).map(|i| bits >> i & 1 == 1).collect();
            doorbell_model(&choices, &[8, 8], bug).is_err()
        });
        assert!(found, "{bug:?} not caught");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Random interleavings of longer runs, with a ring that fills up.
    #[test]
    fn doorbell_model_never_loses_a_wake_up(
        choices in proptest::collection::vec(any::<bool>(), 0..400),
        sizes in proptest::collection::vec(0usize..=100, 1..40),
    ) {
        prop_assert_eq!(doorbell_model(&choices, &sizes, Bug::None), Ok(()));
    }
}

#[derive(Debug, Clone)]
enum Hostile {
    Push(u32, usize),
    Pop,
    Sleep,
    Wake,
    Scribble(usize, Vec<u8>),
    SetWord(usize, u32),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        3 => (0u32..5, 0usize..130).prop_map(|(k, l)| Hostile::Push(k, l)),
        4 => Just(Hostile::Pop),
        1 => Just(Hostile::Sleep),
        1 => Just(Hostile::Wake),
        2 => (0usize..HEADER_LEN + 256, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(o, b)| Hostile::Scribble(o, b)),
        2 => (prop_oneof![Just(OFF_HEAD), Just(OFF_TAIL), Just(OFF_WAKE)],
              prop_oneof![any::<u32>(), (0u32..64).prop_map(|x| x * 8)])
            .prop_map(|(o, v)| Hostile::SetWord(o, v)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// A peer rewriting the header and data between operations gets errors or well-formed
    /// records, never a panic, and never makes the consumer allocate past `max_record`.
    #[test]
    fn scribbling_peer_yields_errors_or_valid_records(
        ops in proptest::collection::vec(hostile(), 1..120),
    ) {
        let max_record = 100;
        let (mut p, mut c) = ring(cfg(256, max_record), 0);
        let mem = c.memory().clone();
        let mut buf = Vec::new();
        for op in ops {
            match op {
                Hostile::Push(kind, len) => {
                    let _ = p.push(kind, &[&payload(len as u64, len)]);
                }
                Hostile::Pop => match c.pop(&mut buf) {
                    Ok(Some(r)) => {
                        prop_assert!((1..=3).contains(&r.kind));
                        prop_assert!(r.len <= max_record as usize);
                        prop_assert_eq!(buf.len(), r.len);
                    }
                    Ok(None) => {}
                    Err(_) => prop_assert!(buf.is_empty()),
                },
                Hostile::Sleep => {
                    let _ = c.prepare_sleep();
                }
                Hostile::Wake => c.wake(),
                Hostile::Scribble(off, bytes) => {
                    let _ = mem.write(off, &bytes);
                }
                Hostile::SetWord(off, v) => mem.store_u32(off, v).unwrap(),
            }
            prop_assert!(buf.capacity() <= max_record as usize);
        }
    }
}

fn mixed_len(seq: u64) -> usize {
    // Reproducible lengths 0..=1000 with many small ones.
    let x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    if x.is_multiple_of(4) {
        (x % 1001) as usize
    } else {
        (x % 97) as usize
    }
}

#[test]
fn two_threads_move_a_million_records_with_doorbells() {
    let c = RingConfig::new(16 << 10, 1000, 1).unwrap();
    let mem = HeapShared::new(c.region_len());
    c.init(&mem).unwrap();
    let t = transfer(mem.clone(), mem, c, 1_000_000, mixed_len, true, true);
    t.report("heap, doorbell");
    assert_eq!(t.lost_wakeups, 0);
}

#[test]
fn two_threads_spinning() {
    let c = RingConfig::new(4 << 10, 1000, 1).unwrap();
    let mem = HeapShared::new(c.region_len());
    c.init(&mem).unwrap();
    // Start near the counters' wrap.
    mem.store_u32(OFF_HEAD, u32::MAX - 4095).unwrap();
    mem.store_u32(OFF_TAIL, u32::MAX - 4095).unwrap();
    let t = transfer(mem.clone(), mem, c, 300_000, mixed_len, true, false);
    assert_eq!(t.records, 300_000);
}

/// `cargo test --release -p splitnet-messaging --lib -- --ignored --nocapture throughput`
#[test]
#[ignore = "measurement"]
fn throughput_heap() {
    for doorbell in [false, true] {
        for (len, count) in [(64usize, 10_000_000u64), (1500, 2_000_000)] {
            let c = RingConfig::new(256 << 10, 1500, 1).unwrap();
            let mem = HeapShared::new(c.region_len());
            c.init(&mem).unwrap();
            let len_of: fn(u64) -> usize = if len == 64 { |_| 64 } else { |_| 1500 };
            let how = if doorbell {
                "consumer parks"
            } else {
                "spinning"
            };
            let t = transfer(mem.clone(), mem, c, count, len_of, false, doorbell);
            t.report(&format!("HeapShared, {len} B records, {how}"));
            assert_eq!(t.lost_wakeups, 0);
        }
    }
}
