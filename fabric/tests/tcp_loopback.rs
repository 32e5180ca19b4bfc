//! Two endpoints over real TCP on loopback push 100,000 frames of random sizes each way at
//! once: every byte exact, none lost, every credit back at the end. The same over a Unix
//! socket, shared memory and (ignored unless run where an RDMA device holds the address in
//! `SPLITNET_VERBS_ADDR`: tests/e2e/50-rdma-vms.sh runs it in a VM) RDMA verbs.

use splitnet_fabric::{self as fabric, DataPath, RegisteredLink};
use splitnet_messaging::endpoint::{Lane, LinkEvent, Posted, Session};
use splitnet_messaging::memory::{DomainId, Registry, SendBuf, SendBufCache};
use splitnet_messaging::testing::config;
use splitnet_messaging::wire::{self, ErrorCode, MAX_MESSAGE_LEN};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const FRAMES: u64 = 100_000;
const TIMEOUT: Duration = Duration::from_secs(5);
/// Longer than any wait of a working exchange: the test fails instead of hanging.
const STALL: Duration = Duration::from_secs(10);

/// Deterministic frame `seq` of a direction: a length (log-uniform 60..=65535, every 997th
/// frame 65,536..=65,600 so it must take the BufferRDMAIndicate path) and a byte pattern.
fn frame_len(dir: u64, seq: u64) -> usize {
    let mut x = (seq + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ dir;
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    if seq.is_multiple_of(997) {
        return 65_536 + (x % 65) as usize;
    }
    let u = (x % 1_000_000) as f64 / 1_000_000.0;
    (60.0 * (65_535.0f64 / 60.0).powf(u)) as usize
}

fn fill(dir: u64, seq: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&seq.to_le_bytes());
    for (j, b) in out[8..].iter_mut().enumerate() {
        *b = (seq.wrapping_mul(31) ^ dir).wrapping_add(j as u64) as u8;
    }
}

fn check(dir: u64, expect_seq: u64, frame: &[u8]) {
    let len = frame_len(dir, expect_seq);
    assert_eq!(frame.len(), len, "frame {expect_seq} length");
    let mut want = vec![0u8; len];
    fill(dir, expect_seq, &mut want);
    assert!(frame == want.as_slice(), "frame {expect_seq} bytes differ");
}

struct Side {
    tl: RegisteredLink,
    /// Frames each way.
    frames: u64,
    reg: Registry,
    cache: SendBufCache,
    dir_out: u64,
    dir_in: u64,
    sent: u64,
    received: u64,
    held: Option<SendBuf>,
    /// This side has sent and received everything.
    finished: bool,
    /// How many sides have.
    both: Arc<AtomicUsize>,
}

impl Side {
    fn next_frame(&mut self) -> Option<SendBuf> {
        if let Some(b) = self.held.take() {
            return Some(b);
        }
        if self.sent == self.frames {
            return None;
        }
        let mut b = self.cache.get()?;
        let len = frame_len(self.dir_out, self.sent);
        fill(self.dir_out, self.sent, &mut b.space()[..len]);
        b.set_len(len);
        Some(b)
    }

    fn done(&self) -> bool {
        self.sent == self.frames
            && self.received == self.frames
            && self.tl.link.session().initiator().in_use() == 0
            && self.tl.link.pending() == 0
    }

    /// Posts, drives and verifies until both directions are complete.
    async fn run(mut self) -> Side {
        let mut events = Vec::new();
        loop {
            while let Some(b) = self.next_frame() {
                match self.tl.link.post_frame(b) {
                    Posted::SendData | Posted::Rdma => self.sent += 1,
                    Posted::Backpressure(b) => {
                        self.held = Some(b);
                        break;
                    }
                    Posted::TooLarge(_) => panic!("frame {} too large", self.sent),
                }
            }
            self.tl.link.flush().expect("flush");
            self.tl.link.reclaim(&mut self.cache);
            // Done once both sides are: a side that stopped reading early could leave the
            // other's last credit updates unsent (a Unix socket buffers little).
            if self.done() && !self.finished {
                self.finished = true;
                self.both.fetch_add(1, Ordering::SeqCst);
            }
            if self.both.load(Ordering::SeqCst) == 2 {
                return self;
            }
            let RegisteredLink { ready, link } = &mut self.tl;
            let pending = link.pending() > 0;
            // Shared memory: ask for the doorbell first; records may be there already.
            let sleep = link.prepare_sleep(Lane::Data);
            let sleep_ctrl = link.prepare_sleep(Lane::Control);
            let (lane, guard) = tokio::select! {
                r = ready.input([sleep_ctrl, sleep]) => {
                    let (lane, g) = r.unwrap();
                    (Some(lane), g)
                }
                g = ready.data.writable(), if pending && ready.writable(Lane::Data) => (None, Some(g.unwrap())),
                g = ready.ctrl.writable(), if pending && ready.writable(Lane::Control) => (None, Some(g.unwrap())),
                // Finished: look again soon whether the other side is too.
                _ = tokio::time::sleep(Duration::from_millis(5)), if self.finished => (None, None),
                _ = tokio::time::sleep(STALL) => panic!(
                    "side {} stalled: sent {}, received {}, credits in use {}, pending {} (ctrl {}), data sleep {sleep}",
                    self.dir_out, self.sent, self.received,
                    link.session().initiator().in_use(), link.pending(),
                    link.pending_on(Lane::Control),
                ),
            };
            link.wake(Lane::Control);
            link.wake(Lane::Data);
            let Some(lane) = lane else {
                if guard.is_none() {
                    continue;
                }
                if !link.flush().expect("flush") {
                    if let Some(mut g) = guard {
                        g.clear_ready();
                    }
                }
                continue;
            };
            let (dir_in, received) = (self.dir_in, &mut self.received);
            let mut copy = Vec::new();
            let more = link.poll(
                &mut self.reg,
                lane,
                256,
                &mut |f| {
                    f.copy_to(&mut copy);
                    check(dir_in, *received, &copy);
                    *received += 1;
                },
                &mut events,
            );
            match more {
                Ok(true) => {}
                Ok(false) => {
                    if let Some(mut g) = guard {
                        g.clear_ready()
                    }
                }
                Err(e) => {
                    // The peer may close once it has everything; then so must we.
                    if self.received == self.frames && self.sent == self.frames {
                        continue;
                    }
                    panic!("link failed: {e}");
                }
            }
            for e in events.drain(..) {
                assert!(!matches!(e, LinkEvent::Goodbye(_)), "unexpected goodbye");
            }
            link.session_mut().flush_credits(&mut self.reg);
        }
    }
}

fn side(
    tl: RegisteredLink,
    reg: Registry,
    dir_out: u64,
    frames: u64,
    both: Arc<AtomicUsize>,
) -> Side {
    Side {
        tl,
        frames,
        reg,
        cache: SendBufCache::new(66_000, 512),
        dir_out,
        dir_in: 1 - dir_out,
        sent: 0,
        received: 0,
        held: None,
        finished: false,
        both,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A listening socket of either transport.
enum Listener {
    Tcp(TcpListener),
    Unix(std::os::unix::net::UnixListener, std::path::PathBuf),
}

impl Listener {
    fn accept(&self) -> fabric::Stream {
        match self {
            Listener::Tcp(l) => l.accept().unwrap().0.into(),
            Listener::Unix(l, _) => l.accept().unwrap().0.into(),
        }
    }
}

#[test]
fn hundred_thousand_frames_each_way_over_tcp() {
    exchange(
        Listener::Tcp(TcpListener::bind("127.0.0.1:0").unwrap()),
        DataPath::Stream,
        Auth::Keys,
    );
}

#[test]
fn hundred_thousand_frames_each_way_over_tcp_with_the_data_channel_sealed() {
    exchange(
        Listener::Tcp(TcpListener::bind("127.0.0.1:0").unwrap()),
        DataPath::Stream,
        Auth::SealedData,
    );
}

/// How a test's session authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// Plain handshakes.
    None,
    /// Authenticated handshakes: the control channel on its socket sealed.
    Keys,
    /// And the host asks for its data channel sealed too.
    SealedData,
}

/// A Unix socket for a test named `name`, in a directory of its own.
fn unix_listener(name: &str) -> (Listener, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("splitnet-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fabric.sock");
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    (Listener::Unix(l, path), dir)
}

#[test]
fn hundred_thousand_frames_each_way_over_a_unix_socket() {
    let (l, dir) = unix_listener("unix");
    exchange(l, DataPath::Stream, Auth::None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hundred_thousand_frames_each_way_over_shared_memory() {
    let (l, dir) = unix_listener("shm");
    exchange(
        l,
        DataPath::Shm {
            pool_bytes: 16 << 20,
        },
        Auth::Keys,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both sides of a session over `listener`'s transport, the data channel over `path`, move
/// [`FRAMES`] frames each way, authenticated as `auth` says.
fn exchange(listener: Listener, path_kind: DataPath, auth: Auth) {
    exchange_frames(listener, path_kind, auth, FRAMES)
}

/// [`exchange`] of `frames` frames each way.
fn exchange_frames(listener: Listener, path_kind: DataPath, auth: Auth, frames: u64) {
    let ioc_key = fabric::auth::generate().unwrap();
    let keys = (auth != Auth::None).then(|| fabric::HostKeys {
        private: fabric::auth::generate().unwrap(),
        ioc: fabric::auth::public_key(&ioc_key),
        seal_data: auth == Auth::SealedData,
        flags: 0,
    });
    let host_public = keys.as_ref().map(|k| fabric::auth::public_key(&k.private));
    let tcp = match &listener {
        Listener::Tcp(l) => Some(l.local_addr().unwrap()),
        Listener::Unix(..) => None,
    };
    let path = match &listener {
        Listener::Unix(_, p) => Some(p.clone()),
        Listener::Tcp(_) => None,
    };
    let both_a = Arc::new(AtomicUsize::new(0));
    let both_b = both_a.clone();
    // Both sides advertise enough large elements that idata and BufferRDMAIndicate both occur.
    let server = std::thread::spawn(move || {
        rt().block_on(async {
            let c = listener.accept();
            let a = fabric::accept_hello(c, TIMEOUT, Some(&ioc_key))
                .await
                .unwrap();
            let (mut c, hello, v, mut proof) = (a.ch, a.hello, a.version, a.auth);
            assert_eq!(proof.as_ref().map(|r| r.peer), host_public);
            assert_eq!(hello.session, 0);
            fabric::post_reply(&mut c, proof.as_deref_mut(), v, ErrorCode::Ok, 1).unwrap();
            fabric::flush(&mut c, TIMEOUT).await.unwrap();
            // Over shared memory the control channel is in rings of its own too.
            let c: fabric::FabricChannel = match path_kind {
                DataPath::Verbs { .. } => {
                    // On a queue pair of its own, sealed after an authenticated handshake.
                    assert_eq!(hello.channel, fabric::verbs::VERBS_CONTROL_CHANNEL);
                    let sealer = proof.map(|r| r.into_sealer().unwrap());
                    let (sock, unread) = c.into_parts();
                    let t = fabric::verbs::accept(sock, unread, DomainId(1), None, 0, TIMEOUT)
                        .await
                        .unwrap();
                    assert!(t.pools().is_none(), "a control channel has no pool arena");
                    let c = fabric::FabricChannel::Verbs(Box::new(t));
                    let c = match sealer {
                        Some(s) => fabric::FabricChannel::sealed(c, s),
                        None => c,
                    };
                    assert_eq!(
                        matches!(c, fabric::FabricChannel::Sealed(_)),
                        auth != Auth::None
                    );
                    c
                }
                DataPath::Stream => {
                    assert_eq!(hello.channel, wire::CONTROL_CHANNEL);
                    let c = fabric::control_channel(c, proof).unwrap();
                    assert_eq!(
                        matches!(c, fabric::FabricChannel::Sealed(_)),
                        auth != Auth::None
                    );
                    c
                }
                DataPath::Shm { .. } => {
                    assert_eq!(hello.channel, fabric::shm::SHM_CONTROL_CHANNEL);
                    let fabric::Stream::Unix(sock) = c.into_stream() else {
                        panic!("not a Unix socket")
                    };
                    let t = fabric::shm::accept(sock, DomainId(1), MAX_MESSAGE_LEN, None, TIMEOUT)
                        .await
                        .unwrap();
                    assert!(t.pools().is_none(), "a control channel has no pool arena");
                    fabric::FabricChannel::Shm(Box::new(t))
                }
            };
            let d = listener.accept();
            let a = fabric::accept_hello(d, TIMEOUT, Some(&ioc_key))
                .await
                .unwrap();
            let (mut d, hello, v, mut proof) = (a.ch, a.hello, a.version, a.auth);
            assert_eq!(proof.as_ref().map(|r| r.peer), host_public);
            // Posted first: the link's first flush sends it ahead of any frame.
            let asked = proof.as_ref().map_or(0, |r| r.flags);
            assert_eq!(asked != 0, auth == Auth::SealedData);
            fabric::post_reply_agreeing(&mut d, proof.as_deref_mut(), v, ErrorCode::Ok, 1, asked)
                .unwrap();
            let d: fabric::FabricChannel = match path_kind {
                DataPath::Stream if asked != 0 => {
                    fabric::flush(&mut d, TIMEOUT).await.unwrap();
                    let sealer = proof.unwrap().into_sealer().unwrap();
                    let d = fabric::sealed_data_channel(d, sealer).unwrap();
                    assert!(matches!(d.stream(), fabric::Stream::Sealed(_)));
                    d.into()
                }
                DataPath::Stream => {
                    assert_eq!((hello.session, hello.channel), (1, 1));
                    d.into()
                }
                DataPath::Verbs { pool_bytes } => {
                    assert_eq!(
                        (hello.session, hello.channel),
                        (1, fabric::verbs::VERBS_CHANNEL)
                    );
                    fabric::flush(&mut d, TIMEOUT).await.unwrap();
                    let size =
                        splitnet_messaging::adapter::shm::setup::Setup::pool_size_for(pool_bytes);
                    let arena = fabric::shm::PoolArena::new(c"test-pools", size).unwrap();
                    let (sock, unread) = d.into_parts();
                    let t = fabric::verbs::accept(
                        sock,
                        unread,
                        DomainId(1),
                        Some(arena.region()),
                        size,
                        TIMEOUT,
                    )
                    .await
                    .unwrap();
                    fabric::FabricChannel::Verbs(Box::new(t))
                }
                DataPath::Shm { .. } => {
                    assert_eq!(
                        (hello.session, hello.channel),
                        (1, fabric::shm::SHM_CHANNEL)
                    );
                    fabric::flush(&mut d, TIMEOUT).await.unwrap();
                    let fabric::Stream::Unix(sock) = d.into_stream() else {
                        panic!("not a Unix socket")
                    };
                    // As large as the client's (16 MiB of pools and the slack), which the
                    // IOC's side requires.
                    let size =
                        splitnet_messaging::adapter::shm::setup::Setup::pool_size_for(16 << 20);
                    let arena = fabric::shm::PoolArena::new(c"test-pools", size).unwrap();
                    let t = fabric::shm::accept(
                        sock,
                        DomainId(1),
                        MAX_MESSAGE_LEN,
                        Some(arena),
                        TIMEOUT,
                    )
                    .await
                    .unwrap();
                    fabric::FabricChannel::Shm(Box::new(t))
                }
            };
            let mut reg = Registry::new(1 << 30);
            // Over shared memory the client places its frames straight into these pools.
            let arena = d.pools();
            assert_eq!(arena.is_some(), path_kind != DataPath::Stream);
            if let Some(a) = arena {
                reg.attach_arena(DomainId(1), a).unwrap();
            }
            let mut s = Session::new(DomainId(1), config(128));
            s.start(&mut reg).unwrap();
            let tl = RegisteredLink::new(s, c, d).unwrap();
            side(tl, reg, 0, frames, both_a).run().await
        })
    });
    let client = std::thread::spawn(move || {
        rt().block_on(async {
            let dial = || async {
                match (tcp, &path) {
                    (Some(a), _) => fabric::dial_tcp(a).await,
                    (None, Some(p)) => fabric::dial_unix(p).await,
                    (None, None) => unreachable!("a listener has an address"),
                }
            };
            let (c, d, reply) = fabric::connect(
                dial,
                path_kind,
                42,
                wire::Queue::SINGLE,
                0,
                TIMEOUT,
                keys.as_ref(),
            )
            .await
            .unwrap();
            assert_eq!(reply.session, 1);
            let mut reg = Registry::new(1 << 30);
            // Over shared memory the server places its frames straight into these pools.
            let arena = d.pools();
            assert_eq!(arena.is_some(), path_kind != DataPath::Stream);
            if let Some(a) = arena {
                reg.attach_arena(DomainId(1), a).unwrap();
            }
            let mut s = Session::new(DomainId(1), config(128));
            s.start(&mut reg).unwrap();
            let tl = RegisteredLink::new(s, c, d).unwrap();
            side(tl, reg, 1, frames, both_b).run().await
        })
    });
    let a = server.join().expect("server side");
    let b = client.join().expect("client side");
    for s in [&a, &b] {
        assert_eq!(s.sent, frames);
        assert_eq!(s.received, frames);
        let st = s.tl.link.stats();
        assert_eq!(st.rx_frames, frames);
        assert!(st.tx_inline > 0, "some frames took SendData");
        // Credits back to the full count: nothing in use, every advertised element free.
        let ini = s.tl.link.session().initiator();
        assert_eq!(ini.in_use(), 0);
        let total: u64 = ini.pools().map(|p| u64::from(p.element_count)).sum();
        assert_eq!(ini.credits(), total);
    }
    let _ = MAX_MESSAGE_LEN;
}

/// Over RDMA verbs on the device that holds `SPLITNET_VERBS_ADDR` (two queue pairs of one
/// device, looped back in it): the frames travel as RDMA WRITE WITH IMMEDIATE, and as RDMA
/// WRITE with a BufferRDMAIndicate where idata cannot describe them.
#[test]
#[ignore = "needs an RDMA device holding SPLITNET_VERBS_ADDR (tests/e2e/50-rdma-vms.sh)"]
fn frames_each_way_over_rdma_verbs() {
    let addr = std::env::var("SPLITNET_VERBS_ADDR")
        .expect("SPLITNET_VERBS_ADDR: an address an RDMA device holds");
    let frames = std::env::var("SPLITNET_VERBS_FRAMES").map_or(FRAMES, |f| f.parse().unwrap());
    let l = TcpListener::bind((addr.parse::<std::net::IpAddr>().unwrap(), 0)).unwrap();
    // Connection requests on the same address and port, as an IOC takes them.
    fabric::verbs::listen(l.local_addr().unwrap()).unwrap();
    exchange_frames(
        Listener::Tcp(l),
        DataPath::Verbs {
            pool_bytes: 16 << 20,
        },
        Auth::Keys,
        frames,
    );
}

/// A host that asked for its data channel sealed does not take an IOC's agreement without
/// the flag: it says Goodbye (Unauthenticated) and fails (docs/protocol.md, row H14).
#[test]
fn a_host_refuses_a_data_channel_left_clear_when_it_asked_for_it_sealed() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let ioc_key = fabric::auth::generate().unwrap();
    let keys = fabric::HostKeys {
        private: fabric::auth::generate().unwrap(),
        ioc: fabric::auth::public_key(&ioc_key),
        seal_data: true,
        flags: 0,
    };
    let server = std::thread::spawn(move || {
        rt().block_on(async {
            let mut asked = Vec::new();
            let mut data = None;
            for _ in 0..2 {
                let s: fabric::Stream = l.accept().unwrap().0.into();
                let a = fabric::accept_hello(s, TIMEOUT, Some(&ioc_key))
                    .await
                    .unwrap();
                let (mut c, mut proof) = (a.ch, a.auth);
                asked.push(proof.as_ref().unwrap().flags);
                // Agrees to nothing.
                fabric::post_reply(&mut c, proof.as_deref_mut(), a.version, ErrorCode::Ok, 1)
                    .unwrap();
                fabric::flush(&mut c, TIMEOUT).await.unwrap();
                data = Some(c);
            }
            // The host's answer on the data channel: Goodbye, then the end.
            let mut d = data.unwrap();
            let mut reg = Registry::new(0);
            let goodbye = loop {
                use splitnet_messaging::adapter::{Channel, RxCompletion};
                match d.poll_recv(&mut reg) {
                    Ok(Some(RxCompletion::Recv { .. })) => break d.received().to_vec(),
                    Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(e) => panic!("no Goodbye: {e}"),
                }
            };
            (asked, goodbye)
        })
    });
    let r = rt().block_on(fabric::connect(
        || fabric::dial_tcp(addr),
        DataPath::Stream,
        42,
        wire::Queue::SINGLE,
        0,
        TIMEOUT,
        Some(&keys),
    ));
    assert!(matches!(r, Err(fabric::FabricError::NotSealed)), "{r:?}");
    let (asked, goodbye) = server.join().unwrap();
    assert_eq!(
        asked,
        [0, wire::HelloReply::SEALED_DATA],
        "asked on the data channel only"
    );
    assert!(matches!(
        wire::Message::parse(&goodbye),
        Ok((
            _,
            wire::Message::Goodbye(wire::Goodbye {
                code: ErrorCode::Unauthenticated
            })
        ))
    ));
}

/// A host's session flags (a standby, a liveness interval) are asked on its data channel's
/// AuthHello only, and what the IOC agreed comes back in the reply `connect` returns
/// (docs/protocol.md 6.4, 8).
#[test]
fn session_flags_are_asked_on_the_data_channel_and_the_agreed_ones_returned() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let ioc_key = fabric::auth::generate().unwrap();
    let asked_flags = wire::HelloReply::with_liveness(wire::HelloReply::STANDBY, 25);
    let keys = fabric::HostKeys {
        private: fabric::auth::generate().unwrap(),
        ioc: fabric::auth::public_key(&ioc_key),
        seal_data: false,
        flags: asked_flags,
    };
    // Agrees to the standby and keeps a longer interval than asked.
    let agreed = wire::HelloReply::with_liveness(wire::HelloReply::STANDBY, 40);
    let server = std::thread::spawn(move || {
        rt().block_on(async {
            let mut asked = Vec::new();
            let mut chans = Vec::new();
            for i in 0..2 {
                let s: fabric::Stream = l.accept().unwrap().0.into();
                let a = fabric::accept_hello(s, TIMEOUT, Some(&ioc_key))
                    .await
                    .unwrap();
                let (mut c, mut proof) = (a.ch, a.auth);
                asked.push(proof.as_ref().unwrap().flags);
                let flags = if i == 1 { agreed } else { 0 };
                fabric::post_reply_agreeing(
                    &mut c,
                    proof.as_deref_mut(),
                    a.version,
                    ErrorCode::Ok,
                    1,
                    flags,
                )
                .unwrap();
                fabric::flush(&mut c, TIMEOUT).await.unwrap();
                chans.push(c);
            }
            asked
        })
    });
    let r = rt().block_on(fabric::connect(
        || fabric::dial_tcp(addr),
        DataPath::Stream,
        42,
        wire::Queue::SINGLE,
        0,
        TIMEOUT,
        Some(&keys),
    ));
    let (_, _, reply) = r.expect("connected");
    assert_eq!(reply.flags, agreed);
    assert_eq!(wire::HelloReply::liveness_ms(reply.flags), Some(40));
    assert_eq!(
        server.join().unwrap(),
        [0, asked_flags],
        "asked on the data channel only"
    );
}
