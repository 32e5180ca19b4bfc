//! The express lane: which frames go ahead of the bulk, on a lane no bulk frame waits in
//! (SendData on the control channel, docs/protocol.md 6.6).
//!
//! The choice is made by flow, never frame by frame, so that no flow's frames are reordered:
//! a flow is sparse, as fq_codel decides it, while it sends small frames (at most
//! [`ExpressConfig::frame_max`] bytes) within a budget of its own (a token bucket); its
//! frames then take the lane. A flow that outgrows its budget, sends a larger frame, or
//! meets a full lane turns bulk at once: its frames in the lane are ahead of anything it
//! sends on the bulk path, so nothing it sent is overtaken. A bulk flow comes back only
//! once none of its frames waits in the sender's queue and [`ExpressConfig::idle`] has
//! passed since its last frame arrived or left that queue ([`Express::left`]): longer than
//! a frame stays on the bulk path after it (the byte limit and the credits bound that), so
//! that its bulk frames are delivered before its first express one.
//!
//! The lane as a whole has a budget too, so that many sparse flows (or a flood of new ones)
//! cannot make it a bulk queue of its own.

use std::time::{Duration, Instant};

/// Bounds of an [`Express`] lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpressConfig {
    /// Flow buckets (frames hash into them; a flow sharing a bulk flow's bucket is bulk).
    pub buckets: usize,
    /// The largest frame that takes the lane (virtio-net header and Ethernet frame).
    pub frame_max: u32,
    /// Bytes per second one flow may send in the lane.
    pub flow_rate: u64,
    /// Bytes one flow may send in the lane at once.
    pub flow_burst: u64,
    /// Bytes per second of the whole lane.
    pub lane_rate: u64,
    /// Bytes the whole lane may carry at once.
    pub lane_burst: u64,
    /// How long a bulk flow must be silent before it may take the lane again.
    pub idle: Duration,
}

impl Default for ExpressConfig {
    /// Frames of up to 1,024 bytes (the SendData a receiver must take, [`crate::wire::MAX_INLINE`]);
    /// 4 MB/s and 32 KiB per flow (a ping, DNS, an interactive session, a request/response
    /// of small messages, a download's acknowledgements, a TCP handshake and its first
    /// window); 16 MB/s and 128 KiB for the lane (at most a tenth of a millisecond of a
    /// 10 Gb/s path waits in it); 100 ms of silence before a bulk flow comes back.
    fn default() -> ExpressConfig {
        ExpressConfig {
            buckets: 1024,
            frame_max: crate::wire::MAX_INLINE as u32,
            flow_rate: 4_000_000,
            flow_burst: 32 << 10,
            lane_rate: 16_000_000,
            lane_burst: 128 << 10,
            idle: Duration::from_millis(100),
        }
    }
}

/// Counters of an [`Express`] lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpressStats {
    /// Frames that took the lane.
    pub frames: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Times a flow turned bulk.
    pub demoted: u64,
    /// Times a bulk flow came back after its silence.
    pub promoted: u64,
}

/// A token bucket of bytes.
#[derive(Debug, Clone, Copy)]
struct Tokens {
    tokens: u64,
    at: Instant,
}

impl Tokens {
    fn full(burst: u64, now: Instant) -> Tokens {
        Tokens {
            tokens: burst,
            at: now,
        }
    }

    /// Refills at `rate` bytes a second up to `burst`, as of `now`.
    fn refill(&mut self, rate: u64, burst: u64, now: Instant) {
        let ns = now.saturating_duration_since(self.at).as_nanos();
        let add = ns.saturating_mul(u128::from(rate)) / 1_000_000_000;
        self.tokens = u64::try_from(u128::from(self.tokens).saturating_add(add))
            .unwrap_or(u64::MAX)
            .min(burst);
        self.at = self.at.max(now);
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: Tokens,
    /// The last frame of the bucket's flow.
    last: Instant,
    bulk: bool,
}

/// One sender's express lane: which flows take it.
#[derive(Debug, Clone)]
pub struct Express {
    config: ExpressConfig,
    /// `None`: no frame of the bucket yet.
    buckets: Vec<Option<Bucket>>,
    lane: Tokens,
    stats: ExpressStats,
}

impl Express {
    /// Every flow sparse, the lane's budget full at `now`.
    pub fn new(config: ExpressConfig, now: Instant) -> Express {
        Express {
            buckets: vec![None; config.buckets.max(1)],
            lane: Tokens::full(config.lane_burst, now),
            config,
            stats: ExpressStats::default(),
        }
    }

    /// The bucket of `flow`.
    pub fn bucket(&self, flow: u64) -> usize {
        (flow % self.buckets.len() as u64) as usize
    }

    /// Whether the next frame of `flow`, `len` bytes, takes the lane at `now` (else it goes
    /// the bulk way). `open`: the lane takes a frame now (false turns an express flow
    /// bulk); `waiting`: frames of the flow's bucket wait in the sender's bulk queue (a bulk
    /// flow then stays bulk, whatever its silence).
    pub fn classify(
        &mut self,
        flow: u64,
        len: u32,
        now: Instant,
        open: bool,
        waiting: bool,
    ) -> bool {
        let c = self.config;
        let i = self.bucket(flow);
        let b = self.buckets[i].get_or_insert(Bucket {
            tokens: Tokens::full(c.flow_burst, now),
            last: now,
            bulk: false,
        });
        let silent = now.saturating_duration_since(b.last);
        b.last = b.last.max(now);
        if b.bulk {
            if silent < c.idle || waiting {
                return false;
            }
            b.bulk = false;
            b.tokens = Tokens::full(c.flow_burst, now);
            self.stats.promoted += 1;
        }
        b.tokens.refill(c.flow_rate, c.flow_burst, now);
        self.lane.refill(c.lane_rate, c.lane_burst, now);
        let n = u64::from(len);
        if !open || len > c.frame_max || b.tokens.tokens < n || self.lane.tokens < n {
            b.bulk = true;
            self.stats.demoted += 1;
            return false;
        }
        b.tokens.tokens -= n;
        self.lane.tokens -= n;
        self.stats.frames += 1;
        self.stats.bytes += n;
        true
    }

    /// A bulk frame of `flow` left the sender's queue at `now` for the bulk path: the
    /// flow's silence counts from then.
    pub fn left(&mut self, flow: u64, now: Instant) {
        let i = self.bucket(flow);
        if let Some(b) = &mut self.buckets[i] {
            b.last = b.last.max(now);
        }
    }

    /// The lane's counters.
    pub fn stats(&self) -> ExpressStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_sparse_ping_takes_the_lane_and_a_bulk_flow_leaves_it_for_good() {
        let t0 = Instant::now();
        let mut x = Express::new(ExpressConfig::default(), t0);
        // A ping every 10 ms for 10 s: always express.
        for n in 0..1000 {
            assert!(x.classify(7, 98, t0 + ms(10 * n), true, false), "ping {n}");
        }
        // A bulk flow of 1,000-byte frames every 10 us: express for its first 32 KiB.
        let mut express = 0;
        for n in 0..10_000u32 {
            let now = t0 + Duration::from_micros(10 * u64::from(n));
            express += u32::from(x.classify(8, 1000, now, true, false));
        }
        // 32 KiB and the 1.4 KB its 4 MB/s refill in the 0.34 ms they take, then bulk.
        assert_eq!(express, 34, "its budget's worth of frames, then bulk");
        assert_eq!(x.stats().demoted, 1);
        // Silent for less than 100 ms: still bulk, even for a small frame.
        assert!(!x.classify(8, 60, t0 + ms(150), true, false));
        // Silent 100 ms, but its frames wait in the bulk queue: bulk.
        assert!(!x.classify(8, 60, t0 + ms(250), true, true));
        // Silent 100 ms with nothing waiting: back.
        assert!(x.classify(8, 60, t0 + ms(350), true, false));
        assert_eq!(x.stats().promoted, 1);
    }

    #[test]
    fn a_large_frame_or_a_closed_lane_turns_the_flow_bulk() {
        let t0 = Instant::now();
        let mut x = Express::new(ExpressConfig::default(), t0);
        assert!(x.classify(1, 100, t0, true, false));
        assert!(!x.classify(1, 1025, t0, true, false), "beyond frame_max");
        assert!(
            !x.classify(1, 100, t0 + ms(1), true, false),
            "the flow is bulk now"
        );
        assert!(x.classify(2, 100, t0, true, false));
        assert!(!x.classify(2, 100, t0 + ms(1), false, false), "lane closed");
        assert!(!x.classify(2, 100, t0 + ms(2), true, false));
        assert_eq!(x.stats().demoted, 2);
        assert_eq!(x.stats().frames, 2);
    }

    #[test]
    fn the_lane_budget_bounds_many_sparse_flows() {
        let t0 = Instant::now();
        let mut x = Express::new(ExpressConfig::default(), t0);
        // 1,000 new flows at once, 1,000 bytes each: the lane takes its burst, 131 frames.
        let took = (0..1000u64)
            .filter(|&f| x.classify(f, 1000, t0, true, false))
            .count();
        assert_eq!(took, 131);
    }

    /// Frames of a few flows, each `(flow, len, gap_us, queue_wait_us, path_delay_us)`.
    fn traffic() -> impl Strategy<Value = Vec<(u64, u32, u64, u64, u64)>> {
        prop::collection::vec(
            (
                0u64..4,
                40u32..1600,
                prop_oneof![0u64..50, 0u64..200_000],
                prop_oneof![Just(0u64), 0u64..1_000_000],
                0u64..99_000,
            ),
            1..400,
        )
    }

    proptest! {
        /// The bulk path as the daemons have it: a frame waits in the sender's queue (any
        /// time; the sender knows which flows wait there), then on a first-in, first-out
        /// path for less than the idle time. The express lane delivers at once. Every
        /// flow's frames arrive in order.
        #[test]
        fn no_flow_is_reordered(frames in traffic()) {
            let t0 = Instant::now();
            let mut x = Express::new(ExpressConfig::default(), t0);
            let mut now = t0;
            // (arrival, flow, seq) of each frame.
            let mut arrivals: Vec<(Instant, u64, usize)> = Vec::new();
            let (mut left_last, mut arrived_last) = (t0, t0);
            // (leaves the queue, flow) of bulk frames.
            let mut queued: Vec<(Instant, u64)> = Vec::new();
            for (seq, &(flow, len, gap, wait, delay)) in frames.iter().enumerate() {
                now += Duration::from_micros(gap);
                // The frames that left the queue since, in order.
                queued.sort_by_key(|&(at, _)| at);
                for &(at, f) in queued.iter().filter(|&&(at, _)| at <= now) {
                    x.left(f, at);
                }
                queued.retain(|&(at, _)| at > now);
                let waiting = queued.iter().any(|&(_, f)| f == flow);
                let at = if x.classify(flow, len, now, true, waiting) {
                    now
                } else {
                    left_last = left_last.max(now + Duration::from_micros(wait));
                    queued.push((left_last, flow));
                    arrived_last = arrived_last.max(left_last + Duration::from_micros(delay));
                    arrived_last
                };
                arrivals.push((at, flow, seq));
            }
            arrivals.sort_by_key(|&(at, _, seq)| (at, seq));
            let mut last: BTreeMap<u64, usize> = BTreeMap::new();
            for (_, flow, seq) in arrivals {
                if let Some(&prev) = last.get(&flow) {
                    prop_assert!(prev < seq, "flow {} frame {} after {}", flow, prev, seq);
                }
                last.insert(flow, seq);
            }
        }

        /// Whatever the traffic, the lane carries at most its burst plus its rate's worth,
        /// and no frame beyond frame_max.
        #[test]
        fn the_lane_keeps_its_budget(frames in traffic()) {
            let c = ExpressConfig::default();
            let t0 = Instant::now();
            let mut x = Express::new(c, t0);
            let mut now = t0;
            let mut bytes = 0u64;
            for &(flow, len, gap, _, _) in &frames {
                now += Duration::from_micros(gap);
                if x.classify(flow, len, now, true, false) {
                    prop_assert!(len <= c.frame_max);
                    bytes += u64::from(len);
                }
            }
            let secs = now.duration_since(t0).as_secs_f64();
            prop_assert!(bytes as f64 <= c.lane_burst as f64 + c.lane_rate as f64 * secs + 1.0);
            prop_assert_eq!(x.stats().bytes, bytes);
        }
    }
}
