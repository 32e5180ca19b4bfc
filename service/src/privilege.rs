//! A daemon run by hand as root holds every capability. Once its privileged set-up is done
//! (sockets, interfaces, listeners) it keeps only the ones it needs for the rest of its life,
//! in every set, the bounding set included, so nothing it gave up can come back. Under
//! systemd the unit gives it those alone already (`AmbientCapabilities=`,
//! `CapabilityBoundingSet=`), and nothing changes. Capabilities belong to a thread and are
//! inherited by the threads it starts: call this before starting any.
//!
//! The system calls (capget, capset, prctl) are the `caps` crate's.

pub use caps::Capability;
use caps::{CapSet, CapsHashSet};

/// What [`keep_only`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// The thread held nothing beyond what it needs.
    Already,
    /// It gave up these.
    Dropped(Vec<Capability>),
}

/// Keeps only `needed` of the calling thread's capabilities (those it holds of them).
pub fn keep_only(needed: &[Capability]) -> Result<Kept, caps::errors::CapsError> {
    let keep: CapsHashSet = needed.iter().copied().collect();
    let permitted = caps::read(None, CapSet::Permitted)?;
    let mut extra: Vec<Capability> = permitted.difference(&keep).copied().collect();
    if extra.is_empty() {
        return Ok(Kept::Already);
    }
    extra.sort_by_key(|c| c.index());
    // The bounding set first, while CAP_SETPCAP is still held: an exec cannot regain them.
    if permitted.contains(&Capability::CAP_SETPCAP) {
        for c in caps::all().difference(&keep) {
            // A capability this kernel does not know cannot be dropped, nor held.
            let _ = caps::drop(None, CapSet::Bounding, *c);
        }
    }
    let now: CapsHashSet = permitted.intersection(&keep).copied().collect();
    caps::clear(None, CapSet::Ambient)?;
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())?;
    caps::set(None, CapSet::Effective, &now)?;
    caps::set(None, CapSet::Permitted, &now)?;
    Ok(Kept::Dropped(extra))
}

/// [`keep_only`], logged: what was given up, or why nothing could be.
pub fn keep_only_logged(needed: &[Capability]) {
    match keep_only(needed) {
        Ok(Kept::Already) => {}
        Ok(Kept::Dropped(gone)) => tracing::info!(
            kept = ?needed,
            dropped = gone.len(),
            "set-up done: keeping only the capabilities the daemon needs"
        ),
        Err(e) => tracing::warn!("cannot drop capabilities ({e}); running with those it has"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread of its own (capabilities are per thread): a root test run gives up all but
    /// one and finds exactly that one in every set; any other run holds none to give up.
    #[test]
    fn a_thread_keeps_only_what_it_needs() {
        std::thread::spawn(|| {
            let before = caps::read(None, CapSet::Permitted).unwrap();
            let wanted = Capability::CAP_NET_ADMIN;
            let r = keep_only(&[wanted]).unwrap();
            let only: CapsHashSet = before
                .contains(&wanted)
                .then_some(wanted)
                .into_iter()
                .collect();
            assert_eq!(caps::read(None, CapSet::Permitted).unwrap(), only);
            assert_eq!(caps::read(None, CapSet::Effective).unwrap(), only);
            assert!(caps::read(None, CapSet::Inheritable).unwrap().is_empty());
            let gone = before.len() - only.len();
            match r {
                Kept::Already => assert_eq!(gone, 0),
                Kept::Dropped(d) => {
                    assert_eq!(d.len(), gone);
                    if before.contains(&Capability::CAP_SETPCAP) {
                        let bounding = caps::read(None, CapSet::Bounding).unwrap();
                        assert!(bounding.iter().all(|c| *c == wanted), "{bounding:?}");
                    }
                }
            }
            // Twice is nothing more.
            assert_eq!(keep_only(&[wanted]).unwrap(), Kept::Already);
        })
        .join()
        .unwrap();
    }
}
