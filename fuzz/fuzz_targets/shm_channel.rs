//! A shared-memory channel's receive side against a rogue peer: operation records (carried
//! or placed, of arbitrary bytes) pushed into its ring, and arbitrary scribbles over the
//! ring and the pool arena between polls, with the writer's pool in private memory or in a
//! shared arena. Never panics, and every write taken lies inside one granted element of the
//! writer's own pool (another domain's elements stay granted, nothing stays in flight).
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::shm::{heap_pair, ring_config, Producer, KIND_OP, KIND_PLACED};
use splitnet_messaging::adapter::{Channel, RxCompletion};
use splitnet_messaging::memory::{
    Access, DomainId, HeapShared, RegionSpec, Registry, SharedMem,
};

#[derive(Debug, Arbitrary)]
struct Input {
    /// The writer's pool lies in a shared arena.
    shared: bool,
    actions: Vec<Action>,
}

#[derive(Debug, Arbitrary)]
enum Action {
    /// A record of these bytes (an operation header and payload, or garbage).
    Record { placed: bool, bytes: Vec<u8> },
    /// A well-formed write header for element `element` of the pool, with `len` bytes
    /// carried behind it, or none (placed).
    Write {
        element: u8,
        len: u16,
        other: bool,
        placed: bool,
    },
    Scribble {
        off: u16,
        bytes: Vec<u8>,
    },
    Poll,
}

fuzz_target!(|input: Input| {
    let cfg = ring_config(16 << 10, 4096).unwrap();
    let mut reg = Registry::new(1 << 20);
    let arena = HeapShared::new(4096);
    if input.shared {
        reg.attach_arena(DomainId(1), std::sync::Arc::new(arena.clone())).unwrap();
    }
    let spec = |domain| RegionSpec {
        domain: DomainId(domain),
        access: Access::REMOTE_WRITE,
        element_size: 256,
        element_count: 4,
        single_use: false,
    };
    let mine = reg.register(spec(1)).unwrap();
    let other = reg.register(spec(2)).unwrap();
    for e in 0..4 {
        reg.grant(mine, e).unwrap();
        reg.grant(other, e).unwrap();
    }
    let (a, mut b) = heap_pair(cfg, (DomainId(2), DomainId(1)), 1024).unwrap();
    let ring = a.tx_memory().clone();
    let mut rogue = Producer::attach(ring.clone(), cfg).unwrap();
    let kind = |placed| if placed { KIND_PLACED } else { KIND_OP };
    for act in input.actions.into_iter().take(64) {
        match act {
            Action::Record { placed, bytes } => {
                let _ = rogue.push(kind(placed), &[&bytes]);
            }
            Action::Write {
                element,
                len,
                other: o,
                placed,
            } => {
                let h = if o { other } else { mine };
                let addr = reg.address(h).unwrap() + 256 * u64::from(element % 5);
                let len = usize::from(len % 600);
                let mut rec = [0u8; 32];
                rec[0] = 3;
                rec[4..8].copy_from_slice(&(len as u32).to_be_bytes());
                rec[8..16].copy_from_slice(&h.to_u64().to_be_bytes());
                rec[16..24].copy_from_slice(&addr.to_be_bytes());
                let carried = if placed { 0 } else { len };
                let _ = rogue.push(kind(placed), &[&rec, &vec![7; carried]]);
            }
            Action::Scribble { off, bytes } => {
                // Over the ring, or (odd offsets) over the pool arena.
                let mem: &HeapShared = if off % 2 == 1 { &arena } else { &ring };
                let off = usize::from(off) % mem.len();
                let n = bytes.len().min(mem.len() - off) & !3;
                let _ = mem.write(off & !3, &bytes[..n]);
            }
            Action::Poll => loop {
                match b.poll_recv(&mut reg) {
                    Ok(Some(RxCompletion::Write {
                        handle,
                        element,
                        len,
                        ..
                    })) => {
                        assert_eq!(handle, mine);
                        assert!(len <= 256);
                        let f = reg.frame(handle, element, len).unwrap();
                        assert_eq!(f.len(), len as usize);
                    }
                    Ok(Some(RxCompletion::Recv { len })) => assert!(len <= 1024),
                    Ok(None) | Err(_) => break,
                }
            },
        }
    }
    b.close(&mut reg);
    for e in 0..4 {
        assert!(
            reg.is_granted(other, e),
            "another domain's element was consumed"
        );
    }
    assert_eq!(reg.in_flight(mine).unwrap(), 0);
});
