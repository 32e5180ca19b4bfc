//! A token bucket: how the IOC bounds what one host may make it do per second (CfgUtil
//! requests, and among them the costly ones), so that no host makes its worker pay for the
//! others.

use std::time::{Duration, Instant};

/// Up to `burst` events at once, then `per_second` on average.
#[derive(Debug, Clone)]
pub struct RateLimit {
    /// Tokens in thousandths, so that a slow rate still refills between calls.
    milli: u64,
    burst_milli: u64,
    per_second: u64,
    last: Instant,
}

impl RateLimit {
    /// A full bucket of `burst` tokens refilled at `per_second`.
    pub fn new(per_second: u64, burst: u64, now: Instant) -> RateLimit {
        RateLimit {
            milli: burst * 1000,
            burst_milli: burst * 1000,
            per_second,
            last: now,
        }
    }

    /// Takes a token if there is one at `now`.
    pub fn allow(&mut self, now: Instant) -> bool {
        // Whole milliseconds of refill; the remainder stays for the next call.
        let ms = now.saturating_duration_since(self.last).as_millis() as u64;
        if ms > 0 {
            self.milli = (self.milli + ms * self.per_second).min(self.burst_milli);
            self.last += Duration::from_millis(ms);
        }
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(10, 4, t0);
        assert_eq!((0..10).filter(|_| r.allow(t0)).count(), 4, "the burst");
        // 100 ms at 10/s: one more.
        let t1 = t0 + Duration::from_millis(100);
        assert!(r.allow(t1));
        assert!(!r.allow(t1));
        // A long quiet time refills the burst, never more.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| r.allow(t2)).count(), 4);
    }

    #[test]
    fn calls_closer_than_a_token_still_add_up() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(1, 1, t0);
        assert!(r.allow(t0));
        // Ten calls 100 ms apart: one token after a second, not zero.
        let got = (1..=10)
            .filter(|i| r.allow(t0 + Duration::from_millis(100 * i)))
            .count();
        assert_eq!(got, 1);
    }
}
