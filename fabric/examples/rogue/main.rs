//! A hostile fabric peer for the reliability tests.
//!
//! `rogue host ADDR` connects to an ioc-driver at ADDR once per attack, speaks the protocol
//! correctly up to the attack, and checks that the IOC closes the connection afterwards.
//! `rogue ioc ADDR` listens at ADDR like an IOC and attacks each host-driver connection in
//! turn. `rogue slow ADDR SECONDS` is a host that keeps its session alive (keepalives, a
//! GetStats a second) but never reads its data channel; it prints its MAC, then whether the
//! IOC kept it. `rogue churn ADDR N` connects and vanishes N times. `rogue shm PATH` connects
//! to the IOC's local socket with its data channel in shared memory, then corrupts its ring
//! and rings the IOC's doorbell, and (other sessions) floods that doorbell, and asks to be
//! woken for every answer without ever reading its own doorbell. `rogue noisy ADDR KIND
//! SECONDS` is a host that storms its IOC (see `noisy`). `rogue rdma ADDR KEY IOC_KEY NODE_ID`
//! writes over RDMA where it may not (see `rdma`). Exit status 0 when every
//! attack was refused (or, the last, survived) as expected.
//!
//! Blocking sockets with timeouts keep it simple; it is a test tool, not a daemon.

mod admission;
mod noisy;
mod rdma;

use splitnet_messaging::adapter::{
    Channel, ChannelError, Op, Payload, RxCompletion, StreamChannel,
};
use splitnet_messaging::endpoint::handshake;
use splitnet_messaging::memory::{DomainId, Handle, Registry};
use splitnet_messaging::wire::{
    self, CfgCode, CfgRequest, Idata, Message, PoolEntry, PoolGet, PoolRun, Queue, Role,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

type Ch = StreamChannel<TcpStream>;

const WAIT: Duration = Duration::from_secs(3);

fn chan(s: TcpStream) -> Ch {
    s.set_read_timeout(Some(Duration::from_millis(50))).ok();
    s.set_nodelay(true).ok();
    StreamChannel::new(s, DomainId(0), wire::MAX_MESSAGE_LEN)
}

fn send<S: Read + Write>(ch: &mut StreamChannel<S>, msg: Vec<u8>) {
    ch.post(Op::Send, &[], Payload::Bytes(msg));
    let _ = ch.flush();
}

fn msg(m: &Message<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    m.emit(1, &mut v);
    v
}

/// Whether a poll's error only says nothing came yet (the sockets have read timeouts).
fn idle(e: &ChannelError) -> bool {
    matches!(e, ChannelError::Io(e) if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ))
}

/// Next message within `WAIT`, or None.
fn recv(ch: &mut impl Channel, reg: &mut Registry) -> Option<Vec<u8>> {
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        match ch.poll_recv(reg) {
            Ok(Some(RxCompletion::Recv { .. })) => return Some(ch.received().to_vec()),
            Ok(_) => {}
            Err(e) if idle(&e) => {}
            Err(_) => return None,
        }
    }
    None
}

/// True if the peer closes the channel within `within` (whatever it sends first is read).
fn closed(ch: &mut impl Channel, reg: &mut Registry, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        match ch.poll_recv(reg) {
            Ok(_) => {}
            Err(e) if idle(&e) => {}
            Err(_) => return true,
        }
    }
    false
}

struct Conn {
    ctrl: Ch,
    data: Ch,
    reg: Registry,
    pools: Vec<PoolEntry>,
    /// The token the IOC gave this session.
    token: u64,
}

/// A correct handshake as a host, then the IOC's pools.
fn connect_host(addr: &str) -> Result<Conn, String> {
    connect_as(addr, 0xbad, None)
}

/// A correct handshake as host `node_id`; `rcvbuf` shrinks the data channel's receive
/// buffer before it connects (a host that reads slowly).
fn connect_as(addr: &str, node_id: u64, rcvbuf: Option<usize>) -> Result<Conn, String> {
    let mut reg = Registry::new(0);
    let mut ctrl = chan(TcpStream::connect(addr).map_err(|e| e.to_string())?);
    send(
        &mut ctrl,
        handshake::hello(Role::Host, 0, Queue::SINGLE, 0, node_id, 70_000),
    );
    let r = recv(&mut ctrl, &mut reg).ok_or("no HelloReply")?;
    let r = handshake::accept_reply(&r).map_err(|e| e.to_string())?;
    let data_sock = match rcvbuf {
        Some(n) => {
            let sa: std::net::SocketAddr = addr.parse().map_err(|e| format!("{e}"))?;
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .map_err(|e| e.to_string())?;
            s.set_recv_buffer_size(n).map_err(|e| e.to_string())?;
            s.connect(&sa.into()).map_err(|e| e.to_string())?;
            TcpStream::from(s)
        }
        None => TcpStream::connect(addr).map_err(|e| e.to_string())?,
    };
    let mut data = chan(data_sock);
    send(
        &mut data,
        handshake::hello(Role::Host, 1, Queue::SINGLE, r.session, node_id, 70_000),
    );
    recv(&mut data, &mut reg).ok_or("no data HelloReply")?;
    let mut pools = Vec::new();
    while pools.is_empty() {
        let m = recv(&mut ctrl, &mut reg).ok_or("no BufferRecvPool")?;
        if let Ok((_, Message::BufferRecvPool(p))) = Message::parse(&m) {
            pools = p;
        }
    }
    // The IOC advertises its initial pools one message each; collect the rest.
    let end = Instant::now() + Duration::from_millis(300);
    while Instant::now() < end {
        if let Ok(Some(RxCompletion::Recv { .. })) = ctrl.poll_recv(&mut reg) {
            if let Ok((_, Message::BufferRecvPool(p))) = Message::parse(ctrl.received()) {
                pools.extend(p);
            }
        }
    }
    Ok(Conn {
        ctrl,
        data,
        reg,
        pools,
        token: r.session,
    })
}

/// A frame (virtio-net header, then Ethernet) from `src` to the broadcast address.
fn frame_from(src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0u8; 10];
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x88, 0xb5]);
    f.resize(len, 0x5a);
    f
}

/// Writes `frame` into element `element` of `pool` with immediate data, as a host does.
fn write_frame(ch: &mut Ch, pool: &PoolEntry, element: u32, frame: &[u8]) {
    let imm = Idata::new(pool.pool_ref, element, frame.len() as u32)
        .map(|i| i.to_u32())
        .unwrap_or(0);
    ch.post(
        Op::WriteImm {
            handle: pool.handle,
            addr: pool.address + u64::from(element) * u64::from(pool.element_size),
            imm,
        },
        &[],
        Payload::Bytes(frame.to_vec()),
    );
    let _ = ch.flush();
}

/// The session's MAC, asked with GetMac.
fn get_mac(c: &mut Conn) -> Option<[u8; 6]> {
    send(
        &mut c.ctrl,
        msg(&Message::CfgUtilRequest(CfgRequest {
            code: CfgCode::GetMac,
            data: &[],
        })),
    );
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        let m = recv(&mut c.ctrl, &mut c.reg)?;
        if let Ok((_, Message::CfgUtilReply(r))) = Message::parse(&m) {
            if r.code == CfgCode::GetMac {
                return r.data.try_into().ok();
            }
        }
    }
    None
}

fn write(ch: &mut Ch, handle: u64, addr: u64, len: usize) {
    ch.post(
        Op::Write { handle, addr },
        &[],
        Payload::Bytes(vec![0xEE; len]),
    );
    let _ = ch.flush();
}

/// Prints how an attack ended (`how`, or "NOT how") and notes it in `missed` unless the IOC
/// refused it.
fn verdict(missed: &mut Vec<&'static str>, name: &'static str, refused: bool, how: &str) {
    if refused {
        println!("{name}: {how}");
    } else {
        println!("{name}: NOT {how}");
        missed.push(name);
    }
}

/// Attacks an ioc-driver; returns the attacks that were not refused.
fn attack_ioc(addr: &str) -> Vec<&'static str> {
    type Attack = fn(&mut Conn);
    let attacks: Vec<(&'static str, Attack)> = vec![
        ("truncated message", |c| {
            send(&mut c.ctrl, vec![0x01, 0x01, 0, 1, 0])
        }),
        ("unknown function", |c| {
            let mut m = msg(&Message::Keepalive);
            m[0] = 0x7f;
            send(&mut c.ctrl, m)
        }),
        ("unknown version", |c| {
            let mut m = msg(&Message::Keepalive);
            m[3] = 9;
            send(&mut c.ctrl, m)
        }),
        ("oversized SEND", |c| {
            c.ctrl.post(
                Op::Send,
                &[],
                Payload::Bytes(vec![0; wire::MAX_MESSAGE_LEN + 1]),
            );
            let _ = c.ctrl.flush();
        }),
        ("SendData over the frame limit", |c| {
            let mut m = msg(&Message::SendData(&[]));
            m[12..16].copy_from_slice(&(1u32 << 20).to_be_bytes());
            send(&mut c.data, m)
        }),
        ("write out of bounds", |c| {
            let p = c.pools[0];
            let end = p.address + u64::from(p.element_size) * u64::from(p.element_count);
            write(&mut c.data, p.handle, end, 64)
        }),
        ("offset + length overflow", |c| {
            let p = c.pools[0];
            write(&mut c.data, p.handle, u64::MAX - 8, 64)
        }),
        ("stale generation", |c| {
            let p = c.pools[0];
            let h = Handle::from_u64(p.handle);
            let stale = Handle::new(h.index(), h.generation().wrapping_add(1));
            write(&mut c.data, stale.to_u64(), p.address, 64)
        }),
        ("another host's domain", |c| {
            // Slot 0 belongs to the first host connected to this IOC.
            let p = c.pools[0];
            let foreign = Handle::new(0, 0);
            if foreign.to_u64() == p.handle {
                write(&mut c.data, Handle::new(1, 0).to_u64(), p.address, 64)
            } else {
                write(&mut c.data, foreign.to_u64(), p.address, 64)
            }
        }),
        ("flushed pool", |c| {
            let p = c.pools[0];
            let mut m = Vec::new();
            Message::BufferPoolFlushRequest(vec![p.pool_ref]).emit(77, &mut m);
            send(&mut c.data, m);
            std::thread::sleep(Duration::from_millis(200));
            write(&mut c.data, p.handle, p.address, 64)
        }),
        ("beyond credits", |c| {
            let p = c.pools[0];
            write(&mut c.data, p.handle, p.address, 64);
            write(&mut c.data, p.handle, p.address, 64)
        }),
        ("credit returned that was never used", |c| {
            send(
                &mut c.ctrl,
                msg(&Message::BufferRecvPoolUpdate(vec![PoolRun {
                    pool_ref: 0,
                    first: 0,
                    count: 1,
                }])),
            )
        }),
    ];
    let mut missed = Vec::new();
    for (name, attack) in attacks {
        let mut c = match connect_host(addr) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{name}: cannot connect: {e}");
                missed.push(name);
                continue;
            }
        };
        attack(&mut c);
        let ok = closed(&mut c.data, &mut c.reg, WAIT) || closed(&mut c.ctrl, &mut c.reg, WAIT);
        verdict(&mut missed, name, ok, "refused, connection closed");
    }
    // A flood of pool requests: declined beyond the bound; the connection may stay.
    if let Ok(mut c) = connect_host(addr) {
        for _ in 0..2000 {
            c.ctrl.post(
                Op::Send,
                &[],
                Payload::Bytes(msg(&Message::BufferRecvPoolGet(PoolGet {
                    element_size: 1 << 20,
                    element_count: 4096,
                }))),
            );
        }
        let _ = c.ctrl.flush();
        let mut granted = 0u64;
        while let Some(m) = recv(&mut c.ctrl, &mut c.reg) {
            if let Ok((_, Message::BufferRecvPool(p))) = Message::parse(&m) {
                granted += p
                    .iter()
                    .map(|e| u64::from(e.element_size) * u64::from(e.element_count))
                    .sum::<u64>();
            }
        }
        println!("BufferRecvPoolGet flood: {granted} bytes granted beyond the initial pools");
        if granted > 64 << 20 {
            missed.push("BufferRecvPoolGet flood");
        }
    }
    // A peer that connects and never speaks is dropped after the handshake timeout.
    if let Ok(s) = TcpStream::connect(addr) {
        let mut c = chan(s);
        let mut reg = Registry::new(0);
        let ok = closed(&mut c, &mut reg, Duration::from_secs(5));
        println!(
            "silent peer: {}",
            if ok { "dropped" } else { "NOT dropped" }
        );
        if !ok {
            missed.push("silent peer");
        }
    }
    // An unknown version in the Hello itself.
    if let Ok(s) = TcpStream::connect(addr) {
        let mut c = chan(s);
        let mut reg = Registry::new(0);
        let mut h = handshake::hello(Role::Host, 0, Queue::SINGLE, 0, 1, 70_000);
        h[12..16].copy_from_slice(&[0, 50, 0, 60]); // versions 50..=60
        send(&mut c, h);
        let refused = recv(&mut c, &mut reg)
            .map(|r| handshake::accept_reply(&r).is_err())
            .unwrap_or(true);
        println!(
            "unsupported Hello version: {}",
            if refused { "refused" } else { "NOT refused" }
        );
        if !refused {
            missed.push("unsupported Hello version");
        }
    }
    // A further queue naming a session that is not its host's first queue: sessions 1..=8
    // (some of them other hosts', with other node ids) and one that does not exist.
    let mut joined = 0;
    for first in (1..=8).chain([0xffff]) {
        let Ok(s) = TcpStream::connect(addr) else {
            continue;
        };
        let mut c = chan(s);
        let mut reg = Registry::new(0);
        let queue = Queue { index: 1, count: 2 };
        send(
            &mut c,
            handshake::hello(Role::Host, 0, queue, first, 0xbad, 70_000),
        );
        let accepted = recv(&mut c, &mut reg).is_some_and(|r| handshake::accept_reply(&r).is_ok());
        joined += usize::from(accepted);
    }
    verdict(
        &mut missed,
        "queue joining another host's session",
        joined == 0,
        "refused",
    );
    // A data channel naming another session: the next tokens, small ids, or the right
    // token from another node.
    if let Ok(c) = connect_host(addr) {
        let mut joined = 0;
        let guesses = [c.token.wrapping_add(1), c.token.wrapping_sub(1), 1, 2, 3];
        for (session, node) in guesses
            .iter()
            .map(|&s| (s, 0xbad))
            .chain([(c.token, 0xb0b)])
        {
            let Ok(s) = TcpStream::connect(addr) else {
                continue;
            };
            let mut d = chan(s);
            let mut reg = Registry::new(0);
            send(
                &mut d,
                handshake::hello(Role::Host, 1, Queue::SINGLE, session, node, 70_000),
            );
            joined += usize::from(
                recv(&mut d, &mut reg).is_some_and(|r| handshake::accept_reply(&r).is_ok()),
            );
        }
        verdict(
            &mut missed,
            "data channel joining another session",
            joined == 0,
            "refused",
        );
    }
    // Pool requests of absurd geometry: declined, nothing granted.
    if let Ok(mut c) = connect_host(addr) {
        for (size, count) in [(1, 1 << 26), (8, 1 << 20), (256, 1 << 16)] {
            send(
                &mut c.ctrl,
                msg(&Message::BufferRecvPoolGet(PoolGet {
                    element_size: size,
                    element_count: count,
                })),
            );
        }
        let mut granted = 0;
        while let Some(m) = recv(&mut c.ctrl, &mut c.reg) {
            if let Ok((_, Message::BufferRecvPool(p))) = Message::parse(&m) {
                granted += p.len();
            }
        }
        verdict(
            &mut missed,
            "BufferRecvPoolGet of absurd geometry",
            granted == 0,
            "declined",
        );
    }
    // Requests whose answers are never read: the IOC ends the session once its backlog of
    // unread answers passes its bound, instead of growing.
    if let Ok(c) = connect_host(addr) {
        let Conn {
            mut ctrl, mut reg, ..
        } = c;
        let req = msg(&Message::CfgUtilRequest(CfgRequest {
            code: CfgCode::GetStats,
            data: &[],
        }));
        let end = Instant::now() + Duration::from_secs(10);
        let mut gone = false;
        while !gone && Instant::now() < end {
            for _ in 0..1000 {
                ctrl.post(Op::Send, &[], Payload::Bytes(req.clone()));
            }
            gone = ctrl.flush().is_err();
        }
        // Only now read: what the IOC sent ends with the close.
        let gone = gone || closed(&mut ctrl, &mut reg, WAIT);
        verdict(
            &mut missed,
            "GetStats without reading the answers",
            gone,
            "disconnected",
        );
    }
    // Frames from a source MAC that is not the host's: dropped and counted by the IOC (the
    // end-to-end test reads the counter); the session stays.
    if let Ok(mut c) = connect_host(addr) {
        if let Some(pool) = c.pools.iter().find(|p| p.element_size >= 128).copied() {
            for e in 0..SPOOFED {
                write_frame(&mut c.data, &pool, e, &frame_from(SPOOF_MAC, 100));
            }
            std::thread::sleep(Duration::from_millis(200));
            println!("spoofed source MAC: {SPOOFED} frames sent");
        }
    }
    missed
}

/// Frames sent from [`SPOOF_MAC`].
const SPOOFED: u32 = 10;
/// A source MAC no host owns.
const SPOOF_MAC: [u8; 6] = [0x02, 0x66, 0x66, 0x66, 0x66, 0x66];

/// [`connect_as`], then the session's MAC, printed for the test (`mac XX:..`); what failed
/// otherwise, said as `who`.
fn host_with_mac(
    addr: &str,
    node_id: u64,
    rcvbuf: Option<usize>,
    who: &str,
) -> Result<(Conn, [u8; 6]), Vec<&'static str>> {
    let mut c = connect_as(addr, node_id, rcvbuf).map_err(|e| {
        eprintln!("{who}: cannot connect: {e}");
        vec!["connect"]
    })?;
    let mac = get_mac(&mut c).ok_or(vec!["GetMac"])?;
    println!("mac {}", wire::fmt_mac(&mac));
    Ok((c, mac))
}

/// A host that keeps its control channel alive and never reads its data channel.
fn slow_host(addr: &str, seconds: u64) -> Vec<&'static str> {
    let mut c = match host_with_mac(addr, 0x5107, Some(4096), "slow host") {
        Ok((c, _)) => c,
        Err(missed) => return missed,
    };
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut next_stats = Instant::now();
    while Instant::now() < end {
        send(&mut c.ctrl, msg(&Message::Keepalive));
        if Instant::now() >= next_stats {
            next_stats += Duration::from_secs(1);
            send(
                &mut c.ctrl,
                msg(&Message::CfgUtilRequest(CfgRequest {
                    code: CfgCode::GetStats,
                    data: &[],
                })),
            );
        }
        // Read the control channel (answers, keepalives) for 100 ms; never the data channel.
        if closed(&mut c.ctrl, &mut c.reg, Duration::from_millis(100)) {
            println!("slow host: the IOC closed the session");
            return vec!["the IOC kept the slow host"];
        }
    }
    println!("slow host: still connected after {seconds} s");
    Vec::new()
}

/// Connects `n` times, each time dropping the connection without a word.
fn churn(addr: &str, n: usize) -> Vec<&'static str> {
    let mut failed = 0;
    for i in 0..n {
        match connect_as(addr, 0xc0de + i as u64 % 4, None) {
            Ok(c) => drop(c),
            Err(_) => failed += 1,
        }
    }
    println!("churn: {n} connections, {failed} failed");
    if failed * 10 > n {
        vec!["churn"]
    } else {
        Vec::new()
    }
}

/// Plays a hostile IOC for `rounds` host connections.
fn attack_host(addr: &str, rounds: usize) -> Vec<&'static str> {
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {addr}: {e}");
            return vec!["listen"];
        }
    };
    type Attack = fn(&mut Ch, &mut Ch, &[PoolEntry]);
    let attacks: Vec<(&'static str, Attack)> = vec![
        ("write out of bounds", |_, d, p| {
            let e = p[0];
            write(
                d,
                e.handle,
                e.address + u64::from(e.element_size) * u64::from(e.element_count),
                64,
            )
        }),
        ("credit violation", |c, _, _| {
            send(
                c,
                msg(&Message::BufferRecvPoolUpdate(vec![PoolRun {
                    pool_ref: 0,
                    first: 0,
                    count: 1,
                }])),
            )
        }),
        ("unknown function", |c, _, _| {
            let mut m = msg(&Message::Keepalive);
            m[0] = 0x66;
            send(c, m)
        }),
        ("unbounded pool advertisement", |c, _, _| {
            send(
                c,
                msg(&Message::BufferRecvPool(vec![PoolEntry {
                    pool_ref: 0,
                    element_count: u32::MAX,
                    element_size: u32::MAX,
                    address: 0,
                    handle: 0,
                    context: 0,
                }])),
            )
        }),
    ];
    let mut missed = Vec::new();
    let mut reg = Registry::new(0);
    for (name, attack) in attacks.into_iter().take(rounds) {
        let Some((mut ctrl, mut data, pools)) = accept_host(&listener, &mut reg) else {
            missed.push(name);
            continue;
        };
        attack(&mut ctrl, &mut data, &pools);
        let ok = closed(&mut data, &mut reg, WAIT) || closed(&mut ctrl, &mut reg, WAIT);
        verdict(&mut missed, name, ok, "refused, connection closed");
    }
    // Frames whose virtio-net header the kernel must not see, and SendData a pool could have
    // held, are dropped (and counted, as the test reads from the host's statistics), not a
    // reason to end the session.
    let name = "frames with a bad virtio-net header, and one inline that a pool could hold";
    match accept_host(&listener, &mut reg) {
        Some((mut ctrl, mut data, pools)) => {
            let mut frame = vec![0u8; 12 + 60];
            frame[0] = 0x80; // no flag the virtio-net header defines
            for element in 0..BAD_HEADER_FRAMES {
                write_frame(&mut data, &pools[0], element, &frame);
            }
            // And a frame inline that the pool it wrote into could hold (beyond MAX_INLINE):
            // refused, counted, the session kept (docs/protocol.md, N1).
            send(&mut data, msg(&Message::SendData(&[0u8; 1500])));
            // Kept alive (the host's keepalive timeout may be short) while it has a second.
            let tick = Duration::from_millis(100);
            let kept = (0..10).all(|_| {
                send(&mut ctrl, msg(&Message::Keepalive));
                !closed(&mut data, &mut reg, tick) && !closed(&mut ctrl, &mut reg, tick)
            });
            verdict(&mut missed, name, kept, "dropped, connection kept");
        }
        None => missed.push(name),
    }
    missed
}

/// Frames with a bad virtio-net header the rogue IOC sends (e2e 15 finds them counted).
const BAD_HEADER_FRAMES: u32 = 3;

/// Accepts a host's control and data channels as an IOC that authenticates no one would, and
/// takes the pools the host advertises.
fn accept_host(listener: &TcpListener, reg: &mut Registry) -> Option<(Ch, Ch, Vec<PoolEntry>)> {
    let accept = |reg: &mut Registry| -> Option<Ch> {
        let (s, _) = listener.accept().ok()?;
        let mut ch = chan(s);
        let h = recv(&mut ch, reg)?;
        let (_, v) = handshake::accept_hello(&h).ok()?;
        send(&mut ch, handshake::reply(v, wire::ErrorCode::Ok, 9, 70_000));
        Some(ch)
    };
    let mut ctrl = accept(reg)?;
    let data = accept(reg)?;
    loop {
        let m = recv(&mut ctrl, reg)?;
        if let Ok((_, Message::BufferRecvPool(p))) = Message::parse(&m) {
            if !p.is_empty() {
                return Some((ctrl, data, p));
            }
        }
    }
}

/// One channel's shared memory as a rogue host sets it up (docs/protocol.md section 9).
struct ShmChannelSetup {
    /// The ring this host produces into.
    to_ioc: splitnet_fabric::shm::memfd::Mapping,
    /// The channel's doorbell: this host's end of its connection.
    ioc_bell: splitnet_fabric::shm::doorbell::Doorbell,
    /// Kept open for the session's lifetime: the other ring and (a data channel's) pool
    /// arena.
    _keep: (
        splitnet_fabric::shm::memfd::Mapping,
        Option<splitnet_fabric::shm::memfd::Memfd>,
    ),
}

impl ShmChannelSetup {
    /// Sends a correct set-up on `sock` (with a pool arena for a data channel) and takes the
    /// IOC's answer.
    fn offer(sock: &UnixStream, data: bool) -> Result<ShmChannelSetup, String> {
        use splitnet_fabric::shm::{doorbell::Doorbell, memfd as shm};
        use splitnet_messaging::adapter::shm::setup::{
            Setup, ACK_LEN, MAX_PAYLOAD, POOL_RANGE, RING_DATA, RING_DATA_CONTROL,
        };
        let setup = Setup {
            data_size: if data { RING_DATA } else { RING_DATA_CONTROL },
            max_payload: MAX_PAYLOAD,
            pool_size: if data { POOL_RANGE.0 } else { 0 },
        };
        let cfg = setup.ring().map_err(|e| e.to_string())?;
        let ring = |name| -> Result<(shm::Memfd, shm::Mapping), String> {
            let fd = shm::Memfd::create(name, cfg.region_len()).map_err(|e| e.to_string())?;
            let map = fd.map().map_err(|e| e.to_string())?;
            cfg.init(&map).map_err(|e| e.to_string())?;
            Ok((fd, map))
        };
        let (to_ioc, to_ioc_map) = ring(c"rogue-to-ioc")?;
        let (from_ioc, from_ioc_map) = ring(c"rogue-from-ioc")?;
        let pools = match data {
            true => Some(
                shm::Memfd::create(c"rogue-pools", setup.pool_size as usize)
                    .map_err(|e| e.to_string())?,
            ),
            false => None,
        };
        let mut fds = vec![to_ioc.as_fd(), from_ioc.as_fd()];
        fds.extend(pools.as_ref().map(|p| p.as_fd()));
        shm::send_fds(sock, &setup.emit(), &fds).map_err(|e| e.to_string())?;
        let mut ack = [0u8; ACK_LEN];
        let want = usize::from(data);
        let (n, got) = shm::recv_fds(sock, &mut ack, want).map_err(|e| e.to_string())?;
        if Setup::parse_ack(&ack[..n]).is_err() || got.len() != want {
            return Err("no ACK from the IOC".into());
        }
        Ok(ShmChannelSetup {
            to_ioc: to_ioc_map,
            ioc_bell: Doorbell::new(sock.try_clone().map_err(|e| e.to_string())?),
            _keep: (from_ioc_map, pools),
        })
    }
}

/// A session of a host over the IOC's local socket at `path` with both its channels in
/// shared memory (docs/protocol.md section 9), set up and then left to an attack.
struct ShmSession {
    /// The data channel's socket: its end of stream says the IOC ended the session.
    sock: UnixStream,
    /// The control channel's shared memory.
    ctrl: ShmChannelSetup,
    /// The data channel's shared memory.
    data: ShmChannelSetup,
    /// The control channel's socket, kept open for the session's lifetime.
    _ctrl_sock: UnixStream,
}

impl ShmSession {
    fn open(path: &str) -> Result<ShmSession, String> {
        use splitnet_messaging::adapter::shm::setup::{SHM_CHANNEL, SHM_CONTROL_CHANNEL};
        let uch = |s: UnixStream| {
            s.set_read_timeout(Some(WAIT)).ok();
            StreamChannel::new(s, DomainId(0), wire::MAX_MESSAGE_LEN)
        };
        let mut reg = Registry::new(0);
        let hello = |channel, session| {
            handshake::hello(Role::Host, channel, Queue::SINGLE, session, 0x5c1, 70_000)
        };
        let mut ctrl = uch(UnixStream::connect(path).map_err(|e| e.to_string())?);
        send(&mut ctrl, hello(SHM_CONTROL_CHANNEL, 0));
        let r = recv(&mut ctrl, &mut reg).ok_or("no HelloReply")?;
        let r = handshake::accept_reply(&r).map_err(|e| e.to_string())?;
        let ctrl_sock = ctrl.into_stream();
        let ctrl = ShmChannelSetup::offer(&ctrl_sock, false)?;
        let mut data = uch(UnixStream::connect(path).map_err(|e| e.to_string())?);
        send(&mut data, hello(SHM_CHANNEL, r.session));
        recv(&mut data, &mut reg).ok_or("no data HelloReply")?;
        let sock = data.into_stream();
        let data = ShmChannelSetup::offer(&sock, true)?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(ShmSession {
            sock,
            ctrl,
            data,
            _ctrl_sock: ctrl_sock,
        })
    }

    /// Whether the IOC ended the session: its end of stream within `WAIT`.
    fn ended(&self) -> bool {
        ended(&self.sock)
    }
}

/// Whether the IOC closed `sock` within `WAIT`: its end of stream after any doorbell bytes.
fn ended(mut sock: &UnixStream) -> bool {
    let mut b = [0u8; 4096];
    let end = Instant::now() + WAIT;
    sock.set_nonblocking(false).ok();
    sock.set_read_timeout(Some(WAIT)).ok();
    while Instant::now() < end {
        match sock.read(&mut b) {
            // A close with doorbell bytes it had not read resets the connection.
            Ok(0) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    false
}

/// A host with both channels in shared memory that asks to be woken for every answer and
/// never reads its doorbell (nor, an IOC using eventfds, would it read one): for 3 s it sends
/// a GetStats every millisecond and polls its ring for the answer. The IOC must answer every
/// one to the end, however many of its rings went unread. Returns (requests, answers).
fn doorbell_never_read(path: &str) -> Result<(u32, u32), String> {
    use splitnet_fabric::shm::offer;
    use splitnet_messaging::adapter::shm::setup::{SHM_CHANNEL, SHM_CONTROL_CHANNEL};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut reg = Registry::new(0);
    let hello = |channel, session| {
        handshake::hello(Role::Host, channel, Queue::SINGLE, session, 0x5c2, 70_000)
    };
    let open = |channel, session, reg: &mut Registry| -> Result<(UnixStream, u64), String> {
        let s = UnixStream::connect(path).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(WAIT)).ok();
        let mut ch = StreamChannel::new(s, DomainId(0), wire::MAX_MESSAGE_LEN);
        send(&mut ch, hello(channel, session));
        let r = recv(&mut ch, reg).ok_or("no HelloReply")?;
        let r = handshake::accept_reply(&r).map_err(|e| e.to_string())?;
        let s = ch.into_stream();
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok((s, r.session))
    };
    let (c, session) = open(SHM_CONTROL_CHANNEL, 0, &mut reg)?;
    let mut ctrl = rt
        .block_on(offer(c, DomainId(0), wire::MAX_MESSAGE_LEN, None, WAIT))
        .map_err(|e| e.to_string())?;
    let (d, _) = open(SHM_CHANNEL, session, &mut reg)?;
    let _data = rt
        .block_on(offer(
            d,
            DomainId(0),
            wire::MAX_MESSAGE_LEN,
            Some(1 << 20),
            WAIT,
        ))
        .map_err(|e| e.to_string())?;
    let req = msg(&Message::CfgUtilRequest(CfgRequest {
        code: CfgCode::GetStats,
        data: &[],
    }));
    let (mut asked, mut answered) = (0u32, 0u32);
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        ctrl.post(Op::Send, &[], Payload::Bytes(req.clone()));
        ctrl.flush().map_err(|e| e.to_string())?;
        asked += 1;
        let by = Instant::now() + WAIT;
        'answer: while Instant::now() < by {
            // Ask to be woken, then look: never read the doorbell.
            ctrl.prepare_sleep();
            while let Some(c) = ctrl.poll_recv(&mut reg).map_err(|e| e.to_string())? {
                if matches!(c, RxCompletion::Recv { .. })
                    && matches!(
                        Message::parse(ctrl.received()),
                        Ok((_, Message::CfgUtilReply(_)))
                    )
                {
                    answered += 1;
                    break 'answer;
                }
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        if answered < asked {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok((asked, answered))
}

/// Attacks over shared memory, each on a session of its own; the IOC must end each session
/// (the set-up socket reaches its end):
/// - `shm-bad-ring-index`: publishes a ring index the ring refuses and rings the doorbell;
/// - `shm-control-bad-ring-index`: the same on the control channel's ring;
/// - `shm-doorbell-flood`: rings the IOC's doorbell without end, with nothing published;
/// - `shm-control-doorbell-flood`: the same with the control channel's doorbell;
/// - `shm-placed-ungranted`: publishes a placed write (a header alone) naming no element it
///   was granted.
fn shm_attacks(path: &str) -> Vec<&'static str> {
    use splitnet_messaging::adapter::shm::{ring_config, setup, Producer, KIND_PLACED};
    use splitnet_messaging::adapter::{Op, OpHeader};
    use splitnet_messaging::memory::SharedMem;
    // `head` of a ring to the IOC (offset 64): not a multiple of 8.
    let bad_index = |data: bool| -> Result<bool, String> {
        let s = ShmSession::open(path)?;
        let ch = if data { &s.data } else { &s.ctrl };
        ch.to_ioc.store_u32(64, 3).map_err(|e| e.to_string())?;
        ch.ioc_bell.ring().map_err(|e| e.to_string())?;
        Ok(s.ended())
    };
    let bad_data_index = || bad_index(true);
    let bad_control_index = || bad_index(false);
    let flood = |data: bool| -> Result<bool, String> {
        let s = ShmSession::open(path)?;
        let bell = if data {
            &s.data.ioc_bell
        } else {
            &s.ctrl.ioc_bell
        };
        s.sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        let start = Instant::now();
        let mut b = [0u8; 1];
        while start.elapsed() < WAIT {
            for _ in 0..64 {
                // A ring refused (the IOC closed the connection) ends the flood.
                if bell.ring().is_err() {
                    return Ok(ended(&s.sock));
                }
                std::thread::yield_now();
            }
            if matches!((&s.sock).read(&mut b), Ok(0)) {
                return Ok(true);
            }
        }
        Ok(false)
    };
    let placed = || -> Result<bool, String> {
        let s = ShmSession::open(path)?;
        let cfg = ring_config(setup::RING_DATA, setup::MAX_PAYLOAD).map_err(|e| e.to_string())?;
        let mut ring = Producer::attach(&s.data.to_ioc, cfg).map_err(|e| e.to_string())?;
        let op = Op::Write {
            handle: 0x7777_0000_0001,
            addr: 1 << 40,
        };
        let header = OpHeader { op, len: 1000 }.emit();
        let _ = ring
            .push(KIND_PLACED, &[&header])
            .map_err(|e| format!("{e:?}"))?;
        s.data.ioc_bell.ring().map_err(|e| e.to_string())?;
        Ok(s.ended())
    };
    let mut missed = Vec::new();
    match doorbell_never_read(path) {
        Ok((asked, answered)) => {
            println!("shm-doorbell-never-read: {answered} of {asked} GetStats answered");
            verdict(
                &mut missed,
                "shm-doorbell-never-read",
                asked > 100 && answered == asked,
                "every request answered",
            );
        }
        Err(e) => {
            println!("shm-doorbell-never-read: {e}");
            missed.push("shm-doorbell-never-read");
        }
    }
    for (name, attack) in [
        (
            "shm-bad-ring-index",
            &bad_data_index as &dyn Fn() -> Result<bool, String>,
        ),
        ("shm-control-bad-ring-index", &bad_control_index),
        ("shm-doorbell-flood", &|| flood(true)),
        ("shm-control-doorbell-flood", &|| flood(false)),
        ("shm-placed-ungranted", &placed),
    ] {
        match attack() {
            Ok(refused) => verdict(&mut missed, name, refused, "session ended"),
            Err(e) => {
                println!("{name}: could not set up: {e}");
                missed.push(name);
            }
        }
    }
    missed
}

fn number(arg: Option<&String>, default: u64) -> u64 {
    arg.and_then(|a| a.parse().ok()).unwrap_or(default)
}

/// The keys of `rogue auth`: an admitted host's private key file, the IOC's public key, and
/// the node id to claim (another host's).
fn admission_keys(args: &[String]) -> Result<(admission::Keys, u64), String> {
    let [file, ioc, claimed] = args else {
        return Err("needs HOST_KEY_FILE IOC_PUBLIC_KEY CLAIMED_NODE_ID".into());
    };
    let key = |text: &str| {
        use base64::Engine;
        let b = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| e.to_string())?;
        <[u8; 32]>::try_from(b).map_err(|_| "not a 32-byte key".to_string())
    };
    let host = key(&std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?)?;
    let claimed = claimed.parse().map_err(|e| format!("{claimed}: {e}"))?;
    Ok((
        admission::Keys {
            host,
            ioc: key(ioc)?,
        },
        claimed,
    ))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let missed = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("host"), Some(addr)) => attack_ioc(addr),
        (Some("ioc"), Some(addr)) => attack_host(addr, 4),
        (Some("slow"), Some(addr)) => slow_host(addr, number(args.get(3), 20)),
        (Some("churn"), Some(addr)) => churn(addr, number(args.get(3), 100) as usize),
        (Some("shm"), Some(path)) => shm_attacks(path),
        (Some("noisy"), Some(addr)) => match args.get(3) {
            Some(kind) => noisy::storm(addr, kind, number(args.get(4), 5)),
            None => vec!["a storm: setmac, setmulticast or broadcast"],
        },
        (Some("rdma"), Some(addr)) => match admission_keys(&args[3..]) {
            Ok((keys, node_id)) => rdma::attack(addr, &keys, node_id),
            Err(e) => {
                eprintln!("rogue rdma: {e}");
                std::process::exit(2);
            }
        },
        (Some("hold"), Some(addr)) => match admission_keys(&args[3..]) {
            Ok((keys, seconds)) => admission::hold(addr, &keys, seconds),
            Err(e) => {
                eprintln!("rogue hold: {e}");
                std::process::exit(2);
            }
        },
        (Some("auth"), Some(addr)) => match admission_keys(&args[3..]) {
            Ok((keys, claimed)) => admission::attack(addr, &keys, claimed),
            Err(e) => {
                eprintln!("rogue auth: {e}");
                std::process::exit(2);
            }
        },
        _ => {
            eprintln!(
                "usage: rogue host IOC_ADDR | rogue ioc LISTEN_ADDR | rogue slow IOC_ADDR SECONDS | rogue churn IOC_ADDR N | rogue shm IOC_LOCAL_SOCKET | rogue noisy IOC_ADDR setmac|setmulticast|broadcast SECONDS | rogue auth IOC_ADDR HOST_KEY_FILE IOC_PUBLIC_KEY CLAIMED_NODE_ID | rogue rdma IOC_ADDR HOST_KEY_FILE IOC_PUBLIC_KEY NODE_ID | rogue hold IOC_ADDR HOST_KEY_FILE IOC_PUBLIC_KEY SECONDS"
            );
            std::process::exit(2);
        }
    };
    if missed.is_empty() {
        println!("all attacks refused");
    } else {
        println!("NOT refused: {missed:?}");
        std::process::exit(1);
    }
}
