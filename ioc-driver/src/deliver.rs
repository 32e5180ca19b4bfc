//! Delivering a frame to hosts: a copy into a send buffer for each host queue it is for,
//! within each one's quota, and a copy for each other worker that has hosts for it.
//!
//! A host with several queues gets each frame on the queue its flow hashes to
//! ([`HostQueue::steer`]), so one flow stays in order on one queue. A host that has no
//! credit left gets the frame queued in its receive ring, by flow ([`HostQueue::post`]);
//! beyond the ring it loses frames, as a NIC ring overflow would, and the loss is counted in
//! its statistics.

use crate::counters::{IocStats, RxDrop};
use crate::host_frame::HostFrame;
use crate::host_queue::HostQueue;
use crate::shard::Shard;
use splitnet_messaging::memory::SendBufCache;
use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;

/// Copies `frame` into a send buffer and posts it to `host`, within its quota.
pub fn deliver_copy(host: &mut HostQueue, frame: HostFrame<'_>, cache: &mut SendBufCache) {
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
pub fn targets(
    hosts: &BTreeMap<u64, HostQueue>,
    frame: &[u8],
    keys: &RandomState,
    want: impl Fn(&HostQueue) -> bool,
) -> Vec<u64> {
    hosts
        .values()
        .filter(|h| h.queue.is_first() && want(h))
        .map(|h| h.steer(frame, keys))
        .collect()
}

/// Copies `frame` to every session in `to`.
pub fn deliver_all(
    to: &[u64],
    hosts: &mut BTreeMap<u64, HostQueue>,
    frame: HostFrame<'_>,
    cache: &mut SendBufCache,
) {
    for s in to {
        if let Some(h) = hosts.get_mut(s) {
            deliver_copy(h, frame, cache);
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
