//! When host-driver tries the IOC again after a connection ends, and whether sd0 keeps its
//! carrier meanwhile. After a loss: the carrier goes off at once, one try at once, then
//! exponential backoff (`reconnect_min_ms` doubling to `reconnect_max_ms`). After an IOC said
//! it is restarting (Goodbye Restarting: its listening sockets outlive its process, so a
//! connection made meanwhile waits for the next one): the carrier stays and a try is made
//! every `reconnect_min_ms` until `restart_grace_ms` runs out, then as after a loss.

use std::time::{Duration, Instant};

/// How a connection ended, for [`Reconnect::ended`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Lost: closed, failed, silent, or a Goodbye other than Restarting.
    Lost,
    /// The IOC said it is restarting.
    Restarting,
}

/// What to do after a failed try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// How long to wait before the next try.
    pub wait: Duration,
    /// The carrier goes off now (the grace ran out).
    pub carrier_off: bool,
}

/// The reconnect policy's state.
#[derive(Debug, Clone)]
pub struct Reconnect {
    min: Duration,
    max: Duration,
    grace: Duration,
    /// The next backoff wait.
    backoff: Duration,
    /// The carrier is held until then.
    hold_until: Option<Instant>,
}

impl Reconnect {
    /// The policy of `reconnect_min`, `reconnect_max` (at least `min`) and `restart_grace`.
    pub fn new(min: Duration, max: Duration, grace: Duration) -> Reconnect {
        Reconnect {
            min,
            max: max.max(min),
            grace,
            backoff: min,
            hold_until: None,
        }
    }

    /// A connection ended as `how` at `now`; true when the carrier goes off now.
    pub fn ended(&mut self, how: Ended, now: Instant) -> bool {
        self.backoff = self.min;
        self.hold_until =
            (how == Ended::Restarting && !self.grace.is_zero()).then(|| now + self.grace);
        self.hold_until.is_none()
    }

    /// A try failed at `now`.
    pub fn failed(&mut self, now: Instant) -> Retry {
        if let Some(until) = self.hold_until {
            if now < until {
                return Retry {
                    wait: self.min.min(until - now),
                    carrier_off: false,
                };
            }
            self.hold_until = None;
            return Retry {
                wait: self.next_backoff(),
                carrier_off: true,
            };
        }
        Retry {
            wait: self.next_backoff(),
            carrier_off: false,
        }
    }

    /// A connection came up.
    pub fn connected(&mut self) {
        self.backoff = self.min;
        self.hold_until = None;
    }

    /// Whether the carrier is held for a restarting IOC.
    pub fn holding(&self) -> bool {
        self.hold_until.is_some()
    }

    fn next_backoff(&mut self) -> Duration {
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(self.max);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy() -> Reconnect {
        Reconnect::new(100 * MS, 500 * MS, 2000 * MS)
    }

    #[test]
    fn a_loss_drops_the_carrier_and_backs_off() {
        let (mut r, t) = (policy(), Instant::now());
        assert!(r.ended(Ended::Lost, t));
        let waits: Vec<_> = (0..5).map(|_| r.failed(t)).collect();
        assert!(waits.iter().all(|w| !w.carrier_off));
        let ms: Vec<_> = waits.iter().map(|w| w.wait.as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 500, 500]);
        r.connected();
        assert_eq!(r.failed(t).wait, 100 * MS, "backoff starts over");
    }

    #[test]
    fn a_restart_keeps_the_carrier_and_retries_often_until_the_grace_runs_out() {
        let (mut r, t) = (policy(), Instant::now());
        assert!(!r.ended(Ended::Restarting, t));
        assert!(r.holding());
        for k in 0..19 {
            let w = r.failed(t + k * 100 * MS);
            assert_eq!(
                w,
                Retry {
                    wait: 100 * MS,
                    carrier_off: false
                },
                "try {k}"
            );
        }
        // The last wait ends at the grace.
        assert_eq!(r.failed(t + 1950 * MS).wait, 50 * MS);
        let w = r.failed(t + 2000 * MS);
        assert_eq!(
            w,
            Retry {
                wait: 100 * MS,
                carrier_off: true
            }
        );
        assert!(!r.holding());
        assert_eq!(
            r.failed(t + 2100 * MS).wait,
            200 * MS,
            "then as after a loss"
        );
    }

    #[test]
    fn back_in_time_the_hold_ends_and_no_grace_is_no_hold() {
        let (mut r, t) = (policy(), Instant::now());
        r.ended(Ended::Restarting, t);
        r.connected();
        assert!(!r.holding());
        let mut none = Reconnect::new(100 * MS, 500 * MS, Duration::ZERO);
        assert!(none.ended(Ended::Restarting, t), "restart_grace_ms = 0");
    }

    proptest! {
        /// Whatever happens, a wait is never beyond the longest backoff, the carrier goes off
        /// at most once per hold and never while within the grace, and never stays held past it.
        #[test]
        fn waits_are_bounded_and_the_carrier_follows_the_grace(
            min in 10u32..1000, extra in 0u32..5000, grace in 0u32..5000,
            steps in proptest::collection::vec((0u8..4, 0u32..3000), 1..60),
        ) {
            let mut r = Reconnect::new(min * MS, (min + extra) * MS, grace * MS);
            let mut now = Instant::now();
            let mut held_since: Option<Instant> = None;
            let mut carrier = true;
            for (what, dt) in steps {
                now += dt * MS;
                match what {
                    0 => { carrier = !r.ended(Ended::Lost, now); held_since = None; }
                    1 => {
                        carrier = !r.ended(Ended::Restarting, now);
                        held_since = carrier.then_some(now);
                    }
                    2 => { r.connected(); carrier = true; held_since = None; }
                    _ => {
                        let w = r.failed(now);
                        prop_assert!(w.wait <= (min + extra) * MS && !w.wait.is_zero());
                        if w.carrier_off {
                            prop_assert!(carrier, "off twice");
                            let since = held_since.take().expect("held");
                            prop_assert!(now >= since + grace * MS);
                            carrier = false;
                        }
                    }
                }
                prop_assert_eq!(r.holding(), held_since.is_some());
            }
        }
    }
}
