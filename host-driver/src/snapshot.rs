//! What the host driver tells operators: a snapshot of its state, refreshed by the data path
//! (counters on every turn, pools and interface settings every watch period), read by the
//! metrics endpoint and the control socket without touching the data path.

use crate::connect::Identity;
use crate::drops::Drops;
use crate::failover::{Cause, Failover};
use splitnet_control::report::{
    Counters, Direction, Fabric, Interface, IocMove, IocRole, NicStats, PeerPools, Pools, Reply,
    Request, Role, Stats, Status, TxLimit,
};
use splitnet_messaging::adapter::shm::SpinCounts;
use splitnet_messaging::endpoint::{LinkStats, Session};
use splitnet_service::{metrics, Answer, Introspect};
use std::sync::Arc;
use std::time::Instant;

/// The host driver's state as operators see it.
#[derive(Debug)]
pub struct Snapshot {
    started: Instant,
    /// The IOC's fabric address.
    pub ioc: String,
    /// Session number and protocol version while connected to the IOC.
    pub session: Option<(u64, u16)>,
    /// When the connection came up.
    pub connected_at: Option<Instant>,
    /// Connections made since start.
    pub connects: u64,
    /// Frames dropped by this connection (every queue's), by cause.
    pub drops: Drops,
    /// Credits held in the IOC's pools.
    pub credits_free: u64,
    /// Elements of the IOC's pools in use.
    pub credits_in_use: u64,
    /// Traffic of this connection.
    pub link: LinkStats,
    /// Traffic of the connections before it.
    before: LinkStats,
    /// Frames the connections before it dropped.
    drops_before: Drops,
    /// How this connection's idle periods ended (`fabric.spin_max_us`; every queue's).
    pub polls: SpinCounts,
    /// The same, of the connections before it.
    polls_before: SpinCounts,
    /// Connections ended by a protocol error of the IOC.
    pub protocol_errors: u64,
    /// Connections ended by a protection error (a write our adapter refused).
    pub protection_errors: u64,
    /// sd0 and its settings.
    pub interface: Interface,
    /// Both directions' pools (refreshed every watch period).
    pub pools: Option<PeerPools>,
    /// The IOC's counters for this host (CfgUtil GetStats).
    pub ioc_counters: Option<Counters>,
    /// The first queue's byte limit and flow queue.
    pub tx_limit: TxLimit,
    /// With standbys: every IOC and its role.
    pub iocs: Vec<IocRole>,
    /// With standbys: the latest moves, when each began.
    moves: Vec<(IocMove, Instant)>,
    /// With standbys: moves since start, by cause, and whether the standby is ready.
    move_counts: Vec<(&'static str, u64)>,
    standby_ready: bool,
}

impl Snapshot {
    /// The state at start: nothing connected.
    pub fn new(ioc: String, interface: Interface) -> Snapshot {
        Snapshot {
            started: Instant::now(),
            ioc,
            session: None,
            connected_at: None,
            connects: 0,
            drops: Drops::default(),
            credits_free: 0,
            credits_in_use: 0,
            link: LinkStats::default(),
            before: LinkStats::default(),
            drops_before: Drops::default(),
            polls: SpinCounts::default(),
            polls_before: SpinCounts::default(),
            protocol_errors: 0,
            protection_errors: 0,
            interface,
            pools: None,
            ioc_counters: None,
            tx_limit: TxLimit::default(),
            iocs: Vec::new(),
            moves: Vec::new(),
            move_counts: Vec::new(),
            standby_ready: false,
        }
    }

    /// Records the roles of the IOCs `ends` and the moves `fo` made (a host with standbys).
    pub fn failover(&mut self, fo: &Failover, ends: &[Arc<Identity>]) {
        if ends.len() < 2 {
            return;
        }
        self.iocs = ends
            .iter()
            .enumerate()
            .map(|(i, e)| IocRole {
                address: e.ioc.to_string(),
                role: match () {
                    _ if fo.active() == Some(i) => "active",
                    _ if fo.standby() == Some(i) && fo.standby_ready() => "standby",
                    _ if fo.standby() == Some(i) => "standby, not ready",
                    _ => "down",
                }
                .into(),
            })
            .collect();
        let name = |i: usize| ends.get(i).map(|e| e.ioc.to_string()).unwrap_or_default();
        self.moves = fo
            .moves()
            .map(|m| {
                let view = IocMove {
                    from: name(m.from),
                    to: name(m.to),
                    cause: m.cause.name().into(),
                    took_ms: m.took.map(|d| d.as_millis() as u64),
                    ago_s: 0,
                };
                (view, m.at)
            })
            .collect();
        self.move_counts = Cause::ALL
            .iter()
            .map(|c| (c.name(), fo.count(*c)))
            .collect();
        self.standby_ready = fo.standby_ready();
    }

    /// A connection came up.
    pub fn connected(&mut self, session: u64, version: u16) {
        self.connects += 1;
        self.session = Some((session, version));
        self.connected_at = Some(Instant::now());
    }

    /// The connection ended: its counters move into the totals.
    pub fn disconnected(&mut self) {
        self.before += self.link;
        self.drops_before += self.drops;
        self.polls_before += std::mem::take(&mut self.polls);
        self.tx_limit = TxLimit::default();
        self.link = LinkStats::default();
        self.drops = Drops::default();
        self.interface.carrier = false;
        self.session = None;
        self.connected_at = None;
        self.pools = None;
        self.ioc_counters = None;
        self.credits_free = 0;
        self.credits_in_use = 0;
    }

    /// Records both directions' pools of `session`.
    pub fn set_pools(&mut self, session: &Session) {
        self.pools = Some(PeerPools::of(format!("ioc {}", self.ioc), session));
    }

    /// Every connection's drops, by cause, those the link counts (too large for any of the
    /// IOC's pools) included.
    fn all_drops(&self) -> impl Iterator<Item = (&'static str, u64)> {
        let too_large = self.before.tx_too_large + self.link.tx_too_large;
        (self.drops_before + self.drops)
            .named()
            .into_iter()
            .chain([("tx_too_large", too_large)])
    }

    fn totals(&self) -> Counters {
        let (b, l) = (&self.before, &self.link);
        let d = self.drops_before + self.drops;
        Counters {
            tx: Direction {
                frames: b.tx_frames + l.tx_frames,
                bytes: b.tx_bytes + l.tx_bytes,
                dropped: b.tx_too_large + l.tx_too_large + d.tx(),
            },
            rx: Direction {
                frames: b.rx_frames + l.rx_frames,
                bytes: b.rx_bytes + l.rx_bytes,
                dropped: d.rx(),
            },
            protocol_errors: self.protocol_errors,
            protection_errors: self.protection_errors,
        }
    }

    /// The answer to a control request.
    pub fn answer(&self, request: Request) -> Reply {
        match request {
            Request::Status => Reply::Status(Status {
                role: Role::Host,
                version: env!("CARGO_PKG_VERSION").into(),
                pid: std::process::id(),
                uptime_s: self.started.elapsed().as_secs(),
                fabric: Fabric {
                    state: if self.session.is_some() {
                        "up"
                    } else {
                        "connecting"
                    }
                    .into(),
                    address: self.ioc.clone(),
                    protocol_version: self.session.map(|s| s.1),
                    session: self.session.map(|s| s.0),
                    connected_s: self.connected_at.map(|t| t.elapsed().as_secs()),
                    connects: self.connects,
                    hosts: None,
                    max_hosts: None,
                    iocs: self.iocs.clone(),
                    moves: self
                        .moves
                        .iter()
                        .map(|(m, at)| IocMove {
                            ago_s: at.elapsed().as_secs(),
                            ..m.clone()
                        })
                        .collect(),
                },
                interface: self.interface.clone(),
            }),
            Request::Pools => Reply::Pools(Pools {
                peers: self.pools.iter().cloned().collect(),
            }),
            Request::Hosts => {
                Reply::Error("hosts: a host driver serves no hosts (ask the IOC)".into())
            }
            Request::Reload => Reply::Error(
                "reload: host-driver reads its configuration at start only (restart it)".into(),
            ),
            Request::Upgrade => Reply::Error(
                "upgrade: host-driver is restarted instead (systemctl restart host-driver; sd0 stays)"
                    .into(),
            ),
            Request::Stats => Reply::Stats(Stats {
                role: Role::Host,
                fabric: self.totals(),
                tx_inline: self.before.tx_inline + self.link.tx_inline,
                tx_express: self.before.tx_express + self.link.tx_express,
                rx_express: self.before.rx_express + self.link.rx_express,
                tx_backpressure: self.before.tx_backpressure + self.link.tx_backpressure,
                credit_updates: self.before.tx_credit_updates + self.link.tx_credit_updates,
                credits: self.credits_free,
                credits_in_use: self.credits_in_use,
                nic: NicStats::read(&self.interface.name),
                ioc: self.ioc_counters,
                drops: self
                    .all_drops()
                    .filter(|(_, n)| *n > 0)
                    .map(|(k, n)| (k.to_string(), n))
                    .collect(),
                send_buffer_bytes: None,
                tx_limit: Some(self.tx_limit),
            }),
        }
    }
}

impl Introspect for Snapshot {
    fn answer_line(&self, line: &str) -> Answer {
        Box::pin(std::future::ready(self.answer_text(line)))
    }

    fn render_metrics(&self) -> Answer {
        Box::pin(std::future::ready(self.metrics_text()))
    }
}

impl Snapshot {
    /// The JSON answer to one control-socket request line.
    pub fn answer_text(&self, line: &str) -> String {
        splitnet_control::answer_line(line, |r| self.answer(r))
    }

    /// Counters of the current connection, in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let l = &self.link;
        let mut e = metrics::Exposition::new();
        e.metric(
            "splitnet_host_fabric_up",
            "gauge",
            "Connected to the IOC (1).",
            u64::from(self.session.is_some()),
        )
        .metric(
            "splitnet_host_carrier",
            "gauge",
            "Carrier of the TAP (1 on).",
            u64::from(self.interface.carrier),
        )
        .metric(
            "splitnet_host_connects_total",
            "counter",
            "Connections made to the IOC.",
            self.connects,
        );
        if !self.iocs.is_empty() {
            e.metric(
                "splitnet_host_standby_ready",
                "gauge",
                "A standby IOC is ready to take the host over (1).",
                u64::from(self.standby_ready),
            );
            e.family(
                "splitnet_host_failovers_total",
                "counter",
                "Moves to another IOC, by cause.",
            );
            for (cause, n) in &self.move_counts {
                e.sample(
                    "splitnet_host_failovers_total",
                    &format!("cause=\"{cause}\""),
                    *n,
                );
            }
            let last = self.moves.iter().rev().find_map(|(m, _)| m.took_ms);
            e.metric(
                "splitnet_host_last_failover_ms",
                "gauge",
                "Time the latest completed move took, from the loss seen to the new IOC's Activate Ok (ms).",
                last.unwrap_or(0),
            );
        }
        e.metric(
            "splitnet_host_tx_frames_total",
            "counter",
            "Frames sent to the IOC (this connection).",
            l.tx_frames,
        )
        .metric(
            "splitnet_host_tx_bytes_total",
            "counter",
            "Bytes sent to the IOC (this connection).",
            l.tx_bytes,
        )
        .metric(
            "splitnet_host_tx_inline_total",
            "counter",
            "Frames sent inline as SendData.",
            l.tx_inline,
        )
        .metric(
            "splitnet_host_tx_express_total",
            "counter",
            "Frames sent in the express lane (SendData on the control channel).",
            l.tx_express,
        )
        .metric(
            "splitnet_host_rx_express_total",
            "counter",
            "Frames received in the express lane.",
            l.rx_express,
        )
        .metric(
            "splitnet_host_tx_in_place_total",
            "counter",
            "Frames read from the TAP straight into an IOC element (shared memory).",
            l.tx_in_place,
        )
        .metric(
            "splitnet_host_tx_backpressure_total",
            "counter",
            "Times a frame waited for credit.",
            l.tx_backpressure,
        )
        .metric(
            "splitnet_host_credit_updates_total",
            "counter",
            "Credit updates (BufferRecvPoolUpdate) sent to the IOC (this connection).",
            l.tx_credit_updates,
        )
        .metric(
            "splitnet_host_rx_frames_total",
            "counter",
            "Frames from the IOC (this connection).",
            l.rx_frames,
        )
        .metric(
            "splitnet_host_rx_bytes_total",
            "counter",
            "Bytes from the IOC (this connection).",
            l.rx_bytes,
        )
        .metric(
            "splitnet_host_rx_dropped_total",
            "counter",
            "Frames from the IOC dropped (this connection).",
            self.drops.rx(),
        )
        .metric(
            "splitnet_host_tx_limit_bytes",
            "gauge",
            "Bytes the first queue may have in flight to the IOC now (its byte limit).",
            self.tx_limit.limit_bytes,
        )
        .metric(
            "splitnet_host_tx_limit_shrunk_total",
            "counter",
            "Times the byte limit shrank under a standing queue.",
            self.tx_limit.shrunk,
        )
        .metric(
            "splitnet_host_tx_limit_grown_total",
            "counter",
            "Times the byte limit grew because the path ran dry.",
            self.tx_limit.grown,
        )
        .metric(
            "splitnet_host_tx_queue_dropped_total",
            "counter",
            "Frames the flow queues dropped (a flow over its share, or the queue full).",
            self.drops_before.tx_flow_queue + self.drops.tx_flow_queue,
        )
        .metric(
            "splitnet_host_tx_ce_marked_total",
            "counter",
            "Frames the first queue's flow queue marked Congestion Experienced (this connection).",
            self.tx_limit.ce_marked,
        )
        .metric(
            "splitnet_host_credits_free",
            "gauge",
            "Free elements in the IOC's pools.",
            self.credits_free,
        )
        .metric(
            "splitnet_host_credits_in_use",
            "gauge",
            "Elements of the IOC's pools in use.",
            self.credits_in_use,
        )
        .metric(
            "splitnet_host_protocol_errors_total",
            "counter",
            "Connections ended by a protocol error of the IOC.",
            self.protocol_errors,
        )
        .metric(
            "splitnet_host_protection_errors_total",
            "counter",
            "Connections ended by a write the adapter refused.",
            self.protection_errors,
        )
        .metric(
            "splitnet_host_poll_caught_total",
            "counter",
            "Idle periods the poll before sleep ended by finding work (fabric.spin_max_us).",
            self.polls_before.caught + self.polls.caught,
        )
        .metric(
            "splitnet_host_poll_slept_total",
            "counter",
            "Idle periods of a polling connection that ended in a sleep and a wake-up for input.",
            self.polls_before.slept + self.polls.slept,
        );
        let name = "splitnet_host_dropped_total";
        e.family(
            name,
            "counter",
            "Frames to or from the IOC dropped, by cause (every connection's).",
        );
        for (cause, n) in self.all_drops() {
            e.sample(name, &format!("cause=\"{cause}\""), n);
        }
        e.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_messaging::wire;

    fn snap() -> Snapshot {
        Snapshot::new(
            "10.200.0.2:7400".into(),
            Interface {
                name: "sd0".into(),
                mac: "00:00:00:00:00:00".into(),
                mtu: 1500,
                carrier: false,
                promisc: false,
                multicast: 0,
                offloads: splitnet_control::report::offload_names(
                    wire::features::VNET_HDR | wire::features::TSO4,
                ),
            },
        )
    }

    #[test]
    fn totals_survive_reconnects() {
        let mut s = snap();
        s.connected(1, 1);
        s.link.tx_frames = 10;
        s.link.rx_bytes = 1000;
        s.drops.rx_bad_header = 2;
        s.drops.tx_flow_queue = 4;
        s.link.tx_too_large = 1;
        s.disconnected();
        s.connected(2, 1);
        s.link.tx_frames = 5;
        s.drops.rx_tap_write = 1;
        s.drops.tx_flow_queue = 3;
        s.drops.tx_lost_at_close = 6;
        let Reply::Stats(st) = s.answer(Request::Stats) else {
            panic!("not stats")
        };
        assert_eq!(st.fabric.tx.frames, 15);
        assert_eq!(st.fabric.rx.bytes, 1000);
        assert_eq!(st.fabric.rx.dropped, 3);
        assert_eq!(st.fabric.tx.dropped, 14, "both connections' tx causes");
        let causes: Vec<(&str, u64)> = st.drops.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        assert_eq!(
            causes,
            [
                ("rx_bad_header", 2),
                ("rx_tap_write", 1),
                ("tx_flow_queue", 7),
                ("tx_lost_at_close", 6),
                ("tx_too_large", 1),
            ]
        );
        let m = s.metrics_text();
        assert!(
            m.contains("splitnet_host_dropped_total{cause=\"tx_flow_queue\"} 7\n"),
            "{m}"
        );
        assert!(m.contains("splitnet_host_dropped_total{cause=\"tx_tap_read\"} 0\n"));
        assert!(m.contains("splitnet_host_tx_queue_dropped_total 7\n"));
        assert_eq!(s.connects, 2);
    }

    #[test]
    fn status_says_connecting_until_up_and_lines_parse() {
        let mut s = snap();
        let Reply::Status(st) = s.answer(Request::Status) else {
            panic!("not status")
        };
        assert_eq!(st.fabric.state, "connecting");
        assert_eq!(st.fabric.session, None);
        assert_eq!(st.interface.offloads, ["vnet_hdr", "tso4"]);
        s.connected(7, 1);
        let json = s.answer_text("status\n");
        assert!(json.contains("\"state\":\"up\""), "{json}");
        assert!(json.contains("\"session\":7"), "{json}");
        assert!(s.answer_text("hosts").starts_with("{\"error\":"));
        assert!(s.answer_text("reboot").contains("unknown request"));
    }
}
