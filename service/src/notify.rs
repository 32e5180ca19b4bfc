//! systemd notifications: READY, STATUS, STOPPING and a watchdog fed from the data path.
//! Every call is a no-op when the daemon was not started by systemd (no NOTIFY_SOCKET).

use std::time::{Duration, Instant};

/// READY=1 with a status line; in a successor ([`crate::handover`]), "ready" to the
/// predecessor instead, which tells the service manager that this is its main process now
/// (a message from this one before that would be refused).
pub fn ready(status: &str) {
    if crate::handover::ready() {
        return;
    }
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ]);
}

/// STATUS= line (nothing while the service manager would not take it from this process:
/// [`crate::handover::is_main`]).
pub fn status(status: &str) {
    if crate::handover::is_main() {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(status)]);
    }
}

/// STOPPING=1 (nothing from a process that is not the main one).
pub fn stopping() {
    if crate::handover::is_main() {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    }
}

/// The service watchdog (`WatchdogSec=`). The data path calls [`Watchdog::kick`] on every
/// turn of its loop, so a loop that stops turning stops feeding it and systemd restarts us.
#[derive(Debug)]
pub struct Watchdog {
    every: Option<Duration>,
    last: Instant,
}

impl Watchdog {
    /// Reads `WATCHDOG_USEC`; disabled when systemd did not ask for a watchdog.
    pub fn from_env() -> Watchdog {
        let every = sd_notify::watchdog_enabled()
            .map(|d| d / 2)
            .filter(|d| !d.is_zero());
        Watchdog {
            every,
            last: Instant::now(),
        }
    }

    /// A watchdog that never sends (threads other than the one systemd should watch).
    pub fn disabled() -> Watchdog {
        Watchdog {
            every: None,
            last: Instant::now(),
        }
    }

    /// Sends WATCHDOG=1 if half the watchdog interval passed since the last one.
    pub fn kick(&mut self, now: Instant) {
        if let Some(every) = self.every {
            if now.duration_since(self.last) >= every && crate::handover::is_main() {
                self.last = now;
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            }
        }
    }
}
