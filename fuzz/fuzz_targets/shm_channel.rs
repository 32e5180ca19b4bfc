//! A shared-memory channel's receive side against a rogue peer: operation records of
//! arbitrary bytes pushed into its ring, and arbitrary scribbles over the ring between
//! polls. Never panics, and every placed write lies inside one granted element of the
//! writer's own pool (another domain's elements stay granted, nothing stays in flight).
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::shm::{heap_pair, ring_config, Producer, SharedMem, KIND_OP};
use splitnet_messaging::adapter::{Channel, RxCompletion};
use splitnet_messaging::memory::{Access, DomainId, RegionSpec, Registry};

#[derive(Debug, Arbitrary)]
enum Action {
    /// A record of these bytes (an operation header and payload, or garbage).
    Record(Vec<u8>),
    /// A well-formed write header for element `element` of the pool, with `len` bytes.
    Write {
        element: u8,
        len: u16,
        other: bool,
    },
    Scribble {
        off: u16,
        bytes: Vec<u8>,
    },
    Poll,
}

fuzz_target!(|actions: Vec<Action>| {
    let cfg = ring_config(16 << 10, 4096).unwrap();
    let mut reg = Registry::new(1 << 20);
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
    for act in actions.into_iter().take(64) {
        match act {
            Action::Record(bytes) => {
                let _ = rogue.push(KIND_OP, &[&bytes]);
            }
            Action::Write {
                element,
                len,
                other: o,
            } => {
                let h = if o { other } else { mine };
                let addr = Registry::base_address(h) + 256 * u64::from(element % 5);
                let len = usize::from(len % 600);
                let mut rec = [0u8; 32];
                rec[0] = 3;
                rec[4..8].copy_from_slice(&(len as u32).to_be_bytes());
                rec[8..16].copy_from_slice(&h.to_u64().to_be_bytes());
                rec[16..24].copy_from_slice(&addr.to_be_bytes());
                let _ = rogue.push(KIND_OP, &[&rec, &vec![7; len]]);
            }
            Action::Scribble { off, bytes } => {
                let off = usize::from(off) % ring.len();
                let n = bytes.len().min(ring.len() - off) & !3;
                let _ = ring.write(off & !3, &bytes[..n]);
            }
            Action::Poll => loop {
                match b.poll_recv(&mut reg) {
                    Ok(Some(RxCompletion::Write { handle, len, .. })) => {
                        assert_eq!(handle, mine);
                        assert!(len <= 256);
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
