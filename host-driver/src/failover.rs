//! Which IOC carries sd0 when the host has standbys (`fabric.standby`): the active one, the
//! warm standby beside it, when to move to the standby (the active lost, or its NIC down
//! while the standby's is up), when to go back to the primary (`fabric.failback_after_s`),
//! when to try a standby again, and every move counted with its cause and the time it took.
//! Sans-IO: the supervisor reports what happened and does what it is told.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// Moves kept for `splitnetctl status` (the counts cover every one).
pub const MOVES_KEPT: usize = 16;

/// Why sd0 moved to another IOC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The active IOC's session closed or failed (its process died, it said goodbye).
    Closed,
    /// The active IOC was silent for the agreed liveness intervals (its machine or its
    /// fabric port gone).
    Silent,
    /// The active IOC's NIC lost link while the standby's was up.
    NicDown,
    /// Back to the primary, `fabric.failback_after_s` after it came back.
    Failback,
}

impl Cause {
    /// Every cause, in the order metrics list them.
    pub const ALL: [Cause; 4] = [
        Cause::Closed,
        Cause::Silent,
        Cause::NicDown,
        Cause::Failback,
    ];

    /// Its name in metrics and status.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Closed => "closed",
            Cause::Silent => "silent",
            Cause::NicDown => "nic_down",
            Cause::Failback => "failback",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One move from IOC `from` to IOC `to` (indices: 0 the primary, then `fabric.standby`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The IOC it left.
    pub from: usize,
    /// The IOC it moved to.
    pub to: usize,
    /// Why.
    pub cause: Cause,
    /// When the move began (the active's end was seen).
    pub at: Instant,
    /// From then until the new IOC answered Activate Ok (`None`: not yet, or never).
    pub took: Option<Duration>,
}

/// What the supervisor does when the active IOC's session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Activate the warm standby, IOC `to`.
    Promote(usize),
    /// No standby is ready: connect again, trying every IOC in order.
    Reconnect,
}

/// The state of the host's IOCs.
#[derive(Debug, Clone)]
pub struct Failover {
    /// How many IOCs (the primary and the standbys).
    count: usize,
    active: Option<usize>,
    /// The warm standby, and since when it is ready (handshake done, MAC matching, NIC up).
    standby: Option<usize>,
    ready_since: Option<Instant>,
    failback_after: Option<Duration>,
    /// When each IOC may be tried as a standby again, and the wait after its next failure.
    retry_at: Vec<Option<Instant>>,
    backoff: Vec<Duration>,
    retry_min: Duration,
    retry_max: Duration,
    moves: VecDeque<Move>,
    counts: [u64; Cause::ALL.len()],
}

impl Failover {
    /// `count` IOCs (at least 1), failing back after `failback_after` (`None`: never), a
    /// failed standby tried again after `retry_min` doubling to `retry_max`.
    pub fn new(
        count: usize,
        failback_after: Option<Duration>,
        retry_min: Duration,
        retry_max: Duration,
    ) -> Failover {
        let count = count.max(1);
        Failover {
            count,
            active: None,
            standby: None,
            ready_since: None,
            failback_after,
            retry_at: vec![None; count],
            backoff: vec![retry_min; count],
            retry_min,
            retry_max: retry_max.max(retry_min),
            moves: VecDeque::new(),
            counts: [0; Cause::ALL.len()],
        }
    }

    /// The active IOC.
    pub fn active(&self) -> Option<usize> {
        self.active
    }

    /// The warm standby.
    pub fn standby(&self) -> Option<usize> {
        self.standby
    }

    /// Whether the warm standby is ready to take over.
    pub fn standby_ready(&self) -> bool {
        self.ready_since.is_some()
    }

    /// A session to IOC `i` came up as the active one (connected directly).
    pub fn connected(&mut self, i: usize) {
        if self.standby == Some(i) {
            self.standby = None;
            self.ready_since = None;
        }
        self.active = Some(i);
        self.backoff[i] = self.retry_min;
        self.retry_at[i] = None;
    }

    /// The IOC to open a standby session to now, if any: none is warm, and the first other
    /// IOC in order whose retry time has come.
    pub fn standby_to_try(&self, now: Instant) -> Option<usize> {
        if self.standby.is_some() || self.count < 2 {
            return None;
        }
        (0..self.count)
            .filter(|i| Some(*i) != self.active)
            .find(|i| self.retry_at[*i].is_none_or(|t| t <= now))
    }

    /// When, after `now`, [`Failover::standby_to_try`] next has an answer (none while it has
    /// one now), or a failback falls due.
    pub fn next_timer(&self, now: Instant) -> Option<Instant> {
        let retry = (self.standby.is_none() && self.standby_to_try(now).is_none())
            .then(|| {
                (0..self.count)
                    .filter(|i| Some(*i) != self.active)
                    .filter_map(|i| self.retry_at[i])
                    .filter(|t| *t > now)
                    .min()
            })
            .flatten();
        let failback = self.failback_at();
        [retry, failback].into_iter().flatten().min()
    }

    /// A standby session to IOC `i` came up (not ready until [`Failover::standby_ready_now`]).
    pub fn standby_up(&mut self, i: usize) {
        self.standby = Some(i);
        self.ready_since = None;
    }

    /// The warm standby is ready (`true`) or not (its NIC is down, or it has not answered
    /// yet).
    pub fn standby_ready_now(&mut self, ready: bool, now: Instant) {
        match (ready, self.ready_since) {
            (true, None) => self.ready_since = Some(now),
            (false, _) => self.ready_since = None,
            _ => {}
        }
    }

    /// Trying IOC `i` as a standby failed, or its standby session ended: tried again after
    /// the backoff.
    pub fn standby_failed(&mut self, i: usize, now: Instant) {
        if self.standby == Some(i) {
            self.standby = None;
            self.ready_since = None;
        }
        self.retry_at[i] = Some(now + self.backoff[i]);
        self.backoff[i] = (self.backoff[i] * 2).min(self.retry_max);
    }

    /// The active IOC's session ended at `now` for `cause`: move to the standby if one is
    /// ready, else reconnect. The IOC left may be tried as a standby at once.
    pub fn active_ended(&mut self, cause: Cause, now: Instant) -> Next {
        let from = self.active.take();
        if let Some(f) = from {
            self.retry_at[f] = None;
        }
        match (from, self.standby, self.ready_since) {
            (Some(from), Some(to), Some(_)) => {
                self.begin_move(from, to, cause, now);
                Next::Promote(to)
            }
            _ => Next::Reconnect,
        }
    }

    /// Whether the host should go back to the primary now: a failback is configured, the
    /// active IOC is not the primary, and the primary has been a ready standby for that long.
    pub fn failback_due(&self, now: Instant) -> bool {
        self.failback_at().is_some_and(|t| t <= now)
    }

    fn failback_at(&self) -> Option<Instant> {
        let after = self.failback_after?;
        match (self.active, self.standby, self.ready_since) {
            (Some(a), Some(0), Some(since)) if a != 0 => Some(since + after),
            _ => None,
        }
    }

    /// The host goes back to the primary at `now` (after [`Failover::failback_due`]): the
    /// primary, the standby, becomes active.
    pub fn fail_back(&mut self, now: Instant) -> Option<usize> {
        if !self.failback_due(now) {
            return None;
        }
        let from = self.active.take()?;
        self.begin_move(from, 0, Cause::Failback, now);
        Some(0)
    }

    fn begin_move(&mut self, from: usize, to: usize, cause: Cause, now: Instant) {
        self.active = Some(to);
        self.standby = None;
        self.ready_since = None;
        self.counts[cause as usize] += 1;
        if self.moves.len() == MOVES_KEPT {
            self.moves.pop_front();
        }
        self.moves.push_back(Move {
            from,
            to,
            cause,
            at: now,
            took: None,
        });
    }

    /// The IOC moved to answered Activate Ok at `now`: the move is complete.
    pub fn activated(&mut self, now: Instant) -> Option<Move> {
        let m = self.moves.back_mut().filter(|m| m.took.is_none())?;
        m.took = Some(now.saturating_duration_since(m.at));
        Some(*m)
    }

    /// The moves kept, oldest first.
    pub fn moves(&self) -> impl Iterator<Item = &Move> {
        self.moves.iter()
    }

    /// Moves made for `cause` since start.
    pub fn count(&self, cause: Cause) -> u64 {
        self.counts[cause as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn two(failback: Option<Duration>) -> (Failover, Instant) {
        let mut f = Failover::new(2, failback, ms(100), ms(800));
        f.connected(0);
        (f, Instant::now())
    }

    #[test]
    fn a_ready_standby_takes_over_when_the_active_ends_and_the_move_is_timed() {
        let (mut f, t0) = two(None);
        assert_eq!(f.standby_to_try(t0), Some(1));
        f.standby_up(1);
        assert_eq!(f.standby_to_try(t0), None, "one warm standby at a time");
        // Not ready yet (its NIC state unknown): no move, a reconnect.
        let mut g = f.clone();
        assert_eq!(g.active_ended(Cause::Closed, t0), Next::Reconnect);
        assert_eq!(g.active(), None);
        f.standby_ready_now(true, t0);
        assert_eq!(f.active_ended(Cause::Silent, t0 + ms(5)), Next::Promote(1));
        assert_eq!((f.active(), f.standby()), (Some(1), None));
        let m = f.activated(t0 + ms(7)).expect("a move in progress");
        assert_eq!(
            (m.from, m.to, m.cause, m.took),
            (0, 1, Cause::Silent, Some(ms(2)))
        );
        assert_eq!(f.activated(t0 + ms(9)), None, "completed once");
        assert_eq!(f.count(Cause::Silent), 1);
        // The IOC it left is tried as the standby at once.
        assert_eq!(f.standby_to_try(t0 + ms(9)), Some(0));
    }

    #[test]
    fn a_standby_whose_nic_goes_down_is_not_ready() {
        let (mut f, t0) = two(None);
        f.standby_up(1);
        f.standby_ready_now(true, t0);
        f.standby_ready_now(false, t0 + ms(1));
        assert!(!f.standby_ready());
        assert_eq!(f.active_ended(Cause::NicDown, t0 + ms(2)), Next::Reconnect);
    }

    #[test]
    fn a_failed_standby_is_tried_again_with_backoff() {
        let (mut f, t0) = two(None);
        f.standby_failed(1, t0);
        assert_eq!(f.standby_to_try(t0), None);
        assert_eq!(f.next_timer(t0), Some(t0 + ms(100)));
        assert_eq!(f.standby_to_try(t0 + ms(100)), Some(1));
        f.standby_failed(1, t0 + ms(100));
        assert_eq!(f.next_timer(t0), Some(t0 + ms(300)), "doubled");
        for _ in 0..10 {
            f.standby_failed(1, t0);
        }
        assert_eq!(f.next_timer(t0), Some(t0 + ms(800)), "capped");
        // Up again: the backoff starts over after its next failure.
        f.standby_up(1);
        assert_eq!(f.next_timer(t0), None);
    }

    #[test]
    fn failback_waits_for_the_primary_to_be_ready_that_long_and_never_without_it() {
        let (mut f, t0) = two(Some(Duration::from_secs(30)));
        f.standby_up(1);
        f.standby_ready_now(true, t0);
        assert!(
            !f.failback_due(t0 + Duration::from_secs(60)),
            "on the primary already"
        );
        assert_eq!(f.active_ended(Cause::Closed, t0), Next::Promote(1));
        f.activated(t0);
        f.standby_up(0);
        f.standby_ready_now(true, t0 + ms(10));
        assert!(!f.failback_due(t0 + Duration::from_secs(30)));
        assert_eq!(
            f.next_timer(t0),
            Some(t0 + ms(10) + Duration::from_secs(30))
        );
        // Its NIC flaps: the wait starts over.
        f.standby_ready_now(false, t0 + Duration::from_secs(20));
        f.standby_ready_now(true, t0 + Duration::from_secs(21));
        assert!(!f.failback_due(t0 + Duration::from_secs(40)));
        let at = t0 + Duration::from_secs(51);
        assert_eq!(f.fail_back(at), Some(0));
        assert_eq!((f.active(), f.standby()), (Some(0), None));
        assert_eq!(f.count(Cause::Failback), 1);
        let (mut never, t0) = two(None);
        never.standby_up(1);
        never.standby_ready_now(true, t0);
        never.active_ended(Cause::Closed, t0);
        never.standby_up(0);
        never.standby_ready_now(true, t0);
        assert!(!never.failback_due(t0 + Duration::from_secs(86_400)));
        assert_eq!(never.fail_back(t0 + Duration::from_secs(86_400)), None);
    }

    #[test]
    fn a_single_ioc_never_has_a_standby() {
        let mut f = Failover::new(1, Some(ms(1)), ms(100), ms(800));
        f.connected(0);
        let t0 = Instant::now();
        assert_eq!(f.standby_to_try(t0), None);
        assert_eq!(f.next_timer(t0), None);
        assert_eq!(f.active_ended(Cause::Closed, t0), Next::Reconnect);
    }

    #[test]
    fn the_moves_kept_are_bounded_and_the_counts_cover_all() {
        let (mut f, t0) = two(None);
        for n in 0..40u64 {
            let i = f.active().expect("active");
            let other = 1 - i;
            f.standby_up(other);
            f.standby_ready_now(true, t0);
            assert_eq!(
                f.active_ended(Cause::Closed, t0 + ms(n)),
                Next::Promote(other)
            );
        }
        assert_eq!(f.moves().count(), MOVES_KEPT);
        assert_eq!(f.count(Cause::Closed), 40);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Up(usize),
        Ready(bool),
        Failed(usize),
        Ended(Cause),
        Connected(usize),
        Activated,
        FailBack,
        Wait(u64),
    }

    fn op(n: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..n).prop_map(Op::Up),
            any::<bool>().prop_map(Op::Ready),
            (0..n).prop_map(Op::Failed),
            prop::sample::select(Cause::ALL.to_vec()).prop_map(Op::Ended),
            (0..n).prop_map(Op::Connected),
            Just(Op::Activated),
            Just(Op::FailBack),
            (0..5_000u64).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Whatever happens, the active IOC is never the standby, a move goes only to the
        /// ready standby and only from the active, and a failback only to the primary.
        #[test]
        fn never_two_roles_at_once(n in 1usize..4, ops in prop::collection::vec(op(3), 0..64)) {
            let mut f = Failover::new(n, Some(ms(1_000)), ms(100), ms(800));
            let mut now = Instant::now();
            for o in ops {
                let (active, standby, ready) = (f.active(), f.standby(), f.standby_ready());
                match o {
                    Op::Up(i) if i < n && Some(i) != f.active() && f.standby_to_try(now) == Some(i) => f.standby_up(i),
                    Op::Ready(r) if f.standby().is_some() => f.standby_ready_now(r, now),
                    Op::Failed(i) if i < n && Some(i) != f.active() => f.standby_failed(i, now),
                    Op::Ended(c) if f.active().is_some() => match f.active_ended(c, now) {
                        Next::Promote(to) => {
                            prop_assert!(ready);
                            prop_assert_eq!(Some(to), standby);
                            prop_assert_ne!(Some(to), active);
                            prop_assert_eq!(f.active(), Some(to));
                        }
                        Next::Reconnect => {
                            prop_assert!(!(ready && standby.is_some()));
                            prop_assert_eq!(f.active(), None);
                        }
                    },
                    Op::Connected(i) if i < n && f.active().is_none() => f.connected(i),
                    Op::Activated => { f.activated(now); }
                    Op::FailBack => {
                        if let Some(to) = f.fail_back(now) {
                            prop_assert_eq!(to, 0);
                            prop_assert_eq!(standby, Some(0));
                            prop_assert!(active.is_some_and(|a| a != 0));
                        }
                    }
                    Op::Wait(d) => now += ms(d),
                    _ => {}
                }
                if let (Some(a), Some(s)) = (f.active(), f.standby()) {
                    prop_assert_ne!(a, s);
                }
                if f.standby().is_none() {
                    prop_assert!(!f.standby_ready());
                }
                prop_assert!(f.moves().count() <= MOVES_KEPT);
                // A timer never fires at once but for a failback due (no busy loop).
                if let Some(t) = f.next_timer(now) {
                    prop_assert!(t > now || f.failback_due(now));
                }
                prop_assert!(f.moves().all(|m| m.from != m.to));
            }
        }
    }
}
