//! The documents of the control socket: one request word in, one [`Reply`] out.
//!
//! Counters are cumulative since the daemon started unless a field says "this connection";
//! rates are left to the reader (`splitnetctl top` differentiates two samples).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// What a client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// [`Status`]: fabric state, peer, protocol version, offloads, uptime.
    Status,
    /// [`Pools`]: every pool on both sides of every connection.
    Pools,
    /// [`Hosts`]: the hosts an IOC serves (a host driver answers with itself).
    Hosts,
    /// [`Stats`]: frame, byte, drop and error counters, and the NIC's.
    Stats,
    /// Read the configuration file again and apply what a reload may change (the IOC's
    /// `[auth]`): [`Reply::Reloaded`], or an error saying why nothing was applied.
    Reload,
    /// Start the daemon's binary again (a new one, after a package upgrade) and hand it the
    /// listening sockets: [`Reply::Upgraded`] once the new process serves, or
    /// [`Reply::NotUpgraded`] when it did not start and the running one serves on.
    Upgrade,
}

impl Request {
    /// Every request, in the order `splitnetctl --help` lists them.
    pub const ALL: [Request; 6] = [
        Request::Status,
        Request::Pools,
        Request::Hosts,
        Request::Stats,
        Request::Reload,
        Request::Upgrade,
    ];

    /// How long a client waits for the answer: an upgrade waits for a new process to start
    /// (the daemon bounds that wait itself, within this).
    pub fn answer_timeout(self) -> std::time::Duration {
        match self {
            Request::Upgrade => std::time::Duration::from_secs(30),
            _ => std::time::Duration::from_secs(3),
        }
    }

    /// The command word on the socket.
    pub fn as_str(self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Pools => "pools",
            Request::Hosts => "hosts",
            Request::Stats => "stats",
            Request::Reload => "reload",
            Request::Upgrade => "upgrade",
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request line that names no command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown request {0:?} (status, pools, hosts, stats, reload or upgrade)")]
pub struct UnknownRequest(pub String);

impl FromStr for Request {
    type Err = UnknownRequest;

    /// Parses a request line (surrounding white space ignored).
    fn from_str(line: &str) -> Result<Request, UnknownRequest> {
        let word = line.trim();
        Request::ALL
            .into_iter()
            .find(|r| r.as_str() == word)
            .ok_or_else(|| UnknownRequest(word.chars().take(32).collect()))
    }
}

/// A daemon's answer: exactly one of the fields is present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Answer to `status`.
    Status(Status),
    /// Answer to `pools`.
    Pools(Pools),
    /// Answer to `hosts`.
    Hosts(Hosts),
    /// Answer to `stats`.
    Stats(Stats),
    /// Answer to `reload`: what was applied.
    Reloaded(String),
    /// Answer to `upgrade`: the new process serves now, this one is ending.
    Upgraded(Upgraded),
    /// Answer to `upgrade`: the new process did not start, and why; this one serves on.
    NotUpgraded(String),
    /// The request could not be answered, and why.
    Error(String),
}

/// A hand-over to a new process that took place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upgraded {
    /// The process id of the one ending.
    pub old_pid: u32,
    /// The process id of the one serving now.
    pub new_pid: u32,
    /// Milliseconds from the start of the new process to its word that it was ready.
    pub ready_ms: u64,
}

/// Which daemon answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// host-driver.
    Host,
    /// ioc-driver.
    Ioc,
}

/// Answer to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Which daemon.
    pub role: Role,
    /// The daemon's version (its package version).
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// The fabric side.
    pub fabric: Fabric,
    /// The interface it drives: sd0 on a host, the NIC on an IOC.
    pub interface: Interface,
}

/// The fabric as one daemon sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fabric {
    /// `up`, `connecting` (host) or `listening` (IOC).
    pub state: String,
    /// The IOC's address (host) or the listening address (IOC).
    pub address: String,
    /// Protocol version in use (host, while up).
    pub protocol_version: Option<u16>,
    /// Session number the IOC gave this host (host, while up).
    pub session: Option<u64>,
    /// Seconds the current connection has been up (host, while up).
    pub connected_s: Option<u64>,
    /// Connections made (host) or accepted (IOC) since start.
    pub connects: u64,
    /// Hosts connected now (IOC).
    pub hosts: Option<u32>,
    /// Hosts served at most (IOC).
    pub max_hosts: Option<u32>,
    /// A host with standbys (`fabric.standby`): every IOC, in order, and its role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iocs: Vec<IocRole>,
    /// A host with standbys: its latest moves between IOCs, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<IocMove>,
}

/// One IOC of a host with standbys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IocRole {
    /// Its fabric address.
    pub address: String,
    /// `active`, `standby` (ready to take over), `standby, not ready` (answering, or its
    /// NIC down) or `down` (no session; tried again with backoff).
    pub role: String,
}

/// One move of a host from one IOC to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IocMove {
    /// The IOC it left.
    pub from: String,
    /// The IOC it moved to.
    pub to: String,
    /// `closed`, `silent`, `nic_down` or `failback`.
    pub cause: String,
    /// From the loss seen to the new IOC's Activate Ok (ms; absent: not completed).
    pub took_ms: Option<u64>,
    /// Seconds ago.
    pub ago_s: u64,
}

/// A network interface and its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    /// Name (sd0, lan0, ...).
    pub name: String,
    /// MAC address, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// MTU in bytes.
    pub mtu: u32,
    /// Carrier (host: sd0's, following the IOC's NIC) or link (IOC: the NIC's).
    pub carrier: bool,
    /// Promiscuous mode.
    pub promisc: bool,
    /// Multicast groups joined (host: sd0's; IOC: the union over its hosts).
    pub multicast: u32,
    /// Offloads in use: `vnet_hdr`, `csum`, `tso4`, `tso6`, `uso`, `ecn`.
    pub offloads: Vec<String>,
}

/// Answer to `pools`: the memory of every connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pools {
    /// One entry per connection (one on a host, one per host on an IOC).
    pub peers: Vec<PeerPools>,
}

impl PeerPools {
    /// Both directions' pools of `session`, as seen from its side.
    pub fn of(peer: String, session: &splitnet_messaging::endpoint::Session) -> PeerPools {
        PeerPools {
            peer,
            local: session
                .target()
                .pool_usage()
                .map(|u| LocalPool {
                    pool_ref: u.pool_ref,
                    element_size: u.spec.element_size,
                    element_count: u.spec.element_count,
                    credits_outstanding: u.granted,
                    busy: u.busy,
                    free: u.free,
                    state: u.state.into(),
                })
                .collect(),
            remote: session
                .initiator()
                .pool_credits()
                .map(|(e, credits)| RemotePool {
                    pool_ref: e.pool_ref,
                    element_size: e.element_size,
                    element_count: e.element_count,
                    credits,
                    in_use: e.element_count.saturating_sub(credits),
                })
                .collect(),
        }
    }
}

/// The pools of one connection, both directions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerPools {
    /// The peer: `ioc` on a host, `session N (MAC)` on an IOC.
    pub peer: String,
    /// Pools this daemon owns and the peer writes into (receive side).
    pub local: Vec<LocalPool>,
    /// The peer's pools this daemon writes into (send side: its credits).
    pub remote: Vec<RemotePool>,
}

/// A pool this daemon registered and advertised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalPool {
    /// The pool reference on the wire.
    pub pool_ref: u32,
    /// Bytes per element.
    pub element_size: u32,
    /// Elements.
    pub element_count: u32,
    /// Elements the peer holds credits for (may write into).
    pub credits_outstanding: u32,
    /// Elements written, waiting for their indication or being delivered.
    pub busy: u32,
    /// Elements free here, waiting to be returned in a BufferRecvPoolUpdate.
    pub free: u32,
    /// `active`, `quiescing` (flush sent, waiting for the reply) or `draining`.
    pub state: String,
}

/// A pool of the peer this daemon writes into.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemotePool {
    /// The pool reference on the wire.
    pub pool_ref: u32,
    /// Bytes per element.
    pub element_size: u32,
    /// Elements.
    pub element_count: u32,
    /// Credits held: elements this daemon may write into now.
    pub credits: u32,
    /// Elements written and not yet returned by the peer.
    pub in_use: u32,
}

/// Answer to `hosts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hosts {
    /// Every host connected now.
    pub hosts: Vec<HostEntry>,
}

fn one() -> u8 {
    1
}

/// One host's session as the IOC serves it (a host with several queues has one per queue).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostEntry {
    /// Session number.
    pub session: u64,
    /// The host's node id from its Hello.
    pub node_id: u64,
    /// Which of the host's queues this session serves (0 carries its configuration).
    #[serde(default)]
    pub queue: u8,
    /// Queues the host opened.
    #[serde(default = "one")]
    pub queues: u8,
    /// The host's fabric address.
    pub address: String,
    /// Its name in the IOC's `[[auth.hosts]]` (empty: not admitted by key).
    #[serde(default)]
    pub name: String,
    /// The MAC the host uses on the LAN.
    pub mac: String,
    /// Protection domain of its registrations.
    pub domain: u64,
    /// Its MTU.
    pub mtu: u32,
    /// Promiscuous mode requested.
    pub promisc: bool,
    /// Multicast groups it joined.
    pub multicast: u32,
    /// Offloads it uses.
    pub offloads: Vec<String>,
    /// Seconds since it connected.
    pub connected_s: u64,
    /// Its traffic (tx: IOC to host).
    pub counters: Counters,
    /// Bytes of the IOC's send buffers (their capacity) it holds now: frames queued towards
    /// it, a small frame in a 2 KiB buffer, a larger one in a 64 KiB buffer.
    #[serde(default)]
    pub buffer_bytes: u64,
    /// Bytes of send buffers it may hold at most; frames for it beyond are dropped
    /// (`rx_quota`).
    #[serde(default)]
    pub buffer_quota_bytes: u64,
    /// LAN frames the IOC wrote straight into its pools, read from its own queue on the
    /// NIC (a host over shared memory; frames few enough for SendData go inline instead).
    #[serde(default)]
    pub in_place: u64,
    /// Frames to it the IOC marked Congestion Experienced (RFC 3168) while more than half
    /// its share of send buffers was held, instead of dropping frames once it is full.
    #[serde(default)]
    pub ce_marked: u64,
    /// Its frames dropped, by cause (causes with a count only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drops: BTreeMap<String, u64>,
    /// The MACs of machines bridged behind it (its entry's `extra_macs`) that it holds: it
    /// may send from them, and frames to them reach it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bridged: Vec<String>,
    /// A standby session (docs/protocol.md 6.5): it claims no MAC and carries no frame
    /// until its host activates it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
    /// Its port on the IOC's machine (`lan.mode = "ports"`; empty in shared mode).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub port: String,
}

/// Frame counters of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Direction {
    /// Frames.
    pub frames: u64,
    /// Bytes.
    pub bytes: u64,
    /// Frames dropped.
    pub dropped: u64,
}

/// Offload feature bits by name (`vnet_hdr`, `csum`, ...), as the reports list them.
pub fn offload_names(bits: u64) -> Vec<String> {
    splitnet_messaging::wire::features::names(bits)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// Counters of one connection or one daemon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Sent to the peer (host: to the IOC; IOC: to the hosts).
    pub tx: Direction,
    /// Received from the peer.
    pub rx: Direction,
    /// Peers disconnected for breaking the protocol.
    pub protocol_errors: u64,
    /// Peers disconnected for a protection error (a write the adapter refused).
    pub protection_errors: u64,
}

impl From<&splitnet_messaging::wire::Stats> for Counters {
    /// A host's counters as the IOC keeps them (CfgUtil GetStats), seen from the IOC: tx is
    /// IOC to host.
    fn from(s: &splitnet_messaging::wire::Stats) -> Counters {
        Counters {
            tx: Direction {
                frames: s.rx_frames,
                bytes: s.rx_bytes,
                dropped: s.rx_dropped,
            },
            rx: Direction {
                frames: s.tx_frames,
                bytes: s.tx_bytes,
                dropped: s.tx_dropped,
            },
            protocol_errors: s.protocol_errors,
            protection_errors: s.protection_errors,
        }
    }
}

/// The NIC's own counters, as the kernel keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicStats {
    /// Received by the NIC.
    pub rx: Direction,
    /// Sent by the NIC.
    pub tx: Direction,
    /// Receive errors.
    pub rx_errors: u64,
    /// Transmit errors.
    pub tx_errors: u64,
}

impl NicStats {
    /// The kernel's counters of interface `name` of this network namespace (sysfs), or
    /// `None` when it has none.
    pub fn read(name: &str) -> Option<NicStats> {
        let read = |c: &str| -> Option<u64> {
            std::fs::read_to_string(format!("/sys/class/net/{name}/statistics/{c}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(NicStats {
            rx: Direction {
                frames: read("rx_packets")?,
                bytes: read("rx_bytes")?,
                dropped: read("rx_dropped")?,
            },
            tx: Direction {
                frames: read("tx_packets")?,
                bytes: read("tx_bytes")?,
                dropped: read("tx_dropped")?,
            },
            rx_errors: read("rx_errors")?,
            tx_errors: read("tx_errors")?,
        })
    }
}

/// Answer to `stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Which daemon.
    pub role: Role,
    /// The daemon's fabric traffic since it started (all connections).
    pub fabric: Counters,
    /// Frames sent inline as SendData.
    pub tx_inline: u64,
    /// Frames sent in the express lane (SendData on the control channel).
    #[serde(default)]
    pub tx_express: u64,
    /// Frames received in the express lane.
    #[serde(default)]
    pub rx_express: u64,
    /// Times a frame waited for a credit.
    pub tx_backpressure: u64,
    /// Credit updates (BufferRecvPoolUpdate) sent to the peers: a wake-up of the peer each.
    #[serde(default)]
    pub credit_updates: u64,
    /// Credits held now in the peers' pools (all connections).
    pub credits: u64,
    /// Elements of the peers' pools in use now.
    pub credits_in_use: u64,
    /// The kernel's counters of the daemon's interface: the NIC (IOC), or the TAP (host),
    /// whose tx dropped counts the frames the kernel had to drop because the driver did not
    /// read them in time (its queue to the driver was full).
    pub nic: Option<NicStats>,
    /// The IOC's counters for this host, from CfgUtil GetStats (host, while the fabric is
    /// up; refreshed every second; tx is IOC to host).
    pub ioc: Option<Counters>,
    /// Frames dropped, by where and why (causes with a count only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drops: BTreeMap<String, u64>,
    /// Bytes of the IOC's send buffers queued towards hosts now, and of all there may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_buffer_bytes: Option<(u64, u64)>,
    /// The host's transmit scheduling (its first queue): the byte limit and the flow queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_limit: Option<TxLimit>,
}

/// A host's byte limit and flow queue towards the IOC (see `splitnet_messaging::sched`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxLimit {
    /// Bytes in flight allowed now.
    pub limit_bytes: u64,
    /// Times the limit grew (the path ran dry).
    pub grown: u64,
    /// Times it shrank (a standing queue persisted).
    pub shrunk: u64,
    /// Times the sender was held back by it.
    pub held_back: u64,
    /// Frames waiting in the flow queue now.
    pub queued: u64,
    /// Frames the flow queue dropped: a flow over its share, or the queue full.
    pub queue_drops: u64,
    /// Frames of a flow with a standing queue marked Congestion Experienced (RFC 3168).
    #[serde(default)]
    pub ce_marked: u64,
}
