//! The bytes of a delivered frame: in private memory, or in a pool shared with the peer.
//!
//! A frame the peer placed in a pool of shared memory (`docs/transports.md`, "Pools in shared
//! memory") stays there until it is released, and the peer may rewrite it at any moment. It
//! is never seen through a Rust reference: [`SharedBytes`] copies ranges out
//! ([`SharedBytes::copy_out`], whose copy is then private and checked once) or hands the
//! kernel its address (`sys::write_parts`), where the kernel copies it.

use crate::memory::{MemError, SharedMem};
use std::sync::atomic::AtomicU32;

/// A delivered frame.
#[derive(Clone, Copy)]
pub enum Frame<'a> {
    /// In private memory.
    Private(&'a [u8]),
    /// In a pool the peer shares and may rewrite at any moment.
    Shared(SharedBytes<'a>),
}

impl std::fmt::Debug for Frame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Frame::Private(b) => write!(f, "Frame::Private({} bytes)", b.len()),
            Frame::Shared(s) => write!(f, "Frame::Shared({} bytes at {})", s.len, s.off),
        }
    }
}

impl Frame<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Frame::Private(b) => b.len(),
            Frame::Shared(s) => s.len,
        }
    }

    /// Whether the frame is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the first `buf.len()` bytes (at most the frame's) into `buf`; returns how many.
    pub fn head(&self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.len());
        match self {
            Frame::Private(b) => buf[..n].copy_from_slice(&b[..n]),
            // In bounds: `n` is at most the frame's length.
            Frame::Shared(s) => s.copy_out(0, &mut buf[..n]).unwrap_or_default(),
        }
        n
    }

    /// A private copy of the whole frame, in `out` (cleared first).
    pub fn copy_to(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Frame::Private(b) => out.extend_from_slice(b),
            Frame::Shared(s) => {
                out.resize(s.len, 0);
                s.copy_out(0, out).unwrap_or_default();
            }
        }
    }
}

/// A range of shared memory holding a frame.
#[derive(Clone, Copy)]
pub struct SharedBytes<'a> {
    mem: &'a (dyn SharedMem + Send + Sync),
    off: usize,
    len: usize,
}

impl<'a> SharedBytes<'a> {
    /// The `len` bytes at `off` of `mem`, if they lie inside it.
    pub fn new(
        mem: &'a (dyn SharedMem + Send + Sync),
        off: usize,
        len: usize,
    ) -> Result<Self, MemError> {
        MemError::check(off, len, mem.len())?;
        Ok(SharedBytes { mem, off, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes after the first `n` (none if `n` is beyond the end).
    pub fn after(&self, n: usize) -> SharedBytes<'a> {
        let n = n.min(self.len);
        SharedBytes {
            mem: self.mem,
            off: self.off + n,
            len: self.len - n,
        }
    }

    /// Copies `buf.len()` bytes starting `at` bytes into the range.
    pub fn copy_out(&self, at: usize, buf: &mut [u8]) -> Result<(), MemError> {
        MemError::check(at, buf.len(), self.len)?;
        self.mem.copy_out(self.off + at, buf)
    }

    /// Copies `data` into the range, starting `at` bytes into it.
    pub fn copy_in(&self, at: usize, data: &[u8]) -> Result<(), MemError> {
        MemError::check(at, data.len(), self.len)?;
        self.mem.copy_in(self.off + at, data)
    }

    /// The words of the shared memory, and the range's offset and length in bytes within
    /// them (in bounds by construction): what `sys` hands the kernel.
    pub fn raw(&self) -> (&'a [AtomicU32], usize, usize) {
        (self.mem.words(), self.off, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::HeapShared;

    #[test]
    fn shared_bytes_stay_inside_their_memory_and_range() {
        let mem = HeapShared::new(64);
        mem.write(8, b"0123456789").unwrap();
        assert!(SharedBytes::new(&mem, 60, 8).is_err());
        assert!(SharedBytes::new(&mem, usize::MAX, 2).is_err());
        let s = SharedBytes::new(&mem, 8, 10).unwrap();
        let f = Frame::Shared(s);
        assert_eq!(f.len(), 10);
        let mut head = [0u8; 4];
        assert_eq!(f.head(&mut head), 4);
        assert_eq!(&head, b"0123");
        let mut long = [0u8; 32];
        assert_eq!(f.head(&mut long), 10);
        let mut v = vec![1, 2, 3];
        f.copy_to(&mut v);
        assert_eq!(v, b"0123456789");
        let mut two = [0u8; 2];
        assert!(s.copy_out(9, &mut two).is_err(), "past the frame's end");
        s.copy_out(8, &mut two).unwrap();
        assert_eq!(&two, b"89");
        let (words, off, len) = s.raw();
        assert_eq!((words.len(), off, len), (16, 8, 10));
        s.copy_in(8, b"xy").unwrap();
        assert!(s.copy_in(9, b"xy").is_err(), "past the frame's end");
        s.copy_out(8, &mut two).unwrap();
        assert_eq!(&two, b"xy");
        s.copy_in(8, b"89").unwrap();
        let rest = s.after(4);
        assert_eq!(rest.raw().1..rest.raw().1 + rest.len(), 12..18);
        rest.copy_out(0, &mut two).unwrap();
        assert_eq!(&two, b"45");
        assert!(s.after(11).is_empty());
        let p = Frame::Private(b"abc");
        p.copy_to(&mut v);
        assert_eq!(v, b"abc");
        assert_eq!(p.head(&mut head), 3);
    }
}
