//! The send staging ring: registered memory the transport copies each operation into before
//! posting it, given back in order as the adapter completes the sends. Sans-IO.
//!
//! Operations are staged contiguously (an adapter reads one scatter-gather entry per work
//! request); one that does not fit before the end of the ring starts at offset 0 and the
//! bytes skipped count as used until it completes. Only every Nth work request asks for a
//! completion: completions on one queue pair come in order, so a completion frees what every
//! earlier work request staged.

use std::collections::VecDeque;

/// Space in the ring and the work requests holding it.
#[derive(Debug)]
pub struct Stage {
    size: u64,
    /// Bytes ever taken (free-running), and ever given back.
    head: u64,
    tail: u64,
    /// Staged operations not completed: (id, `head` after it, work requests it takes,
    /// whether it is an RDMA write).
    held: VecDeque<(u64, u64, usize, bool)>,
    /// Work requests of those.
    wrs: usize,
    /// RDMA writes among them.
    writes: usize,
}

impl Stage {
    /// A ring of `size` bytes.
    pub fn new(size: usize) -> Stage {
        Stage {
            size: size as u64,
            head: 0,
            tail: 0,
            held: VecDeque::new(),
            wrs: 0,
            writes: 0,
        }
    }

    /// Bytes of the ring.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// Takes `len` contiguous bytes for operation `wr_id` (ids increase), posted as `wrs`
    /// work requests completing under that id; returns their offset, or `None` until
    /// completions free enough.
    pub fn take(&mut self, wr_id: u64, len: usize, wrs: usize) -> Option<usize> {
        self.take_op(wr_id, len, wrs, false)
    }

    /// As [`Stage::take`], for an RDMA write (counted until it completes).
    pub fn take_write(&mut self, wr_id: u64, len: usize, wrs: usize) -> Option<usize> {
        self.take_op(wr_id, len, wrs, true)
    }

    fn take_op(&mut self, wr_id: u64, len: usize, wrs: usize, write: bool) -> Option<usize> {
        let len = len as u64;
        let at = self.head % self.size;
        // Skip to the start when it does not fit before the end.
        let skip = if at + len > self.size {
            self.size - at
        } else {
            0
        };
        if len > self.size || self.head + skip + len - self.tail > self.size {
            return None;
        }
        self.head += skip + len;
        self.held.push_back((wr_id, self.head, wrs, write));
        self.wrs += wrs;
        self.writes += usize::from(write);
        Some(((self.head - len) % self.size) as usize)
    }

    /// Operation `wr_id` completed: it and every earlier one give their bytes back.
    /// Returns how many work requests that was.
    pub fn complete(&mut self, wr_id: u64) -> usize {
        let mut n = 0;
        while let Some(&(id, end, wrs, write)) = self.held.front() {
            if id > wr_id {
                break;
            }
            self.tail = end;
            self.held.pop_front();
            n += wrs;
            self.writes -= usize::from(write);
        }
        self.wrs -= n;
        n
    }

    /// Whether operation `wr_id` and every one before it completed (or were forgotten).
    pub fn done_through(&self, wr_id: u64) -> bool {
        self.held.front().is_none_or(|&(id, ..)| id > wr_id)
    }

    /// Bytes in use (staged and not completed, skipped bytes included).
    pub fn used(&self) -> usize {
        (self.head - self.tail) as usize
    }

    /// Work requests posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.wrs
    }

    /// RDMA writes posted and not completed.
    pub fn writes(&self) -> usize {
        self.writes
    }

    /// Forgets everything staged (the queue pair is gone). Returns how many RDMA writes
    /// that was: posted, and never completed.
    pub fn clear(&mut self) -> usize {
        self.tail = self.head;
        self.held.clear();
        self.wrs = 0;
        std::mem::take(&mut self.writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn space_comes_back_in_order_and_wraps_whole() {
        let mut s = Stage::new(100);
        assert_eq!(s.take(1, 40, 1), Some(0));
        // A write with its notice: two work requests, one completion.
        assert_eq!(s.take(2, 40, 2), Some(40));
        assert_eq!(s.outstanding(), 3);
        // 20 bytes left at the end, 30 wanted: nothing at the start is free yet.
        assert_eq!(s.take(3, 30, 1), None);
        assert_eq!(s.complete(1), 1);
        // Now it wraps: the 20 bytes at the end are skipped, 30 taken at 0.
        assert_eq!(s.take(3, 30, 1), Some(0));
        assert_eq!(s.used(), 40 + 20 + 30);
        // A completion covers every earlier work request.
        assert!(s.done_through(1) && !s.done_through(2));
        assert_eq!(s.complete(3), 3);
        assert!(s.done_through(3) && s.done_through(99));
        assert_eq!((s.used(), s.outstanding()), (0, 0));
        assert_eq!(s.take(4, 101, 1), None);
    }

    /// RDMA writes are counted until a completion covers them; what the queue pair never
    /// completed is counted when it is forgotten.
    #[test]
    fn writes_never_completed_are_counted_when_cleared() {
        let mut s = Stage::new(100);
        s.take(1, 10, 1);
        s.take_write(2, 10, 1);
        // A plain write with its notice: one operation, one write.
        s.take_write(3, 10, 2);
        s.take(4, 10, 1);
        s.take_write(5, 10, 1);
        assert_eq!((s.writes(), s.outstanding()), (3, 6));
        assert_eq!(s.complete(3), 4);
        assert_eq!(s.writes(), 1);
        assert_eq!(s.clear(), 1, "the write of id 5");
        assert_eq!((s.writes(), s.outstanding(), s.used()), (0, 0, 0));
        assert_eq!(s.clear(), 0);
        s.take_write(6, 10, 1);
        s.complete(6);
        assert_eq!(s.clear(), 0, "completed");
    }

    proptest! {
        /// Ranges in use never overlap and never cross the end; completing everything frees
        /// everything.
        #[test]
        fn staged_ranges_never_overlap(ops in proptest::collection::vec((1usize..60, any::<bool>()), 1..200)) {
            let mut s = Stage::new(128);
            let mut live: VecDeque<(u64, usize, usize)> = VecDeque::new();
            let mut id = 0;
            for (len, complete) in ops {
                if complete {
                    if let Some(&(first, _, _)) = live.front() {
                        s.complete(first);
                        live.pop_front();
                    }
                    continue;
                }
                id += 1;
                if let Some(off) = s.take(id, len, 1) {
                    prop_assert!(off + len <= 128);
                    for &(_, o, l) in &live {
                        prop_assert!(off + len <= o || o + l <= off, "{off}+{len} overlaps {o}+{l}");
                    }
                    live.push_back((id, off, len));
                }
                prop_assert!(s.used() <= 128);
            }
            s.complete(id);
            prop_assert_eq!(s.used(), 0);
        }
    }
}
