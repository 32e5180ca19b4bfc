//! A queue's poll before it sleeps (`fabric.spin_max_us`): before the loop sleeps, it looks
//! for what would wake it, again and again for an adaptive budget that learns from how each
//! idle period ended (caught by the poll, or woken after a sleep; [`Spin`]).
//!
//! - Over shared memory it reads the IOC's ring, with the doorbell request withdrawn
//!   meanwhile (the IOC need not ring for what the poll finds), and the TAP; over RDMA
//!   likewise the data queue pair's completion queue (`Channel::input_pending`: no system
//!   call for either).
//! - Over a socket it asks the fabric's sockets and the TAP, with one `poll(2)` over them.
//!
//! Work found at the first look is no idle period (the last turn left it, or it came
//! meanwhile): the loop goes on at once, and neither the budget nor the counts change.
//!
//! What the poll finds is left to the reactor: the loop's next look finds it at once, with no
//! wake-up of an idle vCPU. The rest (signals, rtnetlink reports, timers) waits for the
//! budget at most (`spin_max_us`, at most 1 ms).

use splitnet_config::HostConfig;
use splitnet_fabric::{FabricChannel, LinkReady};
use splitnet_messaging::adapter::shm::{Idle, Spin, SpinConfig, SpinCounts};
use splitnet_messaging::adapter::Channel;
use splitnet_messaging::endpoint::{Lane, Link};
use splitnet_netif::tap::Tap;
use splitnet_netif::PollSet;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

/// A queue's poll before it sleeps.
#[derive(Debug)]
pub struct Poll {
    spin: Spin,
    /// Over a socket: the fabric's sockets, and the same with the TAP's. `None` where the
    /// data channel tells its input without a system call (shared memory, RDMA).
    fds: Option<[PollSet; 2]>,
}

impl Poll {
    /// The poll of a connection on `ready` serving `tap`, if configured.
    pub fn configured(cfg: &HostConfig, ready: &LinkReady, tap: &Tap) -> Option<Poll> {
        let max = cfg.fabric.spin_max();
        if max.is_zero() {
            return None;
        }
        // `is_shared_memory`: no socket to wait on for writing (a ring or a queue pair).
        let fds = (!ready.is_shared_memory()).then(|| {
            let mut fabric = PollSet::new();
            fabric.insert(ready.data.as_fd().as_raw_fd());
            fabric.insert(ready.ctrl.as_fd().as_raw_fd());
            let mut all = fabric.clone();
            all.insert(tap.as_fd().as_raw_fd());
            [fabric, all]
        });
        Some(Poll {
            spin: Spin::new(SpinConfig {
                max,
                ..SpinConfig::default()
            }),
            fds,
        })
    }

    /// Whether the poll looks for input on `lane` (over shared memory and RDMA, the data
    /// lane's only).
    pub fn covers(&self, lane: Lane) -> bool {
        self.fds.is_some() || lane == Lane::Data
    }

    /// How the idle periods ended so far.
    pub fn counts(&self) -> SpinCounts {
        self.spin.counts()
    }
}

/// Before the loop sleeps, with the data lane's [`Link::prepare_sleep`] done (and over a
/// socket the control lane's too): polls for the budget what would wake the loop, the TAP
/// only when it is `tap_wanted`. Says whether the loop may sleep (over shared memory or
/// RDMA the data channel is asked to wake it again after the poll, which may find input
/// waiting), and when the idle period began if the poll found nothing. No poll while
/// operations wait for room or for the socket: what frees it is what ends that wait.
pub fn poll_before_sleep(
    poll: Option<&mut Poll>,
    link: &mut Link<FabricChannel>,
    tap: &Tap,
    tap_wanted: bool,
) -> (bool, Option<Instant>) {
    let Some(poll) = poll else {
        return (true, None);
    };
    if link.pending() > 0 {
        return (true, None);
    }
    if link.data_channel_mut().take_rang_peer() {
        poll.spin.rang_peer();
    }
    let start = Instant::now();
    let budget = poll.spin.budget();
    if budget.is_zero() {
        return (true, Some(start));
    }
    if poll.fds.is_none() {
        link.wake(Lane::Data);
    }
    // The turn at which the poll found work, if it did.
    let mut found = None;
    for i in 0u32.. {
        let ready = match &mut poll.fds {
            None => {
                link.data_channel_mut().input_pending()
                    || (tap_wanted && i % 8 == 0 && tap.readable_now().unwrap_or(true))
            }
            // An error (EINTR, ENOMEM) ends the poll as work would: the reactor's own wait
            // then says what there is.
            Some([fabric, all]) => {
                let set = if tap_wanted { all } else { fabric };
                set.any_ready().unwrap_or(true)
            }
        };
        if ready {
            found = Some(i);
            break;
        }
        if start.elapsed() >= budget {
            break;
        }
        std::hint::spin_loop();
    }
    // Found at the first look: work was waiting, no idle period to learn from.
    if found.is_some_and(|i| i > 0) {
        poll.spin.idle_ended(Idle::Caught {
            after: start.elapsed(),
        });
    }
    // A socket needs no asking again.
    let sleep = poll.fds.is_some() || link.prepare_sleep(Lane::Data);
    (sleep, (sleep && found.is_none()).then_some(start))
}

/// The loop woke: if it had slept `since` an idle period began and woke for what a poll
/// could have caught (`woke_for_input`), the budget learns how long it slept.
pub fn woke(poll: Option<&mut Poll>, since: Option<Instant>, woke_for_input: bool, now: Instant) {
    if let (Some(poll), Some(since), true) = (poll, since, woke_for_input) {
        poll.spin.idle_ended(Idle::Slept {
            slept: now.duration_since(since),
        });
    }
}
