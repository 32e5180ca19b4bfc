//! Send buffers and their registration cache (seed 000).
//!
//! Frames are read from the TAP or the NIC straight into a [`SendBuf`], and the adapter
//! writes them to the fabric from there. Buffers are registered once, when the cache
//! creates them, and reused for every later frame; a buffer is deregistered only when it is
//! freed or when its properties (its size) change. With the software adapter registration is
//! bookkeeping; a verbs transport would call `ibv_reg_mr` exactly where [`SendBufCache`]
//! counts a registration.

/// A registered, fixed-capacity buffer holding one outgoing frame.
#[derive(Debug)]
pub struct SendBuf {
    data: Box<[u8]>,
    len: usize,
}

impl SendBuf {
    /// The whole buffer, to read a frame into.
    pub fn space(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// Sets the length of the frame held (clamped to the capacity).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.data.len());
    }

    /// Length of the frame held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no frame is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    /// The frame held.
    pub fn as_slice(&self) -> &[u8] {
        &self.data[..self.len]
    }

    /// The frame held, to change in place (an ECN mark).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.data[..self.len]
    }

    /// Copies `bytes` in; false (and unchanged) if they do not fit.
    pub fn fill_from(&mut self, bytes: &[u8]) -> bool {
        match self.data.get_mut(..bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.len = bytes.len();
                true
            }
            None => false,
        }
    }
}

/// A buffer of `size` bytes from `free`, or a new one while fewer than `max` are `live`.
fn take(
    free: &mut Vec<SendBuf>,
    live: &mut usize,
    size: usize,
    max: usize,
    stats: &mut CacheStats,
) -> Option<SendBuf> {
    if let Some(mut b) = free.pop() {
        stats.reuses += 1;
        b.len = 0;
        return Some(b);
    }
    if *live >= max {
        return None;
    }
    *live += 1;
    stats.registrations += 1;
    Some(SendBuf {
        data: vec![0u8; size].into_boxed_slice(),
        len: 0,
    })
}

/// Counters of the registration cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Buffers registered (created).
    pub registrations: u64,
    /// Buffers deregistered (freed).
    pub deregistrations: u64,
    /// Buffers handed out again without registering.
    pub reuses: u64,
}

/// A bounded cache of registered send buffers of one size, and optionally of small ones.
///
/// At most `max` buffers exist at once; when all are in use [`SendBufCache::get`] returns
/// `None` and the caller applies backpressure to its source. Small buffers
/// ([`SendBufCache::with_small`]) take a copy of a small frame read into a full-size one
/// ([`SendBufCache::shrink`]), which goes straight back to be read into again: a backlog of
/// small frames then holds small buffers, not full-size ones.
#[derive(Debug)]
pub struct SendBufCache {
    free: Vec<SendBuf>,
    size: usize,
    max: usize,
    live: usize,
    small: Vec<SendBuf>,
    small_size: usize,
    small_max: usize,
    small_live: usize,
    stats: CacheStats,
}

impl SendBufCache {
    /// A cache of buffers of `size` bytes, at most `max` of them alive.
    pub fn new(size: usize, max: usize) -> SendBufCache {
        SendBufCache {
            free: Vec::new(),
            size,
            max,
            live: 0,
            small: Vec::new(),
            small_size: 0,
            small_max: 0,
            small_live: 0,
            stats: CacheStats::default(),
        }
    }

    /// The same cache with up to `max` small buffers of `size` bytes besides (none when
    /// `size` is not below the full size).
    pub fn with_small(mut self, size: usize, max: usize) -> SendBufCache {
        if size < self.size {
            self.small_size = size;
            self.small_max = max;
        }
        self
    }

    /// `buf`'s frame in a small buffer when it fits one and one is free or may be made,
    /// `buf` itself back in the cache; otherwise `buf` unchanged.
    pub fn shrink(&mut self, buf: SendBuf) -> SendBuf {
        if buf.len() > self.small_size || buf.capacity() == self.small_size {
            return buf;
        }
        let Some(mut small) = self.small_buf() else {
            return buf;
        };
        small.fill_from(buf.as_slice());
        self.put(buf);
        small
    }

    /// A free small buffer, or a new one while under their limit.
    fn small_buf(&mut self) -> Option<SendBuf> {
        let (size, max) = (self.small_size, self.small_max);
        take(
            &mut self.small,
            &mut self.small_live,
            size,
            max,
            &mut self.stats,
        )
    }

    /// Bytes of the buffer a frame of `len` bytes takes: a small one where it fits one, else
    /// a full-size one ([`SendBufCache::get_for`] gives a full-size one too when no small
    /// one is left).
    pub fn size_for(&self, len: usize) -> usize {
        if len <= self.small_size && self.small_max > 0 {
            self.small_size
        } else {
            self.size
        }
    }

    /// A buffer for a frame of `len` bytes: a small one when the frame fits one and one is
    /// free or may be made, else a full-size one ([`SendBufCache::get`]).
    pub fn get_for(&mut self, len: usize) -> Option<SendBuf> {
        if len <= self.small_size {
            if let Some(b) = self.small_buf() {
                return Some(b);
            }
        }
        self.get()
    }

    /// A buffer: a cached one if any, a newly registered one while under the limit.
    pub fn get(&mut self) -> Option<SendBuf> {
        take(
            &mut self.free,
            &mut self.live,
            self.size,
            self.max,
            &mut self.stats,
        )
    }

    /// Returns a buffer to the cache. A buffer of another size (the properties changed) is
    /// deregistered instead.
    pub fn put(&mut self, buf: SendBuf) {
        if buf.capacity() == self.size && self.free.len() < self.max {
            self.free.push(buf);
        } else if buf.capacity() == self.small_size && self.small_max > 0 {
            if self.small.len() < self.small_max {
                self.small.push(buf);
            } else {
                self.small_live = self.small_live.saturating_sub(1);
                self.stats.deregistrations += 1;
            }
        } else {
            self.live = self.live.saturating_sub(1);
            self.stats.deregistrations += 1;
        }
    }

    /// Changes the buffer size: cached buffers are deregistered now, buffers in use when
    /// they come back.
    pub fn resize(&mut self, size: usize) {
        if size <= self.small_size {
            // Small buffers only hold what is smaller than the full size.
            let n = self.small.len();
            self.small.clear();
            self.small_live -= n;
            self.stats.deregistrations += n as u64;
            self.small_size = 0;
            self.small_max = 0;
        }
        if size != self.size {
            self.size = size;
            let n = self.free.len();
            self.free.clear();
            self.live -= n;
            self.stats.deregistrations += n as u64;
        }
    }

    /// True when [`SendBufCache::get`] would return a buffer.
    pub fn has_free(&self) -> bool {
        !self.free.is_empty() || self.live < self.max
    }

    /// Buffers currently handed out, small ones included.
    pub fn in_use(&self) -> usize {
        self.live - self.free.len() + self.small_live - self.small.len()
    }

    /// Most buffers alive at once.
    pub fn capacity(&self) -> usize {
        self.max
    }

    /// Bytes of the buffers currently handed out (their capacity), small ones included.
    pub fn in_use_bytes(&self) -> usize {
        (self.live - self.free.len()) * self.size
            + (self.small_live - self.small.len()) * self.small_size
    }

    /// Bytes of all the buffers there may be at once, small ones included.
    pub fn capacity_bytes(&self) -> usize {
        self.max * self.size + self.small_max * self.small_size
    }

    /// Buffer size.
    pub fn buffer_size(&self) -> usize {
        self.size
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_once_and_reuses() {
        let mut c = SendBufCache::new(128, 2);
        let a = c.get().unwrap();
        let b = c.get().unwrap();
        assert!(c.get().is_none(), "bounded at max");
        assert!(!c.has_free());
        assert_eq!(c.in_use(), 2);
        c.put(a);
        assert!(c.has_free());
        c.put(b);
        for _ in 0..10 {
            let x = c.get().unwrap();
            c.put(x);
        }
        assert_eq!(c.stats().registrations, 2);
        assert_eq!(c.stats().reuses, 10);
        assert_eq!(c.in_use(), 0);
    }

    #[test]
    fn a_buffer_for_a_small_frame_is_small_while_there_are_any() {
        let mut c = SendBufCache::new(128, 2).with_small(16, 1);
        let small = c.get_for(16).unwrap();
        assert_eq!(small.capacity(), 16);
        let full = c.get_for(16).unwrap();
        assert_eq!(full.capacity(), 128, "no small one left: a full-size one");
        assert_eq!(
            c.get_for(17).unwrap().capacity(),
            128,
            "too large for a small one"
        );
        assert!(c.get_for(1).is_none(), "none of either left");
        assert_eq!((c.size_for(16), c.size_for(17)), (16, 128));
        assert_eq!(c.in_use_bytes(), 16 + 2 * 128);
        assert_eq!(c.capacity_bytes(), 16 + 2 * 128);
        c.put(small);
        assert_eq!(c.get_for(3).unwrap().capacity(), 16, "the small one again");
        c.put(full);
        let mut none = SendBufCache::new(128, 1);
        assert_eq!(
            none.get_for(1).unwrap().capacity(),
            128,
            "no small buffers at all"
        );
        assert_eq!(none.size_for(1), 128);
    }

    #[test]
    fn a_small_frame_moves_to_a_small_buffer_and_frees_its_full_size_one() {
        let mut c = SendBufCache::new(128, 1).with_small(16, 2);
        let mut shrunk = Vec::new();
        for i in 0..2u8 {
            let mut b = c.get().expect("the one full-size buffer is free again");
            assert!(b.fill_from(&[i; 10]));
            let s = c.shrink(b);
            assert_eq!((s.capacity(), s.as_slice()), (16, &[i; 10][..]));
            shrunk.push(s);
        }
        assert_eq!(c.in_use(), 2, "the two small ones");
        // No small buffer left: the frame stays where it is.
        let mut b = c.get().unwrap();
        assert!(b.fill_from(&[7; 10]));
        let kept = c.shrink(b);
        assert_eq!((kept.capacity(), kept.len()), (128, 10));
        assert!(c.get().is_none(), "the full-size one is in use");
        // Too large for a small buffer: unchanged.
        c.put(shrunk.pop().unwrap());
        let mut big = kept;
        assert!(big.fill_from(&[1; 17]));
        let big = c.shrink(big);
        assert_eq!((big.capacity(), big.len()), (128, 17));
        c.put(big);
        c.put(shrunk.pop().unwrap());
        assert_eq!(c.in_use(), 0);
        assert_eq!(
            c.stats().registrations,
            3,
            "one full-size buffer, two small"
        );
    }

    #[test]
    fn resize_to_the_small_size_or_below_ends_the_small_buffers() {
        let mut c = SendBufCache::new(128, 1).with_small(16, 2);
        let mut b = c.get().unwrap();
        b.fill_from(&[1; 4]);
        let s = c.shrink(b);
        c.put(s);
        c.resize(16);
        assert_eq!(c.in_use(), 0);
        let mut b = c.get().unwrap();
        b.fill_from(&[1; 4]);
        assert_eq!(
            c.shrink(b).capacity(),
            16,
            "a full-size buffer of the new size"
        );
        assert!(SendBufCache::new(16, 1).with_small(16, 4).small_max == 0);
    }

    #[test]
    fn resize_deregisters() {
        let mut c = SendBufCache::new(128, 4);
        let a = c.get().unwrap();
        let b = c.get().unwrap();
        c.put(a);
        c.resize(256);
        assert_eq!(c.stats().deregistrations, 1);
        c.put(b); // old size: deregistered on return
        assert_eq!(c.stats().deregistrations, 2);
        assert_eq!(c.get().unwrap().capacity(), 256);
    }

    #[test]
    fn fill_from_bounds() {
        let mut c = SendBufCache::new(4, 1);
        let mut b = c.get().unwrap();
        assert!(!b.fill_from(&[1, 2, 3, 4, 5]));
        assert!(b.fill_from(&[1, 2, 3]));
        assert_eq!(b.as_slice(), &[1, 2, 3]);
    }
}
