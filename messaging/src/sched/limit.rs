//! A dynamic limit on bytes in flight, after Linux's byte queue limits (BQL).
//!
//! The sender asks [`ByteLimit::admits`] before posting; a refusal means it holds the frame
//! back. Completions (credits returned by the peer) report how much completed and what is
//! still in flight:
//! - the limit grows when the path ran dry (nothing left in flight) while the sender was
//!   held back: the limit, not the path, was what slowed it;
//! - it shrinks when, for a whole hold period in which the path never went idle, the limit
//!   stayed above twice what completes at a time (the slack, as BQL computes it): bytes
//!   beyond that only stand in a queue and add delay.

use std::time::{Duration, Instant};

/// Bounds and pace of a [`ByteLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitConfig {
    /// Smallest limit (bytes).
    pub min: u64,
    /// Largest limit (bytes).
    pub max: u64,
    /// Limit at start (bytes).
    pub start: u64,
    /// How long a standing queue must last before the limit shrinks.
    pub hold: Duration,
}

impl Default for LimitConfig {
    /// 128 KiB to 1 MiB, starting at 256 KiB; 100 ms of standing queue shrinks it. A
    /// megabyte is a millisecond at 8 Gb/s: frames sent behind it wait at most that long.
    fn default() -> LimitConfig {
        LimitConfig {
            min: 128 << 10,
            max: 1 << 20,
            start: 256 << 10,
            hold: Duration::from_millis(100),
        }
    }
}

impl LimitConfig {
    /// For a byte stream (TCP, a Unix socket): 64 to 256 KiB, starting at 128 KiB. The bytes
    /// in flight wait in the socket's first-in, first-out queue ahead of every later frame,
    /// a ping's included, and the stream drains them no faster than the shared-memory ring
    /// the default is sized for. Measured here (a ping every 10 ms during a 5 s upload over
    /// the TCP fabric, two alternating pairs): 499 and 561 us instead of 1,777 and 1,529, at
    /// the same throughput (8.6 and 8.0 Gb/s against 6.6 and 7.0); over shared memory the
    /// same bounds cost 7-11% of the upload's throughput, so the ring keeps the default.
    pub fn stream() -> LimitConfig {
        LimitConfig {
            min: 64 << 10,
            max: 256 << 10,
            start: 128 << 10,
            hold: Duration::from_millis(100),
        }
    }
}

/// Counters of a [`ByteLimit`], for operators and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitStats {
    /// The limit now (bytes).
    pub limit: u64,
    /// Times it grew (the path ran dry).
    pub grown: u64,
    /// Times it shrank (a standing queue persisted).
    pub shrunk: u64,
    /// Times a sender was held back by it.
    pub held_back: u64,
}

/// The limit of one direction of one queue.
#[derive(Debug, Clone)]
pub struct ByteLimit {
    config: LimitConfig,
    limit: u64,
    /// The sender was held back since the last completion.
    limited: bool,
    /// Least slack (limit beyond twice a completion) seen this period.
    slack: u64,
    period_start: Instant,
    stats: LimitStats,
}

impl ByteLimit {
    /// A limit at `config.start`, its first period starting at `now`.
    pub fn new(config: LimitConfig, now: Instant) -> ByteLimit {
        let limit = config.start.clamp(config.min, config.max.max(config.min));
        ByteLimit {
            config,
            limit,
            limited: false,
            slack: u64::MAX,
            period_start: now,
            stats: LimitStats {
                limit,
                ..LimitStats::default()
            },
        }
    }

    /// True when a frame may be posted with `inflight` bytes outstanding (one frame may
    /// overshoot the limit). A refusal counts as the sender being held back.
    pub fn admits(&mut self, inflight: u64) -> bool {
        if inflight < self.limit {
            return true;
        }
        if !self.limited {
            self.stats.held_back += 1;
        }
        self.limited = true;
        false
    }

    /// True when a frame may be posted with `inflight` bytes outstanding, counting nothing
    /// (no frame waits yet).
    pub fn would_admit(&self, inflight: u64) -> bool {
        inflight < self.limit
    }

    /// `completed` bytes completed at `now`; `inflight` bytes remain outstanding.
    pub fn completed(&mut self, completed: u64, inflight: u64, now: Instant) {
        if self.limited && inflight == 0 && completed > 0 {
            // Ran dry while the sender waited: too small. (Nothing completed: the peer
            // took its pools back, which says nothing of the path.)
            self.limit = self.limit.saturating_mul(2).min(self.config.max);
            self.stats.grown += 1;
            self.restart(now);
        } else {
            if inflight > 0 {
                // Still busy after this completion: what the limit allows beyond twice a
                // completion is slack.
                let slack = self.limit.saturating_sub(completed.saturating_mul(2));
                self.slack = self.slack.min(slack);
            } else {
                self.slack = 0;
            }
            if now.saturating_duration_since(self.period_start) >= self.config.hold {
                if self.slack != u64::MAX && self.slack > 0 {
                    // The limit stood above what the path needed all period long: move
                    // half way down, so that one wrong guess cannot starve the path.
                    self.limit = self
                        .limit
                        .saturating_sub(self.slack / 2)
                        .max(self.config.min);
                    self.stats.shrunk += 1;
                }
                self.restart(now);
            }
        }
        self.limited = false;
        self.stats.limit = self.limit;
    }

    fn restart(&mut self, now: Instant) {
        self.period_start = now;
        self.slack = u64::MAX;
    }

    /// The limit now (bytes).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Counters.
    pub fn stats(&self) -> LimitStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> LimitConfig {
        LimitConfig {
            min: 100,
            max: 100_000,
            start: 1000,
            hold: Duration::from_millis(100),
        }
    }

    /// A sender that always has data, posting frames of `frame` bytes, in front of a path
    /// that works off `rate` bytes a millisecond in order and completes them at once (as
    /// the IOC returns credits for what it forwarded). The simulated clock advances 1 ms a
    /// step. Returns the bytes delivered in `ms` steps.
    fn run(l: &mut ByteLimit, t0: Instant, rate: u64, frame: u64, ms: usize) -> u64 {
        let (mut inflight, mut delivered) = (0u64, 0u64);
        for step in 0..ms {
            let now = t0 + Duration::from_millis(step as u64);
            while l.admits(inflight) {
                inflight += frame;
            }
            let done = inflight.min(rate) / frame * frame;
            inflight -= done;
            delivered += done;
            if done > 0 {
                l.completed(done, inflight, now);
            }
        }
        delivered
    }

    #[test]
    fn grows_when_the_path_runs_dry() {
        let t0 = Instant::now();
        let mut l = ByteLimit::new(cfg(), t0);
        // Each ms the path completes everything posted a ms ago: 1000 bytes in flight
        // drain to zero while the sender waits.
        l.admits(0);
        assert!(!l.admits(1000));
        l.completed(1000, 0, t0 + Duration::from_millis(1));
        assert_eq!(l.limit(), 2000);
        assert_eq!(l.stats().grown, 1);
    }

    #[test]
    fn shrinks_under_a_standing_queue_and_settles_near_the_path_need() {
        let t0 = Instant::now();
        let mut l = ByteLimit::new(
            LimitConfig {
                start: 50_000,
                ..cfg()
            },
            t0,
        );
        // The path works off 1000 bytes a step: about that much in flight keeps it busy,
        // the rest of the 50,000 bytes only queue.
        let delivered = run(&mut l, t0, 1000, 100, 5000);
        assert!(l.stats().shrunk > 0, "{:?}", l.stats());
        assert!(l.limit() <= 3000, "settled at {}", l.limit());
        // Throughput kept: the path stayed busy nearly all the time.
        assert!(delivered >= 1000 * 4990, "delivered {delivered}");
        // Starting too low, it grows until the path is busy, and stays there.
        let mut low = ByteLimit::new(
            LimitConfig {
                start: 100,
                ..cfg()
            },
            t0,
        );
        let d = run(&mut low, t0, 5000, 100, 5000);
        assert!(low.stats().grown > 0);
        assert!(d >= 5000 * 4900, "delivered {d}");
    }

    #[test]
    fn pools_taken_back_do_not_grow_the_limit() {
        let t0 = Instant::now();
        let mut l = ByteLimit::new(cfg(), t0);
        assert!(!l.admits(1000));
        // The peer flushed its pools: nothing completed, nothing in flight any more.
        l.completed(0, 0, t0 + Duration::from_millis(1));
        assert_eq!((l.limit(), l.stats().grown), (1000, 0));
    }

    #[test]
    fn a_path_that_goes_idle_keeps_the_limit() {
        let t0 = Instant::now();
        let mut l = ByteLimit::new(cfg(), t0);
        for ms in 0..1000u64 {
            assert!(l.admits(0));
            l.completed(100, 0, t0 + Duration::from_millis(ms));
        }
        assert_eq!(l.limit(), 1000);
        assert_eq!((l.stats().grown, l.stats().shrunk), (0, 0));
    }

    #[test]
    fn a_limit_far_above_what_flows_shrinks_even_unreached() {
        let t0 = Instant::now();
        let mut l = ByteLimit::new(cfg(), t0);
        // 500 bytes stay in flight, 100 complete at a time: the limit of 1000 is never
        // reached, but 800 of it is slack.
        for ms in 0..1000u64 {
            let _ = l.admits(500);
            l.completed(100, 500, t0 + Duration::from_millis(ms));
        }
        assert!(l.stats().shrunk > 0);
        assert!(l.limit() < 400, "{}", l.limit());
    }

    proptest! {
        #[test]
        fn stays_within_bounds(events in proptest::collection::vec((0u64..200_000, 0u64..300, any::<bool>()), 0..500), done in 0u64..50_000) {
            let t0 = Instant::now();
            let mut l = ByteLimit::new(cfg(), t0);
            let mut t = t0;
            for (inflight, dt, admit) in events {
                t += Duration::from_millis(dt);
                if admit {
                    let _ = l.admits(inflight);
                } else {
                    l.completed(done, inflight, t);
                }
                prop_assert!(l.limit() >= 100 && l.limit() <= 100_000);
            }
        }
    }
}
