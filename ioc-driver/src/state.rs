//! One worker's state ([`WorkerState`]): the adapter's memory, its socket on the NIC, its
//! send buffers, and every host session it serves; admitting and removing hosts, their own
//! LAN queues, and the NIC's multicast filter.
//!
//! Each worker thread has one (see [`crate::shard`]), served by tasks of its tokio
//! `LocalSet`; tasks borrow this state only between awaits, so there are no locks, and a
//! frame moves from one host's pool to the NIC or to another host of the same worker
//! without crossing threads.

use crate::counters::{Drops, IocStats, RxDrop};
use crate::gate::Policy;
use crate::host_queue::{HostQueue, SMALL_BUFFER};
use crate::lan_tx::LanTx;
use crate::nic::Nic;
use crate::own_queue::{OwnQueue, OwnQueueRetry, FRAME_MAX};
use crate::port::{Action, Hooks, PortQueue, PortSpec};
use crate::rate::RateLimit;
use crate::shard::{self, KeyHold, Shard};
use splitnet_config::{Admission, IocAuth, IocConfig, LanMode, Promiscuous};
use splitnet_fabric::auth::Key;
use splitnet_fabric::FabricChannel;
use splitnet_messaging::endpoint::{Keepalive, Link, LinkError};
use splitnet_messaging::memory::{Registry, SendBufCache};
use splitnet_messaging::wire::{self, fmt_mac, CfgCode, ErrorCode, Queue, Stats};
use splitnet_service::loglimit::LogLimit;
use splitnet_service::notify;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Instant;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// Send buffers for the LAN receive path and host-to-host forwarding, shared out among the
/// sessions the IOC may serve (each buffer holds the largest frame, about 64 KiB).
const SEND_BUFFERS: usize = 256;
/// Fewest and most of those one session's share is worth.
const QUOTA_RANGE: (usize, usize) = (8, 128);
/// Bytes a host may leave unread on its control channel before its session ends: a peer
/// that asks and never reads the answers cannot grow the IOC's memory.
pub const MAX_CONTROL_BACKLOG: usize = 256 << 10;

/// What a worker's send buffers are and what one session may hold of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferPlan {
    /// Bytes of send buffers (their capacity) one session may hold.
    pub quota: usize,
    /// Full-size buffers there may be.
    pub buffers: usize,
    /// Small buffers there may be ([`SMALL_BUFFER`]).
    pub small: usize,
}

/// Each session's share of the send buffers, and the size of the pools: every session at
/// its quota still leaves the buffer the LAN is read into, so no host can stop the others'
/// traffic by not reading its own; and every session may hold its quota in small buffers.
pub fn buffer_plan(max_sessions: u32) -> BufferPlan {
    let n = max_sessions.max(1) as usize;
    let share = (SEND_BUFFERS / n).clamp(QUOTA_RANGE.0, QUOTA_RANGE.1);
    let quota = share * wire::MAX_SEND_DATA;
    BufferPlan {
        quota,
        buffers: share * n + 1,
        small: quota / SMALL_BUFFER * n,
    }
}

/// An unguessable 64-bit token from the operating system's random source (falling back
/// to a keyed hash of the time, which std seeds from that source too).
fn session_token() -> u64 {
    getrandom::u64()
        .unwrap_or_else(|_| std::hash::BuildHasher::hash_one(&RandomState::new(), Instant::now()))
}

/// Who a connecting session is, as its control channel's handshake established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// The host's identity: the node id its key gives, or (open admission, no key) the one
    /// its Hello announced.
    pub node_id: u64,
    /// The key its handshake proved, if it was authenticated.
    pub key: Option<Key>,
    /// Which queue of the host it opens.
    pub queue: Queue,
    /// For a further queue, the token of the host's first queue.
    pub first: u64,
    /// What admission gives it.
    pub policy: Policy,
    /// Its data channel travels in the clear over TCP or RDMA (not sealed, not shared
    /// memory).
    pub clear_data: bool,
    /// The worker's [`WorkerState::auth_generation`] when its connection arrived: a reload
    /// since makes `policy` stale.
    pub generation: u64,
    /// Its handshake agreed a standby session ([`HelloReply::STANDBY`]): it claims nothing
    /// until activated ([`WorkerState::activate`]).
    ///
    /// [`HelloReply::STANDBY`]: splitnet_messaging::wire::HelloReply::STANDBY
    pub standby: bool,
    /// The Keepalive interval its handshake agreed ([`liveness_interval`]), instead of
    /// `fabric.keepalive_interval_ms`.
    pub liveness: Option<std::time::Duration>,
}

/// Shortest Keepalive interval a host may agree: below it, an idle IOC of many hosts would
/// spend its time on Keepalives.
pub const LIVENESS_MIN_MS: u16 = 10;

/// The Keepalive interval the IOC keeps for a host that asked for `asked_ms`: within
/// [`LIVENESS_MIN_MS`] and the IOC's own `keepalive_ms` (it never sends less often than it
/// does to every host).
pub fn liveness_interval(asked_ms: u16, keepalive_ms: u64) -> u16 {
    let max = u16::try_from(keepalive_ms)
        .unwrap_or(u16::MAX)
        .max(LIVENESS_MIN_MS);
    asked_ms.clamp(LIVENESS_MIN_MS, max)
}

#[cfg(test)]
impl Who {
    /// A single-queue host of identity `node_id`, no key (tests and open admission).
    pub fn node(node_id: u64) -> Who {
        Who {
            node_id,
            key: None,
            queue: Queue::SINGLE,
            first: 0,
            policy: Policy::open(),
            clear_data: false,
            generation: 0,
            standby: false,
            liveness: None,
        }
    }
}

/// A control channel waiting for its data channel.
#[derive(Debug)]
pub struct Waiting {
    /// The control channel.
    pub ch: FabricChannel,
    /// Its session.
    pub session: u64,
    /// Who it is.
    pub who: Who,
    /// A first queue's hold on its key's worker ([`KeyHold`]).
    pub hold: Option<KeyHold>,
    /// It holds a session's place while it waits: it proved no admitted key yet that its
    /// data channel will prove (no key, or open admission, where any key gets in).
    pub counted: bool,
}

/// Replacements of a key's session closer together than this say that two host-drivers
/// share the key (a restarted host replaces its old session once).
const SHARED_KEY_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The MACs the entries of `auth` reserve, each to its entry's key: under key admission
/// every entry's `mac` and `extra_macs` are its host's alone.
pub fn reservations(auth: &IocAuth) -> HashMap<[u8; 6], Key> {
    if auth.admission != Admission::Keys {
        return HashMap::new();
    }
    auth.hosts
        .iter()
        .flat_map(|h| h.reserved_macs().map(|m| (m, h.public_key.0)))
        .collect()
}

/// One worker's state: its share of the IOC's hosts, their pools, its NIC socket.
#[derive(Debug)]
pub struct WorkerState {
    /// Configuration.
    pub cfg: IocConfig,
    /// The adapter's registered memory (every host's pools, each in its own domain).
    pub reg: Registry,
    /// The NIC.
    pub nic: Box<dyn Nic>,
    /// Frames for the NIC, sent in batches.
    pub lan_tx: LanTx,
    /// The NIC's MTU as offered to hosts.
    pub mtu: u32,
    /// NIC link state.
    pub nic_up: bool,
    /// The NIC's own MAC (the IOC machine's address on the LAN): its frames are the
    /// machine's, never a promiscuous host's.
    pub nic_mac: Option<[u8; 6]>,
    /// Send buffers.
    pub cache: SendBufCache,
    /// Bytes of send buffers each session may hold ([`buffer_plan`]).
    pub quota: usize,
    /// Drops counted against the hosts that left.
    pub past_drops: Drops,
    /// Rate of the log lines the NIC's receive causes.
    pub log: LogLimit,
    /// Rate of the log lines connections refused in their handshake cause (a flood of
    /// them costs a line per [`crate::host_queue::LOG_INTERVAL`], with a count).
    pub refusals: LogLimit,
    /// Source MACs any host may use besides its own (`lan.extra_source_macs`).
    pub extra_macs: Vec<[u8; 6]>,
    /// Connected hosts by session id.
    pub hosts: BTreeMap<u64, HostQueue>,
    /// Each host's MAC, to the session of its first queue: the destination lookup of every
    /// frame, in constant time whatever the number of hosts.
    pub by_mac: HashMap<[u8; 6], u64>,
    /// Counters.
    pub stats: IocStats,
    /// Shutting down: no new hosts.
    pub stopping: bool,
    /// Signalled when send buffers come back to the cache ([`WorkerState::wake_readers`]).
    pub buffers_freed: Rc<Notify>,
    /// When the IOC started.
    pub started: Instant,
    /// Hosts admitted since start.
    pub connects: u64,
    /// Standby sessions activated since start.
    pub activations: u64,
    /// Counters of the hosts that left.
    pub past: Stats,
    /// Multicast groups joined on the NIC: the union of every host's.
    pub nic_groups: BTreeSet<[u8; 6]>,
    /// `lan.promiscuous = "auto"`: the MACs this worker put in the NIC's unicast filter (its
    /// hosts' and their bridged machines'), and whether it holds the NIC promiscuous (one of
    /// its hosts is).
    pub nic_unicast: BTreeSet<[u8; 6]>,
    /// See `nic_unicast`.
    pub nic_promisc: bool,
    /// Keys of the flow hash that spreads a host's frames over its queues (random per
    /// process, so that LAN traffic cannot aim at one queue).
    pub flow_keys: RandomState,
    /// This worker's place among the IOC's workers.
    pub shard: Shard,
    /// Control channels waiting for their data channel, by the token the data channel
    /// must name.
    pub pending: HashMap<u64, Waiting>,
    /// Sessions whose place is taken and that are not hosts yet: control channels without
    /// a key whose HelloReply is on its way, data channels that proved a key and are being
    /// set up.
    pub admitting: usize,
    /// The MACs reserved for the entries of `[[auth.hosts]]`, to their keys
    /// ([`reservations`]).
    pub reserved: HashMap<[u8; 6], Key>,
    /// How many reloads this worker applied ([`WorkerState::apply_policy`]).
    pub auth_generation: u64,
    /// Where an access host's frame gets its VLAN's tag ([`crate::from_host`]).
    pub vlan_scratch: Vec<u8>,
    /// When each key's session was last replaced by a newer one (two host-drivers that
    /// share a key replace each other again and again: [`SHARED_KEY_WINDOW`]).
    pub replaced: HashMap<Key, Instant>,
    /// Ports mode (`lan.mode = "ports"`): each host's frames go to and come from its port.
    pub ports: bool,
    /// Ports mode: the port hook, told when a host's MAC becomes known or changes.
    pub hooks: Hooks,
}

impl WorkerState {
    /// The IOC over an opened NIC, with one worker.
    #[cfg(test)]
    pub fn new(cfg: IocConfig, nic: Box<dyn Nic>, mtu: u32, nic_up: bool) -> WorkerState {
        WorkerState::worker(cfg, nic, mtu, nic_up, Shard::alone())
    }

    /// One worker of the IOC, with its own socket on the NIC.
    pub fn worker(
        cfg: IocConfig,
        nic: Box<dyn Nic>,
        mtu: u32,
        nic_up: bool,
        shard: Shard,
    ) -> WorkerState {
        let limit = cfg
            .pools
            .max_granted_bytes
            .saturating_mul(u64::from(cfg.fabric.max_hosts));
        let plan = buffer_plan(cfg.fabric.max_hosts);
        // This worker's socket leaves the placed MACs to their hosts' own queues.
        match nic.exclusion() {
            Ok(Some(e)) => {
                if let Err(e) = shard.add_exclusion(e) {
                    warn!("LAN frames for hosts take the general path: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => warn!("LAN frames for hosts take the general path: {e}"),
        }
        WorkerState {
            reg: Registry::new(limit),
            nic,
            lan_tx: LanTx::default(),
            mtu,
            nic_up,
            nic_mac: None,
            cache: SendBufCache::new(wire::MAX_SEND_DATA, plan.buffers)
                .with_small(SMALL_BUFFER, plan.small),
            quota: plan.quota,
            past_drops: Drops::default(),
            log: LogLimit::new(crate::host_queue::LOG_INTERVAL),
            refusals: LogLimit::new(crate::host_queue::LOG_INTERVAL),
            extra_macs: cfg.lan.extra_source_macs.iter().map(|m| m.0).collect(),
            hosts: BTreeMap::new(),
            by_mac: HashMap::new(),
            stats: IocStats::default(),
            stopping: false,
            buffers_freed: Rc::new(Notify::new()),
            started: Instant::now(),
            connects: 0,
            activations: 0,
            past: Stats::default(),
            nic_groups: BTreeSet::new(),
            nic_unicast: BTreeSet::new(),
            nic_promisc: false,
            flow_keys: RandomState::new(),
            shard,
            pending: HashMap::new(),
            admitting: 0,
            reserved: reservations(&cfg.auth),
            replaced: HashMap::new(),
            vlan_scratch: Vec::new(),
            auth_generation: 0,
            ports: cfg.lan.mode == LanMode::Ports,
            hooks: Hooks::none(),
            cfg,
        }
    }

    /// Whether `mac` is reserved for the entry of another key than `key`.
    pub fn reserved_for_other(&self, mac: &[u8; 6], key: Option<&Key>) -> bool {
        self.reserved.get(mac).is_some_and(|k| Some(k) != key)
    }

    /// A MAC for a new host, claimed for this worker: the configured prefix and three
    /// bytes of its identity, avoiding every MAC any worker serves and every MAC an entry
    /// of `[[auth.hosts]]` reserves.
    pub fn assign_mac(&self, node_id: u64) -> [u8; 6] {
        let base = self.cfg.lan.mac_base.0;
        let start = node_id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let candidates = (0u64..).map(|i| {
            let b = start.wrapping_add(i << 40).to_be_bytes();
            [base[0], base[1], base[2], b[0], b[1], b[2]]
        });
        let first = candidates.clone().next().unwrap_or(base);
        // 65,536 candidates for at most 64 hosts and 1,024 entries of at most 65 MACs each
        // (fewer under one prefix than that): one is always free.
        let free = candidates.filter(|m| !self.reserved.contains_key(m));
        self.shard.claim_mac(&*self.nic, free).unwrap_or(first)
    }

    /// Takes `mac`, reserved for the host of `key`, from a session of this worker that holds
    /// it without that right (the reservation came with a reload): its claim ends, logged
    /// (the session itself when it is its own MAC: the protocol cannot move it).
    fn evict_squatter(&mut self, mac: [u8; 6], key: Option<&Key>, name: &str) {
        let Some(&holder) = self.by_mac.get(&mac) else {
            return;
        };
        let Some(h) = self.hosts.get_mut(&holder) else {
            return;
        };
        if h.key.as_ref() == key {
            return;
        }
        if h.mac == mac {
            warn!(session = holder, mac = %fmt_mac(&mac), "the host's MAC is reserved for host {name:?}, which connected: disconnecting it");
            if let Some(link) = h.link.as_mut() {
                link.goodbye(ErrorCode::Refused);
            }
            self.remove_host(holder, "its MAC is another host's", None);
        } else {
            warn!(session = holder, mac = %fmt_mac(&mac), "a bridged MAC the host held is reserved for host {name:?}, which connected: frames to it no longer reach this host");
            self.release_bridged(holder, &[mac]);
        }
    }

    /// The MAC of a new host: the one its policy gives it, or else one derived from its
    /// identity ([`WorkerState::assign_mac`]). A session of this worker holding the
    /// policy's MAC without the right gives it up; a policy's MAC still in use on another
    /// worker gives way to a derived one for this session, logged.
    fn claim_mac(&mut self, node_id: u64, key: Option<&Key>, policy: &Policy) -> [u8; 6] {
        if let Some(mac) = policy.mac {
            self.evict_squatter(mac, key, policy.name.as_deref().unwrap_or_default());
            if self
                .shard
                .claim_mac(&*self.nic, std::iter::once(mac))
                .is_some()
            {
                return mac;
            }
            warn!(
                mac = %fmt_mac(&mac),
                "the host's configured MAC is still in use; it gets another for this session"
            );
        }
        self.assign_mac(node_id)
    }

    /// Enters the MACs of its policy's bridged machines that host `session` (a first
    /// queue) does not hold yet in the forwarding table (this worker's and the directory
    /// every worker steers by), so frames to them reach it and it may send from them. A
    /// session of this worker holding one without the right gives it up; one another worker
    /// serves stays there, logged, and is tried again later ([`WorkerState::claim_missing`]).
    fn claim_bridged(&mut self, session: u64) {
        let Some(h) = self.hosts.get(&session).filter(|h| !h.standby) else {
            return;
        };
        let (key, name) = (h.key, h.policy.name.clone().unwrap_or_default());
        let missing: Vec<[u8; 6]> = h
            .policy
            .extra_macs
            .iter()
            .filter(|m| !h.bridged.contains(m) && **m != h.mac)
            .copied()
            .collect();
        let mut claimed = Vec::new();
        let mut held_elsewhere = false;
        for mac in missing {
            self.evict_squatter(mac, key.as_ref(), &name);
            if self
                .shard
                .claim_mac(&*self.nic, std::iter::once(mac))
                .is_some()
            {
                self.by_mac.insert(mac, session);
                claimed.push(mac);
            } else {
                held_elsewhere = true;
                if let Some(held) = self.log.allow(Instant::now()) {
                    warn!(session, mac = %fmt_mac(&mac), "a bridged MAC of the host's policy is another host's for now; frames to it do not reach this host until it is free ({held} more held back)");
                }
            }
        }
        let Some(h) = self.hosts.get_mut(&session) else {
            return;
        };
        h.bridged.extend(claimed);
        h.bridged_missing = held_elsewhere;
        self.share_bridged(session);
    }

    /// Gives up host `session`'s claims on the bridged MACs `macs`.
    fn release_bridged(&mut self, session: u64, macs: &[[u8; 6]]) {
        let own = self.hosts.get(&session).map(|h| h.mac);
        for mac in macs.iter().filter(|m| Some(**m) != own) {
            if self.by_mac.get(mac) == Some(&session) {
                self.by_mac.remove(mac);
                self.shard.release_mac(&*self.nic, *mac);
            }
        }
        if let Some(h) = self.hosts.get_mut(&session) {
            h.bridged.retain(|m| !macs.contains(m));
        }
        self.share_bridged(session);
    }

    /// Gives every queue of host `session` (its first) the bridged MACs it holds and its
    /// policy: each queue checks the sources of its frames against them.
    fn share_bridged(&mut self, first: u64) {
        let Some(h) = self.hosts.get(&first) else {
            return;
        };
        let (bridged, policy) = (h.bridged.clone(), h.policy.clone());
        for q in self.hosts.values_mut().filter(|q| q.first == first) {
            q.bridged.clone_from(&bridged);
            q.policy.clone_from(&policy);
        }
    }

    /// Ports mode: follows each port's MTU as the switch sets it, as shared mode follows
    /// the NIC's: every queue of the host takes it (a host at the old MTU follows it up or
    /// down, one above the new one comes down to it) and the host is told (LinkChange).
    /// Called every [`crate::port::FOLLOW`].
    pub fn follow_ports(&mut self) {
        let up = self.nic_up;
        let mut told = false;
        for (&session, h) in self.hosts.iter_mut() {
            let Some((before, now)) = h.port.as_ref().and_then(|p| p.mtu_changed()) else {
                continue;
            };
            h.mtu = if h.mtu == before { now } else { h.mtu.min(now) };
            if !h.queue.is_first() {
                continue;
            }
            info!(session, before, now, "port MTU changed: telling the host");
            if let Some(link) = h.link.as_mut() {
                let change = wire::LinkChange { up, mtu: now }.emit();
                link.session_mut().cfg_request(CfgCode::LinkChange, &change);
                told = true;
            }
        }
        if told {
            self.kick_hosts();
        }
    }

    /// Claims the bridged MACs hosts could not have when they asked (another worker held
    /// them a moment, as across a reload); called every second.
    pub fn claim_missing(&mut self) {
        // A host that got a derived MAC because its configured one was another worker's a
        // moment (across a reload) reconnects to take it once it is free.
        let displaced: Vec<u64> = self
            .hosts
            .values()
            .filter(|h| h.queue.is_first())
            .filter(|h| {
                h.policy.mac.is_some_and(|m| {
                    m != h.mac && !self.by_mac.contains_key(&m) && self.shard.owner(&m).is_none()
                })
            })
            .map(|h| h.session)
            .collect();
        for s in displaced {
            info!(
                session = s,
                "the host's configured MAC is free again: it reconnects to take it"
            );
            if let Some(link) = self.hosts.get_mut(&s).and_then(|h| h.link.as_mut()) {
                link.goodbye(ErrorCode::Refused);
            }
            self.remove_host(s, "its configured MAC is free again", None);
        }
        let waiting: Vec<u64> = self
            .hosts
            .values()
            .filter(|h| h.bridged_missing && h.queue.is_first())
            .map(|h| h.session)
            .collect();
        if waiting.is_empty() {
            return;
        }
        for s in waiting {
            self.claim_bridged(s);
        }
        self.sync_nic_filter();
    }

    /// A new session id (unique among the workers, never reused while the IOC runs, so
    /// nothing that outlives a session can act on a later one) and the unguessable token
    /// its channels name, which also names this worker.
    pub fn new_session(&mut self) -> (u64, u64) {
        (
            self.shard.next_session(),
            shard::token(session_token(), self.shard.index),
        )
    }

    /// Tells the other workers how many sessions this one holds.
    /// Control channels waiting for their data channel count only when they hold a place
    /// ([`Waiting::counted`]): one with an admitted key takes its place once its data
    /// channel proves the key.
    pub fn publish_load(&self) {
        let pending = self.pending.values().filter(|w| w.counted);
        self.shard
            .set_load(self.hosts.len() + pending.count() + self.admitting);
    }

    /// Tells the other workers whether a host of this one is promiscuous.
    pub fn publish_promisc(&self) {
        self.shard
            .set_promisc(self.hosts.values().any(|h| h.promisc));
    }

    /// Flushes every host with output queued, except those whose socket is full (their
    /// own task waits for it), and takes their written buffers back.
    pub fn kick_hosts(&mut self) {
        let before = self.cache.in_use();
        for h in self.hosts.values_mut() {
            h.kick(&mut self.cache);
        }
        if self.cache.in_use() < before {
            self.wake_readers();
        }
    }

    /// Send buffers came back: wakes every receive queue's task waiting for them (each
    /// waits on its own, so one wake-up would leave the others' sockets unread), and keeps a
    /// permit for a task about to wait.
    pub fn wake_readers(&self) {
        self.buffers_freed.notify_waiters();
        self.buffers_freed.notify_one();
    }

    /// The connected first queue, named by its token `who.first`, that a session for
    /// `who.queue` joins: same node and key, same number of queues, and that queue not
    /// taken yet.
    pub fn first_queue(&self, who: &Who) -> Option<&HostQueue> {
        let queue = who.queue;
        self.hosts
            .values()
            .find(|h| h.token == who.first)
            .filter(|h| {
                h.node_id == who.node_id
                    && h.key == who.key
                    && h.queue.is_first()
                    && !h.standby
                    && h.queue.count == queue.count
                    && !h
                        .queues
                        .iter()
                        .any(|s| self.hosts.get(s).is_some_and(|q| q.queue == queue))
            })
    }

    /// Admits a host whose handshake completed: tells it the NIC's state and sends what its
    /// link has queued (the HelloReply and the pool advertisements). Returns the notifier
    /// that wakes its task, or `None` (the session closed and its pools freed) for a further
    /// queue whose first queue has left meanwhile.
    pub fn add_host(
        &mut self,
        session: u64,
        token: u64,
        mut who: Who,
        mut link: Link<FabricChannel>,
        peer: String,
    ) -> Option<Rc<Notify>> {
        let (node_id, queue) = (who.node_id, who.queue);
        // A reload came while it connected: the policy of now, not of its Hello.
        let auth = &self.cfg.auth;
        let stale = who.generation != self.auth_generation;
        let now = match stale {
            false => Some(who.policy.clone()),
            true => Policy::of(auth, who.key.as_ref())
                .filter(|p| u16::from(queue.count) <= p.queues)
                .filter(|_| !(who.clear_data && auth.encrypt_data))
                .filter(|p| !who.standby || p.mac.is_some()),
        };
        match now {
            Some(p) if queue.is_first() => who.policy = p,
            Some(_) => {}
            None => {
                warn!(%peer, session, "a reload while the host connected no longer admits it; closed");
                link.goodbye(ErrorCode::Unauthenticated);
                link.close(&mut self.reg, &mut self.cache);
                self.free_domain(splitnet_messaging::memory::DomainId(session));
                return None;
            }
        }
        let name = who.policy.name.clone().unwrap_or_default();
        // Ports mode: an active session takes a queue of its host's port, or is refused.
        let port_name = match queue.is_first() {
            true => who.policy.port.clone(),
            false => self.first_queue(&who).and_then(|f| f.policy.port.clone()),
        };
        let port = match self.ports && !(who.standby && queue.is_first()) {
            true => match open_port(port_name.as_deref()) {
                Ok(p) => Some(p),
                Err(e) => {
                    warn!(%peer, session, name, "refused: {e}");
                    link.goodbye(ErrorCode::Refused);
                    link.close(&mut self.reg, &mut self.cache);
                    self.free_domain(splitnet_messaging::memory::DomainId(session));
                    return None;
                }
            },
            false => None,
        };
        let (first, mac, mtu, features) = if queue.is_first() {
            if let Some(key) = who.key {
                self.replace_older(&key, &name, &peer);
            }
            // A standby claims nothing: its MAC is its entry's (admission made sure it has
            // one), taken when it is activated.
            let mac = match (who.standby, who.policy.mac) {
                (true, Some(mac)) => mac,
                _ => self.claim_mac(node_id, who.key.as_ref(), &who.policy),
            };
            let mtu = port.as_ref().map_or(self.mtu, |p| p.mtu());
            (session, mac, mtu, 0)
        } else {
            match self.first_queue(&who) {
                Some(f) => (f.session, f.mac, f.mtu, f.features),
                None => {
                    // Only its handshake was posted on it: no frame to count.
                    link.close(&mut self.reg, &mut self.cache);
                    self.free_domain(splitnet_messaging::memory::DomainId(session));
                    return None;
                }
            }
        };
        if let Some(f) = self.hosts.get_mut(&first) {
            f.queues.push(session);
        }
        let f = &self.cfg.fabric;
        // The host's interface follows its first queue's session.
        if queue.is_first() {
            link.session_mut().cfg_request(
                CfgCode::LinkChange,
                &wire::LinkChange {
                    up: self.nic_up,
                    mtu,
                }
                .emit(),
            );
        }
        let keepalive = Keepalive::new(
            who.liveness.unwrap_or(f.keepalive_interval()),
            f.keepalive_timeout(),
            Instant::now(),
        );
        let mut host = HostQueue::new(
            session,
            token,
            node_id,
            queue,
            first,
            link,
            self.quota,
            keepalive,
            peer.clone(),
        );
        host.mac = mac;
        host.key = who.key;
        host.policy = who.policy;
        host.clear_data = who.clear_data;
        host.mtu = mtu;
        host.features = features;
        host.port = port;
        let pps = u64::from(self.cfg.lan.storm_control_pps);
        host.storm = (pps > 0).then(|| RateLimit::new(pps, 2 * pps, Instant::now()));
        let standby = who.standby && queue.is_first();
        host.standby = standby;
        if queue.is_first() && !standby {
            self.by_mac.insert(mac, session);
        }
        let wake = host.wake.clone();
        self.hosts.insert(session, host);
        if queue.is_first() {
            self.claim_bridged(session);
        } else {
            self.share_bridged(first);
        }
        if !standby {
            self.sync_nic_filter();
            self.open_own_queue(session);
            if queue.is_first() {
                self.port_changed(session, Action::Up);
            }
        }
        self.publish_load();
        self.connects += 1;
        info!(
            %peer,
            name,
            session,
            node_id,
            queue = queue.index,
            queues = queue.count,
            mac = %fmt_mac(&mac),
            hosts = self.hosts.len(),
            pool_regions = self.reg.stats().regions,
            standby,
            "host connected"
        );
        notify::status(&format!(
            "{} host(s) connected, LAN {}",
            self.hosts.len(),
            self.cfg.lan.interface
        ));
        self.kick_hosts();
        Some(wake)
    }

    /// Makes standby session `session` (a first queue) its host's active one, as the host
    /// asked (CfgUtil Activate): its MAC and its policy's bridged MACs are claimed in the
    /// forwarding table and the NIC's filter, and it gets its own LAN queue where it can.
    /// Ok for a session already active; Refused for a further queue, or when the MAC is in
    /// use by another host of this IOC that may keep it.
    pub fn activate(&mut self, session: u64) -> ErrorCode {
        let Some(h) = self.hosts.get(&session).filter(|h| h.queue.is_first()) else {
            return ErrorCode::Refused;
        };
        if !h.standby {
            return ErrorCode::Ok;
        }
        let (mac, key, name) = (h.mac, h.key, h.policy.name.clone().unwrap_or_default());
        // Its port's queue first: a refusal after the MAC's claim would leave it claimed.
        let port = match self.ports {
            true => match open_port(h.policy.port.as_deref()) {
                Ok(p) => Some(p),
                Err(e) => {
                    warn!(
                        session,
                        name, "a standby host asked to be activated: refused: {e}"
                    );
                    return ErrorCode::Refused;
                }
            },
            false => None,
        };
        self.evict_squatter(mac, key.as_ref(), &name);
        if self.by_mac.contains_key(&mac)
            || self
                .shard
                .claim_mac(&*self.nic, std::iter::once(mac))
                .is_none()
        {
            warn!(session, name, mac = %fmt_mac(&mac), "a standby host asked to be activated, and its MAC is another host's here: refused");
            return ErrorCode::Refused;
        }
        self.by_mac.insert(mac, session);
        if let Some(h) = self.hosts.get_mut(&session) {
            h.standby = false;
            h.port = port;
        }
        self.port_changed(session, Action::Up);
        self.claim_bridged(session);
        self.sync_nic_filter();
        self.open_own_queue(session);
        self.activations += 1;
        info!(session, name, mac = %fmt_mac(&mac), "standby host activated: its MACs are claimed here");
        ErrorCode::Ok
    }

    /// Ends the sessions of host `key` (named `name` in its entry) that a newer first queue
    /// from `peer` replaces: the host restarted before the IOC saw the old ones go, as
    /// WireGuard takes a peer's newest handshake. Replacements again and again mean two
    /// host-drivers share the key: a configuration error, logged by the entry's name.
    pub fn replace_older(&mut self, key: &Key, name: &str, peer: &str) {
        let older: Vec<(u64, String)> = self
            .hosts
            .values()
            .filter(|h| h.queue.is_first() && h.key.as_ref() == Some(key))
            .map(|h| (h.session, h.peer.clone()))
            .collect();
        if older.is_empty() {
            return;
        }
        let now = Instant::now();
        self.replaced
            .retain(|_, at| now.duration_since(*at) < SHARED_KEY_WINDOW);
        let again = self
            .replaced
            .insert(*key, now)
            .is_some_and(|at| now.duration_since(at) < SHARED_KEY_WINDOW);
        for (session, old_peer) in older {
            if again {
                tracing::error!(session, %peer, %old_peer, "host {name:?}: sessions of its key replace each other; two host-drivers share the key of this [[auth.hosts]] entry, and each needs a key of its own");
            } else {
                info!(session, %peer, %old_peer, "host {name:?}: a newer session of its key replaces this one (the host restarted)");
            }
            if let Some(link) = self.hosts.get_mut(&session).and_then(|h| h.link.as_mut()) {
                link.goodbye(ErrorCode::Refused);
            }
            self.remove_host(session, "replaced by a newer session of its key", None);
        }
    }

    /// Applies the configuration's `[auth]` (after a reload) to every session: those it no
    /// longer admits end (told Unauthenticated), as do those whose entry's `mac` or queues
    /// changed, whose MAC is reserved for another entry now, or whose data channel is not
    /// encrypted while `auth.encrypt_data` is set (told Refused: they reconnect under the
    /// new policy); the others take their entry's promiscuity and bridged MACs at once.
    /// Control channels waiting for their data channel that it no longer admits are
    /// dropped.
    pub fn apply_policy(&mut self) {
        self.auth_generation += 1;
        self.reserved = reservations(&self.cfg.auth);
        let admitted = |k: &Key| self.cfg.auth.host(k).is_some();
        self.replaced.retain(|k, _| admitted(k));
        let firsts: Vec<u64> = self
            .hosts
            .values()
            .filter(|h| h.queue.is_first())
            .map(|h| h.session)
            .collect();
        for s in firsts {
            let Some(h) = self.hosts.get(&s) else {
                continue;
            };
            let queues = self.hosts.values().filter(|q| q.first == s).count();
            let clear = self.hosts.values().any(|q| q.first == s && q.clear_data);
            let policy = Policy::of(&self.cfg.auth, h.key.as_ref());
            let end = match &policy {
                None if h.key.is_none() => Some((
                    ErrorCode::Unauthenticated,
                    "it proved no key, and auth.admission is \"keys\" now".to_string(),
                )),
                None => Some((
                    ErrorCode::Unauthenticated,
                    "its key is no longer admitted".to_string(),
                )),
                Some(p) if p.mac != h.policy.mac => Some((
                    ErrorCode::Refused,
                    format!(
                        "its entry's mac changed from {} to {}: it reconnects to take the new one",
                        h.policy.mac.map_or("none".into(), |m| fmt_mac(&m)),
                        p.mac.map_or("none".into(), |m| fmt_mac(&m)),
                    ),
                )),
                Some(p) if self.ports && p.port != h.policy.port => Some((
                    ErrorCode::Refused,
                    format!(
                        "its port changed from {} to {}: it reconnects to take the new one",
                        h.policy.port.as_deref().unwrap_or("none"),
                        p.port.as_deref().unwrap_or("none"),
                    ),
                )),
                Some(_) if self.reserved_for_other(&h.mac, h.key.as_ref()) => Some((
                    ErrorCode::Refused,
                    format!(
                        "its MAC {} is reserved for another host's entry now",
                        fmt_mac(&h.mac)
                    ),
                )),
                Some(p) if queues > usize::from(p.queues) => Some((
                    ErrorCode::Refused,
                    format!(
                        "it has {queues} queues and its entry allows {} now",
                        p.queues
                    ),
                )),
                Some(_) if clear && self.cfg.auth.encrypt_data => Some((
                    ErrorCode::Unauthenticated,
                    "its data channel is not encrypted and auth.encrypt_data is set now"
                        .to_string(),
                )),
                Some(_) => None,
            };
            let name = h.policy.name.clone().unwrap_or_default();
            if let Some((code, why)) = end {
                info!(session = s, name, "reload: disconnecting the host: {why}");
                if let Some(link) = self.hosts.get_mut(&s).and_then(|h| h.link.as_mut()) {
                    link.goodbye(code);
                }
                self.remove_host(s, &format!("reload: {why}"), None);
                continue;
            }
            let Some(policy) = policy else { continue };
            let Some(h) = self.hosts.get_mut(&s) else {
                continue;
            };
            if h.promisc && !policy.promiscuous {
                info!(session = s, name, "reload: the host may no longer be promiscuous; it now receives only its own frames");
                h.promisc = false;
            }
            let gone: Vec<[u8; 6]> = h
                .bridged
                .iter()
                .filter(|m| !policy.extra_macs.contains(m))
                .copied()
                .collect();
            let vlan_changed = h.policy.vlan != policy.vlan;
            if vlan_changed {
                info!(session = s, name, vlan = ?policy.vlan, "reload: the host's VLANs change");
            }
            h.policy = policy;
            self.release_bridged(s, &gone);
            self.claim_bridged(s);
            // Its own LAN queue's filter names its VLAN: made again.
            if vlan_changed {
                self.close_own_queue(s);
                if let Some(h) = self.hosts.get_mut(&s) {
                    h.own_queue_retry = None;
                }
                self.open_own_queue(s);
            }
        }
        let auth = &self.cfg.auth;
        self.pending
            .retain(|_, w| Policy::of(auth, w.who.key.as_ref()).is_some());
        self.sync_nic_filter();
        self.publish_promisc();
        self.publish_load();
    }

    /// Gives host `session` a queue of its own on the NIC once it can take LAN frames read
    /// straight into its pools ([`crate::own_queue`]): its only queue, over shared memory,
    /// with a pool that can always lend an element for any frame of the NIC's. Called
    /// whenever that may have become true (the host connected, changed its MAC, advertised
    /// pools or credits); until then, or when the NIC cannot, its frames keep the general
    /// path. A failed try is made again, when one of those happens,
    /// [`crate::own_queue::OWN_QUEUE_RETRY`] later, then less often.
    pub fn open_own_queue(&mut self, session: u64) {
        let Some(h) = self.hosts.get_mut(&session).filter(|_| !self.ports) else {
            return;
        };
        let Some(link) = h.link.as_ref() else {
            return;
        };
        let Some(frames) = h.policy.vlan.own_queue() else {
            return;
        };
        if h.queue != Queue::SINGLE
            || h.own_queue.is_some()
            || h.own_queue_retry.is_some_and(|r| Instant::now() < r.at)
            || !link.places_writes()
            || !link.session().initiator().may_take(FRAME_MAX)
        {
            return;
        }
        let mac = h.mac;
        if self.by_mac.get(&mac) != Some(&session) || !self.shard.place(mac, frames.tagged.clone())
        {
            h.own_queue_retry = Some(OwnQueueRetry::after(h.own_queue_retry, Instant::now()));
            return;
        }
        match OwnQueue::open(&*self.nic, mac, &frames) {
            Ok(q) => {
                debug!(session, "LAN frames for the host are read into its pools");
                h.own_queue = Some(q);
                h.own_queue_retry = None;
            }
            Err(e) => {
                let retry = OwnQueueRetry::after(h.own_queue_retry, Instant::now());
                h.own_queue_retry = Some(retry);
                self.shard.unplace(mac);
                warn!(
                    session,
                    "LAN frames for the host take the general path for {:?}: {e}", retry.wait
                );
            }
        }
    }

    /// Ports mode: tells the port hook that first queue `session` took its port (`up`),
    /// left it (`down`) or changed its MAC or MTU there (`change`), with those it has now.
    pub fn port_changed(&mut self, session: u64, action: Action) {
        let Some(h) = self.hosts.get_mut(&session) else {
            return;
        };
        // The port the session has: a reload may have named another in its entry.
        let Some(port) = h.port.as_ref().map(|p| p.name.clone()) else {
            return;
        };
        let entry = h.key.as_ref().and_then(|k| self.cfg.auth.host(k));
        let Some(spec) = entry.map(PortSpec::of).or_else(|| h.port_spec.clone()) else {
            return;
        };
        let spec = PortSpec {
            port,
            mac: Some(h.mac),
            mtu: Some(h.mtu),
            ..spec
        };
        self.hooks.run(action, &spec);
        h.port_spec = Some(spec);
    }

    /// Shuts host `session`'s own queue, if it has one, and gives its frames back to the
    /// general path. The general sockets take the MAC's frames first, then the queue stops
    /// taking any, so no frame falls between them; the frames still in the queue are dropped
    /// and counted (`rx_lost_at_close`; a frame that arrived in the moment both took it was
    /// also delivered by the general path, so the count may exceed the loss, never fall short
    /// of it), those its socket overflowed with as `rx_ring_full`. The shut queue is closed with the session ([`HostQueue::shut_queue`]).
    pub fn close_own_queue(&mut self, session: u64) {
        let Some(h) = self.hosts.get_mut(&session) else {
            return;
        };
        let Some(q) = h.own_queue.take() else {
            return;
        };
        self.shard.unplace(q.mac);
        let shut = q.shut();
        if let Some(e) = shut.error {
            warn!(session, "cannot stop the host's own LAN queue: {e}");
        }
        self.stats.lan_rx += shut.discarded;
        self.stats.lan_rx_dropped += shut.overflowed;
        h.drop_rx_n(RxDrop::LostAtClose, shut.discarded);
        h.drop_rx_n(RxDrop::RingFull, shut.overflowed);
        // Shut above, so it takes nothing more while it stays open.
        h.shut_queue = Some(q);
    }

    /// Adds the frames the hosts' own queues dropped since the last call to their counters
    /// (and to the LAN frames the kernel dropped).
    pub fn count_own_queue_drops(&mut self) {
        for h in self.hosts.values_mut() {
            if let Some(n) = h.own_queue.as_ref().map(OwnQueue::take_drops) {
                self.stats.lan_rx_dropped += n;
                h.drop_rx_n(RxDrop::RingFull, n);
            }
        }
    }

    /// Frees every region of `domain` (a host that could not be admitted).
    pub fn free_domain(&mut self, domain: splitnet_messaging::memory::DomainId) {
        for h in self.reg.regions_of(domain) {
            let _ = self.reg.deregister(h);
        }
        self.reg.detach_arena(domain);
    }

    /// Makes the NIC's multicast filter the union of every host's groups: joins the new
    /// ones, leaves the ones no host wants any more. A group the NIC refuses is logged and
    /// tried again on the next change.
    pub fn sync_multicast(&mut self) {
        let want: BTreeSet<[u8; 6]> = self
            .hosts
            .values()
            .flat_map(|h| h.multicast.iter().copied())
            .collect();
        let nic = &*self.nic;
        sync_memberships(&mut self.nic_groups, &want, "multicast group", |g, on| {
            nic.set_multicast(g, on)
        });
    }

    /// With `lan.promiscuous = "auto"`, makes the NIC's filters what this worker's hosts need:
    /// their MACs and their bridged machines' in its unicast filter (`PACKET_MR_UNICAST`; the
    /// kernel turns a NIC that cannot filter unicast promiscuous while the filter holds any),
    /// and promiscuous mode held while one of them is promiscuous. Other settings leave the
    /// NIC as it was opened ("on": promiscuous; "off": neither).
    pub fn sync_nic_filter(&mut self) {
        if self.cfg.lan.promiscuous != Promiscuous::Auto {
            return;
        }
        let want: BTreeSet<[u8; 6]> = self
            .hosts
            .values()
            .filter(|h| h.queue.is_first() && !h.standby && h.mac != [0; 6])
            .flat_map(|h| std::iter::once(h.mac).chain(h.bridged.iter().copied()))
            .collect();
        let nic = &*self.nic;
        sync_memberships(
            &mut self.nic_unicast,
            &want,
            "unicast filter entry",
            |m, on| nic.set_unicast(m, on),
        );
        let promisc = self.hosts.values().any(|h| h.promisc);
        if promisc != self.nic_promisc {
            match self.nic.set_promisc(promisc) {
                Ok(()) => self.nic_promisc = promisc,
                Err(e) => warn!(promisc, "cannot change the NIC's promiscuous mode: {e}"),
            }
        }
    }

    /// Removes a host's session: its channels are closed and every pool of its domain is
    /// freed. The host's other queues go with it: frames of their flows would otherwise be
    /// steered to a queue that is gone, and the host reconnects all its queues together.
    pub fn remove_host(&mut self, session: u64, why: &str, err: Option<&LinkError>) {
        let Some(first) = self.hosts.get(&session).map(|h| h.first) else {
            return;
        };
        let siblings: Vec<u64> = self
            .hosts
            .values()
            .filter(|h| h.first == first && h.session != session)
            .map(|h| h.session)
            .collect();
        self.remove_session(session, why, err);
        for s in siblings {
            self.remove_session(s, &format!("another queue of the host ended ({why})"), None);
        }
    }

    /// Removes a host that exceeded a resource limit: told with ResourceLimit (as far as
    /// its socket takes it), counted as a protocol error.
    pub fn remove_host_over_limit(&mut self, session: u64, why: &str) {
        if let Some(link) = self.hosts.get_mut(&session).and_then(|h| h.link.as_mut()) {
            self.stats.protocol_errors += 1;
            warn!(session, "host over its limits: {why}; disconnecting it");
            link.goodbye(ErrorCode::ResourceLimit);
        }
        self.remove_host(session, why, None);
    }

    fn remove_session(&mut self, session: u64, why: &str, err: Option<&LinkError>) {
        // Its own LAN queue is closed with `host` at the end, once its MAC is free for a
        // host that reconnects meanwhile.
        self.close_own_queue(session);
        if self.hosts.get(&session).is_some_and(|h| h.queue.is_first()) {
            self.port_changed(session, Action::Down);
        }
        let Some(mut host) = self.hosts.remove(&session) else {
            return;
        };
        for mac in std::iter::once(host.mac).chain(host.bridged.iter().copied()) {
            if self.by_mac.get(&mac) == Some(&session) {
                self.by_mac.remove(&mac);
                self.shard.release_mac(&*self.nic, mac);
            }
        }
        self.publish_load();
        if host.promisc {
            self.publish_promisc();
        }
        if let Some(e) = err.filter(|e| e.code().is_some()) {
            // The error table (docs/protocol.md, section 7): Goodbye with the row's code on
            // the control channel, then the session ends.
            if e.is_protection() {
                self.stats.protection_errors += 1;
            } else {
                self.stats.protocol_errors += 1;
            }
            warn!(
                session,
                row = e.row(),
                "host broke the protocol: {e}; disconnecting it"
            );
            if let Some(link) = host.link.as_mut() {
                link.fail(e);
            }
        }
        if let Some(mut link) = host.link.take() {
            let lost = link.close(&mut self.reg, &mut self.cache);
            host.drop_rx_n(RxDrop::LostAtClose, lost as u64);
        }
        let domain = splitnet_messaging::memory::DomainId(session);
        let left = self.reg.regions_of(domain);
        if !left.is_empty() {
            warn!(
                session,
                regions = left.len(),
                "pools left after teardown; freeing"
            );
            for h in left {
                let _ = self.reg.deregister(h);
            }
        }
        self.reg.detach_arena(domain);
        for b in host.take_waiting() {
            self.cache.put(b);
        }
        host.wake.notify_one();
        self.past += host.stats;
        self.past_drops += host.drops;
        self.wake_readers();
        if !host.multicast.is_empty() {
            self.sync_multicast();
        }
        self.sync_nic_filter();
        info!(
            session,
            node_id = host.node_id,
            queue = host.queue.index,
            mac = %fmt_mac(&host.mac),
            hosts = self.hosts.len(),
            pool_regions = self.reg.stats().regions,
            pool_bytes = self.reg.stats().bytes,
            "host removed: {why}"
        );
    }
}

/// A queue of port `name` for a session in ports mode; a host without an entry has none.
fn open_port(name: Option<&str>) -> Result<Rc<PortQueue>, String> {
    let name = name.ok_or("ports mode: only hosts of [[auth.hosts]] have a port")?;
    PortQueue::open(name)
        .map(Rc::new)
        .map_err(|e| format!("no queue of its port {name}: {e}"))
}

/// Makes `held` (what the NIC holds) `want`, each change through `set(mac, on)`. A MAC the NIC
/// refuses to take is logged (`what`) and not recorded; one it refuses to let go is logged
/// and forgotten.
fn sync_memberships(
    held: &mut BTreeSet<[u8; 6]>,
    want: &BTreeSet<[u8; 6]>,
    what: &str,
    set: impl Fn([u8; 6], bool) -> std::io::Result<()>,
) {
    for m in held.difference(want).copied().collect::<Vec<_>>() {
        if let Err(e) = set(m, false) {
            warn!(mac = %fmt_mac(&m), "cannot take a {what} off the NIC: {e}");
        }
        held.remove(&m);
    }
    for m in want.difference(held).copied().collect::<Vec<_>>() {
        match set(m, true) {
            Ok(()) => {
                held.insert(m);
            }
            Err(e) => warn!(mac = %fmt_mac(&m), "cannot put a {what} on the NIC: {e}"),
        }
    }
}
