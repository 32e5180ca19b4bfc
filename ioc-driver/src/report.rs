//! The IOC's answers on the control socket and its metrics. Each worker takes a
//! [`Snapshot`] of its state when asked (nothing is copied on the data path); the
//! snapshots of all workers are merged and the answer is built from the sum.

use crate::counters::{Drops, IocStats};
use crate::host_queue::HostQueue;
use crate::state::WorkerState;
use splitnet_config::IocConfig;
use splitnet_control::report::{
    offload_names, Counters, Fabric, HostEntry, Hosts, Interface, NicStats, PeerPools, Pools,
    Reply, Request, Role, Stats, Status,
};
use splitnet_messaging::wire::{self, features, fmt_mac};
use splitnet_netif::netdev;
use splitnet_service::metrics::Exposition;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Every offload the IOC can pass through to the NIC (`lan.offload = true`).
const ALL_OFFLOADS: u64 = features::VNET_HDR
    | features::CSUM
    | features::TSO4
    | features::TSO6
    | features::ECN
    | features::USO;

impl Snapshot {
    /// Drops of every host, those that left included, by cause.
    fn host_drops(&self) -> Drops {
        let mut d = self.past_drops;
        for h in &self.hosts {
            d += h.drops;
        }
        d
    }

    /// Every drop by cause, the hosts' and the NIC's, those with a count.
    fn named_drops(&self) -> BTreeMap<String, u64> {
        counted(
            self.host_drops()
                .named()
                .into_iter()
                .chain(self.stats.drops_named()),
        )
    }
}

/// The causes with a count, by name.
fn counted(causes: impl Iterator<Item = (&'static str, u64)>) -> BTreeMap<String, u64> {
    causes
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.to_string(), n))
        .collect()
}

fn peer_pools(h: &HostQueue) -> Option<PeerPools> {
    let session = h.link.as_ref()?.session();
    Some(PeerPools::of(
        format!("session {} ({})", h.session, fmt_mac(&h.mac)),
        session,
    ))
}

/// One host session as operators see it.
#[derive(Debug, Clone)]
pub struct HostView {
    /// The control socket's entry.
    pub entry: HostEntry,
    /// Its counters.
    pub stats: wire::Stats,
    /// Its drops by cause.
    pub drops: Drops,
    /// Its pools, while its link is up.
    pub pools: Option<PeerPools>,
}

/// What one worker (or several, merged) shows operators.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When the IOC started.
    pub started: Instant,
    /// Shutting down.
    pub stopping: bool,
    /// NIC link state.
    pub nic_up: bool,
    /// The NIC's MTU as offered to hosts.
    pub mtu: u32,
    /// Offloads offered to hosts.
    pub offered: u64,
    /// Counters of the IOC as a whole.
    pub stats: IocStats,
    /// Writes refused by the memory protection checks.
    pub protection_errors: u64,
    /// Registered pool regions and their bytes.
    pub pool_regions: u64,
    /// Bytes of registered pool regions.
    pub pool_bytes: u64,
    /// Hosts admitted since start.
    pub connects: u64,
    /// Counters of the hosts that left.
    pub past: wire::Stats,
    /// Drops counted against the hosts that left.
    pub past_drops: Drops,
    /// Credits held, credits in use, frames sent inline, sends that waited, over the hosts.
    pub credits: (u64, u64, u64, u64),
    /// Frames of the express lane to and from the hosts connected now.
    pub express: (u64, u64),
    /// Credit updates sent to the hosts connected now.
    pub credit_updates: u64,
    /// Bytes of send buffers in use, and the most there may be.
    pub send_buffer_bytes: (u64, u64),
    /// Multicast groups joined on the NIC.
    pub groups: BTreeSet<[u8; 6]>,
    /// The hosts, by session.
    pub hosts: Vec<HostView>,
}

/// The features offered to every host (GetFeatures): all offloads, or with
/// `lan.offload = false` only the virtio-net header (plain, fully checksummed frames).
/// The express lane is offered too unless `fabric.express = false`.
pub fn offered(cfg: &IocConfig) -> u64 {
    let lane = match cfg.fabric.express {
        true => features::EXPRESS,
        false => 0,
    };
    lane | match cfg.lan.offload {
        true => ALL_OFFLOADS,
        false => features::VNET_HDR,
    }
}

impl WorkerState {
    /// The features offered to every host ([`offered`]).
    pub fn offered(&self) -> u64 {
        offered(&self.cfg)
    }

    /// This worker's state as operators see it.
    pub fn snapshot(&self) -> Snapshot {
        let r = self.reg.stats();
        let mut credits = (0, 0, 0, 0);
        let mut express = (0, 0);
        let mut credit_updates = 0;
        for l in self.hosts.values().filter_map(|h| h.link.as_ref()) {
            let ini = l.session().initiator();
            credits.0 += ini.credits();
            credits.1 += ini.in_use();
            credits.2 += l.stats().tx_inline;
            credits.3 += l.stats().tx_backpressure;
            express.0 += l.stats().tx_express;
            express.1 += l.stats().rx_express;
            credit_updates += l.stats().tx_credit_updates;
        }
        let hosts = self
            .hosts
            .values()
            .map(|h| HostView {
                entry: HostEntry {
                    session: h.session,
                    node_id: h.node_id,
                    queue: h.queue.index,
                    queues: h.queue.count,
                    address: h.peer.to_string(),
                    name: h.policy.name.clone().unwrap_or_default(),
                    mac: fmt_mac(&h.mac),
                    domain: h.session,
                    mtu: h.mtu,
                    promisc: h.promisc,
                    multicast: h.multicast.len() as u32,
                    offloads: offload_names(h.features),
                    connected_s: h.since.elapsed().as_secs(),
                    counters: Counters::from(&h.stats),
                    buffer_bytes: h.held() as u64,
                    buffer_quota_bytes: h.quota as u64,
                    in_place: h.link.as_ref().map_or(0, |l| l.stats().tx_in_place),
                    ce_marked: h.ce_marked,
                    drops: counted(h.drops.named().into_iter()),
                    bridged: h.bridged.iter().map(fmt_mac).collect(),
                    standby: h.standby,
                    port: h.port.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
                },
                stats: h.stats,
                drops: h.drops,
                pools: peer_pools(h),
            })
            .collect();
        Snapshot {
            started: self.started,
            stopping: self.stopping,
            nic_up: self.nic_up,
            mtu: self.mtu,
            offered: self.offered(),
            stats: self.stats,
            protection_errors: r.protection_errors,
            pool_regions: u64::from(r.regions),
            pool_bytes: r.bytes,
            connects: self.connects,
            past: self.past,
            past_drops: self.past_drops,
            credits,
            express,
            credit_updates,
            send_buffer_bytes: (
                self.cache.in_use_bytes() as u64,
                self.cache.capacity_bytes() as u64,
            ),
            groups: self.nic_groups.clone(),
            hosts,
        }
    }

    /// Every counter of this worker alone, in Prometheus text format.
    #[cfg(test)]
    pub fn metrics_text(&self) -> String {
        metrics_text(&self.snapshot())
    }
}

impl IocStats {
    fn add(&mut self, o: &IocStats) {
        self.lan_rx += o.lan_rx;
        self.lan_tx += o.lan_tx;
        self.lan_filtered += o.lan_filtered;
        self.lan_rx_dropped += o.lan_rx_dropped;
        self.lan_tx_errors += o.lan_tx_errors;
        self.lan_rx_unreadable += o.lan_rx_unreadable;
        self.protocol_errors += o.protocol_errors;
        self.protection_errors += o.protection_errors;
        self.handshake_failures += o.handshake_failures;
        self.watchdog_withheld += o.watchdog_withheld;
        self.crossed_out += o.crossed_out;
        self.crossed_in += o.crossed_in;
        self.cross_dropped += o.cross_dropped;
        self.cfg_rate_limited += o.cfg_rate_limited;
        self.poll_caught += o.poll_caught;
        self.poll_slept += o.poll_slept;
        self.lan_rx_truncated += o.lan_rx_truncated;
        self.lan_rx_ring += o.lan_rx_ring;
        self.lan_rx_bad_frame += o.lan_rx_bad_frame;
    }
}

impl Snapshot {
    /// A snapshot of no worker: the IOC's own facts, every count zero.
    pub fn empty(started: Instant, mtu: u32, nic_up: bool, offered: u64) -> Snapshot {
        Snapshot {
            started,
            stopping: false,
            nic_up,
            mtu,
            offered,
            stats: IocStats::default(),
            protection_errors: 0,
            pool_regions: 0,
            pool_bytes: 0,
            connects: 0,
            past: wire::Stats::default(),
            past_drops: Drops::default(),
            credits: (0, 0, 0, 0),
            express: (0, 0),
            credit_updates: 0,
            send_buffer_bytes: (0, 0),
            groups: BTreeSet::new(),
            hosts: Vec::new(),
        }
    }

    /// Adds another worker's snapshot to this one.
    pub fn merge(&mut self, o: Snapshot) {
        self.stopping |= o.stopping;
        self.stats.add(&o.stats);
        self.protection_errors += o.protection_errors;
        self.pool_regions += o.pool_regions;
        self.pool_bytes += o.pool_bytes;
        self.connects += o.connects;
        self.past += o.past;
        self.past_drops += o.past_drops;
        self.credits.0 += o.credits.0;
        self.credits.1 += o.credits.1;
        self.credits.2 += o.credits.2;
        self.credits.3 += o.credits.3;
        self.express.0 += o.express.0;
        self.express.1 += o.express.1;
        self.credit_updates += o.credit_updates;
        self.send_buffer_bytes.0 += o.send_buffer_bytes.0;
        self.send_buffer_bytes.1 += o.send_buffer_bytes.1;
        self.groups.extend(o.groups);
        self.hosts.extend(o.hosts);
        self.hosts.sort_by_key(|h| h.entry.session);
    }
}

/// The answer to a control request.
pub fn answer(cfg: &IocConfig, s: &Snapshot, request: Request) -> Reply {
    let lan = &cfg.lan.interface;
    match request {
        Request::Status => Reply::Status(Status {
            role: Role::Ioc,
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_s: s.started.elapsed().as_secs(),
            fabric: Fabric {
                state: if s.stopping { "stopping" } else { "listening" }.into(),
                address: cfg.fabric.listen.to_string(),
                protocol_version: None,
                session: None,
                connected_s: None,
                connects: s.connects,
                hosts: Some(s.hosts.len() as u32),
                max_hosts: Some(cfg.fabric.max_hosts),
                iocs: Vec::new(),
                moves: Vec::new(),
            },
            interface: Interface {
                name: lan.clone(),
                mac: netdev::mac(lan).map(|m| fmt_mac(&m)).unwrap_or_default(),
                mtu: s.mtu,
                carrier: s.nic_up,
                // The device's state, not the setting.
                promisc: netdev::is_promiscuous(lan).unwrap_or(false),
                multicast: s.groups.len() as u32,
                offloads: offload_names(s.offered),
            },
        }),
        Request::Pools => Reply::Pools(Pools {
            peers: s.hosts.iter().filter_map(|h| h.pools.clone()).collect(),
        }),
        Request::Hosts => Reply::Hosts(Hosts {
            hosts: s.hosts.iter().map(|h| h.entry.clone()).collect(),
        }),
        // The main thread's ([`crate::supervisor::Cluster`]), never a snapshot's.
        Request::Reload | Request::Upgrade => {
            Reply::Error(format!("{request}: not from a snapshot"))
        }
        Request::Stats => {
            let mut fabric = Counters::from(&s.past);
            for h in &s.hosts {
                let c = Counters::from(&h.stats);
                fabric.tx.frames += c.tx.frames;
                fabric.tx.bytes += c.tx.bytes;
                fabric.tx.dropped += c.tx.dropped;
                fabric.rx.frames += c.rx.frames;
                fabric.rx.bytes += c.rx.bytes;
                fabric.rx.dropped += c.rx.dropped;
            }
            fabric.protocol_errors = s.stats.protocol_errors;
            fabric.protection_errors = s.protection_errors;
            Reply::Stats(Stats {
                role: Role::Ioc,
                fabric,
                tx_inline: s.credits.2,
                tx_express: s.express.0,
                rx_express: s.express.1,
                tx_backpressure: s.credits.3,
                credit_updates: s.credit_updates,
                credits: s.credits.0,
                credits_in_use: s.credits.1,
                nic: NicStats::read(lan),
                ioc: None,
                drops: s.named_drops(),
                send_buffer_bytes: Some(s.send_buffer_bytes),
                tx_limit: None,
            })
        }
    }
}

/// Every counter, in Prometheus text format.
pub fn metrics_text(snap: &Snapshot) -> String {
    let s = &snap.stats;
    let mut e = Exposition::new();
    let totals: [(&str, &str, &str, u64); 24] = [
        (
            "splitnet_ioc_hosts",
            "gauge",
            "Hosts connected.",
            snap.hosts.len() as u64,
        ),
        (
            "splitnet_ioc_standby_hosts",
            "gauge",
            "Host sessions connected as standbys (claiming no MAC until activated).",
            snap.hosts.iter().filter(|h| h.entry.standby).count() as u64,
        ),
        (
            "splitnet_ioc_lan_link_up",
            "gauge",
            "NIC link state (1 up).",
            u64::from(snap.nic_up),
        ),
        (
            "splitnet_ioc_lan_rx_frames_total",
            "counter",
            "Frames read from the NIC.",
            s.lan_rx,
        ),
        (
            "splitnet_ioc_lan_tx_frames_total",
            "counter",
            "Frames written to the NIC.",
            s.lan_tx,
        ),
        (
            "splitnet_ioc_lan_filtered_total",
            "counter",
            "NIC frames for no host (among them frames whose host left while they crossed to its worker).",
            s.lan_filtered,
        ),
        (
            "splitnet_ioc_lan_rx_dropped_total",
            "counter",
            "NIC frames dropped on receive: the IOC's receive ring was full.",
            s.lan_rx_dropped,
        ),
        (
            "splitnet_ioc_lan_tx_errors_total",
            "counter",
            "Frames the NIC refused.",
            s.lan_tx_errors,
        ),
        (
            "splitnet_ioc_lan_rx_unreadable_total",
            "counter",
            "NIC frames the kernel could not hand over (an offload a virtio-net header cannot describe).",
            s.lan_rx_unreadable,
        ),
        (
            "splitnet_ioc_protocol_errors_total",
            "counter",
            "Hosts disconnected for protocol errors.",
            s.protocol_errors,
        ),
        (
            "splitnet_ioc_protection_errors_total",
            "counter",
            "RDMA writes refused by the memory protection checks.",
            snap.protection_errors,
        ),
        (
            "splitnet_ioc_handshake_failures_total",
            "counter",
            "Connections refused or timed out in the handshake.",
            s.handshake_failures,
        ),
        (
            "splitnet_ioc_watchdog_withheld_total",
            "counter",
            "Watchdog ticks withheld because a worker's loop had not run for 2 s.",
            s.watchdog_withheld,
        ),
        (
            "splitnet_ioc_pool_regions",
            "gauge",
            "Registered pool regions.",
            snap.pool_regions,
        ),
        (
            "splitnet_ioc_pool_bytes",
            "gauge",
            "Bytes of registered pool regions.",
            snap.pool_bytes,
        ),
        (
            "splitnet_ioc_worker_crossed_total",
            "counter",
            "Frames handed from one worker to another for its hosts.",
            s.crossed_out,
        ),
        (
            "splitnet_ioc_worker_cross_dropped_total",
            "counter",
            "Frames for another worker's hosts dropped: its inbox was full.",
            s.cross_dropped,
        ),
        (
            "splitnet_ioc_lan_rx_bad_frame_total",
            "counter",
            "LAN frames whose virtio-net or Ethernet header failed the checks, dropped.",
            s.lan_rx_bad_frame,
        ),
        (
            "splitnet_ioc_lan_rx_truncated_total",
            "counter",
            "LAN frames longer than a send buffer, cut by the read and dropped.",
            s.lan_rx_truncated,
        ),
        (
            "splitnet_ioc_lan_rx_ring_total",
            "counter",
            "LAN frames read from a mapped ring's slots, without a system call (lan.rx_ring).",
            s.lan_rx_ring,
        ),
        (
            "splitnet_ioc_cfg_rate_limited_total",
            "counter",
            "CfgUtil requests answered Busy: a host asked faster than its rate allows.",
            s.cfg_rate_limited,
        ),
        (
            "splitnet_ioc_poll_caught_total",
            "counter",
            "Idle periods in which a worker's poll before sleep (fabric.spin_max_us) caught work.",
            s.poll_caught,
        ),
        (
            "splitnet_ioc_poll_slept_total",
            "counter",
            "Idle periods in which a polling worker slept (its poll's budget ran out or was zero).",
            s.poll_slept,
        ),
        (
            "splitnet_ioc_send_buffer_bytes",
            "gauge",
            "Bytes of send buffers in use (LAN receive and host-to-host forwarding).",
            snap.send_buffer_bytes.0,
        ),
    ];
    for (name, kind, help, value) in totals {
        e.metric(name, kind, help, value);
    }
    type Counter = (&'static str, &'static str, fn(&wire::Stats) -> u64);
    let per_host: [Counter; 6] = [
        (
            "splitnet_ioc_host_rx_frames_total",
            "Frames delivered to the host.",
            |s| s.rx_frames,
        ),
        (
            "splitnet_ioc_host_rx_bytes_total",
            "Bytes delivered to the host.",
            |s| s.rx_bytes,
        ),
        (
            "splitnet_ioc_host_tx_frames_total",
            "Frames from the host forwarded.",
            |s| s.tx_frames,
        ),
        (
            "splitnet_ioc_host_tx_bytes_total",
            "Bytes from the host forwarded.",
            |s| s.tx_bytes,
        ),
        (
            "splitnet_ioc_host_rx_dropped_total",
            "Frames for the host dropped (no credit).",
            |s| s.rx_dropped,
        ),
        (
            "splitnet_ioc_host_tx_dropped_total",
            "Frames from the host dropped.",
            |s| s.tx_dropped,
        ),
    ];
    for (name, help, get) in per_host {
        e.family(name, "counter", help);
        for h in &snap.hosts {
            let labels = format!(
                "session=\"{}\",mac=\"{}\",queue=\"{}\"",
                h.entry.session, h.entry.mac, h.entry.queue
            );
            e.sample(name, &labels, get(&h.stats));
        }
    }
    let name = "splitnet_ioc_dropped_total";
    e.family(
        name,
        "counter",
        "Frames for or from hosts dropped, by cause, those of hosts that left included.",
    );
    for (cause, n) in snap.host_drops().named() {
        e.sample(name, &format!("cause=\"{cause}\""), n);
    }
    let name = "splitnet_ioc_host_dropped_by_cause_total";
    e.family(
        name,
        "counter",
        "Frames for or from the host dropped, by cause.",
    );
    for h in &snap.hosts {
        for (cause, n) in h.drops.named() {
            let labels = format!(
                "session=\"{}\",queue=\"{}\",cause=\"{cause}\"",
                h.entry.session, h.entry.queue
            );
            e.sample(name, &labels, n);
        }
    }
    // One sample per host session of each of these: name, type, help, value.
    type PerSession = (
        &'static str,
        &'static str,
        &'static str,
        fn(&HostEntry) -> u64,
    );
    let by_session: [PerSession; 3] = [
        (
            "splitnet_ioc_host_rx_in_place_total",
            "counter",
            "LAN frames read straight into the host's pools from its own queue on the NIC (small ones go inline).",
            |h| h.in_place,
        ),
        (
            "splitnet_ioc_host_rx_ce_marked_total",
            "counter",
            "Frames to the host marked Congestion Experienced while its backlog stood (instead of dropped later).",
            |h| h.ce_marked,
        ),
        (
            "splitnet_ioc_host_send_buffer_bytes",
            "gauge",
            "Bytes of the IOC's send buffers the host holds now.",
            |h| h.buffer_bytes,
        ),
    ];
    for (name, kind, help, get) in by_session {
        e.family(name, kind, help);
        for h in &snap.hosts {
            let labels = format!(
                "session=\"{}\",queue=\"{}\"",
                h.entry.session, h.entry.queue
            );
            e.sample(name, &labels, get(&h.entry));
        }
    }
    e.finish()
}
