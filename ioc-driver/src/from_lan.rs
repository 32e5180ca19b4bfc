//! Frames from the LAN: read from this worker's socket on the NIC in batches and delivered
//! by destination MAC, frames other workers hand over, and each host's own queue read
//! straight into its pools ([`crate::own_queue`]).
//!
//! A unicast frame goes to the host owning its destination MAC (through that host's worker
//! when it is another's); group frames (broadcast, multicast) to every host; frames for no
//! host to the promiscuous hosts: each only to hosts on the frame's VLAN, an access host's
//! without its tag ([`crate::vlan`]).

use crate::counters::RxDrop;
use crate::deliver::{cross, deliver_all, strip, targets};
use crate::host_frame::HostFrame;
use crate::own_queue::OwnQueueProgress;
use crate::shard::Crossing;
use crate::state::WorkerState;
use crate::vlan::Egress;
use splitnet_messaging::memory::SendBuf;
use splitnet_messaging::vnet;
use std::io;
use std::time::Instant;
use tracing::warn;

/// Frames read from the NIC per wake-up, with one `recvmmsg(2)`.
const LAN_BATCH: usize = splitnet_netif::packet::RECV_BATCH;

/// Reads a batch of frames from the NIC's receive queue `queue` and delivers them.
pub fn drive_lan(st: &mut WorkerState, queue: usize) -> LanProgress {
    let WorkerState {
        nic,
        cache,
        hosts,
        by_mac,
        stats,
        flow_keys,
        shard,
        log,
        nic_mac,
        ..
    } = &mut *st;
    let mut batch: Vec<SendBuf> = std::iter::from_fn(|| cache.get()).take(LAN_BATCH).collect();
    if batch.is_empty() {
        return LanProgress::NoBuffers;
    }
    let mut lens = [0usize; LAN_BATCH];
    // Only `WouldBlock` says the socket is empty: a short batch may hide an error
    // (`recvmmsg` returns the frames before it, and the error at the next call).
    let (got, drained) = {
        let mut spaces: Vec<&mut [u8]> = batch.iter_mut().map(|b| b.space()).collect();
        match nic.recv_batch(queue, &mut spaces, &mut lens) {
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
        stats.lan_rx += 1;
        if lens[i] > buf.space().len() {
            // Cut by the read: never forwarded as if whole.
            stats.lan_rx_truncated += 1;
            cache.put(buf);
            continue;
        }
        buf.set_len(lens[i]);
        if vnet::check_frame(buf.as_slice()).is_err() {
            stats.lan_rx_bad_frame += 1;
            cache.put(buf);
            continue;
        }
        let frame = buf.as_slice();
        let dst = vnet::dst_mac(frame);
        let vlan = vnet::vlan_of(frame);
        let group = vnet::is_group(&dst);
        let owner = (!group)
            .then(|| by_mac.get(&dst))
            .flatten()
            .and_then(|s| hosts.get(s))
            .map(|h| (h.steer(frame, flow_keys), h.policy.vlan.egress(vlan)));
        // Its host, when the host is on the frame's VLAN (else the frame is for no host on
        // that VLAN).
        if let Some((s, Some(egress))) = owner {
            let Some(h) = hosts.get_mut(&s) else {
                cache.put(buf);
                continue;
            };
            if egress == Egress::Strip && !strip(&mut buf) {
                stats.lan_rx_bad_frame += 1;
                cache.put(buf);
                continue;
            }
            h.post(buf, cache);
            continue;
        }
        let frame = buf.as_slice();
        // A unicast frame for another worker's host goes there alone.
        if let Some(w) = (!group && owner.is_none())
            .then(|| shard.owner(&dst))
            .flatten()
        {
            cross(shard, [w], HostFrame::Private(frame), stats);
            cache.put(buf);
            continue;
        }
        // A frame for the IOC machine's own address is its kernel's, never a host's.
        if !group && Some(dst) == *nic_mac {
            stats.lan_filtered += 1;
            cache.put(buf);
            continue;
        }
        // Broadcast frames go to every host, multicast frames to the hosts that joined the
        // group (or take them all), frames for no host to the promiscuous ones: here, and on
        // the other workers that have such hosts.
        let to = if group {
            targets(hosts, frame, flow_keys, |h| h.wants_group(&dst))
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
        deliver_all(&to, hosts, private, vlan, cache);
        cache.put(buf);
    }
    st.kick_hosts();
    if drained {
        LanProgress::Drained
    } else if !st.cache.has_free() {
        // Every buffer is queued towards a host: wait until one is written.
        LanProgress::NoBuffers
    } else {
        LanProgress::Budget
    }
}

/// Adds the frames the NIC's receive ring dropped since the last call to the counters
/// (the kernel keeps them until they are read).
pub fn count_nic_drops(st: &mut WorkerState) {
    st.stats.lan_rx_dropped += st.nic.take_drops();
    st.stats.lan_rx_ring += st.nic.take_ring_frames();
    st.count_own_queue_drops();
}

/// Delivers frames another worker handed over (from the LAN or from its hosts) to this
/// worker's hosts: never to the LAN, which has had them.
pub fn deliver_crossed(st: &mut WorkerState, frames: &[Crossing]) {
    let WorkerState {
        cache,
        hosts,
        by_mac,
        stats,
        flow_keys,
        ..
    } = &mut *st;
    for frame in frames {
        stats.crossed_in += 1;
        let dst = vnet::dst_mac(frame);
        let vlan = vnet::vlan_of(frame);
        let to = if vnet::is_group(&dst) {
            targets(hosts, frame, flow_keys, |h| h.wants_group(&dst))
        } else {
            let owner = by_mac.get(&dst).and_then(|s| hosts.get(s));
            match owner.filter(|h| h.policy.vlan.egress(vlan).is_some()) {
                Some(h) => vec![h.steer(frame, flow_keys)],
                None => targets(hosts, frame, flow_keys, |h| h.promisc),
            }
        };
        // Its host left while it crossed (and no host here is promiscuous): a frame for no
        // host now, counted as the worker that read it counts those.
        if to.is_empty() && !vnet::is_group(&dst) {
            stats.lan_filtered += 1;
        }
        deliver_all(&to, hosts, HostFrame::Private(frame), vlan, cache);
    }
    st.kick_hosts();
}

/// Reads frames from host `session`'s own queue into its pools, while elements are free.
pub fn read_own_queue(st: &mut WorkerState, session: u64) -> OwnQueueProgress {
    let WorkerState { hosts, stats, .. } = &mut *st;
    let Some(h) = hosts.get_mut(&session) else {
        return OwnQueueProgress::Drained;
    };
    let Some(r) = h.read_own_queue() else {
        return OwnQueueProgress::Drained;
    };
    stats.lan_rx += r.read + r.unreadable;
    stats.lan_rx_unreadable += r.unreadable;
    stats.lan_rx_bad_frame += r.bad_frame;
    stats.lan_rx_dropped += r.overflowed;
    h.stats.rx_frames += r.frames;
    h.stats.rx_bytes += r.bytes;
    h.drop_rx_n(RxDrop::TooLarge, r.too_large);
    h.drop_rx_n(RxDrop::Unreadable, r.unreadable);
    h.drop_rx_n(RxDrop::RingFull, r.overflowed);
    if let Some(e) = r.error {
        if let Some(held) = h.log.allow(Instant::now()) {
            warn!(
                session,
                "a LAN frame for the host could not be read: {e} ({held} more since the last report)"
            );
        }
    }
    if r.stuck {
        st.close_own_queue(session);
        return OwnQueueProgress::Drained;
    }
    r.progress
}

/// How far [`drive_lan`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LanProgress {
    /// The NIC has nothing more.
    Drained,
    /// The batch budget ran out; more may be waiting.
    Budget,
    /// Every send buffer is in flight; wait until some come back.
    NoBuffers,
}
