//! The doorbell of a shared-memory channel: an `eventfd(2)` one side rings and the other
//! waits on, in the same epoll as its TAP or packet socket.
//!
//! A peer can ring as often as it likes: the counter only saturates, and [`EventFd::drain`]
//! takes every ring at once, so a flood of doorbells costs the waiter one read per wake-up.

use super::cvt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A non-blocking, close-on-exec eventfd.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new doorbell, not rung.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain eventfd(2) call; the result is checked before it is owned.
        let raw = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `raw` was just returned by eventfd(2) and is owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(raw) }))
    }

    /// Wraps a descriptor received from the peer (it must be an eventfd: a write or read of
    /// anything else fails, which the caller treats as the peer's error).
    pub fn from_fd(fd: OwnedFd) -> EventFd {
        EventFd(fd)
    }

    /// Rings: the waiter's descriptor becomes readable. A counter at its limit already
    /// wakes the waiter, so `WouldBlock` is success too.
    pub fn ring(&self) -> io::Result<()> {
        let one = 1u64.to_ne_bytes();
        // SAFETY: `one` is 8 readable bytes for the whole call.
        let r = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if r == 8 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => Ok(()),
            _ if r >= 0 => Err(io::Error::other("short eventfd write")),
            _ => Err(e),
        }
    }

    /// Takes every ring since the last drain; returns how many there were (0: none).
    pub fn drain(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        // SAFETY: `buf` is 8 writable bytes for the whole call.
        let r = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if r == 8 {
            return Ok(u64::from_ne_bytes(buf));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => Ok(0),
            _ if r >= 0 => Err(io::Error::other("short eventfd read")),
            _ => Err(e),
        }
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: &EventFd) -> bool {
        crate::sys::readable_now(fd.as_fd()).unwrap()
    }

    #[test]
    fn rings_are_counted_and_drained_at_once() {
        let bell = EventFd::new().unwrap();
        assert!(!readable(&bell));
        assert_eq!(bell.drain().unwrap(), 0);
        for _ in 0..5 {
            bell.ring().unwrap();
        }
        assert!(readable(&bell));
        assert_eq!(bell.drain().unwrap(), 5);
        assert!(!readable(&bell), "one drain takes every ring");
    }

    #[test]
    fn a_duplicate_descriptor_rings_the_same_bell() {
        let waiter = EventFd::new().unwrap();
        let ringer = EventFd::from_fd(waiter.as_fd().try_clone_to_owned().unwrap());
        ringer.ring().unwrap();
        assert!(readable(&waiter));
        assert_eq!(waiter.drain().unwrap(), 1);
    }

    #[test]
    fn a_descriptor_that_is_not_an_eventfd_is_an_error_not_a_count() {
        use std::io::Write;
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let fake = EventFd::from_fd(OwnedFd::from(a));
        // A peer that passed a socket for its doorbell and writes 3 bytes into it.
        b.write_all(b"abc").unwrap();
        assert!(fake.drain().is_err(), "3 bytes are no eventfd counter");
    }
}
