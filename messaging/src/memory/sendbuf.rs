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

/// A bounded cache of registered send buffers of one size.
///
/// At most `max` buffers exist at once; when all are in use [`SendBufCache::get`] returns
/// `None` and the caller applies backpressure to its source.
#[derive(Debug)]
pub struct SendBufCache {
    free: Vec<SendBuf>,
    size: usize,
    max: usize,
    live: usize,
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
            stats: CacheStats::default(),
        }
    }

    /// A buffer: a cached one if any, a newly registered one while under the limit.
    pub fn get(&mut self) -> Option<SendBuf> {
        if let Some(mut b) = self.free.pop() {
            self.stats.reuses += 1;
            b.len = 0;
            return Some(b);
        }
        if self.live >= self.max {
            return None;
        }
        self.live += 1;
        self.stats.registrations += 1;
        Some(SendBuf {
            data: vec![0u8; self.size].into_boxed_slice(),
            len: 0,
        })
    }

    /// Returns a buffer to the cache. A buffer of another size (the properties changed) is
    /// deregistered instead.
    pub fn put(&mut self, buf: SendBuf) {
        if buf.capacity() == self.size && self.free.len() < self.max {
            self.free.push(buf);
        } else {
            self.live = self.live.saturating_sub(1);
            self.stats.deregistrations += 1;
        }
    }

    /// Changes the buffer size: cached buffers are deregistered now, buffers in use when
    /// they come back.
    pub fn resize(&mut self, size: usize) {
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

    /// Buffers currently handed out.
    pub fn in_use(&self) -> usize {
        self.live - self.free.len()
    }

    /// Most buffers alive at once.
    pub fn capacity(&self) -> usize {
        self.max
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
