//! Frame forwarding: LAN to hosts by destination MAC, hosts to the LAN, host to host.
//!
//! Group frames (broadcast, multicast) go to every host and to the LAN. A unicast frame
//! goes to the host owning its destination MAC, else to the LAN (from a host) or to the
//! promiscuous hosts (from the LAN). A host of another worker gets its copy through that
//! worker's inbox ([`crate::shard`]). A host with several queues gets each frame on the queue
//! its flow hashes to ([`Host::steer`]), so one flow stays in order on one queue. A host that
//! has no credit left gets the frame queued in its receive ring, by flow ([`Host::post`]);
//! beyond the ring it loses frames, as a NIC ring overflow would, and the loss is counted in
//! its statistics.

use crate::host::{Host, RxDrop};
use crate::host_frame::{HostFrame, HEAD};
use crate::ioc::{Ioc, IocStats};
use crate::lan_tx::LanTx;
use crate::nic::Nic;
use crate::shard::{Crossing, Shard};
use splitnet_messaging::endpoint::Lane;
use splitnet_messaging::memory::{SendBuf, SendBufCache};
use splitnet_messaging::vnet;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::time::Instant;
use tracing::warn;

/// Completions handled per channel per wake-up.
pub const RX_BUDGET: usize = 256;
/// Frames read from the NIC per wake-up, with one `recvmmsg(2)`.
const LAN_BATCH: usize = splitnet_netif::packet::RECV_BATCH;

/// Copies `frame` into a send buffer and posts it to `host`, within its quota.
fn deliver_copy(host: &mut Host, frame: HostFrame<'_>, cache: &mut SendBufCache) {
    if !host.make_room(cache) {
        return;
    }
    let Some(mut b) = cache.get() else {
        host.drop_rx(RxDrop::Quota);
        return;
    };
    if frame.copy_to(b.space()) {
        b.set_len(frame.len());
        host.post(b, cache);
    } else {
        cache.put(b);
        host.drop_rx(RxDrop::TooLarge);
    }
}

/// The sessions that get a copy of `frame`: for each host (first queue) that `want`s it,
/// the queue its flow hashes to.
fn targets(
    hosts: &BTreeMap<u64, Host>,
    frame: &[u8],
    keys: &RandomState,
    want: impl Fn(&Host) -> bool,
) -> Vec<u64> {
    hosts
        .values()
        .filter(|h| h.queue.is_first() && want(h))
        .map(|h| h.steer(frame, keys))
        .collect()
}

/// Copies `frame` to every session in `to`.
fn deliver_all(
    to: &[u64],
    hosts: &mut BTreeMap<u64, Host>,
    frame: HostFrame<'_>,
    cache: &mut SendBufCache,
) {
    for s in to {
        if let Some(h) = hosts.get_mut(s) {
            deliver_copy(h, frame, cache);
        }
    }
}

/// What the IOC holds every host's frames to (see [`Host::check_tx`]), and where it sends
/// them.
#[derive(Debug, Clone, Copy)]
pub struct TxPolicy<'a> {
    /// Offloads offered to hosts.
    pub offered: u64,
    /// Source MACs any host may use besides its own.
    pub extra_macs: &'a [[u8; 6]],
    /// Each host's MAC, to its first queue's session ([`Ioc::by_mac`]).
    pub by_mac: &'a HashMap<[u8; 6], u64>,
    /// The other workers and their hosts.
    pub shard: &'a Shard,
}

/// Hands `frame` to each worker of `to`, counting what crossed and what a full inbox
/// dropped; returns how many workers it was for.
fn cross(
    shard: &Shard,
    to: impl IntoIterator<Item = usize>,
    frame: HostFrame<'_>,
    stats: &mut IocStats,
) -> usize {
    let mut n = 0;
    let mut copy = None;
    for w in to {
        n += 1;
        let bytes = match frame {
            HostFrame::Private(b) => b,
            HostFrame::Shared { .. } => copy.get_or_insert_with(|| frame.to_vec()),
        };
        if shard.cross(w, bytes) {
            stats.crossed_out += 1;
        } else {
            stats.cross_dropped += 1;
        }
    }
    n
}

/// Forwards one frame a host's session (`from`) wrote into the IOC's pool, if it passes
/// [`Host::check_tx`]; a frame that does not is dropped and counted against the host.
/// Frames for the LAN go through `lan` (sent in batches: see [`LanTx`]), which counts them
/// for the host when the NIC has taken them.
#[allow(clippy::too_many_arguments)]
pub fn from_host(
    from: u64,
    frame: HostFrame<'_>,
    hosts: &mut BTreeMap<u64, Host>,
    nic: &dyn Nic,
    lan: &mut LanTx,
    cache: &mut SendBufCache,
    stats: &mut IocStats,
    keys: &RandomState,
    policy: &TxPolicy<'_>,
) {
    let Some(h) = hosts.get_mut(&from) else {
        return;
    };
    let head = frame.head();
    if let Err((why, text)) = h.check_tx(head, frame.len(), policy.offered, policy.extra_macs) {
        h.drop_tx(why);
        if let Some(held) = h.log.allow(std::time::Instant::now()) {
            warn!(
                session = from,
                "dropping a frame from the host: {text} ({held} more dropped since the last report)"
            );
        }
        return;
    }
    let dst = vnet::dst_mac(head);
    let sender = hosts.get(&from).map_or(from, |h| h.first);
    if vnet::is_group(&dst) {
        let to = targets(hosts, head, keys, |h| h.session != sender);
        deliver_all(&to, hosts, frame, cache);
        cross(policy.shard, policy.shard.others(), frame, stats);
        lan.send(from, frame, nic, hosts, stats);
        return;
    }
    let owner = policy
        .by_mac
        .get(&dst)
        .filter(|&&s| s != sender)
        .and_then(|s| hosts.get(s))
        .map(|h| h.steer(head, keys));
    let elsewhere = policy.shard.owner(&dst);
    match owner.and_then(|s| hosts.get_mut(&s)) {
        Some(to) => deliver_copy(to, frame, cache),
        None => match elsewhere {
            Some(w) => {
                cross(policy.shard, [w], frame, stats);
            }
            None => return lan.send(from, frame, nic, hosts, stats),
        },
    }
    if let Some(h) = hosts.get_mut(&from) {
        h.stats.tx_frames += 1;
        h.stats.tx_bytes += frame.len() as u64;
    }
}

impl Ioc {
    /// Reads frames from the NIC and delivers them.
    pub fn drive_lan(&mut self) -> LanProgress {
        let Ioc {
            nic,
            cache,
            hosts,
            by_mac,
            stats,
            flow_keys,
            shard,
            log,
            ..
        } = self;
        let mut batch: Vec<SendBuf> = std::iter::from_fn(|| cache.get()).take(LAN_BATCH).collect();
        if batch.is_empty() {
            return LanProgress::NoBuffers;
        }
        let mut lens = [0usize; LAN_BATCH];
        // Only `WouldBlock` says the socket is empty: a short batch may hide an error
        // (`recvmmsg` returns the frames before it, and the error at the next call).
        let (got, drained) = {
            let mut spaces: Vec<&mut [u8]> = batch.iter_mut().map(|b| b.space()).collect();
            match nic.recv_batch(&mut spaces, &mut lens) {
                Ok(n) => (n, false),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => (0, true),
                // The NIC went down (reported once): no frame was lost.
                Err(e) if e.kind() == io::ErrorKind::NetworkDown => (0, false),
                // The kernel dropped a frame it could not hand over (an offload a
                // virtio-net header cannot describe): counted; frames may wait behind it.
                Err(e) => {
                    stats.lan_rx += 1;
                    stats.lan_rx_unreadable += 1;
                    if let Some(held) = log.allow(Instant::now()) {
                        warn!("a NIC frame could not be read: {e} ({held} more since the last report)");
                    }
                    (0, false)
                }
            }
        };
        for (i, mut buf) in batch.into_iter().enumerate() {
            if i >= got {
                cache.put(buf);
                continue;
            }
            buf.set_len(lens[i]);
            stats.lan_rx += 1;
            if vnet::check_frame(buf.as_slice()).is_err() {
                cache.put(buf);
                continue;
            }
            let frame = buf.as_slice();
            let dst = vnet::dst_mac(frame);
            let owner = (!vnet::is_group(&dst))
                .then(|| by_mac.get(&dst))
                .flatten()
                .and_then(|s| hosts.get(s))
                .map(|h| h.steer(frame, flow_keys));
            if let Some(h) = owner.and_then(|s| hosts.get_mut(&s)) {
                h.post(buf, cache);
                continue;
            }
            let group = vnet::is_group(&dst);
            // A unicast frame for another worker's host goes there alone.
            if let Some(w) = (!group).then(|| shard.owner(&dst)).flatten() {
                cross(shard, [w], HostFrame::Private(frame), stats);
                cache.put(buf);
                continue;
            }
            // Group frames go to every host, frames for no host to the promiscuous ones: here,
            // and on the other workers that have such hosts.
            let to = if group {
                targets(hosts, frame, flow_keys, |_| true)
            } else {
                targets(hosts, frame, flow_keys, |h| h.promisc)
            };
            let private = HostFrame::Private(frame);
            let crossed = if group {
                cross(shard, shard.others(), private, stats)
            } else {
                cross(
                    shard,
                    shard.promisc_others().iter().copied(),
                    private,
                    stats,
                )
            };
            if to.is_empty() && crossed == 0 && !group {
                stats.lan_filtered += 1;
            }
            deliver_all(&to, hosts, private, cache);
            cache.put(buf);
        }
        self.kick_hosts();
        if drained {
            LanProgress::Drained
        } else if !self.cache.has_free() {
            // Every buffer is queued towards a host: wait until one is written.
            LanProgress::NoBuffers
        } else {
            LanProgress::Budget
        }
    }

    /// Adds the frames the NIC's receive ring dropped since the last call to the counters
    /// (the kernel keeps them until they are read).
    pub fn count_nic_drops(&mut self) {
        self.stats.lan_rx_dropped += self.nic.take_drops();
        self.count_placed_drops();
    }

    /// Delivers frames another worker handed over (from the LAN or from its hosts) to this
    /// worker's hosts: never to the LAN, which has had them.
    pub fn deliver_crossed(&mut self, frames: &[Crossing]) {
        let Ioc {
            cache,
            hosts,
            by_mac,
            stats,
            flow_keys,
            ..
        } = self;
        for frame in frames {
            stats.crossed_in += 1;
            let dst = vnet::dst_mac(frame);
            let to = if vnet::is_group(&dst) {
                targets(hosts, frame, flow_keys, |_| true)
            } else {
                match by_mac.get(&dst).and_then(|s| hosts.get(s)) {
                    Some(h) => vec![h.steer(frame, flow_keys)],
                    None => targets(hosts, frame, flow_keys, |h| h.promisc),
                }
            };
            deliver_all(&to, hosts, HostFrame::Private(frame), cache);
        }
        self.kick_hosts();
    }

    /// Drives one lane of a host's link: its frames are forwarded, its messages handled.
    /// Returns whether the lane is drained, or the error that ends the host's session.
    pub fn drive_host(&mut self, session: u64, lane: Lane) -> Result<bool, HostEnd> {
        let offered = self.offered();
        let Ioc {
            reg,
            nic,
            lan_tx,
            cache,
            hosts,
            by_mac,
            stats,
            flow_keys,
            extra_macs,
            shard,
            ..
        } = self;
        let policy = TxPolicy {
            offered,
            extra_macs,
            by_mac,
            shard,
        };
        let Some(mut link) = hosts.get_mut(&session).and_then(|h| h.link.take()) else {
            return Err(HostEnd::Gone);
        };
        let mut events = Vec::new();
        let mut head = [0u8; HEAD];
        let r = link.poll(
            reg,
            lane,
            RX_BUDGET,
            &mut |frame| {
                // A frame in a shared pool is checked from a private copy of its head
                // (see [`HostFrame`]).
                let frame = HostFrame::new(frame, &mut head);
                from_host(
                    session, frame, hosts, &**nic, lan_tx, cache, stats, flow_keys, &policy,
                )
            },
            &mut events,
        );
        lan_tx.flush(&**nic, hosts, stats);
        link.session_mut().flush_credits(reg);
        if let Some(h) = hosts.get_mut(&session) {
            h.link = Some(link);
        }
        self.kick_hosts();
        // Events first: a Goodbye read just before the end of stream explains it.
        let ev = self.on_events(session, events);
        match (r, ev) {
            (_, Err(why)) => Err(HostEnd::Closed(why)),
            (Err(e), Ok(())) => Err(HostEnd::Failed(e)),
            (Ok(more), Ok(())) => Ok(!more),
        }
    }
}

/// How far [`Ioc::drive_lan`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LanProgress {
    /// The NIC has nothing more.
    Drained,
    /// The batch budget ran out; more may be waiting.
    Budget,
    /// Every send buffer is in flight; wait until some come back.
    NoBuffers,
}

/// Why a host's session ends.
#[derive(Debug)]
pub enum HostEnd {
    /// Already removed.
    Gone,
    /// It said goodbye or was refused at the session level.
    Closed(String),
    /// Its link failed (transport, protocol or protection error).
    Failed(splitnet_messaging::endpoint::LinkError),
    /// It exceeded what the IOC lets one host hold (it does not read its channels).
    Limit(String),
}
