//! Listening sockets kept across a restart in systemd's file descriptor store
//! (`FileDescriptorStoreMax=`, sd_notify(3) `FDSTORE=1`): while no process of the service
//! runs, the kernel still completes the connections peers make and queues them on the
//! socket the service manager holds, and the next process takes the socket back at start
//! (`LISTEN_FDS`, `LISTEN_FDNAMES`) and accepts them. A restart then costs a peer the time
//! between two processes, not a refused connection and a backoff.
//!
//! Taking the passed descriptors turns raw numbers into owned ones, which needs `unsafe`:
//! this module alone in the crate allows it, for that one call.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the passed descriptors are taken: each is owned once.
static TAKEN: AtomicBool = AtomicBool::new(false);
/// Set once the service manager is known to keep a descriptor of ours: it passed one, or
/// took one.
static KEEPING: AtomicBool = AtomicBool::new(false);

/// The descriptors the service manager passed at start, by name.
#[derive(Debug, Default)]
pub struct Inherited(HashMap<String, OwnedFd>);

impl Inherited {
    /// Takes the descriptors passed to this process by the service manager (`LISTEN_PID`
    /// names it), by their `LISTEN_FDNAMES`, and by a predecessor handing over to it
    /// ([`crate::handover`]); none when it was not started so, or when they were taken
    /// already.
    pub fn take() -> Inherited {
        let mut all = Inherited::from_manager();
        for (name, fd) in crate::handover::take_passed() {
            // A name passed both ways: the predecessor's is the one in use.
            all.0.insert(name, fd);
        }
        if !all.0.is_empty() {
            KEEPING.store(true, Ordering::SeqCst);
        }
        all
    }

    /// The service manager's part of [`Inherited::take`].
    fn from_manager() -> Inherited {
        if TAKEN.swap(true, Ordering::SeqCst) {
            return Inherited::default();
        }
        let fds = match sd_notify::listen_fds_with_names() {
            Ok(fds) => fds,
            Err(e) => {
                // Passed, but not as the protocol says (names and count apart): closed, so
                // that none keeps its address bound unseen.
                tracing::warn!(
                    "descriptors passed by the service manager, unreadable: {e}; closed"
                );
                for fd in sd_notify::listen_fds().into_iter().flatten() {
                    // SAFETY: as below: passed to this process, owned by nobody else in it.
                    drop(unsafe { OwnedFd::from_raw_fd(fd) });
                }
                return Inherited::default();
            }
        };
        let mut by_name = HashMap::new();
        for (fd, name) in fds {
            // SAFETY: the service manager passed `fd` to this process (LISTEN_PID is ours,
            // checked by `listen_fds`), open and owned by nobody else in it; TAKEN makes
            // this the only place that turns it into an owned descriptor. A name passed twice
            // closes the first.
            by_name.insert(name, unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Inherited(by_name)
    }

    /// The descriptor passed as `name`, taken out.
    pub fn remove(&mut self, name: &str) -> Option<OwnedFd> {
        self.0.remove(name)
    }

    /// Those named `names`, taken out.
    pub fn split_off(&mut self, names: &[&str]) -> Inherited {
        Inherited(
            names
                .iter()
                .filter_map(|n| self.0.remove_entry(*n))
                .collect(),
        )
    }

    /// The names of those not taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// Whether the service manager keeps descriptors for this service: `$FDSTORE`, the store's
/// size, which systemd 254 and later sets and the unit sets for older ones.
pub fn enabled() -> bool {
    std::env::var("FDSTORE").is_ok_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0))
        && std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// Whether the service manager keeps a descriptor of ours: one was passed at start or
/// stored since ([`store`]), with a store [`enabled`].
pub fn keeping() -> bool {
    enabled() && KEEPING.load(Ordering::SeqCst)
}

/// Whether the service manager would take a message about the store from this process now:
/// a store [`enabled`], and the main process (a successor in an upgrade is not, until its
/// predecessor, which stored what it passed, names it).
fn heard() -> bool {
    enabled() && crate::handover::is_main()
}

/// Asks the service manager to keep `fd` as `name`, replacing what it kept under that name
/// (the old one is removed first); nothing without a store ([`enabled`]), nor from a
/// successor not yet ready.
pub fn store(name: &str, fd: BorrowedFd<'_>) -> std::io::Result<()> {
    if !heard() {
        return Ok(());
    }
    forget(name)?;
    sd_notify::notify_with_fds(
        &[
            sd_notify::NotifyState::FdStore,
            sd_notify::NotifyState::FdName(name),
        ],
        &[fd],
    )?;
    KEEPING.store(true, Ordering::SeqCst);
    Ok(())
}

/// Asks the service manager to drop what it keeps as `name` (closing its copy); nothing
/// when it would not hear it.
pub fn forget(name: &str) -> std::io::Result<()> {
    if !heard() {
        return Ok(());
    }
    sd_notify::notify(&[
        sd_notify::NotifyState::FdStoreRemove,
        sd_notify::NotifyState::FdName(name),
    ])
}
