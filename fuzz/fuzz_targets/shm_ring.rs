//! The shared-memory ring's consumer (and producer) against a hostile peer: arbitrary ring
//! contents and indices, and arbitrary scribbles over the header and data between
//! operations.
//!
//! Invariants, from the ring's module documentation:
//! - no panic, whatever the shared bytes;
//! - every record returned has a known kind and at most `max_record` bytes, all copied into
//!   the caller's buffer, whose capacity never exceeds `max_record`;
//! - an error sticks: the consumer keeps returning it;
//! - a record held by `peek` keeps its kind and length whatever the peer scribbles, reads
//!   inside it succeed (unless the ring broke) and reads outside it fail.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::shm::ring::HEADER_LEN;
use splitnet_messaging::adapter::shm::{Consumer, Producer, RingConfig};
use splitnet_messaging::memory::{HeapShared, SharedMem};

#[derive(Debug, Arbitrary)]
enum Action {
    Pop,
    Peek,
    Read { at: u16, len: u16 },
    Consume,
    PrepareSleep,
    Wake,
    Push { kind: u8, len: u16 },
    Publish,
    Scribble { off: u16, bytes: Vec<u8> },
    Word { which: u8, value: u32 },
}

#[derive(Debug, Arbitrary)]
struct Input {
    size: u8,
    head: u32,
    tail: u32,
    data: Vec<u8>,
    actions: Vec<Action>,
}

fuzz_target!(|input: Input| {
    let data_size = 64u32 << (input.size % 6);
    let max_record = data_size / 2 - 8;
    let max_kind = 3;
    let cfg = RingConfig::new(data_size, max_record, max_kind).unwrap();
    let mem = HeapShared::new(cfg.region_len());
    cfg.init(&mem).unwrap();
    let n = input.data.len().min(data_size as usize);
    mem.write(HEADER_LEN, &input.data[..n]).unwrap();
    mem.store_u32(64, input.head).unwrap();
    mem.store_u32(128, input.tail).unwrap();
    let Ok(mut c) = Consumer::attach(mem.clone(), cfg) else {
        return;
    };
    let mut p = Producer::attach(mem.clone(), cfg).ok();
    let mut buf = Vec::new();
    let mut held = None;
    let mut scratch = vec![0u8; max_record as usize + 8];
    let payload = vec![0xa5u8; max_record as usize + 8];
    for action in input.actions.into_iter().take(256) {
        match action {
            Action::Pop => match {
                held = None;
                c.pop(&mut buf)
            } {
                Ok(Some(r)) => {
                    assert!((1..=max_kind).contains(&r.kind));
                    assert!(r.len <= max_record as usize);
                    assert_eq!(buf.len(), r.len);
                }
                Ok(None) => {}
                Err(e) => {
                    assert!(buf.is_empty());
                    assert_eq!(c.pop(&mut buf), Err(e));
                }
            },
            Action::Peek => match c.peek() {
                Ok(Some(r)) => {
                    assert!((1..=max_kind).contains(&r.kind));
                    assert!(r.len <= max_record as usize);
                    assert!(held.is_none_or(|h| h == r), "a held record never changes");
                    held = Some(r);
                }
                Ok(None) => assert!(held.is_none()),
                Err(e) => {
                    held = None;
                    assert_eq!(c.peek(), Err(e));
                }
            },
            Action::Read { at, len } => {
                let (at, len) = (usize::from(at), usize::from(len).min(scratch.len()));
                let r = c.read(at, &mut scratch[..len]);
                match held {
                    Some(h) if at + len <= h.len => assert!(r.is_ok()),
                    _ => assert!(r.is_err()),
                }
            }
            Action::Consume => {
                if c.consume().is_err() {
                    assert!(c.peek().is_err());
                }
                held = None;
            }
            Action::PrepareSleep => {
                let _ = c.prepare_sleep();
            }
            Action::Wake => c.wake(),
            Action::Push { kind, len } => {
                if let Some(p) = p.as_mut() {
                    let len = usize::from(len).min(payload.len());
                    let _ = p.push(u32::from(kind % 5), &[&payload[..len]]);
                }
            }
            Action::Publish => {
                if let Some(p) = p.as_mut() {
                    let _ = p.publish();
                }
            }
            Action::Scribble { off, bytes } => {
                let _ = mem.write(usize::from(off), &bytes);
            }
            Action::Word { which, value } => {
                let off = [64, 128, 132, 0, 8][usize::from(which % 5)];
                mem.store_u32(off, value).unwrap();
            }
        }
        assert!(buf.capacity() <= max_record as usize);
    }
});
