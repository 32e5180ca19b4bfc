//! Initiator side: the peer's pools this endpoint writes frames into.
//!
//! Every free element of a remote pool is a credit. A frame consumes one: it is written
//! with RDMA WRITE WITH IMMEDIATE when its indication fits the 32-bit idata, else with a
//! plain RDMA WRITE followed by a BufferRDMAIndicate on the same channel. Small frames go
//! inline as SendData. With no credit the caller keeps the frame and stops reading its
//! source (backpressure: never block, never drop), and a BufferRecvPoolGet asks the target
//! for more memory once per starvation episode. A BufferRecvPoolUpdate returns credits.

use super::error::ProtocolError;
use super::outbox::{Lane, Outbox};
use super::target::PoolSpec;
use crate::adapter::{Channel, Op, Payload};
use crate::memory::SendBuf;
use crate::wire::{self, Function, Header, Idata, Indicate, Message, PoolEntry, PoolGet, PoolRun};
use std::collections::VecDeque;

/// Limits of the initiator side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiatorConfig {
    /// Frames of at most this many bytes go inline as SendData.
    pub send_data_max: usize,
    /// Most remote pools accepted from the peer.
    pub max_pools: usize,
    /// Most elements accepted in one remote pool (bounds the credit bookkeeping).
    pub max_elements: u32,
    /// What to ask for with BufferRecvPoolGet when starved; `None` never asks.
    pub pool_get: Option<PoolSpec>,
}

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Inline in a SendData message.
    SendData,
    /// RDMA write into a reserved element.
    Rdma(Reservation),
    /// No credit now: keep the frame and retry after a BufferRecvPoolUpdate.
    Backpressure,
    /// No pool can ever hold it and it is too large for SendData.
    TooLarge,
}

/// A consumed credit: the element a frame will be written into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// The RDMA operation to post.
    pub op: Op,
    /// The BufferRDMAIndicate to send after it, when idata cannot carry the indication.
    pub indicate: Option<Indicate>,
}

/// A peer element taken for a frame not read yet ([`Initiator::take_element`]): used once,
/// by [`Initiator::post_placed`] or [`Initiator::untake`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Element {
    pool_ref: u32,
    element: u32,
    /// Its address in the peer's memory.
    pub(crate) addr: u64,
    /// Its size in bytes.
    pub(crate) size: u32,
}

#[derive(Debug)]
struct RemotePool {
    entry: PoolEntry,
    free: Vec<u32>,
    /// Bytes written into each element whose credit is out (0: free).
    in_use: Vec<u32>,
}

impl RemotePool {
    /// Where `element` starts in the peer's memory. (Validated in on_pools: address +
    /// element_size * element_count does not overflow.)
    fn element_addr(&self, element: u32) -> u64 {
        self.entry.address + u64::from(element) * u64::from(self.entry.element_size)
    }
}

impl Reservation {
    /// Posts the write on `ch`, its payload given by `post` (carried, or already placed),
    /// then the BufferRDMAIndicate when idata could not carry the indication.
    fn post<C: Channel>(self, ch: &mut C, post: impl FnOnce(&mut C, Op)) {
        post(ch, self.op);
        if let Some(ind) = self.indicate {
            let mut msg = Vec::with_capacity(wire::HEADER_LEN + 12);
            Message::BufferRdmaIndicate(ind).emit(0, &mut msg);
            ch.post(Op::Send, &[], Payload::Bytes(msg));
        }
    }
}

/// The peer's pools and our credits in them.
#[derive(Debug)]
pub struct Initiator {
    config: InitiatorConfig,
    pools: Vec<RemotePool>,
    /// Pools we stopped using lately, newest last (at most `max_pools`): a credit update
    /// for one of them raced our flush and is ignored.
    retired: VecDeque<u32>,
    pool_get_sent: bool,
    flush_txn: Option<u64>,
    /// Bytes written whose credits have not come back.
    inflight: u64,
    /// Bytes whose credits came back, not yet taken by [`Initiator::take_completed`].
    completed: u64,
}

/// What [`Initiator::post_frame`] did with a frame.
#[derive(Debug)]
pub enum Posted {
    /// Posted inline as SendData.
    SendData,
    /// Posted as an RDMA write (and an indication if needed).
    Rdma,
    /// Not posted: no credit. The frame is handed back.
    Backpressure(SendBuf),
    /// Not posted: too large for any pool and for SendData. The frame is handed back.
    TooLarge(SendBuf),
}

impl Initiator {
    /// An initiator with no remote pools yet.
    pub fn new(config: InitiatorConfig) -> Initiator {
        Initiator {
            config,
            pools: Vec::new(),
            retired: VecDeque::new(),
            pool_get_sent: false,
            flush_txn: None,
            inflight: 0,
            completed: 0,
        }
    }

    /// A BufferRecvPool: new pools (credits) from the peer.
    pub fn on_pools(&mut self, entries: &[PoolEntry]) -> Result<(), ProtocolError> {
        for e in entries {
            let bad = |why| ProtocolError::BadPool {
                pool_ref: e.pool_ref,
                why,
            };
            let limit = |why| ProtocolError::PoolLimit {
                pool_ref: e.pool_ref,
                why,
            };
            if self.pools.iter().any(|p| p.entry.pool_ref == e.pool_ref) {
                return Err(bad("pool reference already live"));
            }
            if e.element_size == 0 || e.element_count == 0 {
                return Err(bad("empty pool"));
            }
            if self.pools.len() >= self.config.max_pools {
                return Err(limit("too many pools"));
            }
            if e.element_count > self.config.max_elements {
                return Err(limit("too many elements"));
            }
            let size = u64::from(e.element_size) * u64::from(e.element_count);
            if e.address.checked_add(size).is_none() {
                return Err(bad("address range overflows"));
            }
            self.retired.retain(|r| *r != e.pool_ref);
            self.pools.push(RemotePool {
                entry: *e,
                free: (0..e.element_count).rev().collect(),
                in_use: vec![0; e.element_count as usize],
            });
        }
        // Smallest elements first: a frame takes the smallest element that holds it.
        self.pools.sort_by_key(|p| p.entry.element_size);
        self.pool_get_sent = false;
        Ok(())
    }

    /// A BufferRecvPoolUpdate: credits returned.
    pub fn on_update(&mut self, runs: &[PoolRun]) -> Result<(), ProtocolError> {
        for run in runs {
            let Some(pool) = self
                .pools
                .iter_mut()
                .find(|p| p.entry.pool_ref == run.pool_ref)
            else {
                if self.retired.contains(&run.pool_ref) {
                    continue; // raced our own flush of that pool: harmless
                }
                return Err(ProtocolError::UnknownCreditPool(run.pool_ref));
            };
            let violation = |element| ProtocolError::CreditViolation {
                pool_ref: run.pool_ref,
                element,
            };
            let end = run
                .first
                .checked_add(run.count)
                .filter(|&end| end <= pool.entry.element_count)
                .ok_or(violation(run.first))?;
            for e in run.first..end {
                match pool.in_use.get_mut(e as usize) {
                    Some(u) if *u > 0 => {
                        self.inflight -= u64::from(*u);
                        self.completed += u64::from(*u);
                        *u = 0;
                        pool.free.push(e);
                    }
                    _ => return Err(violation(e)),
                }
            }
        }
        self.pool_get_sent = false;
        Ok(())
    }

    /// Decides where a frame of `len` bytes goes, consuming a credit for RDMA.
    pub fn route(&mut self, len: usize) -> Route {
        if len <= self.config.send_data_max {
            return Route::SendData;
        }
        let mut fits_somewhere = false;
        for pool in self.pools.iter_mut() {
            let e = &pool.entry;
            if (e.element_size as usize) < len {
                continue;
            }
            fits_somewhere = true;
            let Some(element) = pool.free.pop() else {
                continue;
            };
            return Route::Rdma(Self::write(pool, element, len, &mut self.inflight));
        }
        if fits_somewhere {
            Route::Backpressure
        } else if len <= wire::MAX_SEND_DATA {
            Route::SendData
        } else {
            Route::TooLarge
        }
    }

    /// The write of `len` bytes into `element` of `pool` (taken from its free list): the
    /// element counts as in use, its bytes as in flight.
    fn write(pool: &mut RemotePool, element: u32, len: usize, inflight: &mut u64) -> Reservation {
        let e = &pool.entry;
        // A frame is never empty (it carries a virtio-net header), but a zero would read as
        // free: count at least one byte.
        let bytes = (len as u32).max(1);
        if let Some(u) = pool.in_use.get_mut(element as usize) {
            *u = bytes;
            *inflight += u64::from(bytes);
        }
        let addr = pool.element_addr(element);
        let len32 = len as u32;
        let (op, indicate) = match Idata::new(e.pool_ref, element, len32) {
            Some(id) => (
                Op::WriteImm {
                    handle: e.handle,
                    addr,
                    imm: id.to_u32(),
                },
                None,
            ),
            None => (
                Op::Write {
                    handle: e.handle,
                    addr,
                },
                Some(Indicate {
                    pool_ref: e.pool_ref,
                    element,
                    length: len32,
                }),
            ),
        };
        Reservation { op, indicate }
    }

    /// Takes a free element of at least `size` bytes for a frame to be read straight into
    /// it (over shared memory): the caller reads into it, then posts the write with
    /// [`Initiator::post_placed`], or gives it back with [`Initiator::untake`] (nothing read).
    /// A frame read so may be small and takes a large element all the same: a quarter of
    /// each pool's elements stays for the frames that need them (`None` then: they take the
    /// send-buffer path).
    pub(crate) fn take_element(&mut self, size: u32) -> Option<Element> {
        let pool = self
            .pools
            .iter_mut()
            .filter(|p| p.entry.element_size >= size)
            .find(|p| p.free.len() > (p.entry.element_count as usize).div_ceil(4))?;
        let element = pool.free.pop()?;
        let e = &pool.entry;
        Some(Element {
            pool_ref: e.pool_ref,
            element,
            addr: pool.element_addr(element),
            size: e.element_size,
        })
    }

    /// Whether [`Initiator::take_element`] could ever give an element of `size` bytes: a pool
    /// of elements that large has more than the quarter it keeps.
    pub fn may_take(&self, size: u32) -> bool {
        self.pools.iter().any(|p| {
            let count = p.entry.element_count as usize;
            p.entry.element_size >= size && count > count.div_ceil(4)
        })
    }

    /// Whether a frame of `len` bytes goes inline (SendData) rather than into a pool.
    pub fn goes_inline(&self, len: usize) -> bool {
        len <= self.config.send_data_max
    }

    /// Gives back an element [`Initiator::take_element`] took, unwritten.
    pub(crate) fn untake(&mut self, taken: Element) {
        if let Some(p) = self
            .pools
            .iter_mut()
            .find(|p| p.entry.pool_ref == taken.pool_ref)
        {
            p.free.push(taken.element);
        }
    }

    /// Posts the write of the `len` bytes (1 to the element's size) read into `taken` on
    /// `ch`, which placed them ([`Channel::peer_window`]): only its header travels. False
    /// (nothing posted) if `len` is out of range (the element goes back), or the element's
    /// pool is gone (it cannot go between taking and posting: nothing reaches the session
    /// meanwhile).
    pub(crate) fn post_placed<C: Channel>(
        &mut self,
        ch: &mut C,
        taken: Element,
        len: usize,
    ) -> bool {
        if len == 0 || len > taken.size as usize {
            self.untake(taken);
            return false;
        }
        let Some(pool) = self
            .pools
            .iter_mut()
            .find(|p| p.entry.pool_ref == taken.pool_ref)
        else {
            return false;
        };
        let r = Self::write(pool, taken.element, len, &mut self.inflight);
        r.post(ch, |ch, op| ch.post_placed(op, len as u32));
        true
    }

    /// Routes a frame and posts it on the data channel `ch`.
    pub fn post_frame<C: Channel>(&mut self, ch: &mut C, buf: SendBuf, out: &mut Outbox) -> Posted {
        match self.route(buf.len()) {
            Route::SendData => {
                ch.post(Op::Send, &send_data_prefix(buf.len()), Payload::Buf(buf));
                Posted::SendData
            }
            Route::Rdma(r) => {
                r.post(ch, |ch, op| ch.post(op, &[], Payload::Buf(buf)));
                Posted::Rdma
            }
            Route::Backpressure => {
                self.starved(out);
                Posted::Backpressure(buf)
            }
            Route::TooLarge => {
                self.starved(out);
                Posted::TooLarge(buf)
            }
        }
    }

    fn starved(&mut self, out: &mut Outbox) {
        let Some(spec) = self.config.pool_get else {
            return;
        };
        if self.pool_get_sent || self.pools.len() >= self.config.max_pools {
            return;
        }
        self.pool_get_sent = true;
        let txn = out.txn();
        out.push(
            Lane::Control,
            txn,
            &Message::BufferRecvPoolGet(PoolGet {
                element_size: spec.element_size,
                element_count: spec.element_count,
            }),
        );
    }

    /// The target's BufferPoolFlushRequest: stop using `pool_refs` and confirm on the data
    /// channel, behind every write already posted into them.
    pub fn on_flush_request(&mut self, txn: u64, pool_refs: &[u32], out: &mut Outbox) {
        let live: Vec<u32> = self
            .pools
            .iter()
            .map(|p| p.entry.pool_ref)
            .filter(|r| pool_refs.contains(r))
            .collect();
        self.drop_pools(|p| pool_refs.contains(&p));
        self.retire(&live);
        out.push(Lane::Data, txn, &Message::BufferPoolFlushReply);
    }

    /// Stops using the pools whose reference `gone` names; what was in flight in them will
    /// never be completed, so it no longer counts.
    fn drop_pools(&mut self, gone: impl Fn(u32) -> bool) {
        let mut lost = 0u64;
        self.pools.retain(|p| {
            let keep = !gone(p.entry.pool_ref);
            if !keep {
                lost += p.in_use.iter().map(|&b| u64::from(b)).sum::<u64>();
            }
            keep
        });
        self.inflight -= lost;
    }

    /// Remembers pools we stopped using (only pools we held), forgetting the oldest beyond
    /// `max_pools`: what a peer names in flush requests cannot grow this list.
    fn retire(&mut self, refs: &[u32]) {
        for &r in refs {
            self.retired.retain(|x| *x != r);
            self.retired.push_back(r);
        }
        while self.retired.len() > self.config.max_pools {
            self.retired.pop_front();
        }
    }

    /// Pools remembered as retired (for tests and operators).
    pub fn retired(&self) -> usize {
        self.retired.len()
    }

    /// Stops using every remote pool (shutdown): queues a BufferPoolFlushRequest on the data
    /// channel, behind every write already posted. Returns its transaction context.
    pub fn start_flush_all(&mut self, out: &mut Outbox) -> Option<u64> {
        if self.pools.is_empty() {
            return None;
        }
        let txn = out.txn();
        let refs: Vec<u32> = self.pools.iter().map(|p| p.entry.pool_ref).collect();
        for chunk in refs.chunks(wire::MAX_FLUSH_REFS) {
            out.push(
                Lane::Data,
                txn,
                &Message::BufferPoolFlushRequest(chunk.to_vec()),
            );
        }
        self.drop_pools(|_| true);
        self.retire(&refs);
        self.flush_txn = Some(txn);
        Some(txn)
    }

    /// The target's BufferPoolFlushReply to our flush; true if it completes it.
    pub fn on_flush_reply(&mut self, txn: u64) -> bool {
        if self.flush_txn == Some(txn) {
            self.flush_txn = None;
            true
        } else {
            false
        }
    }

    /// True while a flush of ours waits for its reply.
    pub fn flush_pending(&self) -> bool {
        self.flush_txn.is_some()
    }

    /// Free credits in all remote pools.
    pub fn credits(&self) -> u64 {
        self.pools.iter().map(|p| p.free.len() as u64).sum()
    }

    /// Bytes written into the peer's pools whose credits have not come back.
    pub fn inflight_bytes(&self) -> u64 {
        self.inflight
    }

    /// Bytes whose credits came back since the last call.
    pub fn take_completed(&mut self) -> u64 {
        std::mem::take(&mut self.completed)
    }

    /// Credits in use (frames written and not yet returned).
    pub fn in_use(&self) -> u64 {
        self.pools
            .iter()
            .map(|p| u64::from(p.entry.element_count) - p.free.len() as u64)
            .sum()
    }

    /// Remote pools known.
    pub fn pools(&self) -> impl Iterator<Item = &PoolEntry> {
        self.pools.iter().map(|p| &p.entry)
    }

    /// Each remote pool with the credits held in it (its free elements).
    pub fn pool_credits(&self) -> impl Iterator<Item = (&PoolEntry, u32)> {
        self.pools.iter().map(|p| (&p.entry, p.free.len() as u32))
    }

    /// Forgets every remote pool (the connection is gone; a new one re-advertises).
    pub fn reset(&mut self) {
        self.pools.clear();
        self.inflight = 0;
        self.completed = 0;
        self.retired.clear();
        self.pool_get_sent = false;
        self.flush_txn = None;
    }
}

/// The 16 bytes that precede a frame posted inline: the SendData header and length.
pub fn send_data_prefix(len: usize) -> [u8; 16] {
    let mut p = [0u8; 16];
    let mut h = [0u8; wire::HEADER_LEN];
    Header {
        function: Function::SendData,
        version: wire::VERSION,
        txn: 0,
    }
    .emit(&mut h);
    p[..wire::HEADER_LEN].copy_from_slice(&h);
    p[wire::HEADER_LEN..].copy_from_slice(&(len as u32).to_be_bytes());
    p
}
