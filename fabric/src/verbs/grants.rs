//! What the peer may write, as the adapter enforces it: each of this side's pools registered
//! on its own; where the device has memory windows, a window bound over each element granted
//! and closed when the peer's write into it completes (seed 004's one-touch grant),
//! else the pool's key; and the keys the peer tells of its own.

use super::windows::WindowOp;
use super::*;
use splitnet_messaging::memory::GrantEvent;

impl VerbsTransport {
    /// Follows the registry: registers the pools it added since the last look and
    /// deregisters those it freed (a write that arrives later, with an old key, fails in the
    /// adapter); with windows, binds one over each element granted since and closes
    /// those of grants withdrawn.
    pub(super) fn sync_keys(&mut self, reg: &mut Registry) -> Result<(), ChannelError> {
        // A control channel takes no writes: none of its pools is registered here.
        let Some(pools) = self.pools.clone() else {
            return Ok(());
        };
        self.watch.get_or_insert_with(|| reg.layout_watch());
        if self.windows.is_some() {
            reg.log_grants(self.domain);
        }
        if self.layout == Some(reg.layout()) {
            return Ok(());
        }
        self.layout = Some(reg.layout());
        let mut events = Vec::new();
        reg.take_grants(self.domain, &mut events);
        let now = reg.arena_regions(self.domain);
        let mut i = 0;
        while i < self.keys.len() {
            if now.iter().any(|(h, ..)| *h == self.keys[i].handle) {
                i += 1;
                continue;
            }
            let freed = self.keys.swap_remove(i);
            if let (true, Some(w)) = (freed.windowed, &mut self.windows) {
                // Deregistered once its windows' closes are done.
                self.windowed -= freed.mrs.len();
                self.stats.close += w.release(freed.handle) as u64;
                self.retired.push((None, freed));
            }
        }
        for event in events {
            match event {
                GrantEvent::Granted(h, e) if self.keys.iter().any(|k| k.handle == h) => {
                    self.open_window(h, e)?
                }
                // A pool not registered here yet: its grants are looked up below.
                GrantEvent::Granted(..) => {}
                GrantEvent::Revoked(h) => {
                    if let Some(w) = &mut self.windows {
                        self.stats.close += w.revoke(h) as u64;
                    }
                }
            }
        }
        // Elements of new pools past MAX_WINDOWED_ELEMENTS (granted with their pool's key).
        let mut keyed = 0u64;
        for (handle, off, len) in now {
            if self.keys.iter().any(|k| k.handle == handle) {
                continue;
            }
            let Some((element_size, count)) = reg.geometry(handle) else {
                continue;
            };
            // Without windows one registration for the pool, its key told the peer; with
            // windows one per element, which the peer cannot write, each window bound over
            // one (so the adapter confines a window's write to its element even where it
            // checks a window's writes against its region's bounds only, as Soft-RoCE does).
            // A peer's pools beyond MAX_WINDOWED_ELEMENTS get a key each: what it asks for
            // costs this side a bounded number of registrations and windows.
            let windowed =
                self.windows.is_some() && self.windowed + count as usize <= MAX_WINDOWED_ELEMENTS;
            let ranges: Vec<(u64, u64)> = match windowed {
                true => (0..u64::from(count))
                    .map(|e| (off + e * u64::from(element_size), u64::from(element_size)))
                    .collect(),
                false => vec![(off, len)],
            };
            let access = match windowed {
                true => sys::Access::Windowed,
                false => sys::Access::RemoteWrite,
            };
            let mut mrs = Vec::with_capacity(ranges.len());
            for (at, n) in ranges {
                match Mr::shared(&self.pd, pools.clone(), at, n, access) {
                    Ok(mr) => mrs.push(mr),
                    Err(e) => return Err(self.fail(format!("cannot register a pool: {e}"))),
                }
            }
            if let (false, Some(mr)) = (windowed, mrs.first()) {
                let rkey = mr.rkey();
                self.key_tx.push(KeyNotice { off, len, rkey }.emit());
            }
            if windowed {
                self.windowed += mrs.len();
            } else if self.windows.is_some() {
                keyed += u64::from(count);
            }
            self.keys.push(PoolKey {
                handle,
                off,
                element_size,
                windowed,
                mrs,
            });
            if windowed {
                for e in (0..count).filter(|&e| reg.is_granted(handle, e)) {
                    self.open_window(handle, e)?;
                }
            }
        }
        if keyed > 0 && !self.keyed_said {
            self.keyed_said = true;
            tracing::warn!(
                qpn = self.qp.qpn(),
                windowed = self.windowed,
                keyed,
                "RDMA element windows: more than {MAX_WINDOWED_ELEMENTS} pool elements on this queue pair: {} get a window each, {keyed} their pool's key instead (said once per queue pair)",
                self.windowed
            );
        }
        Ok(())
    }

    /// Binds a window over `element` of pool `handle`, granted to the peer, allocating one
    /// more when none is free.
    fn open_window(&mut self, handle: Handle, element: u32) -> Result<(), ChannelError> {
        if !self.keys.iter().any(|k| k.handle == handle && k.windowed) {
            return Ok(());
        }
        let Some(w) = &mut self.windows else {
            return Ok(());
        };
        if w.needs_window() {
            match Mw::new(&self.pd) {
                Ok(mw) => {
                    w.add();
                    self.mws.push(mw);
                }
                Err(e) => return Err(self.fail(e.to_string())),
            }
        }
        if w.grant(handle, element) == Some(true) {
            self.stats.bind += 1;
        }
        Ok(())
    }

    /// The peer's write into an element completed (`done`, once checked): its window, if
    /// it has one, is closed, so its key opens nothing any more.
    pub(super) fn touched(
        &mut self,
        done: Result<RxCompletion, ChannelError>,
    ) -> Result<RxCompletion, ChannelError> {
        if let (
            Ok(RxCompletion::Write {
                handle, element, ..
            }),
            Some(w),
        ) = (&done, &mut self.windows)
        {
            if w.written(*handle, *element) {
                self.stats.close += 1;
            }
        }
        done
    }

    /// Binds and closes windows as granted and written, each bind's key to be told the
    /// peer, then adds to the batch the notices of the keys of new pools and of windows
    /// bound. Returns whether the send queue is the windows' for now, nothing else to be
    /// posted.
    ///
    /// Binds go in phases, alone on the send queue: once it is idle, every bind and close
    /// due, then nothing until they completed. Soft-RoCE (kernel 6.1) executes a bind again
    /// when it retransmits work requests posted before it (after an RNR NAK or a timeout),
    /// which fails and stalls or breaks the queue pair; with nothing unacknowledged before a
    /// bind, or after it until it completed, there is nothing to retransmit across it.
    /// `ibv_bind_mw` posts at once: this runs before anything is batched, so work requests
    /// still go in the order of their ids.
    pub(super) fn post_grants(&mut self) -> Result<bool, ChannelError> {
        if let Some(last) = self.binding {
            if !self.stage.done_through(last) {
                return Ok(true);
            }
            self.binding = None;
        }
        // The keys of the last phase's binds go before another phase starts.
        if self.window_tx.is_empty() && self.windows.as_ref().is_some_and(|w| w.pending() > 0) {
            if self.stage.outstanding() > 0 {
                // Let the queue drain first.
                return Ok(true);
            }
            self.bind_phase()?;
            if self.binding.is_some() {
                return Ok(true);
            }
        }
        self.post_notices(false);
        self.post_notices(true);
        Ok(false)
    }

    /// Posts every bind and close due (as many as the send queue holds), each asking for
    /// its completion; the phase lasts until the last completed.
    fn bind_phase(&mut self) -> Result<(), ChannelError> {
        while let Some(op) = self.windows.as_ref().and_then(Windows::next_op) {
            if self.stage.outstanding() >= SEND_DEPTH as usize {
                break;
            }
            let (window, handle, element) = match op {
                WindowOp::Bind {
                    window,
                    handle,
                    element,
                } => (window, handle, Ok(element)),
                WindowOp::Close {
                    window,
                    handle,
                    element,
                } => (window, handle, Err(element)),
                WindowOp::Release(handle) => {
                    // Every close of its windows is an earlier work request.
                    let last = self.next_wr - 1;
                    for r in self.retired.iter_mut().filter(|r| r.1.handle == handle) {
                        r.0.get_or_insert(last);
                    }
                    if let Some(w) = &mut self.windows {
                        w.posted();
                    }
                    continue;
                }
            };
            // The pool's registration: live, or freed and waiting for its windows to close.
            let pool = self
                .keys
                .iter()
                .chain(self.retired.iter().map(|r| &r.1))
                .find(|k| k.handle == handle);
            let Some(pool) = pool else {
                return Err(self.fail(format!("a window of a pool gone ({handle})")));
            };
            // The element's registration: a bind covers it, a close binds no bytes of it.
            let (e, len) = match element {
                Ok(e) => (e, u64::from(pool.element_size)),
                Err(e) => (e, 0),
            };
            let Some(mr) = pool.mrs.get(e as usize) else {
                return Err(self.fail(format!("element {e} outside its pool")));
            };
            let at = pool.off + u64::from(e) * u64::from(pool.element_size);
            let id = self.next_wr;
            if self.stage.take(id, 0, 1).is_none() {
                break;
            }
            self.next_wr += 1;
            let bound = self
                .qp
                .bind_mw(&mut self.mws[window], mr, 0, len, SEND_BIT | id, true);
            self.stats.post_send += 1;
            let rkey = match bound {
                Ok(rkey) => rkey,
                Err(e) => return Err(self.fail(format!("ibv_bind_mw: {e}"))),
            };
            self.binding = Some(id);
            if element.is_ok() {
                self.window_tx.push(KeyNotice { off: at, len, rkey }.emit());
            }
            if let Some(w) = &mut self.windows {
                w.posted();
            }
        }
        Ok(())
    }

    /// Adds to the batch SENDs of the pool key notices waiting (or of the window key
    /// notices, `windows`), as many in each as the peer's receives hold.
    fn post_notices(&mut self, windows: bool) {
        let per_send = (self.peer.recv_buf as usize / KEY_NOTICE_LEN).max(1);
        loop {
            let queue = if windows {
                &self.window_tx
            } else {
                &self.key_tx
            };
            let n = queue.len().min(per_send);
            if n == 0 || self.stage.outstanding() >= SEND_DEPTH as usize {
                return;
            }
            let id = self.next_wr;
            let len = n * KEY_NOTICE_LEN;
            let Some(off) = self.stage.take(id, len, 1) else {
                return;
            };
            let dst = &mut self.stage_mr.bytes_mut()[off..off + len];
            for (chunk, notice) in dst.chunks_exact_mut(KEY_NOTICE_LEN).zip(queue) {
                chunk.copy_from_slice(notice);
            }
            if windows {
                self.window_tx.drain(..n);
            } else {
                self.key_tx.drain(..n);
            }
            self.next_wr += 1;
            self.unsignalled = 0;
            self.stats.send_tx += 1;
            self.batch.push(SendWr {
                wr_id: SEND_BIT | id,
                kind: SendKind::SendImm(if windows { WINDOWS } else { KEYS }),
                off,
                len: len as u32,
                signaled: true,
            });
        }
    }

    /// Whether every grant so far is told the peer: windows bound and notices sent (a
    /// message posted after a grant must not reach the peer before the grant's key).
    pub(super) fn grants_told(&self) -> bool {
        self.key_tx.is_empty()
            && self.window_tx.is_empty()
            && self.windows.as_ref().is_none_or(|w| w.pending() == 0)
    }

    /// Deregisters the freed pools whose windows' closes completed.
    pub(super) fn retire_after_post(&mut self) {
        let stage = &self.stage;
        self.retired
            .retain(|(last, _)| last.is_none_or(|id| !stage.done_through(id)));
    }

    /// Takes a SEND of key notices, `len` bytes at `off` of the receives: pool keys, or
    /// element window keys (`windows`: each used for one write). One that names a range
    /// outside the arena, or would have the peer hold too many keys, breaks the channel.
    pub(super) fn on_keys(
        &mut self,
        off: usize,
        len: usize,
        windows: bool,
    ) -> Result<(), ChannelError> {
        let bytes = self.recv_mr.bytes().get(off..off + len);
        let Some(list) = bytes.and_then(|b| KeyNotice::parse_list(b, self.peer.arena_len)) else {
            return Err(io_err(format!(
                "a key notice of {len} bytes that names no range of the arena"
            )));
        };
        for n in list {
            // A range registered again where another was replaces it.
            if !self.peer_keys.insert(n.off, n.len, n.rkey, windows) {
                return Err(io_err(format!(
                    "the peer told more than {} keys at once",
                    keys::MAX_PEER_KEYS
                )));
            }
        }
        Ok(())
    }
}
