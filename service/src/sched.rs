//! The scheduling class of a data-path thread, set on the calling thread (Linux classes
//! belong to threads): a nice level with `setpriority(2)` on the thread's id, or
//! `SCHED_FIFO` with `sched_setscheduler(2)` and `SCHED_RESET_ON_FORK`, so that nothing the
//! thread starts inherits real time. Two system calls; no crate is needed for them.
//!
//! Real time runs a thread ahead of every normal one, as the kernel runs its softirqs ahead
//! of user tasks, and is safe only with the kernel's real-time throttling on
//! (`kernel.sched_rt_runtime_us`, 95% of each second by default): a real-time thread that
//! never sleeps then leaves the machine the rest. [`apply`] refuses it where the throttling
//! is off.
#![allow(unsafe_code)]

use std::io;

/// A scheduling class for a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Leave the thread as it is.
    Normal,
    /// `SCHED_OTHER` at this nice level (-20..=19).
    Nice(i32),
    /// `SCHED_FIFO` at this priority (1..=99).
    Fifo(u32),
}

/// Why a class could not be set.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    /// The thread may not take the class.
    #[error("{what} is not permitted ({err}): it needs {needs}")]
    NotPermitted {
        /// The class asked for.
        what: String,
        /// What would permit it.
        needs: String,
        /// The system call's error.
        err: io::Error,
    },
    /// Real time asked for where the kernel does not throttle it.
    #[error("real-time scheduling refused: the kernel's real-time throttling is off (kernel.sched_rt_runtime_us = -1), so a busy real-time thread could take a core from everything else")]
    Unthrottled,
    /// Any other failure of the system call.
    #[error("{what}: {0}", what = .1)]
    Other(io::Error, String),
}

/// Sets `class` on the calling thread.
pub fn apply(class: Class) -> Result<(), SchedError> {
    match class {
        Class::Normal => Ok(()),
        Class::Nice(level) => {
            // SAFETY: gettid takes no arguments and cannot fail.
            let tid = unsafe { libc::gettid() };
            // SAFETY: plain integer arguments; PRIO_PROCESS with a thread id sets that
            // thread's nice level alone (Linux).
            let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, level) };
            check(
                r,
                || format!("nice level {level}"),
                || {
                    format!("CAP_SYS_NICE, or LimitNICE={} or more (RLIMIT_NICE) and setpriority allowed by the unit's SystemCallFilter=", 20 - level)
                },
            )
        }
        Class::Fifo(priority) => {
            if rt_unthrottled(
                std::fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us")
                    .ok()
                    .as_deref(),
            ) {
                return Err(SchedError::Unthrottled);
            }
            let param = libc::sched_param {
                sched_priority: priority as libc::c_int,
            };
            // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the
            // whole call.
            let r = unsafe {
                libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
            };
            check(
                r,
                || format!("SCHED_FIFO at priority {priority}"),
                || {
                    format!("CAP_SYS_NICE, or LimitRTPRIO={priority} or more (RLIMIT_RTPRIO), and the unit's RestrictRealtime=no with sched_setscheduler allowed by its SystemCallFilter=")
                },
            )
        }
    }
}

/// The calling thread's scheduling policy (`SCHED_OTHER`, `SCHED_FIFO`, ...).
pub fn policy() -> io::Result<libc::c_int> {
    // SAFETY: pid 0 is the calling thread; no pointer is passed.
    let r = unsafe { libc::sched_getscheduler(0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r & !libc::SCHED_RESET_ON_FORK)
}

/// Whether the text of `kernel.sched_rt_runtime_us` says real time is not throttled; an
/// unreadable value (a unit's `ProcSubset=pid` hides /proc/sys) is taken as the kernel's
/// default, throttled.
fn rt_unthrottled(text: Option<&str>) -> bool {
    text.is_some_and(|t| t.trim() == "-1")
}

fn check(
    r: libc::c_int,
    what: impl FnOnce() -> String,
    needs: impl FnOnce() -> String,
) -> Result<(), SchedError> {
    if r == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Err(SchedError::NotPermitted {
            what: what(),
            needs: needs(),
            err,
        }),
        _ => Err(SchedError::Other(err, what())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_minus_one_is_unthrottled() {
        assert!(rt_unthrottled(Some("-1\n")));
        assert!(!rt_unthrottled(Some("950000\n")));
        assert!(!rt_unthrottled(None));
    }

    /// On a thread of its own: normal leaves it as it was; a nice level above the current
    /// one is always permitted and is read back; real time is either set (and read back) or
    /// refused with what would permit it.
    #[test]
    fn a_thread_takes_its_class_or_says_what_it_needs() {
        std::thread::spawn(|| {
            let before = policy().unwrap();
            apply(Class::Normal).unwrap();
            assert_eq!(policy().unwrap(), before);
            apply(Class::Nice(19)).unwrap();
            // SAFETY: as in `apply`.
            let tid = unsafe { libc::gettid() };
            // SAFETY: plain integer arguments.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
            assert_eq!(nice, 19);
            match apply(Class::Fifo(1)) {
                Ok(()) => assert_eq!(policy().unwrap(), libc::SCHED_FIFO),
                Err(SchedError::NotPermitted { needs, .. }) => {
                    assert!(needs.contains("LimitRTPRIO=1"), "{needs}")
                }
                Err(SchedError::Unthrottled) => {}
                Err(e) => panic!("{e}"),
            }
        })
        .join()
        .unwrap();
    }
}
