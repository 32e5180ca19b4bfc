//! Setting a queue pair up (docs/protocol.md section 10): each side's [`Endpoint`] on the
//! data channel's TCP connection, then the host's connection request to the IOC's
//! listener through the RDMA connection manager, carrying the token the IOC sent.

use super::cm::CmId;
use super::device::Context;
use super::listener::Expected;
use super::{
    sys, Cq, Endpoint, Mr, Pd, Peer, PeerKeys, Qp, Request, Stage, Token, VerbsStats,
    VerbsTransport, Windows, CONTROL_RECV_DEPTH, CONTROL_STAGE_BYTES, ENDPOINT_LEN, RECV_BUF,
    RECV_DEPTH, SEND_DEPTH, SETUP_MIN, STAGE_BYTES,
};
use crate::{FabricError, Stream};
use splitnet_messaging::memory::{DomainId, SharedRegion};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// ACK timeout of a queue pair: 4.096 us x 2^14 = 67 ms before a retransmission, 7 retries:
/// a peer silent for about half a second breaks the connection (the keepalive notices
/// sooner).
const ACK_TIMEOUT: u8 = 14;
/// The connection manager's event for a connection established.
const ESTABLISHED: u32 = rdma_mummy_sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED;

/// A queue pair and its memory, before it is connected.
struct Prepared {
    // Dropped in this order (a failed set-up): the queue pair before the queue it uses.
    qp: Qp,
    cq: Cq,
    stage_mr: Mr,
    recv_mr: Mr,
    pools: Option<SharedRegion>,
    /// Grant each element through a memory window of its own (a data channel on a device
    /// that has them).
    windows: bool,
    pd: Arc<Pd>,
    id: Arc<CmId>,
}

/// Waits for the connection request of the host whose data channel's TCP connection comes
/// from `host`. An IPv4 host on a dual-stack listener is `::ffff:a.b.c.d` there, and
/// `a.b.c.d` to the connection manager.
fn expect_from(host: SocketAddr) -> Result<Expected, FabricError> {
    Expected::new(host.ip().to_canonical())
}

/// Whether element windows are used where the device has them: yes, unless the
/// environment says `SPLITNET_VERBS_WINDOWS=off` (then the peer writes each pool with the
/// pool's key, and only the registry's checks stop a second write into an element).
fn windows_wanted() -> bool {
    std::env::var("SPLITNET_VERBS_WINDOWS").map_or(true, |v| v != "off")
}

/// Send staging bytes and receives posted of a queue pair: a data channel's (`pools`: its
/// arena) or a control channel's.
fn shape(pools: &Option<SharedRegion>) -> (usize, u32) {
    match pools {
        Some(_) => (STAGE_BYTES, RECV_DEPTH),
        None => (CONTROL_STAGE_BYTES, CONTROL_RECV_DEPTH),
    }
}

impl Prepared {
    /// A queue pair on the device `id` resolved to, its memory registered and its
    /// receives posted; a data channel's with its pool arena `pools`.
    fn new(id: &Arc<CmId>, pools: Option<SharedRegion>) -> io::Result<Prepared> {
        let (stage_bytes, recv_depth) = shape(&pools);
        let ctx = Context::of(id)?;
        let on = |what: &str| {
            let dev = ctx.name().to_string();
            let what = what.to_string();
            move |e: io::Error| io::Error::new(e.kind(), format!("{dev}: {what}: {e}"))
        };
        id.set_ack_timeout(ACK_TIMEOUT).map_err(on("ACK timeout"))?;
        let pd = Pd::new(&ctx).map_err(on("protection domain"))?;
        let cq = Cq::new(&ctx, SEND_DEPTH + recv_depth).map_err(on("completion queue"))?;
        let mut qp = Qp::new(id, &pd, &cq, SEND_DEPTH, recv_depth).map_err(on("queue pair"))?;
        let stage_mr = Mr::heap(&pd, stage_bytes, sys::Access::Local)?;
        let recv_mr = Mr::heap(
            &pd,
            (recv_depth * RECV_BUF) as usize,
            sys::Access::LocalWrite,
        )?;
        let slots: Vec<(u64, usize)> = (0..recv_depth)
            .map(|i| (u64::from(i), (i * RECV_BUF) as usize))
            .collect();
        qp.post_recv(&recv_mr, &slots, RECV_BUF)?;
        let wanted = windows_wanted();
        let windows = pools.is_some() && wanted && ctx.has_windows();
        // A data channel without element windows says why, once per queue pair: each pool
        // then has a key, and only the registry's checks stop a second write into an element.
        if pools.is_some() && !windows {
            let (qpn, device) = (qp.qpn(), ctx.name());
            if wanted {
                tracing::warn!(
                    qpn,
                    device,
                    "RDMA element windows off: the device has no memory windows; the peer writes each pool with the pool's key"
                );
            } else {
                tracing::info!(
                    qpn,
                    device,
                    "RDMA element windows off: SPLITNET_VERBS_WINDOWS=off; the peer writes each pool with the pool's key"
                );
            }
        }
        Ok(Prepared {
            windows,
            pd,
            id: id.clone(),
            cq,
            qp,
            stage_mr,
            recv_mr,
            pools,
        })
    }

    /// The transport, once the connection is established.
    fn connected(mut self, peer: &Endpoint, domain: DomainId) -> io::Result<VerbsTransport> {
        // A data channel's peer has pools; a control channel's none.
        if self.pools.is_some() != (peer.arena_len > 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer's pool arena does not match the channel (a data channel has one, a control channel none)",
            ));
        }
        self.qp.set_min_rnr_timer()?;
        let stage = Stage::new(shape(&self.pools).0);
        let bell = sys::Bell::new(&[self.cq.fd(), self.id.events_fd()])?;
        Ok(VerbsTransport {
            qp: self.qp,
            mws: Vec::new(),
            cq: self.cq,
            id: self.id,
            bell,
            stage_mr: self.stage_mr,
            recv_mr: self.recv_mr,
            windows: self.windows.then(Windows::default),
            keys: Vec::new(),
            retired: Vec::new(),
            layout: None,
            watch: None,
            key_tx: Vec::new(),
            window_tx: Vec::new(),
            peer_keys: PeerKeys::default(),
            binding: None,
            windowed: 0,
            keyed_said: false,
            pools: self.pools,
            pd: self.pd,
            peer: Peer {
                arena_addr: peer.arena_addr,
                arena_len: peer.arena_len,
                recv_buf: peer.recv_buf,
            },
            domain,
            writes_allowed: false,
            tx: VecDeque::new(),
            tx_bytes: 0,
            held: 0,
            done: Vec::new(),
            stage,
            next_wr: 1,
            unsignalled: 0,
            batch: Vec::new(),
            wcs: VecDeque::new(),
            scratch: Vec::new(),
            last_recv: None,
            repost: Vec::new(),
            failed: None,
            progress: None,
            stall: super::SEND_STALL,
            stats: VerbsStats {
                post_recv: 1,
                ..VerbsStats::default()
            },
        })
    }
}

/// This side's endpoint: its arena (none on a control channel) and receives, and the token
/// (the IOC's; zero from the host).
fn endpoint(pools: &Option<SharedRegion>, token: Token) -> Endpoint {
    Endpoint {
        token,
        arena_addr: pools.as_ref().map_or(0, sys::region_addr),
        arena_len: pools.as_ref().map_or(0, |p| p.len() as u64),
        recv_buf: RECV_BUF,
        recv_depth: shape(pools).1,
    }
}

/// A connection token: 128 random bits.
pub(super) fn random_token() -> Token {
    let mut t = [0u8; 16];
    // getrandom cannot fail on Linux with a small buffer; should it, the IOC's token map
    // still never holds one twice.
    let _ = getrandom::fill(&mut t);
    t
}

/// The host's side of the set-up, on its data channel's connection once the HelloReply was
/// read (`unread`: bytes read after it): sends its endpoint, reads the IOC's, and connects
/// through the connection manager to the IOC's address and port with the IOC's token.
/// `pools` is the arena a data channel's host lays its receive pools out in (a control
/// channel: none).
pub async fn offer(
    sock: Stream,
    unread: Vec<u8>,
    pools: Option<SharedRegion>,
    max_arena: u64,
    timeout: Duration,
) -> Result<VerbsTransport, FabricError> {
    let (mut s, ip, ioc) = tokio_tcp(sock)?;
    let deadline = Instant::now() + timeout.max(SETUP_MIN);
    let work = async {
        s.write_all(&endpoint(&pools, [0; 16]).emit()).await?;
        let peer = read_endpoint(&mut s, unread, max_arena).await?;
        let p = blocking(move || request(ip, ioc, peer.token, pools, deadline)).await?;
        p.connected(&peer, DomainId(0)).map_err(verbs_err)
    };
    within(deadline, work).await
}

/// The IOC's side of the set-up, after it sent the HelloReply: reads the host's endpoint,
/// answers with its own (`pools`: the arena it laid this host's pools out in; none for a
/// control channel) and a new token, and accepts the host's connection request with that
/// token (from the host's address: see [`listen`](super::listen)).
pub async fn accept(
    sock: Stream,
    unread: Vec<u8>,
    domain: DomainId,
    pools: Option<SharedRegion>,
    max_arena: u64,
    timeout: Duration,
) -> Result<VerbsTransport, FabricError> {
    let (mut s, _, host) = tokio_tcp(sock)?;
    let deadline = Instant::now() + timeout.max(SETUP_MIN);
    let work = async {
        let peer = read_endpoint(&mut s, unread, max_arena).await?;
        let mut expected = expect_from(host)?;
        s.write_all(&endpoint(&pools, expected.token()).emit())
            .await?;
        let id = expected.request().await?;
        let p = blocking(move || answer(id, host, pools, deadline)).await?;
        p.connected(&peer, domain).map_err(verbs_err)
    };
    within(deadline, work).await
}

/// The host's connection: resolves `ioc` from `ip`, makes its queue pair, and requests the
/// connection with `token`; returns once it is established.
fn request(
    ip: IpAddr,
    ioc: SocketAddr,
    token: Token,
    pools: Option<SharedRegion>,
    deadline: Instant,
) -> io::Result<Prepared> {
    let id = Arc::new(CmId::new()?);
    id.resolve(ip, ioc, deadline)?;
    let p = Prepared::new(&id, pools)?;
    id.connect(&Request { token }.emit())?;
    let what = format!("connecting to {ioc}");
    id.expect(ESTABLISHED, &what, deadline)?;
    Ok(p)
}

/// The IOC's: accepts the connection request `id` (from `host`) with a queue pair of its
/// own; returns once it is established.
fn answer(
    id: CmId,
    host: SocketAddr,
    pools: Option<SharedRegion>,
    deadline: Instant,
) -> io::Result<Prepared> {
    let id = Arc::new(id);
    let p = Prepared::new(&id, pools)?;
    id.accept(&[])?;
    id.expect(ESTABLISHED, &format!("accepting {host}"), deadline)?;
    Ok(p)
}

/// `work` before `deadline`.
async fn within<T>(
    deadline: Instant,
    work: impl std::future::Future<Output = Result<T, FabricError>>,
) -> Result<T, FabricError> {
    let left = deadline.saturating_duration_since(Instant::now());
    tokio::time::timeout_at(deadline.into(), work)
        .await
        .map_err(|_| FabricError::Timeout(left))?
}

/// An I/O error of the verbs calls as a fabric error.
pub(super) fn verbs_err(e: io::Error) -> FabricError {
    FabricError::Verbs(e.to_string())
}

/// The set-up connection as a tokio socket, with its local address and its peer's.
fn tokio_tcp(sock: Stream) -> Result<(tokio::net::TcpStream, IpAddr, SocketAddr), FabricError> {
    let Stream::Tcp(s) = sock else {
        return Err(FabricError::Verbs(
            "RDMA set-up needs a TCP connection".into(),
        ));
    };
    let (ip, peer) = (s.local_addr()?.ip(), s.peer_addr()?);
    Ok((tokio::net::TcpStream::from_std(s)?, ip, peer))
}

/// `f` on a thread of the blocking pool: registering memory pins it and the connection
/// manager's steps wait for answers, neither of which may hold up the event loop's other
/// sessions.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<T, FabricError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| FabricError::Verbs(format!("set-up thread: {e}")))?
        .map_err(verbs_err)
}

/// Reads the peer's endpoint: `unread` first, then the socket.
async fn read_endpoint(
    s: &mut tokio::net::TcpStream,
    unread: Vec<u8>,
    max_arena: u64,
) -> Result<Endpoint, FabricError> {
    if unread.len() > ENDPOINT_LEN {
        return Err(FabricError::Verbs(format!(
            "{} bytes after the handshake, not an RDMA set-up",
            unread.len()
        )));
    }
    let mut b = [0u8; ENDPOINT_LEN];
    b[..unread.len()].copy_from_slice(&unread);
    s.read_exact(&mut b[unread.len()..]).await?;
    Endpoint::parse(&b, max_arena).map_err(|e| FabricError::Verbs(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_ip(name: &str) -> IpAddr {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name}: an address an RDMA device holds"))
            .parse()
            .unwrap()
    }

    fn arena() -> crate::shm::PoolArena {
        crate::shm::PoolArena::new(c"verbs-cm-test", 1 << 20).unwrap()
    }

    /// The IOC's listener on `ip`, port 7410, and a runtime to wait for requests on.
    fn listening(ip: IpAddr) -> (SocketAddr, tokio::runtime::Runtime) {
        let ioc = SocketAddr::new(ip, 7410);
        super::super::listen(ioc).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (ioc, rt)
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn refused(r: io::Result<Prepared>) -> String {
        let e = r
            .err()
            .expect("a connection request that should be refused")
            .to_string();
        assert!(e.contains("refused by the peer"), "{e}");
        e
    }

    /// The IOC's listener hands a connection request only to the set-up that sent its
    /// token, only from the address it sent it to, and only once: a request with a token
    /// nobody sent, or with the right token from another address, is refused and leaves
    /// the set-up waiting; the right one connects; the same token again is refused.
    #[test]
    #[ignore = "needs an RDMA device holding SPLITNET_VERBS_ADDR and SPLITNET_VERBS_ALIAS (tests/e2e/50-rdma-vms.sh)"]
    fn a_connection_request_needs_its_token_from_the_address_it_was_sent_to() {
        let (ip, alias) = (
            env_ip("SPLITNET_VERBS_ADDR"),
            env_ip("SPLITNET_VERBS_ALIAS"),
        );
        let (ioc, rt) = listening(ip);
        let host = SocketAddr::new(ip, 40000);
        let (a, b) = (arena(), arena());
        let mut expected = Expected::new(ip).unwrap();
        let token = expected.token();

        refused(request(
            ip,
            ioc,
            random_token(),
            Some(a.region()),
            deadline(),
        ));
        refused(request(alias, ioc, token, Some(a.region()), deadline()));

        let region = Some(a.region());
        let connecting = std::thread::spawn(move || request(ip, ioc, token, region, deadline()));
        let id = rt.block_on(expected.request()).unwrap();
        let ioc_side = answer(id, host, Some(b.region()), deadline()).unwrap();
        let host_side = connecting.join().unwrap().unwrap();
        drop((host_side, ioc_side));

        refused(request(ip, ioc, token, Some(a.region()), deadline()));
    }

    /// An IOC listening on every address of both families (`fabric.listen = "[::]:PORT"`)
    /// takes an IPv4 host's connection request: its TCP connection came from the host's
    /// IPv4-mapped IPv6 address, the connection request from its IPv4 address.
    #[test]
    #[ignore = "needs an RDMA device holding SPLITNET_VERBS_ADDR, and a process of its own (tests/e2e/50-rdma-vms.sh)"]
    fn a_dual_stack_listener_takes_an_ipv4_host() {
        let ip = env_ip("SPLITNET_VERBS_ADDR");
        assert!(ip.is_ipv4(), "SPLITNET_VERBS_ADDR: an IPv4 address");
        let (_, rt) = listening("::".parse().unwrap());
        let ioc = SocketAddr::new(ip, 7410);
        let IpAddr::V4(v4) = ip else { unreachable!() };
        let host = SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), 40000);
        let mut expected = expect_from(host).unwrap();
        let token = expected.token();
        let (a, b) = (arena(), arena());
        let region = Some(a.region());
        let connecting = std::thread::spawn(move || request(ip, ioc, token, region, deadline()));
        let waited = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), expected.request()).await
        });
        let Ok(id) = waited else {
            let why = connecting.join().unwrap().err();
            panic!("the request never reached the set-up: {why:?}");
        };
        let ioc_side = answer(id.unwrap(), host, Some(b.region()), deadline()).unwrap();
        let host_side = connecting.join().unwrap().unwrap();
        drop((host_side, ioc_side));
    }

    /// A peer that takes no SEND (its application never reposts its receives; its adapter
    /// answers "receiver not ready" and this side's retries never end) breaks the queue pair
    /// once sends have been outstanding for the stall time with none completing: the session
    /// ends instead of holding its sends forever.
    #[test]
    #[ignore = "needs an RDMA device holding SPLITNET_VERBS_ADDR (tests/e2e/50-rdma-vms.sh)"]
    fn a_peer_that_takes_no_send_breaks_the_queue_pair_after_the_stall_time() {
        use splitnet_messaging::adapter::{Channel, Op, Payload};
        let ip = env_ip("SPLITNET_VERBS_ADDR");
        let (ioc, rt) = listening(ip);
        // Two control channels (no arenas): the IOC's side is never polled.
        let mut expected = Expected::new(ip).unwrap();
        let token = expected.token();
        let connecting = std::thread::spawn(move || request(ip, ioc, token, None, deadline()));
        let id = rt.block_on(expected.request()).unwrap();
        let peer = endpoint(&None, [0; 16]);
        let _ioc_side = answer(id, ioc, None, deadline())
            .unwrap()
            .connected(&peer, DomainId(1))
            .unwrap();
        let mut host = connecting
            .join()
            .unwrap()
            .unwrap()
            .connected(&peer, DomainId(0))
            .unwrap();
        host.stall = Duration::from_secs(2);
        let start = Instant::now();
        let e = loop {
            for _ in 0..16 {
                host.post(Op::Send, &[], Payload::Bytes(vec![7; 64]));
            }
            if let Err(e) = host.flush() {
                break e.to_string();
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "sends stalled for a minute and the queue pair is still up"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(e.contains("the peer took no send for 2s"), "{e}");
        // The peer's posted receives took their share first.
        assert!(
            host.stats.send_tx >= u64::from(CONTROL_RECV_DEPTH),
            "{}",
            host.stats
        );
    }
}
