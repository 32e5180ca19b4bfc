//! One worker of the IOC: a thread with its own event loop, its own [`Ioc`] (hosts,
//! pools, send buffers) and its own packet socket on the NIC. The main thread hands it
//! the connections whose Hello names it ([`Cmd::Connection`]); it completes their
//! handshake, serves their sessions, reads its share of the LAN and takes the frames other
//! workers hand it.

use crate::forward::LanProgress;
use crate::hosts;
use crate::ioc::Ioc;
use crate::nic::Nic;
use crate::report::Snapshot;
use crate::shard::{Crossing, InboxRx, Shard};
use splitnet_config::IocConfig;
use splitnet_fabric::{self as fabric, FabricChannel, FabricLink, Ready, StreamConn};
use splitnet_messaging::adapter::shm::setup::Setup;
use splitnet_messaging::endpoint::Session;
use splitnet_messaging::memory::DomainId;
use splitnet_messaging::wire::{self, CfgCode, ErrorCode, Hello, Queue};
use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// How often a worker shows it is alive ([`Worker::heartbeat`]).
const HEARTBEAT: Duration = Duration::from_millis(250);
/// Time allowed for flushing every host's pools on shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// Crossing frames delivered per wake-up.
const INBOX_BATCH: usize = 64;

/// A control channel waiting for its data channel.
#[derive(Debug)]
pub struct Waiting {
    ch: FabricChannel,
    session: u64,
    node_id: u64,
    queue: Queue,
    /// For a further queue, the token of the host's first queue.
    first: u64,
}

/// What the main thread asks of a worker.
#[derive(Debug)]
pub enum Cmd {
    /// A connection whose Hello was read, for this worker: a host's control channel, or a
    /// data channel or further queue naming a session of this worker.
    Connection {
        /// The channel, its Hello taken.
        ch: Box<StreamConn>,
        /// The Hello.
        hello: Hello,
        /// The protocol version agreed.
        version: u16,
        /// The peer's address (`ADDRESS:PORT`, or `unix:PATH (pid N)`).
        peer: String,
    },
    /// The NIC's link state changed.
    Link(bool),
    /// A snapshot for the operators.
    Report(std::sync::mpsc::Sender<Snapshot>),
    /// Flush every host's pools, say goodbye, stop.
    Stop,
}

/// Opens the worker's NIC inside its event loop: the NIC, and the readiness of its
/// socket (`None`: nothing to read, as for a test's NIC).
pub type NicFactory = Box<dyn FnOnce() -> io::Result<(Box<dyn Nic>, Option<Ready>)> + Send>;

/// A running worker, as the main thread holds it.
#[derive(Debug)]
pub struct Worker {
    /// Its commands.
    pub cmds: mpsc::UnboundedSender<Cmd>,
    /// Milliseconds since the IOC's start at its last heartbeat.
    pub heartbeat: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

/// What a worker starts with.
pub struct Spec {
    /// Configuration.
    pub cfg: IocConfig,
    /// The NIC's MTU as offered to hosts.
    pub mtu: u32,
    /// NIC link state at start.
    pub link_up: bool,
    /// When the IOC started (heartbeats count from it).
    pub epoch: Instant,
    /// Its place among the workers.
    pub shard: Shard,
    /// Its inbox.
    pub inbox: InboxRx,
    /// Its NIC.
    pub nic: NicFactory,
    /// Applied to its state before it serves anyone (tests).
    pub prepare: fn(&mut Ioc),
}

impl Worker {
    /// Starts a worker thread; returns once its event loop runs (or could not start).
    pub fn spawn(spec: Spec) -> io::Result<Worker> {
        let (cmds, rx) = mpsc::unbounded_channel();
        let heartbeat = Arc::new(AtomicU64::new(0));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let beat = heartbeat.clone();
        let name = format!("ioc-worker-{}", spec.shard.index);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, run(spec, rx, beat, started_tx));
        })?;
        match started_rx.recv() {
            Ok(Ok(())) => Ok(Worker {
                cmds,
                heartbeat,
                thread,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other("worker thread ended at start")),
        }
    }

    /// Waits for the thread to end (after [`Cmd::Stop`]).
    pub fn join(self) {
        if self.thread.join().is_err() {
            warn!("a worker thread panicked");
        }
    }
}

/// The worker's event loop: its LAN, inbox and heartbeat tasks, and its commands.
async fn run(
    spec: Spec,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    beat: Arc<AtomicU64>,
    started: std::sync::mpsc::Sender<io::Result<()>>,
) {
    let Spec {
        cfg,
        mtu,
        link_up,
        epoch,
        shard,
        inbox,
        nic,
        prepare,
    } = spec;
    let (nic, ready) = match nic() {
        Ok(n) => n,
        Err(e) => {
            let _ = started.send(Err(e));
            return;
        }
    };
    let ioc = Rc::new(RefCell::new(Ioc::worker(cfg, nic, mtu, link_up, shard)));
    prepare(&mut ioc.borrow_mut());
    let mut tasks = vec![
        tokio::task::spawn_local(deliver_crossed(ioc.clone(), inbox)),
        tokio::task::spawn_local(heartbeat(beat, epoch)),
    ];
    if let Some(ready) = ready {
        tasks.push(tokio::task::spawn_local(lan(ioc.clone(), ready)));
    }
    let _ = started.send(Ok(()));
    while let Some(cmd) = cmds.recv().await {
        match cmd {
            Cmd::Connection {
                ch,
                hello,
                version,
                peer,
            } => {
                tokio::task::spawn_local(handshake(ioc.clone(), *ch, hello, version, peer));
            }
            Cmd::Link(up) => link_change(&mut ioc.borrow_mut(), up),
            Cmd::Report(reply) => {
                let mut st = ioc.borrow_mut();
                st.count_nic_drops();
                let _ = reply.send(st.snapshot());
            }
            Cmd::Stop => break,
        }
    }
    for t in tasks {
        t.abort();
    }
    shutdown(&ioc).await;
}

/// Completes the handshake of a connection the main thread read the Hello of.
async fn handshake(
    ioc: Rc<RefCell<Ioc>>,
    mut ch: StreamConn,
    hello: Hello,
    version: u16,
    peer: String,
) {
    let timeout = ioc.borrow().cfg.fabric.handshake_timeout();
    let refuse = |ch, status: ErrorCode, why: &str| {
        ioc.borrow_mut().stats.handshake_failures += 1;
        warn!(%peer, ?status, "connection refused: {why}");
        fabric::refuse(ch, version, status, timeout)
    };
    if fabric::is_control(hello.channel) {
        // A control channel in shared memory needs the local socket.
        let shm = hello.channel == fabric::shm::SHM_CONTROL_CHANNEL;
        if shm && !matches!(ch.stream(), fabric::Stream::Unix(_)) {
            return refuse(ch, ErrorCode::Refused, "shared memory asked for over TCP").await;
        }
        let admitted = {
            let mut st = ioc.borrow_mut();
            if st.stopping {
                Err((ErrorCode::ShuttingDown, "shutting down"))
            } else if !hello.queue.is_first()
                && st
                    .first_queue(hello.session, hello.node_id, hello.queue)
                    .is_none()
            {
                // A further queue joins the session of the host's first queue.
                Err((
                    ErrorCode::UnknownSession,
                    "queue of a host whose first queue is not connected",
                ))
            } else if !st.shard.admit(st.cfg.fabric.max_hosts as usize) {
                Err((ErrorCode::Busy, "max_hosts reached"))
            } else {
                // Counted from here: the session's place is taken while its reply is sent.
                st.admitting += 1;
                Ok(st.new_session())
            }
        };
        let (session, token) = match admitted {
            Ok(s) => s,
            Err((status, why)) => return refuse(ch, status, why).await,
        };
        fabric::post_reply(&mut ch, version, ErrorCode::Ok, token);
        let opened = match shm {
            true => shm_channel(ch, DomainId(session as u32), None, timeout)
                .await
                .map(|t| FabricChannel::Shm(Box::new(t))),
            false => fabric::flush(&mut ch, timeout)
                .await
                .map(|()| FabricChannel::Stream(ch)),
        };
        {
            let mut st = ioc.borrow_mut();
            st.admitting -= 1;
            let ch = match opened {
                Ok(ch) => ch,
                Err(e) => {
                    st.stats.handshake_failures += 1;
                    st.publish_load();
                    warn!(%peer, "cannot open the control channel: {e}");
                    return;
                }
            };
            let waiting = Waiting {
                ch,
                session,
                node_id: hello.node_id,
                queue: hello.queue,
                first: hello.session,
            };
            st.pending.insert(token, waiting);
            st.publish_load();
        }
        debug!(%peer, session, "control channel open, waiting for the data channel");
        // A host that never opens its data channel is dropped after the handshake timeout;
        // the token names this control channel alone, never a later one.
        tokio::time::sleep(timeout).await;
        let mut st = ioc.borrow_mut();
        if st.pending.remove(&token).is_some() {
            st.stats.handshake_failures += 1;
            st.publish_load();
            warn!(%peer, session, "no data channel within {timeout:?}; dropped");
        }
        return;
    }
    // A data channel over shared memory needs the local socket.
    let shm = hello.channel == fabric::shm::SHM_CHANNEL;
    if shm && !matches!(ch.stream(), fabric::Stream::Unix(_)) {
        return refuse(ch, ErrorCode::Refused, "shared memory asked for over TCP").await;
    }
    // A data channel joins the control channel whose token it names, from the same node.
    let joined = {
        let mut st = ioc.borrow_mut();
        let w = match st.pending.get(&hello.session) {
            Some(w) if w.node_id == hello.node_id => st.pending.remove(&hello.session),
            _ => None,
        };
        st.publish_load();
        w
    };
    let Some(w) = joined else {
        return refuse(ch, ErrorCode::UnknownSession, "unknown session").await;
    };
    let (session, token) = (w.session, hello.session);
    let domain = DomainId(session as u32);
    // Over shared memory the pools for this host lie in an arena the host maps and places
    // its frames in.
    let arena = match shm {
        true => {
            let size = Setup::pool_size_for(ioc.borrow().cfg.pools.max_granted_bytes);
            match fabric::shm::PoolArena::new(c"splitnet-ioc-pools", size) {
                Ok(a) => Some(a),
                Err(e) => {
                    warn!(%peer, "cannot make a pool arena for a new host: {e}");
                    return refuse(ch, ErrorCode::ResourceLimit, "out of pool memory").await;
                }
            }
        }
        false => None,
    };
    if let Some(a) = &arena {
        // A new session's domain has no regions yet, so this cannot be refused.
        let attached = ioc.borrow_mut().reg.attach_arena(domain, a.region());
        if let Err(e) = attached {
            warn!(%peer, "cannot lay out pools for a new host: {e}");
            return refuse(ch, ErrorCode::ResourceLimit, "out of pool memory").await;
        }
    }
    let mut s = Session::new(domain, ioc.borrow().cfg.pools.session_config());
    let started = s.start(&mut ioc.borrow_mut().reg);
    if let Err(e) = started {
        warn!(%peer, "cannot register pools for a new host: {e}");
        ioc.borrow_mut().free_domain(domain);
        return refuse(ch, ErrorCode::ResourceLimit, "out of pool memory").await;
    }
    // The reply goes first on the data channel, ahead of anything posted to the host later.
    fabric::post_reply(&mut ch, version, ErrorCode::Ok, token);
    let data = if let Some(arena) = arena {
        match shm_channel(ch, domain, Some(arena), timeout).await {
            Ok(t) => FabricChannel::Shm(Box::new(t)),
            Err(e) => {
                ioc.borrow_mut().stats.handshake_failures += 1;
                warn!(%peer, session, "shared memory refused: {e}");
                ioc.borrow_mut().free_domain(domain);
                return;
            }
        }
    } else {
        FabricChannel::Stream(ch)
    };
    let tl = match FabricLink::new(s, w.ch, data) {
        Ok(tl) => tl,
        Err(e) => {
            warn!(%peer, "cannot register the host's sockets: {e}");
            ioc.borrow_mut().free_domain(domain);
            return;
        }
    };
    let FabricLink { ready, link } = tl;
    let peer = if shm {
        format!("{peer}, shared memory")
    } else {
        peer
    };
    let added = ioc.borrow_mut().add_host(
        session,
        token,
        w.node_id,
        w.queue,
        w.first,
        link,
        peer.clone(),
    );
    match added {
        Some(wake) => hosts::serve(ioc, session, ready, wake).await,
        None => {
            warn!(%peer, session, "the host's first queue left while this queue connected; closed")
        }
    }
}

/// Sends the HelloReply of a shared-memory channel, then takes the host's rings, doorbell
/// and (a data channel's) pool arena over the socket and answers, with `arena` for a data
/// channel ([`fabric::shm::accept`]).
async fn shm_channel(
    mut ch: StreamConn,
    domain: DomainId,
    arena: Option<fabric::shm::PoolArena>,
    timeout: Duration,
) -> Result<fabric::shm::ShmTransport, fabric::FabricError> {
    fabric::flush(&mut ch, timeout).await?;
    let fabric::Stream::Unix(sock) = ch.into_stream() else {
        return Err(fabric::FabricError::Shm("not a Unix socket".into()));
    };
    fabric::shm::accept(sock, domain, wire::MAX_MESSAGE_LEN, arena, timeout).await
}

/// Moves frames from the NIC to the hosts.
async fn lan(ioc: Rc<RefCell<Ioc>>, ready: Ready) {
    loop {
        let mut g = match ready.readable().await {
            Ok(g) => g,
            Err(e) => {
                warn!("NIC readiness failed: {e}");
                return;
            }
        };
        let (progress, freed) = {
            let mut st = ioc.borrow_mut();
            (st.drive_lan(), st.buffers_freed.clone())
        };
        match progress {
            LanProgress::Drained => g.clear_ready(),
            // More may be waiting: let the hosts' tasks run, then continue.
            LanProgress::Budget => tokio::task::yield_now().await,
            // Every buffer is queued towards a host: wait until one is written.
            LanProgress::NoBuffers => freed.notified().await,
        }
    }
}

/// Delivers the frames other workers hand this one to its hosts.
async fn deliver_crossed(ioc: Rc<RefCell<Ioc>>, mut inbox: InboxRx) {
    let mut frames: Vec<Crossing> = Vec::with_capacity(INBOX_BATCH);
    loop {
        if inbox.recv(&mut frames, INBOX_BATCH).await == 0 {
            return;
        }
        ioc.borrow_mut().deliver_crossed(&frames);
        frames.clear();
    }
}

/// Shows the main thread this worker's loop runs: a loop stuck in one task stops it, and
/// the main thread stops feeding the service watchdog.
async fn heartbeat(beat: Arc<AtomicU64>, epoch: Instant) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tick.tick().await;
        beat.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Tells every host of this worker that the NIC's link changed.
fn link_change(st: &mut Ioc, up: bool) {
    if st.link_up == up {
        return;
    }
    st.link_up = up;
    let change = wire::LinkChange { up, mtu: st.mtu }.emit();
    for h in st.hosts.values_mut().filter(|h| h.queue.is_first()) {
        if let Some(link) = h.link.as_mut() {
            link.session_mut().cfg_request(CfgCode::LinkChange, &change);
        }
    }
    st.kick_hosts();
}

/// SIGTERM: flush every host's pools (both directions), say goodbye, stop.
async fn shutdown(ioc: &Rc<RefCell<Ioc>>) {
    {
        let mut st = ioc.borrow_mut();
        st.stopping = true;
        if !st.hosts.is_empty() {
            info!(
                hosts = st.hosts.len(),
                worker = st.shard.index,
                "shutting down: flushing pools with every host"
            );
        }
        let Ioc { reg, hosts, .. } = &mut *st;
        for h in hosts.values_mut() {
            if let Some(link) = h.link.as_mut() {
                link.session_mut().start_flush(reg);
            }
        }
        st.kick_hosts();
    }
    let deadline = Instant::now() + FLUSH_TIMEOUT;
    loop {
        let done = ioc
            .borrow()
            .hosts
            .values()
            .all(|h| h.link.as_ref().is_none_or(|l| l.session().is_flushed()));
        if done || Instant::now() >= deadline {
            if !done {
                warn!("pool flush incomplete within {FLUSH_TIMEOUT:?}");
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut st = ioc.borrow_mut();
    let sessions: Vec<u64> = st.hosts.keys().copied().collect();
    for s in sessions {
        if let Some(link) = st.hosts.get_mut(&s).and_then(|h| h.link.as_mut()) {
            link.goodbye(ErrorCode::ShuttingDown);
        }
        st.remove_host(s, "IOC shutting down", None);
    }
}
