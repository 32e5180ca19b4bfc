//! A worker's poll before it sleeps (`fabric.spin_max_us`): when its event loop has nothing
//! left to run, the worker asks the descriptors its tasks wait on (the hosts' sockets or
//! doorbells, the NIC's packet sockets) whether any is readable, again and again for an
//! adaptive budget, before the runtime sleeps in `epoll_wait`. Work that arrives meanwhile
//! finds the thread awake: `epoll_wait` returns at once, with no wake-up of an idle vCPU.
//! The budget adapts as host-driver's does over shared memory ([`Spin`], halt-polling
//! style): it grows after sleeps that a longer poll would have caught, shrinks after long
//! ones, and stays zero for workers whose traffic comes in bursts far apart.
//!
//! Besides descriptors, the poll watches the worker's inbox of frames other workers hand it
//! ([`watch_queued`]: its byte count), which wakes the runtime through no descriptor of its
//! own. What else wakes it from another thread (the main thread's rare commands) and timers
//! falling due wait at most for the budget (`spin_max_us`, at most 1 ms). Like host-driver's,
//! the poll does not run right after the worker rang a sleeping host's doorbell ([`set_rang`]):
//! that host is waking up, maybe on this very core.
//!
//! Written here: tokio has no poll before it parks, only the `on_thread_park` hook this
//! runs from. The state is the worker thread's own ([`install`]), so the hook, the tasks
//! that register descriptors ([`watch`]) and the report ([`counts`]) meet without locks.

use splitnet_messaging::adapter::shm::{Idle, Spin, SpinConfig, SpinCounts};
use splitnet_netif::PollSet;
use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

thread_local! {
    static POLLER: RefCell<Option<Poller>> = const { RefCell::new(None) };
}

/// Whether the worker rang a sleeping peer's doorbell since it was last asked.
pub type RangProbe = Box<dyn FnMut() -> bool>;

/// The poll of one worker thread.
struct Poller {
    spin: Spin,
    set: PollSet,
    /// Counts of work queued by other threads (non-zero: work waits).
    queued: Vec<Arc<AtomicUsize>>,
    rang: Option<RangProbe>,
    /// When the idle period the runtime is sleeping in began (it did not end in the poll).
    idle_since: Option<Instant>,
}

/// Turns the poll on for this thread, up to `max` per idle period (zero: never polls, and
/// [`watch`] registers nothing). Called once by the worker thread before its runtime.
pub fn install(max: Duration) {
    let poller = (!max.is_zero()).then(|| Poller {
        spin: Spin::new(SpinConfig {
            max,
            ..SpinConfig::default()
        }),
        set: PollSet::new(),
        queued: Vec::new(),
        rang: None,
        idle_since: None,
    });
    POLLER.with_borrow_mut(|p| *p = poller);
}

/// Adds to this thread's poll a count that other threads raise when they queue work for it
/// (the inbox's bytes), for as long as the thread polls.
pub fn watch_queued(count: Arc<AtomicUsize>) {
    POLLER.with_borrow_mut(|p| {
        if let Some(p) = p.as_mut() {
            p.queued.push(count);
        }
    });
}

/// Sets what tells this thread's poll that the worker rang a sleeping peer's doorbell since
/// it last asked (no poll then).
pub fn set_rang(probe: RangProbe) {
    POLLER.with_borrow_mut(|p| {
        if let Some(p) = p.as_mut() {
            p.rang = Some(probe);
        }
    });
}

/// A descriptor in this thread's poll until dropped. Drop it before the descriptor closes
/// (a closed one only ends each poll at once, as if ready).
#[derive(Debug)]
pub struct Watch(Option<RawFd>);

/// Adds `fd` to this thread's poll, if it has one.
pub fn watch(fd: &impl AsFd) -> Watch {
    let fd = fd.as_fd().as_raw_fd();
    Watch(POLLER.with_borrow_mut(|p| {
        p.as_mut().map(|p| {
            p.set.insert(fd);
            fd
        })
    }))
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(fd) = self.0 {
            // During the thread's teardown the poller may be gone already.
            let _ = POLLER.try_with(|p| {
                if let Some(p) = p.borrow_mut().as_mut() {
                    p.set.remove(fd);
                }
            });
        }
    }
}

/// The runtime is about to sleep: polls the watched descriptors for the budget. One found
/// readable leaves the sleep nothing to wait for.
pub fn before_park() {
    POLLER.with_borrow_mut(|p| {
        let Some(p) = p.as_mut() else {
            return;
        };
        let start = Instant::now();
        p.idle_since = Some(start);
        if p.rang.as_mut().is_some_and(|rang| rang()) {
            p.spin.rang_peer();
        }
        let budget = p.spin.budget();
        if budget.is_zero() || p.set.is_empty() && p.queued.is_empty() {
            return;
        }
        loop {
            // An error (EINTR, ENOMEM) ends the poll like work would: the runtime's own
            // wait then says what there is.
            let queued = p.queued.iter().any(|c| c.load(Ordering::Relaxed) > 0);
            if queued || p.set.any_ready().unwrap_or(true) {
                p.spin.idle_ended(Idle::Caught {
                    after: start.elapsed(),
                });
                p.idle_since = None;
                return;
            }
            if start.elapsed() >= budget {
                return;
            }
            std::hint::spin_loop();
        }
    });
}

/// The runtime woke from its sleep: the budget learns how long the idle period lasted.
pub fn after_unpark() {
    POLLER.with_borrow_mut(|p| {
        let Some(p) = p.as_mut() else {
            return;
        };
        if let Some(since) = p.idle_since.take() {
            p.spin.idle_ended(Idle::Slept {
                slept: since.elapsed(),
            });
        }
    });
}

/// How this thread's idle periods ended (zero without a poll).
pub fn counts() -> SpinCounts {
    POLLER.with_borrow(|p| p.as_ref().map(|p| p.spin.counts()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    /// Idle periods as the runtime has them: a poll, then (unless it caught work) a sleep of
    /// `sleep` and the wake-up.
    fn idle(sleep: Duration) {
        before_park();
        std::thread::sleep(sleep);
        after_unpark();
    }

    #[test]
    fn short_sleeps_grow_a_poll_that_catches_work_and_long_ones_stop_it() {
        // A max far above any sleep of this test's but the long ones, so that a machine
        // busy with other tests cannot turn a short sleep into a long one.
        install(Duration::from_millis(50));
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let w = watch(&b);
        // The budget starts at zero: every idle period sleeps.
        idle(Duration::ZERO);
        assert_eq!(
            counts(),
            SpinCounts {
                caught: 0,
                slept: 1
            }
        );
        // Short sleeps grow it (to 4 ms in 12); then work already waiting is caught by the
        // poll, and the runtime's sleep is not counted.
        for _ in 0..12 {
            idle(Duration::ZERO);
        }
        a.write_all(b"x").unwrap();
        let slept = counts().slept;
        before_park();
        after_unpark();
        assert_eq!(counts(), SpinCounts { caught: 1, slept });
        // Sleeps beyond the max halve it to zero: then even waiting work is not polled for.
        let mut byte = [0u8; 1];
        b.read_exact(&mut byte).unwrap();
        for _ in 0..14 {
            idle(Duration::from_millis(60));
        }
        a.write_all(b"y").unwrap();
        let before = counts();
        before_park();
        after_unpark();
        assert_eq!(
            counts().caught,
            before.caught,
            "no poll once long sleeps shrank it"
        );
        // A descriptor no longer watched is not polled: with a budget again (short sleeps
        // grow it from zero), the idle period still sleeps (the byte still unread).
        drop(w);
        for _ in 0..12 {
            idle(Duration::ZERO);
        }
        let before = counts();
        before_park();
        after_unpark();
        assert_eq!(counts().caught, before.caught);
        assert_eq!(counts().slept, before.slept + 1);
    }

    #[test]
    fn work_queued_by_another_thread_is_caught_and_a_rung_peer_skips_a_poll() {
        install(Duration::from_millis(50));
        let queued = Arc::new(AtomicUsize::new(0));
        watch_queued(queued.clone());
        let rang = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probe = rang.clone();
        set_rang(Box::new(move || probe.swap(false, Ordering::Relaxed)));
        for _ in 0..12 {
            idle(Duration::ZERO);
        }
        // Frames in the inbox end the poll.
        queued.store(1500, Ordering::Relaxed);
        let before = counts();
        before_park();
        after_unpark();
        assert_eq!(counts().caught, before.caught + 1);
        // Right after ringing a sleeping peer: no poll, though work waits.
        rang.store(true, Ordering::Relaxed);
        before_park();
        after_unpark();
        assert_eq!(counts().caught, before.caught + 1, "no poll after a ring");
        // The next idle period polls again.
        before_park();
        after_unpark();
        assert_eq!(counts().caught, before.caught + 2);
    }

    #[test]
    fn without_a_poll_nothing_is_watched_or_counted() {
        install(Duration::ZERO);
        let (_a, b) = UnixStream::pair().unwrap();
        let w = watch(&b);
        assert!(w.0.is_none());
        idle(Duration::ZERO);
        assert_eq!(counts(), SpinCounts::default());
    }
}
