//! Memory shared with a peer that may rewrite any byte of it at any moment.
//!
//! Every access to shared memory goes through [`SharedMem::words`], 32-bit atomics: the
//! peer's racing writes are then races between atomic accesses, which are defined, and every
//! value read is some `u32` (or bytes of one), never a torn or "uninitialised" Rust value.
//! Nothing here forms a reference to shared memory other than `&AtomicU32`.
//!
//! The byte copies [`SharedMem::read`] and [`SharedMem::write`] go a word at a time, with
//! atomics: what is parsed (record and operation headers) is read this way, so no compiler
//! may fetch a checked byte from shared memory a second time. The bulk copies
//! [`SharedMem::copy_out`] and [`SharedMem::copy_in`], for payloads that are only carried to
//! private memory and parsed (if at all) there, default to the same, and an implementation
//! may make them `memcpy`, as `splitnet-fabric`'s `memfd::Mapping` does (this crate has no
//! `unsafe`): a word-at-a-time copy of every frame cost a fifth of all CPU under load.
//!
//! Words hold their bytes in little-endian order whatever the host's order, so the byte at
//! offset `4 * i + j` is byte `j` of `u32::from_le(words[i])`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// An access outside the region or at a misaligned offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MemError {
    /// `len` bytes at `off` do not fit in a region of `size` bytes.
    #[error("{len} bytes at offset {off} are outside the {size}-byte shared region")]
    OutOfBounds {
        /// First byte of the access.
        off: usize,
        /// Bytes accessed.
        len: usize,
        /// Size of the region.
        size: usize,
    },
    /// A 32-bit access at an offset that is not a multiple of 4.
    #[error("32-bit access at misaligned offset {0}")]
    Misaligned(usize),
}

/// A region of memory shared with a peer, as 32-bit atomic words.
///
/// Implementors provide [`SharedMem::words`]; the byte-level accessors are provided and
/// check every offset, so no input (least of all one computed from peer-written values) can
/// make them panic.
pub trait SharedMem {
    /// The region as atomic words.
    fn words(&self) -> &[AtomicU32];

    /// Size of the region in bytes.
    fn len(&self) -> usize {
        self.words().len() * 4
    }

    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.words().is_empty()
    }

    /// Loads the little-endian `u32` at `off` (a multiple of 4) with `Acquire` ordering.
    fn load_u32(&self, off: usize) -> Result<u32, MemError> {
        Ok(u32::from_le(
            word(self.words(), off)?.load(Ordering::Acquire),
        ))
    }

    /// Stores `v` little-endian at `off` (a multiple of 4) with `Release` ordering.
    fn store_u32(&self, off: usize, v: u32) -> Result<(), MemError> {
        word(self.words(), off)?.store(v.to_le(), Ordering::Release);
        Ok(())
    }

    /// Copies `buf.len()` bytes at `off` into `buf` (relaxed loads, no ordering).
    fn read(&self, off: usize, buf: &mut [u8]) -> Result<(), MemError> {
        read_bytes(self.words(), off, buf)
    }

    /// Copies `data` to `off` (relaxed stores, no ordering). Bytes of a word that `data`
    /// only partly covers keep their value, even against racing writes to them.
    fn write(&self, off: usize, data: &[u8]) -> Result<(), MemError> {
        write_bytes(self.words(), off, data)
    }

    /// As [`SharedMem::read`], for bytes carried to private memory and not parsed before
    /// (a payload): an implementation may copy them with `memcpy`.
    fn copy_out(&self, off: usize, buf: &mut [u8]) -> Result<(), MemError> {
        self.read(off, buf)
    }

    /// As [`SharedMem::write`], for a payload: an implementation may use `memcpy`.
    fn copy_in(&self, off: usize, data: &[u8]) -> Result<(), MemError> {
        self.write(off, data)
    }
}

/// Forwards every method, so that a reference or an `Arc` copies as its target does.
macro_rules! forward_shared_mem {
    ($($t:tt)*) => {
        impl<T: SharedMem + ?Sized> SharedMem for $($t)* {
            fn words(&self) -> &[AtomicU32] {
                (**self).words()
            }
            fn read(&self, off: usize, buf: &mut [u8]) -> Result<(), MemError> {
                (**self).read(off, buf)
            }
            fn write(&self, off: usize, data: &[u8]) -> Result<(), MemError> {
                (**self).write(off, data)
            }
            fn copy_out(&self, off: usize, buf: &mut [u8]) -> Result<(), MemError> {
                (**self).copy_out(off, buf)
            }
            fn copy_in(&self, off: usize, data: &[u8]) -> Result<(), MemError> {
                (**self).copy_in(off, data)
            }
        }
    };
}

forward_shared_mem!(&T);
forward_shared_mem!(Arc<T>);

/// Shared memory on the heap of this process, for tests, fuzzing and in-process use.
///
/// Clones share the same words, so one clone can be the producer's and another the
/// consumer's (in one thread or two).
#[derive(Debug, Clone)]
pub struct HeapShared {
    words: Arc<[AtomicU32]>,
}

impl HeapShared {
    /// A zeroed region of `len` bytes rounded up to a multiple of 4.
    pub fn new(len: usize) -> HeapShared {
        HeapShared {
            words: (0..len.div_ceil(4)).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

impl SharedMem for HeapShared {
    fn words(&self) -> &[AtomicU32] {
        &self.words
    }
}

impl MemError {
    /// Checks that `len` bytes at `off` fit in a region of `size` bytes.
    pub fn check(off: usize, len: usize, size: usize) -> Result<(), MemError> {
        match off.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(MemError::OutOfBounds { off, len, size }),
        }
    }
}

fn check(words: &[AtomicU32], off: usize, len: usize) -> Result<(), MemError> {
    MemError::check(off, len, words.len() * 4)
}

fn word(words: &[AtomicU32], off: usize) -> Result<&AtomicU32, MemError> {
    check(words, off, 4)?;
    if !off.is_multiple_of(4) {
        return Err(MemError::Misaligned(off));
    }
    words.get(off / 4).ok_or(MemError::OutOfBounds {
        off,
        len: 4,
        size: words.len() * 4,
    })
}

fn read_bytes(words: &[AtomicU32], off: usize, buf: &mut [u8]) -> Result<(), MemError> {
    check(words, off, buf.len())?;
    let mut pos = off;
    let mut rest = buf;
    // A leading partial word.
    if !pos.is_multiple_of(4) && !rest.is_empty() {
        let skip = pos % 4;
        let n = (4 - skip).min(rest.len());
        let bytes = words[pos / 4].load(Ordering::Relaxed).to_le_bytes();
        let (head, tail) = rest.split_at_mut(n);
        head.copy_from_slice(&bytes[skip..skip + n]);
        rest = tail;
        pos += n;
    }
    // Whole words, then a trailing partial word.
    let first = pos / 4;
    let whole = rest.len() / 4;
    let mut chunks = rest.chunks_exact_mut(4);
    for (dst, w) in (&mut chunks).zip(&words[first..]) {
        dst.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let bytes = words[first + whole].load(Ordering::Relaxed).to_le_bytes();
        let n = tail.len();
        tail.copy_from_slice(&bytes[..n]);
    }
    Ok(())
}

fn write_bytes(words: &[AtomicU32], off: usize, data: &[u8]) -> Result<(), MemError> {
    check(words, off, data.len())?;
    let mut pos = off;
    let mut rest = data;
    if !pos.is_multiple_of(4) && !rest.is_empty() {
        let skip = pos % 4;
        let n = (4 - skip).min(rest.len());
        merge(&words[pos / 4], skip, &rest[..n]);
        rest = &rest[n..];
        pos += n;
    }
    let first = pos / 4;
    let mut chunks = rest.chunks_exact(4);
    for (src, w) in (&mut chunks).zip(&words[first..]) {
        let v = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        w.store(v.to_le(), Ordering::Relaxed);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        merge(&words[first + rest.len() / 4], 0, tail);
    }
    Ok(())
}

/// Replaces bytes `skip..skip + bytes.len()` of one word, leaving the others as they are.
fn merge(w: &AtomicU32, skip: usize, bytes: &[u8]) {
    let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let mut b = u32::from_le(old).to_le_bytes();
        b[skip..skip + bytes.len()].copy_from_slice(bytes);
        Some(u32::from_le_bytes(b).to_le())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn words_are_little_endian() {
        let m = HeapShared::new(8);
        m.store_u32(4, 0x0403_0201).unwrap();
        let mut b = [0u8; 8];
        m.read(0, &mut b).unwrap();
        assert_eq!(b, [0, 0, 0, 0, 1, 2, 3, 4]);
        m.write(1, &[9, 8]).unwrap();
        assert_eq!(m.load_u32(0).unwrap(), 0x0008_0900);
    }

    #[test]
    fn bounds_and_alignment_are_checked() {
        let m = HeapShared::new(16);
        assert_eq!(m.len(), 16);
        assert!(!m.is_empty());
        assert!(HeapShared::new(0).is_empty());
        assert_eq!(m.load_u32(2), Err(MemError::Misaligned(2)));
        assert!(matches!(m.load_u32(16), Err(MemError::OutOfBounds { .. })));
        assert!(matches!(
            m.store_u32(usize::MAX - 1, 0),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(m.read(12, &mut [0; 5]).is_err());
        assert!(m.write(usize::MAX, &[1]).is_err());
        assert!(m.read(16, &mut []).is_ok());
        assert!(m.read(17, &mut []).is_err());
    }

    proptest! {
        /// Byte reads and writes at any offset behave like a plain byte array.
        #[test]
        fn behaves_like_bytes(ops in proptest::collection::vec(
            (0usize..70, proptest::collection::vec(any::<u8>(), 0..20), any::<bool>()), 1..40)
        ) {
            let m = HeapShared::new(64);
            let mut model = [0u8; 64];
            for (off, data, is_write) in ops {
                let fits = off + data.len() <= 64;
                if is_write {
                    prop_assert_eq!(m.write(off, &data).is_ok(), fits);
                    if fits {
                        model[off..off + data.len()].copy_from_slice(&data);
                    }
                } else {
                    let mut buf = vec![0u8; data.len()];
                    prop_assert_eq!(m.read(off, &mut buf).is_ok(), fits);
                    if fits {
                        prop_assert_eq!(&buf[..], &model[off..off + data.len()]);
                    }
                }
            }
            let mut all = [0u8; 64];
            m.read(0, &mut all).unwrap();
            prop_assert_eq!(all, model);
        }
    }
}
