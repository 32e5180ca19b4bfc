//! Start-up, the fabric listener with its handshake, the LAN and link-state tasks, and
//! graceful shutdown.

use crate::forward::LanProgress;
use crate::hosts;
use crate::ioc::Ioc;
use splitnet_config::{IocConfig, Promiscuous};
use splitnet_messaging::endpoint::Session;
use splitnet_messaging::fabric::{self, Ready, TcpLink};
use splitnet_messaging::memory::DomainId;
use splitnet_messaging::service::loglimit::LogLimit;
use splitnet_messaging::service::{self, notify};
use splitnet_messaging::sys::{netdev, packet::PacketSocket};
use splitnet_messaging::wire::fmt_mac;
use splitnet_messaging::wire::{self, CfgCode, ErrorCode, Queue, Role};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{debug, info, warn};

/// How often the NIC's link state and MTU are checked.
const LINK_POLL: Duration = Duration::from_millis(250);
/// Time allowed for flushing every host's pools on shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// A start-up failure: the one line printed before exiting.
#[derive(Debug, Error)]
pub enum StartError {
    /// The LAN interface could not be opened.
    #[error("cannot open LAN interface {name}: {source} (does it exist? needs CAP_NET_RAW and CAP_NET_ADMIN)")]
    Lan {
        /// Interface.
        name: String,
        /// Cause.
        source: io::Error,
    },
    /// The fabric address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// Address.
        addr: std::net::SocketAddr,
        /// Cause.
        source: io::Error,
    },
    /// The metrics listener or the control socket could not be opened.
    #[error(transparent)]
    Endpoint(#[from] service::EndpointError),
    /// Signal handlers or reactor registration failed.
    #[error("cannot set up the event loop: {0}")]
    Runtime(#[from] io::Error),
}

/// A control channel waiting for its data channel.
#[derive(Debug)]
pub(crate) struct Waiting {
    ch: fabric::TcpChannel,
    session: u64,
    node_id: u64,
    queue: Queue,
    /// For a further queue, the token of the host's first queue.
    first: u64,
}

/// Control channels waiting for their data channel, by the token the data channel must name.
pub(crate) type Pending = Rc<RefCell<HashMap<u64, Waiting>>>;

/// Counts a connection in its handshake while it lives.
struct InHandshake(Rc<Cell<u32>>);

impl Drop for InHandshake {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// Runs the IOC until SIGTERM/SIGINT.
pub async fn run(cfg: IocConfig, control_socket: Option<PathBuf>) -> Result<(), StartError> {
    let name = cfg.lan.interface.clone();
    let lan_err = |source| StartError::Lan {
        name: name.clone(),
        source,
    };
    netdev::set_up(&name).map_err(lan_err)?;
    let nic = PacketSocket::open(&name).map_err(lan_err)?;
    if cfg.lan.promiscuous != Promiscuous::Off {
        nic.set_promiscuous().map_err(lan_err)?;
    }
    let mtu = match cfg.lan.mtu {
        Some(m) => m,
        None => netdev::mtu(&name).map_err(lan_err)?,
    };
    let link_up = netdev::is_running(&name).unwrap_or(false);
    let nic_ready = Ready::new(&nic)?;
    let handshakes = Rc::new(Cell::new(0u32));
    let mut refusals = LogLimit::new(Duration::from_secs(5));
    let listen = cfg.fabric.listen;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: listen,
            source,
        })?;
    info!(lan = %name, mac = %fmt_mac(&netdev::mac(&name).unwrap_or_default()), mtu, link_up, %listen, "IOC ready");
    let ioc = Rc::new(RefCell::new(Ioc::new(cfg, Box::new(nic), mtu, link_up)));
    notify::ready(&format!("listening on {listen}, LAN {name}"));
    let pending: Pending = Rc::default();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let metrics_addr = ioc.borrow().cfg.metrics.listen;
    service::serve_operators(ioc.clone(), metrics_addr, control_socket).await?;
    let lan_task = tokio::task::spawn_local(lan(ioc.clone(), nic_ready));
    let link_task = tokio::task::spawn_local(link_monitor(ioc.clone(), name));
    loop {
        tokio::select! {
            a = listener.accept() => match a {
                Ok((sock, peer)) => accept(&ioc, &pending, &handshakes, &mut refusals, sock, peer),
                Err(e) => warn!("accept failed: {e}"),
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    lan_task.abort();
    link_task.abort();
    shutdown(&ioc).await;
    Ok(())
}

/// Takes a new fabric connection: its handshake runs in a task of its own, unless
/// `fabric.max_handshakes` handshakes are already in progress (then it is closed at once, so
/// half-open connections cannot pile up).
pub(crate) fn accept(
    ioc: &Rc<RefCell<Ioc>>,
    pending: &Pending,
    handshakes: &Rc<Cell<u32>>,
    refusals: &mut LogLimit,
    sock: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
) {
    let max = ioc.borrow().cfg.fabric.max_handshakes;
    if handshakes.get() >= max {
        ioc.borrow_mut().stats.handshake_failures += 1;
        if let Some(held) = refusals.allow(Instant::now()) {
            warn!(%peer, "connection closed: {max} handshakes already in progress (fabric.max_handshakes; {held} more closed since the last report)");
        }
        return;
    }
    handshakes.set(handshakes.get() + 1);
    let guard = InHandshake(handshakes.clone());
    match sock.into_std() {
        Ok(s) => {
            tokio::task::spawn_local(handshake(ioc.clone(), pending.clone(), s, peer, guard));
        }
        Err(e) => warn!(%peer, "cannot take the connection: {e}"),
    }
}

/// Completes the handshake of one new connection (a control or a data channel).
async fn handshake(
    ioc: Rc<RefCell<Ioc>>,
    pending: Pending,
    sock: TcpStream,
    peer: std::net::SocketAddr,
    guard: InHandshake,
) {
    let timeout = ioc.borrow().cfg.fabric.handshake_timeout();
    let accepted = fabric::accept_hello(sock, timeout).await;
    drop(guard);
    let (mut ch, hello, version) = match accepted {
        Ok(h) => h,
        Err(e) => {
            ioc.borrow_mut().stats.handshake_failures += 1;
            warn!(%peer, "handshake refused: {e}");
            return;
        }
    };
    let refuse = |ch, status: ErrorCode, why: &str| {
        warn!(%peer, ?status, "connection refused: {why}");
        fabric::refuse(ch, version, status, timeout)
    };
    if hello.role != Role::Host {
        return refuse(ch, ErrorCode::Refused, "peer is not a host").await;
    }
    if hello.channel == wire::CONTROL_CHANNEL {
        let admitted = {
            let mut st = ioc.borrow_mut();
            if st.stopping {
                Err((ErrorCode::ShuttingDown, "shutting down"))
            } else if st.hosts.len() + pending.borrow().len() >= st.cfg.fabric.max_hosts as usize {
                Err((ErrorCode::Busy, "max_hosts reached"))
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
            } else {
                Ok(st.new_session())
            }
        };
        let (session, token) = match admitted {
            Ok(s) => s,
            Err((status, why)) => return refuse(ch, status, why).await,
        };
        fabric::post_reply(&mut ch, version, ErrorCode::Ok, token);
        if let Err(e) = fabric::flush(&mut ch, timeout).await {
            warn!(%peer, "cannot answer the Hello: {e}");
            return;
        }
        let waiting = Waiting {
            ch,
            session,
            node_id: hello.node_id,
            queue: hello.queue,
            first: hello.session,
        };
        pending.borrow_mut().insert(token, waiting);
        debug!(%peer, session, "control channel open, waiting for the data channel");
        // A host that never opens its data channel is dropped after the handshake timeout;
        // the token names this control channel alone, never a later one.
        tokio::time::sleep(timeout).await;
        if pending.borrow_mut().remove(&token).is_some() {
            ioc.borrow_mut().stats.handshake_failures += 1;
            warn!(%peer, session, "no data channel within {timeout:?}; dropped");
        }
        return;
    }
    // A data channel joins the control channel whose token it names, from the same node.
    let joined = {
        let mut p = pending.borrow_mut();
        match p.get(&hello.session) {
            Some(w) if w.node_id == hello.node_id => p.remove(&hello.session),
            _ => None,
        }
    };
    let Some(w) = joined else {
        return refuse(ch, ErrorCode::UnknownSession, "unknown session").await;
    };
    let (session, token) = (w.session, hello.session);
    let domain = DomainId(session as u32);
    let mut s = Session::new(domain, ioc.borrow().session_config());
    let started = s.start(&mut ioc.borrow_mut().reg);
    if let Err(e) = started {
        warn!(%peer, "cannot register pools for a new host: {e}");
        ioc.borrow_mut().free_domain(domain);
        return refuse(ch, ErrorCode::ResourceLimit, "out of pool memory").await;
    }
    // The reply goes first on the data channel, ahead of anything posted to the host later.
    fabric::post_reply(&mut ch, version, ErrorCode::Ok, token);
    let tl = match TcpLink::new(s, w.ch, ch) {
        Ok(tl) => tl,
        Err(e) => {
            warn!(%peer, "cannot register the host's sockets: {e}");
            ioc.borrow_mut().free_domain(domain);
            return;
        }
    };
    let TcpLink { ready, link } = tl;
    let added = ioc
        .borrow_mut()
        .add_host(session, token, w.node_id, w.queue, w.first, link, peer);
    match added {
        Some(wake) => hosts::serve(ioc, session, ready, wake).await,
        None => {
            warn!(%peer, session, "the host's first queue left while this queue connected; closed")
        }
    }
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

/// Watches the NIC's link state and MTU and tells every host when they change.
/// Also feeds the service watchdog and refreshes the STATUS= line: every task of the IOC
/// shares this thread, so a data path stuck in a loop starves this task and stops the feed.
async fn link_monitor(ioc: Rc<RefCell<Ioc>>, name: String) {
    let mut tick = tokio::time::interval(LINK_POLL);
    let mut watchdog = notify::Watchdog::from_env();
    let mut status_at = Instant::now();
    loop {
        tick.tick().await;
        let now = Instant::now();
        watchdog.kick(now);
        let up = netdev::is_running(&name).unwrap_or(false);
        let mut st = ioc.borrow_mut();
        if now.duration_since(status_at) >= Duration::from_secs(5) {
            status_at = now;
            notify::status(&format!(
                "{} host(s), LAN {name} link {}, {} frames from and {} to the LAN",
                st.hosts.len(),
                if st.link_up { "up" } else { "down" },
                st.stats.lan_rx,
                st.stats.lan_tx
            ));
        }
        if up == st.link_up {
            continue;
        }
        st.link_up = up;
        info!(lan = %name, up, "NIC link change");
        let change = wire::LinkChange { up, mtu: st.mtu }.emit();
        for h in st.hosts.values_mut().filter(|h| h.queue.is_first()) {
            if let Some(link) = h.link.as_mut() {
                link.session_mut().cfg_request(CfgCode::LinkChange, &change);
            }
        }
        st.kick_hosts();
    }
}

/// SIGTERM: flush every host's pools (both directions), say goodbye, stop.
async fn shutdown(ioc: &Rc<RefCell<Ioc>>) {
    notify::stopping();
    {
        let mut st = ioc.borrow_mut();
        st.stopping = true;
        info!(
            hosts = st.hosts.len(),
            "shutting down: flushing pools with every host"
        );
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
    info!("stopped");
}
