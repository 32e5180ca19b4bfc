//! A trunk host's own receive queue: the frames for its MAC on its VLANs, read straight into
//! shared memory as they were on the wire.
//!
//! The kernel takes a frame's outer tag out before any socket sees it. An untagged frame is
//! read as it came; a tagged one around a gap where its tag goes back
//! ([`PacketSocket::recv_batch_tagged_into`]). One read cannot know which it will get, so
//! a host that takes both has two sockets, one for each, and one descriptor to wait on: an
//! epoll set of the two (epoll by hand, as everything in this crate: three calls, and
//! tokio waits on the set's descriptor as on any).

use super::cvt;
use super::filter::{only_to, Tagged};
use super::packet::PacketSocket;
use splitnet_messaging::memory::SharedBytes;
use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A trunk host's own queue ([`TrunkSocket::open`]).
#[derive(Debug)]
pub struct TrunkSocket {
    /// Its frames that came tagged, read with their tags put back.
    tagged: PacketSocket,
    /// Its frames that came untagged, if it takes them, and the set waiting on both.
    untagged: Option<(PacketSocket, OwnedFd)>,
    /// The untagged socket is read first next time (the two take turns).
    untagged_first: Cell<bool>,
}

impl TrunkSocket {
    /// The queue of `mac`'s frames that came as `t` says, on `nic`'s interface; `t` must
    /// take tagged frames (`InvalidInput` otherwise: such a host needs a plain socket).
    pub fn open(nic: &PacketSocket, mac: [u8; 6], t: &Tagged) -> io::Result<TrunkSocket> {
        if !t.takes_tagged() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let tagged = nic.open_sibling(&only_to(&mac, &t.tagged_only()))?;
        let untagged = match t.takes_untagged() {
            false => None,
            true => {
                let plain = nic.open_sibling(&only_to(&mac, &Tagged::untagged()))?;
                let set = poll_set(&[tagged.as_fd(), plain.as_fd()])?;
                Some((plain, set))
            }
        };
        Ok(TrunkSocket {
            tagged,
            untagged,
            untagged_first: Cell::new(false),
        })
    }

    /// Its sockets, the one whose turn it is first.
    fn sockets(&self) -> impl Iterator<Item = (&PacketSocket, bool)> {
        let plain = self.untagged.as_ref().map(|(s, _)| (s, false));
        let first = self.untagged_first.replace(!self.untagged_first.get());
        let (a, b) = match first {
            true => (plain, Some((&self.tagged, true))),
            false => (Some((&self.tagged, true)), plain),
        };
        a.into_iter().chain(b)
    }

    /// Receives up to `dst.len()` frames from one of its sockets, each straight into its
    /// range as it was on the wire, their whole lengths into `lens` (as
    /// [`PacketSocket::recv_batch_into`]); `WouldBlock` when neither holds one.
    pub fn recv_batch_into(
        &self,
        dst: &[SharedBytes<'_>],
        lens: &mut [usize],
    ) -> io::Result<usize> {
        for (s, tagged) in self.sockets() {
            let r = match tagged {
                true => s.recv_batch_tagged_into(dst, lens),
                false => s.recv_batch_into(dst, lens),
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Frames its sockets dropped, their buffers full, since the last call (reading resets
    /// a socket's count, so what one gave counts even when the other fails; an error only
    /// when neither gave a count).
    pub fn take_drops(&self) -> io::Result<u64> {
        let tagged = self.tagged.take_drops();
        let Some((plain, _)) = &self.untagged else {
            return tagged;
        };
        match (plain.take_drops(), tagged) {
            (Ok(a), Ok(b)) => Ok(a + b),
            (Ok(n), Err(_)) | (Err(_), Ok(n)) => Ok(n),
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Its sockets take nothing more (the frames they hold stay): both are shut whatever
    /// the first gives, and the first error is returned.
    pub fn shut(&self) -> io::Result<()> {
        let nothing = super::filter::nothing();
        let plain = self
            .untagged
            .as_ref()
            .map_or(Ok(()), |(s, _)| s.set_filter(&nothing));
        let tagged = self.tagged.set_filter(&nothing);
        plain.and(tagged)
    }

    /// Drops a batch of frames waiting, unread; how many (`WouldBlock`: none).
    pub fn discard(&self) -> io::Result<usize> {
        for (s, _) in self.sockets() {
            match s.discard() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
        Err(io::ErrorKind::WouldBlock.into())
    }
}

impl AsFd for TrunkSocket {
    /// The descriptor readable when a frame waits in either socket.
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.untagged {
            Some((_, set)) => set.as_fd(),
            None => self.tagged.as_fd(),
        }
    }
}

/// An epoll set readable while one of `fds` is (level-triggered inside: the set's own
/// readiness is the union of theirs, whoever waits on it and however).
fn poll_set(fds: &[BorrowedFd<'_>]) -> io::Result<OwnedFd> {
    // SAFETY: plain epoll_create1(2) call; the result is checked before it is owned.
    let raw = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: `raw` was just returned by epoll_create1(2) and is owned by nobody else.
    let set = unsafe { OwnedFd::from_raw_fd(raw) };
    for fd in fds {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd.as_raw_fd() as u64,
        };
        // SAFETY: both descriptors are open for the call; `ev` is valid and only read.
        cvt(unsafe {
            libc::epoll_ctl(
                set.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        })?;
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    mod needs_root {
        use super::super::*;
        use crate::packet::tests::{frame, own_namespace, wait_readable};
        use splitnet_messaging::memory::HeapShared;

        /// Issue 41: a trunk host that takes untagged frames and tagged ones gets both, each
        /// as it was on the wire, from one descriptor that says when either waits; shut, it
        /// takes nothing more, and what it held is discarded.
        #[test]
        #[ignore = "needs root"]
        fn a_trunk_hosts_queue_takes_both_kinds_through_one_descriptor() {
            own_namespace();
            let mine = [2, 0, 0, 0, 0, 1];
            let nic = PacketSocket::open("lo").unwrap();
            let t = Tagged::of(true, [5, 6]).unwrap();
            let q = TrunkSocket::open(&nic, mine, &t).unwrap();
            assert!(TrunkSocket::open(&nic, mine, &Tagged::untagged()).is_err());
            let sent = [
                frame(mine, None, 1),
                frame(mine, Some(5), 2),
                frame(mine, Some(7), 3),
                frame(mine, Some(6), 4),
            ];
            for f in &sent {
                nic.send(f).unwrap();
            }
            let mem = HeapShared::new(4096);
            let dst = [SharedBytes::new(&mem, 0, 1000).unwrap()];
            let mut got = Vec::new();
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while got.len() < 3 && std::time::Instant::now() < until {
                wait_readable(q.as_fd());
                let mut lens = [0usize];
                if let Ok(1) = q.recv_batch_into(&dst, &mut lens) {
                    let mut f = vec![0u8; lens[0]];
                    dst[0].copy_out(0, &mut f).unwrap();
                    got.push(f);
                }
            }
            got.sort();
            let mut want = vec![sent[0].clone(), sent[1].clone(), sent[3].clone()];
            want.sort();
            assert_eq!(got, want, "VLAN 7 is not the host's");
            assert!(!crate::readable_now(q.as_fd()).unwrap());
            let mut lens = [0usize];
            let e = q.recv_batch_into(&dst, &mut lens).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            nic.send(&sent[1]).unwrap();
            wait_readable(q.as_fd());
            q.shut().unwrap();
            // Sent after the shut, then a marker a socket of its own receives: once the
            // marker is in, the frame before it has been through every filter.
            let marker = [2, 0, 0, 0, 0, 9];
            let watch = nic
                .open_sibling(&only_to(&marker, &Tagged::untagged()))
                .unwrap();
            nic.send(&sent[0]).unwrap();
            nic.send(&frame(marker, None, 9)).unwrap();
            wait_readable(&watch);
            assert_eq!(
                q.discard().unwrap(),
                1,
                "the frame from before the shut alone"
            );
            assert_eq!(q.discard().unwrap_err().kind(), io::ErrorKind::WouldBlock);
            assert_eq!(q.take_drops().unwrap(), 0);
        }
    }
}
