//! What a queue's connection reports as it runs: the first queue refreshes the snapshot
//! operators read (with the further queues' counters added in) and the STATUS= line; a
//! further queue publishes its counters for the first.

use crate::cfgutil::Settings;
use crate::drops::Drops;
use crate::snapshot::Snapshot;
use splitnet_control::report::{offload_names, Counters, TxLimit};
use splitnet_fabric::FabricChannel;
use splitnet_messaging::adapter::shm::SpinCounts;
use splitnet_messaging::endpoint::{Link, LinkStats, Session};
use splitnet_messaging::wire::{self, CfgCode};
use splitnet_netif::netdev;
use splitnet_service::notify;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the IOC's counters for this host are fetched (for splitnetctl).
const STATS_EVERY: Duration = Duration::from_secs(1);

/// A queue's counters; a further queue's are published for the first queue's snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueCounters {
    link: LinkStats,
    drops: Drops,
    polls: SpinCounts,
    credits_free: u64,
    credits_in_use: u64,
}

impl QueueCounters {
    /// The counters of a connection on `link` that dropped `drops` and whose idle periods
    /// ended as `polls` counts.
    fn of(link: &Link<FabricChannel>, drops: Drops, polls: SpinCounts) -> QueueCounters {
        let ini = link.session().initiator();
        QueueCounters {
            link: link.stats(),
            drops,
            polls,
            credits_free: ini.credits(),
            credits_in_use: ini.in_use(),
        }
    }
}

/// One further queue's published counters.
pub type SharedCounters = Arc<Mutex<QueueCounters>>;

/// Where a queue's connection reports.
pub struct Reporter {
    /// What operators see (the first queue's connection keeps it).
    snap: Option<Rc<RefCell<Snapshot>>>,
    /// A further queue: where it publishes its counters.
    publish: Option<SharedCounters>,
    /// The first queue: the further queues' counters, added into the snapshot.
    others: Vec<SharedCounters>,
    /// Next time the IOC's counters for this host are asked for (GetStats).
    next_stats: Instant,
}

impl Reporter {
    /// The first queue's: into `snap`, with the `others`' counters added in.
    pub fn first(snap: Rc<RefCell<Snapshot>>, others: Vec<SharedCounters>) -> Reporter {
        Reporter {
            snap: Some(snap),
            publish: None,
            others,
            next_stats: Instant::now(),
        }
    }

    /// A further queue's: into `publish`.
    pub fn further(publish: SharedCounters) -> Reporter {
        Reporter {
            snap: None,
            publish: Some(publish),
            others: Vec::new(),
            next_stats: Instant::now(),
        }
    }

    /// A further queue: publishes its counters for the first queue's snapshot.
    pub fn publish(&self, link: &Link<FabricChannel>, drops: Drops, polls: SpinCounts) {
        if let Some(Ok(mut p)) = self.publish.as_ref().map(|p| p.lock()) {
            *p = QueueCounters::of(link, drops, polls);
        }
    }

    /// Counters for the metrics and control sockets, all queues together: cheap, on every
    /// turn.
    pub fn refresh_snapshot(
        &self,
        link: &Link<FabricChannel>,
        drops: Drops,
        polls: SpinCounts,
        tx_limit: TxLimit,
        carrier: bool,
    ) {
        let Some(snap) = &self.snap else { return };
        let mut sum = QueueCounters::of(link, drops, polls);
        for o in self.others.iter().filter_map(|o| o.lock().ok().map(|g| *g)) {
            sum.link += o.link;
            sum.drops += o.drops;
            sum.polls += o.polls;
            sum.credits_free += o.credits_free;
            sum.credits_in_use += o.credits_in_use;
        }
        let mut g = snap.borrow_mut();
        g.tx_limit = tx_limit;
        g.interface.carrier = carrier;
        g.drops = sum.drops;
        g.polls = sum.polls;
        g.credits_free = sum.credits_free;
        g.credits_in_use = sum.credits_in_use;
        g.link = sum.link;
    }

    /// Pools and interface settings for the control socket: every watch period. Asks the
    /// IOC (on `session`) for its counters for this host every [`STATS_EVERY`].
    pub fn refresh_details(&mut self, now: Instant, session: &mut Session, s: &Settings) {
        let Some(snap) = &self.snap else { return };
        let mut g = snap.borrow_mut();
        g.set_pools(session);
        let i = &mut g.interface;
        i.mtu = s.mtu;
        i.promisc = s.promisc;
        i.multicast = s.multicast.len() as u32;
        i.offloads = offload_names(s.features);
        if let Ok(mac) = netdev::mac(&s.name) {
            i.mac = wire::fmt_mac(&mac);
        }
        drop(g);
        if now >= self.next_stats {
            self.next_stats = now + STATS_EVERY;
            session.cfg_request(CfgCode::GetStats, &[]);
        }
    }

    /// The IOC's counters for this host (its answer to GetStats).
    pub fn ioc_counters(&self, c: Counters) {
        if let Some(snap) = &self.snap {
            snap.borrow_mut().ioc_counters = Some(c);
        }
    }
}

/// The STATUS= line: peer, carrier and throughput, refreshed every few seconds.
pub struct StatusLine {
    at: Instant,
    last: LinkStats,
}

impl StatusLine {
    const EVERY: Duration = Duration::from_secs(5);

    /// A line whose throughput counts from `stats`.
    pub fn new(stats: LinkStats) -> StatusLine {
        StatusLine {
            at: Instant::now(),
            last: stats,
        }
    }

    /// Tells systemd the link's state with `peer`, if the line is due.
    pub fn update(&mut self, now: Instant, s: LinkStats, peer: &str, carrier: bool) {
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
