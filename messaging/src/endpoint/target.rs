//! Target side: the pools this endpoint owns and lets the peer write into.
//!
//! Element lifecycle: `Granted` (a credit the peer holds) -> `Written` (landed, waiting for
//! its BufferRDMAIndicate; skipped when the write carried idata) -> `Delivered` (the
//! consumer holds the frame) -> `Free` (released, waiting to be returned) -> `Granted` again
//! when a BufferRecvPoolUpdate carries it back.
//!
//! Credits are returned in batches: an update is sent once `credit_batch` elements are free,
//! and at the end of a wake-up ([`Target::flush_idle`]) only where the peer may be waiting
//! for them: it holds half of a pool's credits or fewer, or the frames of the credits kept
//! come to [`KEEP_BYTES`]. So a sparse flow of small frames costs the peer a wake-up per
//! batch, not per frame, and no sender stalls: its credits never run below half a pool, and
//! what it counts in flight for credits kept stays below any byte limit's least
//! ([`crate::sched::LimitConfig`]). [`Target::flush_credits`] returns everything now.
//!
//! Flush (seed 001's quiesce): a pool being flushed is marked quiescing (no credit is
//! returned for it any more), the writes the peer already holds credits for may still land,
//! and once the peer confirms it stopped (its BufferPoolFlushReply, sent on the data channel
//! after its last write) the remaining grants are revoked, writes in flight drain to zero,
//! delivered frames are released, and the region is deregistered: its generation is bumped,
//! so any later write through the old handle is a protection error, never a write into
//! freed memory.

use super::error::ProtocolError;
use super::outbox::{Lane, Outbox};
use crate::memory::{Access, DomainId, Frame, Handle, RegionSpec, Registry, RegistryError};
use crate::wire::{Idata, Indicate, Message, PoolEntry, PoolGet, PoolRun};

/// Geometry of a receive pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// Bytes per element.
    pub element_size: u32,
    /// Number of elements.
    pub element_count: u32,
}

impl PoolSpec {
    /// Bytes of the whole pool.
    pub fn bytes(&self) -> u64 {
        u64::from(self.element_size) * u64::from(self.element_count)
    }
}

/// Memory a pool costs the target: its elements and their bookkeeping.
fn cost(spec: PoolSpec) -> u64 {
    spec.bytes() + u64::from(spec.element_count) * ELEMENT_OVERHEAD
}

/// Limits of the target side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// Free elements gathered before a BufferRecvPoolUpdate is sent.
    pub credit_batch: u32,
    /// Pool memory granted to this peer at most, advertised and BufferRecvPoolGet together.
    pub max_granted_bytes: u64,
    /// Most pools granted to this peer at once.
    pub max_pools: usize,
    /// Largest element a BufferRecvPoolGet may ask for.
    pub max_element_size: u32,
}

/// Smallest element a BufferRecvPoolGet may ask for (the bound of advertised pools too).
pub const MIN_ELEMENT_SIZE: u32 = 256;
/// Most elements a BufferRecvPoolGet may ask for (the bound of advertised pools too).
pub const MAX_ELEMENT_COUNT: u32 = 4096;
/// Bookkeeping bytes one element costs the target (its state here and its grant in the
/// registry), counted with the pool's memory against `max_granted_bytes`.
pub const ELEMENT_OVERHEAD: u64 = 16;

/// A frame that landed in one of our elements. Release it with [`Target::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Delivery {
    /// Pool written.
    pub pool_ref: u32,
    /// Element written.
    pub element: u32,
    /// Bytes of the frame.
    pub len: u32,
    handle: Handle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Elem {
    Granted,
    Written(u32),
    Delivered,
    Free,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolState {
    Active,
    /// Flush requested with this transaction; waiting for the peer's reply.
    Quiescing(u64),
    /// The peer stopped; freed once nothing is in flight or delivered.
    Draining,
}

#[derive(Debug)]
struct LocalPool {
    handle: Handle,
    spec: PoolSpec,
    state: PoolState,
    elems: Vec<Elem>,
    /// The peer has written into it: it knows the pool.
    used: bool,
    /// Elements in `elems` that are `Granted`.
    granted: u32,
}

/// Occupancy of one pool, for operators (`splitnetctl pools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUsage {
    /// Pool reference.
    pub pool_ref: u32,
    /// Geometry.
    pub spec: PoolSpec,
    /// Elements the peer holds credits for.
    pub granted: u32,
    /// Elements written and not yet released (waiting for an indication, or delivered).
    pub busy: u32,
    /// Elements released, waiting to be returned to the peer.
    pub free: u32,
    /// `active`, `quiescing` or `draining`.
    pub state: &'static str,
}

/// What happened to a BufferRecvPoolGet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolGetOutcome {
    /// A new pool was registered and advertised.
    Granted(u32),
    /// Declined: it would exceed the configured bounds.
    Declined(&'static str),
}

/// Bytes of frames whose credits [`Target::flush_idle`] may keep: below half the least byte
/// limit a sender may have ([`crate::sched::LimitConfig`]), so that a sender held back by
/// its limit always has frames it waits on that the target will still release.
pub const KEEP_BYTES: u64 = 32 << 10;

/// The pools one peer may write into.
#[derive(Debug)]
pub struct Target {
    domain: DomainId,
    config: TargetConfig,
    pools: Vec<Option<LocalPool>>,
    granted_bytes: u64,
    /// Elements freed and not yet returned: pool, element.
    returns: Vec<(u32, u32)>,
    /// Bytes of the frames those elements held.
    kept_bytes: u64,
    /// Our flushes waiting for the peer's reply.
    flushes: Vec<u64>,
    /// BufferRecvPoolUpdate messages sent.
    updates: u64,
}

impl Target {
    /// A target for the peer in `domain`.
    pub fn new(domain: DomainId, config: TargetConfig) -> Target {
        Target {
            domain,
            config,
            pools: Vec::new(),
            granted_bytes: 0,
            returns: Vec::new(),
            kept_bytes: 0,
            flushes: Vec::new(),
            updates: 0,
        }
    }

    /// Registers a pool, grants every element, and queues its BufferRecvPool.
    pub fn advertise(
        &mut self,
        reg: &mut Registry,
        spec: PoolSpec,
        out: &mut Outbox,
    ) -> Result<u32, RegistryError> {
        let txn = out.txn();
        self.advertise_as(reg, spec, txn, out)
    }

    /// As [`Target::advertise`], with the BufferRecvPool carrying transaction context `txn`.
    fn advertise_as(
        &mut self,
        reg: &mut Registry,
        spec: PoolSpec,
        txn: u64,
        out: &mut Outbox,
    ) -> Result<u32, RegistryError> {
        let entry = self.register(reg, spec)?;
        out.push(Lane::Control, txn, &Message::BufferRecvPool(vec![entry]));
        Ok(entry.pool_ref)
    }

    fn register(&mut self, reg: &mut Registry, spec: PoolSpec) -> Result<PoolEntry, RegistryError> {
        let handle = reg.register(RegionSpec {
            domain: self.domain,
            access: Access::REMOTE_WRITE,
            element_size: spec.element_size,
            element_count: spec.element_count,
            single_use: false,
        })?;
        for e in 0..spec.element_count {
            reg.grant(handle, e)?;
        }
        let pool_ref = match self.pools.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.pools.push(None);
                self.pools.len() - 1
            }
        } as u32;
        reg.name_pool(handle, pool_ref)?;
        self.pools[pool_ref as usize] = Some(LocalPool {
            handle,
            spec,
            state: PoolState::Active,
            elems: vec![Elem::Granted; spec.element_count as usize],
            used: false,
            granted: spec.element_count,
        });
        self.granted_bytes += spec.bytes();
        Ok(PoolEntry {
            pool_ref,
            element_count: spec.element_count,
            element_size: spec.element_size,
            address: reg.address(handle)?,
            handle: handle.to_u64(),
            context: self.domain.0,
        })
    }

    fn pool_mut(&mut self, pool_ref: u32) -> Result<&mut LocalPool, ProtocolError> {
        self.pools
            .get_mut(pool_ref as usize)
            .and_then(Option::as_mut)
            .ok_or(ProtocolError::UnknownPool(pool_ref))
    }

    /// A write completed by the adapter. With immediate data the frame is delivered now;
    /// without, it waits for its BufferRDMAIndicate.
    pub fn on_write(
        &mut self,
        handle: Handle,
        element: u32,
        len: u32,
        imm: Option<u32>,
    ) -> Result<Option<Delivery>, ProtocolError> {
        // The adapter placed the write, so the handle and element are ours unless the
        // registry and the pools disagree; refuse rather than trust either.
        let unaccounted = |pool_ref| ProtocolError::NoSuchWrite {
            pool_ref,
            element,
            len,
        };
        let pool_ref = self
            .pools
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.handle == handle))
            .ok_or(unaccounted(u32::MAX))? as u32;
        let pool = self.pool_mut(pool_ref)?;
        pool.used = true;
        let slot = pool
            .elems
            .get_mut(element as usize)
            .ok_or(unaccounted(pool_ref))?;
        // The adapter only lets a write through into a granted element, so this holds unless
        // the registry and the pool disagree; refuse rather than trust either.
        if *slot != Elem::Granted {
            return Err(ProtocolError::NoSuchWrite {
                pool_ref,
                element,
                len,
            });
        }
        match imm {
            None => {
                *slot = Elem::Written(len);
                pool.granted -= 1;
                Ok(None)
            }
            Some(imm) => {
                let id = Idata::from_u32(imm);
                if u32::from(id.pool_ref) != pool_ref
                    || u32::from(id.element) != element
                    || u32::from(id.length) != len
                {
                    return Err(ProtocolError::IdataMismatch {
                        imm,
                        pool_ref,
                        element,
                        len,
                    });
                }
                *slot = Elem::Delivered;
                pool.granted -= 1;
                Ok(Some(Delivery {
                    pool_ref,
                    element,
                    len,
                    handle,
                }))
            }
        }
    }

    /// A BufferRDMAIndicate: delivers the write it describes.
    pub fn on_indicate(&mut self, ind: &Indicate) -> Result<Delivery, ProtocolError> {
        let no_such = ProtocolError::NoSuchWrite {
            pool_ref: ind.pool_ref,
            element: ind.element,
            len: ind.length,
        };
        let Ok(pool) = self.pool_mut(ind.pool_ref) else {
            return Err(no_such);
        };
        let handle = pool.handle;
        match pool.elems.get_mut(ind.element as usize) {
            Some(slot) if *slot == Elem::Written(ind.length) => {
                *slot = Elem::Delivered;
                Ok(Delivery {
                    pool_ref: ind.pool_ref,
                    element: ind.element,
                    len: ind.length,
                    handle,
                })
            }
            _ => Err(no_such),
        }
    }

    /// The bytes of a delivered frame.
    pub fn frame<'r>(&self, reg: &'r Registry, d: &Delivery) -> Frame<'r> {
        reg.frame(d.handle, d.element, d.len)
            .unwrap_or(Frame::Private(&[]))
    }

    /// The consumer is done with a delivered frame: its element becomes a credit to return.
    pub fn release(&mut self, reg: &mut Registry, d: Delivery, out: &mut Outbox) {
        let Ok(pool) = self.pool_mut(d.pool_ref) else {
            return;
        };
        // Only a delivered element is released (a Delivery of a pool since freed and
        // registered anew under the same reference names nothing here).
        match pool.elems.get_mut(d.element as usize) {
            Some(slot) if *slot == Elem::Delivered && pool.handle == d.handle => *slot = Elem::Free,
            _ => return,
        }
        match pool.state {
            PoolState::Active => {
                self.returns.push((d.pool_ref, d.element));
                self.kept_bytes += u64::from(d.len);
                if self.returns.len() as u32 >= self.config.credit_batch {
                    self.flush_credits(reg, out);
                }
            }
            PoolState::Quiescing(_) => {}
            PoolState::Draining => self.try_free(reg, d.pool_ref),
        }
    }

    /// Returns every freed element now (the shell calls this when its input goes idle).
    pub fn flush_credits(&mut self, reg: &mut Registry, out: &mut Outbox) {
        if self.returns.is_empty() {
            return;
        }
        self.returns.sort_unstable();
        let mut runs: Vec<PoolRun> = Vec::new();
        for &(pool_ref, element) in &self.returns {
            let Some(Some(pool)) = self.pools.get_mut(pool_ref as usize) else {
                continue;
            };
            if pool.state != PoolState::Active || reg.grant(pool.handle, element).is_err() {
                continue;
            }
            if let Some(slot) = pool.elems.get_mut(element as usize) {
                *slot = Elem::Granted;
                pool.granted += 1;
            }
            match runs.last_mut() {
                Some(r) if r.pool_ref == pool_ref && r.first + r.count == element => r.count += 1,
                _ => runs.push(PoolRun {
                    pool_ref,
                    first: element,
                    count: 1,
                }),
            }
        }
        self.returns.clear();
        self.kept_bytes = 0;
        for chunk in runs.chunks(crate::wire::MAX_POOL_RUNS) {
            self.updates += 1;
            let txn = out.txn();
            out.push(
                Lane::Control,
                txn,
                &Message::BufferRecvPoolUpdate(chunk.to_vec()),
            );
        }
    }

    /// The end of a wake-up: returns the freed credits if the peer may be waiting for them
    /// (it holds half of a pool's credits or fewer, for a pool with credits to return; or
    /// the frames of the credits kept come to [`KEEP_BYTES`]); else they wait for the batch
    /// or a later wake-up's need.
    pub fn flush_idle(&mut self, reg: &mut Registry, out: &mut Outbox) {
        if self.returns.is_empty() {
            return;
        }
        let low = self.returns.iter().any(|&(r, _)| {
            self.pools
                .get(r as usize)
                .and_then(Option::as_ref)
                .is_some_and(|p| p.granted as usize * 2 <= p.elems.len())
        });
        if low || self.kept_bytes >= KEEP_BYTES {
            self.flush_credits(reg, out);
        }
    }

    /// BufferRecvPoolUpdate messages sent so far.
    pub fn credit_updates(&self) -> u64 {
        self.updates
    }

    /// Credits freed but not yet returned.
    pub fn pending_credits(&self) -> usize {
        self.returns.len()
    }

    /// A BufferRecvPoolGet with transaction context `txn`: grants a new pool within the
    /// configured bounds (its BufferRecvPool echoes `txn`), or declines (no answer).
    pub fn on_pool_get(
        &mut self,
        reg: &mut Registry,
        txn: u64,
        get: &PoolGet,
        out: &mut Outbox,
    ) -> PoolGetOutcome {
        let spec = PoolSpec {
            element_size: get.element_size,
            element_count: get.element_count,
        };
        if spec.element_size == 0 || spec.element_count == 0 {
            return PoolGetOutcome::Declined("empty pool");
        }
        if spec.element_size < MIN_ELEMENT_SIZE {
            return PoolGetOutcome::Declined("element size below the minimum");
        }
        if spec.element_size > self.config.max_element_size {
            return PoolGetOutcome::Declined("element size above the limit");
        }
        if spec.element_count > MAX_ELEMENT_COUNT {
            return PoolGetOutcome::Declined("element count above the limit");
        }
        if self.live_pools() >= self.config.max_pools {
            return PoolGetOutcome::Declined("too many pools");
        }
        if self.cost().saturating_add(cost(spec)) > self.config.max_granted_bytes {
            return PoolGetOutcome::Declined("granted memory limit reached");
        }
        match self.advertise_as(reg, spec, txn, out) {
            Ok(pool_ref) => PoolGetOutcome::Granted(pool_ref),
            Err(_) => PoolGetOutcome::Declined("registration failed"),
        }
    }

    /// Element size of the largest pool still taking writes that the peer has shown it
    /// knows by writing into it (0 without one): a frame up to this size the peer should
    /// write, never send inline.
    pub fn largest_element(&self) -> u64 {
        self.pools
            .iter()
            .flatten()
            .filter(|p| p.state == PoolState::Active && p.used)
            .map(|p| u64::from(p.spec.element_size))
            .max()
            .unwrap_or(0)
    }

    /// Memory of every live pool with its bookkeeping.
    fn cost(&self) -> u64 {
        self.pools.iter().flatten().map(|p| cost(p.spec)).sum()
    }

    /// Pools currently granted.
    pub fn live_pools(&self) -> usize {
        self.pools.iter().flatten().count()
    }

    /// Bytes currently granted to the peer.
    pub fn granted_bytes(&self) -> u64 {
        self.granted_bytes
    }

    /// Pool references currently live.
    pub fn pool_refs(&self) -> Vec<u32> {
        (0..self.pools.len() as u32)
            .filter(|&i| self.pools[i as usize].is_some())
            .collect()
    }

    /// Starts flushing `pool_refs` (our side wants the memory back): they stop receiving
    /// credits, and a BufferPoolFlushRequest is queued. Returns its transaction context.
    pub fn start_flush(&mut self, reg: &mut Registry, pool_refs: &[u32], out: &mut Outbox) -> u64 {
        let txn = out.txn();
        let mut refs = Vec::new();
        for &r in pool_refs {
            if let Ok(pool) = self.pool_mut(r) {
                if pool.state == PoolState::Active {
                    pool.state = PoolState::Quiescing(txn);
                    let _ = reg.quiesce(pool.handle);
                    refs.push(r);
                }
            }
        }
        self.returns.retain(|(p, _)| !refs.contains(p));
        if !refs.is_empty() {
            self.flushes.push(txn);
        }
        for chunk in refs.chunks(crate::wire::MAX_FLUSH_REFS) {
            out.push(
                Lane::Control,
                txn,
                &Message::BufferPoolFlushRequest(chunk.to_vec()),
            );
        }
        txn
    }

    /// The peer's BufferPoolFlushReply: it holds no more credits for the pools flushed with
    /// `txn`. Returns true if that transaction named any pool.
    ///
    /// A pool the peer gave back in the meantime with its own flush request (both sides
    /// shutting down at once) is already gone; the reply still completes the transaction.
    pub fn on_flush_reply(&mut self, reg: &mut Registry, txn: u64) -> bool {
        let Some(i) = self.flushes.iter().position(|t| *t == txn) else {
            return false;
        };
        self.flushes.swap_remove(i);
        let refs: Vec<u32> = (0..self.pools.len() as u32)
            .filter(|&i| {
                matches!(&self.pools[i as usize], Some(p) if p.state == PoolState::Quiescing(txn))
            })
            .collect();
        for &r in &refs {
            self.drain(reg, r);
        }
        true
    }

    /// The peer's BufferPoolFlushRequest: it stopped using `pool_refs`; free them and reply.
    pub fn on_flush_request(
        &mut self,
        reg: &mut Registry,
        txn: u64,
        pool_refs: &[u32],
        out: &mut Outbox,
    ) -> Result<(), ProtocolError> {
        for &r in pool_refs {
            self.pool_mut(r)?;
        }
        for &r in pool_refs {
            if let Ok(pool) = self.pool_mut(r) {
                let _ = reg.quiesce(pool.handle);
            }
            self.returns.retain(|(p, _)| *p != r);
            self.drain(reg, r);
        }
        out.push(Lane::Control, txn, &Message::BufferPoolFlushReply);
        Ok(())
    }

    fn drain(&mut self, reg: &mut Registry, pool_ref: u32) {
        if let Ok(pool) = self.pool_mut(pool_ref) {
            pool.state = PoolState::Draining;
            let _ = reg.revoke_all(pool.handle);
            for e in pool.elems.iter_mut() {
                if matches!(e, Elem::Granted | Elem::Written(_)) {
                    *e = Elem::Free;
                }
            }
            pool.granted = 0;
        }
        self.try_free(reg, pool_ref);
    }

    fn try_free(&mut self, reg: &mut Registry, pool_ref: u32) {
        let Some(slot) = self.pools.get_mut(pool_ref as usize) else {
            return;
        };
        let Some(pool) = slot else { return };
        if pool.state != PoolState::Draining || pool.elems.contains(&Elem::Delivered) {
            return;
        }
        if reg.deregister(pool.handle).is_ok() {
            self.granted_bytes -= pool.spec.bytes();
            *slot = None;
        }
    }

    /// True when no pool is left and no flush of ours waits for its reply.
    pub fn is_empty(&self) -> bool {
        self.live_pools() == 0 && self.flushes.is_empty()
    }

    /// Frees every pool at once: the connection is gone, nothing can be in flight any more
    /// (the shell closed the channels first). Frames still delivered are forgotten.
    pub fn teardown(&mut self, reg: &mut Registry) {
        for slot in self.pools.iter_mut() {
            if let Some(pool) = slot.take() {
                let _ = reg.deregister(pool.handle);
            }
        }
        self.pools.clear();
        self.returns.clear();
        self.flushes.clear();
        self.granted_bytes = 0;
    }

    /// Occupancy of every live pool.
    pub fn pool_usage(&self) -> impl Iterator<Item = PoolUsage> + '_ {
        self.pools.iter().enumerate().filter_map(|(i, p)| {
            let p = p.as_ref()?;
            let count = |f: fn(&Elem) -> bool| p.elems.iter().filter(|e| f(e)).count() as u32;
            debug_assert_eq!(p.granted, count(|e| *e == Elem::Granted));
            Some(PoolUsage {
                pool_ref: i as u32,
                spec: p.spec,
                granted: p.granted,
                busy: count(|e| matches!(e, Elem::Written(_) | Elem::Delivered)),
                free: count(|e| *e == Elem::Free),
                state: match p.state {
                    PoolState::Active => "active",
                    PoolState::Quiescing(_) => "quiescing",
                    PoolState::Draining => "draining",
                },
            })
        })
    }

    /// Elements currently granted to the peer (credits it holds), per live pool.
    pub fn credits_outstanding(&self) -> u64 {
        self.pools
            .iter()
            .flatten()
            .map(|p| u64::from(p.granted))
            .sum()
    }
}
