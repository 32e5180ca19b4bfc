//! The shared-memory set-up over a Unix socket pair: a host's offer and the IOC's
//! acceptance agree and carry operations; every kind of bad set-up a rogue host can send
//! is refused with an error (never a panic, never a mapping of what was not checked).

use splitnet_messaging::adapter::shm::setup::{Setup, MAX_PAYLOAD, RING_DATA};
use splitnet_messaging::adapter::{Channel, Op, Payload, RxCompletion};
use splitnet_messaging::fabric::shm::{accept, offer, ShmTransport};
use splitnet_messaging::fabric::FabricError;
use splitnet_messaging::memory::{DomainId, Registry};
use splitnet_messaging::sys::eventfd::EventFd;
use splitnet_messaging::sys::shm::{send_fds, Memfd};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_millis(300);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (a, b)
}

/// What the IOC's side makes of `send` done by a rogue host on its end of a socket pair.
fn ioc_sees(send: impl FnOnce(&UnixStream)) -> Result<ShmTransport, FabricError> {
    let (host, ioc) = pair();
    send(&host);
    rt().block_on(accept(ioc, DomainId(1), MAX_PAYLOAD as usize, TIMEOUT))
}

fn good_setup() -> [u8; 16] {
    Setup {
        data_size: RING_DATA,
        max_payload: MAX_PAYLOAD,
    }
    .emit()
}

fn ring_len() -> usize {
    Setup {
        data_size: RING_DATA,
        max_payload: MAX_PAYLOAD,
    }
    .ring()
    .unwrap()
    .region_len()
}

fn shm_error(r: Result<ShmTransport, FabricError>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn offer_and_accept_agree_and_carry_operations() {
    let (host, ioc) = pair();
    let rt = rt();
    let (h, i) = rt.block_on(async {
        tokio::join!(
            offer(host, DomainId(1), 4096, TIMEOUT),
            accept(ioc, DomainId(1), 4096, TIMEOUT)
        )
    });
    let (mut h, mut i) = (h.unwrap(), i.unwrap());
    h.post(
        Op::Send,
        &[],
        Payload::Bytes(b"hello over shared memory".to_vec()),
    );
    assert!(h.flush().unwrap());
    let mut reg = Registry::new(0);
    assert!(matches!(
        i.poll_recv(&mut reg).unwrap(),
        Some(RxCompletion::Recv { len: 24 })
    ));
    assert_eq!(i.received(), b"hello over shared memory");
    // The IOC armed its doorbell; the host's next publication rings it.
    assert_eq!(i.poll_recv(&mut reg).unwrap(), None);
    assert!(!i.input_pending());
    assert!(!h.take_rang_peer(), "the IOC was awake");
    assert!(i.prepare_sleep());
    h.post(Op::Send, &[], Payload::Bytes(b"2".to_vec()));
    assert!(h.flush().unwrap());
    assert!(h.take_rang_peer(), "the host woke the IOC");
    assert!(!h.take_rang_peer(), "said once");
    assert!(i.input_pending(), "seen without the doorbell");
    assert_eq!(i.bell().drain().unwrap(), 1, "rung once");
    assert!(i.poll_recv(&mut reg).unwrap().is_some());
    assert!(!i.input_pending());
}

#[test]
fn a_rogue_hosts_set_ups_are_refused() {
    let len = ring_len();
    let sealed = || Memfd::create(c"test-ring", len).unwrap();
    let bell = EventFd::new().unwrap();
    let send = |s: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]| {
        send_fds(s, data, fds).unwrap();
    };
    // Nothing at all: the IOC gives up after its timeout.
    assert!(shm_error(ioc_sees(|_| {})).contains("no answer"));
    // Bad bytes.
    let (a, b) = (sealed(), sealed());
    let mut bad = good_setup();
    bad[0] = b'X';
    let e = shm_error(ioc_sees(|s| {
        send(s, &bad, &[a.as_fd(), b.as_fd(), bell.as_fd()])
    }));
    assert!(e.contains("not a shared-memory set-up"), "{e}");
    // Too few descriptors.
    let e = shm_error(ioc_sees(|s| send(s, &good_setup(), &[a.as_fd()])));
    assert!(e.contains("three descriptors"), "{e}");
    // A ring of the wrong size.
    let small = Memfd::create(c"small", len / 2).unwrap();
    let e = shm_error(ioc_sees(|s| {
        send(s, &good_setup(), &[small.as_fd(), b.as_fd(), bell.as_fd()])
    }));
    assert!(e.contains(&format!("bytes, expected {len}")), "{e}");
    // Not sealed: the host could shrink it under the IOC's mapping.
    // SAFETY: plain syscalls creating and sizing a file this test owns.
    let unsealed = unsafe {
        let fd = libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
    };
    let e = shm_error(ioc_sees(|s| {
        send(
            s,
            &good_setup(),
            &[unsealed.as_fd(), b.as_fd(), bell.as_fd()],
        )
    }));
    assert!(e.contains("not sealed against resizing"), "{e}");
    // Sealed and sized, but never initialised as a ring.
    let e = shm_error(ioc_sees(|s| {
        send(s, &good_setup(), &[a.as_fd(), b.as_fd(), bell.as_fd()])
    }));
    assert!(e.contains("magic"), "{e}");
}
