//! A data channel over RDMA verbs (rdma-core: InfiniBand, RoCE, Soft-RoCE).
//!
//! A host whose `fabric.ioc` is `rdma:ADDR:PORT` opens its control channel over TCP as usual
//! and its data channel's connection with a Hello naming [`VERBS_CHANNEL`]. After the
//! HelloReply each side tells the other, on that connection, its queue pair and pool arena
//! ([`Endpoint`]): the host first, the IOC once its queue pair is connected, then the host
//! confirms with one byte once its own is (so the IOC never sends into a queue pair that
//! cannot receive yet). The connection is then closed; everything travels over the queue
//! pair (docs/protocol.md section 10):
//!
//! * RDMA WRITE WITH IMMEDIATE (an indication idata can carry): the frame lands in the
//!   element the immediate data names, in the peer's pool arena, a memory region registered
//!   for remote write in the session's protection domain; its completion gives the receiver
//!   the immediate data and the length, which the registry checks as for any write
//!   ([`Registry::begin_write_idata`]).
//! * RDMA WRITE of a frame idata cannot describe, followed by a SEND WITH IMMEDIATE
//!   ([`NOTICE`]) carrying its 32-byte operation header, which the registry checks; the
//!   BufferRDMAIndicate follows as a message, as on every transport.
//! * SEND: messages, into receives each side keeps posted.
//!
//! The device is the one whose GID table holds the address the connection used (RoCE), so
//! no device is configured. Its libibverbs is loaded when first needed: without rdma-core
//! only an `rdma:` address fails, with an error that names what is missing.

mod endpoint;
mod stage;
#[allow(unsafe_code)]
mod sys;

pub use endpoint::{Endpoint, EndpointError, ENDPOINT_LEN};

use super::{FabricError, Stream};
use splitnet_messaging::adapter::{
    Channel, ChannelError, Op, OpHeader, Payload, RxCompletion, RxError, MAX_PREFIX, OP_HEADER_LEN,
};
use splitnet_messaging::memory::{
    DomainId, ProtectionError, Registry, SendBuf, SendBufCache, SharedRegion,
};
use stage::Stage;
use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;
use sys::{Cq, Mr, Pd, Qp, Remote, SendKind, SendWr, Wc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Channel number a data channel's Hello names to travel over an RDMA queue pair.
pub const VERBS_CHANNEL: u8 = 4;
/// Immediate data of a SEND that carries the operation header of the RDMA WRITE before it.
pub const NOTICE: u32 = 0x4e4f_5443;
/// Work requests the send queue holds.
const SEND_DEPTH: u32 = 256;
/// Receives kept posted: each RDMA WRITE WITH IMMEDIATE takes one too, so this many writes
/// and messages may be in flight before the sender waits (receiver not ready: it retries,
/// nothing is lost).
const RECV_DEPTH: u32 = 128;
/// Bytes of each posted receive: the largest message (a SendData of a frame no pool element
/// holds, before the peer's pools are known, is up to 65,536 bytes).
const RECV_BUF: u32 = splitnet_messaging::wire::MAX_MESSAGE_LEN as u32;
/// Bytes of the send staging ring: room for several of the largest frames.
const STAGE_BYTES: usize = 4 << 20;
/// At most this many unsignalled work requests in a row.
const SIGNAL_EVERY: u64 = 16;
/// Byte that confirms the host's queue pair is connected.
const READY: u8 = 1;
/// Least time the set-up after the HelloReply may take: registering memory pins it, which
/// takes milliseconds natively and up to seconds under emulation. A host that stalls it
/// holds one of the IOC's `max_handshakes` places that long.
const SETUP_MIN: Duration = Duration::from_secs(10);

/// A posted operation waiting for staging room.
#[derive(Debug)]
struct TxOp {
    op: Op,
    prefix: [u8; MAX_PREFIX],
    prefix_len: usize,
    payload: Payload,
}

impl TxOp {
    fn len(&self) -> usize {
        self.prefix_len + payload_bytes(&self.payload).len()
    }

    fn is_frame(&self) -> bool {
        !matches!(self.op, Op::Send) || matches!(self.payload, Payload::Buf(_))
    }
}

fn payload_bytes(p: &Payload) -> &[u8] {
    match p {
        Payload::Empty => &[],
        Payload::Bytes(b) => b,
        Payload::Buf(b) => b.as_slice(),
    }
}

/// The peer's pool arena and receives, from its [`Endpoint`].
#[derive(Debug, Clone, Copy)]
struct Peer {
    arena_addr: u64,
    arena_len: u64,
    rkey: u32,
    recv_buf: u32,
}

/// What a queue pair did: the verbs calls it made and the operations it carried. Logged
/// when the channel ends; per frame, this is what predicts the cost on an RDMA NIC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerbsStats {
    /// RDMA WRITE WITH IMMEDIATE posted.
    pub write_imm_tx: u64,
    /// Plain RDMA WRITE posted (each with its notice).
    pub write_tx: u64,
    /// SENDs posted (messages).
    pub send_tx: u64,
    /// RDMA WRITE WITH IMMEDIATE received.
    pub write_imm_rx: u64,
    /// Plain RDMA WRITE received (by their notices).
    pub write_rx: u64,
    /// SENDs received.
    pub send_rx: u64,
    /// `ibv_post_send` calls (each rings the adapter's doorbell once).
    pub post_send: u64,
    /// `ibv_post_recv` calls.
    pub post_recv: u64,
    /// `ibv_poll_cq` calls.
    pub poll_cq: u64,
    /// Completions polled.
    pub completions: u64,
    /// `ibv_req_notify_cq` calls (arming before a sleep).
    pub arm: u64,
    /// Completion events read from the channel (wake-ups).
    pub events: u64,
}

impl std::fmt::Display for VerbsStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "write_imm_tx={} write_tx={} send_tx={} write_imm_rx={} write_rx={} send_rx={} \
             post_send={} post_recv={} poll_cq={} completions={} arm={} events={}",
            self.write_imm_tx,
            self.write_tx,
            self.send_tx,
            self.write_imm_rx,
            self.write_rx,
            self.send_rx,
            self.post_send,
            self.post_recv,
            self.poll_cq,
            self.completions,
            self.arm,
            self.events
        )
    }
}

/// A channel over an RC queue pair. Fields drop in order: the queue pair before the
/// completion queue and the memory regions it uses, all before their protection domain.
pub struct VerbsTransport {
    qp: Qp,
    cq: Cq,
    stage_mr: Mr,
    recv_mr: Mr,
    _arena_mr: Mr,
    pools: SharedRegion,
    _pd: Arc<Pd>,
    peer: Peer,
    domain: DomainId,
    writes_allowed: bool,
    tx: VecDeque<TxOp>,
    tx_bytes: usize,
    tx_bufs: usize,
    done: Vec<SendBuf>,
    stage: Stage,
    next_wr: u64,
    unsignalled: u64,
    batch: Vec<SendWr>,
    /// Completions polled and not yet handled.
    wcs: VecDeque<Wc>,
    scratch: Vec<Wc>,
    /// The receive whose bytes [`Channel::received`] returns (slot id, offset, length):
    /// reposted at the next poll.
    last_recv: Option<(u64, usize, usize)>,
    repost: Vec<(u64, usize)>,
    /// Why the queue pair broke, once it did: every later call fails with it.
    failed: Option<String>,
    stats: VerbsStats,
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        tracing::info!(
            qpn = self.qp.qpn(),
            "RDMA queue pair closed: {}",
            self.stats
        );
    }
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("qpn", &self.qp.qpn())
            .field("domain", &self.domain)
            .field("pending", &self.tx_bytes)
            .finish()
    }
}

/// A queue pair and its memory, before it is connected.
struct Prepared {
    pd: Arc<Pd>,
    cq: Cq,
    qp: Qp,
    stage_mr: Mr,
    recv_mr: Mr,
    arena_mr: Mr,
    pools: SharedRegion,
    port: sys::Port,
    psn: u32,
}

impl Prepared {
    fn new(ip: IpAddr, pools: SharedRegion) -> io::Result<Prepared> {
        let port = sys::port_for(ip)?;
        let on = |what: &str| {
            let dev = port.ctx.name().to_string();
            let what = what.to_string();
            move |e: io::Error| io::Error::new(e.kind(), format!("{dev}: {what}: {e}"))
        };
        let pd = Pd::new(&port.ctx).map_err(on("protection domain"))?;
        let cq = Cq::new(&port.ctx, SEND_DEPTH + RECV_DEPTH).map_err(on("completion queue"))?;
        let qp = Qp::new(&pd, &port, &cq, SEND_DEPTH, RECV_DEPTH).map_err(on("queue pair"))?;
        let stage_mr = Mr::heap(&pd, STAGE_BYTES, sys::Access::Local)?;
        let recv_mr = Mr::heap(
            &pd,
            (RECV_DEPTH * RECV_BUF) as usize,
            sys::Access::LocalWrite,
        )?;
        let arena_mr = Mr::shared(&pd, pools.clone())?;
        let psn = random_psn();
        Ok(Prepared {
            pd,
            cq,
            qp,
            stage_mr,
            recv_mr,
            arena_mr,
            pools,
            port,
            psn,
        })
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint {
            qpn: self.qp.qpn(),
            psn: self.psn,
            gid: self.port.gid,
            mtu: self.port.mtu,
            rkey: self.arena_mr.rkey(),
            arena_addr: self.arena_mr.addr(),
            arena_len: self.arena_mr.len() as u64,
            recv_buf: RECV_BUF,
            recv_depth: RECV_DEPTH,
        }
    }

    /// Posts every receive and connects to `peer`.
    fn connect(mut self, peer: &Endpoint, domain: DomainId) -> io::Result<VerbsTransport> {
        let slots: Vec<(u64, usize)> = (0..RECV_DEPTH)
            .map(|i| (u64::from(i), (i * RECV_BUF) as usize))
            .collect();
        self.qp.post_recv(&self.recv_mr, &slots, RECV_BUF)?;
        let remote = Remote {
            qpn: peer.qpn,
            psn: peer.psn,
            gid: peer.gid,
            mtu: peer.mtu.min(self.port.mtu),
        };
        self.qp.connect(&remote, self.psn)?;
        Ok(VerbsTransport {
            qp: self.qp,
            cq: self.cq,
            stage_mr: self.stage_mr,
            recv_mr: self.recv_mr,
            _arena_mr: self.arena_mr,
            pools: self.pools,
            _pd: self.pd,
            peer: Peer {
                arena_addr: peer.arena_addr,
                arena_len: peer.arena_len,
                rkey: peer.rkey,
                recv_buf: peer.recv_buf,
            },
            domain,
            writes_allowed: false,
            tx: VecDeque::new(),
            tx_bytes: 0,
            tx_bufs: 0,
            done: Vec::new(),
            stage: Stage::new(STAGE_BYTES),
            next_wr: 1,
            unsignalled: 0,
            batch: Vec::new(),
            wcs: VecDeque::new(),
            scratch: Vec::new(),
            last_recv: None,
            repost: Vec::new(),
            failed: None,
            stats: VerbsStats {
                post_recv: 1,
                ..VerbsStats::default()
            },
        })
    }
}

/// A first packet sequence number: 24 bits, differing between connections.
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // getrandom cannot fail on Linux with a small buffer; a fixed value would do as well.
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b) & 0x00ff_ffff
}

/// Work request ids: sends count up from 1 with this bit set; receives are their slot index.
const SEND_BIT: u64 = 1 << 63;

fn io_err(msg: String) -> ChannelError {
    ChannelError::Io(io::Error::other(msg))
}

impl VerbsTransport {
    /// This side's pool arena: the registry lays the session's pools out in it
    /// ([`Registry::attach_arena`]) before the session starts.
    pub fn pools(&self) -> SharedRegion {
        self.pools.clone()
    }

    /// Changes the protection domain whose writes this channel carries.
    pub fn set_domain(&mut self, domain: DomainId) {
        self.domain = domain;
    }

    /// The completion channel's descriptor: readable once an armed queue got a completion.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.cq.fd()
    }

    /// Polls the completion queue: send completions give staging back at once; receive
    /// completions wait in `wcs`. A failed completion stops the channel.
    fn reap(&mut self) -> Result<(), ChannelError> {
        loop {
            self.scratch.clear();
            let n = self.cq.poll(&mut self.scratch)?;
            self.stats.poll_cq += 1;
            self.stats.completions += n as u64;
            for i in 0..self.scratch.len() {
                let wc = self.scratch[i];
                if wc.status != 0 {
                    let what = if wc.wr_id & SEND_BIT != 0 {
                        "send"
                    } else {
                        "receive"
                    };
                    return Err(self.fail(format!(
                        "RDMA {what} failed: {} (status {})",
                        sys::status_str(wc.status),
                        wc.status
                    )));
                }
                if wc.wr_id & SEND_BIT != 0 {
                    self.stage.complete(wc.wr_id & !SEND_BIT);
                } else {
                    self.wcs.push_back(wc);
                }
            }
            if n < 32 {
                return Ok(());
            }
        }
    }

    /// Marks the queue pair broken for `why`; the error to return.
    fn fail(&mut self, why: String) -> ChannelError {
        let e = io_err(format!("the RDMA queue pair is broken: {why}"));
        self.failed.get_or_insert(why);
        e
    }

    /// The error of a broken queue pair, if it is.
    fn broken(&self) -> Result<(), ChannelError> {
        match &self.failed {
            Some(why) => Err(io_err(format!("the RDMA queue pair is broken: {why}"))),
            None => Ok(()),
        }
    }

    /// Gives received buffers back to the adapter.
    fn repost(&mut self) -> Result<(), ChannelError> {
        if let Some((id, off, _)) = self.last_recv.take() {
            self.repost.push((id, off));
        }
        if !self.repost.is_empty() {
            if let Err(e) = self.qp.post_recv(&self.recv_mr, &self.repost, RECV_BUF) {
                return Err(self.fail(format!("ibv_post_recv: {e}")));
            }
            self.stats.post_recv += 1;
            self.repost.clear();
        }
        Ok(())
    }

    /// Where a write to `addr` (the peer's registry address) of `len` bytes lands in the
    /// peer's arena, if it lies inside it.
    fn remote(&self, addr: u64, len: usize) -> Option<u64> {
        let off = splitnet_messaging::memory::arena_offset(addr);
        (off.checked_add(len as u64)? <= self.peer.arena_len).then(|| self.peer.arena_addr + off)
    }

    /// Handles one receive completion.
    fn on_recv(&mut self, wc: Wc, reg: &mut Registry) -> Result<RxCompletion, ChannelError> {
        let slot = (wc.wr_id, (wc.wr_id as usize) * RECV_BUF as usize);
        let len = wc.byte_len;
        match (wc.opcode, wc.imm) {
            (sys::WC_RECV_RDMA_WITH_IMM, Some(imm)) => {
                self.repost.push(slot);
                if !self.writes_allowed {
                    return Err(RxError::WriteNotAllowed.into());
                }
                self.stats.write_imm_rx += 1;
                let p = reg
                    .begin_write_idata(self.domain, imm, len)
                    .map_err(RxError::from)?;
                // The adapter placed the bytes before the completion: nothing to copy.
                reg.finish_write(&p);
                Ok(RxCompletion::Write {
                    handle: p.handle,
                    element: p.element,
                    len,
                    imm: Some(imm),
                })
            }
            (sys::WC_RECV, Some(NOTICE)) => {
                self.repost.push(slot);
                if !self.writes_allowed {
                    return Err(RxError::WriteNotAllowed.into());
                }
                let bytes = self.recv_mr.bytes();
                let mut h = [0u8; OP_HEADER_LEN];
                if len as usize != OP_HEADER_LEN {
                    return Err(io_err(format!(
                        "RDMA write notice of {len} bytes, not {OP_HEADER_LEN}"
                    )));
                }
                h.copy_from_slice(&bytes[slot.1..slot.1 + OP_HEADER_LEN]);
                let header = OpHeader::parse(&h).map_err(RxError::from)?;
                let Op::Write { handle, addr } = header.op else {
                    return Err(io_err("RDMA write notice names no plain RDMA WRITE".into()));
                };
                self.stats.write_rx += 1;
                let p = reg
                    .begin_write(self.domain, handle, addr, header.len)
                    .map_err(RxError::from)?;
                reg.finish_write(&p);
                if !reg.is_shared(p.handle) {
                    return Err(RxError::Protection(ProtectionError::NoAccess(p.handle)).into());
                }
                Ok(RxCompletion::Write {
                    handle: p.handle,
                    element: p.element,
                    len: header.len,
                    imm: None,
                })
            }
            (sys::WC_RECV, None) => {
                self.stats.send_rx += 1;
                self.last_recv = Some((slot.0, slot.1, len as usize));
                Ok(RxCompletion::Recv { len: len as usize })
            }
            (op, imm) => {
                self.repost.push(slot);
                Err(io_err(format!(
                    "unexpected RDMA receive completion (opcode {op}, immediate {imm:?})"
                )))
            }
        }
    }
}

impl Channel for VerbsTransport {
    fn post(&mut self, op: Op, prefix: &[u8], payload: Payload) {
        let mut p = [0u8; MAX_PREFIX];
        let prefix_len = prefix.len().min(MAX_PREFIX);
        p[..prefix_len].copy_from_slice(&prefix[..prefix_len]);
        let op = TxOp {
            op,
            prefix: p,
            prefix_len,
            payload,
        };
        self.tx_bytes += op.len();
        self.tx_bufs += usize::from(matches!(op.payload, Payload::Buf(_)));
        self.tx.push_back(op);
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        self.broken()?;
        self.reap()?;
        self.batch.clear();
        while let Some(op) = self.tx.front() {
            let len = op.len();
            // A plain write takes two work requests (the write and its notice).
            let wrs = if matches!(op.op, Op::Write { .. }) {
                2
            } else {
                1
            };
            if self.stage.outstanding() + self.batch.len() + wrs > SEND_DEPTH as usize {
                break;
            }
            let (kind, notice) = match op.op {
                Op::Send => {
                    if len > self.peer.recv_buf as usize {
                        return Err(io_err(format!(
                            "SEND of {len} bytes exceeds the peer's receive buffers of {}",
                            self.peer.recv_buf
                        )));
                    }
                    (SendKind::Send, None)
                }
                Op::WriteImm { addr, imm, .. } => {
                    let Some(raddr) = self.remote(addr, len) else {
                        return Err(io_err(format!(
                            "RDMA write of {len} bytes at {addr:#x} outside the peer's pool arena"
                        )));
                    };
                    (
                        SendKind::WriteImm {
                            addr: raddr,
                            rkey: self.peer.rkey,
                            imm,
                        },
                        None,
                    )
                }
                Op::Write { addr, .. } => {
                    let Some(raddr) = self.remote(addr, len) else {
                        return Err(io_err(format!(
                            "RDMA write of {len} bytes at {addr:#x} outside the peer's pool arena"
                        )));
                    };
                    let header = OpHeader {
                        op: op.op,
                        len: len as u32,
                    }
                    .emit();
                    (
                        SendKind::Write {
                            addr: raddr,
                            rkey: self.peer.rkey,
                        },
                        Some(header),
                    )
                }
            };
            let staged = len + notice.map_or(0, |h| h.len());
            let id = self.next_wr;
            let Some(off) = self.stage.take(id, staged) else {
                break;
            };
            let bytes = &mut self.stage_mr.bytes_mut()[off..off + staged];
            bytes[..op.prefix_len].copy_from_slice(&op.prefix[..op.prefix_len]);
            bytes[op.prefix_len..len].copy_from_slice(payload_bytes(&op.payload));
            if let Some(h) = notice {
                bytes[len..].copy_from_slice(&h);
            }
            let Some(op) = self.tx.pop_front() else { break };
            self.tx_bytes -= len;
            if let Payload::Buf(b) = op.payload {
                self.tx_bufs -= 1;
                self.done.push(b);
            }
            self.next_wr += 1;
            self.unsignalled += 1;
            // Signalled: every SIGNAL_EVERY-th, the last of a flush (so its staging comes
            // back without waiting for more traffic) and any once the ring is half full; a
            // write with a notice never (the notice is).
            let signaled = notice.is_none()
                && (self.unsignalled >= SIGNAL_EVERY
                    || self.tx.is_empty()
                    || self.stage.used() > STAGE_BYTES / 2);
            if signaled {
                self.unsignalled = 0;
            }
            match kind {
                SendKind::WriteImm { .. } => self.stats.write_imm_tx += 1,
                SendKind::Write { .. } => self.stats.write_tx += 1,
                _ => self.stats.send_tx += 1,
            }
            self.batch.push(SendWr {
                wr_id: SEND_BIT | id,
                kind,
                off,
                len: len as u32,
                signaled,
            });
            if let Some(h) = notice {
                // The notice completes the pair: its completion frees both.
                self.unsignalled = 0;
                self.batch.push(SendWr {
                    wr_id: SEND_BIT | id,
                    kind: SendKind::SendImm(NOTICE),
                    off: off + len,
                    len: h.len() as u32,
                    signaled: true,
                });
            }
        }
        if self.batch.is_empty() {
            return Ok(self.tx.is_empty());
        }
        self.stats.post_send += 1;
        let posted = self.qp.post_send(&self.stage_mr, &self.batch);
        if let Err(e) = posted {
            return Err(self.fail(format!("ibv_post_send: {e}")));
        }
        Ok(self.tx.is_empty())
    }

    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        self.broken()?;
        self.repost()?;
        if self.wcs.is_empty() {
            self.reap()?;
        }
        match self.wcs.pop_front() {
            Some(wc) => match self.on_recv(wc, reg) {
                Ok(c) => Ok(Some(c)),
                Err(e) => {
                    self.failed.get_or_insert(e.to_string());
                    Err(e)
                }
            },
            None => Ok(None),
        }
    }

    fn received(&self) -> &[u8] {
        match self.last_recv {
            Some((_, off, len)) => self.recv_mr.bytes().get(off..off + len).unwrap_or_default(),
            None => &[],
        }
    }

    fn reclaim(&mut self, cache: &mut SendBufCache) {
        for b in self.done.drain(..) {
            cache.put(b);
        }
    }

    fn pending(&self) -> usize {
        self.tx_bytes
    }

    fn held_buffers(&self) -> usize {
        self.tx_bufs + self.done.len()
    }

    fn set_writes_allowed(&mut self, allowed: bool) {
        self.writes_allowed = allowed;
    }

    fn close(&mut self, _reg: &mut Registry) -> usize {
        let _ = self.qp.shut();
        self.failed.get_or_insert("closed".into());
        self.stage.clear();
        let mut frames = 0;
        for op in self.tx.drain(..) {
            frames += usize::from(op.is_frame());
            if let Payload::Buf(b) = op.payload {
                self.done.push(b);
            }
        }
        self.tx_bytes = 0;
        self.tx_bufs = 0;
        frames
    }

    fn prepare_sleep(&mut self) -> bool {
        if !self.wcs.is_empty() || self.failed.is_some() {
            return false;
        }
        self.stats.arm += 1;
        if let Err(e) = self.cq.arm() {
            self.fail(format!("ibv_req_notify_cq: {e}"));
            return false;
        }
        // A completion that arrived before the arming raises no event: look once more.
        let before = self.stage.outstanding();
        if self.reap().is_err() {
            return false;
        }
        self.wcs.is_empty() && (self.tx.is_empty() || self.stage.outstanding() == before)
    }

    fn wake(&mut self) {
        match self.cq.take_events() {
            Ok(n) => self.stats.events += u64::from(n),
            Err(e) => {
                self.fail(format!("ibv_get_cq_event: {e}"));
            }
        }
    }

    fn withdraw(&mut self) {}

    fn input_pending(&mut self) -> bool {
        !self.wcs.is_empty() || (self.reap().is_ok() && !self.wcs.is_empty())
    }
}

/// The host's side of the set-up, on its data channel's connection once the HelloReply was
/// read (`unread`: bytes read after it): sends its endpoint, reads the IOC's, connects, and
/// confirms. `pools` is the arena the host lays its receive pools out in.
pub async fn offer(
    sock: Stream,
    unread: Vec<u8>,
    pools: SharedRegion,
    max_arena: u64,
    timeout: Duration,
) -> Result<VerbsTransport, FabricError> {
    let (mut s, ip) = tokio_tcp(sock)?;
    let work = async {
        let prepared = Prepared::new(ip, pools).map_err(verbs_err)?;
        s.write_all(&prepared.endpoint().emit()).await?;
        let peer = read_endpoint(&mut s, unread, max_arena).await?;
        let t = prepared.connect(&peer, DomainId(0)).map_err(verbs_err)?;
        s.write_all(&[READY]).await?;
        Ok::<_, FabricError>(t)
    };
    let timeout = timeout.max(SETUP_MIN);
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FabricError::Timeout(timeout))?
}

/// The IOC's side of the set-up, after it sent the HelloReply: reads the host's endpoint,
/// connects, answers with its own (`pools`: the arena it laid this host's pools out in), and
/// waits for the host's confirmation.
pub async fn accept(
    sock: Stream,
    unread: Vec<u8>,
    domain: DomainId,
    pools: SharedRegion,
    max_arena: u64,
    timeout: Duration,
) -> Result<VerbsTransport, FabricError> {
    let (mut s, ip) = tokio_tcp(sock)?;
    let work = async {
        let peer = read_endpoint(&mut s, unread, max_arena).await?;
        let prepared = Prepared::new(ip, pools).map_err(verbs_err)?;
        let mine = prepared.endpoint();
        let t = prepared.connect(&peer, domain).map_err(verbs_err)?;
        s.write_all(&mine.emit()).await?;
        let mut ready = [0u8; 1];
        s.read_exact(&mut ready).await?;
        if ready[0] != READY {
            return Err(FabricError::Verbs(format!(
                "the host confirmed with {:#04x}, not {READY:#04x}",
                ready[0]
            )));
        }
        Ok(t)
    };
    let timeout = timeout.max(SETUP_MIN);
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FabricError::Timeout(timeout))?
}

/// Checks that this machine can carry a data channel over verbs from `ip`: an RDMA device
/// holds it in its GID table. The error says what is missing.
pub fn check_address(ip: IpAddr) -> Result<String, FabricError> {
    let p = sys::port_for(ip).map_err(verbs_err)?;
    Ok(format!(
        "{} port {} GID {}",
        p.ctx.name(),
        p.port,
        sys::gid_display(&p.gid)
    ))
}

fn verbs_err(e: io::Error) -> FabricError {
    FabricError::Verbs(e.to_string())
}

/// The set-up connection as a tokio socket, with its local address.
fn tokio_tcp(sock: Stream) -> Result<(tokio::net::TcpStream, IpAddr), FabricError> {
    let Stream::Tcp(s) = sock else {
        return Err(FabricError::Verbs(
            "RDMA set-up needs a TCP connection".into(),
        ));
    };
    let ip = s.local_addr()?.ip();
    Ok((tokio::net::TcpStream::from_std(s)?, ip))
}

/// Reads the peer's endpoint: `unread` first, then the socket.
async fn read_endpoint(
    s: &mut tokio::net::TcpStream,
    unread: Vec<u8>,
    max_arena: u64,
) -> Result<Endpoint, FabricError> {
    if unread.len() > ENDPOINT_LEN {
        return Err(FabricError::Verbs(format!(
            "{} bytes after the handshake, not an RDMA set-up",
            unread.len()
        )));
    }
    let mut b = [0u8; ENDPOINT_LEN];
    b[..unread.len()].copy_from_slice(&unread);
    s.read_exact(&mut b[unread.len()..]).await?;
    Endpoint::parse(&b, max_arena).map_err(|e| FabricError::Verbs(e.to_string()))
}
