//! The verbs calls the transport makes on a device's objects (protection domains, memory
//! regions, completion queues, queue pairs): with `device` (finding and opening the device),
//! all of the transport's `unsafe`.
//!
//! libibverbs is reached through `rdma-mummy-sys`, which loads it with `dlopen` on first use,
//! so the daemons start (and run TCP and shared memory) on a machine without rdma-core. The
//! safe wrappers are written here over that sys crate rather than taken from `sideway`, the
//! maintained safe crate over it: `sideway` cannot arm a completion queue or read a completion
//! channel (`ibv_req_notify_cq`, `ibv_get_cq_event`), which an event loop needs, and its
//! destructors panic when a destroy call fails.
//!
//! Each object owns what it was made from ([`Arc`]s to its device and protection domain), so
//! they are destroyed in the order verbs requires whatever order their owners drop them in.
//! A memory region owns its memory, so the adapter never writes memory that was freed.

use super::cm::CmId;
use super::device::Context;
use rdma_mummy_sys as ffi;
use splitnet_messaging::memory::SharedRegion;
use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// `errno` of the last failed call, as an error.
pub(super) fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// A return code of a verbs call that reports errors as a positive `errno`.
fn check(rc: i32) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        e if e > 0 => Err(io::Error::from_raw_os_error(e)),
        e if e > i32::MIN => Err(io::Error::from_raw_os_error(-e)),
        _ => Err(last_error()),
    }
}

/// A protection domain: the queue pair and memory regions of one peer's session.
#[derive(Debug)]
pub struct Pd {
    pd: NonNull<ffi::ibv_pd>,
    _ctx: Arc<Context>,
}

// SAFETY: as for Context.
unsafe impl Send for Pd {}
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: everything made in this domain holds an Arc to it, so nothing is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

impl Pd {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> io::Result<Arc<Pd>> {
        // SAFETY: the context is open.
        let pd =
            NonNull::new(unsafe { ffi::ibv_alloc_pd(ctx.ctx.as_ptr()) }).ok_or_else(last_error)?;
        Ok(Arc::new(Pd {
            pd,
            _ctx: ctx.clone(),
        }))
    }
}

/// The memory behind a region: owned by it, so it outlives the registration.
enum MrMem {
    /// Private memory this side copies into (send staging) or the adapter fills (receives).
    Heap(Box<[u8]>),
    /// A pool arena the peer's writes land in (held, never read here).
    Shared(#[allow(dead_code)] SharedRegion),
}

/// A registered memory region.
pub struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    mem: MrMem,
    _pd: Arc<Pd>,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("len", &self.len())
            .field("rkey", &self.rkey())
            .finish()
    }
}

// SAFETY: the region is only read through its keys and the memory it owns.
unsafe impl Send for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: `mr` came from ibv_reg_mr; its memory is still owned (dropped after this).
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// Access rights of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Local use only: a send buffer.
    Local,
    /// The adapter writes it on receipt: posted receives (local write).
    LocalWrite,
    /// The peer writes it with RDMA WRITE: a pool arena (remote write, no remote read).
    RemoteWrite,
    /// The peer writes it only through a memory window bound to it ([`Mw`]): an element of
    /// a pool arena, granted through a window (local write, window binding).
    Windowed,
}

impl Mr {
    /// Registers `len` bytes of zeroed private memory.
    pub fn heap(pd: &Arc<Pd>, len: usize, access: Access) -> io::Result<Mr> {
        let mut mem = vec![0u8; len].into_boxed_slice();
        let ptr = mem.as_mut_ptr();
        // SAFETY: `mem` is `len` bytes that the region owns from now on (a Box's heap memory
        // does not move when the Box does).
        unsafe { Mr::register(pd, ptr, len, access, MrMem::Heap(mem)) }
    }

    /// Registers `len` bytes at `off` of a pool arena for the peer's RDMA writes: a pool,
    /// written through its key (`Access::RemoteWrite`), or an element, written only through
    /// a window bound to it (`Access::Windowed`). Refused (nothing registered) if the range
    /// leaves the arena.
    pub fn shared(
        pd: &Arc<Pd>,
        region: SharedRegion,
        off: u64,
        len: u64,
        access: Access,
    ) -> io::Result<Mr> {
        let words = region.words();
        let size = words.len() as u64 * 4;
        if len == 0 || off.checked_add(len).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "pool outside its arena",
            ));
        }
        // SAFETY: `off` is inside the mapping (checked above).
        let ptr = unsafe { (words.as_ptr() as *mut u8).add(off as usize) };
        // SAFETY: the arena's mapping stays while the region holds the Arc, and the range lies
        // in it; it is only ever accessed through atomics on this side, so the adapter's
        // writes race with nothing Rust considers plain memory.
        unsafe { Mr::register(pd, ptr, len as usize, access, MrMem::Shared(region)) }
    }

    /// # Safety
    /// `ptr..ptr + len` must stay valid as long as `mem` lives.
    unsafe fn register(
        pd: &Arc<Pd>,
        ptr: *mut u8,
        len: usize,
        access: Access,
        mem: MrMem,
    ) -> io::Result<Mr> {
        let flags = match access {
            Access::Local => 0,
            Access::LocalWrite => ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
            Access::RemoteWrite => {
                ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                    | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            }
            Access::Windowed => {
                ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                    | ffi::ibv_access_flags::IBV_ACCESS_MW_BIND.0
            }
        };
        // SAFETY: the caller guarantees the memory; the domain is alive.
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd.as_ptr(), ptr.cast(), len, flags as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| {
            let e = last_error();
            let hint = match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EPERM) => {
                    " (pinned memory is limited by RLIMIT_MEMLOCK: LimitMEMLOCK= in the unit, ulimit -l, or CAP_IPC_LOCK)"
                }
                _ => "",
            };
            io::Error::new(e.kind(), format!("cannot register {len} bytes with the adapter: {e}{hint}"))
        })?;
        Ok(Mr {
            mr,
            mem,
            _pd: pd.clone(),
        })
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration.
        unsafe { self.mr.as_ref().lkey }
    }

    /// Remote key: what the peer names this region by.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref().rkey }
    }

    /// Address of the first byte (the peer's remote address for it).
    pub fn addr(&self) -> u64 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref().addr as u64 }
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        // SAFETY: as above.
        unsafe { self.mr.as_ref().length }
    }

    /// The private bytes (empty for a pool arena).
    pub fn bytes(&self) -> &[u8] {
        match &self.mem {
            MrMem::Heap(m) => m,
            MrMem::Shared(_) => &[],
        }
    }

    /// The private bytes, writable (empty for a pool arena). Only while the adapter does
    /// not use them: a send staging range not in flight, a receive buffer not posted.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            MrMem::Heap(m) => m,
            MrMem::Shared(_) => &mut [],
        }
    }
}

/// A type 1 memory window: bound through the queue pair ([`Qp::bind_mw`]) to a range of
/// a region registered `Access::Windowed`, which the peer may then write through the
/// window's key only; each bind gives it a new key, and a bind of no bytes closes it.
/// Allocated once, bound many times; deallocated (which unbinds it) when dropped.
///
/// Type 1 rather than type 2: invalidating a type 2 window takes a LOCAL_INV work
/// request, which Soft-RoCE makes wait for every earlier work request of the queue pair to
/// complete, and there a completion racing the wait can stall the send queue for good.
pub struct Mw {
    mw: NonNull<ffi::ibv_mw>,
    _pd: Arc<Pd>,
}

// SAFETY: as for Mr.
unsafe impl Send for Mw {}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &self.rkey()).finish()
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: `mw` came from ibv_alloc_mw and is deallocated once.
        unsafe { ffi::ibv_dealloc_mw(self.mw.as_ptr()) };
    }
}

impl Mw {
    /// Allocates an unbound type 1 window in `pd`.
    pub fn new(pd: &Arc<Pd>) -> io::Result<Mw> {
        // SAFETY: the domain is alive; a device without windows returns null (EOPNOTSUPP).
        let mw = unsafe { ffi::ibv_alloc_mw(pd.pd.as_ptr(), ffi::ibv_mw_type::IBV_MW_TYPE_1) };
        let mw = NonNull::new(mw).ok_or_else(|| {
            let e = last_error();
            io::Error::new(e.kind(), format!("cannot allocate a memory window: {e}"))
        })?;
        Ok(Mw {
            mw,
            _pd: pd.clone(),
        })
    }

    /// Its key now: each bind gives it a new one.
    pub fn rkey(&self) -> u32 {
        // SAFETY: live window.
        unsafe { self.mw.as_ref().rkey }
    }
}

/// A work completion, copied out of the completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// `enum ibv_wc_status`: 0 is success.
    pub status: u32,
    /// `enum ibv_wc_opcode`.
    pub opcode: u32,
    /// Bytes received (receives only).
    pub byte_len: u32,
    /// Immediate data in host order, when the completion carries some.
    pub imm: Option<u32>,
}

/// `IBV_WC_RECV`: a SEND arrived.
pub const WC_RECV: u32 = ffi::ibv_wc_opcode::IBV_WC_RECV;
/// Status of a work request flushed: the queue pair went to the error state before it ran.
pub const WC_WR_FLUSH_ERR: u32 = ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
/// `IBV_WC_RECV_RDMA_WITH_IMM`: an RDMA WRITE WITH IMMEDIATE arrived.
pub const WC_RECV_RDMA_WITH_IMM: u32 = ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;

/// What a failed completion's status means.
pub fn status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    unsafe { CStr::from_ptr(ffi::ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}

/// A completion queue with its own completion channel: a descriptor that becomes readable
/// when the queue, armed, gets a completion.
#[derive(Debug)]
pub struct Cq {
    cq: NonNull<ffi::ibv_cq>,
    channel: NonNull<ffi::ibv_comp_channel>,
    /// Events read from the channel and not yet acknowledged.
    unacked: u32,
    _ctx: Arc<Context>,
}

// SAFETY: as for Context.
unsafe impl Send for Cq {}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the queue pair using this queue holds no reference to it but is dropped
        // first by its owner (field order); every event read is acknowledged before the
        // queue is destroyed, as verbs requires.
        unsafe {
            ffi::ibv_ack_cq_events(self.cq.as_ptr(), self.unacked);
            ffi::ibv_destroy_cq(self.cq.as_ptr());
            ffi::ibv_destroy_comp_channel(self.channel.as_ptr());
        }
    }
}

/// Completions read per `ibv_poll_cq`.
const POLL_BATCH: usize = 32;

impl Cq {
    /// A completion queue of `depth` entries on `ctx`, with a non-blocking channel.
    pub fn new(ctx: &Arc<Context>, depth: u32) -> io::Result<Cq> {
        // SAFETY: the context is open.
        let channel = NonNull::new(unsafe { ffi::ibv_create_comp_channel(ctx.ctx.as_ptr()) })
            .ok_or_else(last_error)?;
        // SAFETY: `channel` is live; its descriptor is ours.
        let fd: RawFd = unsafe { channel.as_ref().fd };
        // SAFETY: fcntl on a descriptor we own.
        let nonblock = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        let fail = |e: io::Error| {
            // SAFETY: nothing uses the channel (no queue was made on it).
            unsafe { ffi::ibv_destroy_comp_channel(channel.as_ptr()) };
            e
        };
        if !nonblock {
            return Err(fail(last_error()));
        }
        let cqe = i32::try_from(depth).unwrap_or(i32::MAX);
        // SAFETY: as above.
        let cq = unsafe {
            ffi::ibv_create_cq(ctx.ctx.as_ptr(), cqe, ptr::null_mut(), channel.as_ptr(), 0)
        };
        let cq = NonNull::new(cq).ok_or_else(|| fail(last_error()))?;
        Ok(Cq {
            cq,
            channel,
            unacked: 0,
            _ctx: ctx.clone(),
        })
    }

    /// The channel's descriptor: readable once an armed queue got a completion.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel and its descriptor live as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.channel.as_ref().fd) }
    }

    /// Appends the completions waiting (at most `POLL_BATCH`) to `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<Wc>) -> io::Result<usize> {
        let mut wcs = [MaybeUninit::<ffi::ibv_wc>::zeroed(); POLL_BATCH];
        // SAFETY: `wcs` has room for POLL_BATCH completions.
        let n = unsafe {
            ffi::ibv_poll_cq(self.cq.as_ptr(), POLL_BATCH as i32, wcs.as_mut_ptr().cast())
        };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({n})")));
        }
        for wc in &wcs[..n as usize] {
            // SAFETY: the first `n` entries were written.
            let wc = unsafe { wc.assume_init_ref() };
            let with_imm = wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            out.push(Wc {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate data
                // (big-endian on the wire and here).
                imm: with_imm
                    .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
            });
        }
        Ok(n as usize)
    }

    /// Asks for an event on the channel at the next completion.
    pub fn arm(&mut self) -> io::Result<()> {
        // SAFETY: the queue is live.
        check(unsafe { ffi::ibv_req_notify_cq(self.cq.as_ptr(), 0) })
    }

    /// Reads the events the channel holds (none: `Ok(0)`).
    pub fn take_events(&mut self) -> io::Result<u32> {
        let mut n = 0;
        loop {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: the channel is live and non-blocking.
            let rc = unsafe { ffi::ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut ctx) };
            if rc != 0 {
                let e = last_error();
                if e.kind() != io::ErrorKind::WouldBlock {
                    return Err(e);
                }
                break;
            }
            n += 1;
            self.unacked += 1;
        }
        if self.unacked >= 64 {
            // SAFETY: these events were read from this queue's channel.
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_ptr(), self.unacked) };
            self.unacked = 0;
        }
        Ok(n)
    }
}

/// One entry of a batch of sends: `len` bytes at `off` of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Id the completion carries.
    pub wr_id: u64,
    /// What to do.
    pub kind: SendKind,
    /// Offset of the payload in the source region.
    pub off: usize,
    /// Payload bytes.
    pub len: u32,
    /// Ask for a completion.
    pub signaled: bool,
}

/// The operation of a [`SendWr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendKind {
    /// SEND.
    Send,
    /// SEND WITH IMMEDIATE.
    SendImm(u32),
    /// RDMA WRITE to `addr` of the peer's region `rkey`.
    Write {
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE WITH IMMEDIATE.
    WriteImm {
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data (host order).
        imm: u32,
    },
}

/// A reliable-connected queue pair, made on a connection manager identifier, which
/// connects it.
pub struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    id: Arc<CmId>,
    wrs: Vec<ffi::ibv_send_wr>,
    sges: Vec<ffi::ibv_sge>,
    _pd: Arc<Pd>,
}

// SAFETY: as for Context.
unsafe impl Send for Qp {}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp").field("qpn", &self.qpn()).finish()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: the queue pair is the identifier's; its completion queue outlives it
        // (field order of its owner), and so does the identifier (held here).
        unsafe { ffi::rdma_destroy_qp(self.id.raw()) };
    }
}

impl Qp {
    /// An RC queue pair on `id`'s device, in `pd`, both queues completing on `cq`, in INIT
    /// (remote write access to this side's regions, whose own rights still apply); `id`
    /// connects it.
    pub fn new(
        id: &Arc<CmId>,
        pd: &Arc<Pd>,
        cq: &Cq,
        send_depth: u32,
        recv_depth: u32,
    ) -> io::Result<Qp> {
        // SAFETY: zero is a valid ibv_qp_init_attr (null pointers, zero counts).
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.cq.as_ptr();
        init.recv_cq = cq.cq.as_ptr();
        init.cap.max_send_wr = send_depth;
        init.cap.max_recv_wr = recv_depth;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        // SAFETY: the identifier, domain and queue are live, on one device; `init` is
        // initialised.
        if unsafe { ffi::rdma_create_qp(id.raw(), pd.pd.as_ptr(), &mut init) } != 0 {
            return Err(last_error());
        }
        // SAFETY: a successful call left the queue pair on the identifier.
        let qp = NonNull::new(unsafe { (*id.raw()).qp }).ok_or_else(last_error)?;
        Ok(Qp {
            qp,
            id: id.clone(),
            wrs: Vec::new(),
            sges: Vec::new(),
            _pd: pd.clone(),
        })
    }

    fn modify(&mut self, a: &mut ffi::ibv_qp_attr, mask: u32) -> io::Result<()> {
        // SAFETY: the queue pair is live; `a` is initialised.
        check(unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), a, mask as i32) })
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: live queue pair.
        unsafe { self.qp.as_ref().qp_num }
    }

    /// Once connected: the shortest wait a peer's send makes when this side has no
    /// receive posted (0.01 ms, where the connection manager leaves 655 ms), so
    /// back-pressure costs little time.
    pub fn set_min_rnr_timer(&mut self) -> io::Result<()> {
        // SAFETY: zero is a valid ibv_qp_attr.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.min_rnr_timer = 1;
        use ffi::ibv_qp_attr_mask as m;
        self.modify(&mut a, m::IBV_QP_STATE.0 | m::IBV_QP_MIN_RNR_TIMER.0)
    }

    /// Moves the queue pair to the error state: everything posted completes with a flush
    /// error, and nothing more is sent or received.
    pub fn shut(&mut self) -> io::Result<()> {
        // SAFETY: zero is a valid ibv_qp_attr.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0)
    }

    /// Posts `batch` with one `ibv_post_send` (one doorbell), each payload from `src`.
    /// Refused (nothing posted) if a payload lies outside `src`.
    pub fn post_send(&mut self, src: &Mr, batch: &[SendWr]) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.wrs.clear();
        self.sges.clear();
        for w in batch {
            let end = w.off.checked_add(w.len as usize);
            if end.is_none_or(|e| e > src.len()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "send outside its staging region",
                ));
            }
            self.sges.push(ffi::ibv_sge {
                addr: src.addr() + w.off as u64,
                length: w.len,
                lkey: src.lkey(),
            });
            // SAFETY: zero is a valid ibv_send_wr (null links, no flags).
            let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = w.wr_id;
            wr.num_sge = i32::from(w.len > 0);
            if w.signaled {
                wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            use ffi::ibv_wr_opcode as op;
            match w.kind {
                SendKind::Send => wr.opcode = op::IBV_WR_SEND,
                SendKind::SendImm(imm) => {
                    wr.opcode = op::IBV_WR_SEND_WITH_IMM;
                    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
                SendKind::Write { addr, rkey } => {
                    wr.opcode = op::IBV_WR_RDMA_WRITE;
                    wr.wr.rdma = ffi::rdma_t {
                        remote_addr: addr,
                        rkey,
                    };
                }
                SendKind::WriteImm { addr, rkey, imm } => {
                    wr.opcode = op::IBV_WR_RDMA_WRITE_WITH_IMM;
                    wr.wr.rdma = ffi::rdma_t {
                        remote_addr: addr,
                        rkey,
                    };
                    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
            }
            self.wrs.push(wr);
        }
        // Link the list now that neither vector moves any more, through one pointer to each.
        let n = self.wrs.len();
        let (wrs, sges) = (self.wrs.as_mut_ptr(), self.sges.as_mut_ptr());
        for i in 0..n {
            // SAFETY: `i` (and `i + 1` where used) are below both vectors' lengths.
            unsafe {
                (*wrs.add(i)).sg_list = sges.add(i);
                (*wrs.add(i)).next = if i + 1 < n {
                    wrs.add(i + 1)
                } else {
                    ptr::null_mut()
                };
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the list is well formed; every payload lies in `src`, a live registration
        // whose memory the caller does not touch until the completion.
        check(unsafe { ffi::ibv_post_send(self.qp.as_ptr(), wrs, &mut bad) })
    }

    /// Binds `mw` to bytes `off..off + len` of `mr` (registered `Access::Windowed`) for the
    /// peer's remote writes, or closes it (`len` 0), with one work request (id `wr_id`,
    /// asking for a completion if `signaled`); returns the window's new key. Refused
    /// (nothing posted) if the range leaves the region.
    pub fn bind_mw(
        &mut self,
        mw: &mut Mw,
        mr: &Mr,
        off: u64,
        len: u64,
        wr_id: u64,
        signaled: bool,
    ) -> io::Result<u32> {
        if off.checked_add(len).is_none_or(|end| end > mr.len() as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "window outside its region",
            ));
        }
        let access = match len {
            0 => 0,
            _ => ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
        };
        let mut bind = ffi::ibv_mw_bind {
            wr_id,
            send_flags: if signaled {
                ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            },
            bind_info: ffi::ibv_mw_bind_info {
                mr: mr.mr.as_ptr(),
                addr: mr.addr() + off,
                length: len,
                mw_access_flags: access,
            },
        };
        // SAFETY: the queue pair, window and region are live and in one protection domain;
        // the region outlives the binding (its owner unbinds first).
        check(unsafe { ffi::ibv_bind_mw(self.qp.as_ptr(), mw.mw.as_ptr(), &mut bind) })?;
        Ok(mw.rkey())
    }

    /// Posts receives, one per `(wr_id, off)`, each of `len` bytes of `dst`, with one call.
    pub fn post_recv(&mut self, dst: &Mr, slots: &[(u64, usize)], len: u32) -> io::Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let mut sges = Vec::with_capacity(slots.len());
        for &(_, off) in slots {
            if off.checked_add(len as usize).is_none_or(|e| e > dst.len()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "receive outside its region",
                ));
            }
            sges.push(ffi::ibv_sge {
                addr: dst.addr() + off as u64,
                length: len,
                lkey: dst.lkey(),
            });
        }
        let mut wrs: Vec<ffi::ibv_recv_wr> = slots
            .iter()
            .map(|&(wr_id, _)| ffi::ibv_recv_wr {
                wr_id,
                next: ptr::null_mut(),
                sg_list: ptr::null_mut(),
                num_sge: 1,
            })
            .collect();
        let n = wrs.len();
        let (w, g) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for i in 0..n {
            // SAFETY: as in post_send.
            unsafe {
                (*w.add(i)).sg_list = g.add(i);
                (*w.add(i)).next = if i + 1 < n {
                    w.add(i + 1)
                } else {
                    ptr::null_mut()
                };
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the list is well formed and every buffer lies in `dst`, which the caller
        // does not touch until the completion.
        check(unsafe { ffi::ibv_post_recv(self.qp.as_ptr(), w, &mut bad) })
    }
}

/// The address of a pool arena's first byte (what the peer adds a pool's offset to).
pub fn region_addr(region: &SharedRegion) -> u64 {
    region.words().as_ptr() as u64
}

/// One descriptor readable while any of several is (an epoll instance, level-triggered,
/// never waited on itself): a queue pair's completion channel and its connection manager
/// channel, as the one readiness a channel has.
#[derive(Debug)]
pub struct Bell {
    fd: OwnedFd,
}

impl Bell {
    /// A bell for `fds`.
    pub fn new(fds: &[BorrowedFd<'_>]) -> io::Result<Bell> {
        // SAFETY: plain call; the descriptor is ours on success.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(last_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        for f in fds {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 0,
            };
            // SAFETY: both descriptors are live; `ev` is initialised.
            let rc = unsafe {
                libc::epoll_ctl(
                    raw,
                    libc::EPOLL_CTL_ADD,
                    std::os::fd::AsRawFd::as_raw_fd(f),
                    &mut ev,
                )
            };
            if rc != 0 {
                return Err(last_error());
            }
        }
        Ok(Bell { fd })
    }

    /// Its descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
