//! The host driver's life: TAP up, connect with backoff, configure over CfgUtil, move
//! frames until the fabric is lost or a signal arrives, and start again.
//!
//! With several TAP queues, each further queue is served by a thread of its own over a
//! session of its own ([`queue_thread`]); the first queue's thread (this one) also carries
//! the configuration. The queues connect, and reconnect, together: when one ends, all do.

use crate::snapshot::Snapshot;
use splitnet_config::{FabricAddr, HostConfig, HostFabric};
use splitnet_control::report::{offload_names, Counters, Interface};
use splitnet_fabric::{self as fabric, DataPath, FabricChannel, FabricLink};
use splitnet_messaging::adapter::shm::{Idle, Spin, SpinConfig};
use splitnet_messaging::adapter::Channel;
use splitnet_messaging::endpoint::{
    InPlace, Keepalive, Lane, LinkEvent, Liveness, Posted, Session,
};
use splitnet_messaging::memory::{DomainId, Frame, Registry, SendBuf, SendBufCache, SharedBytes};
use splitnet_messaging::sched::{FqConfig, LimitConfig, Scheduler};
use splitnet_messaging::vnet;
use splitnet_messaging::wire::{self, features, CfgCode, ErrorCode, HelloReply, Message, Queue};
use splitnet_netif::netdev;
use splitnet_netif::tap::{Offloads, Tap};
use splitnet_service::{self as service, notify};
use std::cell::RefCell;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

/// Frames read from the TAP per wake-up before the fabric is flushed.
const TAP_BATCH: usize = 64;
/// The largest frame the TAP gives: its virtio-net header, Ethernet with a VLAN tag, and an
/// IP packet of 64 KiB (a TSO super-frame). A frame is read straight into an IOC element only
/// if the element holds this much, since the read cannot know the frame's size first.
const TAP_FRAME_MAX: u32 = (vnet::VNET_HDR_LEN + 18 + 65_535) as u32;
/// Completions handled per channel per wake-up; credits go back after each batch, so a
/// small batch returns them sooner to the IOC, whose frames for this host wait for them.
const RX_BUDGET: usize = 32;
/// Send buffers: bounds the frames in flight to the IOC.
const SEND_BUFFERS: usize = 256;
/// How often the IOC's counters for this host are fetched (for splitnetctl).
const STATS_EVERY: Duration = Duration::from_secs(1);
/// Time allowed for the pool flush on shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// A start-up failure: the one line printed before exiting.
#[derive(Debug, Error)]
pub enum StartError {
    /// The TAP could not be created.
    #[error("cannot create TAP interface {name}: {source} (needs CAP_NET_ADMIN and /dev/net/tun)")]
    Tap {
        /// Interface name.
        name: String,
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

/// Why a connection ended.
enum End {
    /// SIGTERM or SIGINT: exit.
    Shutdown,
    /// The IOC went away or broke the protocol: reconnect.
    Lost(String),
}

/// What ends a connection from outside: a signal, or the end of another queue's
/// connection (every queue's thread holds one).
struct Stop<'s> {
    term: &'s mut Signal,
    int: &'s mut Signal,
    /// Set when any queue's connection ended.
    ended: watch::Receiver<bool>,
}

/// Why a [`Stop`] fired.
enum Reason {
    Signal,
    QueueEnded,
}

impl Stop<'_> {
    /// Waits for a signal or the end of another queue (cancel-safe).
    async fn wait(&mut self) -> Reason {
        tokio::select! {
            _ = self.term.recv() => Reason::Signal,
            _ = self.int.recv() => Reason::Signal,
            _ = self.ended.wait_for(|ended| *ended) => Reason::QueueEnded,
        }
    }
}

/// A further queue's counters, published for the first queue's snapshot.
#[derive(Debug, Clone, Copy, Default)]
struct QueueCounters {
    link: splitnet_messaging::endpoint::LinkStats,
    rx_dropped: u64,
    credits_free: u64,
    credits_in_use: u64,
}

/// One further queue's published counters.
type SharedCounters = Arc<Mutex<QueueCounters>>;

/// The further queues of one connection: their threads, the flag that ends them, and
/// their counters.
struct Queues {
    threads: Vec<JoinHandle<()>>,
    ended: Arc<watch::Sender<bool>>,
    counters: Vec<SharedCounters>,
}

impl Queues {
    /// Connects queues 1.. (one thread each, `taps[i]` serving queue i + 1) as further
    /// sessions of the host whose first queue has session `first`; returns once every one
    /// is connected, or the first failure (the ones started are then stopped).
    async fn start(
        cfg: &Arc<HostConfig>,
        taps: &[Arc<Tap>],
        node_id: u64,
        first: u64,
    ) -> Result<Queues, String> {
        let (ended, _) = watch::channel(false);
        let mut q = Queues {
            threads: Vec::new(),
            ended: Arc::new(ended),
            counters: Vec::new(),
        };
        let count = taps.len() as u8 + 1;
        let mut results = Vec::new();
        for (i, tap) in taps.iter().enumerate() {
            let queue = Queue {
                index: i as u8 + 1,
                count,
            };
            let (tx, rx) = oneshot::channel();
            let counters = SharedCounters::default();
            q.counters.push(counters.clone());
            let (cfg, tap, ended) = (cfg.clone(), tap.clone(), q.ended.clone());
            let t = std::thread::Builder::new()
                .name(format!("queue-{}", queue.index))
                .spawn(move || queue_thread(cfg, tap, queue, node_id, first, tx, ended, counters))
                .map_err(|e| format!("cannot start the thread of queue {}: {e}", queue.index))?;
            q.threads.push(t);
            results.push((queue.index, rx));
        }
        for (index, rx) in results {
            let r = rx
                .await
                .unwrap_or_else(|_| Err("its thread stopped".into()));
            if let Err(e) = r {
                // Dropping `q` stops the queues already started.
                return Err(format!("queue {index} cannot connect: {e}"));
            }
        }
        Ok(q)
    }

    /// Ends every queue's connection and waits for their threads.
    fn stop(&mut self) {
        self.ended.send_replace(true);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Queues {
    /// No queue outlives its connection (a signal may drop [`Queues::start`] half-way).
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves TAP queue `queue` over a fabric session of its own until its connection ends:
/// a signal (it flushes its pools and exits), the IOC, or another queue (`ended`).
/// `connected` hears whether the session came up; `counters` is kept current.
#[allow(clippy::too_many_arguments)]
fn queue_thread(
    cfg: Arc<HostConfig>,
    tap: Arc<Tap>,
    queue: Queue,
    node_id: u64,
    first: u64,
    connected: oneshot::Sender<Result<(), String>>,
    ended: Arc<watch::Sender<bool>>,
    counters: SharedCounters,
) {
    let rt = match service::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = connected.send(Err(format!("cannot start its runtime: {e}")));
            return;
        }
    };
    let stopped = ended.subscribe();
    let serve = async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let tap_ready = fabric::Ready::new(&*tap)?;
        let timeout = cfg.fabric.keepalive_timeout();
        let (ctrl, data, _) = connect(
            &cfg.fabric,
            cfg.pools.max_granted_bytes,
            node_id,
            queue,
            first,
            timeout,
        )
        .await
        .map_err(|e| io::Error::other(e.to_string()))?;
        let mut conn = Conn::new(&cfg, queue, &tap, &tap_ready, ctrl, data, None)?;
        conn.publish = Some(counters);
        debug!(queue = queue.index, "queue connected");
        let _ = connected.send(Ok(()));
        let mut stop = Stop {
            term: &mut term,
            int: &mut int,
            ended: stopped,
        };
        let end = conn
            .run(&mut stop, &mut true, &mut notify::Watchdog::disabled())
            .await;
        conn.close();
        if let End::Lost(why) = end {
            warn!(queue = queue.index, "queue's connection lost: {why}");
        }
        Ok::<(), io::Error>(())
    };
    if let Err(e) = rt.block_on(serve) {
        warn!(queue = queue.index, "queue stopped: {e}");
    }
    // The connection is over for every queue once one of them ends (a sender that was
    // already told so by the others keeps the value).
    ended.send_replace(true);
}

/// Runs until SIGTERM/SIGINT. Only start-up failures are errors; an unreachable IOC is not.
pub async fn run(cfg: HostConfig, control_socket: Option<PathBuf>) -> Result<(), StartError> {
    let cfg = Arc::new(cfg);
    let name = cfg.interface.name.clone();
    let tap_err = |source| StartError::Tap {
        name: name.clone(),
        source,
    };
    let mut more_taps: Vec<Arc<Tap>> = Tap::open_queues(&name, cfg.interface.queues.into())
        .map_err(tap_err)?
        .into_iter()
        .map(Arc::new)
        .collect();
    if more_taps.is_empty() {
        return Err(tap_err(io::Error::other("no TAP queue opened")));
    }
    let tap = more_taps.remove(0);
    // Persistent: sd0 outlives this process (restart, upgrade, crash), and the next driver
    // re-attaches to it with its addresses, routes, MAC and MTU.
    tap.set_persist(cfg.interface.persist).map_err(tap_err)?;
    let mut keep_mtu = tap.reattached();
    if tap.reattached() {
        info!(interface = %name, "re-attached to the existing interface: addresses, routes, MAC and MTU kept");
    }
    let offloads = tap
        .enable_offloads(cfg.interface.offload)
        .map_err(|source| StartError::Tap {
            name: name.clone(),
            source,
        })?;
    tap.set_carrier(false)?;
    info!(interface = %name, ?offloads, "TAP ready, carrier off until the fabric is up");
    let tap_ready = fabric::Ready::new(&tap)?;
    let snap = Rc::new(RefCell::new(Snapshot::new(
        cfg.fabric.ioc.to_string(),
        Interface {
            name: name.clone(),
            mac: netdev::mac(&name)
                .map(|m| wire::fmt_mac(&m))
                .unwrap_or_default(),
            mtu: netdev::mtu(&name).unwrap_or(0),
            carrier: false,
            promisc: false,
            multicast: 0,
            offloads: offload_names(feature_bits(&offloads)),
        },
    )));
    service::serve_operators(snap.clone(), cfg.metrics.listen, control_socket).await?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let min = cfg.fabric.reconnect_min();
    let mut backoff = min;
    let mut ready_sent = false;
    let mut watchdog = notify::Watchdog::from_env();
    let queue = Queue {
        index: 0,
        count: cfg.interface.queues as u8,
    };
    loop {
        watchdog.kick(Instant::now());
        notify::status(&format!("connecting to IOC {}", cfg.fabric.ioc));
        let node_id = cfg.fabric.node_id.unwrap_or_else(|| default_node_id(&name));
        let connect = async {
            let timeout = cfg.fabric.keepalive_timeout();
            let (ctrl, data, reply) = connect(
                &cfg.fabric,
                cfg.pools.max_granted_bytes,
                node_id,
                queue,
                0,
                timeout,
            )
            .await
            .map_err(|e| format!("IOC {} unreachable: {e}", cfg.fabric.ioc))?;
            // The further queues join the first queue's session before any frame moves.
            let queues = Queues::start(&cfg, &more_taps, node_id, reply.session).await?;
            Ok::<_, String>((ctrl, data, reply, queues))
        };
        let conn = tokio::select! {
            c = connect => c,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        let (ctrl, data, reply, mut queues) = match conn {
            Ok(c) => c,
            Err(e) => {
                warn!("{e}; retrying in {backoff:?}");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = term.recv() => return Ok(()),
                    _ = int.recv() => return Ok(()),
                }
                backoff = (backoff * 2).min(cfg.fabric.reconnect_max());
                continue;
            }
        };
        backoff = min;
        info!(
            ioc = %cfg.fabric.ioc,
            session = reply.session,
            version = reply.version,
            queues = queue.count,
            "fabric up"
        );
        snap.borrow_mut().connected(reply.session, reply.version);
        let mut conn = Conn::new(
            &cfg,
            queue,
            &tap,
            &tap_ready,
            ctrl,
            data,
            Some(snap.clone()),
        )?;
        conn.others = queues.counters.clone();
        conn.keep_mtu = std::mem::take(&mut keep_mtu);
        let mut stop = Stop {
            term: &mut term,
            int: &mut int,
            ended: queues.ended.subscribe(),
        };
        let end = conn.run(&mut stop, &mut ready_sent, &mut watchdog).await;
        let _ = tap.set_carrier(false);
        queues.stop();
        conn.close();
        snap.borrow_mut().disconnected();
        match end {
            End::Shutdown => {
                if cfg.interface.persist {
                    info!(
                        "stopped; {name} stays (carrier off) until a host-driver serves it again"
                    );
                } else {
                    info!("stopped; {name} goes with it (interface.persist = false)");
                }
                return Ok(());
            }
            End::Lost(why) => {
                warn!("fabric lost: {why}; carrier off, reconnecting");
            }
        }
    }
}

/// The features a TAP with `o` makes the kernel use, as told to the IOC.
fn feature_bits(o: &Offloads) -> u64 {
    let mut f = features::VNET_HDR;
    if o.csum {
        f |= features::CSUM;
    }
    if o.tso {
        f |= features::TSO4 | features::TSO6 | features::ECN;
    }
    if o.uso {
        f |= features::USO;
    }
    f
}

/// A stable identity for this host: its machine id and interface name, unless configured.
fn default_node_id(ifname: &str) -> u64 {
    let machine = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    // The fabric address distinguishes hosts that share a machine id (namespaces, clones).
    let host = splitnet_netif::hostname();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in machine
        .trim()
        .bytes()
        .chain(host.trim().bytes())
        .chain(ifname.bytes())
        .chain(netns_inode().to_le_bytes())
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn netns_inode() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Opens both channels of `queue`'s session to the IOC at `ioc` (TCP, or its local Unix
/// socket) and completes the handshake (see [`fabric::connect`]).
async fn connect(
    cfg: &HostFabric,
    pool_bytes: u64,
    node_id: u64,
    queue: Queue,
    first: u64,
    timeout: Duration,
) -> Result<(FabricChannel, FabricChannel, HelloReply), fabric::FabricError> {
    match &cfg.ioc {
        FabricAddr::Tcp(a) => {
            let dial = || fabric::dial_tcp(*a);
            fabric::connect(dial, DataPath::Stream, node_id, queue, first, timeout).await
        }
        FabricAddr::Unix(p) => {
            let path = if cfg.shared_memory {
                DataPath::Shm { pool_bytes }
            } else {
                DataPath::Stream
            };
            fabric::connect(
                || fabric::dial_unix(p),
                path,
                node_id,
                queue,
                first,
                timeout,
            )
            .await
        }
    }
}

/// The STATUS= line: peer, carrier and throughput, refreshed every few seconds.
struct StatusLine {
    at: Instant,
    last: splitnet_messaging::endpoint::LinkStats,
}

impl StatusLine {
    const EVERY: Duration = Duration::from_secs(5);

    fn new(stats: splitnet_messaging::endpoint::LinkStats) -> StatusLine {
        StatusLine {
            at: Instant::now(),
            last: stats,
        }
    }

    fn update(
        &mut self,
        now: Instant,
        s: splitnet_messaging::endpoint::LinkStats,
        peer: &str,
        carrier: bool,
    ) {
        let dt = now.duration_since(self.at);
        if dt < Self::EVERY {
            return;
        }
        let rate = |b: u64, a: u64| (b - a) as f64 * 8.0 / dt.as_secs_f64() / 1e6;
        notify::status(&format!(
            "fabric up to IOC {peer}, carrier {}, tx {:.0} Mb/s, rx {:.0} Mb/s",
            if carrier { "on" } else { "off" },
            rate(s.tx_bytes, self.last.tx_bytes),
            rate(s.rx_bytes, self.last.rx_bytes),
        ));
        self.at = now;
        self.last = s;
    }
}

/// Whether the TAP is worth waiting for: the kernel sends on a queue only while the first
/// queue has the carrier on; and with every send buffer queued (in the flow queue or on the
/// fabric socket) there is nothing to read into: returned credits or the socket's
/// writability wake the loop instead, so a full socket never makes it spin.
fn tap_wanted(sending: bool, buffers: bool) -> bool {
    sending && buffers
}

/// The poll before sleeping of a link over shared memory, if configured.
fn spin(cfg: &HostConfig, ready: &fabric::LinkReady) -> Option<Spin> {
    let max = cfg.fabric.spin_max();
    (ready.is_shared_memory() && !max.is_zero()).then(|| {
        Spin::new(SpinConfig {
            max,
            ..SpinConfig::default()
        })
    })
}

/// One queue's connection to the IOC.
struct Conn<'a> {
    /// The TAP queue it serves; the first also carries the configuration and the carrier.
    queue: Queue,
    tap: &'a Tap,
    tap_ready: &'a fabric::Ready,
    name: String,
    peer: String,
    mac_override: Option<[u8; 6]>,
    tl: FabricLink,
    reg: Registry,
    cache: SendBufCache,
    /// Frames read from the TAP waiting for credit or the byte limit, by flow.
    tx: Scheduler<SendBuf>,
    /// Frames the flow queue dropped (a flow over its share: its newest; the queue full:
    /// the longest flow's oldest).
    queue_drops: u64,
    keepalive: Keepalive,
    mtu_known: bool,
    /// MTU agreed with the IOC and set on the TAP.
    mtu: u32,
    /// Largest MTU the IOC accepts.
    mtu_max: u32,
    /// An MTU set on the TAP by an administrator, asked of the IOC, not yet answered.
    mtu_pending: Option<u32>,
    /// Promiscuous mode last reported to the IOC.
    promisc: bool,
    /// Next time the TAP's settings are compared with what the IOC knows.
    next_watch: Instant,
    mac_known: bool,
    link_up: bool,
    carrier: bool,
    /// Features told to the IOC (SetFeatures): what sd0's offloads let the kernel send.
    features: u64,
    rx_dropped: u64,
    /// What operators see (the first queue's connection keeps it).
    snap: Option<Rc<RefCell<Snapshot>>>,
    /// A further queue: where it publishes its counters.
    publish: Option<SharedCounters>,
    /// The first queue: the further queues' counters, added into the snapshot.
    others: Vec<SharedCounters>,
    /// Next time the IOC's counters for this host are asked for (GetStats).
    next_stats: Instant,
    /// Multicast groups of the TAP last reported to the IOC.
    multicast: Vec<[u8; 6]>,
    /// The TAP was re-attached and this is its first connection: its MTU is kept (asked
    /// of the IOC) rather than replaced by the IOC's.
    keep_mtu: bool,
    /// Over shared memory: how long to poll before sleeping (`None`: never poll).
    spin: Option<Spin>,
}

impl<'a> Conn<'a> {
    fn new(
        cfg: &HostConfig,
        queue: Queue,
        tap: &'a Tap,
        tap_ready: &'a fabric::Ready,
        ctrl: FabricChannel,
        data: fabric::FabricChannel,
        snap: Option<Rc<RefCell<Snapshot>>>,
    ) -> io::Result<Conn<'a>> {
        // Offloads as configured, again for each IOC (the last one may have refused them);
        // they belong to the interface, so the first queue sets them.
        let features = match queue.is_first() {
            true => feature_bits(&tap.enable_offloads(cfg.interface.offload)?),
            false => 0,
        };
        let sc = cfg.pools.session_config();
        let mut reg = Registry::new(cfg.pools.max_granted_bytes);
        // Over shared memory the IOC places its frames straight into the pools.
        if let Some(arena) = data.pools() {
            reg.attach_arena(DomainId(1), arena)
                .map_err(|e| io::Error::other(format!("cannot lay out pools: {e}")))?;
        }
        let mut session = Session::new(DomainId(1), sc);
        session
            .start(&mut reg)
            .map_err(|e| io::Error::other(format!("cannot register pools: {e}")))?;
        let mut tl = FabricLink::new(session, ctrl, data)?;
        let spin = spin(cfg, &tl.ready);
        let s = tl.link.session_mut();
        if queue.is_first() {
            match cfg.interface.mac {
                Some(mac) => {
                    s.cfg_request(CfgCode::SetMac, &mac.0);
                }
                None => {
                    s.cfg_request(CfgCode::GetMac, &[]);
                }
            }
            s.cfg_request(CfgCode::GetMtu, &[]);
            s.cfg_request(CfgCode::GetLink, &[]);
            s.cfg_request(CfgCode::SetFeatures, &features.to_be_bytes());
        }
        Ok(Conn {
            queue,
            tap,
            tap_ready,
            name: cfg.interface.name.clone(),
            peer: cfg.fabric.ioc.to_string(),
            mac_override: cfg.interface.mac.map(|m| m.0),
            tl,
            reg,
            cache: SendBufCache::new(wire::MAX_SEND_DATA, SEND_BUFFERS),
            tx: Scheduler::new(
                FqConfig::default(),
                Some(LimitConfig::default()),
                Instant::now(),
            ),
            queue_drops: 0,
            keepalive: Keepalive::new(
                cfg.fabric.keepalive_interval(),
                cfg.fabric.keepalive_timeout(),
                Instant::now(),
            ),
            mtu_known: false,
            mtu: 0,
            mtu_max: 0,
            mtu_pending: None,
            promisc: false,
            next_watch: Instant::now(),
            mac_known: false,
            link_up: false,
            carrier: false,
            features,
            rx_dropped: 0,
            snap,
            publish: None,
            others: Vec::new(),
            next_stats: Instant::now(),
            multicast: Vec::new(),
            keep_mtu: false,
            spin,
        })
    }

    /// Over shared memory, before the loop sleeps: polls the IOC's ring, and the TAP when
    /// it is wanted, for the adaptive budget (`adapter::shm::Spin`), with the doorbell
    /// request withdrawn meanwhile (the IOC need not ring for what the poll finds). Then
    /// asks for the doorbell again and says whether the loop may sleep ([`Link::prepare_sleep`]);
    /// a TAP frame found is left to the reactor, whose next look finds it at once. Also
    /// returns when the idle period began, if the poll found nothing. No poll while
    /// operations wait for room in the ring: the room the IOC frees is what ends that wait,
    /// and only its doorbell says so.
    fn poll_before_sleep(&mut self, tap_wanted: bool) -> (bool, Option<Instant>) {
        let Some(spin) = self.spin.as_mut() else {
            return (true, None);
        };
        if self.tl.link.pending() > 0 {
            return (true, None);
        }
        if self.tl.link.data_channel_mut().take_rang_peer() {
            spin.rang_peer();
        }
        let start = Instant::now();
        let budget = spin.budget();
        if budget.is_zero() {
            return (true, Some(start));
        }
        let link = &mut self.tl.link;
        link.wake(Lane::Data);
        let mut caught = false;
        for i in 0u32.. {
            caught = link.data_channel_mut().input_pending()
                || (tap_wanted && i % 8 == 0 && self.tap.readable_now().unwrap_or(true));
            if caught || start.elapsed() >= budget {
                break;
            }
            std::hint::spin_loop();
        }
        if caught {
            spin.idle_ended(Idle::Caught {
                after: start.elapsed(),
            });
        }
        let sleep = link.prepare_sleep(Lane::Data);
        (sleep, (sleep && !caught).then_some(start))
    }

    async fn run(
        &mut self,
        stop: &mut Stop<'_>,
        ready_sent: &mut bool,
        watchdog: &mut notify::Watchdog,
    ) -> End {
        let mut events = Vec::new();
        let mut status = StatusLine::new(self.tl.link.stats());
        let first = self.queue.is_first();
        loop {
            if let Err(e) = self.tl.link.flush() {
                return End::Lost(e.to_string());
            }
            self.tl.link.reclaim(&mut self.cache);
            if first {
                self.update_carrier(ready_sent);
            }
            let tap_wanted = tap_wanted(self.carrier || !first, self.cache.has_free());
            let pending = self.tl.link.pending() > 0;
            let deadline = tokio::time::Instant::from_std(self.keepalive.deadline());
            // Shared memory: ask for the doorbell; records may be waiting already. Before
            // sleeping, poll a while (adaptively) for what would wake us.
            let mut sleep = self.tl.link.prepare_sleep(Lane::Data);
            let mut idle_since = None;
            if sleep {
                (sleep, idle_since) = self.poll_before_sleep(tap_wanted);
            }
            let sleep_ctrl = self.tl.link.prepare_sleep(Lane::Control);
            let FabricLink { ready, link } = &mut self.tl;
            let (ctrl_writable, data_writable) =
                (ready.writable(Lane::Control), ready.writable(Lane::Data));
            let mut rx_seen = false;
            // Woken by what a poll before sleeping could have caught (the doorbell, the TAP).
            let mut woke_for_input = false;
            let step: Result<(), String> = tokio::select! {
                r = stop.wait() => match r {
                    Reason::Signal => return self.shutdown().await,
                    Reason::QueueEnded => return End::Lost("another queue's connection ended".into()),
                },
                g = self.tap_ready.readable(), if tap_wanted => match g {
                    Ok(mut g) => {
                        woke_for_input = true;
                        if self.read_tap() {
                            g.clear_ready();
                        }
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                },
                r = ready.input([sleep_ctrl, sleep]) => match r {
                    Ok((lane, g)) => {
                        if g.is_some() {
                            // Woken by that lane's doorbell (or socket): withdraw its request.
                            link.wake(lane);
                            woke_for_input |= lane == Lane::Data;
                        }
                        rx_seen = true;
                        Self::poll_lane(link, &mut self.reg, self.tap, &mut self.rx_dropped, lane, g, &mut events)
                    }
                    Err(e) => Err(e.to_string()),
                },
                g = ready.data.writable(), if pending && data_writable => match g {
                    Ok(mut g) => match link.flush() {
                        Ok(true) => Ok(()),
                        Ok(false) => { g.clear_ready(); Ok(()) }
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                },
                g = ready.ctrl.writable(), if pending && ctrl_writable => match g {
                    Ok(mut g) => match link.flush() {
                        Ok(true) => Ok(()),
                        Ok(false) => { g.clear_ready(); Ok(()) }
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                },
                _ = tokio::time::sleep_until(deadline) => Ok(()),
            };
            if let Err(why) = step {
                // A leaving IOC sends Goodbye on the control channel and closes both; the
                // data channel's end of stream may be seen first.
                let mut dropped = 0;
                let _ = Self::poll_lane(
                    &mut self.tl.link,
                    &mut self.reg,
                    self.tap,
                    &mut dropped,
                    Lane::Control,
                    None,
                    &mut events,
                );
                for ev in events.drain(..) {
                    if let LinkEvent::Goodbye(code) = ev {
                        return End::Lost(format!("IOC closed the connection ({code:?})"));
                    }
                }
                return End::Lost(why);
            }
            let now = Instant::now();
            if let (Some(spin), Some(since), true) =
                (self.spin.as_mut(), idle_since, woke_for_input)
            {
                spin.idle_ended(Idle::Slept {
                    slept: now.duration_since(since),
                });
            }
            if rx_seen {
                self.keepalive.on_rx(now);
            }
            // The keepalive timer turns this loop at least every keepalive interval.
            watchdog.kick(now);
            if first {
                self.watch_interface(now);
                self.refresh_snapshot();
                status.update(now, self.tl.link.stats(), &self.peer, self.carrier);
            } else {
                self.publish_counters();
            }
            match self.keepalive.poll(now) {
                Liveness::Idle => {}
                Liveness::SendKeepalive => self
                    .tl
                    .link
                    .session_mut()
                    .send(Lane::Control, &Message::Keepalive),
                Liveness::Expired => {
                    return End::Lost("IOC silent beyond the keepalive timeout".into())
                }
            }
            for ev in events.drain(..) {
                if let Some(end) = self.on_event(ev) {
                    return end;
                }
            }
            self.tl.link.session_mut().flush_credits(&mut self.reg);
        }
    }

    fn poll_lane(
        link: &mut splitnet_messaging::endpoint::Link<fabric::FabricChannel>,
        reg: &mut Registry,
        tap: &Tap,
        rx_dropped: &mut u64,
        lane: Lane,
        guard: Option<fabric::Guard<'_>>,
        events: &mut Vec<LinkEvent>,
    ) -> Result<(), String> {
        let mut sink = |frame: Frame<'_>| {
            // A frame in a shared pool: its header is checked from a private copy, and that
            // copy is what the TAP gets, followed by the rest straight from the pool.
            let mut head = [0u8; vnet::VNET_HDR_LEN];
            let checked = match frame {
                Frame::Private(b) => vnet::check_frame(b),
                Frame::Shared(_) => {
                    let n = frame.head(&mut head);
                    vnet::check_head(&head[..n], frame.len())
                }
            };
            let sent = match (checked, frame) {
                (Err(e), _) => {
                    *rx_dropped += 1;
                    warn!("dropping frame from the IOC: {e}");
                    return;
                }
                (Ok(_), Frame::Private(b)) => tap.send(b),
                (Ok(_), Frame::Shared(s)) => tap.send_parts(&head, &s.after(head.len())),
            };
            if let Err(e) = sent {
                *rx_dropped += 1;
                debug!("TAP write failed: {e}");
            }
        };
        match link.poll(reg, lane, RX_BUDGET, &mut sink, events) {
            Ok(true) => Ok(()),
            Ok(false) => {
                if let Some(mut g) = guard {
                    g.clear_ready();
                }
                Ok(())
            }
            Err(e) => {
                // The error table (docs/protocol.md, section 7): Goodbye with the row's code
                // on the control channel, then the session (every queue) ends.
                match link.fail(&e) {
                    Some(code) => Err(format!(
                        "IOC broke the protocol: {e}; sent Goodbye({code:?})"
                    )),
                    None => Err(e.to_string()),
                }
            }
        }
    }

    /// Reads frames from the TAP into the flow queue and sends what the byte limit lets
    /// through. Returns true when the TAP is drained.
    fn read_tap(&mut self) -> bool {
        let mut drained = false;
        // Read even when the flow queue is full: it then drops from its longest flow, so a
        // new sparse flow still gets in instead of waiting in the TAP's ring.
        for _ in 0..TAP_BATCH {
            // Nothing waits and the limit lets one more go: over shared memory the frame is
            // read straight into an element of the IOC's, and no copy of it is made here.
            let inflight = self.tl.link.session().initiator().inflight_bytes();
            if self.tl.link.places_writes() && self.tx.may_bypass(inflight) {
                let tap = self.tap;
                let read = |dst: &SharedBytes<'_>| tap.recv_into(dst);
                match self.tl.link.read_in_place(TAP_FRAME_MAX, read) {
                    Some(InPlace::Posted(_) | InPlace::Inline(_)) => continue,
                    Some(InPlace::Dropped(n)) => {
                        warn!(len = n, "frame larger than an IOC element; dropped");
                        continue;
                    }
                    Some(InPlace::Empty) => {
                        drained = true;
                        break;
                    }
                    Some(InPlace::Failed(e)) => {
                        if e.kind() != io::ErrorKind::WouldBlock {
                            warn!("TAP read failed: {e}");
                        }
                        drained = true;
                        break;
                    }
                    // No element that large is free: a send buffer.
                    None => {}
                }
            }
            let Some(mut buf) = self.cache.get() else {
                break;
            };
            match self.tap.recv(buf.space()) {
                Ok(n) => buf.set_len(n),
                Err(e) => {
                    self.cache.put(buf);
                    if e.kind() != io::ErrorKind::WouldBlock {
                        warn!("TAP read failed: {e}");
                    }
                    drained = true;
                    break;
                }
            }
            let Conn {
                tx,
                cache,
                queue_drops,
                ..
            } = self;
            let (flow, len) = (tx.flow(buf.as_slice()), buf.len() as u32);
            tx.push(flow, len, buf, &mut |b| {
                cache.put(b);
                *queue_drops += 1;
            });
        }
        self.send_queued();
        drained
    }

    /// Posts queued frames, the one held back for credit first, then the flow queue's
    /// choice, while the byte limit lets more go in flight.
    fn send_queued(&mut self) {
        loop {
            let inflight = self.tl.link.session().initiator().inflight_bytes();
            let Some(buf) = self.tx.next(inflight) else {
                return;
            };
            if !self.post(buf) {
                return;
            }
        }
    }

    /// Posts a frame; false when it is held back for lack of credit.
    fn post(&mut self, buf: SendBuf) -> bool {
        match self.tl.link.post_frame(buf) {
            Posted::SendData | Posted::Rdma => true,
            Posted::Backpressure(b) => {
                self.tx.hold(b);
                false
            }
            Posted::TooLarge(b) => {
                warn!(len = b.len(), "frame larger than any IOC pool; dropped");
                self.cache.put(b);
                true
            }
        }
    }

    fn on_event(&mut self, ev: LinkEvent) -> Option<End> {
        match ev {
            LinkEvent::Credits => {
                let ini = self.tl.link.session_mut().initiator_mut();
                let done = ini.take_completed();
                let inflight = ini.inflight_bytes();
                self.tx.completed(done, inflight, Instant::now());
                self.send_queued();
            }
            LinkEvent::CfgReply {
                code, status, data, ..
            } => self.on_cfg_reply(code, status, &data),
            LinkEvent::CfgRequest { txn, code, data } => {
                let status = match code {
                    // The interface follows the first queue's session.
                    CfgCode::LinkChange if !self.queue.is_first() => ErrorCode::Refused,
                    CfgCode::LinkChange => match wire::LinkChange::parse(&data) {
                        Ok(c) => {
                            info!(up = c.up, mtu = c.mtu, "NIC link change");
                            self.link_up = c.up;
                            self.mtu_max = c.mtu;
                            if !self.mtu_known || self.mtu > c.mtu {
                                self.take_ioc_mtu(c.mtu);
                            }
                            ErrorCode::Ok
                        }
                        Err(_) => ErrorCode::Malformed,
                    },
                    _ => ErrorCode::Unsupported,
                };
                self.tl.link.session_mut().cfg_reply(txn, code, status, &[]);
            }
            LinkEvent::Goodbye(code) => {
                return Some(End::Lost(format!("IOC closed the connection ({code:?})")));
            }
            LinkEvent::PoolGet(o) => debug!(?o, "pool request from the IOC"),
            LinkEvent::Flushed { .. } => {}
            LinkEvent::RefusedInline { len } => {
                self.rx_dropped += 1;
                debug!(len, "refused a SendData frame one of our pools could hold");
            }
        }
        None
    }

    fn on_cfg_reply(&mut self, code: CfgCode, status: ErrorCode, data: &[u8]) {
        if status != ErrorCode::Ok {
            warn!(?code, ?status, "IOC refused a configuration request");
            if code == CfgCode::SetMtu {
                if let Some(asked) = self.mtu_pending.take() {
                    warn!(
                        "MTU {asked} on {} refused by the IOC ({status:?}); back to {}",
                        self.name, self.mtu
                    );
                    let _ = netdev::set_mtu(&self.name, self.mtu);
                }
            }
            if code == CfgCode::SetFeatures && self.features != features::VNET_HDR {
                // The IOC's NIC side takes no offloads: the kernel must hand sd0 plain,
                // fully checksummed frames.
                match self.tap.enable_offloads(false) {
                    Ok(_) => {
                        warn!(
                            "IOC does not take checksum/segmentation offloads; turned them off on {}",
                            self.name
                        );
                        self.features = features::VNET_HDR;
                        self.tl
                            .link
                            .session_mut()
                            .cfg_request(CfgCode::SetFeatures, &self.features.to_be_bytes());
                    }
                    Err(e) => warn!("cannot turn the offloads of {} off: {e}", self.name),
                }
            }
            if code == CfgCode::SetMac {
                // Fall back to the MAC the IOC assigns.
                self.tl.link.session_mut().cfg_request(CfgCode::GetMac, &[]);
            }
            return;
        }
        match code {
            CfgCode::GetMac | CfgCode::SetMac => {
                let mac = if code == CfgCode::SetMac {
                    self.mac_override
                } else {
                    wire::parse_mac(data).ok()
                };
                // The MAC a re-attached interface already has is left alone on its first
                // connection: setting it anew would make the kernel flush the neighbour
                // entries that outlived the daemon. On a reconnect it is set again: the
                // carrier going down already flushed the entries that were good, and the
                // flush clears those that failed while the IOC was away, which the kernel
                // would otherwise keep answering with errors for a second or more.
                let keep = self.keep_mtu;
                if let Some(mac) = mac.filter(|m| keep && netdev::mac(&self.name).ok() == Some(*m))
                {
                    debug!(mac = %wire::fmt_mac(&mac), "MAC address already set");
                    self.mac_known = true;
                } else if let Some(mac) = mac {
                    match netdev::set_mac(&self.name, mac) {
                        Ok(()) => {
                            info!(mac = %wire::fmt_mac(&mac), "MAC address set");
                            self.mac_known = true;
                        }
                        Err(e) => warn!("cannot set the MAC of {}: {e}", self.name),
                    }
                }
            }
            CfgCode::GetMtu => {
                if let Ok(m) = wire::Mtu::parse(data) {
                    self.mtu_max = m.max;
                    // An MTU being asked of the IOC (a kept one) is not overridden.
                    if self.mtu_pending.is_none() {
                        self.take_ioc_mtu(m.current);
                    }
                }
            }
            CfgCode::SetMtu => {
                if let Some(n) = self.mtu_pending.take() {
                    info!(mtu = n, "MTU accepted by the IOC");
                    self.mtu = n;
                }
            }
            CfgCode::SetPromisc => {
                debug!(promisc = self.promisc, "promiscuous mode set on the IOC")
            }
            CfgCode::GetLink => {
                if let Ok(v) = wire::parse_u8(data) {
                    self.link_up = v == 1;
                }
            }
            CfgCode::SetFeatures => debug!(
                features = ?features::names(self.features),
                "offload features agreed"
            ),
            CfgCode::SetMulticast => debug!(
                groups = self.multicast.len(),
                "multicast groups set on the IOC"
            ),
            CfgCode::GetStats => {
                if let (Ok(st), Some(snap)) = (wire::Stats::parse(data), &self.snap) {
                    snap.borrow_mut().ioc_counters = Some(Counters::from(&st));
                }
            }
            other => debug!(?other, "CfgUtil reply"),
        }
    }

    /// Takes the IOC's current MTU onto sd0, unless sd0 was re-attached with an MTU of its
    /// own that the IOC allows: that one is kept, and [`Conn::watch_interface`] asks the IOC
    /// for it (SetMtu) as for an `ip link set sd0 mtu` change.
    fn take_ioc_mtu(&mut self, current: u32) {
        if self.keep_mtu {
            match netdev::mtu(&self.name) {
                Ok(cur) if cur != current && (68..=self.mtu_max).contains(&cur) => {
                    info!(mtu = cur, "keeping the MTU of {}", self.name);
                    self.mtu = current;
                    self.mtu_known = true;
                    return;
                }
                _ => self.keep_mtu = false,
            }
        }
        self.apply_mtu(current);
    }

    fn apply_mtu(&mut self, mtu: u32) {
        match netdev::set_mtu(&self.name, mtu) {
            Ok(()) => {
                info!(mtu, "MTU set from the IOC");
                self.mtu = mtu;
                self.mtu_known = true;
            }
            Err(e) => warn!("cannot set MTU {mtu} on {}: {e}", self.name),
        }
    }

    /// Maps what Linux tools did to the TAP onto CfgUtil: `ip link set sd0 mtu N` becomes
    /// SetMtu (refused at once beyond the IOC's maximum, and reverted if the IOC refuses),
    /// `ip link set sd0 promisc on|off` becomes SetPromisc.
    fn watch_interface(&mut self, now: Instant) {
        if now < self.next_watch || !self.mtu_known {
            return;
        }
        self.next_watch = now + Duration::from_millis(250);
        if self.mtu_pending.is_none() {
            if let Ok(cur) = netdev::mtu(&self.name) {
                // Asked of the IOC below, or already agreed: nothing more to keep.
                self.keep_mtu = false;
                if cur != self.mtu {
                    if cur > self.mtu_max || cur < 68 {
                        warn!(
                            "MTU {cur} on {} refused: the IOC allows 68..={}; back to {}",
                            self.name, self.mtu_max, self.mtu
                        );
                        let _ = netdev::set_mtu(&self.name, self.mtu);
                    } else {
                        info!(mtu = cur, "MTU changed on {}; asking the IOC", self.name);
                        self.mtu_pending = Some(cur);
                        self.tl
                            .link
                            .session_mut()
                            .cfg_request(CfgCode::SetMtu, &cur.to_be_bytes());
                    }
                }
            }
        }
        if let Ok(flags) = netdev::flags(&self.name) {
            let promisc = flags & libc::IFF_PROMISC != 0;
            if promisc != self.promisc {
                self.promisc = promisc;
                info!(promisc, "promiscuous mode changed on {}", self.name);
                self.tl
                    .link
                    .session_mut()
                    .cfg_request(CfgCode::SetPromisc, &[u8::from(promisc)]);
            }
        }
        match netdev::multicast(&self.name) {
            Ok(mut groups) => {
                groups.truncate(wire::MAX_MULTICAST);
                if groups != self.multicast {
                    info!(
                        groups = groups.len(),
                        "multicast groups changed on {}", self.name
                    );
                    let data: Vec<u8> = groups.iter().flatten().copied().collect();
                    self.multicast = groups;
                    self.tl
                        .link
                        .session_mut()
                        .cfg_request(CfgCode::SetMulticast, &data);
                }
            }
            Err(e) => debug!("cannot read the multicast groups of {}: {e}", self.name),
        }
        self.refresh_details(now);
    }

    /// This connection's counters.
    fn counters(&self) -> QueueCounters {
        let ini = self.tl.link.session().initiator();
        QueueCounters {
            link: self.tl.link.stats(),
            rx_dropped: self.rx_dropped,
            credits_free: ini.credits(),
            credits_in_use: ini.in_use(),
        }
    }

    /// A further queue: publishes its counters for the first queue's snapshot.
    fn publish_counters(&self) {
        if let Some(Ok(mut p)) = self.publish.as_ref().map(|p| p.lock()) {
            *p = self.counters();
        }
    }

    /// Counters for the metrics and control sockets, all queues together: cheap, on every
    /// turn.
    fn refresh_snapshot(&self) {
        let Some(snap) = &self.snap else { return };
        let mut sum = self.counters();
        for o in self.others.iter().filter_map(|o| o.lock().ok().map(|g| *g)) {
            sum.link += o.link;
            sum.rx_dropped += o.rx_dropped;
            sum.credits_free += o.credits_free;
            sum.credits_in_use += o.credits_in_use;
        }
        let mut g = snap.borrow_mut();
        let l = self.tx.stats().unwrap_or_default();
        g.tx_limit = splitnet_control::report::TxLimit {
            limit_bytes: l.limit,
            grown: l.grown,
            shrunk: l.shrunk,
            held_back: l.held_back,
            queued: self.tx.waiting() as u64,
            queue_drops: self.queue_drops,
        };
        g.interface.carrier = self.carrier;
        g.rx_dropped = sum.rx_dropped;
        g.credits_free = sum.credits_free;
        g.credits_in_use = sum.credits_in_use;
        g.link = sum.link;
    }

    /// Pools and interface settings for the control socket: every watch period.
    fn refresh_details(&mut self, now: Instant) {
        let Some(snap) = &self.snap else { return };
        let mut g = snap.borrow_mut();
        g.set_pools(self.tl.link.session());
        let i = &mut g.interface;
        i.mtu = self.mtu;
        i.promisc = self.promisc;
        i.multicast = self.multicast.len() as u32;
        i.offloads = offload_names(self.features);
        if let Ok(mac) = netdev::mac(&self.name) {
            i.mac = wire::fmt_mac(&mac);
        }
        drop(g);
        if now >= self.next_stats {
            self.next_stats = now + STATS_EVERY;
            self.tl
                .link
                .session_mut()
                .cfg_request(CfgCode::GetStats, &[]);
        }
    }

    fn update_carrier(&mut self, ready_sent: &mut bool) {
        let want = self.mac_known && self.mtu_known && self.link_up;
        if want != self.carrier {
            match self.tap.set_carrier(want) {
                Ok(()) => {
                    self.carrier = want;
                    info!(carrier = want, "carrier");
                }
                Err(e) => warn!("cannot set carrier: {e}"),
            }
        }
        if want && !*ready_sent {
            *ready_sent = true;
            notify::ready("fabric up, data path ready");
        }
    }

    /// SIGTERM: flush pools with the IOC (both directions), say goodbye, stop.
    async fn shutdown(&mut self) -> End {
        if self.queue.is_first() {
            notify::stopping();
            info!("shutting down: flushing pools with the IOC");
            let _ = self.tap.set_carrier(false);
        }
        self.tl.link.session_mut().start_flush(&mut self.reg);
        let deadline = tokio::time::Instant::now() + FLUSH_TIMEOUT;
        let mut events = Vec::new();
        while !self.tl.link.session().is_flushed() {
            if self.tl.link.flush().is_err() {
                break;
            }
            let sleeps = [Lane::Control, Lane::Data].map(|l| self.tl.link.prepare_sleep(l));
            let FabricLink { ready, link } = &mut self.tl;
            let r = tokio::select! {
                r = ready.input(sleeps) => r,
                _ = tokio::time::sleep_until(deadline) => break,
            };
            let Ok((lane, g)) = r else { break };
            if g.is_some() {
                link.wake(lane);
            }
            let mut drop_frames = 0u64;
            if Self::poll_lane(
                link,
                &mut self.reg,
                self.tap,
                &mut drop_frames,
                lane,
                g,
                &mut events,
            )
            .is_err()
            {
                break;
            }
            events.clear();
        }
        let flushed = self.tl.link.session().is_flushed();
        self.tl.link.goodbye(ErrorCode::ShuttingDown);
        if flushed {
            info!("pools flushed");
        } else {
            warn!("pool flush incomplete within {FLUSH_TIMEOUT:?}");
        }
        End::Shutdown
    }

    fn close(mut self) {
        self.tl.link.close(&mut self.reg, &mut self.cache);
        if self.rx_dropped > 0 {
            info!(dropped = self.rx_dropped, "frames from the IOC dropped");
        }
        let waiting = self.tx.waiting();
        if waiting > 0 || self.queue_drops > 0 {
            info!(
                waiting,
                dropped = self.queue_drops,
                "frames to the IOC lost with the connection (waiting) or dropped by the flow queue"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tap_waits_while_no_send_buffer_is_free() {
        assert!(tap_wanted(true, true));
        assert!(
            !tap_wanted(true, false),
            "every buffer queued: no busy loop"
        );
        assert!(!tap_wanted(false, true));
    }

    #[test]
    fn features_follow_the_tap_offloads() {
        let none = Offloads::default();
        assert_eq!(feature_bits(&none), features::VNET_HDR);
        let tso = Offloads {
            csum: true,
            tso: true,
            uso: false,
        };
        assert_eq!(
            features::names(feature_bits(&tso)),
            ["vnet_hdr", "csum", "tso4", "tso6", "ecn"]
        );
        let all = Offloads { uso: true, ..tso };
        assert!(features::names(feature_bits(&all)).contains(&"uso"));
    }
}
