//! One-touch element grants over memory windows (seed 004), where the device has them: each
//! element this side grants the peer gets a window of its own, bound over the element's
//! bytes, and its key is told the peer; when the peer's write into the element completes,
//! the window is closed (bound to no bytes, which also changes its key), so a second write
//! with that key, or one outside the element, fails in the adapter. A pool's own
//! registration gives the peer no access. Sans-IO: which window serves which element, and
//! the binds to post, in the order the send queue must execute them.

use splitnet_messaging::memory::Handle;
use std::collections::{HashMap, VecDeque};

/// A work request to post for the windows, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowOp {
    /// Bind window `window` over `element` of pool `handle`, then tell the peer its key.
    Bind {
        /// The window's index.
        window: usize,
        /// The pool.
        handle: Handle,
        /// The element.
        element: u32,
    },
    /// Close window `window`, bound over `element` of pool `handle` until now.
    Close {
        /// The window's index.
        window: usize,
        /// The pool.
        handle: Handle,
        /// The element.
        element: u32,
    },
    /// Every earlier work request of pool `handle`'s windows is posted: its registration may
    /// go once they completed.
    Release(Handle),
}

/// The windows of one queue pair and the elements they are bound to.
#[derive(Debug, Default)]
pub struct Windows {
    /// Windows allocated.
    count: usize,
    /// Closed windows, longest closed first: a window's 256 key tags go round as slowly
    /// as the windows allow.
    free: VecDeque<usize>,
    /// The window bound over each granted element.
    bound: HashMap<(Handle, u32), usize>,
    ops: VecDeque<WindowOp>,
}

impl Windows {
    /// Adds a closed window; returns its index.
    pub fn add(&mut self) -> usize {
        self.free.push_back(self.count);
        self.count += 1;
        self.count - 1
    }

    /// Whether the next grant needs a window added first.
    pub fn needs_window(&self) -> bool {
        self.free.is_empty()
    }

    /// `element` of `handle` was granted to the peer: binds a free window over it (none
    /// needed if one is bound there already: `Some(false)`). `None` if no window is free.
    pub fn grant(&mut self, handle: Handle, element: u32) -> Option<bool> {
        if self.bound.contains_key(&(handle, element)) {
            return Some(false);
        }
        let window = self.free.pop_front()?;
        self.bound.insert((handle, element), window);
        self.ops.push_back(WindowOp::Bind {
            window,
            handle,
            element,
        });
        Some(true)
    }

    /// The peer's write into `element` of `handle` completed: its window is closed (one
    /// touch) and free for another grant. Whether it had one.
    pub fn written(&mut self, handle: Handle, element: u32) -> bool {
        let window = self.bound.remove(&(handle, element));
        if let Some(window) = window {
            self.close(window, handle, element);
        }
        window.is_some()
    }

    /// Closes every window bound in pool `handle` (its grants are withdrawn); how many.
    pub fn revoke(&mut self, handle: Handle) -> usize {
        let mut gone: Vec<(u32, usize)> = self
            .bound
            .iter()
            .filter(|((h, _), _)| *h == handle)
            .map(|(&(_, e), &w)| (e, w))
            .collect();
        gone.sort_unstable();
        for &(e, w) in &gone {
            self.bound.remove(&(handle, e));
            self.close(w, handle, e);
        }
        gone.len()
    }

    /// Pool `handle` is freed: its windows are closed (how many), then
    /// [`WindowOp::Release`] says when its registration may go.
    pub fn release(&mut self, handle: Handle) -> usize {
        let closed = self.revoke(handle);
        self.ops.push_back(WindowOp::Release(handle));
        closed
    }

    fn close(&mut self, window: usize, handle: Handle, element: u32) {
        self.ops.push_back(WindowOp::Close {
            window,
            handle,
            element,
        });
        self.free.push_back(window);
    }

    /// The next operation to post.
    pub fn next_op(&self) -> Option<WindowOp> {
        self.ops.front().copied()
    }

    /// The operation [`Windows::next_op`] returned was posted.
    pub fn posted(&mut self) {
        self.ops.pop_front();
    }

    /// Operations waiting to be posted.
    pub fn pending(&self) -> usize {
        self.ops.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(i: u32) -> Handle {
        Handle::new(i, 0)
    }

    fn drain(w: &mut Windows) -> Vec<WindowOp> {
        let mut v = Vec::new();
        while let Some(op) = w.next_op() {
            v.push(op);
            w.posted();
        }
        v
    }

    #[test]
    fn a_grant_binds_a_window_a_write_closes_it() {
        let mut w = Windows::default();
        assert!(w.needs_window());
        assert_eq!(w.grant(h(1), 0), None);
        assert_eq!(w.add(), 0);
        assert_eq!(w.grant(h(1), 0), Some(true));
        assert_eq!(w.grant(h(1), 0), Some(false), "bound already");
        assert!(w.written(h(1), 0));
        assert!(!w.written(h(1), 0));
        assert_eq!(w.grant(h(1), 0), Some(true));
        let bind = WindowOp::Bind {
            window: 0,
            handle: h(1),
            element: 0,
        };
        let close = WindowOp::Close {
            window: 0,
            handle: h(1),
            element: 0,
        };
        assert_eq!(drain(&mut w), [bind, close, bind]);
    }

    #[test]
    fn a_released_pool_closes_its_windows_before_it_goes() {
        let mut w = Windows::default();
        for _ in 0..3 {
            w.add();
        }
        w.grant(h(1), 0);
        w.grant(h(2), 0);
        w.grant(h(1), 1);
        drain(&mut w);
        w.release(h(1));
        assert_eq!(w.revoke(h(1)), 0, "closed already");
        assert_eq!(
            drain(&mut w),
            [
                WindowOp::Close {
                    window: 0,
                    handle: h(1),
                    element: 0
                },
                WindowOp::Close {
                    window: 2,
                    handle: h(1),
                    element: 1
                },
                WindowOp::Release(h(1))
            ]
        );
        // The closed windows serve the next grants, the longest closed first.
        assert_eq!(w.grant(h(3), 5), Some(true));
        assert_eq!(w.grant(h(3), 6), Some(true));
        assert_eq!(w.grant(h(3), 7), None);
    }

    proptest! {
        /// Whatever the order of grants, writes and revocations: a window is bound over at
        /// most one element at a time, binds only a closed window, closes only a bound
        /// one, and every element granted and not written has a window bound over it.
        #[test]
        fn each_window_serves_one_element_at_a_time(events in proptest::collection::vec((0u8..3, 0u32..2, 0u32..4), 1..200)) {
            let mut w = Windows::default();
            for _ in 0..4 {
                w.add();
            }
            // What the adapter would have: per window, the element it is bound over.
            let mut adapter: Vec<Option<(Handle, u32)>> = vec![None; 4];
            let mut granted = std::collections::HashSet::new();
            for (kind, pool, element) in events {
                match kind {
                    0 => {
                        if w.grant(h(pool), element).is_some() {
                            granted.insert((h(pool), element));
                        }
                    }
                    1 => {
                        let had = w.written(h(pool), element);
                        prop_assert_eq!(had, granted.remove(&(h(pool), element)));
                    }
                    _ => {
                        let before = granted.len();
                        granted.retain(|g| g.0 != h(pool));
                        prop_assert_eq!(w.revoke(h(pool)), before - granted.len());
                    }
                }
                for op in drain(&mut w) {
                    match op {
                        WindowOp::Bind { window, handle, element } => {
                            prop_assert_eq!(adapter[window], None);
                            adapter[window] = Some((handle, element));
                        }
                        WindowOp::Close { window, handle, element } => {
                            prop_assert_eq!(adapter[window], Some((handle, element)));
                            adapter[window] = None;
                        }
                        WindowOp::Release(_) => {}
                    }
                }
                let mut open: Vec<_> = adapter.iter().flatten().copied().collect();
                open.sort_unstable_by_key(|&(h, e)| (h.index(), e));
                let mut want: Vec<_> = granted.iter().copied().collect();
                want.sort_unstable_by_key(|&(h, e)| (h.index(), e));
                prop_assert_eq!(open, want);
            }
        }
    }
}
