//! Conformance with docs/protocol.md: an in-process IOC (its real handshake and host tasks,
//! over loopback TCP) against a peer that speaks only from the document. The peer builds
//! raw bytes from the layouts of sections 2, 3 and 5 (no type of the messaging crate), and
//! every expected status and Goodbye code, the Goodbye's channel and what ends, is read
//! from the tables of section 7 at test time: change the document and these tests follow.

use crate::nic::fake::FakeNic;
use crate::nic::Nic;
use crate::state::WorkerState;
use crate::supervisor::{Acceptor, Cluster, Source};
use crate::worker::NicFactory;
use std::cell::RefCell;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

const DOC: &str = include_str!("../../docs/protocol.md");

/// One row of a table of section 7: its cells.
pub(crate) fn row(id: &str) -> Vec<String> {
    DOC.lines()
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        })
        .find(|c| c.len() > 2 && c[1] == id)
        .unwrap_or_else(|| panic!("docs/protocol.md has no row {id}"))
}

/// The code of a row: the number its code (or status) cell starts with.
pub(crate) fn code(id: &str) -> u16 {
    let cell = &row(id)[3];
    let digits: String = cell.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("row {id} has no code: {cell}"))
}

// Section 2: opcodes. Section 3: functions.
const SEND: u8 = 1;
const WRITE: u8 = 2;
const WRITE_IMM: u8 = 3;
const HELLO: u16 = 0x0001;
const HELLO_REPLY: u16 = 0x0002;
const KEEPALIVE: u16 = 0x0003;
const GOODBYE: u16 = 0x0004;
const POOL: u16 = 0x0101;
const POOL_UPDATE: u16 = 0x0103;
const FLUSH_REQUEST: u16 = 0x0104;
const FLUSH_REPLY: u16 = 0x0105;
const INDICATE: u16 = 0x0202;
const CFG_REQUEST: u16 = 0x0301;
const CFG_REPLY: u16 = 0x0302;
const MAX_MESSAGE: u32 = 66_560;

/// A 32-byte operation header (section 2).
fn op(opcode: u8, len: u32, handle: u64, addr: u64, imm: u32) -> Vec<u8> {
    let mut b = vec![opcode, 0, 0, 0];
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(&addr.to_be_bytes());
    b.extend_from_slice(&imm.to_be_bytes());
    b.extend_from_slice(&[0; 4]);
    b
}

/// A message (section 3): header and body, with `version` in the header.
fn msg_v(function: u16, version: u16, txn: u64, body: &[u8]) -> Vec<u8> {
    let mut b = function.to_be_bytes().to_vec();
    b.extend_from_slice(&version.to_be_bytes());
    b.extend_from_slice(&txn.to_be_bytes());
    b.extend_from_slice(body);
    b
}

fn msg(function: u16, txn: u64, body: &[u8]) -> Vec<u8> {
    msg_v(function, 1, txn, body)
}

/// A SEND operation carrying `m`.
fn send(m: &[u8]) -> Vec<u8> {
    let mut b = op(SEND, m.len() as u32, 0, 0, 0);
    b.extend_from_slice(m);
    b
}

/// A Hello body (section 5).
#[derive(Clone, Copy)]
struct Hello {
    min: u16,
    max: u16,
    role: u8,
    channel: u8,
    queue: u8,
    queues: u8,
    session: u64,
    node: u64,
    max_message: u32,
}

impl Hello {
    fn host(channel: u8, session: u64, node: u64) -> Hello {
        Hello {
            min: 1,
            max: 1,
            role: 1,
            channel,
            queue: 0,
            queues: 1,
            session,
            node,
            max_message: MAX_MESSAGE,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = self.min.to_be_bytes().to_vec();
        b.extend_from_slice(&self.max.to_be_bytes());
        b.extend_from_slice(&[self.role, self.channel, self.queue, self.queues]);
        b.extend_from_slice(&self.session.to_be_bytes());
        b.extend_from_slice(&self.node.to_be_bytes());
        b.extend_from_slice(&self.max_message.to_be_bytes());
        send(&msg(HELLO, 0, &b))
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// A received message: function, transaction context, body.
#[derive(Debug)]
struct Msg {
    function: u16,
    txn: u64,
    body: Vec<u8>,
}

/// One raw TCP connection to the IOC.
struct Conn(TcpStream);

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn(s)
    }

    /// A connection to `addr` from the local address `from` (any of 127/8 on loopback).
    fn open_from(addr: SocketAddr, from: std::net::IpAddr) -> Conn {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::new(from, 0).into()).unwrap();
        s.connect(&addr.into()).unwrap();
        let s: TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn(s)
    }

    fn put(&mut self, b: &[u8]) {
        // The IOC may already have closed: a refused write is what some rows expect.
        let _ = self.0.write_all(b);
    }

    /// Exactly `n` bytes, or `None` at the end of the stream (or a reset).
    fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match self.0.read(&mut b[got..]) {
                Ok(0) => return None,
                Ok(k) => got += k,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("no answer from the IOC: {e}"),
            }
        }
        Some(b)
    }

    /// The next message (RDMA writes to us are skipped), `None` at the end of the stream.
    fn next(&mut self) -> Option<Msg> {
        loop {
            let h = self.take(32)?;
            let len = be32(&h[4..]) as usize;
            let payload = self.take(len)?;
            if h[0] == SEND {
                return Some(Msg {
                    function: be16(&payload),
                    txn: be64(&payload[4..]),
                    body: payload[12..].to_vec(),
                });
            }
        }
    }

    /// Reads until a message of `function`; `None` if the stream ends first.
    fn until(&mut self, function: u16) -> Option<Msg> {
        loop {
            let m = self.next()?;
            if m.function == function {
                return Some(m);
            }
        }
    }

    /// Reads until the end of the stream; returns every Goodbye code seen on the way.
    fn drain(&mut self) -> Vec<u16> {
        let mut codes = Vec::new();
        while let Some(m) = self.next() {
            if m.function == GOODBYE {
                codes.push(be16(&m.body));
            }
        }
        codes
    }

    /// The HelloReply: (version, status, session token).
    fn reply(&mut self) -> (u16, u16, u64) {
        let m = self.next().expect("a HelloReply");
        assert_eq!(m.function, HELLO_REPLY);
        assert_eq!(m.body.len(), 20, "HelloReply body is 20 bytes");
        (be16(&m.body), be16(&m.body[2..]), be64(&m.body[8..]))
    }
}

/// A pool the IOC advertised (section 3, pool entry).
#[derive(Debug, Clone, Copy)]
struct Pool {
    pool_ref: u32,
    size: u32,
    addr: u64,
    handle: u64,
}

/// A host session opened by the raw peer.
struct Session {
    ctrl: Conn,
    data: Conn,
    token: u64,
    pool: Pool,
}

impl Session {
    /// Opens queue `queue` of `queues` for `node` (a further queue names `first`).
    fn open(addr: SocketAddr, node: u64, queue: u8, queues: u8, first: u64) -> Session {
        let mut ctrl = Conn::open(addr);
        let h = Hello {
            queue,
            queues,
            ..Hello::host(0, first, node)
        };
        ctrl.put(&h.bytes());
        let (v, status, token) = ctrl.reply();
        assert_eq!((v, status), (1, 0), "control channel accepted");
        let mut data = Conn::open(addr);
        data.put(
            &Hello {
                queue,
                queues,
                ..Hello::host(1, token, node)
            }
            .bytes(),
        );
        assert_eq!(data.reply(), (1, 0, token), "data channel accepted");
        let p = ctrl.until(POOL).expect("the IOC advertises its pools");
        let e = &p.body[4..];
        let pool = Pool {
            pool_ref: be32(e),
            size: be32(&e[8..]),
            addr: be64(&e[16..]),
            handle: be64(&e[24..]),
        };
        Session {
            ctrl,
            data,
            token,
            pool,
        }
    }

    /// Asks GetLink and waits for its answer: the session is alive.
    fn alive(&mut self) {
        let req = msg(CFG_REQUEST, 77, &[0, 5, 0, 0, 0, 0, 0, 0]);
        self.ctrl.put(&send(&req));
        let r = self.ctrl.until(CFG_REPLY).expect("a live session answers");
        assert_eq!(r.txn, 77, "CfgUtilReply echoes the transaction context");
        assert_eq!(be16(&r.body), 5);
    }
}

fn ioc_config(extra: &str) -> splitnet_config::IocConfig {
    // The document's plain handshake: open admission (section 5.1 has the authenticated one).
    let text = format!(
        "[fabric]\nlisten = \"127.0.0.1:7400\"\n{extra}\n[lan]\ninterface = \"lan0\"\n[auth]\nadmission = \"open\"\n"
    );
    splitnet_config::parse_ioc(&text, Path::new("test.toml")).unwrap()
}

/// Starts an IOC (its real accept step, handshake and host tasks) on a thread of its own;
/// returns its fabric address. The thread lives as long as the test process.
fn start_ioc(extra: &str) -> SocketAddr {
    start_ioc_with(extra, |_| {})
}

/// [`start_ioc`], with `prepare` applied to each worker's state before it accepts. The
/// IOC runs `fabric.workers` workers (two unless `extra` says otherwise), so a host's
/// channels and queues meet on their worker as they do in the daemon.
fn start_ioc_with(extra: &str, prepare: fn(&mut WorkerState)) -> SocketAddr {
    let extra = if extra.contains("workers") {
        extra.to_string()
    } else {
        format!("workers = 2\n{extra}")
    };
    spawn_ioc(ioc_config(&extra), None, prepare)
}

/// Starts IOC `cfg` with private key `key` (for `auth.admission = "keys"`) as
/// [`start_ioc_with`] does.
pub(crate) fn spawn_ioc(
    cfg: splitnet_config::IocConfig,
    key: Option<splitnet_fabric::auth::Key>,
    prepare: fn(&mut WorkerState),
) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let fake = |_| -> NicFactory {
                Box::new(|| Ok((Box::new(FakeNic::default()) as Box<dyn Nic>, Vec::new())))
            };
            let cluster = Cluster::start(cfg, key, 1500, true, None, fake, prepare).unwrap();
            let acceptor = Acceptor::new(Rc::new(RefCell::new(cluster)));
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let (sock, peer) = listener.accept().await.unwrap();
                acceptor.accept(
                    sock.into_std().unwrap().into(),
                    peer.to_string(),
                    Source::Ip(peer.ip()),
                );
            }
        });
    });
    rx.recv().unwrap()
}

/// Table 7.1: host A (two queues) commits `violation` on its first queue; A gets Goodbye
/// with the row's code on the channel the row names, every session of A ends, and host B
/// is not affected.
fn session_row(id: &str, violation: impl FnOnce(&mut Session)) {
    let cells = row(id);
    let channel = &cells[4];
    assert!(cells[5].contains("every session of the host"), "{cells:?}");
    let addr = start_ioc("");
    let mut a = Session::open(addr, 0xA, 0, 2, 0);
    let mut a1 = Session::open(addr, 0xA, 1, 2, a.token);
    let mut b = Session::open(addr, 0xB, 0, 1, 0);
    violation(&mut a);
    let want = code(id);
    match channel.as_str() {
        "0" => {
            assert_eq!(
                a.ctrl.drain(),
                vec![want],
                "row {id}: Goodbye({want}) on channel 0"
            );
            assert_eq!(
                a.data.drain(),
                Vec::<u16>::new(),
                "row {id}: none on channel 1"
            );
        }
        other => panic!("row {id}: Goodbye on channel {other:?}"),
    }
    // Every queue of the host ends; the other queues without a Goodbye.
    assert_eq!(
        a1.ctrl.drain(),
        Vec::<u16>::new(),
        "row {id}: queue 1 closed"
    );
    assert_eq!(
        a1.data.drain(),
        Vec::<u16>::new(),
        "row {id}: queue 1 closed"
    );
    b.alive();
}

#[test]
fn e1_unknown_opcode() {
    session_row("E1", |a| a.data.put(&[9; 32]));
}

#[test]
fn e2_send_too_long() {
    session_row("E2", |a| a.data.put(&op(SEND, MAX_MESSAGE + 1, 0, 0, 0)));
}

#[test]
fn e3_stale_handle() {
    session_row("E3", |a| {
        let p = a.pool;
        let mut w = op(WRITE_IMM, 60, p.handle ^ 1, p.addr, 0);
        w.extend_from_slice(&[0x45; 60]);
        a.data.put(&w);
    });
}

#[test]
fn e4_write_on_the_control_channel() {
    session_row("E4", |a| {
        // A valid handle, address and element: only the channel is wrong.
        let p = a.pool;
        let imm = (p.pool_ref << 24) | 60;
        let mut w = op(WRITE_IMM, 60, p.handle, p.addr, imm);
        w.extend_from_slice(&[0x45; 60]);
        a.ctrl.put(&w);
    });
}

#[test]
fn e5_unknown_function() {
    session_row("E5", |a| a.data.put(&send(&msg(0x0999, 0, &[]))));
}

#[test]
fn e6_version_in_header() {
    session_row("E6", |a| a.ctrl.put(&send(&msg_v(KEEPALIVE, 2, 0, &[]))));
}

#[test]
fn e7_body_longer_than_its_layout() {
    session_row("E7", |a| a.ctrl.put(&send(&msg(KEEPALIVE, 0, &[0]))));
}

#[test]
fn e8_hello_after_the_handshake() {
    session_row("E8", |a| {
        let t = a.token;
        a.ctrl.put(&Hello::host(0, t, 0xA).bytes())
    });
}

#[test]
fn e9_idata_length_differs_from_the_write() {
    session_row("E9", |a| {
        let p = a.pool;
        assert!(p.pool_ref < 256 && p.size >= 60);
        let imm = (p.pool_ref << 24) | 61; // element 0, 61 bytes; 60 are written
        let mut w = op(WRITE_IMM, 60, p.handle, p.addr, imm);
        w.extend_from_slice(&[0x45; 60]);
        a.data.put(&w);
    });
}

#[test]
fn e10_indication_of_an_element_never_written() {
    session_row("E10", |a| {
        let mut body = a.pool.pool_ref.to_be_bytes().to_vec();
        body.extend_from_slice(&0u32.to_be_bytes());
        body.extend_from_slice(&60u32.to_be_bytes());
        a.data.put(&send(&msg(INDICATE, 0, &body)));
    });
}

/// A BufferRecvPool body of `count` entries of the host's own (opaque handles).
fn pools(count: u16, elements: u32) -> Vec<u8> {
    let mut b = count.to_be_bytes().to_vec();
    b.extend_from_slice(&[0, 0]);
    for i in 0..u32::from(count) {
        b.extend_from_slice(&i.to_be_bytes());
        b.extend_from_slice(&elements.to_be_bytes());
        b.extend_from_slice(&2048u32.to_be_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&(0x1000_0000u64 * u64::from(i + 1)).to_be_bytes());
        b.extend_from_slice(
            &0x5eed_0000_0000_0001u64
                .wrapping_add(i.into())
                .to_be_bytes(),
        );
        b.extend_from_slice(&0u64.to_be_bytes());
    }
    b
}

#[test]
fn e11_credit_returned_that_the_initiator_does_not_hold() {
    session_row("E11", |a| {
        a.ctrl.put(&send(&msg(POOL, 1, &pools(1, 4))));
        // Element 0 is a credit the IOC holds, never written: returning it is a violation.
        let run = [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        a.ctrl.put(&send(&msg(POOL_UPDATE, 2, &run)));
    });
}

#[test]
fn e12_empty_pool() {
    session_row("E12", |a| a.ctrl.put(&send(&msg(POOL, 1, &pools(1, 0)))));
}

#[test]
fn e13_more_pools_than_the_receiver_takes() {
    // The IOC takes 16 pools of a host (an implementation setting, section 8).
    session_row("E13", |a| a.ctrl.put(&send(&msg(POOL, 1, &pools(17, 4)))));
}

#[test]
fn e14_initiator_flushes_a_pool_that_is_not_live() {
    session_row("E14", |a| {
        a.data
            .put(&send(&msg(FLUSH_REQUEST, 5, &[0, 1, 0, 0, 0, 0, 0, 200])))
    });
}

#[test]
fn e15_flush_reply_with_an_unknown_context() {
    session_row("E15", |a| a.data.put(&send(&msg(FLUSH_REPLY, 0xdead, &[]))));
}

#[test]
fn e17_silence_ends_without_goodbye() {
    let cells = row("E17");
    assert!(cells[3].starts_with("none"), "{cells:?}");
    let addr = start_ioc("keepalive_interval_ms = 100\nkeepalive_timeout_ms = 300");
    let mut a = Session::open(addr, 0xA, 0, 1, 0);
    let t = Instant::now();
    // The IOC's keepalives arrive; ours never go: after the timeout the session ends.
    assert_eq!(a.ctrl.drain(), Vec::<u16>::new());
    assert_eq!(a.data.drain(), Vec::<u16>::new());
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
}

/// Table 7.2: the first bytes of a connection, answered by a HelloReply with the row's
/// status and the IOC's highest version, then closed.
fn handshake_row(id: &str, first: &[u8]) {
    let cells = row(id);
    assert_eq!(cells[4], "HelloReply", "{cells:?}");
    let addr = start_ioc("");
    let mut c = Conn::open(addr);
    c.put(first);
    let (version, status, session) = c.reply();
    assert_eq!(status, code(id), "row {id}");
    assert_eq!(
        (version, session),
        (1, 0),
        "row {id}: highest version, no session"
    );
    assert_eq!(c.drain(), Vec::<u16>::new(), "row {id}: then closed");
}

#[test]
fn h1_first_send_is_not_a_message() {
    handshake_row("H1", &send(&[0, 1, 0]));
}

#[test]
fn h2_first_operation_is_a_write_or_too_long() {
    handshake_row("H2", &op(WRITE, 4, 1, 0, 0));
    handshake_row("H2", &op(SEND, 257, 0, 0, 0));
}

#[test]
fn h3_bad_queue_and_small_max_message() {
    let bad_queue = Hello {
        queue: 1,
        queues: 1,
        ..Hello::host(0, 0, 7)
    };
    handshake_row("H3", &bad_queue.bytes());
    let small = Hello {
        max_message: 1500,
        ..Hello::host(0, 0, 7)
    };
    handshake_row("H3", &small.bytes());
    handshake_row("H3", &send(&msg(KEEPALIVE, 0, &[])));
}

#[test]
fn h4_no_common_version() {
    // A newer host that speaks versions 2..=3 only learns that the IOC speaks up to 1.
    let newer = Hello {
        min: 2,
        max: 3,
        ..Hello::host(0, 0, 7)
    };
    handshake_row("H4", &newer.bytes());
}

#[test]
fn h5_peer_is_not_a_host() {
    handshake_row(
        "H5",
        &Hello {
            role: 2,
            ..Hello::host(0, 0, 7)
        }
        .bytes(),
    );
}

#[test]
fn h8_data_channel_of_an_unknown_token_or_another_node() {
    handshake_row("H8", &Hello::host(1, 0x1234_5678, 7).bytes());
    // The right token from another node id.
    let addr = start_ioc("");
    let mut ctrl = Conn::open(addr);
    ctrl.put(&Hello::host(0, 0, 7).bytes());
    let (_, status, token) = ctrl.reply();
    assert_eq!(status, 0);
    let mut data = Conn::open(addr);
    data.put(&Hello::host(1, token, 8).bytes());
    assert_eq!(data.reply().1, code("H8"));
}

#[test]
fn h6_ioc_full() {
    let cells = row("H6");
    assert_eq!(cells[4], "HelloReply", "{cells:?}");
    let addr = start_ioc("max_hosts = 1");
    let mut a = Session::open(addr, 0xA, 0, 1, 0);
    let mut c = Conn::open(addr);
    c.put(&Hello::host(0, 0, 0xB).bytes());
    let (version, status, session) = c.reply();
    assert_eq!((version, status, session), (1, code("H6"), 0));
    assert_eq!(c.drain(), Vec::<u16>::new(), "then closed");
    a.alive();
}

#[test]
fn h7_ioc_stopping() {
    let cells = row("H7");
    assert_eq!(cells[4], "HelloReply", "{cells:?}");
    let addr = start_ioc_with("", |ioc| ioc.stopping = true);
    let mut c = Conn::open(addr);
    c.put(&Hello::host(0, 0, 0xB).bytes());
    assert_eq!(c.reply(), (1, code("H7"), 0));
    assert_eq!(c.drain(), Vec::<u16>::new(), "then closed");
}

#[test]
fn h10_no_memory_for_the_new_sessions_pools() {
    let cells = row("H10");
    assert_eq!(cells[4], "HelloReply", "{cells:?}");
    // Every byte the registry may hold is taken before the host comes.
    let addr = start_ioc_with("", |ioc| {
        let spec = splitnet_messaging::memory::RegionSpec {
            domain: splitnet_messaging::memory::DomainId(9999),
            access: splitnet_messaging::memory::Access::REMOTE_WRITE,
            element_size: 1 << 20,
            element_count: 1,
            single_use: false,
        };
        while ioc.reg.register(spec).is_ok() {}
    });
    let mut ctrl = Conn::open(addr);
    ctrl.put(&Hello::host(0, 0, 0xB).bytes());
    let (_, status, token) = ctrl.reply();
    assert_eq!(status, 0, "the control channel is answered first");
    let mut data = Conn::open(addr);
    data.put(&Hello::host(1, token, 0xB).bytes());
    assert_eq!(data.reply(), (1, code("H10"), 0));
    assert_eq!(data.drain(), Vec::<u16>::new(), "then closed");
}

#[test]
fn h11_too_many_handshakes_at_once() {
    let cells = row("H11");
    assert!(cells[3].starts_with("none"), "{cells:?}");
    let addr = start_ioc("max_handshakes = 2");
    // Two connections that never speak hold both handshake places.
    let _silent = [Conn::open(addr), Conn::open(addr)];
    std::thread::sleep(Duration::from_millis(100));
    let mut c = Conn::open(addr);
    c.put(&Hello::host(0, 0, 0xB).bytes());
    assert!(c.next().is_none(), "closed at once, without a HelloReply");
}

/// Issue 27, item 2: one source holds at most a quarter of the handshake places; its silent
/// connections beyond them are closed at once, and a host from another source is answered.
#[test]
fn one_source_cannot_hold_every_handshake_place() {
    let addr = start_ioc("max_handshakes = 8");
    let flooder: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    // Two connections from one address that never speak hold its share (8 / 4).
    let _silent = [
        Conn::open_from(addr, flooder),
        Conn::open_from(addr, flooder),
    ];
    std::thread::sleep(Duration::from_millis(100));
    let mut third = Conn::open_from(addr, flooder);
    third.put(&Hello::host(0, 0, 0xB).bytes());
    assert!(
        third.next().is_none(),
        "the source's third is closed at once"
    );
    // Another source still has places: its host is answered.
    let mut other = Conn::open_from(addr, "127.0.0.2".parse().unwrap());
    other.put(&Hello::host(0, 0, 0xC).bytes());
    let (_, status, _) = other.reply();
    assert_eq!(status, 0, "a host from another source is admitted");
}

/// Issue 15, item 3: the timer of a control channel waiting for its data channel belongs
/// to that channel: when it fires after its session is long gone, it cannot drop a later
/// host's control channel that is waiting at that moment.
#[test]
fn a_stale_handshake_timer_cannot_act_on_a_successor() {
    let addr = start_ioc("handshake_timeout_ms = 400");
    let t0 = Instant::now();
    // Host A: a full session (its control channel's timer runs until t0 + 400 ms), ended
    // at once by a protocol error.
    let mut a = Session::open(addr, 0xA, 0, 1, 0);
    a.data.put(&[9; 32]);
    assert_eq!(a.ctrl.drain(), vec![code("E1")]);
    // Host B's control channel waits while A's timer fires; its data channel comes after.
    std::thread::sleep(Duration::from_millis(250).saturating_sub(t0.elapsed()));
    let mut ctrl = Conn::open(addr);
    ctrl.put(&Hello::host(0, 0, 0xB).bytes());
    let (_, status, token) = ctrl.reply();
    assert_eq!(status, 0);
    std::thread::sleep(Duration::from_millis(550).saturating_sub(t0.elapsed()));
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "B's own timer still runs"
    );
    let mut data = Conn::open(addr);
    data.put(&Hello::host(1, token, 0xB).bytes());
    assert_eq!(data.reply(), (1, 0, token), "B joins after A's timer fired");
    assert!(ctrl.until(POOL).is_some(), "B's session runs");
}

/// A HelloReply as a raw IOC sends it: `version`, `status`, session token 99.
fn hello_reply(version: u16, status: u16) -> Vec<u8> {
    let mut r = version.to_be_bytes().to_vec();
    r.extend_from_slice(&status.to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(&99u64.to_be_bytes());
    r.extend_from_slice(&MAX_MESSAGE.to_be_bytes());
    send(&msg(HELLO_REPLY, 0, &r))
}

/// The host's side of the handshake (`fabric::connect`, as host-driver calls it) against a
/// raw IOC at `addr`, its data channel over `path`.
/// Runs `f` to its end on a runtime of its own (a host's side of a test).
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    rt.expect("a current-thread runtime").block_on(f)
}

fn host_connect(
    addr: SocketAddr,
    path: splitnet_fabric::DataPath,
) -> Result<(), splitnet_fabric::FabricError> {
    block_on(splitnet_fabric::connect(
        || splitnet_fabric::dial_tcp(addr),
        path,
        7,
        splitnet_messaging::wire::Queue::SINGLE,
        0,
        Duration::from_secs(2),
        None,
    ))
    .map(|_| ())
}

/// Table 7.2, H9: the host's side of the handshake against a raw IOC that offers a version
/// the host does not speak.
#[test]
fn h9_host_answers_an_unusable_reply_with_goodbye() {
    let cells = row("H9");
    assert_eq!(cells[4], "Goodbye", "{cells:?}");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let ioc = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut c = Conn(s);
        let hello = c.next().expect("the host's Hello");
        assert_eq!(hello.function, HELLO);
        // Version 2, which the host (1..=1) does not speak.
        c.put(&hello_reply(2, 0));
        c.drain()
    });
    let r = host_connect(addr, splitnet_fabric::DataPath::Stream);
    assert!(r.is_err());
    assert_eq!(ioc.join().unwrap(), vec![code("H9")]);
}

/// Section 9: a host whose control channel in shared memory (channel 3) an older IOC does
/// not know (it answers UnknownSession) opens it on its socket (channel 0) instead, then
/// its data channel (channel 2), as `fabric::connect` does for host-driver.
#[test]
fn a_host_falls_back_to_its_control_socket_when_the_ioc_refuses_channel_3() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let ioc = std::thread::spawn(move || {
        let mut channels = Vec::new();
        for status in [code("H8"), 0, 0] {
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut c = Conn(s);
            let hello = c.next().expect("the host's Hello");
            assert_eq!(hello.function, HELLO);
            channels.push(hello.body[5]);
            c.put(&hello_reply(1, status));
        }
        channels
    });
    let path = splitnet_fabric::DataPath::Shm {
        pool_bytes: 1 << 20,
    };
    // The data channel's set-up would follow over a Unix socket; not over TCP.
    let e = host_connect(addr, path).expect_err("shared memory needs a Unix socket");
    assert!(e.to_string().contains("Unix socket"), "{e}");
    assert_eq!(ioc.join().unwrap(), vec![3, 0, 2]);
}
