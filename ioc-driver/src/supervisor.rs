//! The main thread: start-up, the workers, the fabric listener and the first step of each
//! handshake (the Hello says which worker the connection is for), the link-state monitor
//! and watchdog, the operators' endpoints (answers merged over the workers), and graceful
//! shutdown.

use crate::admission::Incoming;
use crate::gate::Gate;
use crate::listeners::{accept_local, fabric_listener, local_listener, Local, KEPT_LOCAL};
use crate::nic::{open_lan, rx_queues, LanQueues, Nic, NoNic};
use crate::nic_link::{NicFollow, NicLink};
use crate::port::{Hooks, Ports};
use crate::report::{self, offered, Snapshot};
use crate::shard::{self, Observer, Shard};
use crate::state::WorkerState;
use crate::upgrade::{self, UpgradeAsked};
use crate::worker::{Cmd, NicFactory, Spec, Worker};
use splitnet_config::{Admission, IocConfig, LanMode, Promiscuous};
use splitnet_control::Reply;
use splitnet_fabric::auth::{Key, Responder};
use splitnet_fabric::{self as fabric, Ready, Stream};
use splitnet_messaging::wire::{fmt_mac, ErrorCode, Role};
use splitnet_netif::{netdev, packet::PacketSocket};
use splitnet_service::fdstore::{self, Inherited};
use splitnet_service::handover;
use splitnet_service::loglimit::LogLimit;
use splitnet_service::privilege::Capability;
use splitnet_service::{self as service, notify, Answer, Introspect};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How long a reload in ports mode waits for the workers to apply it before it removes ports.
const RELOAD_ACK_DEADLINE: Duration = Duration::from_secs(1);
/// How long a stopping IOC waits for its port hook's last calls.
const HOOK_DRAIN_DEADLINE: Duration = Duration::from_secs(3);

/// How often the NIC's link state and MTU are checked.
const LINK_POLL: Duration = Duration::from_millis(250);

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
    /// The local fabric socket could not be bound.
    #[error("cannot listen on {}: {source}", path.display())]
    ListenLocal {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// `fabric.rdma` is set and RDMA connections cannot be taken on `fabric.listen`.
    #[error("fabric.rdma: {0}")]
    Rdma(fabric::FabricError),
    /// The metrics listener or the control socket could not be opened.
    #[error(transparent)]
    Endpoint(#[from] service::EndpointError),
    /// This IOC's private key could not be read.
    #[error("{0}")]
    Key(String),
    /// Signal handlers or reactor registration failed.
    #[error("cannot set up the event loop: {0}")]
    Runtime(#[from] io::Error),
    /// An upgrade handed over to a new process the service manager may not take for the
    /// main one: this one ends with a failure (after serving and flushing as on SIGTERM).
    #[error("upgrade: {0}; ending with a failure")]
    Upgrade(String),
}

/// How long an operator's request waits for the workers' snapshots.
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often refused connections may be logged (each line counts the ones held back).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// A worker whose heartbeat is older than this counts as stuck: the watchdog is not fed.
const STUCK: Duration = Duration::from_secs(2);

/// The workers as the main thread holds them: where connections go, and the operators'
/// view of the whole IOC.
#[derive(Debug)]
pub struct Cluster {
    cfg: IocConfig,
    workers: Vec<Worker>,
    observer: Observer,
    started: Instant,
    mtu: u32,
    nic_up: bool,
    stopping: bool,
    /// Connections refused before a worker saw them.
    failures: u64,
    /// Watchdog ticks withheld for a stuck worker.
    watchdog_withheld: u64,
    /// How long a snapshot waits for the workers ([`REPORT_TIMEOUT`]).
    report_timeout: Duration,
    /// Rate of the log lines refused connections cause.
    refusals: LogLimit,
    /// Who may become a host.
    gate: Gate,
    /// Where the control socket's `reload` requests go: the main loop, which reads the file
    /// and answers with what it applied, or why nothing.
    reloads: Option<mpsc::UnboundedSender<ReloadAsked>>,
    /// Where its `upgrade` requests go: the main loop, which hands over or says why not.
    upgrades: Option<mpsc::UnboundedSender<UpgradeAsked>>,
    /// Ports mode: the hosts' ports.
    ports: Option<Ports>,
}

/// A `reload` request of the control socket, answered with what was applied or why not.
pub type ReloadAsked = tokio::sync::oneshot::Sender<Result<String, String>>;

impl Cluster {
    /// Starts `cfg.fabric.worker_count()` workers, each over the NIC `nic(i)` opens (whose
    /// own address is `nic_mac`); `key` is this IOC's private key.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cfg: IocConfig,
        key: Option<Key>,
        mtu: u32,
        nic_up: bool,
        nic_mac: Option<[u8; 6]>,
        mut nic: impl FnMut(usize) -> NicFactory,
        prepare: fn(&mut WorkerState),
    ) -> io::Result<Cluster> {
        let started = Instant::now();
        // Ports mode: every entry's port, before any host can connect to it.
        let ports = (cfg.lan.mode == LanMode::Ports).then(|| {
            let mut p = Ports::new(&cfg.lan);
            p.sync(&cfg.auth);
            p
        });
        let hooks = ports.as_ref().map_or_else(Hooks::none, |p| p.hooks.clone());
        let shards = Shard::set(cfg.fabric.worker_count());
        let observer = shards[0].0.observer();
        let mut workers = Vec::with_capacity(shards.len());
        for (shard, inbox) in shards {
            let i = shard.index;
            workers.push(Worker::spawn(Spec {
                cfg: cfg.clone(),
                mtu,
                nic_up,
                nic_mac,
                epoch: started,
                shard,
                inbox,
                nic: nic(i),
                prepare,
                hooks: hooks.clone(),
            })?);
        }
        Ok(Cluster {
            gate: Gate::new(cfg.auth.clone(), key),
            cfg,
            workers,
            observer,
            started,
            mtu,
            nic_up,
            stopping: false,
            failures: 0,
            watchdog_withheld: 0,
            report_timeout: REPORT_TIMEOUT,
            refusals: LogLimit::new(REFUSAL_LOG_INTERVAL),
            reloads: None,
            upgrades: None,
            ports,
        })
    }

    /// Every worker's snapshot, merged: asks each worker now and returns what waits for
    /// their answers, until one deadline (a worker that misses it is logged and left out).
    /// Nothing of the cluster is borrowed meanwhile, so the main thread goes on accepting
    /// and dispatching connections while a worker is slow to answer.
    pub fn snapshot(&self) -> impl Future<Output = Snapshot> + 'static {
        let mut sum = Snapshot::empty(self.started, self.mtu, self.nic_up, offered(&self.cfg));
        sum.stopping = self.stopping;
        sum.stats.handshake_failures = self.failures;
        sum.stats.watchdog_withheld = self.watchdog_withheld;
        let asked: Vec<_> = self
            .workers
            .iter()
            .filter_map(|w| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                w.cmds.send(Cmd::Report(tx)).ok().map(|()| rx)
            })
            .collect();
        let wait = self.report_timeout;
        async move {
            let deadline = tokio::time::Instant::now() + wait;
            let mut late = 0;
            for rx in asked {
                match tokio::time::timeout_at(deadline, rx).await {
                    Ok(Ok(s)) => sum.merge(s),
                    _ => late += 1,
                }
            }
            if late > 0 {
                warn!("{late} worker(s) did not answer within {wait:?}");
            }
            sum
        }
    }

    /// Sends a connection to the worker its Hello names, or refuses it (admission first:
    /// [`Gate`]).
    fn dispatch(&mut self, accepted: fabric::Accepted, peer: String) {
        let fabric::Accepted {
            ch,
            mut hello,
            version,
            auth,
        } = accepted;
        let timeout = self.cfg.fabric.handshake_timeout();
        let refusals = &mut self.refusals;
        let failures = &mut self.failures;
        let mut refuse = |ch, auth: Option<Box<Responder>>, status: ErrorCode, why: &str| {
            *failures += 1;
            if let Some(held) = refusals.allow(Instant::now()) {
                warn!(%peer, ?status, "connection refused: {why} ({held} more refused since the last report)");
            }
            tokio::task::spawn_local(async move {
                let mut auth = auth;
                fabric::refuse(ch, auth.as_deref_mut(), version, status, timeout).await
            });
        };
        if hello.role != Role::Host {
            return refuse(ch, auth, ErrorCode::Refused, "peer is not a host");
        }
        if self.stopping {
            return refuse(ch, auth, ErrorCode::ShuttingDown, "shutting down");
        }
        let control = fabric::is_control(hello.channel);
        let policy = match self.gate.admit(&mut hello, control, auth.as_deref()) {
            Ok(a) => a,
            Err((status, why)) => return refuse(ch, auth, status, &why),
        };
        // A host's first queue goes to the worker of its key's other sessions, else where
        // the fewest sessions are; its other queues and every data channel go to the worker
        // their token names.
        let first = control && hello.queue.is_first();
        let (to, hold) = match auth.as_ref().map(|r| r.peer) {
            Some(key) if first => {
                let (to, hold) = self.observer.hold_key(key);
                (to, Some(hold))
            }
            _ if first => (self.observer.least_loaded(), None),
            _ => (shard::worker_of(hello.session), None),
        };
        let Some(w) = self.workers.get(to) else {
            return refuse(ch, auth, ErrorCode::UnknownSession, "unknown session");
        };
        let incoming = Incoming {
            accepted: fabric::Accepted {
                ch,
                hello,
                version,
                auth,
            },
            peer: peer.clone(),
            policy,
            hold,
            // Set by the worker as the connection reaches it.
            generation: 0,
        };
        if let Err(mpsc::error::SendError(Cmd::Connection(i))) =
            w.cmds.send(Cmd::Connection(Box::new(incoming)))
        {
            let fabric::Accepted { ch, auth, .. } = i.accepted;
            refuse(ch, auth, ErrorCode::ShuttingDown, "shutting down");
        }
    }

    /// Takes `cfg`'s `[auth]` (a reload): admission follows it from now on, and every
    /// worker applies it to its sessions at once ([`WorkerState::apply_policy`]). A file
    /// that changes anything a reload cannot apply ([`IocConfig::restart_needed`]) is
    /// refused whole: the running configuration stays.
    pub fn reload(&mut self, cfg: IocConfig) -> Result<String, String> {
        let restart = self.cfg.restart_needed(&cfg);
        if !restart.is_empty() {
            return Err(format!(
                "{} changed, which a reload cannot apply (restart ioc-driver for them); nothing was applied",
                restart.join(", ")
            ));
        }
        let hosts = cfg.auth.hosts.len();
        // New entries' ports first: the host may connect as soon as the gate admits it.
        if let Some(p) = self.ports.as_mut() {
            p.make_wanted(&cfg.auth);
        }
        self.gate.reload(cfg.auth.clone());
        self.cfg.auth = cfg.auth;
        let a = &self.cfg.auth;
        info!(hosts, admission = ?a.admission, encrypt_data = a.encrypt_data, "reloaded [auth]");
        let auth = Arc::new(a.clone());
        let (applied, acks) = std::sync::mpsc::sync_channel(self.workers.len());
        let told = (self.workers.iter())
            .filter(|w| {
                w.cmds
                    .send(Cmd::Auth(auth.clone(), applied.clone()))
                    .is_ok()
            })
            .count();
        // Ports of entries gone are removed once the workers ended their sessions (the
        // hook's `down` of a port before its `remove`). A worker applies [auth] in
        // microseconds; one that does not answer within the deadline is stuck, and the
        // ports go all the same.
        if let Some(p) = self.ports.as_mut() {
            let until = Instant::now() + RELOAD_ACK_DEADLINE;
            for _ in 0..told {
                let left = until.saturating_duration_since(Instant::now());
                if acks.recv_timeout(left).is_err() {
                    warn!("a worker did not apply the reload within {RELOAD_ACK_DEADLINE:?}: its hosts' ports go all the same");
                    break;
                }
            }
            p.remove_gone(&self.cfg.auth);
        }
        Ok(format!(
            "reloaded [auth]: {hosts} host(s) in [[auth.hosts]], admission {:?}, encrypt_data {}; applied to every session",
            a.admission, a.encrypt_data
        ))
    }

    /// Tells every worker that the NIC's link or MTU changed.
    fn link_change(&mut self, now: NicLink) {
        (self.nic_up, self.mtu) = (now.up, now.mtu);
        for w in &self.workers {
            let _ = w.cmds.send(Cmd::Link(now));
        }
    }

    /// Whether every worker's loop has run lately.
    fn alive(&self) -> bool {
        let now = self.started.elapsed().as_millis() as u64;
        let stuck = STUCK.as_millis() as u64;
        self.workers
            .iter()
            .all(|w| now.saturating_sub(w.heartbeat.load(Ordering::Relaxed)) < stuck)
    }

    /// Stops every worker (each flushes its hosts' pools and says goodbye with `code`) and
    /// waits.
    fn stop(&mut self, code: ErrorCode) -> Vec<Worker> {
        self.stopping = true;
        for w in &self.workers {
            let _ = w.cmds.send(Cmd::Stop(code));
        }
        std::mem::take(&mut self.workers)
    }
}

impl Introspect for Cluster {
    fn answer_line(&self, line: &str) -> Answer {
        if line.parse() == Ok(splitnet_control::Request::Upgrade) {
            return upgrade::answer(self.upgrades.as_ref());
        }
        if line.parse() == Ok(splitnet_control::Request::Reload) {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let asked = self.reloads.as_ref().is_some_and(|r| r.send(tx).is_ok());
            return Box::pin(async move {
                let reply = match (asked, rx.await) {
                    (true, Ok(Ok(what))) => Reply::Reloaded(what),
                    (true, Ok(Err(why))) => Reply::Error(format!("reload refused: {why}")),
                    _ => Reply::Error("reload: the IOC is stopping".into()),
                };
                serde_json::to_string(&reply).unwrap_or_default()
            });
        }
        let (cfg, line, snap) = (self.cfg.clone(), line.to_owned(), self.snapshot());
        Box::pin(async move {
            let snap = snap.await;
            splitnet_control::answer_line(&line, |r| report::answer(&cfg, &snap, r))
        })
    }

    fn render_metrics(&self) -> Answer {
        let snap = self.snapshot();
        Box::pin(async move { report::metrics_text(&snap.await) })
    }
}

/// A reload (SIGHUP, or `reload` on the control socket): reads the file at `config` and
/// applies it ([`Cluster::reload`]); a refusal is logged and nothing changes.
fn reload_from(cluster: &RefCell<Cluster>, config: &std::path::Path) -> Result<String, String> {
    let loaded = splitnet_config::load_ioc(config).map_err(|e| e.to_string());
    let done = loaded.and_then(|cfg| cluster.borrow_mut().reload(cfg));
    if let Err(e) = &done {
        warn!("reload refused, the running configuration stays: {e}");
    }
    done
}

/// Runs until SIGTERM/SIGINT; SIGHUP reads `[auth]` of the file at `config` again.
pub async fn run(
    cfg: IocConfig,
    config: PathBuf,
    control_socket: Option<PathBuf>,
) -> Result<(), StartError> {
    let key = private_key(&cfg)?;
    // The listening sockets an earlier process left with the service manager, or handed
    // over in an upgrade.
    let mut kept = Inherited::take();
    let mut kept_ops = kept.split_off(&[service::KEPT_METRICS, service::KEPT_CONTROL]);
    let name = cfg.lan.interface.clone();
    let lan_err = |source| StartError::Lan {
        name: name.clone(),
        source,
    };
    let n = cfg.fabric.worker_count();
    crate::budget::budget(&cfg, n, 2 * service::memory::tcp_socket_max()).log();
    // Ports mode: no NIC is opened; each host's MTU is its port's.
    let ports = cfg.lan.mode == LanMode::Ports;
    let fixed_mtu = cfg.lan.mtu;
    let (mut socks, mtu, nic_up) = if ports {
        (
            (0..n).map(|_| None).collect(),
            cfg.lan.mtu.unwrap_or(1500),
            true,
        )
    } else {
        netdev::set_up(&name).map_err(lan_err)?;
        // "auto": each worker puts its hosts' MACs in the NIC's unicast filter and holds it
        // promiscuous while one of its hosts is (`WorkerState::sync_nic_filter`).
        let promisc = cfg.lan.promiscuous == Promiscuous::On;
        let queues = rx_queues(cfg.lan.rx_queues as usize, n);
        let socks: Vec<Option<Vec<PacketSocket>>> =
            open_lan(&name, n, queues, promisc, cfg.lan.rx_ring)
                .map_err(lan_err)?
                .into_iter()
                .map(Some)
                .collect();
        let mtu = match cfg.lan.mtu {
            Some(m) => m,
            None => netdev::mtu(&name).map_err(lan_err)?,
        };
        (socks, mtu, netdev::is_running(&name).unwrap_or(false))
    };
    let listen = cfg.fabric.listen;
    let rdma = cfg.fabric.rdma;
    let listener =
        fabric_listener(&mut kept, listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: listen,
                source,
            })?;
    let local = match &cfg.fabric.listen_local {
        Some(path) => Some(
            local_listener(&mut kept, path, cfg.fabric.listen_local_group.as_deref()).map_err(
                |source| StartError::ListenLocal {
                    path: path.clone(),
                    source,
                },
            )?,
        ),
        None => {
            let _ = fdstore::forget(KEPT_LOCAL);
            None
        }
    };
    // Kept for a configuration of before (or not ours): closed, and the manager's copy too.
    for name in kept.names() {
        info!(
            name,
            "a descriptor the service manager kept is not used: dropped"
        );
        let _ = fdstore::forget(name);
    }
    drop(kept);
    let metrics_addr = cfg.metrics.listen;
    // Run by hand as root: from here on only the NIC (CAP_NET_ADMIN) and the hosts' own
    // packet sockets (CAP_NET_RAW) need a capability, and with RDMA pinning registered memory
    // beyond RLIMIT_MEMLOCK (units raise LimitMEMLOCK instead). Before the workers' threads
    // start.
    let mut keep = vec![Capability::CAP_NET_ADMIN, Capability::CAP_NET_RAW];
    if cfg.fabric.rdma {
        keep.push(Capability::CAP_IPC_LOCK);
    }
    // The workers take their class (scheduling.class) as they start: with the capability
    // where the daemon has it (by hand as root), else by the unit's LimitRTPRIO/LimitNICE.
    if crate::worker::sched_class(&cfg.scheduling) != service::sched::Class::Normal {
        keep.push(Capability::CAP_SYS_NICE);
    }
    service::privilege::keep_only_logged(&keep);
    // RDMA connection requests on the fabric address and port (on a given address its
    // device must be there now). After the capabilities are dropped: the kernel refuses
    // verbs on a device opened with other credentials than the caller's.
    if cfg.fabric.rdma {
        let on = fabric::verbs::listen(listen).map_err(StartError::Rdma)?;
        info!("data channels over RDMA: connection requests on {on}");
    }
    let cluster = Cluster::start(
        cfg,
        key,
        mtu,
        nic_up,
        netdev::mac(&name).ok().filter(|_| !ports),
        |i| {
            let sock = socks[i].take();
            if ports {
                return Box::new(|| Ok((Box::new(NoNic) as Box<dyn Nic>, Vec::new())));
            }
            Box::new(move || {
                let queues = LanQueues::new(sock.unwrap_or_default())?;
                let ready = queues
                    .sockets()
                    .iter()
                    .map(Ready::reading)
                    .collect::<io::Result<Vec<_>>>()?;
                Ok((Box::new(queues) as Box<dyn Nic>, ready))
            })
        },
        |_| {},
    )?;
    info!(lan = %name, mac = %fmt_mac(&netdev::mac(&name).unwrap_or_default()), mtu, nic_up, %listen, workers = n, "IOC ready");
    let cluster = Rc::new(RefCell::new(cluster));
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let operators =
        service::serve_operators(cluster.clone(), metrics_addr, control_socket, &mut kept_ops)
            .await?;
    drop(kept_ops);
    notify::ready(&format!("listening on {listen}, LAN {name}"));
    let nic = match ports {
        true => NicFollow::nothing(NicLink { up: nic_up, mtu }),
        false => NicFollow::new(&name, NicLink { up: nic_up, mtu }, fixed_mtu),
    };
    let link_task = tokio::task::spawn_local(link_monitor(cluster.clone(), name, nic));
    let acceptor = Acceptor::new(cluster.clone());
    let (reload_tx, mut reloads) = mpsc::unbounded_channel();
    cluster.borrow_mut().reloads = Some(reload_tx);
    let (upgrade_tx, mut upgrades) = mpsc::unbounded_channel::<UpgradeAsked>();
    cluster.borrow_mut().upgrades = Some(upgrade_tx);
    let mut local_refusals = LogLimit::new(REFUSAL_LOG_INTERVAL);
    // An upgrade whose new main process the service manager did not confirm.
    let mut unconfirmed = None;
    loop {
        tokio::select! {
            a = listener.accept() => match a.and_then(|(s, peer)| Ok((s.into_std()?, peer))) {
                Ok((sock, peer)) => acceptor.accept(sock.into(), peer.to_string(), Source::Ip(peer.ip())),
                Err(e) => warn!("accept failed: {e}"),
            },
            a = accept_local(local.as_ref()) => match a {
                Ok(Local::Admitted(sock, peer, uid)) => acceptor.accept(sock, peer, Source::Uid(uid)),
                Ok(Local::Refused(peer, uid)) => {
                    cluster.borrow_mut().failures += 1;
                    if let Some(held) = local_refusals.allow(Instant::now()) {
                        warn!(%peer, uid, "local connection refused: not root, the IOC's user or a member of fabric.listen_local_group ({held} more refused since the last report)");
                    }
                }
                Err(e) => warn!("accept failed on the local fabric socket: {e}"),
            },
            _ = hup.recv() => {
                let _ = reload_from(&cluster, &config);
            }
            Some(asked) = reloads.recv() => {
                let _ = asked.send(reload_from(&cluster, &config));
            }
            // Nothing is accepted meanwhile: connections wait on the socket, for whichever
            // process serves after it. A SIGTERM meanwhile ends the new process and stops.
            Some(asked) = upgrades.recv() => {
                let outcome = if rdma {
                    Some(upgrade::Outcome::Refused(upgrade::Refusal::Other(
                        "not with fabric.rdma (the RDMA connection manager's listener cannot be shared): restart instead".into(),
                    )))
                } else {
                    let local_fd = local.as_ref().map(|(l, _, _)| l.as_fd());
                    tokio::select! {
                        o = upgrade::hand_over(listener.as_fd(), local_fd, &operators) => Some(o),
                        _ = term.recv() => None,
                    }
                };
                let Some(outcome) = outcome else {
                    let _ = asked.send(Reply::Error("upgrade: cancelled by SIGTERM; the new process ended, this one stops".into()));
                    break;
                };
                match outcome {
                    upgrade::Outcome::Done(done) => {
                        let _ = asked.send(Reply::Upgraded(done));
                        break;
                    }
                    upgrade::Outcome::Unconfirmed(why) => {
                        let _ = asked.send(Reply::Error(format!("upgrade: {why}")));
                        unconfirmed = Some(why);
                        break;
                    }
                    upgrade::Outcome::Refused(why) => {
                        let _ = asked.send(why.reply());
                    }
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    link_task.abort();
    // With the service manager keeping the listening sockets, a restart's process takes
    // them up and the hosts' connections made meanwhile wait on them: the hosts are told
    // so, and the local socket's file stays for them (a stop removes the runtime directory).
    // After an upgrade the new process holds them already.
    let handed_over = handover::has_handed_over();
    if handed_over {
        operators.stop().await;
    }
    let restarting = handed_over || fdstore::keeping();
    if let Some((_, path, _)) = &local {
        if !restarting {
            let _ = std::fs::remove_file(path);
        }
    }
    // Nothing once handed over: this is not the service's main process any more.
    notify::stopping();
    info!(restarting, "shutting down");
    let code = match restarting {
        true => ErrorCode::Restarting,
        false => ErrorCode::ShuttingDown,
    };
    let (workers, ports) = {
        let mut c = cluster.borrow_mut();
        if handed_over {
            if let Some(p) = &c.ports {
                p.hooks.hand_over();
            }
        }
        (c.stop(code), c.ports.take())
    };
    let joined = tokio::task::spawn_blocking(move || {
        workers.into_iter().for_each(Worker::join);
        if let Some(p) = ports {
            p.finish(HOOK_DRAIN_DEADLINE);
        }
    });
    if joined.await.is_err() {
        warn!("the workers could not be waited for");
    }
    info!("stopped");
    match unconfirmed {
        Some(why) => Err(StartError::Upgrade(why)),
        None => Ok(()),
    }
}

/// This IOC's private key ([`splitnet_config::key::private_key_path`]): required with
/// `auth.admission = "keys"`; with "open", read if there is one, and the open door is
/// logged loudly.
fn private_key(cfg: &IocConfig) -> Result<Option<Key>, StartError> {
    use splitnet_config::key;
    let path = key::private_key_path(cfg.auth.private_key_file.as_deref());
    let key = match (&path, cfg.auth.admission) {
        (Some(p), Admission::Keys) => Some(key::read_private_key(p).map_err(StartError::Key)?),
        (Some(p), Admission::Open) if p.exists() => {
            Some(key::read_private_key(p).map_err(StartError::Key)?)
        }
        (_, Admission::Open) => None,
        (None, Admission::Keys) => return Err(StartError::Key(
            "auth.admission = \"keys\" needs this IOC's private key: set auth.private_key_file, or give the credential splitnet.key (systemd LoadCredential=)".into(),
        )),
    };
    match cfg.auth.admission {
        Admission::Open => warn!(
            "auth.admission = \"open\": ANY peer that reaches the fabric becomes a host, with or without a key; for a lab only"
        ),
        Admission::Keys if cfg.auth.hosts.is_empty() => {
            warn!("no host is admitted: [[auth.hosts]] is empty")
        }
        Admission::Keys => info!(hosts = cfg.auth.hosts.len(), "admitting the hosts of [[auth.hosts]] by key"),
    }
    Ok(key.map(|k| k.0))
}

/// Where a connection comes from, for the bound on one source's handshakes in flight: its
/// IP address over TCP, the user of its process on the local socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A TCP peer.
    Ip(std::net::IpAddr),
    /// A local peer's user id.
    Uid(u32),
}

/// One source may hold at most this share of `fabric.max_handshakes` (rounded up), so that
/// no single address can keep every place in the handshake.
const PER_SOURCE_SHARE: u32 = 4;

/// Takes new fabric connections: reads each one's Hello in a task of its own (at most
/// `fabric.max_handshakes` at once, and a quarter of them from any one source; more are
/// closed at once, so half-open connections cannot pile up) and hands it to its worker.
#[derive(Debug, Clone)]
pub struct Acceptor {
    cluster: Rc<RefCell<Cluster>>,
    handshakes: Rc<Cell<u32>>,
    by_source: Rc<RefCell<HashMap<Source, u32>>>,
    refusals: Rc<RefCell<LogLimit>>,
}

impl Acceptor {
    /// An acceptor for `cluster`'s workers.
    pub fn new(cluster: Rc<RefCell<Cluster>>) -> Acceptor {
        Acceptor {
            cluster,
            handshakes: Rc::default(),
            by_source: Rc::default(),
            refusals: Rc::new(RefCell::new(LogLimit::new(REFUSAL_LOG_INTERVAL))),
        }
    }

    /// Takes one new connection from `source`.
    pub fn accept(&self, sock: Stream, peer: String, source: Source) {
        let (max, timeout) = {
            let c = self.cluster.borrow();
            (
                c.cfg.fabric.max_handshakes,
                c.cfg.fabric.handshake_timeout(),
            )
        };
        let per_source = max.div_ceil(PER_SOURCE_SHARE);
        let from_source = self.by_source.borrow().get(&source).copied().unwrap_or(0);
        let full = if self.handshakes.get() >= max {
            Some(format!(
                "{max} handshakes already in progress (fabric.max_handshakes)"
            ))
        } else if from_source >= per_source {
            Some(format!(
                "{per_source} handshakes from this source already in progress (a quarter of fabric.max_handshakes)"
            ))
        } else {
            None
        };
        if let Some(why) = full {
            self.cluster.borrow_mut().failures += 1;
            if let Some(held) = self.refusals.borrow_mut().allow(Instant::now()) {
                warn!(%peer, "connection closed: {why} ({held} more closed since the last report)");
            }
            return;
        }
        self.handshakes.set(self.handshakes.get() + 1);
        *self.by_source.borrow_mut().entry(source).or_default() += 1;
        let guard = InHandshake {
            all: self.handshakes.clone(),
            by_source: self.by_source.clone(),
            source,
        };
        let (cluster, refusals) = (self.cluster.clone(), self.refusals.clone());
        tokio::task::spawn_local(async move {
            let key = cluster.borrow().gate.key().copied();
            let accepted = fabric::accept_hello(sock, timeout, key.as_ref()).await;
            drop(guard);
            match accepted {
                Ok(a) => cluster.borrow_mut().dispatch(a, peer),
                Err(e) => {
                    cluster.borrow_mut().failures += 1;
                    if let Some(held) = refusals.borrow_mut().allow(Instant::now()) {
                        warn!(%peer, "handshake refused: {e} ({held} more refused since the last report)");
                    }
                }
            }
        });
    }
}

/// Counts a connection in its handshake, overall and for its source, while it lives.
struct InHandshake {
    all: Rc<Cell<u32>>,
    by_source: Rc<RefCell<HashMap<Source, u32>>>,
    source: Source,
}

impl Drop for InHandshake {
    fn drop(&mut self) {
        self.all.set(self.all.get().saturating_sub(1));
        let mut by = self.by_source.borrow_mut();
        if let Some(n) = by.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.source);
            }
        }
    }
}

/// Follows the NIC's link and MTU ([`NicFollow`]) and tells every worker when they change.
/// Also feeds the service watchdog while every worker's loop runs, and refreshes the STATUS=
/// line.
async fn link_monitor(cluster: Rc<RefCell<Cluster>>, name: String, mut nic: NicFollow) {
    let mut tick = tokio::time::interval(LINK_POLL);
    let mut watchdog = notify::Watchdog::from_env();
    let mut status_at = Instant::now();
    // Whether the last tick found a worker stuck.
    let mut stuck = false;
    loop {
        let changed = tokio::select! {
            _ = tick.tick() => nic.polled().then(|| nic.poll()).flatten(),
            c = nic.changed() => match c {
                Ok(c) => Some(c),
                Err(e) => {
                    warn!(lan = %name, "following the NIC through rtnetlink failed ({e}): reading its state every {LINK_POLL:?} instead");
                    nic.poll_instead();
                    None
                }
            },
        };
        if let Some(now) = changed {
            info!(lan = %name, up = now.up, mtu = now.mtu, "NIC link change");
            cluster.borrow_mut().link_change(now);
            continue;
        }
        let now = Instant::now();
        let mut c = cluster.borrow_mut();
        if c.alive() {
            watchdog.kick(now);
            stuck = false;
        } else {
            // Counted, and said once per episode: systemd restarts the IOC if it lasts.
            if !stuck {
                warn!("a worker's loop has not run for {STUCK:?}: the watchdog is not fed");
            }
            stuck = true;
            c.watchdog_withheld += 1;
        }
        if now.duration_since(status_at) >= Duration::from_secs(5) {
            status_at = now;
            // Its own task: the watchdog and the link are never late for a slow worker.
            let (snap, up, name) = (c.snapshot(), c.nic_up, name.clone());
            tokio::task::spawn_local(async move {
                let s = snap.await;
                notify::status(&format!(
                    "{} host(s), LAN {name} link {}, {} frames from and {} to the LAN",
                    s.hosts.len(),
                    if up { "up" } else { "down" },
                    s.stats.lan_rx,
                    s.stats.lan_tx
                ));
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listeners::{group_id, group_in, LocalAccess};

    /// A cluster of `workers` that never answer, as the main thread holds them.
    fn cluster_of(workers: Vec<Worker>) -> Cluster {
        let cfg = splitnet_config::parse_ioc(
            "[fabric]\nlisten = \"127.0.0.1:7400\"\n[lan]\ninterface = \"lan0\"\n",
            std::path::Path::new("test.toml"),
        )
        .unwrap();
        let observer = Shard::set(1).remove(0).0.observer();
        Cluster {
            gate: Gate::new(cfg.auth.clone(), None),
            cfg,
            workers,
            observer,
            started: Instant::now(),
            mtu: 1500,
            nic_up: true,
            stopping: false,
            failures: 0,
            watchdog_withheld: 0,
            report_timeout: Duration::from_millis(200),
            refusals: LogLimit::new(REFUSAL_LOG_INTERVAL),
            reloads: None,
            upgrades: None,
            ports: None,
        }
    }

    /// A reload that changes only `[auth]` reaches every worker whole; one that changes
    /// anything else, or a file that does not parse, is refused whole, saying why, and the
    /// running configuration stays (on SIGHUP and through the control socket alike).
    #[test]
    fn a_reload_applies_auth_to_the_workers_or_is_refused_whole() {
        let (w, mut cmds) = Worker::unanswering();
        let cluster = Rc::new(RefCell::new(cluster_of(vec![w])));
        let dir = std::env::temp_dir().join(format!("splitnet-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ioc.toml");
        let base = "[fabric]\nlisten = \"127.0.0.1:7400\"\n[lan]\ninterface = \"lan0\"\n";
        let write = |extra: &str| std::fs::write(&file, format!("{base}{extra}")).unwrap();
        write("[auth]\nencrypt_data = true\nadmission = \"open\"\n");
        let done = reload_from(&cluster, &file).unwrap();
        assert!(done.contains("encrypt_data true"), "{done}");
        let Ok(Cmd::Auth(auth, _)) = cmds.try_recv() else {
            panic!("the worker was not told");
        };
        assert!(auth.encrypt_data && auth.admission == Admission::Open);
        // A restart-only key with an [auth] change: nothing is applied.
        write("[pools]\ncredit_batch = 3\n[auth]\nencrypt_data = false\n");
        let why = reload_from(&cluster, &file).unwrap_err();
        assert!(why.contains("[pools] changed"), "{why}");
        assert!(cmds.try_recv().is_err(), "no worker told");
        assert!(
            cluster.borrow().cfg.auth.encrypt_data,
            "the running [auth] stays"
        );
        write("[auth]\nadmission = \"sometimes\"\n");
        let why = reload_from(&cluster, &file).unwrap_err();
        assert!(why.contains("sometimes"), "{why}");
        assert!(cmds.try_recv().is_err());
        // Through the control socket: the main loop's answer is the reply.
        let rt = service::runtime().unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let (tx, mut rx) = mpsc::unbounded_channel::<ReloadAsked>();
            cluster.borrow_mut().reloads = Some(tx);
            let c = cluster.clone();
            let f = file.clone();
            tokio::task::spawn_local(async move {
                while let Some(asked) = rx.recv().await {
                    let _ = asked.send(reload_from(&c, &f));
                }
            });
            let answer = cluster.borrow().answer_line("reload\n");
            let refused = answer.await;
            assert!(
                refused.contains("reload refused") && refused.contains("sometimes"),
                "{refused}"
            );
            write("");
            let answer = cluster.borrow().answer_line("reload\n");
            let applied = answer.await;
            assert!(applied.contains("\"reloaded\""), "{applied}");
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An operator's request to an IOC with a worker that does not answer: the main thread
    /// keeps running its other tasks while the answer waits (a blocking wait would run them
    /// only after it), and the answer comes, without that worker, once the deadline passed.
    #[test]
    fn a_worker_that_does_not_answer_never_holds_the_main_thread() {
        let (stuck, mut cmds) = Worker::unanswering();
        let cluster = Rc::new(RefCell::new(cluster_of(vec![stuck])));
        let rt = service::runtime().unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let ticks = Rc::new(Cell::new(0u32));
            let t = ticks.clone();
            let ticker = tokio::task::spawn_local(async move {
                loop {
                    t.set(t.get() + 1);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let answer = cluster.borrow().answer_line("status\n");
            // The cluster is not borrowed while the answer waits: a connection could be
            // dispatched meanwhile.
            assert!(cluster.try_borrow_mut().is_ok());
            let before = ticks.get();
            let json = answer.await;
            assert!(
                ticks.get() > before + 1,
                "the main thread's other tasks ran while the answer waited"
            );
            assert!(json.contains("\"status\""), "{json}");
            assert!(
                matches!(cmds.try_recv(), Ok(Cmd::Report(_))),
                "the worker was asked"
            );
            ticker.abort();
        });
    }

    #[test]
    fn local_access_is_root_the_iocs_user_and_the_groups_members() {
        let open = LocalAccess {
            owner: 990,
            group: None,
        };
        assert!(open.allows(0, 0, &[]));
        assert!(open.allows(990, 990, &[]));
        assert!(!open.allows(1000, 1000, &[4242]));
        let grouped = LocalAccess {
            owner: 990,
            group: Some(4242),
        };
        assert!(grouped.allows(1000, 4242, &[]), "its primary group");
        assert!(
            grouped.allows(1000, 1000, &[27, 4242]),
            "a supplementary group"
        );
        assert!(!grouped.allows(1000, 1000, &[27]));
    }

    #[test]
    fn groups_are_found_by_name_or_number() {
        let table = "root:x:0:\nsplitnet:x:4242:alice,bob\nbroken\nsplit:x:7:\n";
        assert_eq!(group_in("splitnet", table).unwrap(), 4242);
        assert_eq!(group_in("split", table).unwrap(), 7);
        assert!(group_in("nobody", table).is_err());
        assert_eq!(group_id("4242").unwrap(), 4242);
    }
}
