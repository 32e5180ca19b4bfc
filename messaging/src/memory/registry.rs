//! The registry of memory regions: what a channel adapter checks before placing a byte.
//!
//! A region is an array of fixed-size elements (a receive pool). The peer may write only into
//! an element that was granted to it (a credit), once per grant, starting at the element's first
//! byte, through a handle of the current generation, from the owning protection domain, into a
//! region registered with remote-write access. Every check uses checked arithmetic; a failed
//! check is a [`ProtectionError`] and no byte is placed.

use super::arena::{Arena, SharedRegion};
use super::frame::{Frame, SharedBytes};
use super::handle::{Access, DomainId, Handle};
use std::sync::Arc;
use thiserror::Error;

/// Spacing of region base addresses in the adapter's I/O virtual address space.
///
/// Base addresses are synthetic (not process pointers, which would leak the layout of the
/// target's memory to the peer): region `i` starts at `(i + 1) << REGION_SHIFT`.
const REGION_SHIFT: u32 = 40;

/// Where a write to `addr` lands in the pool arena of a region laid out in shared memory:
/// such a region's base address is `(index + 1) << 40` plus its offset in the arena (which
/// is smaller than 2^40), so the writer finds the element's bytes at `addr mod 2^40`.
pub fn arena_offset(addr: u64) -> u64 {
    addr & ((1 << REGION_SHIFT) - 1)
}

/// What to register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSpec {
    /// Owning protection domain.
    pub domain: DomainId,
    /// Rights granted to the peer.
    pub access: Access,
    /// Bytes per element.
    pub element_size: u32,
    /// Number of elements.
    pub element_count: u32,
    /// Valid for exactly one remote write (seed 004): a second write is a protection error.
    pub single_use: bool,
}

/// Why an incoming RDMA write was refused. Each one is a protection error: the writer's
/// connection is torn down and nothing else is affected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtectionError {
    /// No region was ever registered under this index.
    #[error("unknown memory handle {0}")]
    UnknownHandle(Handle),
    /// The handle's generation is not the slot's current one (flushed or re-registered).
    #[error("stale memory handle {handle}: current generation is {current}")]
    StaleGeneration {
        /// Handle used by the writer.
        handle: Handle,
        /// The slot's generation now.
        current: u32,
    },
    /// The region belongs to another protection domain.
    #[error("handle {handle} belongs to {owner}, not to {writer}")]
    ForeignDomain {
        /// Handle used by the writer.
        handle: Handle,
        /// Domain owning the region.
        owner: DomainId,
        /// Domain of the writer.
        writer: DomainId,
    },
    /// The region was not registered with remote-write access.
    #[error("handle {0} does not allow remote writes")]
    NoAccess(Handle),
    /// A single-use region was written a second time.
    #[error("single-use handle {0} was already used")]
    SingleUseReused(Handle),
    /// The write falls outside the region.
    #[error(
        "write of {len} bytes at {addr:#x} is outside region {handle} ({base:#x}, {size} bytes)"
    )]
    OutOfBounds {
        /// Handle used by the writer.
        handle: Handle,
        /// Target address of the write.
        addr: u64,
        /// Length of the write.
        len: u32,
        /// Base address of the region.
        base: u64,
        /// Size of the region in bytes.
        size: u64,
    },
    /// Address plus length does not fit in 64 bits.
    #[error("write of {len} bytes at {addr:#x} overflows the address space")]
    Overflow {
        /// Target address of the write.
        addr: u64,
        /// Length of the write.
        len: u32,
    },
    /// The write does not start at an element boundary or is longer than one element.
    #[error(
        "write of {len} bytes at offset {offset} does not fit one element of {element_size} bytes"
    )]
    NotOneElement {
        /// Offset of the write inside the region.
        offset: u64,
        /// Length of the write.
        len: u32,
        /// Element size of the region.
        element_size: u32,
    },
    /// Immediate data naming a pool reference the writer's domain never advertised.
    #[error("immediate data names pool reference {0}, which this side never advertised")]
    UnknownPoolRef(u8),
    /// Immediate data whose length is not the length the adapter placed.
    #[error("immediate data {imm:#010x} does not give the {len} bytes placed")]
    IdataLength {
        /// The immediate data.
        imm: u32,
        /// Bytes the adapter placed.
        len: u32,
    },
    /// The element is not currently granted to the writer: a write beyond its credits.
    #[error("element {element} of {handle} was not granted (write beyond credits)")]
    NotGranted {
        /// Handle used by the writer.
        handle: Handle,
        /// The element written.
        element: u32,
    },
}

/// Local misuse of the registry (a bug or resource exhaustion on this side, not the peer's fault).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegistryError {
    /// Zero-sized or absurd region geometry.
    #[error("invalid region geometry: {element_count} x {element_size} bytes")]
    BadGeometry {
        /// Requested element size.
        element_size: u32,
        /// Requested element count.
        element_count: u32,
    },
    /// Registering would exceed the registry's memory limit.
    #[error(
        "registering {requested} bytes would exceed the limit of {limit} bytes ({used} in use)"
    )]
    OutOfMemory {
        /// Bytes requested.
        requested: u64,
        /// Bytes already registered.
        used: u64,
        /// The limit.
        limit: u64,
    },
    /// The handle does not name a live region.
    #[error("handle {0} does not name a live region")]
    NoSuchRegion(Handle),
    /// The element index is beyond the region.
    #[error("element {element} is beyond region {handle}")]
    NoSuchElement {
        /// Region handle.
        handle: Handle,
        /// Element index.
        element: u32,
    },
    /// The region is quiescing: no new grants.
    #[error("region {0} is quiescing")]
    Quiescing(Handle),
    /// An arena cannot be attached to a domain that has regions already.
    #[error("{0} has regions already")]
    DomainInUse(DomainId),
    /// The region lies in shared memory: its bytes are read through [`Registry::frame`].
    #[error("region {0} is in shared memory")]
    Shared(Handle),
    /// Writes into the region are still in flight; it cannot be freed yet.
    #[error("region {handle} has {in_flight} writes in flight")]
    Busy {
        /// Region handle.
        handle: Handle,
        /// Writes in flight.
        in_flight: u32,
    },
}

/// A write that passed every check: where its bytes go. Obtained from
/// [`Registry::begin_write`]; must be ended with [`Registry::finish_write`] or
/// [`Registry::abort_write`] so the region's in-flight count drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Placement {
    /// Region written.
    pub handle: Handle,
    /// Element written.
    pub element: u32,
    /// Bytes written.
    pub len: u32,
    offset: usize,
}

struct Region {
    domain: DomainId,
    access: Access,
    single_use: bool,
    used: bool,
    quiescing: bool,
    element_size: u32,
    element_count: u32,
    in_flight: u32,
    granted: Vec<bool>,
    mem: Mem,
    /// The pool reference its owner advertised it under, when it fits the 8 bits of
    /// immediate data ([`Registry::name_pool`]).
    pool_ref: Option<u8>,
}

/// A region's bytes.
enum Mem {
    /// Private memory.
    Heap(Box<[u8]>),
    /// `len` bytes at `off` of a pool arena shared with the writer.
    Shared {
        arena: SharedRegion,
        off: usize,
        len: usize,
    },
}

impl Region {
    fn size(&self) -> u64 {
        match &self.mem {
            Mem::Heap(m) => m.len() as u64,
            Mem::Shared { len, .. } => *len as u64,
        }
    }

    /// Where it starts in its pool arena (0 in private memory): what its base address adds
    /// to the slot's.
    fn arena_offset(&self) -> u64 {
        match self.mem {
            Mem::Heap(_) => 0,
            Mem::Shared { off, .. } => off as u64,
        }
    }

    /// The private bytes, if the region is private.
    fn heap_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.mem {
            Mem::Heap(m) => Some(m),
            Mem::Shared { .. } => None,
        }
    }
}

#[derive(Default)]
struct Slot {
    generation: u32,
    region: Option<Region>,
}

/// What happened to a grant in a domain whose grants are logged ([`Registry::log_grants`]):
/// what an adapter that opens a memory window per granted element follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantEvent {
    /// The element was granted to the peer.
    Granted(Handle, u32),
    /// Every outstanding grant of the region was withdrawn.
    Revoked(Handle),
}

/// Counters kept by the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Live regions.
    pub regions: u32,
    /// Bytes of live regions.
    pub bytes: u64,
    /// Writes refused with a protection error since creation.
    pub protection_errors: u64,
}

/// The adapter's table of registered regions (its memory protection table).
pub struct Registry {
    slots: Vec<Slot>,
    free: Vec<u32>,
    limit: u64,
    stats: RegistryStats,
    /// Pool arenas, by the domain whose regions they hold.
    arenas: Vec<(DomainId, Arena)>,
    /// Regions registered or freed since creation, and grants in logged domains: a
    /// transport that mirrors the regions (one adapter registration per pool, or a window
    /// per granted element) looks again when it changes.
    layout: LayoutWatch,
    /// Domains whose grants are logged, and the log, oldest first.
    logged: Vec<DomainId>,
    grant_log: Vec<(DomainId, GrantEvent)>,
}

/// The count of regions registered and freed, and of grants logged ([`Registry::layout`]),
/// readable without the registry: a transport that mirrors the regions holds one to know, before it sleeps,
/// whether it must look again.
#[derive(Debug, Clone, Default)]
pub struct LayoutWatch(Arc<std::sync::atomic::AtomicU64>);

impl LayoutWatch {
    /// The count now.
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn bump(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("slots", &self.slots.len())
            .field("limit", &self.limit)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Registry {
    /// A registry that refuses to hold more than `limit` bytes of regions in total.
    pub fn new(limit: u64) -> Registry {
        Registry {
            slots: Vec::new(),
            free: Vec::new(),
            limit,
            stats: RegistryStats::default(),
            arenas: Vec::new(),
            layout: LayoutWatch::default(),
            logged: Vec::new(),
            grant_log: Vec::new(),
        }
    }

    /// Lays out the regions `domain` registers from now on in `mem`, shared with the peer
    /// of that domain, which then writes frames straight into their elements. Refused while
    /// the domain has regions (an arena is attached before its session registers any).
    pub fn attach_arena(
        &mut self,
        domain: DomainId,
        mem: SharedRegion,
    ) -> Result<(), RegistryError> {
        if self
            .slots
            .iter()
            .any(|s| s.region.as_ref().is_some_and(|r| r.domain == domain))
        {
            return Err(RegistryError::DomainInUse(domain));
        }
        self.arenas.retain(|(d, _)| *d != domain);
        self.arenas.push((domain, Arena::new(mem)));
        Ok(())
    }

    /// Forgets `domain`'s arena (its peer is gone); regions still in it keep their memory
    /// until they are deregistered. Its grants are no longer logged.
    pub fn detach_arena(&mut self, domain: DomainId) {
        self.arenas.retain(|(d, _)| *d != domain);
        self.logged.retain(|d| *d != domain);
        self.grant_log.retain(|(d, _)| *d != domain);
    }

    fn arena_mut(&mut self, domain: DomainId) -> Option<&mut Arena> {
        self.arenas
            .iter_mut()
            .find(|(d, _)| *d == domain)
            .map(|(_, a)| a)
    }

    /// Counters.
    pub fn stats(&self) -> RegistryStats {
        self.stats
    }

    /// Registers a zeroed region and returns its handle. No element is granted yet.
    pub fn register(&mut self, spec: RegionSpec) -> Result<Handle, RegistryError> {
        let bad = RegistryError::BadGeometry {
            element_size: spec.element_size,
            element_count: spec.element_count,
        };
        if spec.element_size == 0 || spec.element_count == 0 {
            return Err(bad);
        }
        let size = u64::from(spec.element_size) * u64::from(spec.element_count);
        if size >= 1 << REGION_SHIFT {
            return Err(bad);
        }
        let used = self.stats.bytes;
        if used.saturating_add(size) > self.limit {
            return Err(RegistryError::OutOfMemory {
                requested: size,
                used,
                limit: self.limit,
            });
        }
        let len = usize::try_from(size).map_err(|_| bad)?;
        let mem = match self.arena_mut(spec.domain) {
            Some(a) => {
                let total = a.mem().len() as u64;
                let full = RegistryError::OutOfMemory {
                    requested: size,
                    used: total.saturating_sub(a.free_bytes() as u64),
                    limit: total,
                };
                let off = a.alloc(len).ok_or(full)?;
                Mem::Shared {
                    arena: a.mem().clone(),
                    off,
                    len,
                }
            }
            // vec![0; n] is calloc: pages are only made resident when written.
            None => Mem::Heap(vec![0u8; len].into_boxed_slice()),
        };
        let region = Region {
            domain: spec.domain,
            access: spec.access,
            single_use: spec.single_use,
            used: false,
            quiescing: false,
            element_size: spec.element_size,
            element_count: spec.element_count,
            in_flight: 0,
            granted: vec![false; spec.element_count as usize],
            mem,
            pool_ref: None,
        };
        let index = match self.free.pop() {
            Some(i) => i,
            None => match u32::try_from(self.slots.len()) {
                Ok(i) => {
                    self.slots.push(Slot::default());
                    i
                }
                Err(_) => {
                    self.release(spec.domain, region.mem);
                    return Err(RegistryError::OutOfMemory {
                        requested: size,
                        used,
                        limit: self.limit,
                    });
                }
            },
        };
        let slot = &mut self.slots[index as usize];
        slot.region = Some(region);
        self.stats.regions += 1;
        self.layout.bump();
        self.stats.bytes += size;
        Ok(Handle::new(index, slot.generation))
    }

    /// Base address of a region in private memory (its "registered address"); one in a
    /// pool arena adds its offset there ([`Registry::address`] says which).
    pub fn base_address(handle: Handle) -> u64 {
        (u64::from(handle.index()) + 1) << REGION_SHIFT
    }

    /// Base address the peer must use for the region.
    pub fn address(&self, handle: Handle) -> Result<u64, RegistryError> {
        Ok(Registry::base_address(handle) + self.region(handle)?.arena_offset())
    }

    /// Whether the region lies in a pool arena shared with its writer.
    pub fn is_shared(&self, handle: Handle) -> bool {
        matches!(
            self.region(handle),
            Ok(Region {
                mem: Mem::Shared { .. },
                ..
            })
        )
    }

    /// Gives a freed region's arena range back, if its arena is still the domain's.
    fn release(&mut self, domain: DomainId, mem: Mem) {
        if let Mem::Shared { arena, off, len } = mem {
            if let Some(a) = self.arena_mut(domain) {
                if Arc::ptr_eq(a.mem(), &arena) {
                    a.free(off, len);
                }
            }
        }
    }

    fn region(&self, handle: Handle) -> Result<&Region, RegistryError> {
        match self.slots.get(handle.index() as usize) {
            Some(Slot {
                generation,
                region: Some(r),
            }) if *generation == handle.generation() => Ok(r),
            _ => Err(RegistryError::NoSuchRegion(handle)),
        }
    }

    fn region_mut(&mut self, handle: Handle) -> Result<&mut Region, RegistryError> {
        match self.slots.get_mut(handle.index() as usize) {
            Some(Slot {
                generation,
                region: Some(r),
            }) if *generation == handle.generation() => Ok(r),
            _ => Err(RegistryError::NoSuchRegion(handle)),
        }
    }

    /// Grants one element to the peer: it may now write it once.
    pub fn grant(&mut self, handle: Handle, element: u32) -> Result<(), RegistryError> {
        let r = self.region_mut(handle)?;
        if r.quiescing {
            return Err(RegistryError::Quiescing(handle));
        }
        let domain = r.domain;
        match r.granted.get_mut(element as usize) {
            Some(g) => *g = true,
            None => return Err(RegistryError::NoSuchElement { handle, element }),
        }
        self.log(domain, GrantEvent::Granted(handle, element));
        Ok(())
    }

    /// Logs `event` if `domain`'s grants are logged.
    fn log(&mut self, domain: DomainId, event: GrantEvent) {
        if self.logged.contains(&domain) {
            self.grant_log.push((domain, event));
            self.layout.bump();
        }
    }

    /// Logs `domain`'s grants and revocations from now on, for [`Registry::take_grants`]
    /// (an adapter that opens a memory window per granted element). The log holds what the
    /// domain's own polls have not taken yet: grants follow the writes it delivered.
    pub fn log_grants(&mut self, domain: DomainId) {
        if !self.logged.contains(&domain) {
            self.logged.push(domain);
        }
    }

    /// Moves `domain`'s logged grant events, oldest first, to `out`.
    pub fn take_grants(&mut self, domain: DomainId, out: &mut Vec<GrantEvent>) {
        self.grant_log.retain(|&(d, e)| {
            if d == domain {
                out.push(e);
            }
            d != domain
        });
    }

    /// Bytes of each element of a live region, and how many it has.
    pub fn geometry(&self, handle: Handle) -> Option<(u32, u32)> {
        let r = self.region(handle).ok()?;
        Some((r.element_size, r.element_count))
    }

    /// True when `element` is granted to the peer and not yet written.
    pub fn is_granted(&self, handle: Handle, element: u32) -> bool {
        self.region(handle)
            .ok()
            .and_then(|r| r.granted.get(element as usize).copied())
            .unwrap_or(false)
    }

    /// Marks the region quiescing (seed 001): no new grants are accepted. Writes already
    /// granted may still land until [`Registry::revoke_all`].
    pub fn quiesce(&mut self, handle: Handle) -> Result<(), RegistryError> {
        self.region_mut(handle)?.quiescing = true;
        Ok(())
    }

    /// Withdraws every outstanding grant of the region.
    pub fn revoke_all(&mut self, handle: Handle) -> Result<(), RegistryError> {
        let r = self.region_mut(handle)?;
        r.granted.fill(false);
        let domain = r.domain;
        self.log(domain, GrantEvent::Revoked(handle));
        Ok(())
    }

    /// Writes in flight into the region.
    pub fn in_flight(&self, handle: Handle) -> Result<u32, RegistryError> {
        Ok(self.region(handle)?.in_flight)
    }

    /// Frees the region and bumps its slot's generation so the handle goes stale.
    /// Refused while writes are in flight.
    pub fn deregister(&mut self, handle: Handle) -> Result<(), RegistryError> {
        let r = self.region(handle)?;
        if r.in_flight > 0 {
            return Err(RegistryError::Busy {
                handle,
                in_flight: r.in_flight,
            });
        }
        let size = r.size();
        let slot = &mut self.slots[handle.index() as usize];
        let freed = slot.region.take();
        slot.generation = slot.generation.wrapping_add(1);
        if let Some(r) = freed {
            self.release(r.domain, r.mem);
        }
        self.free.push(handle.index());
        self.stats.regions -= 1;
        self.layout.bump();
        self.stats.bytes -= size;
        Ok(())
    }

    /// Counts the regions registered and freed so far: unchanged, so are the regions.
    pub fn layout(&self) -> u64 {
        self.layout.get()
    }

    /// A handle on [`Registry::layout`] that reads it without the registry.
    pub fn layout_watch(&self) -> LayoutWatch {
        self.layout.clone()
    }

    /// Every live region of `domain` that lies in its pool arena: its handle, its offset in
    /// the arena and its size in bytes.
    pub fn arena_regions(&self, domain: DomainId) -> Vec<(Handle, u64, u64)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.region {
                Some(
                    r @ Region {
                        mem: Mem::Shared { off, len, .. },
                        ..
                    },
                ) if r.domain == domain => Some((
                    Handle::new(i as u32, s.generation),
                    *off as u64,
                    *len as u64,
                )),
                _ => None,
            })
            .collect()
    }

    /// Handles of every live region owned by `domain`.
    pub fn regions_of(&self, domain: DomainId) -> Vec<Handle> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.region {
                Some(r) if r.domain == domain => Some(Handle::new(i as u32, s.generation)),
                _ => None,
            })
            .collect()
    }

    /// Records that the region's owner advertised it under `pool_ref`, so that a write
    /// named only by its immediate data ([`Registry::begin_write_idata`]) finds it. A
    /// reference above 255 cannot be named that way and is not recorded.
    pub fn name_pool(&mut self, handle: Handle, pool_ref: u32) -> Result<(), RegistryError> {
        self.region_mut(handle)?.pool_ref = u8::try_from(pool_ref).ok();
        Ok(())
    }

    /// Checks an RDMA WRITE WITH IMMEDIATE that an RDMA adapter already placed, known only
    /// by its immediate data `imm` (pool reference, element, length: [`crate::wire::Idata`])
    /// and the `len` bytes its completion reports: the region `writer` advertised under that
    /// reference, then every check of [`Registry::begin_write`] at the element's address. The
    /// immediate data must give the length the adapter reports.
    pub fn begin_write_idata(
        &mut self,
        writer: DomainId,
        imm: u32,
        len: u32,
    ) -> Result<Placement, ProtectionError> {
        let id = crate::wire::Idata::from_u32(imm);
        let found = self
            .slots
            .iter()
            .enumerate()
            .find_map(|(i, s)| match &s.region {
                Some(r) if r.domain == writer && r.pool_ref == Some(id.pool_ref) => Some((
                    Handle::new(i as u32, s.generation),
                    r.arena_offset(),
                    r.element_size,
                )),
                _ => None,
            });
        let result = match found {
            None => Err(ProtectionError::UnknownPoolRef(id.pool_ref)),
            Some(_) if u32::from(id.length) != len => {
                Err(ProtectionError::IdataLength { imm, len })
            }
            Some((handle, off, esize)) => {
                let addr =
                    Registry::base_address(handle) + off + u64::from(id.element) * u64::from(esize);
                self.check_write(writer, handle, addr, len)
            }
        };
        if result.is_err() {
            self.stats.protection_errors += 1;
        }
        result
    }

    /// Checks an incoming RDMA write of `len` bytes at `addr` through `handle` (its wire
    /// form) by `writer`. On success the element's grant is consumed and the write counts
    /// as in flight until finished or aborted.
    pub fn begin_write(
        &mut self,
        writer: DomainId,
        handle: u64,
        addr: u64,
        len: u32,
    ) -> Result<Placement, ProtectionError> {
        let result = self.check_write(writer, Handle::from_u64(handle), addr, len);
        if result.is_err() {
            self.stats.protection_errors += 1;
        }
        result
    }

    fn check_write(
        &mut self,
        writer: DomainId,
        handle: Handle,
        addr: u64,
        len: u32,
    ) -> Result<Placement, ProtectionError> {
        let slot = self
            .slots
            .get_mut(handle.index() as usize)
            .ok_or(ProtectionError::UnknownHandle(handle))?;
        if slot.generation != handle.generation() {
            return Err(ProtectionError::StaleGeneration {
                handle,
                current: slot.generation,
            });
        }
        let r = slot
            .region
            .as_mut()
            .ok_or(ProtectionError::UnknownHandle(handle))?;
        if r.domain != writer {
            return Err(ProtectionError::ForeignDomain {
                handle,
                owner: r.domain,
                writer,
            });
        }
        if !r.access.contains(Access::REMOTE_WRITE) {
            return Err(ProtectionError::NoAccess(handle));
        }
        if r.single_use && r.used {
            return Err(ProtectionError::SingleUseReused(handle));
        }
        let base = Registry::base_address(handle) + r.arena_offset();
        let size = r.size();
        let out_of_bounds = ProtectionError::OutOfBounds {
            handle,
            addr,
            len,
            base,
            size,
        };
        let end = addr
            .checked_add(u64::from(len))
            .ok_or(ProtectionError::Overflow { addr, len })?;
        // base + size < 2^41: a region and its offset in an arena are smaller than the 2^40
        // spacing.
        if addr < base || end > base + size {
            return Err(out_of_bounds);
        }
        let offset = addr - base;
        let esize = u64::from(r.element_size);
        if !offset.is_multiple_of(esize) || u64::from(len) > esize {
            return Err(ProtectionError::NotOneElement {
                offset,
                len,
                element_size: r.element_size,
            });
        }
        // offset < size < 2^40 and element_count fits u32, so these conversions are exact.
        let element = (offset / esize) as u32;
        match r.granted.get_mut(element as usize) {
            Some(g) if *g => *g = false,
            _ => return Err(ProtectionError::NotGranted { handle, element }),
        }
        r.used = true;
        r.in_flight += 1;
        Ok(Placement {
            handle,
            element,
            len,
            offset: offset as usize,
        })
    }

    /// The bytes a checked write fills. Empty if the placement is not live (cannot happen
    /// while it is in flight, since a region with writes in flight cannot be freed) or lies
    /// in shared memory (the writer placed it there itself).
    pub fn placement_mut(&mut self, p: &Placement) -> &mut [u8] {
        let end = p.offset + p.len as usize;
        match self.region_mut(p.handle).ok().and_then(Region::heap_mut) {
            Some(m) => m.get_mut(p.offset..end).unwrap_or_default(),
            None => &mut [],
        }
    }

    /// Ends a write whose bytes have all been placed.
    pub fn finish_write(&mut self, p: &Placement) {
        if let Ok(r) = self.region_mut(p.handle) {
            r.in_flight = r.in_flight.saturating_sub(1);
        }
    }

    /// Ends a write cut short (its connection died): the element keeps partial data and
    /// stays ungranted.
    pub fn abort_write(&mut self, p: &Placement) {
        self.finish_write(p)
    }

    /// The first `len` bytes of `element`, wherever the region lies.
    pub fn frame(
        &self,
        handle: Handle,
        element: u32,
        len: u32,
    ) -> Result<Frame<'_>, RegistryError> {
        let r = self.region(handle)?;
        let no_such = RegistryError::NoSuchElement { handle, element };
        if element >= r.element_count || len > r.element_size {
            return Err(no_such);
        }
        let start = element as usize * r.element_size as usize;
        match &r.mem {
            Mem::Heap(m) => m
                .get(start..start + len as usize)
                .map(Frame::Private)
                .ok_or(no_such),
            Mem::Shared { arena, off, .. } => SharedBytes::new(&**arena, off + start, len as usize)
                .map(Frame::Shared)
                .map_err(|_| no_such),
        }
    }

    /// Local read of the first `len` bytes of `element` of a region in private memory.
    pub fn element(&self, handle: Handle, element: u32, len: u32) -> Result<&[u8], RegistryError> {
        match self.frame(handle, element, len)? {
            Frame::Private(b) => Ok(b),
            Frame::Shared(_) => Err(RegistryError::Shared(handle)),
        }
    }

    /// Local write access to a whole element (used by in-process placement and tests).
    pub fn element_mut(
        &mut self,
        handle: Handle,
        element: u32,
    ) -> Result<&mut [u8], RegistryError> {
        let r = self.region_mut(handle)?;
        let no_such = RegistryError::NoSuchElement { handle, element };
        if element >= r.element_count {
            return Err(no_such);
        }
        let esize = r.element_size as usize;
        let start = element as usize * esize;
        let m = r.heap_mut().ok_or(RegistryError::Shared(handle))?;
        m.get_mut(start..start + esize).ok_or(no_such)
    }
}
