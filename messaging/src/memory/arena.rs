//! A pool arena: shared memory in which one protection domain's regions are laid out, so
//! that the peer writing into them places each frame straight into its element.
//!
//! Allocation is first fit over a list of free ranges, kept sorted and merged: an arena
//! holds a handful of pools, registered at a session's start and after a flush, so nothing
//! smarter pays (and no allocator crate manages memory it does not own).

use crate::memory::SharedMem;
use std::sync::Arc;

/// Shared memory that backs regions.
pub type SharedRegion = Arc<dyn SharedMem + Send + Sync>;

/// Alignment of every region in an arena: a cache line (and a multiple of the 4-byte words).
pub const ARENA_ALIGN: usize = 64;

/// An arena and its free ranges.
pub struct Arena {
    mem: SharedRegion,
    /// Free `(offset, len)` ranges, sorted by offset, never adjacent.
    free: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("len", &self.mem.len())
            .field("free", &self.free)
            .finish()
    }
}

impl Arena {
    /// All of `mem`, free.
    pub fn new(mem: SharedRegion) -> Arena {
        let len = mem.len() / ARENA_ALIGN * ARENA_ALIGN;
        let free = if len > 0 { vec![(0, len)] } else { Vec::new() };
        Arena { mem, free }
    }

    /// The memory.
    pub fn mem(&self) -> &SharedRegion {
        &self.mem
    }

    /// Takes `len` bytes (rounded up to [`ARENA_ALIGN`]); their offset, or `None` if no free
    /// range is large enough.
    pub fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = len.checked_next_multiple_of(ARENA_ALIGN)?.max(ARENA_ALIGN);
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        Some(off)
    }

    /// Gives back `len` bytes at `off`, as [`Arena::alloc`] returned them.
    pub fn free(&mut self, off: usize, len: usize) {
        let Some(len) = len.checked_next_multiple_of(ARENA_ALIGN) else {
            return;
        };
        let len = len.max(ARENA_ALIGN);
        let i = self.free.partition_point(|&(o, _)| o < off);
        debug_assert!(
            self.free.get(i).is_none_or(|&(next, _)| off + len <= next)
                && (i == 0 || self.free[i - 1].0 + self.free[i - 1].1 <= off),
            "freeing {len} bytes at {off}, which overlap a free range"
        );
        self.free.insert(i, (off, len));
        // Merge with the next range, then with the previous one.
        if let Some(&(next, nlen)) = self.free.get(i + 1) {
            if off + len == next {
                self.free[i].1 += nlen;
                self.free.remove(i + 1);
            }
        }
        if i > 0 {
            let (prev, plen) = self.free[i - 1];
            if prev + plen == off {
                self.free[i - 1].1 += self.free[i].1;
                self.free.remove(i);
            }
        }
    }

    /// Free bytes.
    pub fn free_bytes(&self) -> usize {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::HeapShared;
    use proptest::prelude::*;

    fn arena(len: usize) -> Arena {
        Arena::new(Arc::new(HeapShared::new(len)))
    }

    #[test]
    fn ranges_are_aligned_reused_and_merged() {
        let mut a = arena(1024);
        assert_eq!(a.alloc(10), Some(0));
        assert_eq!(a.alloc(64), Some(64));
        assert_eq!(a.alloc(65), Some(128));
        assert_eq!(a.free_bytes(), 1024 - 256);
        assert_eq!(a.alloc(1024), None, "no range is that large");
        a.free(64, 64);
        assert_eq!(a.alloc(64), Some(64), "the hole is reused first");
        a.free(0, 10);
        a.free(128, 65);
        a.free(64, 64);
        assert_eq!(a.free_bytes(), 1024);
        assert_eq!(a.alloc(1024), Some(0), "every range merged back into one");
        assert_eq!(a.alloc(usize::MAX), None);
    }

    proptest! {
        /// Whatever the sequence of allocations and frees: live ranges never overlap, stay
        /// inside the arena, and freeing everything gives the whole arena back.
        #[test]
        fn live_ranges_never_overlap(ops in proptest::collection::vec((any::<bool>(), 1usize..300), 1..80)) {
            let mut a = arena(4096);
            let mut live: Vec<(usize, usize)> = Vec::new();
            for (alloc, n) in ops {
                if alloc || live.is_empty() {
                    if let Some(off) = a.alloc(n) {
                        let len = n.next_multiple_of(ARENA_ALIGN);
                        prop_assert!(off + len <= 4096);
                        prop_assert_eq!(off % ARENA_ALIGN, 0);
                        for &(o, l) in &live {
                            prop_assert!(off + len <= o || o + l <= off);
                        }
                        live.push((off, len));
                    }
                } else {
                    let (o, l) = live.swap_remove(n % live.len());
                    a.free(o, l);
                }
            }
            for (o, l) in live.drain(..) {
                a.free(o, l);
            }
            prop_assert_eq!(a.free_bytes(), 4096);
            prop_assert_eq!(a.alloc(4096), Some(0));
        }
    }
}
