//! A fair queue of flows: one queue per flow hash, served by deficit round robin, flows that
//! just became active first (the sparse-flow priority of fq_codel). A ping or a keystroke
//! never waits behind a bulk transfer's backlog, only behind what is already in flight.
//!
//! Bounded in frames and bytes: a frame arriving at a full queue pushes out the oldest frame
//! of the longest flow (which may be itself), so a new sparse flow still gets in; a flow at
//! its own byte limit drops its oldest frames (head drop, as fq_codel). Every dropped frame
//! is handed back to the caller to free and count.

use std::collections::VecDeque;

/// Bounds of a [`FlowQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FqConfig {
    /// Flow buckets (frames hash into them).
    pub buckets: usize,
    /// Bytes a flow may send per round.
    pub quantum: u32,
    /// Frames waiting at most, all flows together.
    pub max_frames: usize,
    /// Bytes waiting at most, all flows together.
    pub max_bytes: u64,
    /// Bytes one flow may have waiting.
    pub flow_bytes: u64,
    /// A flow with more bytes than this waiting gets each ECN-capable frame that arrives
    /// marked Congestion Experienced ([`FlowQueue::push_marking`]), so that it slows down
    /// before its share is full and frames must be dropped (`None`: no marks).
    pub mark_bytes: Option<u64>,
}

impl Default for FqConfig {
    /// 1024 buckets (as fq_codel: a sparse flow shares a bulk flow's bucket rarely), a
    /// quantum of one MTU-sized frame, 192 frames and 8 MiB in all, 4 MiB per flow: one
    /// flow's share holds a whole batch a sender reads at once (host-driver reads up to 64
    /// frames from the TAP per wake-up, 4 MiB of TSO frames), more than its byte limit lets
    /// go, so a bulk flow's burst waits instead of being dropped (measured: an upload
    /// through sd0 lost nothing in 20 s, where 1 MiB per flow dropped 1,500 TSO frames in 5
    /// s, 10,000 TCP retransmits per GB). A sparse flow still passes it, and the frames
    /// cost no memory of their own (each holds one of the sender's send buffers).
    fn default() -> FqConfig {
        FqConfig {
            buckets: 1024,
            quantum: 1514,
            max_frames: 192,
            max_bytes: 8 << 20,
            flow_bytes: 4 << 20,
            mark_bytes: None,
        }
    }
}

#[derive(Debug)]
struct Flow<T> {
    frames: VecDeque<(T, u32)>,
    bytes: u64,
    deficit: i64,
    listed: bool,
}

/// Frames waiting to be sent, by flow.
#[derive(Debug)]
pub struct FlowQueue<T> {
    config: FqConfig,
    flows: Vec<Flow<T>>,
    new: VecDeque<usize>,
    old: VecDeque<usize>,
    frames: usize,
    bytes: u64,
    /// Frames marked Congestion Experienced.
    marked: u64,
}

impl<T> FlowQueue<T> {
    /// An empty queue (at least one bucket, a quantum of at least one byte).
    pub fn new(mut config: FqConfig) -> FlowQueue<T> {
        config.quantum = config.quantum.max(1);
        FlowQueue {
            flows: (0..config.buckets.max(1))
                .map(|_| Flow {
                    frames: VecDeque::new(),
                    bytes: 0,
                    deficit: 0,
                    listed: false,
                })
                .collect(),
            config,
            new: VecDeque::new(),
            old: VecDeque::new(),
            frames: 0,
            bytes: 0,
            marked: 0,
        }
    }

    /// As [`FlowQueue::push`], and when the frame's flow has more than
    /// [`FqConfig::mark_bytes`] waiting, `mark` is asked to mark it Congestion Experienced
    /// (true: the frame carries the mark, counted in [`FlowQueue::marked`]).
    pub fn push_marking(
        &mut self,
        hash: u64,
        len: u32,
        mut frame: T,
        mark: impl FnOnce(&mut T) -> bool,
        dropped: &mut impl FnMut(T),
    ) {
        let i = (hash % self.flows.len() as u64) as usize;
        if self
            .config
            .mark_bytes
            .is_some_and(|m| self.flows[i].bytes > m)
            && mark(&mut frame)
        {
            self.marked += 1;
        }
        self.push(hash, len, frame, dropped);
    }

    /// Frames marked Congestion Experienced so far.
    pub fn marked(&self) -> u64 {
        self.marked
    }

    /// Queues `frame` of `len` bytes in the flow of `hash`. Frames dropped to make room (the
    /// longest flows' oldest), or `frame` itself when its flow is at its limit, go to
    /// `dropped`.
    pub fn push(&mut self, hash: u64, len: u32, frame: T, dropped: &mut impl FnMut(T)) {
        let i = (hash % self.flows.len() as u64) as usize;
        // A flow over its share loses its oldest frames (head drop, as fq_codel): the loss
        // is behind the frames still queued, so the receiver reports it, and the sender
        // slows down, a queue's length sooner than a drop of the newest would tell it.
        while self.flows[i].bytes + u64::from(len) > self.config.flow_bytes {
            let Some((old, n)) = self.flows[i].frames.pop_front() else {
                break;
            };
            self.flows[i].bytes -= u64::from(n);
            self.frames -= 1;
            self.bytes -= u64::from(n);
            dropped(old);
        }
        while self.frames > 0
            && (self.frames >= self.config.max_frames
                || self.bytes + u64::from(len) > self.config.max_bytes)
        {
            match self.evict() {
                Some(f) => dropped(f),
                None => break,
            }
        }
        let f = &mut self.flows[i];
        f.frames.push_back((frame, len));
        f.bytes += u64::from(len);
        if !f.listed {
            f.listed = true;
            f.deficit = i64::from(self.config.quantum);
            self.new.push_back(i);
        }
        self.frames += 1;
        self.bytes += u64::from(len);
    }

    /// Takes the oldest frame of the longest flow out (to make room), or `None` when
    /// nothing waits.
    pub fn evict(&mut self) -> Option<T> {
        if self.frames == 0 {
            return None;
        }
        // Every flow with frames is on one of the two lists: scan those, not every bucket.
        let i = self
            .new
            .iter()
            .chain(self.old.iter())
            .copied()
            .max_by_key(|&i| self.flows[i].bytes)?;
        let (frame, len) = self.flows[i].frames.pop_front()?;
        self.flows[i].bytes -= u64::from(len);
        self.frames -= 1;
        self.bytes -= u64::from(len);
        Some(frame)
    }

    /// The next frame to send, or `None` when nothing waits.
    pub fn pop(&mut self) -> Option<T> {
        self.pop_with_bucket().map(|(_, frame)| frame)
    }

    /// As [`FlowQueue::pop`], with the bucket the frame was in.
    pub fn pop_with_bucket(&mut self) -> Option<(usize, T)> {
        loop {
            let from_new = !self.new.is_empty();
            let i = *if from_new { &self.new } else { &self.old }.front()?;
            let f = &mut self.flows[i];
            if f.deficit <= 0 {
                f.deficit += i64::from(self.config.quantum);
                self.list(from_new).pop_front();
                self.old.push_back(i);
                continue;
            }
            match f.frames.pop_front() {
                Some((frame, len)) => {
                    f.deficit -= i64::from(len);
                    f.bytes -= u64::from(len);
                    self.frames -= 1;
                    self.bytes -= u64::from(len);
                    return Some((i, frame));
                }
                None => {
                    self.list(from_new).pop_front();
                    // An emptied new flow goes to the old list once, so that a flow that
                    // keeps emptying cannot stay ahead of the others forever.
                    if from_new && !self.old.is_empty() {
                        self.old.push_back(i);
                    } else {
                        self.flows[i].listed = false;
                    }
                }
            }
        }
    }

    fn list(&mut self, new: bool) -> &mut VecDeque<usize> {
        if new {
            &mut self.new
        } else {
            &mut self.old
        }
    }

    /// True when a frame of `len` bytes would push another out: a sender that can wait
    /// (the TAP keeps its frames) stops taking more instead.
    pub fn is_full(&self, len: u32) -> bool {
        self.frames >= self.config.max_frames || self.bytes + u64::from(len) > self.config.max_bytes
    }

    /// True when a frame of up to `len` bytes, of any flow, would be taken without pushing
    /// another out: neither the queue nor its longest flow's share is that close to full.
    /// A sender that can leave frames where they are (a TAP queue's ring) reads only then,
    /// and never drops here.
    pub fn has_room(&self, len: u32) -> bool {
        let longest = self
            .new
            .iter()
            .chain(self.old.iter())
            .map(|&i| self.flows[i].bytes)
            .max()
            .unwrap_or(0);
        !self.is_full(len) && longest + u64::from(len) <= self.config.flow_bytes
    }

    /// The bucket of `hash`'s flow.
    pub fn bucket(&self, hash: u64) -> usize {
        (hash % self.flows.len() as u64) as usize
    }

    /// Buckets of the queue.
    pub fn buckets(&self) -> usize {
        self.flows.len()
    }

    /// True when frames of `bucket` wait.
    pub fn waits_in(&self, bucket: usize) -> bool {
        self.flows.get(bucket).is_some_and(|f| !f.frames.is_empty())
    }

    /// Frames waiting.
    pub fn len(&self) -> usize {
        self.frames
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    /// Bytes waiting.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes every waiting frame out (teardown).
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.new.clear();
        self.old.clear();
        self.frames = 0;
        self.bytes = 0;
        self.flows.iter_mut().flat_map(|f| {
            f.listed = false;
            f.bytes = 0;
            f.frames.drain(..).map(|(t, _)| t)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pushes, expecting nothing dropped.
    fn put<T: std::fmt::Debug>(q: &mut FlowQueue<T>, hash: u64, len: u32, frame: T) {
        q.push(hash, len, frame, &mut |d| panic!("dropped {d:?}"));
    }

    /// Pushes, returning what was dropped.
    fn put_dropping<T>(q: &mut FlowQueue<T>, hash: u64, len: u32, frame: T) -> Vec<T> {
        let mut out = Vec::new();
        q.push(hash, len, frame, &mut |d| out.push(d));
        out
    }

    #[test]
    fn a_sparse_flow_passes_a_bulk_backlog() {
        let mut q = FlowQueue::new(FqConfig::default());
        for n in 0..100u32 {
            put(&mut q, 1, 1514, ("bulk", n));
        }
        // Two bulk frames leave, then a ping arrives.
        assert_eq!(q.pop(), Some(("bulk", 0)));
        assert_eq!(q.pop(), Some(("bulk", 1)));
        put(&mut q, 2, 98, ("ping", 0));
        assert_eq!(q.pop(), Some(("ping", 0)), "the new flow goes first");
        assert_eq!(q.pop(), Some(("bulk", 2)));
    }

    #[test]
    fn two_bulk_flows_share_fairly() {
        let mut q = FlowQueue::new(FqConfig::default());
        for n in 0..50u32 {
            put(&mut q, 1, 1514, (1, n));
            put(&mut q, 2, 1514, (2, n));
        }
        let first: Vec<u64> = (0..20).map(|_| q.pop().unwrap().0).collect();
        let ones = first.iter().filter(|f| **f == 1).count();
        assert!((9..=11).contains(&ones), "{first:?}");
    }

    #[test]
    fn full_queue_drops_from_the_longest_flow_and_lets_a_new_flow_in() {
        let mut q = FlowQueue::new(FqConfig {
            max_frames: 10,
            quantum: 100,
            ..FqConfig::default()
        });
        for n in 0..10u32 {
            put(&mut q, 1, 100, n);
        }
        assert_eq!(q.pop(), Some(0), "the bulk flow used its quantum");
        put(&mut q, 1, 100, 10);
        assert_eq!(
            put_dropping(&mut q, 2, 100, 99),
            vec![1],
            "the bulk flow's oldest goes"
        );
        assert_eq!(q.len(), 10);
        assert_eq!(q.pop(), Some(99), "the new flow first");
    }

    #[test]
    fn a_flow_at_its_byte_limit_drops_its_oldest() {
        let mut q = FlowQueue::new(FqConfig {
            flow_bytes: 1000,
            ..FqConfig::default()
        });
        for n in 0..10u32 {
            put(&mut q, 7, 100, n);
        }
        put(&mut q, 8, 100, 80);
        assert_eq!(put_dropping(&mut q, 7, 100, 10), vec![0]);
        assert_eq!((q.len(), q.bytes()), (11, 1100));
        // A frame as large as the whole share pushes out every older one of its flow, and
        // only of its flow.
        assert_eq!(
            put_dropping(&mut q, 7, 1000, 11),
            (1..=10).collect::<Vec<_>>()
        );
        assert_eq!((q.len(), q.bytes()), (2, 1100));
        let mut order = Vec::new();
        while let Some(f) = q.pop() {
            order.push(f);
        }
        order.sort();
        assert_eq!(order, vec![11, 80]);
    }

    #[test]
    fn evict_takes_the_longest_flows_oldest() {
        let mut q = FlowQueue::new(FqConfig::default());
        assert_eq!(q.evict(), None::<u32>);
        put(&mut q, 1, 100, 10);
        put(&mut q, 2, 100, 20);
        put(&mut q, 2, 100, 21);
        assert_eq!(q.evict(), Some(20));
        assert_eq!((q.len(), q.bytes()), (2, 200));
        assert_eq!(q.pop(), Some(10));
        assert_eq!(q.pop(), Some(21));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn a_zero_quantum_still_serves() {
        let mut q = FlowQueue::new(FqConfig {
            quantum: 0,
            ..FqConfig::default()
        });
        put(&mut q, 1, 1500, 1);
        put(&mut q, 1, 1500, 2);
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(2));
    }

    #[test]
    fn room_for_any_flow_means_no_drop() {
        let mut q = FlowQueue::new(FqConfig {
            max_frames: 4,
            max_bytes: 10_000,
            flow_bytes: 1000,
            ..FqConfig::default()
        });
        assert!(q.has_room(1000));
        put(&mut q, 1, 600, 0);
        assert!(q.has_room(400), "the flow still takes 400 bytes");
        assert!(!q.has_room(401), "its share would overflow");
        put(&mut q, 1, 400, 1);
        put(&mut q, 2, 100, 2);
        assert!(!q.has_room(1), "flow 1 is at its share");
        assert_eq!(q.pop(), Some(0));
        assert!(q.has_room(600));
        put(&mut q, 3, 100, 3);
        assert!(q.has_room(600));
        put(&mut q, 4, 100, 4);
        assert!(!q.has_room(1), "four frames: the queue is full");
    }

    #[test]
    fn a_flow_past_its_mark_threshold_gets_marks_not_drops() {
        let mut q = FlowQueue::new(FqConfig {
            flow_bytes: 1000,
            mark_bytes: Some(300),
            ..FqConfig::default()
        });
        let mut marks = Vec::new();
        for n in 0..6u32 {
            q.push_marking(
                1,
                100,
                n,
                |f| {
                    marks.push(*f);
                    true
                },
                &mut |_| panic!("dropped"),
            );
        }
        assert_eq!(marks, vec![4, 5], "marked once more than 300 bytes waited");
        // Another flow is not marked; a frame its marker cannot mark is not counted.
        q.push_marking(2, 100, 9, |_| panic!("asked"), &mut |_| panic!("dropped"));
        q.push_marking(1, 100, 6, |_| false, &mut |_| panic!("dropped"));
        assert_eq!(q.marked(), 2);
        let unmarked: FlowQueue<u32> = FlowQueue::new(FqConfig::default());
        assert_eq!(unmarked.config.mark_bytes, None);
    }

    proptest! {
        /// A queue that says it has room for `len` takes any frame of up to `len` bytes
        /// without dropping one.
        #[test]
        fn room_is_never_a_drop(
            ops in proptest::collection::vec((any::<bool>(), 0u64..6, 1u32..3000), 0..300),
            len in 1u32..3000,
        ) {
            let cfg = FqConfig { buckets: 8, max_frames: 12, max_bytes: 15_000, flow_bytes: 6000, ..FqConfig::default() };
            let mut q = FlowQueue::new(cfg);
            for (push, hash, n) in ops {
                if push {
                    let room = q.has_room(len);
                    let mut dropped = 0;
                    q.push(hash, n.min(len), (), &mut |_| dropped += 1);
                    prop_assert!(!room || dropped == 0);
                } else {
                    q.pop();
                }
            }
        }

        /// Every frame pushed comes out exactly once, popped or dropped; bounds always hold;
        /// each flow's frames leave in order.
        #[test]
        fn conserves_frames_and_keeps_bounds(
            ops in proptest::collection::vec((any::<bool>(), 0u64..8, 1u32..3000), 0..400)
        ) {
            let cfg = FqConfig { buckets: 4, max_frames: 20, max_bytes: 20_000, flow_bytes: 9000, ..FqConfig::default() };
            let mut q = FlowQueue::new(cfg);
            let (mut pushed, mut out) = (0u64, Vec::new());
            for (push, hash, len) in ops {
                if push {
                    q.push(hash, len, (hash % 4, pushed), &mut |d| out.push(d));
                    pushed += 1;
                } else if let Some(f) = q.pop() {
                    out.push(f);
                }
                prop_assert!(q.len() <= 20);
                prop_assert!(q.bytes() <= 20_000);
            }
            let mut popped: Vec<(u64, u64)> = Vec::new();
            while let Some(f) = q.pop() { popped.push(f); }
            prop_assert!(q.is_empty() && q.bytes() == 0);
            let mut all: Vec<u64> = out.iter().chain(popped.iter()).map(|f| f.1).collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..pushed).collect::<Vec<_>>());
            for b in 0..4 {
                let seq: Vec<u64> = popped.iter().filter(|f| f.0 == b).map(|f| f.1).collect();
                prop_assert!(seq.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}
