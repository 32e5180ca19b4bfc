//! The doorbell of a shared-memory channel: one byte on the channel's own set-up connection.
//!
//! Each side rings by sending a byte on its end of the Unix stream the channel was set up
//! on, and waits for its end to be readable, in the same epoll as its TAP or packet socket.
//! Both calls pass `MSG_DONTWAIT`, so neither can block whatever the peer does: a flag set
//! per call is not part of the open file description, which the peer cannot reach anyway
//! (each end of a connection is its own). An `eventfd` passed between the two could not
//! give that: its status flags are shared with the peer, which may clear `O_NONBLOCK` and
//! fill the counter (or drain it) so that the next write (or read) blocks.
//!
//! A peer can ring as often as it likes: unread rings stay in this side's receive queue
//! until the peer's send buffer is full, when a further ring is refused with `EAGAIN`, which
//! [`Doorbell::ring`] takes as rung (the waiter has rings to read). [`Doorbell::drain`] takes
//! up to [`DRAIN_MAX`] rings in one call. End of stream says that the peer has gone.

use super::{cvt, cvt_size};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;

/// Rings one [`Doorbell::drain`] call takes at most; more are left for the next wake-up
/// (the descriptor stays readable).
pub const DRAIN_MAX: usize = 256;

/// This side's end of a channel's set-up connection, used as its doorbell.
#[derive(Debug)]
pub struct Doorbell(UnixStream);

impl Doorbell {
    /// The doorbell on `sock`, this side's end of the connection the channel was set up on.
    /// Nothing else may be read from it after the set-up.
    pub fn new(sock: UnixStream) -> Doorbell {
        Doorbell(sock)
    }

    /// Rings the peer: its end becomes readable. A full send buffer means the peer has
    /// rings it has not read, so `WouldBlock` is success too.
    pub fn ring(&self) -> io::Result<()> {
        let one = [1u8];
        // SAFETY: `one` is 1 readable byte for the whole call; MSG_DONTWAIT never sleeps and
        // MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
        let r = unsafe {
            libc::send(
                self.0.as_raw_fd(),
                one.as_ptr().cast(),
                one.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        match cvt_size(r) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes the rings since the last drain, up to [`DRAIN_MAX`]; returns how many there were
    /// (0: none). The peer's end of stream is `UnexpectedEof`: it has gone (or
    /// `ConnectionReset`, when it left rings of this side's unread).
    pub fn drain(&self) -> io::Result<usize> {
        let mut buf = [0u8; DRAIN_MAX];
        // SAFETY: `buf` is DRAIN_MAX writable bytes for the whole call; MSG_DONTWAIT never
        // sleeps.
        let r = unsafe {
            libc::recv(
                self.0.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match cvt_size(r) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the channel's connection",
            )),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }
}

impl Doorbell {
    /// Whether this side's end is readable now (the peer rang, or left): `poll(2)` with a
    /// zero timeout.
    pub fn is_readable(&self) -> io::Result<bool> {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the whole call; zero timeout.
        let n = cvt(unsafe { libc::poll(&mut p, 1, 0) })?;
        Ok(n == 1 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0)
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn readable(d: &Doorbell) -> bool {
        d.is_readable().unwrap()
    }

    fn pair() -> (Doorbell, Doorbell) {
        let (a, b) = UnixStream::pair().unwrap();
        (Doorbell::new(a), Doorbell::new(b))
    }

    #[test]
    fn rings_are_counted_and_drained_at_once() {
        let (ringer, waiter) = pair();
        assert!(!readable(&waiter));
        assert_eq!(waiter.drain().unwrap(), 0);
        for _ in 0..5 {
            ringer.ring().unwrap();
        }
        assert!(readable(&waiter));
        assert!(!readable(&ringer), "a ring wakes only the other end");
        assert_eq!(waiter.drain().unwrap(), 5);
        assert!(!readable(&waiter), "one drain takes every ring");
    }

    #[test]
    fn more_rings_than_one_drain_takes_stay_readable() {
        let (ringer, waiter) = pair();
        for _ in 0..DRAIN_MAX + 3 {
            ringer.ring().unwrap();
        }
        assert_eq!(waiter.drain().unwrap(), DRAIN_MAX);
        assert!(readable(&waiter));
        assert_eq!(waiter.drain().unwrap(), 3);
    }

    #[test]
    fn the_peer_gone_is_end_of_stream_after_its_last_rings() {
        let (ringer, waiter) = pair();
        ringer.ring().unwrap();
        drop(ringer);
        assert_eq!(
            waiter.drain().unwrap(),
            1,
            "rings before leaving are read first"
        );
        let e = waiter.drain().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(readable(&waiter), "end of stream wakes the waiter");
    }

    #[test]
    fn ringing_a_gone_peer_is_an_error_not_a_signal() {
        let (ringer, waiter) = pair();
        drop(waiter);
        assert!(ringer.ring().is_err());
    }

    /// A peer that never reads its doorbell, with its end made blocking: ringing it returns
    /// at once however often (a blocking descriptor would hang the ringing thread here).
    #[test]
    fn a_peer_that_never_reads_cannot_block_the_ringer() {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(false).unwrap();
        b.set_nonblocking(false).unwrap();
        let ringer = Doorbell::new(a);
        for _ in 0..200_000 {
            ringer.ring().unwrap();
        }
        drop(b);
    }

    /// A peer that reads this side's rings itself (it cannot: its end is its own) or sends
    /// nothing: a drain of a blocking end with nothing to read returns 0 at once.
    #[test]
    fn draining_a_blocking_end_with_nothing_to_read_does_not_block() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(false).unwrap();
        let waiter = Doorbell::new(a);
        assert_eq!(waiter.drain().unwrap(), 0);
        b.write_all(b"xy").unwrap();
        assert_eq!(waiter.drain().unwrap(), 2);
        let mut none = [0u8; 1];
        b.set_nonblocking(true).unwrap();
        assert!(b.read(&mut none).is_err(), "nothing was rung back");
    }
}
