//! A [`Channel`] over two shared-memory rings: one this side produces into, one it consumes.
//!
//! Each operation travels as one ring record of kind [`KIND_OP`]: the 32-byte operation
//! header of the TCP framing ([`OpHeader`]) followed by its payload. The consumer copies the
//! header out of shared memory once ([`Consumer::peek`], [`Consumer::read`]), parses it from
//! that copy, and places an RDMA write through the [`Registry`] with exactly the checks of
//! the TCP path (domain, handle, grant, bounds), copying the payload from the ring straight
//! into the granted element: one copy, each byte read once, so a peer that rewrites shared
//! memory meanwhile changes nothing that was checked. A ring the peer corrupted
//! ([`ShmError`]) ends the channel, and only this peer's.
//!
//! With the peer's pools in shared memory ([`ShmChannel::set_peer_pools`]), this side
//! places each RDMA write straight into the peer's element and sends only its header, in a
//! record of kind [`KIND_PLACED`]; the peer runs the same checks on that header and takes the
//! bytes where they are ([`crate::memory::Frame::Shared`]).
//!
//! Sans-IO: the doorbell is the caller's. [`ShmChannel::take_doorbell`] says when the peer
//! asked to be woken by a publication; [`ShmChannel::prepare_sleep`] arms this side's own
//! request before the caller sleeps on its doorbell.

use super::ring::{Consumer, Producer, PushError, RingConfig, RingError};
use crate::adapter::op::{Op, OpHeader, OP_HEADER_LEN};
use crate::adapter::rx::{RxCompletion, RxError};
use crate::adapter::tx::{Payload, TxQueue};
use crate::adapter::{Channel, ChannelError};
use crate::memory::SharedMem;
use crate::memory::{arena_offset, DomainId, Placement, Registry, SendBufCache, SharedBytes};
use thiserror::Error;

/// The record kind of an operation.
pub const KIND_OP: u32 = 1;
/// The record kind of a write placed in the peer's shared pool: the operation header alone.
pub const KIND_PLACED: u32 = 2;

/// Doorbell rings in a row that found nothing to do, beyond which the peer is cut off. A
/// correct peer rings only when asked, so a ring finds a record or room at least every
/// other time (the other: a request withdrawn after the peer had seen it).
pub const MAX_IDLE_WAKES: u32 = 64;

/// Why a shared-memory channel stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ShmError {
    /// The peer corrupted its ring (indices, record headers).
    #[error("shared-memory ring: {0}")]
    Ring(#[from] RingError),
    /// A record that does not hold exactly one operation.
    #[error("ring record of {len} bytes does not hold one operation")]
    BadRecord {
        /// The record's length.
        len: usize,
    },
    /// The peer rang this side's doorbell [`MAX_IDLE_WAKES`] times in a row with nothing
    /// published and no room freed: a flood, which would keep this side busy for nothing.
    #[error("doorbell rung {0} times in a row with nothing to do")]
    DoorbellFlood(u32),
    /// The channel already failed (the error was returned then); nothing more is read.
    #[error("shared-memory channel stopped after an earlier error")]
    Stopped,
    /// A write record that does not match where its pool lives: placed into a pool in
    /// private memory (the bytes are not there), or carried in the ring into a pool in
    /// shared memory (the writer must place it).
    #[error("a {kind} write into a pool in {mem} memory")]
    Misplaced {
        /// "placed" or "carried".
        kind: &'static str,
        /// "private" or "shared".
        mem: &'static str,
    },
    /// An operation larger than the ring's records (a configuration error of this side).
    #[error("operation of {len} bytes exceeds the ring's largest record")]
    TooLarge {
        /// The operation's length.
        len: usize,
    },
}

/// A ring configuration for operations with payloads of up to `max_payload` bytes, in a
/// data area of `data_size` bytes (a power of two holding at least two of them).
pub fn ring_config(data_size: u32, max_payload: u32) -> Result<RingConfig, super::ConfigError> {
    RingConfig::new(
        data_size,
        max_payload.saturating_add(OP_HEADER_LEN as u32),
        KIND_PLACED,
    )
}

/// A queue pair over shared-memory rings.
#[derive(Debug)]
pub struct ShmChannel<M> {
    tx: Producer<M>,
    rx: Consumer<M>,
    /// The peer's pool arena, where this side places its writes.
    peer_pools: Option<M>,
    queue: TxQueue,
    domain: DomainId,
    max_send: usize,
    writes: bool,
    /// The last SEND's payload, copied out of the ring (private memory).
    record: Vec<u8>,
    doorbell: bool,
    idle: IdleRings,
    /// A received operation failed: the held record is never read again.
    stopped: bool,
}

/// The doorbell-flood rule: rings of this side's doorbell in a row after which the peer had
/// neither published a record nor freed room this side looked for.
#[derive(Debug)]
struct IdleRings {
    /// The doorbell rang since the last ring was judged.
    rung: bool,
    /// A record arrived since the last ring was judged.
    took: bool,
    /// The peer's tail (room it freed) when the last ring was judged.
    tail: u32,
    /// Idle rings in a row.
    count: u32,
}

impl IdleRings {
    /// Judges the last ring, if any, once the ring is drained; `tail` is the peer's tail as
    /// this side last loaded it.
    fn judge(&mut self, tail: u32) -> Result<(), ShmError> {
        if !std::mem::take(&mut self.rung) {
            return Ok(());
        }
        let freed = std::mem::replace(&mut self.tail, tail) != tail;
        if std::mem::take(&mut self.took) || freed {
            self.count = 0;
            return Ok(());
        }
        self.count += 1;
        match self.count >= MAX_IDLE_WAKES {
            true => Err(ShmError::DoorbellFlood(self.count)),
            false => Ok(()),
        }
    }
}

impl<M: SharedMem> ShmChannel<M> {
    /// A channel producing into `tx` and consuming `rx`, accepting writes into the pools of
    /// `domain` and SENDs of up to `max_send` bytes.
    pub fn new(tx: Producer<M>, rx: Consumer<M>, domain: DomainId, max_send: usize) -> Self {
        let tail = tx.tail();
        ShmChannel {
            tx,
            rx,
            peer_pools: None,
            queue: TxQueue::new(),
            domain,
            max_send,
            writes: true,
            record: Vec::new(),
            doorbell: false,
            idle: IdleRings {
                rung: false,
                took: false,
                tail,
                count: 0,
            },
            stopped: false,
        }
    }

    /// The peer's pools lie in `mem` (its pool arena): from now on each RDMA write is placed
    /// straight into its element there and only its header travels ([`KIND_PLACED`]).
    pub fn set_peer_pools(&mut self, mem: M) {
        self.peer_pools = Some(mem);
    }

    /// Changes the protection domain whose writes this channel carries.
    pub fn set_domain(&mut self, domain: DomainId) {
        self.domain = domain;
    }

    /// Whether the peer asked to be woken by what this side did since the last call (it
    /// published records the peer waits for, or consumed records and so freed the space the
    /// peer waits for): the caller then rings the peer's doorbell.
    pub fn take_doorbell(&mut self) -> bool {
        let freed = self.rx.space_requested();
        std::mem::take(&mut self.doorbell) | freed
    }

    /// Asks the peer to ring this side's doorbell on its next publication, and, while
    /// operations wait for room in the ring, once it frees space. `true`: the caller may
    /// sleep on the doorbell; `false`: records or room may be there already, poll again.
    pub fn prepare_sleep(&mut self) -> bool {
        if !self.queue.is_empty() && !self.tx.prepare_wait_space() {
            return false;
        }
        if !self.rx.prepare_sleep() {
            self.tx.wake_space();
            return false;
        }
        true
    }

    /// Whether a record may be waiting (one load, no doorbell request).
    pub fn input_pending(&self) -> bool {
        self.rx.pending()
    }

    /// Notes that the peer rang this side's doorbell. The next poll that drains the ring
    /// judges the ring: if the peer neither published a record nor freed room this side
    /// looked for since the last judged ring, it was idle, and [`MAX_IDLE_WAKES`] idle rings
    /// in a row end the channel ([`ShmError::DoorbellFlood`]). Only what the peer did
    /// counts, so traffic towards a flooding peer does not shield it.
    pub fn rang(&mut self) {
        self.idle.rung = true;
    }

    /// Withdraws the requests to be woken (after waking up).
    pub fn wake(&mut self) {
        self.rx.wake();
        self.tx.wake_space();
    }

    /// The memory of the ring this side produces into (tests and fuzzing play a rogue
    /// producer through it).
    pub fn tx_memory(&self) -> &M {
        self.tx.memory()
    }

    /// Checks a write into `reg` with the registry's checks, and that its pool lies where
    /// the record says: in shared memory for a placed write, else in private memory.
    fn begin(
        &self,
        reg: &mut Registry,
        (handle, addr): (u64, u64),
        len: u32,
        placed: bool,
    ) -> Result<Placement, ChannelError> {
        if !self.writes {
            return Err(RxError::WriteNotAllowed.into());
        }
        let p = reg
            .begin_write(self.domain, handle, addr, len)
            .map_err(RxError::from)?;
        if reg.is_shared(p.handle) != placed {
            reg.abort_write(&p);
            let (kind, mem) = match placed {
                true => ("placed", "private"),
                false => ("carried", "shared"),
            };
            return Err(ShmError::Misplaced { kind, mem }.into());
        }
        Ok(p)
    }

    /// Places the write of the held record's payload (after the operation header) through
    /// `reg`'s checks, copying it from the ring straight into the element; or, for a write
    /// the peer `placed` in this side's shared pool itself, only checks it.
    fn place(
        &mut self,
        reg: &mut Registry,
        (handle, addr, imm): (u64, u64, Option<u32>),
        len: u32,
        placed: bool,
    ) -> Result<RxCompletion, ChannelError> {
        let p = self.begin(reg, (handle, addr), len, placed)?;
        if !placed {
            let dst = reg.placement_mut(&p);
            if dst.len() != len as usize {
                reg.abort_write(&p);
                return Err(ShmError::BadRecord {
                    len: OP_HEADER_LEN + len as usize,
                }
                .into());
            }
            if let Err(e) = self.rx.copy_out(OP_HEADER_LEN, dst) {
                reg.abort_write(&p);
                return Err(ShmError::Ring(e).into());
            }
        }
        reg.finish_write(&p);
        Ok(RxCompletion::Write {
            handle: p.handle,
            element: p.element,
            len: p.len,
            imm,
        })
    }

    /// Takes the next operation: its header is copied out and parsed privately, a write's
    /// payload goes straight from the ring into its element (or was placed there by the
    /// peer), a SEND's into `record`.
    fn take(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        let Some(rec) = self.rx.peek().map_err(ShmError::Ring)? else {
            return Ok(None);
        };
        let mut header = [0u8; OP_HEADER_LEN];
        if rec.len < OP_HEADER_LEN {
            return Err(ShmError::BadRecord { len: rec.len }.into());
        }
        self.rx.read(0, &mut header).map_err(ShmError::Ring)?;
        let h = OpHeader::parse(&header).map_err(RxError::from)?;
        if rec.kind == KIND_PLACED {
            let target = match h.op {
                Op::Write { handle, addr } => (handle, addr, None),
                Op::WriteImm { handle, addr, imm } => (handle, addr, Some(imm)),
                Op::Send => return Err(ShmError::BadRecord { len: rec.len }.into()),
            };
            if rec.len != OP_HEADER_LEN {
                return Err(ShmError::BadRecord { len: rec.len }.into());
            }
            return self.place(reg, target, h.len, true).map(Some);
        }
        if h.len as usize != rec.len - OP_HEADER_LEN {
            return Err(ShmError::BadRecord { len: rec.len }.into());
        }
        match h.op {
            Op::Write { handle, addr } => {
                return self
                    .place(reg, (handle, addr, None), h.len, false)
                    .map(Some)
            }
            Op::WriteImm { handle, addr, imm } => {
                return self
                    .place(reg, (handle, addr, Some(imm)), h.len, false)
                    .map(Some)
            }
            Op::Send => {}
        }
        if h.len as usize > self.max_send {
            return Err(RxError::SendTooLong {
                len: h.len,
                max: self.max_send,
            }
            .into());
        }
        self.record.clear();
        self.record.resize(h.len as usize, 0);
        self.rx
            .copy_out(OP_HEADER_LEN, &mut self.record)
            .map_err(ShmError::Ring)?;
        Ok(Some(RxCompletion::Recv {
            len: h.len as usize,
        }))
    }
}

impl<M: SharedMem + Send + Sync> Channel for ShmChannel<M> {
    fn post(&mut self, op: Op, prefix: &[u8], payload: Payload) {
        // With the peer's arena, a write's bytes go straight to their element there. One
        // that does not fit the arena travels in the ring, and the peer's checks refuse it.
        if let Op::Write { addr, .. } | Op::WriteImm { addr, .. } = op {
            let bytes = payload.as_slice();
            let len = prefix.len() + bytes.len();
            let placed = self.peer_window(addr, len).is_some_and(|w| {
                w.copy_in(0, prefix).is_ok() && w.copy_in(prefix.len(), bytes).is_ok()
            });
            if placed {
                // A write is at most one element, far below 4 GiB.
                self.queue.post_placed(op, len as u32);
                self.queue.retire(payload);
                return;
            }
        }
        self.queue.post(op, prefix, payload);
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        let mut staged = false;
        while let Some((parts, placed)) = self.queue.front() {
            let len: usize = parts.iter().map(|p| p.len()).sum();
            let kind = if placed { KIND_PLACED } else { KIND_OP };
            match self.tx.stage(kind, &parts) {
                Ok(()) => {
                    self.queue.advance(len);
                    staged = true;
                }
                Err(PushError::Full) => break,
                Err(PushError::Peer(e)) => return Err(ShmError::Ring(e).into()),
                Err(PushError::TooLarge { .. } | PushError::BadKind(_)) => {
                    return Err(ShmError::TooLarge { len }.into())
                }
            }
        }
        if staged {
            let published = self.tx.publish().map_err(ShmError::Ring)?;
            self.doorbell |= published.notify;
        }
        Ok(self.queue.is_empty())
    }

    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        if self.stopped {
            return Err(ShmError::Stopped.into());
        }
        // Only a record taken whole is given back; an error ends the channel, and the record
        // it held is never read again.
        let taken = self.take(reg).inspect_err(|_| self.stopped = true)?;
        self.rx.consume().map_err(ShmError::Ring)?;
        match taken {
            Some(_) => self.idle.took = true,
            None => self.idle.judge(self.tx.tail())?,
        }
        Ok(taken)
    }

    fn received(&self) -> &[u8] {
        &self.record
    }

    fn reclaim(&mut self, cache: &mut SendBufCache) {
        self.queue.reclaim(cache);
    }

    fn pending(&self) -> usize {
        self.queue.queued_bytes()
    }

    fn held_bytes(&self) -> usize {
        self.queue.held_bytes()
    }

    fn set_writes_allowed(&mut self, allowed: bool) {
        self.writes = allowed;
    }

    fn close(&mut self, _reg: &mut Registry) -> usize {
        // Writes are placed whole when their record is popped: none is ever half done.
        self.queue.clear()
    }

    fn places_writes(&self) -> bool {
        self.peer_pools.is_some()
    }

    fn peer_window(&self, addr: u64, len: usize) -> Option<SharedBytes<'_>> {
        let mem = self.peer_pools.as_ref()?;
        let off = usize::try_from(arena_offset(addr)).ok()?;
        SharedBytes::new(mem, off, len).ok()
    }

    fn post_placed(&mut self, op: Op, len: u32) {
        self.queue.post_placed(op, len);
    }
}

/// Two connected channels over in-process rings of `cfg` ([`crate::memory::HeapShared`]): for tests,
/// fuzzing and benchmarks. `a` accepts writes into the pools of `domain_a` (its side's
/// registry), `b` into those of `domain_b`.
pub fn heap_pair(
    cfg: RingConfig,
    (domain_a, domain_b): (DomainId, DomainId),
    max_send: usize,
) -> Result<
    (
        ShmChannel<crate::memory::HeapShared>,
        ShmChannel<crate::memory::HeapShared>,
    ),
    RingError,
> {
    let ring = || -> Result<crate::memory::HeapShared, RingError> {
        let m = crate::memory::HeapShared::new(cfg.region_len());
        cfg.init(&m)?;
        Ok(m)
    };
    let (ab, ba) = (ring()?, ring()?);
    let a = ShmChannel::new(
        Producer::attach(ab.clone(), cfg)?,
        Consumer::attach(ba.clone(), cfg)?,
        domain_a,
        max_send,
    );
    let b = ShmChannel::new(
        Producer::attach(ba, cfg)?,
        Consumer::attach(ab, cfg)?,
        domain_b,
        max_send,
    );
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::shm::ring::HEADER_LEN;
    use crate::adapter::tests::{drain, target_pool as pool, PD};
    use crate::memory::{Frame, Handle, ProtectionError, RegistryError};
    use crate::memory::{HeapShared, SharedMem};

    /// Two channels over rings of `data_size` bytes carrying payloads up to 4 KiB.
    fn pair(data_size: u32) -> (ShmChannel<HeapShared>, ShmChannel<HeapShared>) {
        heap_pair(ring_config(data_size, 4096).unwrap(), (PD, PD), 4096).unwrap()
    }

    fn write(h: Handle, addr: u64, imm: u32) -> Op {
        Op::WriteImm {
            handle: h.to_u64(),
            addr,
            imm,
        }
    }

    #[test]
    fn a_full_ring_holds_operations_back_until_the_peer_consumes() {
        let mut reg = Registry::new(1 << 20);
        let h = pool(&mut reg, 16, 4096);
        let base = Registry::base_address(h);
        // 16 KiB of ring: three 4 KiB writes fit, the rest wait in the queue.
        let (mut a, mut b) = pair(16 << 10);
        for i in 0..8u8 {
            let op = write(h, base + 4096 * u64::from(i), u32::from(i));
            a.post(op, &[], Payload::Bytes(vec![i; 4000]));
        }
        a.post(Op::Send, &[], Payload::Bytes(b"last".to_vec()));
        let mut got = vec![];
        let mut rounds = 0;
        while !a.flush().unwrap() {
            got.extend(drain(&mut b, &mut reg));
            rounds += 1;
        }
        got.extend(drain(&mut b, &mut reg));
        assert!(rounds >= 2, "the ring filled ({rounds} rounds)");
        assert_eq!(a.pending(), 0);
        assert_eq!(got.len(), 9);
        for (i, (c, bytes)) in got.iter().take(8).enumerate() {
            assert!(
                matches!(c, RxCompletion::Write { element, imm: Some(imm), .. }
                if *element == i as u32 && *imm == i as u32)
            );
            assert_eq!(bytes, &vec![i as u8; 4000]);
        }
        assert_eq!(got[8].1, b"last");
    }

    #[test]
    fn a_side_waiting_for_room_is_woken_when_the_peer_consumes() {
        let mut reg = Registry::new(1 << 20);
        let h = pool(&mut reg, 16, 4096);
        let base = Registry::base_address(h);
        let (mut a, mut b) = pair(16 << 10);
        assert!(b.prepare_sleep(), "b waits for records");
        for i in 0..8u8 {
            let op = write(h, base + 4096 * u64::from(i), u32::from(i));
            a.post(op, &[], Payload::Bytes(vec![i; 4000]));
        }
        assert!(!a.flush().unwrap(), "the ring is full");
        assert!(a.take_doorbell(), "b asked to be woken by a publication");
        assert!(a.prepare_sleep(), "a may sleep: it asked for room");
        b.wake();
        assert!(!b.take_doorbell(), "nothing consumed yet");
        assert!(!drain(&mut b, &mut reg).is_empty());
        assert!(b.take_doorbell(), "consuming freed the room a waits for");
        assert!(!b.take_doorbell(), "once");
        a.wake();
        // Nothing waits in a's queue once all is out: it sleeps on records alone.
        while !a.flush().unwrap() {
            drain(&mut b, &mut reg);
        }
        drain(&mut b, &mut reg);
        let _ = b.take_doorbell();
        assert!(a.prepare_sleep());
        assert!(!b.take_doorbell(), "a did not ask for room");
    }

    #[test]
    fn writes_pass_the_registry_checks_before_placement() {
        let mut reg = Registry::new(1 << 20);
        let h = pool(&mut reg, 2, 256);
        let base = Registry::base_address(h);
        let (mut a, mut b) = pair(16 << 10);
        // 300 bytes into a 256-byte element.
        a.post(write(h, base, 0), &[], Payload::Bytes(vec![9; 300]));
        a.flush().unwrap();
        let err = b.poll_recv(&mut reg).unwrap_err();
        assert!(
            matches!(err, ChannelError::Rx(RxError::Protection(_))),
            "{err}"
        );
        assert_eq!(
            reg.element(h, 0, 256).unwrap(),
            &[0; 256][..],
            "nothing placed"
        );
        // Writes refused on a channel that carries none (the control channel).
        let (mut a, mut b) = pair(16 << 10);
        b.set_writes_allowed(false);
        a.post(write(h, base, 0), &[], Payload::Bytes(vec![9; 10]));
        a.flush().unwrap();
        assert!(matches!(
            b.poll_recv(&mut reg),
            Err(ChannelError::Rx(RxError::WriteNotAllowed))
        ));
    }

    #[test]
    fn a_send_longer_than_the_receive_buffer_is_refused() {
        let mut reg = Registry::new(1 << 20);
        let cfg = ring_config(16 << 10, 4096).unwrap();
        let (mut a, mut b) = heap_pair(cfg, (PD, PD), 100).unwrap();
        a.post(Op::Send, &[], Payload::Bytes(vec![1; 100]));
        a.post(Op::Send, &[], Payload::Bytes(vec![1; 101]));
        a.flush().unwrap();
        assert!(matches!(
            b.poll_recv(&mut reg),
            Ok(Some(RxCompletion::Recv { len: 100 }))
        ));
        assert!(matches!(
            b.poll_recv(&mut reg),
            Err(ChannelError::Rx(RxError::SendTooLong {
                len: 101,
                max: 100
            }))
        ));
    }

    #[test]
    fn a_peer_that_scribbles_on_its_ring_is_cut_off_and_no_one_else() {
        let mut reg = Registry::new(1 << 20);
        let h = pool(&mut reg, 4, 256);
        let base = Registry::base_address(h);
        let (mut bad, mut victim_side) = pair(16 << 10);
        let (mut good, mut good_side) = pair(16 << 10);
        bad.post(Op::Send, &[], Payload::Bytes(b"hello".to_vec()));
        bad.flush().unwrap();
        // The rogue producer moves its head past anything it wrote.
        bad.tx.memory().store_u32(64, 1 << 20).unwrap();
        assert!(matches!(
            victim_side.poll_recv(&mut reg),
            Err(ChannelError::Shm(ShmError::Ring(_)))
        ));
        assert!(
            victim_side.poll_recv(&mut reg).is_err(),
            "a broken ring stays broken"
        );
        good.post(write(h, base, 5), &[], Payload::Bytes(vec![3; 200]));
        good.flush().unwrap();
        let got = drain(&mut good_side, &mut reg);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, vec![3; 200]);
    }

    #[test]
    fn a_record_that_is_not_one_operation_is_refused() {
        let mut reg = Registry::new(1 << 20);
        let cfg = ring_config(16 << 10, 4096).unwrap();
        for record in [vec![0u8; 10], {
            // A SEND header claiming 50 bytes with 20 behind it.
            let mut r = OpHeader {
                op: Op::Send,
                len: 50,
            }
            .emit()
            .to_vec();
            r.extend_from_slice(&[0; 20]);
            r
        }] {
            let (a, mut b) = heap_pair(cfg, (PD, PD), 4096).unwrap();
            let mut raw = Producer::attach(a.tx.memory().clone(), cfg).unwrap();
            let _ = raw.push(KIND_OP, &[&record]).unwrap();
            assert!(matches!(
                b.poll_recv(&mut reg),
                Err(ChannelError::Shm(ShmError::BadRecord { .. }))
            ));
        }
    }

    /// A pair whose `b` side keeps its pools in a shared arena of `arena` bytes that `a`
    /// places its writes in; `b`'s registry, with the arena attached for [`PD`].
    fn placed_pair(arena: usize) -> (ShmChannel<HeapShared>, ShmChannel<HeapShared>, Registry) {
        let (mut a, b) = pair(16 << 10);
        let mem = HeapShared::new(arena);
        a.set_peer_pools(mem.clone());
        let mut reg = Registry::new(1 << 20);
        reg.attach_arena(PD, std::sync::Arc::new(mem)).unwrap();
        (a, b, reg)
    }

    #[test]
    fn writes_into_a_shared_pool_are_placed_by_the_writer_and_only_headers_travel() {
        let (mut a, mut b, mut reg) = placed_pair(64 << 10);
        let first = pool(&mut reg, 1, 100);
        let h = pool(&mut reg, 8, 4096);
        assert!(reg.is_shared(h));
        let base = reg.address(h).unwrap();
        assert_eq!(arena_offset(base), 128, "after the first pool, aligned");
        reg.deregister(first).unwrap();
        assert_ne!(
            base,
            Registry::base_address(h),
            "the arena offset is in the address"
        );
        // Eight writes of 4000 bytes: in the ring they would need 32 KiB of its 16; placed,
        // each is a 32-byte header and all go out in one flush.
        for i in 0..8u8 {
            let op = write(h, base + 4096 * u64::from(i), u32::from(i));
            a.post(op, &[i], Payload::Bytes(vec![i; 3999]));
        }
        assert!(a.flush().unwrap(), "everything staged at once");
        let got = drain(&mut b, &mut reg);
        assert_eq!(got.len(), 8);
        for (i, (c, bytes)) in got.iter().enumerate() {
            assert!(
                matches!(c, RxCompletion::Write { element, len: 4000, imm: Some(imm), .. }
                if *element == i as u32 && *imm == i as u32)
            );
            assert_eq!(bytes.len(), 4000);
            assert!(bytes.iter().all(|&x| x == i as u8), "write {i} is in place");
            assert!(matches!(reg.frame(h, i as u32, 4000), Ok(Frame::Shared(_))));
            assert!(matches!(
                reg.element(h, i as u32, 1),
                Err(RegistryError::Shared(_))
            ));
        }
        // Placed writes pass the same checks: the elements were written once already.
        a.post(write(h, base, 9), &[], Payload::Bytes(vec![1; 10]));
        a.flush().unwrap();
        assert!(matches!(
            b.poll_recv(&mut reg),
            Err(ChannelError::Rx(RxError::Protection(
                ProtectionError::NotGranted { .. }
            )))
        ));
    }

    #[test]
    fn a_write_that_does_not_match_where_its_pool_lives_is_refused() {
        let cfg = ring_config(16 << 10, 4096).unwrap();
        // Each case: whether b's pool is in a shared arena, the record's kind and bytes.
        // Each case: whether b's pool is in a shared arena, the record's kind, whether it
        // holds a SEND (else a write), whether 8 payload bytes follow the header.
        let cases = [
            (true, KIND_OP, false, true, "carried into shared"),
            (false, KIND_PLACED, false, false, "placed into private"),
            (true, KIND_PLACED, true, false, "a placed SEND"),
            (
                true,
                KIND_PLACED,
                false,
                true,
                "a placed write with bytes behind it",
            ),
        ];
        for (shared, kind, send, bytes, what) in cases {
            let mut reg = Registry::new(1 << 20);
            if shared {
                reg.attach_arena(PD, std::sync::Arc::new(HeapShared::new(64 << 10)))
                    .unwrap();
            }
            let h = pool(&mut reg, 2, 256);
            let base = reg.address(h).unwrap();
            let (a, mut b) = heap_pair(cfg, (PD, PD), 4096).unwrap();
            let mut raw = Producer::attach(a.tx.memory().clone(), cfg).unwrap();
            let op = if send { Op::Send } else { write(h, base, 0) };
            let mut record = OpHeader { op, len: 8 }.emit().to_vec();
            if bytes {
                record.extend_from_slice(&[7; 8]);
            }
            let _ = raw.push(kind, &[&record]).unwrap();
            let err = b.poll_recv(&mut reg).unwrap_err();
            match what {
                "carried into shared" | "placed into private" => assert!(
                    matches!(err, ChannelError::Shm(ShmError::Misplaced { .. })),
                    "{what}: {err}"
                ),
                _ => assert!(
                    matches!(err, ChannelError::Shm(ShmError::BadRecord { .. })),
                    "{what}: {err}"
                ),
            }
            assert_eq!(reg.stats().regions, 1);
            assert_eq!(reg.in_flight(h), Ok(0), "{what}: nothing left in flight");
        }
    }

    #[test]
    fn a_write_beyond_the_peers_arena_travels_in_the_ring_and_is_refused() {
        let (mut a, mut b, mut reg) = placed_pair(4096);
        let h = pool(&mut reg, 1, 4096);
        let base = reg.address(h).unwrap();
        // The writer's view of the arena is smaller than the pool claims.
        a.set_peer_pools(HeapShared::new(1024));
        a.post(write(h, base, 0), &[], Payload::Bytes(vec![5; 2000]));
        a.flush().unwrap();
        let err = b.poll_recv(&mut reg).unwrap_err();
        assert!(
            matches!(err, ChannelError::Shm(ShmError::Misplaced { .. })),
            "{err}"
        );
    }

    #[test]
    fn the_doorbell_is_asked_for_once_per_sleep() {
        let (mut a, mut b) = pair(16 << 10);
        a.post(Op::Send, &[], Payload::Bytes(vec![1]));
        a.flush().unwrap();
        assert!(!a.take_doorbell(), "the peer was not asleep");
        let mut reg = Registry::new(1 << 20);
        drain(&mut b, &mut reg);
        assert!(b.prepare_sleep());
        for _ in 0..3 {
            a.post(Op::Send, &[], Payload::Bytes(vec![2]));
            a.flush().unwrap();
        }
        assert!(a.take_doorbell());
        assert!(!a.take_doorbell());
        b.wake();
        assert!(!drain(&mut b, &mut reg).is_empty());
    }

    /// One doorbell ring with nothing published and nothing to stage.
    fn idle_ring(b: &mut ShmChannel<HeapShared>, reg: &mut Registry) -> Result<(), ChannelError> {
        b.rang();
        b.flush()?;
        b.poll_recv(reg).map(|_| ())
    }

    #[test]
    fn a_doorbell_flood_ends_the_channel() {
        let mut reg = Registry::new(1 << 20);
        let (_a, mut b) = pair(16 << 10);
        for _ in 1..MAX_IDLE_WAKES {
            idle_ring(&mut b, &mut reg).unwrap();
        }
        let e = idle_ring(&mut b, &mut reg).unwrap_err();
        assert!(
            matches!(e, ChannelError::Shm(ShmError::DoorbellFlood(n)) if n == MAX_IDLE_WAKES),
            "{e}"
        );
        // Polls without a ring are not rings: a quiet peer is never cut off.
        let (_a, mut b) = pair(16 << 10);
        for _ in 0..10 * MAX_IDLE_WAKES {
            assert!(b.poll_recv(&mut reg).unwrap().is_none());
        }
    }

    #[test]
    fn rings_that_bring_records_or_room_are_never_a_flood() {
        let mut reg = Registry::new(1 << 20);
        let (mut a, mut b) = pair(16 << 10);
        // Every other ring is idle (a request withdrawn after the peer saw it).
        for i in 0..4 * MAX_IDLE_WAKES {
            if i % 2 == 0 {
                a.post(Op::Send, &[], Payload::Bytes(b"x".to_vec()));
                a.flush().unwrap();
            }
            b.rang();
            drain(&mut b, &mut reg);
        }
        // A side waiting for room: rung each time the peer frees some, it stages more.
        for i in 0..4 * u32::from(u8::MAX) {
            a.post(Op::Send, &[], Payload::Bytes(vec![i as u8; 3000]));
        }
        let mut rounds = 0;
        while !a.flush().unwrap() {
            assert!(a.prepare_sleep(), "the ring is full");
            assert!(b.poll_recv(&mut reg).unwrap().is_some());
            drain(&mut b, &mut reg);
            assert!(b.take_doorbell(), "room freed for a side that asked");
            a.wake();
            a.rang();
            assert!(a.poll_recv(&mut reg).unwrap().is_none());
            rounds += 1;
        }
        assert!(rounds > MAX_IDLE_WAKES, "{rounds} rounds");
    }

    #[test]
    fn traffic_towards_a_flooding_peer_does_not_shield_it() {
        let mut reg = Registry::new(1 << 20);
        let (mut flooder, mut victim) = pair(16 << 10);
        let mut rounds = 0;
        let e = loop {
            victim.post(Op::Send, &[], Payload::Bytes(b"to you".to_vec()));
            assert!(victim.flush().unwrap());
            drain(&mut flooder, &mut reg);
            victim.rang();
            rounds += 1;
            match victim.poll_recv(&mut reg) {
                Ok(None) => assert!(rounds < 1000, "never cut off"),
                Ok(Some(_)) => panic!("the flooder sent nothing"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(e, ChannelError::Shm(ShmError::DoorbellFlood(_))),
            "{e}"
        );
        assert_eq!(rounds, MAX_IDLE_WAKES);
    }

    #[test]
    fn after_an_error_the_held_record_is_never_read_again() {
        let mut reg = Registry::new(1 << 20);
        let (mut a, mut b) = pair(16 << 10);
        // A write through a handle that names no region: refused.
        a.post(
            write(Handle::new(7, 0), 0, 1),
            &[],
            Payload::Bytes(vec![1; 64]),
        );
        assert!(a.flush().unwrap());
        let e = b.poll_recv(&mut reg).unwrap_err();
        assert!(matches!(e, ChannelError::Rx(RxError::Protection(_))), "{e}");
        // The peer may now rewrite the record; nothing reads it.
        a.tx_memory().write(HEADER_LEN + 8, &[0xff; 32]).unwrap();
        for _ in 0..3 {
            let e = b.poll_recv(&mut reg).unwrap_err();
            assert!(matches!(e, ChannelError::Shm(ShmError::Stopped)), "{e}");
        }
    }
}
