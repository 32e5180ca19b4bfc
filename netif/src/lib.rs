//! The Linux network interfaces the daemons need and no well-kept crate offers as one piece:
//! a TAP with `IFF_VNET_HDR`, `TUNSETOFFLOAD` and `TUNSETCARRIER` ([`tap`]), an `AF_PACKET`
//! socket with `PACKET_VNET_HDR`, batched reads, a mapped receive ring and fanout ([`packet`],
//! [`rx_ring`], [`fanout`]), its
//! classic BPF receive filters ([`bpf`], [`filter`]), and the `SIOC*IF*` ioctls for MTU, MAC
//! and flags ([`netdev`]), the kernel's reports of interface changes over rtnetlink
//! ([`link_watch`]), the frames that announce a moved MAC to the LAN ([`announce`]) and its multicast
//! groups ([`groups`], [`membership`]); and the reads and writes between a descriptor and memory shared
//! with a peer that the kernel does for us (below).
//!
//! `tun-tap` 0.1 cannot set `IFF_VNET_HDR` (it must be given at `TUNSETIFF` time) and
//! `tun-rs` segments GSO frames in userspace in its offload mode, which is exactly what the
//! pass-through design avoids; both lack `TUNSETCARRIER`. So the few ioctls live here. This
//! crate's business is system calls: it allows `unsafe`, each use with a `// SAFETY:` note;
//! the protocol core (`splitnet-messaging`) has none.
#![allow(unsafe_code)]
#![warn(missing_docs)]

pub mod announce;
pub mod bpf;
pub mod fanout;
pub mod filter;
pub mod groups;
pub mod link_watch;
pub mod membership;
pub mod netdev;
pub mod packet;
pub mod rx_ring;
pub mod tap;
pub mod trunk;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `read(2)` on an owned descriptor.
pub(crate) fn read(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid writable region of `buf.len()` bytes for the whole call.
    cvt_size(unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// Whether `fd` is readable now: `poll(2)` with a zero timeout.
pub fn readable_now(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the whole call; zero timeout.
    let n = cvt(unsafe { libc::poll(&mut p, 1, 0) })?;
    Ok(n == 1 && p.revents & libc::POLLIN != 0)
}

/// Descriptors asked at once whether any is readable now: one `poll(2)` with a zero timeout
/// for the whole set, as a poll loop needs it (no allocation per call). A descriptor closed
/// while in the set counts as ready (its `POLLNVAL`), which only ends a poll early.
#[derive(Debug, Default, Clone)]
pub struct PollSet(Vec<libc::pollfd>);

impl PollSet {
    /// An empty set.
    pub fn new() -> PollSet {
        PollSet::default()
    }

    /// Adds `fd`.
    pub fn insert(&mut self, fd: RawFd) {
        self.0.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }

    /// Removes one entry of `fd`, if it has one.
    pub fn remove(&mut self, fd: RawFd) {
        if let Some(i) = self.0.iter().position(|p| p.fd == fd) {
            self.0.swap_remove(i);
        }
    }

    /// How many descriptors the set holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set holds none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether any descriptor is readable now (or in error, hung up, or closed).
    pub fn any_ready(&mut self) -> io::Result<bool> {
        if self.0.is_empty() {
            return Ok(false);
        }
        // SAFETY: the pointer and length name this vector's initialised pollfds, which
        // nothing else touches during the call; zero timeout.
        let n = cvt(unsafe { libc::poll(self.0.as_mut_ptr(), self.0.len() as libc::nfds_t, 0) })?;
        Ok(n > 0)
    }
}

/// The address and length of the bytes `b` names in shared memory, for the kernel. Formed
/// from the atomics' own pointer, so no Rust reference to the bytes exists; checked again
/// against the words (in bounds by `SharedBytes`' construction) since `unsafe` relies on it.
fn shared_range(
    b: &splitnet_messaging::memory::SharedBytes<'_>,
) -> io::Result<(*mut libc::c_void, usize)> {
    let (words, off, len) = b.raw();
    if off.checked_add(len).is_none_or(|end| end > words.len() * 4) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let ptr = words.as_ptr().cast::<u8>().wrapping_add(off).cast_mut();
    Ok((ptr.cast(), len))
}

/// Writes `head` (private) then the bytes `tail` names in shared memory with one
/// `writev(2)`: the kernel copies the shared bytes itself, so no Rust reference to memory
/// the peer may rewrite is ever formed. `head` is what was checked; only it must not
/// change, and it is private.
pub fn write_parts(
    fd: BorrowedFd<'_>,
    head: &[u8],
    tail: &splitnet_messaging::memory::SharedBytes<'_>,
) -> io::Result<usize> {
    let (base, len) = shared_range(tail)?;
    let iov = [
        libc::iovec {
            iov_base: head.as_ptr().cast_mut().cast(),
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: base,
            iov_len: len,
        },
    ];
    // SAFETY: both iovecs name readable memory valid for the call: `head` is a live slice,
    // and the tail lies inside a live slice of atomics (the kernel only reads it; racing
    // writes by the peer change the bytes sent, never memory safety).
    cvt_size(unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), 2) })
}

/// Reads into the bytes `dst` names in shared memory with one `read(2)`: the kernel writes
/// them, so no Rust reference to memory the peer may rewrite is formed.
pub fn read_into(
    fd: BorrowedFd<'_>,
    dst: &splitnet_messaging::memory::SharedBytes<'_>,
) -> io::Result<usize> {
    let (base, len) = shared_range(dst)?;
    // SAFETY: the range lies inside a live slice of atomics, valid for the call; atomics
    // may be written through a shared reference (interior mutability), and the kernel's
    // write races only with the peer's, which changes bytes, not memory safety.
    cvt_size(unsafe { libc::read(fd.as_raw_fd(), base, len) })
}

/// Receives one datagram into the bytes `dst` names in shared memory with one `recv(2)`
/// and `flags`, as [`read_into`] reads.
pub fn recv_into(
    fd: BorrowedFd<'_>,
    dst: &splitnet_messaging::memory::SharedBytes<'_>,
    flags: libc::c_int,
) -> io::Result<usize> {
    let (base, len) = shared_range(dst)?;
    // SAFETY: as in `read_into`: the range lies inside a live slice of atomics, valid for
    // the call, and the kernel writes at most `len` bytes of it.
    cvt_size(unsafe { libc::recv(fd.as_raw_fd(), base, len, flags) })
}

/// `write(2)` on an owned descriptor.
pub(crate) fn write(fd: &OwnedFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid readable region of `buf.len()` bytes for the whole call.
    cvt_size(unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) })
}

/// The supplementary groups of the process at the other end of a Unix socket, as the kernel
/// recorded them when it connected (`SO_PEERGROUPS`; `SO_PEERCRED` gives only the primary
/// group).
pub fn peer_groups(fd: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is `len` writable bytes for the whole call; the kernel writes at
        // most `len` and says in `len` how many it wrote (or needs, with ERANGE).
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        // A peer in more groups than the buffer holds: the kernel says how many (at most
        // NGROUPS_MAX, 65,536).
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 1 << 16 {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}

/// This machine's host name from `uname(2)` (the UTS namespace), which needs no file in
/// `/proc` (hidden by the units' `ProcSubset=pid`). Empty if the call fails.
pub fn hostname() -> String {
    // SAFETY: `utsname` is plain old data; all-zero bytes are a valid value.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uname` writes into the struct we own, valid for the call.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    let name: Vec<u8> = uts
        .nodename
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&name).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_messaging::memory::HeapShared;
    use splitnet_messaging::memory::SharedBytes;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixDatagram;

    /// The peer's groups are the kernel's record of them: for a pair in this process, this
    /// process's supplementary groups.
    #[test]
    fn a_peers_groups_are_those_it_connected_with() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut got = peer_groups(a.as_fd()).unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let mut want: Vec<u32> = status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .unwrap()
            .split_whitespace()
            .map(|g| g.parse().unwrap())
            .collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn frames_go_between_a_descriptor_and_shared_memory_without_a_reference() {
        let mem = HeapShared::new(4096);
        let (a, b) = UnixDatagram::pair().unwrap();
        // A datagram read straight into a range of shared memory, at an unaligned offset.
        a.send(b"a frame from the TAP").unwrap();
        let dst = SharedBytes::new(&mem, 1001, 100).unwrap();
        assert_eq!(read_into(b.as_fd(), &dst).unwrap(), 20);
        let mut got = [0u8; 20];
        dst.copy_out(0, &mut got).unwrap();
        assert_eq!(&got, b"a frame from the TAP");
        // And written out as a private head and the rest from shared memory, in one piece.
        let rest = SharedBytes::new(&mem, 1001 + 8, 12).unwrap();
        assert_eq!(write_parts(b.as_fd(), b"HEAD", &rest).unwrap(), 16);
        let mut out = [0u8; 64];
        let n = a.recv(&mut out).unwrap();
        assert_eq!(&out[..n], b"HEADfrom the TAP");
        // A stream is a descriptor as well.
        let (mut x, y) = std::os::unix::net::UnixStream::pair().unwrap();
        x.write_all(b"xyz").unwrap();
        let dst = SharedBytes::new(&mem, 0, 3).unwrap();
        assert_eq!(read_into(y.as_fd(), &dst).unwrap(), 3);
        let mut back = [0u8; 3];
        dst.copy_out(0, &mut back).unwrap();
        assert_eq!(&back, b"xyz");
    }

    #[test]
    fn a_poll_set_says_whether_any_descriptor_is_readable() {
        use std::io::Read;
        use std::os::unix::net::UnixStream;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let (mut c, d) = UnixStream::pair().unwrap();
        let mut set = PollSet::new();
        assert!(!set.any_ready().unwrap(), "an empty set");
        set.insert(b.as_raw_fd());
        set.insert(d.as_raw_fd());
        assert_eq!(set.len(), 2);
        assert!(!set.any_ready().unwrap(), "nothing sent");
        c.write_all(b"x").unwrap();
        assert!(set.any_ready().unwrap(), "the second has a byte");
        set.remove(d.as_raw_fd());
        assert!(!set.any_ready().unwrap(), "the readable one removed");
        a.write_all(b"y").unwrap();
        assert!(set.any_ready().unwrap(), "the first has one");
        let mut buf = [0u8; 4];
        assert_eq!(b.read(&mut buf).unwrap(), 1);
        assert!(!set.any_ready().unwrap(), "read again");
        // A peer gone: its end is hung up, which ends a poll too.
        drop(a);
        assert!(set.any_ready().unwrap(), "the peer hung up");
        drop((c, d));
    }
}
