//! The receive side of a channel fed arbitrary bytes in arbitrary chunks: never panics, and
//! every placed write lies inside one granted element of the writer's own pool.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::{RxCompletion, RxStream};
use splitnet_messaging::memory::{Access, DomainId, RegionSpec, Registry};

fuzz_target!(|input: (Vec<u8>, Vec<u8>)| {
    let (bytes, cuts) = input;
    let mut reg = Registry::new(1 << 20);
    let mine = reg
        .register(RegionSpec {
            domain: DomainId(1),
            access: Access::REMOTE_WRITE,
            element_size: 256,
            element_count: 4,
            single_use: false,
        })
        .unwrap();
    let other = reg
        .register(RegionSpec {
            domain: DomainId(2),
            access: Access::REMOTE_WRITE,
            element_size: 256,
            element_count: 4,
            single_use: false,
        })
        .unwrap();
    for e in 0..4 {
        reg.grant(mine, e).unwrap();
        reg.grant(other, e).unwrap();
    }
    let mut rx = RxStream::new(DomainId(1), 1024);
    let mut pos = 0;
    let mut cut = cuts.iter().cycle();
    'feed: while pos < bytes.len() {
        loop {
            match rx.poll_staged(&mut reg) {
                Ok(Some(RxCompletion::Write { handle, len, .. })) => {
                    assert_eq!(handle, mine);
                    assert!(len <= 256);
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
        let want = usize::from(*cut.next().unwrap_or(&255)).max(1);
        // One vectored read: the current payload first, then the read-ahead.
        let (payload, ahead) = rx.buffers(&mut reg);
        let n = want.min(payload.len() + ahead.len()).min(bytes.len() - pos);
        let a = n.min(payload.len());
        payload[..a].copy_from_slice(&bytes[pos..pos + a]);
        ahead[..n - a].copy_from_slice(&bytes[pos + a..pos + n]);
        pos += n;
        match rx.advance(n, &mut reg) {
            Ok(Some(RxCompletion::Write { handle, len, .. })) => {
                assert_eq!(handle, mine);
                assert!(len <= 256);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    rx.abort(&mut reg);
    for e in 0..4 {
        assert!(
            reg.is_granted(other, e),
            "another domain's element was consumed"
        );
    }
    assert_eq!(reg.in_flight(mine).unwrap(), 0);
});
