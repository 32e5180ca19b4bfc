//! The peer's remote keys, by the range of its pool arena each opens: a pool's key (used for
//! every write into the pool) or an element's window key (used for one write). Sans-IO.

use std::collections::BTreeMap;

/// Most keys a peer may have open at once: far more than its pools have elements (a pool of
/// 64 KiB elements in a 1 GiB arena has 16,384), few enough that a peer announcing tiny
/// ranges cannot make this side hold much.
pub const MAX_PEER_KEYS: usize = 65_536;

/// A key and the range it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    len: u64,
    rkey: u32,
    /// A window's key: forgotten once used.
    once: bool,
}

/// The key for a write ([`PeerKeys::find`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyUse {
    /// The remote key.
    pub rkey: u32,
    /// A window's key: where its range starts, to forget it once used.
    once_at: Option<u64>,
}

/// The keys the peer told this side, none overlapping another.
#[derive(Debug, Default)]
pub struct PeerKeys {
    /// By the offset of the range's first byte in the peer's arena.
    keys: BTreeMap<u64, Key>,
}

impl PeerKeys {
    /// Records `rkey` for bytes `off..off + len` of the peer's arena (`len` > 0), replacing
    /// every key whose range overlaps it; `once` for a window's key. `false` (nothing
    /// recorded) when the peer would hold more than [`MAX_PEER_KEYS`].
    pub fn insert(&mut self, off: u64, len: u64, rkey: u32, once: bool) -> bool {
        let end = off.saturating_add(len);
        let before = self
            .keys
            .range(..off)
            .next_back()
            .filter(|(s, k)| s.saturating_add(k.len) > off)
            .map(|(s, _)| *s);
        let inside: Vec<u64> = self.keys.range(off..end).map(|(s, _)| *s).collect();
        for s in before.into_iter().chain(inside) {
            self.keys.remove(&s);
        }
        if self.keys.len() >= MAX_PEER_KEYS {
            return false;
        }
        self.keys.insert(off, Key { len, rkey, once });
        true
    }

    /// The key of the range holding byte `off`, if one does.
    pub fn get(&self, off: u64) -> Option<u32> {
        self.holding(off, off.saturating_add(1))
            .map(|(_, k)| k.rkey)
    }

    /// The key of the range holding all of `off..end`, if one does, for a write there:
    /// pass it to [`PeerKeys::used`] once the write is posted.
    pub fn find(&self, off: u64, end: u64) -> Option<KeyUse> {
        self.holding(off, end).map(|(start, k)| KeyUse {
            rkey: k.rkey,
            once_at: k.once.then_some(start),
        })
    }

    /// A write with `key` was posted: a window's key is forgotten (it opens its element
    /// for one write).
    pub fn used(&mut self, key: KeyUse) {
        if let Some(start) = key.once_at {
            self.keys.remove(&start);
        }
    }

    /// [`PeerKeys::find`] and [`PeerKeys::used`] at once.
    #[cfg(test)]
    pub fn take(&mut self, off: u64, end: u64) -> Option<u32> {
        let key = self.find(off, end)?;
        self.used(key);
        Some(key.rkey)
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    fn holding(&self, off: u64, end: u64) -> Option<(u64, Key)> {
        let (&start, &key) = self.keys.range(..=off).next_back()?;
        (end <= start.saturating_add(key.len) && off < end).then_some((start, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_window_key_opens_its_element_once_a_pool_key_its_pool_always() {
        let mut k = PeerKeys::default();
        assert!(k.insert(0, 4096, 7, false));
        assert!(k.insert(8192, 1024, 9, true));
        assert_eq!(k.take(100, 200), Some(7));
        assert_eq!(k.take(100, 200), Some(7));
        // Past the pool's end, or across it.
        assert_eq!(k.take(4000, 4097), None);
        assert_eq!(k.take(8192, 8192 + 1025), None);
        assert_eq!(k.get(8192), Some(9));
        assert_eq!(k.find(8192, 8192 + 1024).map(|u| u.rkey), Some(9));
        assert_eq!(k.take(8192, 8192 + 1024), Some(9));
        assert_eq!(
            k.take(8192, 8192 + 1024),
            None,
            "a window's key is used once"
        );
        // An empty range is held by nothing.
        assert_eq!(k.take(10, 10), None);
    }

    #[test]
    fn a_new_range_replaces_those_it_overlaps() {
        let mut k = PeerKeys::default();
        k.insert(0, 1000, 1, false);
        k.insert(1000, 1000, 2, false);
        k.insert(2000, 1000, 3, false);
        k.insert(500, 1000, 4, true);
        assert_eq!((k.get(0), k.get(999), k.get(1500)), (None, Some(4), None));
        assert_eq!(k.get(2000), Some(3));
        assert_eq!(k.len(), 2);
    }

    #[test]
    fn a_peer_cannot_hold_more_than_the_limit() {
        let mut k = PeerKeys::default();
        for i in 0..MAX_PEER_KEYS as u64 {
            assert!(k.insert(i * 2, 1, 0, true));
        }
        assert!(!k.insert(u64::MAX - 5, 1, 0, true));
        // Replacing one is still possible.
        assert!(k.insert(0, 1, 5, true));
        assert_eq!(k.get(0), Some(5));
    }

    proptest! {
        /// Whatever the peer announces, no two ranges overlap, and the key a write gets is
        /// the last one announced for a range holding the whole write.
        #[test]
        fn ranges_never_overlap(ops in proptest::collection::vec((0u64..64, 1u64..16, any::<bool>()), 1..100),
                                probe in (0u64..80, 1u64..8)) {
            let mut k = PeerKeys::default();
            let mut model: Vec<(u64, u64, u32)> = Vec::new();
            for (i, (off, len, once)) in ops.into_iter().enumerate() {
                k.insert(off, len, i as u32, once);
                model.retain(|&(o, l, _)| o + l <= off || off + len <= o);
                model.push((off, len, i as u32));
            }
            let v: Vec<_> = k.keys.iter().map(|(s, key)| (*s, key.len)).collect();
            for w in v.windows(2) {
                prop_assert!(w[0].0 + w[0].1 <= w[1].0);
            }
            let (off, len) = probe;
            let want = model.iter().find(|&&(o, l, _)| o <= off && off + len <= o + l).map(|m| m.2);
            prop_assert_eq!(k.take(off, off + len), want);
        }
    }
}
