//! How long a shared-memory consumer polls its ring before it arms the doorbell and sleeps.
//!
//! Waking a sleeping thread costs a doorbell's send and receive and, on an idle vCPU, a wake-up
//! of 16-18 us per hop on the reference machine; polling a ring costs nothing but the CPU it
//! burns. Polling pays when the next record comes soon after the last, and loses when gaps
//! are long, or when the peer needs the very CPU the poller occupies. So the spin budget
//! adapts, the way KVM's halt-polling does (`virt/kvm/kvm_main.c`, `grow_halt_poll_ns`):
//!
//! - it starts at zero and grows (to `start`, then doubling) after a sleep that a longer spin
//!   would have avoided: the wait was shorter than `max`;
//! - it shrinks (halving, then to zero) after a sleep longer than `max`, which no allowed spin
//!   would have caught: that spin was CPU burnt for nothing;
//! - it is zero right after this side rang a sleeping peer's doorbell: the peer is waking up,
//!   maybe on this very CPU, and spinning would only delay it;
//! - `max` zero turns polling off.
//!
//! Sans-IO: the caller measures time and reports what happened; [`Spin::budget`] says how long
//! to poll next.

use std::time::Duration;

/// Limits of the adaptive spin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinConfig {
    /// Longest spin; zero: never spin, always sleep.
    pub max: Duration,
    /// The first non-zero budget after growing from zero.
    pub start: Duration,
}

impl Default for SpinConfig {
    /// Up to 50 us (three wake-ups' worth on the reference machine), from 2 us.
    fn default() -> SpinConfig {
        SpinConfig {
            max: Duration::from_micros(50),
            start: Duration::from_micros(2),
        }
    }
}

/// What ended an idle period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Work arrived while polling, after `after` of it.
    Caught {
        /// Time spent polling.
        after: Duration,
    },
    /// Nothing arrived within the budget; the consumer slept and was woken after `slept`
    /// (measured from when it began to poll).
    Slept {
        /// Time from the start of polling to the wake-up.
        slept: Duration,
    },
}

/// How a consumer's idle periods ended, as reported to [`Spin::idle_ended`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpinCounts {
    /// Caught by the poll: work arrived before the budget ran out.
    pub caught: u64,
    /// Slept and woken (the budget ran out, or was zero).
    pub slept: u64,
}

impl std::ops::AddAssign for SpinCounts {
    fn add_assign(&mut self, o: SpinCounts) {
        self.caught += o.caught;
        self.slept += o.slept;
    }
}

/// The adaptive spin budget of one consumer.
#[derive(Debug, Clone)]
pub struct Spin {
    cfg: SpinConfig,
    budget: Duration,
    rang_peer: bool,
    counts: SpinCounts,
}

impl Spin {
    /// A policy with budget zero, growing as sleeps prove short.
    pub fn new(cfg: SpinConfig) -> Spin {
        let start = cfg.start.min(cfg.max);
        Spin {
            cfg: SpinConfig { start, ..cfg },
            budget: Duration::ZERO,
            rang_peer: false,
            counts: SpinCounts::default(),
        }
    }

    /// How the idle periods reported so far ended.
    pub fn counts(&self) -> SpinCounts {
        self.counts
    }

    /// How long to poll before arming the doorbell and sleeping.
    pub fn budget(&self) -> Duration {
        if self.rang_peer {
            Duration::ZERO
        } else {
            self.budget
        }
    }

    /// This side just rang a sleeping peer's doorbell: the next idle period does not spin.
    pub fn rang_peer(&mut self) {
        self.rang_peer = true;
    }

    /// Reports how the idle period that began with [`Spin::budget`] ended.
    pub fn idle_ended(&mut self, how: Idle) {
        let skipped = std::mem::take(&mut self.rang_peer);
        match how {
            Idle::Caught { .. } => self.counts.caught += 1,
            Idle::Slept { .. } => self.counts.slept += 1,
        }
        match how {
            Idle::Caught { .. } => {}
            Idle::Slept { slept } if slept > self.cfg.max => self.shrink(),
            // A short sleep: a longer spin would have caught it (unless this period was
            // not allowed to spin at all, which says nothing about the budget).
            Idle::Slept { slept } if slept > self.budget && !skipped => self.grow(),
            Idle::Slept { .. } => {}
        }
    }

    fn grow(&mut self) {
        self.budget = if self.budget.is_zero() {
            self.cfg.start
        } else {
            (self.budget * 2).min(self.cfg.max)
        };
    }

    fn shrink(&mut self) {
        self.budget /= 2;
        if self.budget < self.cfg.start {
            self.budget = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const US: Duration = Duration::from_micros(1);

    fn slept(us: u64) -> Idle {
        Idle::Slept {
            slept: US * us as u32,
        }
    }

    #[test]
    fn short_sleeps_grow_the_budget_to_the_max() {
        let mut s = Spin::new(SpinConfig::default());
        assert_eq!(s.budget(), Duration::ZERO);
        let mut seen = vec![];
        for _ in 0..8 {
            s.idle_ended(slept(40));
            seen.push(s.budget().as_micros());
        }
        assert_eq!(seen, [2, 4, 8, 16, 32, 50, 50, 50]);
    }

    #[test]
    fn long_sleeps_shrink_it_to_zero() {
        let mut s = Spin::new(SpinConfig::default());
        for _ in 0..6 {
            s.idle_ended(slept(45));
        }
        assert_eq!(s.budget(), US * 50);
        let mut seen = vec![];
        for _ in 0..6 {
            s.idle_ended(slept(1000));
            seen.push(s.budget().as_micros());
        }
        assert_eq!(seen, [25, 12, 6, 3, 0, 0]);
    }

    #[test]
    fn the_budget_grows_only_as_far_as_the_gaps_need() {
        let mut s = Spin::new(SpinConfig::default());
        for _ in 0..10 {
            s.idle_ended(slept(10));
        }
        assert_eq!(s.budget(), US * 16, "a 16 us spin catches 10 us gaps");
    }

    #[test]
    fn work_caught_while_spinning_keeps_the_budget() {
        let mut s = Spin::new(SpinConfig::default());
        for _ in 0..3 {
            s.idle_ended(slept(10));
        }
        let b = s.budget();
        s.idle_ended(Idle::Caught { after: US });
        assert_eq!(s.budget(), b);
        assert_eq!(
            s.counts(),
            SpinCounts {
                caught: 1,
                slept: 3
            }
        );
    }

    #[test]
    fn no_spin_right_after_ringing_a_sleeping_peer() {
        let mut s = Spin::new(SpinConfig::default());
        for _ in 0..4 {
            s.idle_ended(slept(10));
        }
        let b = s.budget();
        s.rang_peer();
        assert_eq!(
            s.budget(),
            Duration::ZERO,
            "the peer is waking: give it the CPU"
        );
        // The sleep that followed says nothing about the spin: the budget stays.
        s.idle_ended(slept(3));
        assert_eq!(s.budget(), b);
    }

    #[test]
    fn max_zero_never_spins() {
        let mut s = Spin::new(SpinConfig {
            max: Duration::ZERO,
            start: US * 2,
        });
        for _ in 0..10 {
            s.idle_ended(slept(0));
            s.idle_ended(slept(1));
            assert_eq!(s.budget(), Duration::ZERO);
        }
    }

    proptest! {
        /// Whatever happens, the budget is zero or within [start, max].
        #[test]
        fn budget_stays_within_its_bounds(
            max_us in 0u64..200,
            start_us in 1u64..20,
            events in proptest::collection::vec((0u8..3, 0u64..500), 0..200)
        ) {
            let cfg = SpinConfig { max: US * max_us as u32, start: US * start_us as u32 };
            let mut s = Spin::new(cfg);
            for (kind, us) in events {
                match kind {
                    0 => s.idle_ended(slept(us)),
                    1 => s.idle_ended(Idle::Caught { after: US * us as u32 }),
                    _ => s.rang_peer(),
                }
                let b = s.budget();
                prop_assert!(b <= cfg.max);
                prop_assert!(b.is_zero() || b >= cfg.start.min(cfg.max));
            }
        }
    }
}
