//! One queue of a host (a session, [`HostQueue`]) as the IOC serves it, and what it may use
//! of the IOC.
//!
//! Every host gets its own share of the IOC's send buffers (its quota) and its own receive
//! ring (frames waiting for credit, by flow, bounded in bytes: new flows leave first, so a
//! reply passes a bulk download). A host that does not read fast enough
//! loses its own frames, counted against it; it can never take another host's buffers, and
//! a full socket of its own is waited on by its own task only.

use crate::counters::{Drops, RxDrop, TxDrop};
use crate::gate::Policy;
use crate::host_frame::HEAD;
use crate::own_queue::{OwnQueue, OwnQueueRetry, Read};
use crate::port::PortQueue;
use crate::rate::RateLimit;
use crate::shard::KeyHold;
use crate::vlan::Ingress;
use splitnet_fabric::FabricChannel;
use splitnet_messaging::ecn::{self, Mark};
use splitnet_messaging::endpoint::{Keepalive, Link, LinkError, Posted};
use splitnet_messaging::memory::{SendBuf, SendBufCache, SharedBytes};
use splitnet_messaging::sched::{Deficit, ExpressConfig, FqConfig, Scheduler};
use splitnet_messaging::vnet;
use splitnet_messaging::wire::{self, features, Queue, Stats};
use splitnet_service::loglimit::LogLimit;
use std::collections::hash_map::RandomState;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Bytes of frames held per host while it has no credit, like the descriptors of a NIC's
/// receive ring: a burst waits here, by flow, instead of being dropped; beyond it frames are
/// dropped and counted. One flow may fill half of it.
pub const RING_BYTES: u64 = 4 << 20;
/// Bytes a host's express lane (its control channel) may have unwritten before a sparse
/// flow's frame goes through the receive ring instead: the lane stays a short queue, and a
/// host that does not read is never driven into E16 by it (256 KiB).
pub const EXPRESS_BACKLOG: usize = 64 << 10;

/// Bytes of a small send buffer. A frame of at most this much (an MTU-sized frame with its
/// headers) waits in one instead of a 64 KiB buffer, so a host's share holds 32 times as
/// many of them as of the largest frames: 1,024 with `max_hosts` 8, about 12 ms of MTU-sized
/// frames at 1 Gb/s, where a share of 32 buffers of any size held 0.4 ms and a host that the
/// scheduler kept off its core for 10 ms lost frames (a NIC's ring holds 256 to 4,096).
pub const SMALL_BUFFER: usize = 2048;
/// CfgUtil requests a host may make per second, and at once: a host-driver asks for its
/// counters once a second and for a handful of settings when its interface changes.
pub const CFG_RATE: (u64, u64) = (20, 40);
/// Of those, the requests that cost the IOC more than an answer (SetMac reopens filters and
/// sockets, SetMulticast joins groups on the NIC under the kernel's rtnl lock, SetPromisc
/// and SetMtu change what every frame is checked against): per second, and at once.
pub const CFG_COSTLY_RATE: (u64, u64) = (2, 8);
/// Multicast groups one host may join: beyond, SetMulticast is refused (ResourceLimit).
pub const MAX_HOST_GROUPS: usize = 64;

/// Bytes a host's frames may take of its worker per round of deficit round robin, shared by
/// its queues: four TSO frames or about 180 of MTU size. A frame of another host waits at most
/// this much per backlogged host (200 us at 10 Gb/s); a smaller quantum costs a busy host one
/// more yield of its worker's loop (an `epoll_wait`) per quantum.
pub const DRR_QUANTUM: u32 = 256 << 10;

/// How often a host's bad frames may be logged (each line counts the ones held back).
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// One connected host session (one queue of a host).
#[derive(Debug)]
pub struct HostQueue {
    /// Session id (also its protection domain); never reused while the IOC runs.
    pub session: u64,
    /// The unguessable token its channels name in their Hellos.
    pub token: u64,
    /// Its identity: the node id its key gives, or (open admission) the one it announced.
    pub node_id: u64,
    /// The key its handshake proved, if it was authenticated.
    pub key: Option<splitnet_fabric::auth::Key>,
    /// What admission gave it: bridged machines' MACs, whether it may be promiscuous.
    pub policy: Policy,
    /// The bridged MACs of its policy entered in the forwarding table for it (on every
    /// queue of the host): the sources it may send from besides its own MAC.
    pub bridged: Vec<[u8; 6]>,
    /// Some bridged MACs of its policy were another host's when it asked: tried again
    /// (first queue only).
    pub bridged_missing: bool,
    /// Its data channel travels over TCP in the clear.
    pub clear_data: bool,
    /// A first queue's hold on its key's worker ([`KeyHold`]).
    pub hold: Option<KeyHold>,
    /// Which of the host's queues this session serves.
    pub queue: Queue,
    /// Session of the host's first queue (its own id on the first queue), which carries
    /// the host's configuration.
    pub first: u64,
    /// On the first queue: the sessions of every queue of the host connected so far, the
    /// first queue's own first; frames for the host are spread over them by flow.
    pub queues: Vec<u64>,
    /// MAC address assigned or set.
    pub mac: [u8; 6],
    /// MTU agreed.
    pub mtu: u32,
    /// Receives every LAN frame.
    pub promisc: bool,
    /// Its interface is in all-multicast mode: it receives every multicast frame.
    pub allmulti: bool,
    /// It joined more groups than the IOC keeps for a host ([`MAX_HOST_GROUPS`]): it
    /// receives every multicast frame, as behind a NIC whose filter overflows.
    pub allmulti_overflow: bool,
    /// Multicast groups it joined: the multicast frames it receives (besides all of them
    /// when promiscuous or all-multicast), and the NIC's filter holds their union.
    pub multicast: Vec<[u8; 6]>,
    /// Offload features it uses.
    pub features: u64,
    /// Its link; `None` only while its own frames are being forwarded.
    pub link: Option<Link<FabricChannel>>,
    /// Wakes its task when another path found its socket full (the task then waits for
    /// the socket to drain) or removed it.
    pub wake: Rc<Notify>,
    /// Its socket refused a write: its task waits for writability, and no other path
    /// writes to it (they queue, within the quota).
    pub blocked: bool,
    /// Bytes of send buffers (their capacity) it may hold at once, queued towards it or
    /// waiting in its receive ring (the worker's buffer plan gives it): a frame of up to
    /// [`SMALL_BUFFER`] bytes takes a small buffer, so a share holds 32 of those for each
    /// frame of the largest size.
    pub quota: usize,
    /// Keepalive timer.
    pub keepalive: Keepalive,
    /// Counters reported over CfgUtil GetStats.
    pub stats: Stats,
    /// Drops by cause (their sums are `stats.rx_dropped` and `stats.tx_dropped`).
    pub drops: Drops,
    /// Rate of the log lines it causes.
    pub log: LogLimit,
    /// Frames for it waiting for credit, by flow (its receive ring: at most [`RING_BYTES`]
    /// of frames and its quota of buffers; beyond, frames are dropped).
    rx_ring: Scheduler<SendBuf>,
    /// Bytes of the send buffers (their capacity) waiting in `rx_ring`.
    ring_held: usize,
    /// Its own queue of LAN frames, read straight into its pools ([`crate::own_queue`]).
    pub own_queue: Option<OwnQueue>,
    /// Opening that queue failed: its frames keep the general path until this retry (or
    /// its next MAC).
    pub own_queue_retry: Option<OwnQueueRetry>,
    /// Its last own queue, shut, closed with the session (see [`crate::own_queue`]).
    pub shut_queue: Option<OwnQueue>,
    /// Ports mode: this session's queue of the host's port ([`crate::port`]), attached
    /// while the session is active.
    pub port: Option<Rc<PortQueue>>,
    /// Ports mode: what the port hook was last told of this first queue's port (its `down`
    /// says the same once a reload took the entry away).
    pub port_spec: Option<crate::port::PortSpec>,
    /// Its fabric address.
    pub peer: String,
    /// When it connected.
    pub since: Instant,
    /// Its CfgUtil requests ([`CFG_RATE`]).
    pub cfg_rate: RateLimit,
    /// Its requests that make the IOC change the NIC or its filters ([`CFG_COSTLY_RATE`]).
    pub cfg_costly_rate: RateLimit,
    /// Its broadcast and multicast frames (`lan.storm_control_pps`; `None`: no limit).
    pub storm: Option<RateLimit>,
    /// Frames to it marked Congestion Experienced instead of being dropped later.
    pub ce_marked: u64,
    /// Its share of its worker: frames are read from its data channel by deficit round robin
    /// among the worker's hosts ([`DRR_QUANTUM`] per host and round, split among its queues).
    pub drr: Deficit,
    /// A standby session (docs/protocol.md 6.4): admitted, but it holds no MAC, gets no
    /// frame and may send none until its host activates it.
    pub standby: bool,
}

impl HostQueue {
    /// A host session just admitted, with nothing queued.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        session: u64,
        token: u64,
        node_id: u64,
        queue: Queue,
        first: u64,
        link: Link<FabricChannel>,
        quota: usize,
        keepalive: Keepalive,
        peer: String,
    ) -> HostQueue {
        HostQueue {
            session,
            token,
            node_id,
            key: None,
            policy: Policy::open(),
            bridged: Vec::new(),
            bridged_missing: false,
            clear_data: false,
            hold: None,
            queue,
            first,
            queues: if queue.is_first() {
                vec![session]
            } else {
                Vec::new()
            },
            mac: [0; 6],
            mtu: 0,
            promisc: false,
            allmulti: false,
            allmulti_overflow: false,
            multicast: Vec::new(),
            features: 0,
            link: Some(link),
            wake: Rc::new(Notify::new()),
            blocked: false,
            quota,
            keepalive,
            stats: Stats::default(),
            drops: Drops::default(),
            log: LogLimit::new(LOG_INTERVAL),
            rx_ring: Scheduler::new(
                FqConfig {
                    max_frames: (quota / SMALL_BUFFER).max(1),
                    max_bytes: RING_BYTES,
                    flow_bytes: RING_BYTES / 2,
                    ..FqConfig::default()
                },
                // No byte limit: frames waiting here hold send buffers of the host's quota,
                // so a limit that keeps them waiting drives the host into its quota. Measured
                // with e2e 24 (32 flows over 3 queues): 1.8% of frames dropped with the
                // limit, 0.02% without. Frames towards a host wait only for credit, by flow.
                None,
                Instant::now(),
            )
            .with_express(ExpressConfig::default(), Instant::now()),
            ring_held: 0,
            own_queue: None,
            own_queue_retry: None,
            shut_queue: None,
            port: None,
            port_spec: None,
            peer,
            since: Instant::now(),
            cfg_rate: RateLimit::new(CFG_RATE.0, CFG_RATE.1, Instant::now()),
            cfg_costly_rate: RateLimit::new(CFG_COSTLY_RATE.0, CFG_COSTLY_RATE.1, Instant::now()),
            storm: None,
            ce_marked: 0,
            drr: Deficit::new(DRR_QUANTUM / u32::from(queue.count.max(1))),
            standby: false,
        }
    }

    /// Whether a frame to group address `dst` is for this host: every broadcast; a
    /// multicast frame only where it joined the group, or takes every multicast frame.
    pub fn wants_group(&self, dst: &[u8; 6]) -> bool {
        *dst == [0xff; 6]
            || self.promisc
            || self.allmulti
            || self.allmulti_overflow
            || self.multicast.contains(dst)
    }

    /// The session of this host's queues that carries `frame`'s flow (call on the first
    /// queue).
    pub fn steer(&self, frame: &[u8], keys: &RandomState) -> u64 {
        match self.queues.len() {
            0 | 1 => self.session,
            n => self.queues[(vnet::flow_hash(frame, keys) % n as u64) as usize],
        }
    }

    /// Bytes of send buffers (their capacity) it holds: waiting in its receive ring, queued
    /// on its link, or written and not yet taken back.
    pub fn held(&self) -> usize {
        self.ring_held + self.link.as_ref().map_or(0, |l| l.held_bytes())
    }

    /// Frames waiting in its receive ring.
    #[cfg(test)]
    pub fn ring_waiting(&self) -> usize {
        self.rx_ring.waiting()
    }

    /// True when one more send buffer of `size` bytes fits its quota.
    pub fn has_room(&self, size: usize) -> bool {
        self.held() + size <= self.quota
    }

    /// Counts a frame for it that was dropped.
    pub fn drop_rx(&mut self, why: RxDrop) {
        self.drop_rx_n(why, 1);
    }

    /// Counts `n` frames for it that were dropped.
    pub fn drop_rx_n(&mut self, why: RxDrop, n: u64) {
        self.stats.rx_dropped += n;
        match why {
            RxDrop::RingFull => self.drops.ring_full += n,
            RxDrop::Quota => self.drops.quota += n,
            RxDrop::TooLarge => self.drops.too_large += n,
            RxDrop::Unreadable => self.drops.unreadable += n,
            RxDrop::LostAtClose => self.drops.lost_at_close += n,
        }
    }

    /// Counts a frame from it that was dropped.
    pub fn drop_tx(&mut self, why: TxDrop) {
        self.stats.tx_dropped += 1;
        let d = &mut self.drops;
        match why {
            TxDrop::BadOffload => d.bad_offload += 1,
            TxDrop::Spoofed => d.spoofed += 1,
            TxDrop::OverMtu => d.over_mtu += 1,
            TxDrop::NotNegotiated => d.not_negotiated += 1,
            TxDrop::OversizeInline => d.oversize_inline += 1,
            TxDrop::Nic => d.nic += 1,
            TxDrop::Storm => d.storm += 1,
            TxDrop::Vlan => d.vlan += 1,
            TxDrop::Standby => d.standby += 1,
        }
    }

    /// Checks a frame of `len` bytes the host sent, from `head` (its first bytes, private),
    /// against what it negotiated: offload metadata the kernel may see, its own source MAC
    /// (or one of `extra_macs`, or a bridged MAC of its policy that it holds), its VLAN
    /// policy, only the offloads it negotiated (`offered` until it sent SetFeatures), and its
    /// MTU. The error says why; `Ok` says what the frame needs for its VLAN.
    pub fn check_tx(
        &self,
        head: &[u8],
        len: usize,
        offered: u64,
        extra_macs: &[[u8; 6]],
    ) -> Result<Ingress, (TxDrop, String)> {
        if self.standby {
            return Err((
                TxDrop::Standby,
                "a frame on a standby session, which carries none until activated".into(),
            ));
        }
        let h = vnet::check_head(head, len).map_err(|e| (TxDrop::BadOffload, e.to_string()))?;
        let src = vnet::src_mac(head);
        if src != self.mac && !extra_macs.contains(&src) && !self.bridged.contains(&src) {
            return Err((
                TxDrop::Spoofed,
                format!("source MAC {} is not the host's", wire::fmt_mac(&src)),
            ));
        }
        let negotiated = if self.features == 0 {
            offered
        } else {
            self.features
        };
        let used = vnet::features_used(&h);
        if used & !negotiated != 0 {
            return Err((
                TxDrop::NotNegotiated,
                format!("offloads {used:#x} beyond the negotiated {negotiated:#x}"),
            ));
        }
        // A GSO frame's segments carry its headers each: they are what the MTU bounds.
        let len = if h.is_gso() {
            vnet::gso_segment_l3_len(head, &h)
        } else {
            vnet::l3_len_of(head, len)
        };
        if len > self.mtu as usize {
            return Err((
                TxDrop::OverMtu,
                format!("{len} bytes beyond the MTU of {}", self.mtu),
            ));
        }
        self.policy
            .vlan
            .ingress(head)
            .map_err(|e| (TxDrop::Vlan, e))
    }

    /// Reads the host's own queue into its pools ([`OwnQueue::read`]); `None` without one
    /// (or without a link). Where the host agreed to the express lane, a sparse flow's frame
    /// takes it, as in [`HostQueue::post`]: the same rule decides, by flow, over frames of
    /// both paths.
    pub fn read_own_queue(&mut self) -> Option<Read> {
        let (Some(link), Some(q)) = (self.link.as_mut(), self.own_queue.as_mut()) else {
            return None;
        };
        let on = self.features & features::EXPRESS != 0;
        let open = link.express_pending() < EXPRESS_BACKLOG;
        let ring = &mut self.rx_ring;
        let lane = |w: &SharedBytes<'_>, n: usize| {
            let mut head = [0u8; HEAD];
            let head = &mut head[..n.min(HEAD)];
            on && w.copy_out(0, head).is_ok() && {
                let flow = ring.flow(head);
                ring.express(flow, n as u32, Instant::now(), open)
            }
        };
        Some(q.read(link, lane))
    }

    /// Queues a frame for this host in its receive ring, by flow, and sends what the credits
    /// let through. A frame beyond its quota, or pushed out of a full ring, is dropped and
    /// counted.
    /// A frame small enough moves to a small buffer first ([`SendBufCache::shrink`]), its
    /// full-size one going back to be read into again.
    pub fn post(&mut self, buf: SendBuf, cache: &mut SendBufCache) {
        let mut buf = cache.shrink(buf);
        if !self.make_room(buf.capacity(), cache) {
            cache.put(buf);
            return;
        }
        let flow = self.rx_ring.flow(buf.as_slice());
        // With the express lane agreed, a sparse flow's frame goes past the ring as SendData
        // on the control channel, while that channel has no backlog.
        if let Some(link) = self
            .link
            .as_mut()
            .filter(|_| self.features & features::EXPRESS != 0)
        {
            let open = link.express_pending() < EXPRESS_BACKLOG;
            let len = buf.len();
            if self.rx_ring.express(flow, len as u32, Instant::now(), open) {
                link.post_express(buf);
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += len as u64;
                return;
            }
        }
        // More than half its share of send buffers held (frames waiting for credit or on
        // its link): a standing backlog towards the host, which sheds frames once the share
        // is full. An ECN-capable frame is marked Congestion Experienced instead (RFC 3168),
        // so that its sender slows down before frames must be dropped.
        if self.held() * 2 > self.quota && ecn::mark_ce(buf.as_mut_slice()) == Mark::Marked {
            self.ce_marked += 1;
        }
        let len = buf.len() as u32;
        let mut dropped = 0;
        let mut freed = 0;
        self.ring_held += buf.capacity();
        self.rx_ring.push(flow, len, buf, &mut |b| {
            freed += b.capacity();
            cache.put(b);
            dropped += 1;
        });
        self.ring_held -= freed;
        for _ in 0..dropped {
            self.drop_rx(RxDrop::RingFull);
        }
        self.send_queued(cache);
    }

    /// Makes room within its quota for one more send buffer of `size` bytes: takes back
    /// written buffers, else the longest flow waiting gives up its oldest frames, so that a
    /// new sparse flow still gets in (each counted as `rx_quota`). False when what waits in
    /// its ring could not give way enough (the rest is on its link, out of reach): the frame
    /// must go (counted too), and nothing waiting is given up for it.
    pub fn make_room(&mut self, size: usize, cache: &mut SendBufCache) -> bool {
        if self.has_room(size) {
            return true;
        }
        self.kick(cache);
        if self.held() - self.ring_held + size > self.quota {
            self.drop_rx(RxDrop::Quota);
            return false;
        }
        // A large frame may take the place of several small ones.
        while !self.has_room(size) {
            self.drop_rx(RxDrop::Quota);
            let Some(old) = self.rx_ring.evict() else {
                return false;
            };
            self.ring_held -= old.capacity();
            cache.put(old);
        }
        true
    }

    /// Posts waiting frames, the one that met no credit first, while the credits allow (call
    /// when credits come back).
    pub fn send_queued(&mut self, cache: &mut SendBufCache) {
        // One clock read per turn, not per frame (see host-driver's `Outbound::send_queued`).
        let now = Instant::now();
        loop {
            let Some(link) = self.link.as_mut() else {
                return;
            };
            let Some(buf) = self
                .rx_ring
                .next(link.session().initiator().inflight_bytes(), now)
            else {
                return;
            };
            self.ring_held -= buf.capacity();
            let len = buf.len() as u64;
            match link.post_frame(buf) {
                Posted::SendData | Posted::Rdma => {
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += len;
                }
                Posted::Backpressure(b) => {
                    self.ring_held += b.capacity();
                    self.rx_ring.hold(b);
                    return;
                }
                Posted::TooLarge(b) => {
                    cache.put(b);
                    self.drop_rx(RxDrop::TooLarge);
                }
            }
        }
    }

    /// Every buffer waiting in the ring, for teardown: counted as dropped
    /// (`rx_lost_at_close`).
    pub fn take_waiting(&mut self) -> Vec<SendBuf> {
        let waiting: Vec<SendBuf> = self.rx_ring.drain().collect();
        self.ring_held = 0;
        self.drop_rx_n(RxDrop::LostAtClose, waiting.len() as u64);
        waiting
    }

    /// Bytes waiting to be written to this host.
    pub fn pending(&self) -> usize {
        self.link.as_ref().map_or(0, |l| l.pending())
    }

    /// Pushes queued output from another path than the host's own task, and takes written
    /// buffers back. A socket that is full (or failed) is left to the host's task, woken
    /// once for it: nobody retries a full socket until it is writable again.
    pub fn kick(&mut self, cache: &mut SendBufCache) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        if !self.blocked && link.pending() > 0 && !matches!(link.flush(), Ok(true)) {
            self.blocked = true;
            self.wake.notify_one();
        }
        link.reclaim(cache);
    }

    /// The host's own task writes what is queued: `Ok(true)` when everything went out
    /// (the socket is no longer full), `Ok(false)` when it must wait for writability.
    pub fn flush(&mut self, cache: &mut SendBufCache) -> Result<bool, LinkError> {
        let Some(link) = self.link.as_mut() else {
            return Ok(true);
        };
        let done = link.flush();
        link.reclaim(cache);
        let done = done?;
        self.blocked = !done;
        Ok(done)
    }
}
