//! One sender's transmit scheduling: frames wait in a [`FlowQueue`] and leave while the
//! [`ByteLimit`] (if any) admits more in flight; a frame that met no credit goes first next
//! time. With an [`Express`] lane, the frames of sparse flows go past both.

use super::express::{Express, ExpressConfig, ExpressStats};
use super::fq::{FlowQueue, FqConfig};
use super::limit::{ByteLimit, LimitConfig, LimitStats};
use crate::vnet;
use std::collections::hash_map::RandomState;
use std::time::Instant;

/// The frames one sender has waiting for its peer, and how many bytes it may have in flight.
#[derive(Debug)]
pub struct Scheduler<T> {
    queue: FlowQueue<T>,
    /// None: frames wait only for credit.
    limit: Option<ByteLimit>,
    /// The frame that met no credit (and its bucket): first to go when credits return.
    held: Option<T>,
    held_bucket: Option<usize>,
    /// The bucket of the frame [`Scheduler::next`] gave last.
    last_bucket: Option<usize>,
    /// Which flows go past the queue (none: every frame waits its turn).
    express: Option<Express>,
    /// Keys of the flow hash (random, so that traffic cannot choose its bucket).
    keys: RandomState,
}

impl<T> Scheduler<T> {
    /// Nothing waiting; the limit (none: frames wait only for credit) starts at
    /// `limit.start`, its first period at `now`.
    pub fn new(queue: FqConfig, limit: Option<LimitConfig>, now: Instant) -> Scheduler<T> {
        Scheduler {
            queue: FlowQueue::new(queue),
            limit: limit.map(|l| ByteLimit::new(l, now)),
            held: None,
            held_bucket: None,
            last_bucket: None,
            express: None,
            keys: RandomState::new(),
        }
    }

    /// Adds an express lane ([`Express`]; its buckets are the flow queue's).
    pub fn with_express(mut self, config: ExpressConfig, now: Instant) -> Scheduler<T> {
        let config = ExpressConfig {
            buckets: self.queue.buckets(),
            ..config
        };
        self.express = Some(Express::new(config, now));
        self
    }

    /// Whether the next frame of `flow`, `len` bytes, goes past the queue in the express
    /// lane at `now` (see [`Express::classify`]; `open`: the lane takes a frame now). False
    /// without a lane. A frame that does not is for [`Scheduler::push`].
    pub fn express(&mut self, flow: u64, len: u32, now: Instant, open: bool) -> bool {
        let bucket = self.queue.bucket(flow);
        let waiting = self.queue.waits_in(bucket) || self.held_bucket == Some(bucket);
        match &mut self.express {
            Some(x) => x.classify(flow, len, now, open, waiting),
            None => false,
        }
    }

    /// The express lane's counters (none without one).
    pub fn express_stats(&self) -> Option<ExpressStats> {
        self.express.as_ref().map(Express::stats)
    }

    /// The flow of a frame (its virtio-net header and Ethernet frame), for [`Scheduler::push`].
    pub fn flow(&self, frame: &[u8]) -> u64 {
        vnet::flow_hash(frame, &self.keys)
    }

    /// Queues `frame` of `len` bytes in `flow`. What the flow queue drops to make room goes
    /// to `dropped`.
    pub fn push(&mut self, flow: u64, len: u32, frame: T, dropped: &mut impl FnMut(T)) {
        self.queue.push(flow, len, frame, dropped);
    }

    /// As [`Scheduler::push`], marking the frame Congestion Experienced with `mark` when
    /// its flow is past the queue's mark threshold (see [`FlowQueue::push_marking`]).
    pub fn push_marking(
        &mut self,
        flow: u64,
        len: u32,
        frame: T,
        mark: impl FnOnce(&mut T) -> bool,
        dropped: &mut impl FnMut(T),
    ) {
        self.queue.push_marking(flow, len, frame, mark, dropped);
    }

    /// Frames marked Congestion Experienced so far.
    pub fn marked(&self) -> u64 {
        self.queue.marked()
    }

    /// The next frame to post with `inflight` bytes outstanding: the held one first, then
    /// the flow queue's choice. `None` when nothing waits, or when the limit holds the sender
    /// back (counted only when something waits).
    /// `now` is when it leaves, for the express lane's count of the flow's silence.
    pub fn next(&mut self, inflight: u64, now: Instant) -> Option<T> {
        if self.held.is_none() && self.queue.is_empty() {
            return None;
        }
        if let Some(limit) = &mut self.limit {
            if !limit.admits(inflight) {
                return None;
            }
        }
        let (bucket, frame) = match self.held.take() {
            Some(f) => (self.held_bucket.take(), f),
            None => {
                let (b, f) = self.queue.pop_with_bucket()?;
                (Some(b), f)
            }
        };
        self.last_bucket = bucket;
        if let (Some(x), Some(b)) = (&mut self.express, bucket) {
            x.left(b as u64, now);
        }
        Some(frame)
    }

    /// Whether a new frame may go at once, past the queue, with `inflight` bytes
    /// outstanding: nothing waits and the limit lets one more go. Counts nothing: no frame
    /// waits yet (one that then does is counted by [`Scheduler::next`]).
    pub fn may_bypass(&self, inflight: u64) -> bool {
        self.held.is_none()
            && self.queue.is_empty()
            && self.limit.as_ref().is_none_or(|l| l.would_admit(inflight))
    }

    /// Whether a frame of up to `len` bytes would be queued without dropping another (see
    /// [`FlowQueue::has_room`]).
    pub fn has_room(&self, len: u32) -> bool {
        self.queue.has_room(len)
    }

    /// Puts back a frame [`Scheduler::next`] gave that met no credit: it goes first next
    /// time.
    pub fn hold(&mut self, frame: T) {
        self.held = Some(frame);
        self.held_bucket = self.last_bucket;
    }

    /// Credits came back at `now`: `completed` bytes completed, `inflight` remain.
    pub fn completed(&mut self, completed: u64, inflight: u64, now: Instant) {
        if let Some(limit) = &mut self.limit {
            limit.completed(completed, inflight, now);
        }
    }

    /// Takes the longest flow's oldest frame out (to make room), or `None` when only the
    /// held frame, or nothing, waits.
    pub fn evict(&mut self) -> Option<T> {
        self.queue.evict()
    }

    /// Frames waiting, the held one included.
    pub fn waiting(&self) -> usize {
        self.queue.len() + usize::from(self.held.is_some())
    }

    /// Takes every waiting frame out (teardown).
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.held_bucket = None;
        self.held.take().into_iter().chain(self.queue.drain())
    }

    /// The limit's counters (none without a limit).
    pub fn stats(&self) -> Option<LimitStats> {
        self.limit.as_ref().map(ByteLimit::stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A frame of flow `port` (IPv4/UDP to that destination port) as the daemons carry it.
    fn frame(port: u16) -> Vec<u8> {
        let mut f = vec![0u8; vnet::VNET_HDR_LEN + 14 + 20 + 8];
        let eth = vnet::VNET_HDR_LEN;
        f[eth + 12..eth + 14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = eth + 14;
        f[ip] = 0x45;
        f[ip + 9] = 17;
        f[ip + 12..ip + 16].copy_from_slice(&[10, 0, 0, 1]);
        f[ip + 16..ip + 20].copy_from_slice(&[10, 0, 0, 2]);
        f[ip + 22..ip + 24].copy_from_slice(&port.to_be_bytes());
        f
    }

    fn sched() -> Scheduler<(u16, u32)> {
        Scheduler::new(
            FqConfig::default(),
            Some(LimitConfig {
                min: 1000,
                max: 100_000,
                start: 3000,
                hold: Duration::from_millis(100),
            }),
            Instant::now(),
        )
    }

    /// A port whose flow does not share `other`'s bucket (the keys are random).
    fn apart(s: &Scheduler<(u16, u32)>, other: u16) -> u16 {
        let bucket = |p: u16| s.flow(&frame(p)) % 1024;
        (1..).find(|&p| bucket(p) != bucket(other)).unwrap()
    }

    fn push(s: &mut Scheduler<(u16, u32)>, port: u16, n: u32, len: u32) {
        let flow = s.flow(&frame(port));
        s.push(flow, len, (port, n), &mut |d| panic!("dropped {d:?}"));
    }

    #[test]
    fn the_limit_holds_back_and_a_new_flow_passes_the_backlog() {
        let mut s = sched();
        for n in 0..10 {
            push(&mut s, 5001, n, 1000);
        }
        let mut inflight = 0;
        while s.next(inflight, Instant::now()).is_some() {
            inflight += 1000;
        }
        assert_eq!(inflight, 3000, "the limit admits up to 3000 bytes");
        assert_eq!(s.stats().unwrap().held_back, 1);
        let ping = apart(&s, 5001);
        push(&mut s, ping, 0, 100);
        // 1000 bytes complete: the ping goes before the bulk backlog.
        inflight -= 1000;
        s.completed(1000, inflight, Instant::now());
        assert_eq!(s.next(inflight, Instant::now()), Some((ping, 0)));
        assert_eq!(s.next(inflight + 100, Instant::now()), Some((5001, 3)));
        assert_eq!(s.waiting(), 6);
    }

    #[test]
    fn without_a_limit_frames_wait_only_for_credit() {
        let mut s: Scheduler<u32> = Scheduler::new(FqConfig::default(), None, Instant::now());
        for n in 0..3 {
            s.push(0, 60_000, n, &mut |d| panic!("dropped {d}"));
        }
        assert_eq!(
            s.next(u64::MAX / 2, Instant::now()),
            Some(0),
            "no limit holds it back"
        );
        assert_eq!(s.stats(), None);
        s.hold(1_000);
        assert_eq!(s.next(0, Instant::now()), Some(1_000));
    }

    #[test]
    fn a_held_frame_goes_first_and_nothing_waiting_is_not_held_back() {
        let mut s = sched();
        assert_eq!(s.next(1_000_000, Instant::now()), None);
        assert_eq!(s.stats().unwrap().held_back, 0, "nothing waited");
        push(&mut s, 5001, 0, 500);
        let other = apart(&s, 5001);
        push(&mut s, other, 0, 100);
        let first = s.next(0, Instant::now()).unwrap();
        s.hold(first);
        assert_eq!(s.waiting(), 2);
        assert_eq!(s.next(0, Instant::now()), Some(first));
        assert_eq!(s.drain().count(), 1);
        assert_eq!(s.waiting(), 0);
    }

    #[test]
    fn a_frame_bypasses_only_an_empty_queue_within_the_limit_and_counts_no_wait() {
        let mut s = sched();
        assert!(s.may_bypass(0));
        assert!(s.may_bypass(2999));
        assert!(!s.may_bypass(3000), "at the limit");
        assert_eq!(s.stats().unwrap().held_back, 0, "nothing waited");
        // Running dry after that is no reason to grow: nothing was held back.
        s.completed(3000, 0, Instant::now());
        assert_eq!(s.stats().unwrap().limit, 3000);
        push(&mut s, 5001, 0, 100);
        assert!(!s.may_bypass(0), "a frame waits in the queue");
        let f = s.next(0, Instant::now()).unwrap();
        s.hold(f);
        assert!(!s.may_bypass(0), "a frame is held for credit");
        assert_eq!(s.next(0, Instant::now()), Some(f));
        assert!(s.may_bypass(0));
    }
}
