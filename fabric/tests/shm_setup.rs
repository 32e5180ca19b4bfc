//! The shared-memory set-up over a Unix socket pair: a host's offer and the IOC's
//! acceptance agree and carry operations; every kind of bad set-up a rogue host can send
//! is refused with an error (never a panic, never a mapping of what was not checked).

use splitnet_fabric::shm::memfd::{send_fds, Memfd};
use splitnet_fabric::shm::{accept, offer, PoolArena, ShmTransport};
use splitnet_fabric::FabricError;
use splitnet_messaging::adapter::shm::setup::{
    Setup, MAX_PAYLOAD, POOL_RANGE, RING_DATA, SETUP_LEN,
};
use splitnet_messaging::adapter::{Channel, Op, Payload, RxCompletion};
use splitnet_messaging::memory::{
    Access, DomainId, Frame, Handle, RegionSpec, Registry, SharedRegion,
};
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
    rt().block_on(accept(
        ioc,
        DomainId(1),
        MAX_PAYLOAD as usize,
        Some(arena()),
        TIMEOUT,
    ))
}

const POOLS: u64 = POOL_RANGE.0;

/// The IOC's pool arena for the host.
fn arena() -> PoolArena {
    PoolArena::new(c"test-ioc-pools", POOLS).unwrap()
}

fn good_setup() -> [u8; SETUP_LEN] {
    Setup {
        data_size: RING_DATA,
        max_payload: MAX_PAYLOAD,
        pool_size: POOLS,
    }
    .emit()
}

fn ring_len() -> usize {
    Setup {
        data_size: RING_DATA,
        max_payload: MAX_PAYLOAD,
        pool_size: POOLS,
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

/// A registry laying domain 1's pools out in `arena`, and a pool of `count` 2 KiB elements.
fn pool_in(arena: SharedRegion, count: u32) -> (Registry, Handle) {
    let mut reg = Registry::new(1 << 20);
    reg.attach_arena(DomainId(1), arena).unwrap();
    let pool = reg
        .register(RegionSpec {
            domain: DomainId(1),
            access: Access::REMOTE_WRITE,
            element_size: 2048,
            element_count: count,
            single_use: false,
        })
        .unwrap();
    (reg, pool)
}

/// A host's offer (`host_pools`: a data channel's receive pools, `None`: a control channel)
/// against the IOC's acceptance (with its pool arena when `ioc_arena`) on a new socket pair.
fn set_up(
    host_pools: Option<u64>,
    ioc_arena: bool,
) -> (
    Result<ShmTransport, FabricError>,
    Result<ShmTransport, FabricError>,
) {
    let (host, ioc) = pair();
    rt().block_on(async {
        tokio::join!(
            offer(host, DomainId(1), 4096, host_pools, TIMEOUT),
            accept(ioc, DomainId(1), 4096, ioc_arena.then(arena), TIMEOUT)
        )
    })
}

/// `h` sends `msg`; `i` receives exactly it, as one SEND.
fn carries(h: &mut ShmTransport, i: &mut ShmTransport, msg: &[u8]) {
    h.post(Op::Send, &[], Payload::Bytes(msg.to_vec()));
    assert!(h.flush().unwrap());
    let mut reg = Registry::new(0);
    assert_eq!(
        i.poll_recv(&mut reg).unwrap(),
        Some(RxCompletion::Recv { len: msg.len() })
    );
    assert_eq!(i.received(), msg);
}

#[test]
fn offer_and_accept_agree_and_carry_operations() {
    let (h, i) = set_up(Some(64 << 10), true);
    let (mut h, mut i) = (h.unwrap(), i.unwrap());
    carries(&mut h, &mut i, b"hello over shared memory");
    let mut reg = Registry::new(0);
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
    // The IOC places a write straight into the host's pool, laid out in the host's arena.
    let (mut host_reg, pool) = pool_in(h.pools().expect("the host has a pool arena"), 4);
    host_reg.grant(pool, 2).unwrap();
    let addr = host_reg.address(pool).unwrap() + 2 * 2048;
    let op = Op::WriteImm {
        handle: pool.to_u64(),
        addr,
        imm: 7,
    };
    i.post(op, &[], Payload::Bytes(vec![0xab; 1500]));
    assert!(i.flush().unwrap());
    let got = h.poll_recv(&mut host_reg).unwrap();
    assert!(
        matches!(
            got,
            Some(RxCompletion::Write {
                element: 2,
                len: 1500,
                imm: Some(7),
                ..
            })
        ),
        "{got:?}"
    );
    let Ok(Frame::Shared(bytes)) = host_reg.frame(pool, 2, 1500) else {
        panic!("the frame is in the shared pool");
    };
    let mut copy = vec![0; 1500];
    bytes.copy_out(0, &mut copy).unwrap();
    assert!(copy.iter().all(|&b| b == 0xab));
    // And the host places its writes into the IOC's pool for it, in the IOC's arena.
    let (mut ioc_reg, pool) = pool_in(i.pools().expect("the IOC has a pool arena"), 2);
    ioc_reg.grant(pool, 1).unwrap();
    let op = Op::Write {
        handle: pool.to_u64(),
        addr: ioc_reg.address(pool).unwrap() + 2048,
    };
    h.post(op, &[1, 2], Payload::Bytes(vec![0xcd; 998]));
    assert!(h.flush().unwrap());
    let got = i.poll_recv(&mut ioc_reg).unwrap();
    assert!(
        matches!(
            got,
            Some(RxCompletion::Write {
                element: 1,
                len: 1000,
                imm: None,
                ..
            })
        ),
        "{got:?}"
    );
    let mut copy = Vec::new();
    ioc_reg.frame(pool, 1, 1000).unwrap().copy_to(&mut copy);
    assert_eq!(&copy[..2], &[1, 2]);
    assert!(copy[2..].iter().all(|&b| b == 0xcd));
}

/// A host that never reads its doorbell: the IOC rings it as often as the host asks and never
/// waits (a ring finds the host's end full and counts as rung), and the host's records still
/// arrive.
#[test]
fn a_host_that_never_reads_its_doorbell_cannot_block_the_ioc() {
    let (h, i) = set_up(None, false);
    let (mut h, mut i) = (h.unwrap(), i.unwrap());
    let mut reg = Registry::new(0);
    let mut rang = 0;
    for n in 0..20_000u32 {
        // The host asks to be woken each time, and never reads its doorbell.
        assert!(h.prepare_sleep());
        carries(&mut i, &mut h, &n.to_be_bytes());
        rang += usize::from(i.take_rang_peer());
        assert_eq!(h.poll_recv(&mut reg).unwrap(), None);
    }
    assert_eq!(rang, 20_000, "every request was answered with a ring");
    carries(&mut h, &mut i, b"still served");
}

/// The peer's end of stream is said once everything it published has been read: a Goodbye
/// in the ring is never lost to its close.
#[test]
fn a_peer_that_leaves_is_seen_after_its_last_records() {
    let (h, i) = set_up(None, false);
    let (mut h, mut i) = (h.unwrap(), i.unwrap());
    let mut reg = Registry::new(0);
    assert_eq!(i.poll_recv(&mut reg).unwrap(), None);
    assert!(i.prepare_sleep());
    h.post(Op::Send, &[], Payload::Bytes(b"goodbye".to_vec()));
    assert!(h.flush().unwrap());
    drop(h);
    i.wake();
    assert_eq!(
        i.poll_recv(&mut reg).unwrap(),
        Some(RxCompletion::Recv { len: 7 })
    );
    assert_eq!(i.received(), b"goodbye");
    // Its end of stream keeps the doorbell readable: the next wake-up reads it.
    assert!(i.bell().is_readable().unwrap());
    i.wake();
    let e = i.poll_recv(&mut reg).unwrap_err();
    assert!(e.to_string().contains("closed by peer"), "{e}");
}

#[test]
fn a_rogue_hosts_set_ups_are_refused() {
    let len = ring_len();
    let sealed = || Memfd::create(c"test-ring", len).unwrap();
    let pools = Memfd::create(c"test-pools", POOLS as usize).unwrap();
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
        send(s, &bad, &[a.as_fd(), b.as_fd(), pools.as_fd()])
    }));
    assert!(e.contains("not a shared-memory set-up"), "{e}");
    // Too few descriptors.
    let e = shm_error(ioc_sees(|s| {
        send(s, &good_setup(), &[a.as_fd(), b.as_fd()])
    }));
    assert!(e.contains("needs 3 descriptors"), "{e}");
    // A descriptor more (version 2's doorbell, here a pipe the host never reads): refused,
    // never written to.
    let (pipe_rx, pipe_tx) = std::io::pipe().unwrap();
    let e = shm_error(ioc_sees(|s| {
        send(
            s,
            &good_setup(),
            &[a.as_fd(), b.as_fd(), pipe_tx.as_fd(), pools.as_fd()],
        )
    }));
    assert!(e.contains("4 descriptors received, at most 3"), "{e}");
    drop((pipe_rx, pipe_tx));
    // Version 2's set-up: refused by its version.
    let mut v2 = good_setup();
    v2[4..6].copy_from_slice(&2u16.to_be_bytes());
    let e = shm_error(ioc_sees(|s| {
        send(s, &v2, &[a.as_fd(), b.as_fd(), pools.as_fd()])
    }));
    assert!(e.contains("set-up version 2"), "{e}");
    // A ring of the wrong size.
    let small = Memfd::create(c"small", len / 2).unwrap();
    let e = shm_error(ioc_sees(|s| {
        send(s, &good_setup(), &[small.as_fd(), b.as_fd(), pools.as_fd()])
    }));
    assert!(e.contains(&format!("bytes, expected {len}")), "{e}");
    // A pool arena larger than the IOC's own for the host: the IOC's writes into it would
    // be charged to the IOC beyond its budget for a session.
    let mut big = good_setup();
    big[16..20].copy_from_slice(&((2 * POOLS / 4096) as u32).to_be_bytes());
    let e = shm_error(ioc_sees(|s| {
        send(s, &big, &[a.as_fd(), b.as_fd(), pools.as_fd()])
    }));
    assert!(
        e.contains(&format!(
            "{} bytes is larger than the IOC's for it ({POOLS} bytes",
            2 * POOLS
        )),
        "{e}"
    );
    // A pool arena of another size than the set-up says.
    let e = shm_error(ioc_sees(|s| {
        send(s, &good_setup(), &[a.as_fd(), b.as_fd(), small.as_fd()])
    }));
    assert!(e.contains(&format!("expected {POOLS}")), "{e}");
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
            &[unsealed.as_fd(), b.as_fd(), pools.as_fd()],
        )
    }));
    assert!(e.contains("not sealed against resizing"), "{e}");
    // Sealed and sized, but never initialised as a ring.
    let e = shm_error(ioc_sees(|s| {
        send(s, &good_setup(), &[a.as_fd(), b.as_fd(), pools.as_fd()])
    }));
    assert!(e.contains("magic"), "{e}");
}

#[test]
fn a_control_channel_is_set_up_without_a_pool_arena_and_refused_with_one() {
    let rt = rt();
    // Agreed: smaller rings, no arena either way, messages carried.
    let (h, i) = set_up(None, false);
    let (mut h, mut i) = (h.unwrap(), i.unwrap());
    assert!(h.pools().is_none() && i.pools().is_none());
    assert!(!h.places_writes() && !i.places_writes());
    carries(&mut h, &mut i, b"credits");
    // A data channel's set-up (with its arena) where a control channel is expected, and
    // the other way round: refused.
    let (h, i) = set_up(Some(64 << 10), false);
    assert!(h.is_err());
    let e = shm_error(i);
    assert!(e.contains("descriptors"), "{e}");
    let (h, i) = set_up(None, true);
    assert!(h.is_err());
    assert!(shm_error(i).contains("needs 3 descriptors"));
    // Two descriptors but a set-up that names an arena.
    let (host, ioc) = pair();
    let (a, b) = (
        Memfd::create(c"a", ring_len()).unwrap(),
        Memfd::create(c"b", ring_len()).unwrap(),
    );
    send_fds(&host, &good_setup(), &[a.as_fd(), b.as_fd()]).unwrap();
    let e = shm_error(rt.block_on(accept(ioc, DomainId(1), 4096, None, TIMEOUT)));
    assert!(e.contains("has no pool arena"), "{e}");
    // A control channel with a data channel's larger rings: refused.
    let (host, ioc) = pair();
    let large = Setup {
        data_size: RING_DATA,
        max_payload: MAX_PAYLOAD,
        pool_size: 0,
    };
    send_fds(&host, &large.emit(), &[a.as_fd(), b.as_fd()]).unwrap();
    let e = shm_error(rt.block_on(accept(ioc, DomainId(1), 4096, None, TIMEOUT)));
    assert!(
        e.contains("control channel's rings are 262144 bytes"),
        "{e}"
    );
}
