//! One worker of the IOC: a thread with its own event loop, its own [`WorkerState`] (hosts,
//! pools, send buffers) and its own packet socket on the NIC. The main thread hands it
//! the connections whose Hello names it ([`Cmd::Connection`]); it completes their
//! handshake, serves their sessions, reads its share of the LAN and takes the frames other
//! workers hand it.

use crate::admission;
use crate::from_lan::{self, LanProgress};
use crate::nic::Nic;
use crate::nic_link::NicLink;
use crate::report::Snapshot;
use crate::shard::{Crossing, InboxRx, Shard};
use crate::state::WorkerState;
use splitnet_config::{IocAuth, IocConfig};
use splitnet_fabric::Ready;
use splitnet_messaging::adapter::Channel;
use splitnet_messaging::wire::{self, CfgCode, ErrorCode};
use splitnet_service as service;
use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How often a worker shows it is alive ([`Worker::heartbeat`]).
const HEARTBEAT: Duration = Duration::from_millis(250);
/// Time allowed for flushing every host's pools on shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// Crossing frames delivered per wake-up.
const INBOX_BATCH: usize = 64;

/// What the main thread asks of a worker.
#[derive(Debug)]
pub enum Cmd {
    /// A connection whose Hello was read, for this worker: a host's control channel, or a
    /// data channel or further queue naming a session of this worker.
    Connection(Box<admission::Incoming>),
    /// The NIC's link state or MTU changed.
    Link(NicLink),
    /// A snapshot for the operators (the main thread waits for it within a deadline).
    Report(tokio::sync::oneshot::Sender<Snapshot>),
    /// A reload's `[auth]`: applied to every session at once
    /// ([`WorkerState::apply_policy`]), then acknowledged on the sender, which ports mode
    /// waits for before it removes the ports of entries gone.
    Auth(Arc<IocAuth>, std::sync::mpsc::SyncSender<()>),
    /// Flush every host's pools, say goodbye with this code (ShuttingDown, or Restarting
    /// when the listening sockets outlive the process), stop.
    Stop(ErrorCode),
}

/// Opens the worker's NIC inside its event loop: the NIC, and the readiness of each of its
/// receive queues' sockets (none: nothing to read, as for a test's NIC).
pub type NicFactory = Box<dyn FnOnce() -> io::Result<(Box<dyn Nic>, Vec<Ready>)> + Send>;

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
    pub nic_up: bool,
    /// The NIC's own MAC, if known.
    pub nic_mac: Option<[u8; 6]>,
    /// When the IOC started (heartbeats count from it).
    pub epoch: Instant,
    /// Its place among the workers.
    pub shard: Shard,
    /// Its inbox.
    pub inbox: InboxRx,
    /// Its NIC.
    pub nic: NicFactory,
    /// Applied to its state before it serves anyone (tests).
    pub prepare: fn(&mut WorkerState),
    /// Ports mode: the port hook.
    pub hooks: crate::port::Hooks,
}

/// The class `[scheduling]` gives the data-path threads.
pub fn sched_class(s: &splitnet_config::Scheduling) -> service::sched::Class {
    use splitnet_config::SchedClass;
    match s.class {
        SchedClass::Normal => service::sched::Class::Normal,
        SchedClass::Nice => service::sched::Class::Nice(s.nice),
        SchedClass::Fifo => service::sched::Class::Fifo(s.priority),
    }
}

impl Worker {
    /// Starts a worker thread; returns once its event loop runs (or could not start).
    pub fn spawn(spec: Spec) -> io::Result<Worker> {
        let (cmds, rx) = mpsc::unbounded_channel();
        let heartbeat = Arc::new(AtomicU64::new(0));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let beat = heartbeat.clone();
        let name = format!("ioc-worker-{}", spec.shard.index);
        let class = sched_class(&spec.cfg.scheduling);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // The data path's class (scheduling.class), before it serves anything.
            if let Err(e) = service::sched::apply(class) {
                let _ = started_tx.send(Err(io::Error::other(format!("scheduling: {e}"))));
                return;
            }
            // Its poll before sleep (fabric.spin_max_us), when configured.
            let spin_max = spec.cfg.fabric.spin_max();
            crate::spin::install(spin_max);
            let mut rt = tokio::runtime::Builder::new_current_thread();
            if !spin_max.is_zero() {
                rt.on_thread_park(crate::spin::before_park)
                    .on_thread_unpark(crate::spin::after_unpark);
            }
            let rt = match rt.enable_all().build() {
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

    /// A worker that never reads its commands, for tests of what waits on one; its
    /// commands arrive on the receiver returned with it.
    #[cfg(test)]
    pub fn unanswering() -> (Worker, mpsc::UnboundedReceiver<Cmd>) {
        let (cmds, rx) = mpsc::unbounded_channel();
        let worker = Worker {
            cmds,
            heartbeat: Arc::new(AtomicU64::new(0)),
            thread: std::thread::spawn(|| {}),
        };
        (worker, rx)
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
        nic_up,
        nic_mac,
        epoch,
        shard,
        inbox,
        nic,
        prepare,
        hooks,
    } = spec;
    let (nic, queues) = match nic() {
        Ok(n) => n,
        Err(e) => {
            let _ = started.send(Err(e));
            return;
        }
    };
    let ioc = Rc::new(RefCell::new(WorkerState::worker(
        cfg, nic, mtu, nic_up, shard,
    )));
    ioc.borrow_mut().nic_mac = nic_mac;
    ioc.borrow_mut().hooks = hooks;
    prepare(&mut ioc.borrow_mut());
    // Its poll before sleep (if any) watches the inbox, and skips a poll right after a
    // host's doorbell was rung.
    crate::spin::watch_queued(inbox.queued());
    let weak = Rc::downgrade(&ioc);
    crate::spin::set_rang(Box::new(move || {
        let Some(ioc) = weak.upgrade() else {
            return false;
        };
        let Ok(mut st) = ioc.try_borrow_mut() else {
            return false;
        };
        let mut rang = false;
        for l in st.hosts.values_mut().filter_map(|h| h.link.as_mut()) {
            rang |= l.data_channel_mut().take_rang_peer();
            rang |= l.control_channel_mut().take_rang_peer();
        }
        rang
    }));
    let mut tasks = vec![
        tokio::task::spawn_local(deliver_crossed(ioc.clone(), inbox)),
        tokio::task::spawn_local(heartbeat(beat, epoch)),
        tokio::task::spawn_local(claims(ioc.clone())),
        tokio::task::spawn_local(port_links(ioc.clone())),
    ];
    // With fabric.busy_poll, a task that keeps the runtime polling: the worker never sleeps.
    if ioc.borrow().cfg.fabric.busy_poll {
        tasks.push(tokio::task::spawn_local(service::busy_poll()));
    }
    // A task per receive queue: the runtime runs the ready ones in turn, so the queues are
    // read round robin, a batch at a time; with several, the first (frames of no flow:
    // pings, ARP, neighbour discovery) is also read before each batch of the others.
    let several = queues.len() > 1;
    for (queue, ready) in queues.into_iter().enumerate() {
        let first = several && queue > 0;
        tasks.push(tokio::task::spawn_local(lan(
            ioc.clone(),
            queue,
            ready,
            first,
        )));
    }
    let _ = started.send(Ok(()));
    // The main thread gone without a word: a clean stop all the same.
    let goodbye = loop {
        let Some(cmd) = cmds.recv().await else {
            break ErrorCode::ShuttingDown;
        };
        match cmd {
            Cmd::Connection(mut incoming) => {
                // Its policy is of the reloads applied so far: a later one makes it stale.
                incoming.generation = ioc.borrow().auth_generation;
                tokio::task::spawn_local(admission::admit(ioc.clone(), *incoming));
            }
            Cmd::Link(now) => link_change(&mut ioc.borrow_mut(), now),
            Cmd::Report(reply) => {
                let mut st = ioc.borrow_mut();
                from_lan::count_nic_drops(&mut st);
                let polls = crate::spin::counts();
                (st.stats.poll_caught, st.stats.poll_slept) = (polls.caught, polls.slept);
                let _ = reply.send(st.snapshot());
            }
            Cmd::Auth(auth, applied) => {
                let mut st = ioc.borrow_mut();
                st.cfg.auth = (*auth).clone();
                st.apply_policy();
                let _ = applied.try_send(());
            }
            Cmd::Stop(code) => break code,
        }
    };
    for t in tasks {
        t.abort();
    }
    shutdown(&ioc, goodbye).await;
}

/// Moves frames from the NIC's receive queue `queue` to the hosts; with `first_first`,
/// reads queue 0 (the express queue of frames without a flow, [`splitnet_netif::fanout`])
/// before each batch, so that a ping's reply never waits for a bulk batch's turn.
async fn lan(ioc: Rc<RefCell<WorkerState>>, queue: usize, ready: Ready, first_first: bool) {
    loop {
        let polled = crate::spin::watch(&ready);
        let readable = ready.readable().await;
        drop(polled);
        let mut g = match readable {
            Ok(g) => g,
            Err(e) => {
                warn!("NIC readiness failed: {e}");
                return;
            }
        };
        let (progress, freed) = {
            let mut st = ioc.borrow_mut();
            if first_first {
                from_lan::drive_lan(&mut st, 0);
            }
            (
                from_lan::drive_lan(&mut st, queue),
                st.buffers_freed.clone(),
            )
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
async fn deliver_crossed(ioc: Rc<RefCell<WorkerState>>, mut inbox: InboxRx) {
    let mut frames: Vec<Crossing> = Vec::with_capacity(INBOX_BATCH);
    loop {
        if inbox.recv(&mut frames, INBOX_BATCH).await == 0 {
            return;
        }
        from_lan::deliver_crossed(&mut ioc.borrow_mut(), &frames);
        frames.clear();
    }
}

/// How often bridged MACs that were another host's are claimed again.
const CLAIM_RETRY: Duration = Duration::from_secs(1);

/// Claims, every [`CLAIM_RETRY`], the bridged MACs hosts could not have when they asked.
async fn claims(ioc: Rc<RefCell<WorkerState>>) {
    let mut tick = tokio::time::interval(CLAIM_RETRY);
    loop {
        tick.tick().await;
        ioc.borrow_mut().claim_missing();
    }
}

/// Ports mode: follows the ports' MTUs every [`crate::port::FOLLOW`] (in shared mode, it ends
/// at once).
async fn port_links(ioc: Rc<RefCell<WorkerState>>) {
    if !ioc.borrow().ports {
        return;
    }
    let mut tick = tokio::time::interval(crate::port::FOLLOW);
    loop {
        tick.tick().await;
        ioc.borrow_mut().follow_ports();
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

/// Tells every host of this worker that the NIC's link or MTU changed. A host at the NIC's
/// MTU follows it, up or down, and a host above the new one takes it, as host-driver does on
/// the LinkChange (its frames are checked against its MTU).
fn link_change(st: &mut WorkerState, now: NicLink) {
    if (st.nic_up, st.mtu) == (now.up, now.mtu) {
        return;
    }
    let before = st.mtu;
    (st.nic_up, st.mtu) = (now.up, now.mtu);
    let change = wire::LinkChange {
        up: now.up,
        mtu: now.mtu,
    }
    .emit();
    for h in st.hosts.values_mut() {
        h.mtu = if h.mtu == before {
            now.mtu
        } else {
            h.mtu.min(now.mtu)
        };
    }
    for h in st.hosts.values_mut().filter(|h| h.queue.is_first()) {
        if let Some(link) = h.link.as_mut() {
            link.session_mut().cfg_request(CfgCode::LinkChange, &change);
        }
    }
    st.kick_hosts();
}

/// SIGTERM: flush every host's pools (both directions), say goodbye with `code`, stop.
async fn shutdown(ioc: &Rc<RefCell<WorkerState>>, code: ErrorCode) {
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
        let WorkerState { reg, hosts, .. } = &mut *st;
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
    // Every session hears the Goodbye before any is removed: removing a host's first queue
    // ends its further queues without one, and a host must hear Restarting on each.
    for h in st.hosts.values_mut() {
        if let Some(link) = h.link.as_mut() {
            link.goodbye(code);
        }
    }
    let sessions: Vec<u64> = st.hosts.keys().copied().collect();
    for s in sessions {
        st.remove_host(s, "IOC shutting down", None);
    }
}
