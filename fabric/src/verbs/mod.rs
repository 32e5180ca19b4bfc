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
//! The device is the one the connection manager resolves the address to, so none is
//! configured. librdmacm and libibverbs are loaded when first needed: without rdma-core
//! only an `rdma:` address fails, with an error that names what is missing.

#[allow(unsafe_code)]
mod cm;
#[allow(unsafe_code)]
mod device;
mod endpoint;
mod listener;
mod setup;
mod stage;
#[allow(unsafe_code)]
mod sys;

pub use endpoint::{
    Endpoint, EndpointError, KeyNotice, Request, Token, ENDPOINT_LEN, KEY_NOTICE_LEN, REQUEST_LEN,
};
pub use listener::listen;
pub use setup::{accept, offer};

use cm::CmId;
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
use sys::{Bell, Cq, Mr, Pd, Qp, SendKind, SendWr, Wc};

/// Channel number a data channel's Hello names to travel over an RDMA queue pair.
pub const VERBS_CHANNEL: u8 = 4;
/// Channel number a control channel's Hello names to travel over an RDMA queue pair.
pub const VERBS_CONTROL_CHANNEL: u8 = 5;
/// Immediate data of a SEND that carries the operation header of the RDMA WRITE before it.
pub const NOTICE: u32 = 0x4e4f_5443;
/// Immediate data of a SEND that gives the key of one of the sender's pools ([`KeyNotice`]).
pub const KEYS: u32 = 0x4b45_5953;
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

/// One of this side's pools registered for the peer's writes.
struct PoolKey {
    handle: Handle,
    /// Its registration: dropped, it is deregistered.
    _mr: Mr,
}

/// A channel over an RC queue pair. Fields drop in order: the queue pair before the
/// completion queue and the memory regions it uses, all before their protection domain.
pub struct VerbsTransport {
    qp: Qp,
    cq: Cq,
    /// The connection manager's identifier: its channel says when the peer disconnects.
    id: Arc<CmId>,
    /// Readable on a completion (armed) or a connection manager event.
    bell: Bell,
    stage_mr: Mr,
    recv_mr: Mr,
    /// This side's pools, each registered for the peer's writes on its own (its key told
    /// the peer in a key notice), and the registry's layout they mirror.
    keys: Vec<PoolKey>,
    layout: Option<u64>,
    /// The registry's layout count, for [`Channel::prepare_sleep`] (no registry there).
    watch: Option<LayoutWatch>,
    /// Key notices to send.
    key_tx: VecDeque<[u8; KEY_NOTICE_LEN]>,
    /// The peer's pools: arena offset, length, key.
    peer_keys: Vec<(u64, u64, u32)>,
    /// This side's pool arena (none on a control channel, which carries no writes).
    pools: Option<SharedRegion>,
    pd: Arc<Pd>,
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

    /// The peer's pool arena's length, and the remote key of its pool at arena offset
    /// `off`, once its key notice came.
    pub fn peer_key(&self, off: u64) -> (u64, Option<u32>) {
        let key = self
            .peer_keys
            .iter()
            .find(|k| k.0 <= off && off < k.0 + k.1);
        (self.peer.arena_len, key.map(|k| k.2))
    }

    /// Registers this side's pools that the registry added since the last look (each on its
    /// own, with a key notice for the peer) and deregisters those it freed: a write that
    /// arrives for a freed pool, with its old key, fails in the adapter.
    fn sync_keys(&mut self, reg: &Registry) -> Result<(), ChannelError> {
        // A control channel takes no writes: none of its pools is registered here.
        let Some(pools) = self.pools.clone() else {
            return Ok(());
        };
        self.watch.get_or_insert_with(|| reg.layout_watch());
        if self.layout == Some(reg.layout()) {
            return Ok(());
        }
        self.layout = Some(reg.layout());
        let now = reg.arena_regions(self.domain);
        self.keys
            .retain(|k| now.iter().any(|(h, ..)| *h == k.handle));
        for (handle, off, len) in now {
            if self.keys.iter().any(|k| k.handle == handle) {
                continue;
            }
            let mr = match Mr::shared(&self.pd, pools.clone(), off, len) {
                Ok(mr) => mr,
                Err(e) => return Err(self.fail(format!("cannot register a pool: {e}"))),
            };
            let rkey = mr.rkey();
            self.key_tx.push_back(KeyNotice { off, len, rkey }.emit());
            self.keys.push(PoolKey { handle, _mr: mr });
        }
        Ok(())
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
        let Some(off) = self.stage.take(id, len as usize, 1) else {
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
    /// peer's arena, and the key of the pool it lies in: `Err(false)` while that pool's key
    /// has not come yet, `Err(true)` if it lies outside the arena.
    fn remote(&self, addr: u64, len: usize) -> Result<(u64, u32), bool> {
        let off = splitnet_messaging::memory::arena_offset(addr);
        let end = off.checked_add(len as u64).ok_or(true)?;
        if end > self.peer.arena_len {
            return Err(true);
        }
        let key = self
            .peer_keys
            .iter()
            .find(|k| k.0 <= off && end <= k.0 + k.1);
        key.map(|k| (self.peer.arena_addr + off, k.2)).ok_or(false)
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
                placed(reg, checked, Some(imm)).map(Some)
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
                placed(reg, checked, None).map(Some)
            }
            (sys::WC_RECV, Some(KEYS)) => {
                self.repost.push(slot);
                let bytes = self.recv_mr.bytes().get(slot.1..slot.1 + len as usize);
                let Some(n) = bytes.and_then(|b| KeyNotice::parse(b, self.peer.arena_len)) else {
                    return Err(io_err(format!(
                        "a key notice of {len} bytes that names no pool of the arena"
                    )));
                };
                // A pool registered again where another was replaces it.
                self.peer_keys
                    .retain(|k| k.0 + k.1 <= n.off || n.off + n.len <= k.0);
                self.peer_keys.push((n.off, n.len, n.rkey));
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
        self.tx_bufs += usize::from(matches!(op.payload, Payload::Buf(_)));
        self.tx.push_back(op);
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        self.broken()?;
        self.reap()?;
        self.batch.clear();
        // An operation this side cannot post (the peer's pools or limits are wrong): what
        // was staged before it is posted, then the queue pair is given up.
        let mut refused = None;
        // The keys of this side's new pools go first.
        while let Some(notice) = self.key_tx.front() {
            let id = self.next_wr;
            if self.stage.outstanding() >= SEND_DEPTH as usize {
                break;
            }
            let Some(off) = self.stage.take(id, KEY_NOTICE_LEN, 1) else {
                break;
            };
            self.stage_mr.bytes_mut()[off..off + KEY_NOTICE_LEN].copy_from_slice(notice);
            self.key_tx.pop_front();
            self.next_wr += 1;
            self.unsignalled = 0;
            self.stats.send_tx += 1;
            self.batch.push(SendWr {
                wr_id: SEND_BIT | id,
                kind: SendKind::SendImm(KEYS),
                off,
                len: KEY_NOTICE_LEN as u32,
                signaled: true,
            });
        }
        while let Some(op) = self.tx.front() {
            if !self.key_tx.is_empty() {
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
                        Ok(r) => r,
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
            let Some(off) = self.stage.take(id, staged, wrs) else {
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
            cache.put(b);
        }
    }

    fn pending(&self) -> usize {
        self.tx_bytes + self.key_tx.len() * KEY_NOTICE_LEN
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
        self.wcs.is_empty() && (self.tx.is_empty() || self.stage.outstanding() == before)
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
