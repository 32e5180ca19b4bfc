//! Setting a queue pair up on the data channel's TCP connection (docs/protocol.md section 10):
//! each side's [`Endpoint`], then the host's ready byte.

use super::{
    device, sys, Cq, Endpoint, Mr, Pd, Peer, Qp, Remote, Stage, VerbsStats, VerbsTransport,
    ENDPOINT_LEN, READY, RECV_BUF, RECV_DEPTH, SEND_DEPTH, SETUP_MIN, STAGE_BYTES,
};
use crate::{FabricError, Stream};
use splitnet_messaging::memory::{DomainId, SharedRegion};
use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A queue pair and its memory, before it is connected.
struct Prepared {
    // Dropped in this order (a failed set-up): the queue pair before the queue it uses.
    qp: Qp,
    cq: Cq,
    stage_mr: Mr,
    recv_mr: Mr,
    pools: SharedRegion,
    pd: Arc<Pd>,
    port: device::Port,
    psn: u32,
}

impl Prepared {
    fn new(ip: IpAddr, pools: SharedRegion) -> io::Result<Prepared> {
        let port = device::port_for(ip)?;
        let on = |what: &str| {
            let dev = port.ctx.name().to_string();
            let what = what.to_string();
            move |e: io::Error| io::Error::new(e.kind(), format!("{dev}: {what}: {e}"))
        };
        let pd = Pd::new(&port.ctx).map_err(on("protection domain"))?;
        let cq = Cq::new(&port.ctx, SEND_DEPTH + RECV_DEPTH).map_err(on("completion queue"))?;
        let qp = Qp::new(&pd, &port, &cq, SEND_DEPTH, RECV_DEPTH).map_err(on("queue pair"))?;
        let stage_mr = Mr::heap(&pd, STAGE_BYTES, sys::Access::Local)?;
        let recv_mr = Mr::heap(
            &pd,
            (RECV_DEPTH * RECV_BUF) as usize,
            sys::Access::LocalWrite,
        )?;
        let psn = random_psn();
        Ok(Prepared {
            pd,
            cq,
            qp,
            stage_mr,
            recv_mr,
            pools,
            port,
            psn,
        })
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint {
            qpn: self.qp.qpn(),
            psn: self.psn,
            gid: self.port.gid,
            mtu: self.port.mtu,
            // Each pool's key comes in a key notice once it is registered.
            rkey: 0,
            arena_addr: sys::region_addr(&self.pools),
            arena_len: self.pools.len() as u64,
            recv_buf: RECV_BUF,
            recv_depth: RECV_DEPTH,
        }
    }

    /// Posts every receive and connects to `peer`.
    fn connect(mut self, peer: &Endpoint, domain: DomainId) -> io::Result<VerbsTransport> {
        let slots: Vec<(u64, usize)> = (0..RECV_DEPTH)
            .map(|i| (u64::from(i), (i * RECV_BUF) as usize))
            .collect();
        self.qp.post_recv(&self.recv_mr, &slots, RECV_BUF)?;
        let remote = Remote {
            qpn: peer.qpn,
            psn: peer.psn,
            gid: peer.gid,
            mtu: peer.mtu.min(self.port.mtu),
        };
        self.qp.connect(&remote, self.psn)?;
        Ok(VerbsTransport {
            qp: self.qp,
            cq: self.cq,
            stage_mr: self.stage_mr,
            recv_mr: self.recv_mr,
            keys: Vec::new(),
            layout: None,
            watch: None,
            key_tx: VecDeque::new(),
            peer_keys: Vec::new(),
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
            tx_bufs: 0,
            done: Vec::new(),
            stage: Stage::new(STAGE_BYTES),
            next_wr: 1,
            unsignalled: 0,
            batch: Vec::new(),
            wcs: VecDeque::new(),
            scratch: Vec::new(),
            last_recv: None,
            repost: Vec::new(),
            failed: None,
            stats: VerbsStats {
                post_recv: 1,
                ..VerbsStats::default()
            },
        })
    }
}

/// A first packet sequence number: 24 bits, differing between connections.
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // getrandom cannot fail on Linux with a small buffer; a fixed value would do as well.
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b) & 0x00ff_ffff
}

/// The host's side of the set-up, on its data channel's connection once the HelloReply was
/// read (`unread`: bytes read after it): sends its endpoint, reads the IOC's, connects, and
/// confirms. `pools` is the arena the host lays its receive pools out in.
pub async fn offer(
    sock: Stream,
    unread: Vec<u8>,
    pools: SharedRegion,
    max_arena: u64,
    timeout: Duration,
) -> Result<VerbsTransport, FabricError> {
    let (mut s, ip, peer_ip) = tokio_tcp(sock)?;
    let work = async {
        let prepared = prepare(ip, pools).await?;
        s.write_all(&prepared.endpoint().emit()).await?;
        let peer = read_endpoint(&mut s, unread, max_arena, peer_ip).await?;
        let t = prepared.connect(&peer, DomainId(0)).map_err(verbs_err)?;
        s.write_all(&[READY]).await?;
        Ok::<_, FabricError>(t)
    };
    within(timeout, work).await
}

/// The IOC's side of the set-up, after it sent the HelloReply: reads the host's endpoint,
/// connects, answers with its own (`pools`: the arena it laid this host's pools out in), and
/// waits for the host's confirmation.
pub async fn accept(
    sock: Stream,
    unread: Vec<u8>,
    domain: DomainId,
    pools: SharedRegion,
    max_arena: u64,
    timeout: Duration,
) -> Result<VerbsTransport, FabricError> {
    let (mut s, ip, peer_ip) = tokio_tcp(sock)?;
    let work = async {
        let peer = read_endpoint(&mut s, unread, max_arena, peer_ip).await?;
        let prepared = prepare(ip, pools).await?;
        let mine = prepared.endpoint();
        let t = prepared.connect(&peer, domain).map_err(verbs_err)?;
        s.write_all(&mine.emit()).await?;
        let mut ready = [0u8; 1];
        s.read_exact(&mut ready).await?;
        if ready[0] != READY {
            return Err(FabricError::Verbs(format!(
                "the host confirmed with {:#04x}, not {READY:#04x}",
                ready[0]
            )));
        }
        Ok(t)
    };
    within(timeout, work).await
}

/// `work` within the handshake's `timeout`, and at least [`SETUP_MIN`].
async fn within<T>(
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, FabricError>>,
) -> Result<T, FabricError> {
    let timeout = timeout.max(SETUP_MIN);
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FabricError::Timeout(timeout))?
}

/// Checks that this machine can carry a data channel over verbs from `ip`: an RDMA device
/// holds it in its GID table. The error says what is missing.
pub fn check_address(ip: IpAddr) -> Result<String, FabricError> {
    let p = device::port_for(ip).map_err(verbs_err)?;
    Ok(format!(
        "{} port {} GID {}",
        p.ctx.name(),
        p.port,
        device::gid_display(&p.gid)
    ))
}

fn verbs_err(e: io::Error) -> FabricError {
    FabricError::Verbs(e.to_string())
}

/// The set-up connection as a tokio socket, with its local and its peer's addresses.
fn tokio_tcp(sock: Stream) -> Result<(tokio::net::TcpStream, IpAddr, IpAddr), FabricError> {
    let Stream::Tcp(s) = sock else {
        return Err(FabricError::Verbs(
            "RDMA set-up needs a TCP connection".into(),
        ));
    };
    let (ip, peer) = (s.local_addr()?.ip(), s.peer_addr()?.ip());
    Ok((tokio::net::TcpStream::from_std(s)?, ip, peer))
}

/// [`Prepared::new`] on a thread of the blocking pool: registering memory pins it, which
/// must not hold up the event loop's other sessions.
async fn prepare(ip: IpAddr, pools: SharedRegion) -> Result<Prepared, FabricError> {
    tokio::task::spawn_blocking(move || Prepared::new(ip, pools))
        .await
        .map_err(|e| FabricError::Verbs(format!("set-up thread: {e}")))?
        .map_err(verbs_err)
}

/// Reads the peer's endpoint: `unread` first, then the socket.
async fn read_endpoint(
    s: &mut tokio::net::TcpStream,
    unread: Vec<u8>,
    max_arena: u64,
    peer_ip: IpAddr,
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
    let e = Endpoint::parse(&b, max_arena).map_err(|e| FabricError::Verbs(e.to_string()))?;
    // The peer's queue pair is where its connection comes from: no side sends elsewhere.
    if e.gid != device::gid_of(peer_ip) {
        return Err(FabricError::Verbs(format!(
            "the peer at {peer_ip} announced GID {}, not its own",
            device::gid_display(&e.gid)
        )));
    }
    Ok(e)
}
