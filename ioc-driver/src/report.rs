//! The IOC's answers on the control socket, built from its state when asked (the state is
//! on the same thread; nothing is copied on the data path).

use crate::host::{Drops, Host};
use crate::ioc::Ioc;
use splitnet_config::Promiscuous;
use splitnet_control::report::{
    offload_names, Counters, Fabric, HostEntry, Hosts, Interface, NicStats, PeerPools, Pools,
    Reply, Request, Role, Stats, Status,
};
use splitnet_messaging::service::Introspect;
use splitnet_messaging::sys::netdev;
use splitnet_messaging::wire::features;
use splitnet_messaging::wire::fmt_mac;
use std::collections::BTreeMap;

/// Every offload the IOC can pass through to the NIC (`lan.offload = true`).
const ALL_OFFLOADS: u64 = features::VNET_HDR
    | features::CSUM
    | features::TSO4
    | features::TSO6
    | features::ECN
    | features::USO;

/// The causes with a count, by name.
fn named_drops(d: &Drops) -> BTreeMap<String, u64> {
    d.named()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.to_string(), n))
        .collect()
}

fn peer_pools(h: &Host) -> Option<PeerPools> {
    let session = h.link.as_ref()?.session();
    Some(PeerPools::of(
        format!("session {} ({})", h.session, fmt_mac(&h.mac)),
        session,
    ))
}

impl Ioc {
    /// The features offered to every host (GetFeatures): all offloads, or with
    /// `lan.offload = false` only the virtio-net header (plain, fully checksummed frames).
    pub fn offered(&self) -> u64 {
        if self.cfg.lan.offload {
            ALL_OFFLOADS
        } else {
            features::VNET_HDR
        }
    }

    /// The answer to a control request.
    pub fn answer(&self, request: Request) -> Reply {
        let lan = &self.cfg.lan.interface;
        match request {
            Request::Status => Reply::Status(Status {
                role: Role::Ioc,
                version: env!("CARGO_PKG_VERSION").into(),
                pid: std::process::id(),
                uptime_s: self.started.elapsed().as_secs(),
                fabric: Fabric {
                    state: if self.stopping {
                        "stopping"
                    } else {
                        "listening"
                    }
                    .into(),
                    address: self.cfg.fabric.listen.to_string(),
                    protocol_version: None,
                    session: None,
                    connected_s: None,
                    connects: self.connects,
                    hosts: Some(self.hosts.len() as u32),
                    max_hosts: Some(self.cfg.fabric.max_hosts),
                },
                interface: Interface {
                    name: lan.clone(),
                    mac: netdev::mac(lan).map(|m| fmt_mac(&m)).unwrap_or_default(),
                    mtu: self.mtu,
                    carrier: self.link_up,
                    promisc: self.cfg.lan.promiscuous != Promiscuous::Off,
                    multicast: self.nic_groups.len() as u32,
                    offloads: offload_names(self.offered()),
                },
            }),
            Request::Pools => Reply::Pools(Pools {
                peers: self.hosts.values().filter_map(peer_pools).collect(),
            }),
            Request::Hosts => Reply::Hosts(Hosts {
                hosts: self
                    .hosts
                    .values()
                    .map(|h| HostEntry {
                        session: h.session,
                        node_id: h.node_id,
                        queue: h.queue.index,
                        queues: h.queue.count,
                        address: h.peer.to_string(),
                        mac: fmt_mac(&h.mac),
                        domain: h.session as u32,
                        mtu: h.mtu,
                        promisc: h.promisc,
                        multicast: h.multicast.len() as u32,
                        offloads: offload_names(h.features),
                        connected_s: h.since.elapsed().as_secs(),
                        counters: Counters::from(&h.stats),
                        buffers: h.held() as u32,
                        buffer_quota: h.quota as u32,
                        drops: named_drops(&h.drops),
                    })
                    .collect(),
            }),
            Request::Stats => {
                let mut fabric = Counters::from(&self.past);
                let mut drops = self.past_drops;
                let (mut credits, mut in_use, mut inline, mut waited) = (0, 0, 0, 0);
                for h in self.hosts.values() {
                    drops += h.drops;
                    let c = Counters::from(&h.stats);
                    fabric.tx.frames += c.tx.frames;
                    fabric.tx.bytes += c.tx.bytes;
                    fabric.tx.dropped += c.tx.dropped;
                    fabric.rx.frames += c.rx.frames;
                    fabric.rx.bytes += c.rx.bytes;
                    fabric.rx.dropped += c.rx.dropped;
                    if let Some(l) = &h.link {
                        let ini = l.session().initiator();
                        credits += ini.credits();
                        in_use += ini.in_use();
                        inline += l.stats().tx_inline;
                        waited += l.stats().tx_backpressure;
                    }
                }
                fabric.protocol_errors = self.stats.protocol_errors;
                fabric.protection_errors = self.reg.stats().protection_errors;
                Reply::Stats(Stats {
                    role: Role::Ioc,
                    fabric,
                    tx_inline: inline,
                    tx_backpressure: waited,
                    credits,
                    credits_in_use: in_use,
                    nic: NicStats::read(lan),
                    ioc: None,
                    drops: named_drops(&drops),
                    send_buffers: Some((self.cache.in_use() as u64, self.cache.capacity() as u64)),
                })
            }
        }
    }
}

impl Introspect for Ioc {
    fn answer_line(&self, line: &str) -> String {
        splitnet_control::answer_line(line, |r| self.answer(r))
    }

    fn render_metrics(&self) -> String {
        self.metrics_text()
    }
}
