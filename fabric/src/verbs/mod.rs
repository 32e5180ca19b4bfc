//! A link's channels over RDMA verbs (rdma-core: InfiniBand, RoCE, iWARP, Soft-RoCE), each on
//! an RC queue pair of its own.
//!
//! A host whose `fabric.ioc` is `rdma:ADDR:PORT` opens each channel's connection over TCP with
//! a Hello naming [`VERBS_CONTROL_CHANNEL`] or [`VERBS_CHANNEL`]. After the HelloReply each
//! side tells the other, on that connection, its pool arena (none on a control channel) and
//! receives ([`Endpoint`]), the IOC with a token; the host then connects a queue pair through
//! the RDMA connection manager to the IOC's address and port, its request carrying the token
//! ([`Request`]), and the IOC's listener ([`listen`]) hands the request to the set-up that
//! sent it. The connection is then closed; everything travels over the queue pair
//! (docs/protocol.md section 10):
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
//! Each side registers its pools on its own and tells the peer their keys ([`KEYS`]), or,
//! where the device has memory windows, binds a window over each element it grants, tells
//! its key ([`WINDOWS`]) and closes it when the write into it is read (seed 004's one-touch
//! grant).
//!
//! The device is the one the connection manager resolves the address to, so none is
//! configured. librdmacm and libibverbs are loaded when first needed: without rdma-core
//! only an `rdma:` address fails, with an error that names what is missing.

#[allow(unsafe_code)]
mod cm;
#[allow(unsafe_code)]
mod device;
mod endpoint;
mod grants;
mod keys;
mod listener;
mod setup;
mod stage;
mod stats;
#[allow(unsafe_code)]
mod sys;
mod windows;

pub use endpoint::{
    Endpoint, EndpointError, KeyNotice, Request, Token, ENDPOINT_LEN, KEY_NOTICE_LEN, REQUEST_LEN,
};
pub use listener::listen;
pub use setup::{accept, offer};
pub use stats::VerbsStats;

use cm::CmId;
use keys::{KeyUse, PeerKeys};
use splitnet_messaging::adapter::{
    Channel, ChannelError, Op, OpHeader, Payload, RxCompletion, RxError, MAX_PREFIX, OP_HEADER_LEN,
};
use splitnet_messaging::memory::{
    DomainId, Handle, LayoutWatch, Placement, ProtectionError, Registry, SendBuf, SendBufCache,
    SharedRegion,
};
use stage::Stage;
use std::collections::VecDeque;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;
use sys::{Bell, Cq, Mr, Mw, Pd, Qp, SendKind, SendWr, Wc};
use windows::Windows;

/// Channel number a data channel's Hello names to travel over an RDMA queue pair.
pub const VERBS_CHANNEL: u8 = 4;
/// Channel number a control channel's Hello names to travel over an RDMA queue pair.
pub const VERBS_CONTROL_CHANNEL: u8 = 5;
/// Immediate data of a SEND that carries the operation header of the RDMA WRITE before it.
pub const NOTICE: u32 = 0x4e4f_5443;
/// Immediate data of a SEND that gives the keys of the sender's pools ([`KeyNotice`]s).
pub const KEYS: u32 = 0x4b45_5953;
/// Immediate data of a SEND that gives the window keys of elements the sender granted
/// ([`KeyNotice`]s, each opening one element for one write).
pub const WINDOWS: u32 = 0x574e_4457;
/// Work requests the send queue holds.
const SEND_DEPTH: u32 = 256;
/// Receives a data channel keeps posted: each RDMA WRITE WITH IMMEDIATE takes one too, so
/// this many writes and messages may be in flight before the sender waits (receiver not
/// ready: it retries, nothing is lost).
const RECV_DEPTH: u32 = 128;
/// Receives a control channel keeps posted (messages only, a few at a time).
const CONTROL_RECV_DEPTH: u32 = 32;
/// Bytes of each posted receive: the largest message (a SendData of a frame no pool element
/// holds, before the peer's pools are known, is up to 65,536 bytes), sealed (a control
/// channel after an authenticated handshake).
const RECV_BUF: u32 = crate::auth::sealed_len(splitnet_messaging::wire::MAX_MESSAGE_LEN) as u32;
/// Bytes of a data channel's send staging ring: room for several of the largest frames.
const STAGE_BYTES: usize = 4 << 20;
/// Bytes of a control channel's: room for several of the largest messages.
const CONTROL_STAGE_BYTES: usize = 256 << 10;
/// Memory a host session's queue pairs register (pin) besides the pool arena: send staging
/// and receives, of its data channel and of its control channel.
pub const PINNED: u64 = (STAGE_BYTES + CONTROL_STAGE_BYTES) as u64
    + (RECV_DEPTH + CONTROL_RECV_DEPTH) as u64 * RECV_BUF as u64;
/// Most elements of one queue pair's pools granted through windows, each a registration
/// and a window of this side's: a peer's pools beyond it get a key each (docs/protocol.md
/// section 10).
const MAX_WINDOWED_ELEMENTS: usize = 4096;
/// At most this many unsignalled work requests in a row.
const SIGNAL_EVERY: u64 = 16;
/// Longest a queue pair waits with sends outstanding and none completing: a peer that takes
/// no SEND (keeps no receive posted; the adapter retries without limit) for this long
/// breaks it, so its session ends instead of holding this side's sends forever.
const SEND_STALL: Duration = Duration::from_secs(10);
/// Receives handled before they are posted again with one call (all before sleeping).
const REPOST_BATCH: usize = 16;
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
    recv_buf: u32,
}

/// One of this side's pools registered for the peer's writes.
struct PoolKey {
    handle: Handle,
    /// Offset in the arena, bytes of each element.
    off: u64,
    element_size: u32,
    /// Granted through element windows (else through the pool's key).
    windowed: bool,
    /// Its registration (with windows, one per element): dropped, deregistered.
    mrs: Vec<Mr>,
}

/// A channel over an RC queue pair. Fields drop in order: the queue pair (its binds
/// name the windows), the memory windows (a region with a window bound to it cannot be
/// deregistered), the completion queue and the memory regions, all before their protection
/// domain.
pub struct VerbsTransport {
    qp: Qp,
    mws: Vec<Mw>,
    cq: Cq,
    /// The connection manager's identifier: its channel says when the peer disconnects.
    id: Arc<CmId>,
    /// Readable on a completion (armed) or a connection manager event.
    bell: Bell,
    stage_mr: Mr,
    recv_mr: Mr,
    /// Where the device has memory windows (a data channel): which granted element each
    /// of this side's windows (`mws`) is bound over.
    windows: Option<Windows>,
    /// This side's pools, each registered on its own, and the registry's layout they
    /// mirror. Without windows the peer writes a pool with its key (told in a key notice).
    keys: Vec<PoolKey>,
    /// Pools freed whose registrations wait for their windows' closes to complete: the id
    /// of the last close, once posted.
    retired: Vec<(Option<u64>, PoolKey)>,
    layout: Option<u64>,
    /// The registry's layout count, for [`Channel::prepare_sleep`] (no registry there).
    watch: Option<LayoutWatch>,
    /// Notices to send: pool keys, and window keys of windows whose binds are posted.
    key_tx: Vec<[u8; KEY_NOTICE_LEN]>,
    window_tx: Vec<[u8; KEY_NOTICE_LEN]>,
    /// The keys the peer told.
    peer_keys: PeerKeys,
    /// While windows are being bound: the id of the last bind or close posted.
    binding: Option<u64>,
    /// Elements of this side's pools registered for windows (at most
    /// [`MAX_WINDOWED_ELEMENTS`]).
    windowed: usize,
    /// Whether pools past [`MAX_WINDOWED_ELEMENTS`] were logged (once per queue pair).
    keyed_said: bool,
    /// This side's pool arena (none on a control channel, which carries no writes).
    pools: Option<SharedRegion>,
    pd: Arc<Pd>,
    peer: Peer,
    domain: DomainId,
    writes_allowed: bool,
    tx: VecDeque<TxOp>,
    tx_bytes: usize,
    /// Capacity of the send buffers held: in `tx` and in `done`.
    held: usize,
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
    /// While sends are outstanding: when one last completed (or the first was posted).
    progress: Option<std::time::Instant>,
    /// See [`SEND_STALL`].
    stall: Duration,
    stats: VerbsStats,
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        tracing::info!(
            qpn = self.qp.qpn(),
            channel = self.kind(),
            windows = self.mws.len(),
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
            .field("ops", &self.tx.len())
            .field("outstanding", &self.stage.outstanding())
            .field("writes_outstanding", &self.stage.writes())
            .field("notices", &(self.key_tx.len(), self.window_tx.len()))
            .field("window_ops", &self.windows.as_ref().map(Windows::pending))
            .field("windows", &self.mws.len())
            .field("peer_keys", &self.peer_keys.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// Work request ids: sends count up from 1 with this bit set; receives are their slot index.
const SEND_BIT: u64 = 1 << 63;

fn io_err(msg: String) -> ChannelError {
    ChannelError::Io(io::Error::other(msg))
}

impl VerbsTransport {
    /// This side's pool arena: the registry lays the session's pools out in it
    /// ([`Registry::attach_arena`]) before the session starts. None on a control channel.
    pub fn pools(&self) -> Option<SharedRegion> {
        self.pools.clone()
    }

    /// What the queue pair did so far (logged when it closes).
    pub fn stats(&self) -> VerbsStats {
        self.stats
    }

    /// What the queue pair carries, for logs: `"data"` or `"control"`.
    pub fn kind(&self) -> &'static str {
        match self.pools {
            Some(_) => "data",
            None => "control",
        }
    }

    /// Changes the protection domain whose writes this channel carries.
    pub fn set_domain(&mut self, domain: DomainId) {
        self.domain = domain;
        // Its pools are another domain's now: look again.
        self.layout = None;
    }

    /// What to wait on: readable once an armed queue got a completion, or the connection
    /// manager has news (the peer disconnected).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.bell.fd()
    }

    /// The peer's pool arena's length, and the remote key of the pool or element window
    /// holding arena offset `off`, once its notice came.
    pub fn peer_key(&self, off: u64) -> (u64, Option<u32>) {
        (self.peer.arena_len, self.peer_keys.get(off))
    }

    /// For tests of a peer's defences: posts an RDMA WRITE WITH IMMEDIATE of `len` zero
    /// bytes to byte `offset` of the peer's pool arena with remote key `rkey` and immediate
    /// data `imm`, past every check this side makes (credits, bounds, the arena's key). A
    /// peer must refuse what its grants do not allow; its adapter refuses what lies outside
    /// its arena or names another key, and then this queue pair breaks (the error comes
    /// from the next [`Channel::poll_recv`] or [`Channel::flush`]).
    pub fn post_unchecked_write(
        &mut self,
        offset: u64,
        len: u32,
        rkey: u32,
        imm: u32,
    ) -> Result<(), ChannelError> {
        self.broken()?;
        let id = self.next_wr;
        if self.stage.outstanding() >= SEND_DEPTH as usize {
            return Err(io_err("send queue full".into()));
        }
        let Some(off) = self.stage.take_write(id, len as usize, 1) else {
            return Err(io_err("no staging room".into()));
        };
        self.stage_mr.bytes_mut()[off..off + len as usize].fill(0);
        self.next_wr += 1;
        let addr = self.peer.arena_addr.wrapping_add(offset);
        let wr = SendWr {
            wr_id: SEND_BIT | id,
            kind: SendKind::WriteImm { addr, rkey, imm },
            off,
            len,
            signaled: true,
        };
        self.stats.post_send += 1;
        self.stats.write_imm_tx += 1;
        self.qp
            .post_send(&self.stage_mr, &[wr])
            .map_err(|e| self.fail(format!("ibv_post_send: {e}")))
    }

    /// Polls the completion queue: send completions give staging back at once; receive
    /// completions wait in `wcs`. A failed completion stops the channel.
    fn reap(&mut self) -> Result<(), ChannelError> {
        let mut sent = false;
        loop {
            self.scratch.clear();
            let n = self.cq.poll(&mut self.scratch)?;
            self.stats.poll_cq += 1;
            self.stats.completions += n as u64;
            for i in 0..self.scratch.len() {
                let wc = self.scratch[i];
                if wc.status != 0 {
                    // A flush is the consequence of an error: report the cause if it came
                    // in this poll.
                    let wc = self.scratch[i..]
                        .iter()
                        .find(|c| c.status != 0 && c.status != sys::WC_WR_FLUSH_ERR)
                        .copied()
                        .unwrap_or(wc);
                    let what = if wc.wr_id & SEND_BIT != 0 {
                        "send"
                    } else {
                        "receive"
                    };
                    return Err(self.fail(format!(
                        "RDMA {what} failed: {} (status {}, opcode {})",
                        sys::status_str(wc.status),
                        wc.status,
                        wc.opcode
                    )));
                }
                if wc.wr_id & SEND_BIT != 0 {
                    self.stage.complete(wc.wr_id & !SEND_BIT);
                    sent = true;
                } else {
                    self.wcs.push_back(wc);
                }
            }
            if n < 32 {
                return self.check_progress(sent);
            }
        }
    }

    /// Notes whether sends made progress (`sent`: one completed); fails once sends have
    /// been outstanding for [`SEND_STALL`] with none completing.
    fn check_progress(&mut self, sent: bool) -> Result<(), ChannelError> {
        if self.stage.outstanding() == 0 {
            self.progress = None;
            return Ok(());
        }
        match self.progress {
            Some(t) if !sent && t.elapsed() > self.stall => Err(self.fail(format!(
                "the peer took no send for {:?} ({} outstanding)",
                self.stall,
                self.stage.outstanding()
            ))),
            Some(_) if !sent => Ok(()),
            _ => {
                self.progress = Some(std::time::Instant::now());
                Ok(())
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

    /// Gives received buffers back to the adapter, in batches of [`REPOST_BATCH`] unless
    /// `all`.
    fn repost(&mut self, all: bool) -> Result<(), ChannelError> {
        if let Some((id, off, _)) = self.last_recv.take() {
            self.repost.push((id, off));
        }
        if self.repost.len() >= if all { 1 } else { REPOST_BATCH } {
            if let Err(e) = self.qp.post_recv(&self.recv_mr, &self.repost, RECV_BUF) {
                return Err(self.fail(format!("ibv_post_recv: {e}")));
            }
            self.stats.post_recv += 1;
            self.repost.clear();
        }
        Ok(())
    }

    /// Where a write to `addr` (the peer's registry address) of `len` bytes lands in the
    /// peer's arena, and the key of the pool or element window it lies in: `Err(false)`
    /// while that key has not come yet, `Err(true)` if it lies outside the arena.
    fn remote(&self, addr: u64, len: usize) -> Result<(u64, KeyUse), bool> {
        let off = splitnet_messaging::memory::arena_offset(addr);
        let end = off.checked_add(len as u64).ok_or(true)?;
        if end > self.peer.arena_len {
            return Err(true);
        }
        let key = self.peer_keys.find(off, end);
        key.map(|k| (self.peer.arena_addr + off, k)).ok_or(false)
    }

    /// Handles one receive completion: a completion for the caller, or `None` for a key
    /// notice (taken here).
    fn on_recv(
        &mut self,
        wc: Wc,
        reg: &mut Registry,
    ) -> Result<Option<RxCompletion>, ChannelError> {
        let slot = (wc.wr_id, (wc.wr_id as usize) * RECV_BUF as usize);
        let len = wc.byte_len;
        match (wc.opcode, wc.imm) {
            (sys::WC_RECV_RDMA_WITH_IMM, Some(imm)) => {
                self.repost.push(slot);
                if !self.writes_allowed {
                    return Err(RxError::WriteNotAllowed.into());
                }
                self.stats.write_imm_rx += 1;
                let checked = reg.begin_write_idata(self.domain, imm, len);
                self.touched(placed(reg, checked, Some(imm))).map(Some)
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
                let checked = reg.begin_write(self.domain, handle, addr, header.len);
                self.touched(placed(reg, checked, None)).map(Some)
            }
            (sys::WC_RECV, Some(imm @ (KEYS | WINDOWS))) => {
                self.repost.push(slot);
                self.on_keys(slot.1, len as usize, imm == WINDOWS)?;
                Ok(None)
            }
            (sys::WC_RECV, None) => {
                self.stats.send_rx += 1;
                self.last_recv = Some((slot.0, slot.1, len as usize));
                Ok(Some(RxCompletion::Recv { len: len as usize }))
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

/// The completion of a write the adapter placed, once the registry checked it (`checked`):
/// nothing to copy; a pool outside the arena (which the adapter cannot have written) is
/// refused.
fn placed(
    reg: &mut Registry,
    checked: Result<Placement, ProtectionError>,
    imm: Option<u32>,
) -> Result<RxCompletion, ChannelError> {
    let p = checked.map_err(RxError::from)?;
    reg.finish_write(&p);
    if !reg.is_shared(p.handle) {
        return Err(RxError::Protection(ProtectionError::NoAccess(p.handle)).into());
    }
    Ok(RxCompletion::Write {
        handle: p.handle,
        element: p.element,
        len: p.len,
        imm,
    })
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
        if let Payload::Buf(b) = &op.payload {
            self.held += b.capacity();
        }
        self.tx.push_back(op);
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        self.broken()?;
        self.reap()?;
        self.batch.clear();
        // An operation this side cannot post (the peer's pools or limits are wrong): what
        // was staged before it is posted, then the queue pair is given up.
        let mut refused = None;
        // Windows bound and closed, and the keys of this side's new pools and windows, go
        // first; while windows are being bound, nothing else.
        if self.post_grants()? {
            return Ok(self.tx.is_empty());
        }
        while let Some(op) = self.tx.front() {
            if !self.grants_told() {
                break;
            }
            let len = op.len();
            // A plain write takes two work requests (the write and its notice).
            let wrs = if matches!(op.op, Op::Write { .. }) {
                2
            } else {
                1
            };
            // The batch's work requests are counted in `outstanding` once staged.
            if self.stage.outstanding() + wrs > SEND_DEPTH as usize {
                break;
            }
            // The key a write uses: a window's is used up once the write is posted.
            let mut key = None;
            let (kind, notice) = match op.op {
                Op::Send => {
                    if len > self.peer.recv_buf as usize {
                        refused = Some(format!(
                            "SEND of {len} bytes exceeds the peer's receive buffers of {}",
                            self.peer.recv_buf
                        ));
                        break;
                    }
                    (SendKind::Send, None)
                }
                Op::WriteImm { addr, .. } | Op::Write { addr, .. } => {
                    let (raddr, rkey) = match self.remote(addr, len) {
                        Ok((raddr, k)) => {
                            key = Some(k);
                            (raddr, k.rkey)
                        }
                        // The pool's key is on its way: wait for it.
                        Err(false) => break,
                        Err(true) => {
                            refused = Some(format!(
                                "RDMA write of {len} bytes at {addr:#x} outside the peer's pool arena"
                            ));
                            break;
                        }
                    };
                    match op.op {
                        Op::WriteImm { imm, .. } => (
                            SendKind::WriteImm {
                                addr: raddr,
                                rkey,
                                imm,
                            },
                            None,
                        ),
                        // A plain write: its header follows in a notice.
                        _ => {
                            let header = OpHeader {
                                op: op.op,
                                len: len as u32,
                            };
                            (SendKind::Write { addr: raddr, rkey }, Some(header.emit()))
                        }
                    }
                }
            };
            let staged = len + notice.map_or(0, |h| h.len());
            let id = self.next_wr;
            let taken = match kind {
                SendKind::Send => self.stage.take(id, staged, wrs),
                _ => self.stage.take_write(id, staged, wrs),
            };
            let Some(off) = taken else {
                break;
            };
            let bytes = &mut self.stage_mr.bytes_mut()[off..off + staged];
            bytes[..op.prefix_len].copy_from_slice(&op.prefix[..op.prefix_len]);
            bytes[op.prefix_len..len].copy_from_slice(payload_bytes(&op.payload));
            if let Some(h) = notice {
                bytes[len..].copy_from_slice(&h);
            }
            let Some(op) = self.tx.pop_front() else { break };
            if let Some(k) = key {
                self.peer_keys.used(k);
            }
            self.tx_bytes -= len;
            if let Payload::Buf(b) = op.payload {
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
                    || self.stage.used() > self.stage.size() / 2);
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
        self.retire_after_post();
        if self.batch.is_empty() {
            return match refused {
                Some(why) => Err(self.fail(why)),
                None => Ok(self.tx.is_empty()),
            };
        }
        // The last of a batch is signalled, also when the batch stopped early (staging full,
        // a key awaited): otherwise nothing might ever complete it and its staging, and the
        // ring would stay full.
        if let Some(last) = self.batch.last_mut() {
            if !last.signaled {
                last.signaled = true;
                self.unsignalled = 0;
            }
        }
        self.stats.post_send += 1;
        let posted = self.qp.post_send(&self.stage_mr, &self.batch);
        if let Err(e) = posted {
            return Err(self.fail(format!("ibv_post_send: {e}")));
        }
        if let Some(why) = refused {
            return Err(self.fail(why));
        }
        Ok(self.tx.is_empty())
    }

    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        self.broken()?;
        self.sync_keys(reg)?;
        self.repost(false)?;
        loop {
            if self.wcs.is_empty() {
                self.reap()?;
            }
            let Some(wc) = self.wcs.pop_front() else {
                return Ok(None);
            };
            match self.on_recv(wc, reg) {
                Ok(Some(c)) => return Ok(Some(c)),
                // A key notice: the transport's own.
                Ok(None) => {}
                Err(e) => {
                    self.failed.get_or_insert(e.to_string());
                    return Err(e);
                }
            }
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
            self.held -= b.capacity();
            cache.put(b);
        }
    }

    fn pending(&self) -> usize {
        self.tx_bytes
            + (self.key_tx.len() + self.window_tx.len()) * KEY_NOTICE_LEN
            + self.windows.as_ref().map_or(0, Windows::pending)
    }

    fn held_bytes(&self) -> usize {
        self.held
    }

    fn set_writes_allowed(&mut self, allowed: bool) {
        self.writes_allowed = allowed;
    }

    fn close(&mut self, _reg: &mut Registry) -> usize {
        // What completed already counts as done (a failed completion ends the look: what
        // it did not reach counts as never completed).
        let _ = self.reap();
        let _ = self.qp.shut();
        self.failed.get_or_insert("closed".into());
        let lost = self.stage.clear() as u64;
        self.stats.write_incomplete += lost;
        if lost > 0 {
            tracing::warn!(
                qpn = self.qp.qpn(),
                channel = self.kind(),
                "RDMA writes never completed: {lost} posted on this queue pair when it was closed (the peer may not have them)"
            );
        }
        let mut frames = 0;
        for op in self.tx.drain(..) {
            frames += usize::from(op.is_frame());
            if let Payload::Buf(b) = op.payload {
                self.done.push(b);
            }
        }
        self.tx_bytes = 0;
        frames
    }

    fn prepare_sleep(&mut self) -> bool {
        if !self.wcs.is_empty() || self.failed.is_some() || self.repost(true).is_err() {
            return false;
        }
        // Pools registered or freed since the last poll (or none seen yet): poll, which
        // registers them and sends their keys, before sleeping.
        let layout = self.watch.as_ref().map(LayoutWatch::get);
        if self.pools.is_some() && (layout.is_none() || layout != self.layout) {
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
        // Something left to post (operations, windows, notices) waits for a completion: one
        // that came just now means looking again.
        let idle = self.tx.is_empty() && self.grants_told();
        self.wcs.is_empty() && (idle || self.stage.outstanding() == before)
    }

    fn wake(&mut self) {
        match self.cq.take_events() {
            Ok(n) => self.stats.events += u64::from(n),
            Err(e) => {
                self.fail(format!("ibv_get_cq_event: {e}"));
            }
        }
        // The connection manager's news too, at every wake-up: the reactor reports the bell
        // once for both descriptors, so a disconnect that came with completions would wait
        // for the next wake-up otherwise.
        match self.id.ended() {
            Ok(None) => {}
            Ok(Some(event)) => {
                self.fail(format!("the peer disconnected ({event})"));
            }
            Err(e) => {
                self.fail(format!("rdma_get_cm_event: {e}"));
            }
        }
    }

    fn withdraw(&mut self) {}

    fn input_pending(&mut self) -> bool {
        !self.wcs.is_empty() || (self.reap().is_ok() && !self.wcs.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No RDMA device holds a loopback address: whatever this machine has (no librdmacm,
    /// no connection manager in the kernel, no device, devices), taking RDMA connections
    /// there fails with one line that names what is missing.
    #[test]
    fn asking_for_rdma_where_it_cannot_be_had_says_what_is_missing() {
        let e = listen("127.0.0.1:4791".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.contains("no RDMA connection manager")
                || e.contains("no RDMA device holds this address"),
            "{e}"
        );
    }
}
