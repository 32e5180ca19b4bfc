//! Delivering a frame to hosts: a copy into a send buffer for each host queue it is for,
//! within each one's quota, and a copy for each other worker that has hosts for it.
//!
//! A host with several queues gets each frame on the queue its flow hashes to
//! ([`HostQueue::steer`]), so one flow stays in order on one queue. A host that has no
//! credit left gets the frame queued in its receive ring, by flow ([`HostQueue::post`]);
//! beyond the ring it loses frames, as a NIC ring overflow would, and the loss is counted in
//! its statistics. A frame reaches only the hosts on its VLAN ([`crate::vlan`]), an access
//! host's without its tag.

use crate::counters::{IocStats, RxDrop};
use crate::host_frame::HostFrame;
use crate::host_queue::HostQueue;
use crate::shard::Shard;
use crate::vlan::Egress;
use splitnet_messaging::memory::{SendBuf, SendBufCache};
use splitnet_messaging::vnet;
use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;

/// Copies `frame`, on VLAN `vlan` (`None`: untagged), into a send buffer and posts it to
/// `host`, within its quota, as the host's VLAN policy has it (an access host's without its
/// tag); nothing when the host is not on that VLAN.
pub fn deliver_copy(
    host: &mut HostQueue,
    frame: HostFrame<'_>,
    vlan: Option<u16>,
    cache: &mut SendBufCache,
) {
    let Some(egress) = host.policy.vlan.egress(vlan) else {
        return;
    };
    let len = frame.len();
    if !host.make_room(cache.size_for(len), cache) {
        return;
    }
    let Some(mut b) = cache.get_for(len) else {
        host.drop_rx(RxDrop::Quota);
        return;
    };
    if !frame.copy_to(b.space()) {
        cache.put(b);
        host.drop_rx(RxDrop::TooLarge);
        return;
    }
    b.set_len(frame.len());
    if egress == Egress::Strip && !strip(&mut b) {
        cache.put(b);
        host.drop_rx(RxDrop::Unreadable);
        return;
    }
    host.post(b, cache);
}

/// Takes the outer VLAN tag out of the frame in `b` (for an access host, which takes
/// untagged frames only); false when that leaves no frame (its offsets point into the tag)
/// or a frame still tagged (QinQ, or a priority tag in front of the VLAN's): dropped.
pub fn strip(b: &mut SendBuf) -> bool {
    let n = b.len();
    match vnet::strip_vlan(b.space(), n) {
        Some(m) => {
            b.set_len(m);
            vnet::outer_tag(b.as_slice()).is_none()
        }
        None => false,
    }
}

/// The sessions that get a copy of `frame`: for each host (first queue) on the frame's
/// VLAN that `want`s it, the queue its flow hashes to.
pub fn targets(
    hosts: &BTreeMap<u64, HostQueue>,
    frame: &[u8],
    keys: &RandomState,
    want: impl Fn(&HostQueue) -> bool,
) -> Vec<u64> {
    let vlan = vnet::vlan_of(frame);
    hosts
        .values()
        .filter(|h| h.queue.is_first() && !h.standby)
        .filter(|h| h.policy.vlan.egress(vlan).is_some() && want(h))
        .map(|h| h.steer(frame, keys))
        .collect()
}

/// Copies `frame`, on VLAN `vlan`, to every session in `to` ([`deliver_copy`]).
pub fn deliver_all(
    to: &[u64],
    hosts: &mut BTreeMap<u64, HostQueue>,
    frame: HostFrame<'_>,
    vlan: Option<u16>,
    cache: &mut SendBufCache,
) {
    for s in to {
        if let Some(h) = hosts.get_mut(s) {
            deliver_copy(h, frame, vlan, cache);
        }
    }
}

/// Hands `frame` to each worker of `to`, counting what crossed and what a full inbox
/// dropped; returns how many workers it was for.
pub fn cross(
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
