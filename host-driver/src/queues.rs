//! The further TAP queues (1..): each is served by a thread of its own over a session of
//! its own, joined to the first queue's session; they connect with the first queue and end
//! with it.

use crate::connect::{connect, Identity};
use crate::connection::{Conn, End, Stop};
use crate::reconnect::Ended;
use crate::report::{Reporter, SharedCounters};
use splitnet_config::HostConfig;
use splitnet_fabric as fabric;
use splitnet_messaging::wire::Queue;
use splitnet_netif::tap::Tap;
use splitnet_service::{self as service, notify};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{oneshot, watch};
use tracing::{debug, warn};

/// The further queues of one connection: their threads, the flag that ends them, and
/// their counters.
pub struct Queues {
    threads: Vec<JoinHandle<()>>,
    ended: Arc<watch::Sender<Option<Ended>>>,
    counters: Vec<SharedCounters>,
}

impl Queues {
    /// Connects queues 1.. (one thread each, `taps[i]` serving queue i + 1) as further
    /// sessions of the host whose first queue has session `first`; returns once every one
    /// is connected, or the first failure (the ones started are then stopped).
    pub async fn start(
        cfg: &Arc<HostConfig>,
        taps: &[Arc<Tap>],
        id: &Arc<Identity>,
        first: u64,
    ) -> Result<Queues, String> {
        let mut q = Queues::none();
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
            let (cfg, tap, ended, id) = (cfg.clone(), tap.clone(), q.ended.clone(), id.clone());
            let t = std::thread::Builder::new()
                .name(format!("queue-{}", queue.index))
                .spawn(move || queue_thread(cfg, tap, queue, id, first, tx, ended, counters))
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

    /// No further queue (yet).
    pub fn none() -> Queues {
        Queues {
            threads: Vec::new(),
            ended: Arc::new(watch::channel(None).0),
            counters: Vec::new(),
        }
    }

    /// Set when any queue's connection ended, to how it ended.
    pub fn ended(&self) -> watch::Receiver<Option<Ended>> {
        self.ended.subscribe()
    }

    /// The queues' published counters.
    pub fn counters(&self) -> Vec<SharedCounters> {
        self.counters.clone()
    }

    /// Ends every queue's connection and waits for their threads.
    pub fn stop(&mut self) {
        self.ended.send_if_modified(|e| first_end(e, Ended::Lost));
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
    id: Arc<Identity>,
    first: u64,
    connected: oneshot::Sender<Result<(), String>>,
    ended: Arc<watch::Sender<Option<Ended>>>,
    counters: SharedCounters,
) {
    if let Err(e) = service::sched::apply(sched_class(&cfg.scheduling)) {
        let _ = connected.send(Err(format!("scheduling: {e}")));
        return;
    }
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
        let tap_ready = fabric::Ready::reading(&*tap)?;
        let timeout = cfg.fabric.keepalive_timeout();
        let (ctrl, data, _) = connect(
            &cfg.fabric,
            cfg.pools.max_granted_bytes,
            &id,
            queue,
            first,
            timeout,
            false,
        )
        .await
        .map_err(|e| io::Error::other(e.to_string()))?;
        let report = Reporter::further(counters);
        let mut conn = Conn::new(&cfg, queue, &tap, &tap_ready, ctrl, data, report)?;
        debug!(queue = queue.index, "queue connected");
        let _ = connected.send(Ok(()));
        let mut stop = Stop::new(&mut term, &mut int, stopped);
        let end = conn
            .run(&mut stop, &mut true, &mut notify::Watchdog::disabled())
            .await;
        if matches!(end, End::Shutdown) {
            conn.shutdown().await;
        }
        conn.close();
        match end {
            End::Lost(why) => warn!(queue = queue.index, "queue's connection lost: {why}"),
            End::Restarting => return Ok(Ended::Restarting),
            End::Shutdown | End::NicDown | End::Activated(_) | End::Failback => {}
        }
        Ok::<_, io::Error>(Ended::Lost)
    };
    if cfg.fabric.busy_poll {
        rt.spawn(service::busy_poll());
    }
    let how = rt.block_on(serve).unwrap_or_else(|e| {
        warn!(queue = queue.index, "queue stopped: {e}");
        Ended::Lost
    });
    // The connection is over for every queue once one of them ends (a value set already,
    // by the queue that ended first, stays).
    ended.send_if_modified(|e| first_end(e, how));
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

/// Records `how` as the way the queues' connection ended unless one did already; whether it
/// was recorded.
fn first_end(e: &mut Option<Ended>, how: Ended) -> bool {
    let first = e.is_none();
    e.get_or_insert(how);
    first
}
