//! Spin polling over shared memory: before the loop sleeps, it polls the IOC's ring and
//! the TAP for an adaptive budget, which learns from how each idle period ended (caught by
//! the poll, or woken after a sleep).

use splitnet_config::HostConfig;
use splitnet_fabric::{FabricChannel, LinkReady};
use splitnet_messaging::adapter::shm::{Idle, Spin, SpinConfig};
use splitnet_messaging::adapter::Channel;
use splitnet_messaging::endpoint::{Lane, Link};
use splitnet_netif::tap::Tap;
use std::time::Instant;

/// The poll before sleeping of a link over shared memory, if configured.
pub fn configured(cfg: &HostConfig, ready: &LinkReady) -> Option<Spin> {
    let max = cfg.fabric.spin_max();
    (ready.is_shared_memory() && !max.is_zero()).then(|| {
        Spin::new(SpinConfig {
            max,
            ..SpinConfig::default()
        })
    })
}

/// Over shared memory, before the loop sleeps: polls the IOC's ring, and `tap` when it is
/// wanted, for the adaptive budget of `spin` (`adapter::shm::Spin`), with the doorbell
/// request withdrawn meanwhile (the IOC need not ring for what the poll finds). Then
/// asks for the doorbell again and says whether the loop may sleep ([`Link::prepare_sleep`]);
/// a TAP frame found is left to the reactor, whose next look finds it at once. Also
/// returns when the idle period began, if the poll found nothing. No poll while
/// operations wait for room in the ring: the room the IOC frees is what ends that wait,
/// and only its doorbell says so.
pub fn poll_before_sleep(
    spin: Option<&mut Spin>,
    link: &mut Link<FabricChannel>,
    tap: &Tap,
    tap_wanted: bool,
) -> (bool, Option<Instant>) {
    let Some(spin) = spin else {
        return (true, None);
    };
    if link.pending() > 0 {
        return (true, None);
    }
    if link.data_channel_mut().take_rang_peer() {
        spin.rang_peer();
    }
    let start = Instant::now();
    let budget = spin.budget();
    if budget.is_zero() {
        return (true, Some(start));
    }
    link.wake(Lane::Data);
    let mut caught = false;
    for i in 0u32.. {
        caught = link.data_channel_mut().input_pending()
            || (tap_wanted && i % 8 == 0 && tap.readable_now().unwrap_or(true));
        if caught || start.elapsed() >= budget {
            break;
        }
        std::hint::spin_loop();
    }
    if caught {
        spin.idle_ended(Idle::Caught {
            after: start.elapsed(),
        });
    }
    let sleep = link.prepare_sleep(Lane::Data);
    (sleep, (sleep && !caught).then_some(start))
}

/// The loop woke: if it had slept `since` an idle period began and woke for what a poll
/// could have caught (`woke_for_input`), `spin` learns how long it slept.
pub fn woke(spin: Option<&mut Spin>, since: Option<Instant>, woke_for_input: bool, now: Instant) {
    if let (Some(spin), Some(since), true) = (spin, since, woke_for_input) {
        spin.idle_ended(Idle::Slept {
            slept: now.duration_since(since),
        });
    }
}
