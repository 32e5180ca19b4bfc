//! Shared memory between the daemons' processes: sealed `memfd`s, their mappings as
//! [`SharedMem`], and passing descriptors over a Unix socket (`SCM_RIGHTS`).
//!
//! The creator makes a [`Memfd`] of a fixed size sealed against shrinking and growing, maps
//! it and sends its descriptor with [`send_fds`]. The receiver takes it with [`recv_fds`]
//! and checks it with [`Memfd::verify`] before mapping: a file the peer could truncate would
//! turn our next access past the new end into `SIGBUS`, so an unsealed (or wrongly sized)
//! file is refused. Both then access the memory only through atomics ([`Mapping`]).
//!
//! Plain `libc` calls: the handful needed do not justify another dependency.

use super::{cvt, cvt_size};
use splitnet_messaging::memory::{MemError, SharedMem};
use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicU32;
use thiserror::Error;

/// The seals a shared-memory file must carry: its size can change neither way.
pub const REQUIRED_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
/// The most descriptors one message carries (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

/// Why a shared-memory file is refused or could not be made.
#[derive(Debug, Error)]
pub enum MemfdError {
    /// A system call failed.
    #[error("memfd: {0}")]
    Io(#[from] io::Error),
    /// The descriptor is not a regular file that supports sealing (not a memfd).
    #[error("shared memory descriptor is not a sealable file")]
    NotSealable,
    /// The file may still shrink or grow.
    #[error("shared memory is not sealed against resizing (seals {0:#x})")]
    NotSealed(libc::c_int),
    /// The file is sealed against writing, so it cannot be mapped writable.
    #[error("shared memory is sealed against writing (seals {0:#x})")]
    WriteSealed(libc::c_int),
    /// The file's size is not the agreed one.
    #[error("shared memory is {found} bytes, expected {expected}")]
    Size {
        /// The file's size.
        found: u64,
        /// The agreed size.
        expected: u64,
    },
    /// Not ordinary shared memory (a `memfd` on hugetlbfs, say): a page that cannot be
    /// allocated when touched would raise `SIGBUS` in the process that touched it.
    #[error("shared memory is not an ordinary memfd (file system {0:#x})")]
    NotShmem(u64),
    /// The requested size is zero, not a multiple of 4 or too large.
    #[error("shared memory size {0} is not a positive multiple of 4 below 2^40")]
    BadLen(usize),
}

/// A `memfd` of fixed size, sealed against shrinking and growing.
#[derive(Debug)]
pub struct Memfd {
    fd: OwnedFd,
    len: usize,
}

fn check_len(len: usize) -> Result<(), MemfdError> {
    if len == 0 || !len.is_multiple_of(4) || len as u64 >= 1 << 40 {
        return Err(MemfdError::BadLen(len));
    }
    Ok(())
}

impl Memfd {
    /// Creates a zero-filled memfd of `len` bytes (close-on-exec) and seals its size (and
    /// its seals).
    pub fn create(name: &CStr, len: usize) -> Result<Memfd, MemfdError> {
        check_len(len)?;
        // SAFETY: `name` is a NUL-terminated string valid for the call.
        let raw = cvt(unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        })?;
        // SAFETY: `raw` was just returned by memfd_create and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on a descriptor we own; `len` < 2^40 fits in off_t.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
        // SAFETY: as above.
        cvt(unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                REQUIRED_SEALS | libc::F_SEAL_SEAL,
            )
        })?;
        Ok(Memfd { fd, len })
    }

    /// Accepts a descriptor received from a peer as a shared-memory file of exactly `len`
    /// bytes: it must be a regular file sealed against shrinking and growing (checked
    /// first, so the size checked next cannot change afterwards) and not against writing.
    pub fn verify(fd: OwnedFd, len: usize) -> Result<Memfd, MemfdError> {
        check_len(len)?;
        // SAFETY: plain syscall on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EINVAL) {
                MemfdError::NotSealable
            } else {
                e.into()
            });
        }
        if seals & REQUIRED_SEALS != REQUIRED_SEALS {
            return Err(MemfdError::NotSealed(seals));
        }
        if seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0 {
            return Err(MemfdError::WriteSealed(seals));
        }
        // SAFETY: `stat` is plain old data; all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fstat` writes into the struct we own, valid for the call.
        cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(MemfdError::NotSealable);
        }
        // SAFETY: `statfs` is plain old data; all-zero bytes are a valid value.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `fstatfs` writes into the struct we own, valid for the call.
        cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) })?;
        // A memfd without MFD_HUGETLB lives on the kernel's internal tmpfs (shmem), whose
        // pages are allocated like any anonymous memory; hugetlbfs' come from a pool that a
        // hole punched by the peer and an exhausted pool turn into SIGBUS.
        if fs.f_type as u64 != libc::TMPFS_MAGIC as u64 {
            return Err(MemfdError::NotShmem(fs.f_type as u64));
        }
        if st.st_size as u64 != len as u64 {
            return Err(MemfdError::Size {
                found: st.st_size as u64,
                expected: len as u64,
            });
        }
        Ok(Memfd { fd, len })
    }

    /// The file's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the file is empty (never: sizes are positive).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maps the whole file shared, readable and writable.
    pub fn map(&self) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel (no address hint, no MAP_FIXED), so
        // no existing memory is affected; the descriptor is valid for the call.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<AtomicU32>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Mapping { ptr, len: self.len })
    }
}

impl AsFd for Memfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A shared mapping of a [`Memfd`], accessed as atomic words and by byte copies.
///
/// Unmapped on drop. Several mappings of the same file (in this process or others) see
/// each other's writes.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<AtomicU32>,
    len: usize,
}

// SAFETY: the mapping is only ever accessed through `&AtomicU32` (see `words`), which is
// `Sync`, and by the byte copies of `copy_out` and `copy_in` (see there); the pointer is
// owned by this value alone and unmapped once, in `drop`.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl SharedMem for Mapping {
    fn words(&self) -> &[AtomicU32] {
        // SAFETY:
        // - `ptr` is the page-aligned start of a live `len`-byte mapping (unmapped only in
        //   `drop`, which needs `&mut self`, so not while this borrow lives); `len` is a
        //   multiple of 4 and `AtomicU32` has the size and alignment of `u32`.
        // - Every page stays backed: the file is sealed against shrinking (checked by
        //   `Memfd::create` or `Memfd::verify`, the only ways to a `Mapping`), so no access
        //   below `len` can raise SIGBUS.
        // - The peer (another process, or another mapping of the same file here) may write
        //   any of these bytes at any time. All we ever form are `&AtomicU32`, whose
        //   contents may change under a shared reference (`UnsafeCell`), and all we do with
        //   them are atomic loads, stores and compare-exchanges on aligned 4-byte words:
        //   a racing write by the peer, atomic or not (the hardware makes aligned 4-byte
        //   accesses single-copy atomic), can only change which `u32` we read, and every
        //   bit pattern is a valid `u32`. No non-atomic reference (`&[u8]`) to this memory
        //   is ever created: payload bytes are copied by `copy_out` and `copy_in` through
        //   raw pointers into and out of private buffers.
        // - Two mappings of one file alias each other at different addresses; because every
        //   access is atomic or a raw-pointer copy, the compiler never assumes a value stays
        //   put, so the aliasing is invisible to it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len / 4) }
    }

    /// Copies with `memcpy`, as rust-vmm's vm-memory copies guest memory.
    fn copy_out(&self, off: usize, buf: &mut [u8]) -> Result<(), MemError> {
        MemError::check(off, buf.len(), self.len)?;
        // SAFETY: `off..off + buf.len()` lies inside the mapping (checked above; every page
        // is backed, see `words`), and `buf` is private memory, so the two do not overlap.
        // A correct peer never writes these bytes while we copy them: the ring's
        // `Release`/`Acquire` index words order the copy after its writes and before its
        // reuse of the space, so there is no data race. A rogue peer's racing writes can
        // only make the copied bytes arbitrary: `u8` has no invalid values, and nothing
        // parses them before they are all in private memory (headers, which are parsed, go
        // through the atomic `read`, so no check can be undone by a second fetch).
        unsafe {
            let src = self.ptr.as_ptr().cast::<u8>().add(off);
            ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len());
        }
        Ok(())
    }

    /// Copies with `memcpy`: exactly the bytes `off..off + data.len()` are written.
    fn copy_in(&self, off: usize, data: &[u8]) -> Result<(), MemError> {
        MemError::check(off, data.len(), self.len)?;
        // SAFETY: as in `copy_out`. The words are `UnsafeCell`s (atomics) reached through a
        // pointer we own, so writing them through it is allowed; bytes outside the range,
        // including the rest of a partly covered word, are not touched.
        unsafe {
            let dst = self.ptr.as_ptr().cast::<u8>().add(off);
            ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` created; no borrow of it outlives
        // `&self` (see `words`), and this runs once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Sends `data` (at least one byte: the descriptors ride on it) and `fds` (at most
/// [`MAX_FDS`]) in one `sendmsg`. Returns the bytes sent; on a partial send the
/// descriptors went with the first part and the rest is sent without them.
pub fn send_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "descriptors need at least one data byte",
        ));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one message",
        ));
    }
    let payload = (fds.len() * size_of::<RawFd>()) as libc::c_uint;
    let mut control = control_buffer(fds.len());
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let msg = message(&mut iov, &mut control);
    if !control.is_empty() {
        // SAFETY: `msg_control` points to the zeroed, aligned control buffer, room for one
        // header (CMSG_FIRSTHDR is then non-null) and `fds.len()` descriptors after it, as
        // CMSG_SPACE computed; unaligned writes for the descriptors.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
            let dst = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                ptr::write_unaligned(dst.add(i), fd.as_raw_fd());
            }
        }
    }
    // SAFETY: `msg` points to the iovec and control buffer above, live for the call; the
    // kernel only reads them.
    cvt_size(unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })
}

/// A zeroed control buffer with room for `fds` descriptors (`CMSG_SPACE`), in u64 words so
/// that it is aligned for `cmsghdr`; empty for none.
fn control_buffer(fds: usize) -> Vec<u64> {
    if fds == 0 {
        return Vec::new();
    }
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((fds * size_of::<RawFd>()) as libc::c_uint) } as usize;
    vec![0u64; space.div_ceil(8)]
}

/// A message of one buffer, `iov`, and the control buffer `control` (none if empty); both
/// must outlive its use.
fn message(iov: &mut libc::iovec, control: &mut [u64]) -> libc::msghdr {
    // SAFETY: `msghdr` is plain old data; all-zero bytes are a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    if !control.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(control) as _;
    }
    msg
}

/// Receives into `buf` and takes at most `max_fds` descriptors (clamped to [`MAX_FDS`]),
/// close-on-exec. A message carrying more descriptors than `max_fds`, or whose
/// descriptors were truncated (`MSG_CTRUNC`), is refused with `InvalidData` after closing
/// every descriptor it carried. Returns the bytes received (0: end of stream) and the
/// descriptors.
pub fn recv_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let max_fds = max_fds.min(MAX_FDS);
    let mut control = control_buffer(max_fds);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut msg = message(&mut iov, &mut control);
    // SAFETY: `msg` points to `buf` and the control buffer, both writable and live for the
    // call; the kernel writes at most their lengths.
    let n = cvt_size(unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) })?;
    // Own every descriptor received before judging the message, so that all are closed
    // (dropped) if it is refused.
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of our control buffer with
    // well-formed control messages; CMSG_FIRSTHDR/CMSG_NXTHDR stay within them (null at
    // the end). Headers and descriptors are read unaligned into private values; the
    // descriptor count is bounded by the bytes of the buffer, and each descriptor was
    // installed in this process by `recvmsg` and belongs to no one else.
    unsafe {
        let end = (msg.msg_control as *const u8).add(msg.msg_controllen);
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let h: libc::cmsghdr = ptr::read_unaligned(cmsg);
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let avail = (end as usize).saturating_sub(data as usize);
                let bytes = (h.cmsg_len as usize)
                    .saturating_sub(libc::CMSG_LEN(0) as usize)
                    .min(avail);
                for i in 0..bytes / size_of::<RawFd>() {
                    let raw = ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "descriptors truncated: the peer sent more than expected",
        ));
    }
    if fds.len() > max_fds {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} descriptors received, at most {max_fds} expected",
                fds.len()
            ),
        ));
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_messaging::adapter::shm::harness::{payload, transfer};
    use splitnet_messaging::adapter::shm::{Consumer, Producer, Record, RingConfig};
    use splitnet_messaging::memory::HeapShared;
    use std::io::Read;

    fn ring_cfg() -> RingConfig {
        RingConfig::new(64 << 10, 1500, 2).unwrap()
    }

    fn ring_memfd() -> Memfd {
        let m = Memfd::create(c"splitnet-test", ring_cfg().region_len()).unwrap();
        ring_cfg().init(&m.map().unwrap()).unwrap();
        m
    }

    /// A memfd made by hand, sealed with `seals`.
    fn raw_memfd(len: usize, seals: libc::c_int) -> OwnedFd {
        // SAFETY: test-only syscalls on a descriptor we create and own.
        unsafe {
            let raw =
                libc::memfd_create(c"raw".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert!(raw >= 0);
            let fd = OwnedFd::from_raw_fd(raw);
            assert_eq!(libc::ftruncate(raw, len as libc::off_t), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, seals), 0);
            }
            fd
        }
    }

    fn cloexec(fd: &OwnedFd) -> bool {
        // SAFETY: plain syscall on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        flags >= 0 && flags & libc::FD_CLOEXEC != 0
    }

    #[test]
    fn create_seals_the_size() {
        let m = ring_memfd();
        assert_eq!(m.len(), ring_cfg().region_len());
        assert!(!m.is_empty());
        // SAFETY: plain syscalls on a descriptor `m` owns.
        unsafe {
            let seals = libc::fcntl(m.as_fd().as_raw_fd(), libc::F_GET_SEALS);
            assert_eq!(seals, REQUIRED_SEALS | libc::F_SEAL_SEAL);
            assert_ne!(
                libc::ftruncate(m.as_fd().as_raw_fd(), 4096),
                0,
                "shrinking is sealed"
            );
        }
        assert!(matches!(Memfd::create(c"x", 0), Err(MemfdError::BadLen(0))));
        assert!(matches!(Memfd::create(c"x", 6), Err(MemfdError::BadLen(6))));
    }

    #[test]
    fn two_mappings_see_each_others_records() {
        let m = ring_memfd();
        let (a, b) = (m.map().unwrap(), m.map().unwrap());
        let mut p = Producer::attach(&a, ring_cfg()).unwrap();
        let mut c = Consumer::attach(&b, ring_cfg()).unwrap();
        let mut buf = Vec::new();
        assert!(c.prepare_sleep());
        assert!(p.push(1, &[b"over ", b"memfd"]).unwrap().notify);
        assert_eq!(c.pop(&mut buf), Ok(Some(Record { kind: 1, len: 10 })));
        assert_eq!(buf, b"over memfd");
        for i in 0..1000u64 {
            let len = (i as usize * 37) % 1501;
            let _ = p.push(2, &[&payload(i, len)]).unwrap();
            assert_eq!(c.pop(&mut buf).unwrap(), Some(Record { kind: 2, len }));
            assert_eq!(buf, payload(i, len));
        }
    }

    proptest::proptest! {
        /// The `memcpy` copies of a mapping behave exactly like the word-at-a-time copies
        /// of `HeapShared`: same bytes, same bounds errors, neighbours of a partly covered
        /// word untouched, and the other mapping of the file sees every byte.
        #[test]
        fn mapping_copies_match_the_word_copies(ops in proptest::collection::vec(
            (0usize..4200, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
             proptest::prelude::any::<bool>()), 1..30)
        ) {
            let fd = Memfd::create(c"copies", 4096).unwrap();
            let (m, other) = (fd.map().unwrap(), fd.map().unwrap());
            let model = HeapShared::new(4096);
            for (off, data, is_write) in ops {
                if is_write {
                    proptest::prop_assert_eq!(m.copy_in(off, &data), model.write(off, &data));
                } else {
                    let (mut got, mut want) = (vec![0u8; data.len()], vec![0u8; data.len()]);
                    proptest::prop_assert_eq!(m.copy_out(off, &mut got), model.read(off, &mut want));
                    proptest::prop_assert_eq!(got, want);
                }
            }
            let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
            other.read(0, &mut a).unwrap();
            model.read(0, &mut b).unwrap();
            proptest::prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn two_threads_over_two_mappings() {
        let m = ring_memfd();
        let t = transfer(
            m.map().unwrap(),
            m.map().unwrap(),
            ring_cfg(),
            200_000,
            |s| (s % 1501) as usize,
            true,
            true,
        );
        assert_eq!(t.lost_wakeups, 0);
    }

    #[test]
    fn memfd_passed_over_scm_rights_carries_the_ring() {
        let m = ring_memfd();
        let (tx, rx) = UnixStream::pair().unwrap();
        assert_eq!(send_fds(&tx, b"ring", &[m.as_fd()]).unwrap(), 4);
        let mut buf = [0u8; 16];
        let (n, mut fds) = recv_fds(&rx, &mut buf, 1).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"ring"[..], 1));
        let fd = fds.pop().unwrap();
        assert!(cloexec(&fd));
        let theirs = Memfd::verify(fd, ring_cfg().region_len())
            .unwrap()
            .map()
            .unwrap();
        let ours = m.map().unwrap();
        drop(m); // the mappings keep the file alive
        let mut p = Producer::attach(&ours, ring_cfg()).unwrap();
        let mut c = Consumer::attach(&theirs, ring_cfg()).unwrap();
        let _ = p.push(2, &[&payload(7, 1500)]).unwrap();
        let mut rec = Vec::new();
        assert_eq!(c.pop(&mut rec), Ok(Some(Record { kind: 2, len: 1500 })));
        assert_eq!(rec, payload(7, 1500));
    }

    #[test]
    fn verify_refuses_unsealed_short_and_foreign_files() {
        let len = ring_cfg().region_len();
        assert!(matches!(
            Memfd::verify(raw_memfd(len, 0), len),
            Err(MemfdError::NotSealed(0))
        ));
        assert!(matches!(
            Memfd::verify(raw_memfd(len, libc::F_SEAL_SHRINK), len),
            Err(MemfdError::NotSealed(_))
        ));
        assert!(matches!(
            Memfd::verify(raw_memfd(len - 4096, REQUIRED_SEALS), len),
            Err(MemfdError::Size { .. })
        ));
        assert!(matches!(
            Memfd::verify(raw_memfd(len + 4096, REQUIRED_SEALS), len),
            Err(MemfdError::Size { .. })
        ));
        assert!(matches!(
            Memfd::verify(raw_memfd(len, REQUIRED_SEALS | libc::F_SEAL_WRITE), len),
            Err(MemfdError::WriteSealed(_))
        ));
        let (sock, _) = UnixStream::pair().unwrap();
        assert!(matches!(
            Memfd::verify(sock.into(), len),
            Err(MemfdError::NotSealable)
        ));
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(matches!(
            Memfd::verify(file.into(), len),
            Err(MemfdError::NotSealable)
        ));
        // Sealed and of the right size: accepted and mappable.
        let ok = Memfd::verify(raw_memfd(len, REQUIRED_SEALS), len).unwrap();
        assert_eq!(ok.map().unwrap().len(), len);
    }

    #[test]
    fn verify_refuses_a_hugetlb_memfd() {
        let len = 2 << 20;
        // SAFETY: test-only syscalls on a descriptor we create and own.
        let fd = unsafe {
            let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB;
            let raw = libc::memfd_create(c"huge".as_ptr(), flags);
            if raw < 0 {
                // A kernel without hugetlbfs cannot make one: nothing to refuse.
                eprintln!("no hugetlb memfd here: {}", io::Error::last_os_error());
                return;
            }
            let fd = OwnedFd::from_raw_fd(raw);
            assert_eq!(libc::ftruncate(raw, len as libc::off_t), 0);
            assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, REQUIRED_SEALS), 0);
            fd
        };
        assert!(matches!(
            Memfd::verify(fd, len),
            Err(MemfdError::NotShmem(m)) if m == libc::HUGETLBFS_MAGIC as u64
        ));
    }

    /// `probe` reads end of stream once every copy of its peer end is closed.
    fn closed(probe: &mut UnixStream) -> bool {
        probe.set_nonblocking(true).unwrap();
        matches!(probe.read(&mut [0u8; 1]), Ok(0))
    }

    #[test]
    fn recv_fds_refuses_and_closes_unexpected_descriptors() {
        let (tx, rx) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 8];
        // CMSG_SPACE rounds up: room for two descriptors when one is wanted, so both the
        // "more than max_fds" check (2) and MSG_CTRUNC (3) are exercised.
        for (count, max) in [(2usize, 1usize), (3, 1), (1, 0), (MAX_FDS, 2)] {
            let (mut probe, end) = UnixStream::pair().unwrap();
            let ends: Vec<BorrowedFd<'_>> = (0..count).map(|_| end.as_fd()).collect();
            send_fds(&tx, b"x", &ends).unwrap();
            drop(ends);
            drop(end);
            assert!(!closed(&mut probe), "in flight");
            let e = recv_fds(&rx, &mut buf, max).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{count} for {max}");
            assert!(
                closed(&mut probe),
                "{count} for {max}: every received copy closed"
            );
        }
        // Nothing unexpected: fine, and so is no descriptor at all.
        send_fds(&tx, b"yz", &[]).unwrap();
        let (n, fds) = recv_fds(&rx, &mut buf, 4).unwrap();
        assert_eq!((n, fds.len()), (2, 0));
        drop(tx);
        assert_eq!(recv_fds(&rx, &mut buf, 4).unwrap().0, 0, "end of stream");
    }

    #[test]
    fn send_fds_refuses_what_cannot_be_sent() {
        let (tx, _rx) = UnixStream::pair().unwrap();
        let m = ring_memfd();
        assert_eq!(
            send_fds(&tx, b"", &[m.as_fd()]).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let many: Vec<BorrowedFd<'_>> = (0..=MAX_FDS).map(|_| m.as_fd()).collect();
        assert_eq!(
            send_fds(&tx, b"x", &many).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    /// `cargo test --release -p splitnet-messaging --all-features --lib -- --ignored --nocapture throughput`
    #[test]
    #[ignore = "measurement"]
    fn throughput_memfd() {
        for (len, count) in [(64usize, 10_000_000u64), (1500, 2_000_000)] {
            let c = RingConfig::new(256 << 10, 1500, 1).unwrap();
            let m = Memfd::create(c"bench", c.region_len()).unwrap();
            c.init(&m.map().unwrap()).unwrap();
            let len_of: fn(u64) -> usize = if len == 64 { |_| 64 } else { |_| 1500 };
            transfer(
                m.map().unwrap(),
                m.map().unwrap(),
                c,
                count,
                len_of,
                false,
                false,
            )
            .report(&format!("memfd mappings, {len} B records, spinning"));
        }
    }
}
