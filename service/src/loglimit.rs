//! Rate-limited logging of what a peer causes: one line per interval, with a count of the
//! lines held back, so a peer cannot choose how fast the log grows.

use std::time::{Duration, Instant};

/// Lets one log line through per interval and counts the ones it holds back.
#[derive(Debug, Clone)]
pub struct LogLimit {
    interval: Duration,
    next: Option<Instant>,
    held: u64,
}

impl LogLimit {
    /// At most one line per `interval`.
    pub fn new(interval: Duration) -> LogLimit {
        LogLimit {
            interval,
            next: None,
            held: 0,
        }
    }

    /// `Some(n)` when a line may be logged at `now`, `n` being the lines held back since
    /// the last one let through; `None` (the line is counted) otherwise.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.next {
            Some(next) if now < next => {
                self.held += 1;
                None
            }
            _ => {
                self.next = Some(now + self.interval);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let t0 = Instant::now();
        let mut l = LogLimit::new(Duration::from_secs(1));
        assert_eq!(l.allow(t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(l.allow(t0 + Duration::from_micros(i)), None);
        }
        assert_eq!(l.allow(t0 + Duration::from_millis(999)), None);
        assert_eq!(l.allow(t0 + Duration::from_secs(1)), Some(1001));
        assert_eq!(l.allow(t0 + Duration::from_millis(1500)), None);
        assert_eq!(l.allow(t0 + Duration::from_secs(5)), Some(1));
    }
}
