//! A link's channels over shared memory, between daemons on one machine.
//!
//! A host on the IOC's machine opens its control channel on the IOC's local Unix socket
//! with a Hello naming channel [`SHM_CONTROL_CHANNEL`], then its data channel with a Hello
//! naming [`SHM_CHANNEL`]. After each HelloReply, the two sides set up that channel's shared
//! memory over its socket (`SCM_RIGHTS`):
//!
//! 1. The host sends a [`Setup`] with three descriptors: the ring it produces into (host to
//!    IOC), the ring the IOC produces into (IOC to host), both sealed `memfd`s it created and
//!    initialised, and its pool arena (a sealed `memfd` in which it lays out its receive
//!    pools). A control channel's set-up has no pool arena (0 pages, two descriptors) and
//!    smaller rings.
//! 2. The IOC checks the setup against its limits, verifies each `memfd` (sealed against
//!    shrinking and growing, exactly the size the set-up gives), maps it, checks the ring
//!    headers, and answers [`ACK`](splitnet_messaging::adapter::shm::setup::ACK) and the
//!    size of its own pool arena for this host, with that arena (a sealed `memfd` it
//!    created, in which it laid out the pools it advertises to the host); for a control
//!    channel 0 pages and no descriptor. The host checks the size and verifies and maps the
//!    arena as the IOC did its own.
//!
//! Then each operation travels as a ring record ([`ShmChannel`]); each side places its RDMA
//! writes straight into the other's pool elements, so their records are headers only
//! ([`splitnet_messaging::adapter::shm::KIND_PLACED`]). The connection stays the channel's doorbell
//! ([`Doorbell`]): each side sleeps until its end is readable and rings the peer, with a
//! byte, when the peer asked to be woken; its end of stream says that the peer is gone. No
//! descriptor the peer sends is ever read or written, so none can block this side.

//!
//! All of this transport's `unsafe` is in two submodules: [`memfd`] (sealed files, their
//! mappings, descriptor passing) and [`doorbell`]; the ring itself and its checks against a
//! hostile peer are sans-IO, in `splitnet_messaging::adapter::shm`.

#[allow(unsafe_code)]
pub mod doorbell;
#[allow(unsafe_code)]
pub mod memfd;

pub use splitnet_messaging::adapter::shm::setup::{SHM_CHANNEL, SHM_CONTROL_CHANNEL};

use super::{FabricError, Ready};
use doorbell::Doorbell;
use memfd::{recv_fds, send_fds, Mapping, Memfd};
use splitnet_messaging::adapter::shm::setup::{
    Setup, ACK_LEN, MAX_PAYLOAD, RING_DATA, RING_DATA_CONTROL, SETUP_LEN,
};
use splitnet_messaging::adapter::shm::{Consumer, Producer, RingConfig, ShmChannel};
use splitnet_messaging::adapter::{Channel, ChannelError, Op, Payload, RxCompletion};
use splitnet_messaging::memory::{DomainId, Registry, SendBufCache, SharedBytes, SharedRegion};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// A channel over shared-memory rings, with the doorbell its set-up connection became.
#[derive(Debug)]
pub struct ShmTransport {
    ch: ShmChannel<Mapping>,
    /// This side's end of the set-up connection: readable when the peer rang or left.
    bell: Doorbell,
    /// This side rang the peer since [`Channel::take_rang_peer`] last looked.
    rang: bool,
    /// Why the doorbell failed (the peer left): said once the ring is drained.
    failed: Option<io::Error>,
    /// This side's pool arena, shared with the peer that places writes in it.
    pools: Option<Arc<Mapping>>,
}

impl ShmTransport {
    fn new(ch: ShmChannel<Mapping>, sock: UnixStream) -> Self {
        ShmTransport {
            ch,
            bell: Doorbell::new(sock),
            rang: false,
            failed: None,
            pools: None,
        }
    }

    /// This side's pool arena, if the peer places its writes in this side's pools: the
    /// registry must lay the data channel's pools out in it
    /// ([`Registry::attach_arena`]).
    pub fn pools(&self) -> Option<SharedRegion> {
        self.pools.clone().map(|m| m as SharedRegion)
    }

    /// Changes the protection domain whose writes this channel carries.
    pub fn set_domain(&mut self, domain: DomainId) {
        self.ch.set_domain(domain);
    }

    /// This side's doorbell, to wait on: readable when the peer rang, and once it has gone.
    pub fn bell(&self) -> &Doorbell {
        &self.bell
    }

    /// Rings the peer if what this side did is what it waits for.
    fn ring_peer(&mut self) -> Result<(), ChannelError> {
        if self.ch.take_doorbell() {
            self.bell.ring()?;
            self.rang = true;
        }
        Ok(())
    }
}

impl Channel for ShmTransport {
    fn post(&mut self, op: Op, prefix: &[u8], payload: Payload) {
        self.ch.post(op, prefix, payload);
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        let done = self.ch.flush()?;
        self.ring_peer()?;
        Ok(done)
    }

    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        let r = self.ch.poll_recv(reg)?;
        if r.is_none() {
            // Everything the peer published before it left has been read: say that it left.
            if let Some(e) = self.failed.take() {
                // A peer that closes with rings this side had not read resets the
                // connection: that is a close too.
                return Err(match e.kind() {
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                        ChannelError::Closed
                    }
                    _ => ChannelError::Io(e),
                });
            }
            // Drained: what this side consumed may be the room the peer waits for.
            self.ring_peer()?;
        }
        Ok(r)
    }

    fn received(&self) -> &[u8] {
        self.ch.received()
    }

    fn reclaim(&mut self, cache: &mut SendBufCache) {
        self.ch.reclaim(cache);
    }

    fn pending(&self) -> usize {
        self.ch.pending()
    }

    fn held_bytes(&self) -> usize {
        self.ch.held_bytes()
    }

    fn set_writes_allowed(&mut self, allowed: bool) {
        self.ch.set_writes_allowed(allowed);
    }

    fn close(&mut self, reg: &mut Registry) -> usize {
        self.ch.close(reg)
    }

    fn prepare_sleep(&mut self) -> bool {
        self.ch.prepare_sleep()
    }

    fn places_writes(&self) -> bool {
        self.ch.places_writes()
    }

    fn peer_window(&self, addr: u64, len: usize) -> Option<SharedBytes<'_>> {
        self.ch.peer_window(addr, len)
    }

    fn post_placed(&mut self, op: Op, len: u32) {
        self.ch.post_placed(op, len);
    }

    fn input_pending(&mut self) -> bool {
        self.ch.input_pending()
    }

    fn take_rang_peer(&mut self) -> bool {
        std::mem::take(&mut self.rang)
    }

    fn wake(&mut self) {
        self.ch.wake();
        match self.bell.drain() {
            Ok(0) => {}
            Ok(_) => self.ch.rang(),
            Err(e) => self.failed = Some(e),
        }
    }

    fn withdraw(&mut self) {
        self.ch.wake();
    }
}

/// A pool arena: a sealed `memfd` this side creates and maps, whose descriptor goes to the
/// peer that places its writes in it.
#[derive(Debug)]
pub struct PoolArena {
    fd: Memfd,
    map: Arc<Mapping>,
}

impl PoolArena {
    /// An arena of `size` bytes (a whole number of pages).
    pub fn new(name: &std::ffi::CStr, size: u64) -> Result<PoolArena, FabricError> {
        let len = usize::try_from(size).map_err(shm_err)?;
        let fd = Memfd::create(name, len).map_err(shm_err)?;
        let map = Arc::new(fd.map()?);
        Ok(PoolArena { fd, map })
    }

    /// The memory, for the registry that lays this side's pools out in it.
    pub fn region(&self) -> SharedRegion {
        self.map.clone()
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.fd.len() as u64
    }
}

/// A set-up failure, said as what went wrong.
fn shm_err(e: impl std::fmt::Display) -> FabricError {
    FabricError::Shm(e.to_string())
}

fn ring(setup: &Setup) -> Result<RingConfig, FabricError> {
    setup.ring().map_err(shm_err)
}

/// The channel producing into `tx` and consuming `rx`, once both rings' headers check.
fn attach(
    tx: Mapping,
    rx: Mapping,
    cfg: RingConfig,
    domain: DomainId,
    max_send: usize,
) -> Result<ShmChannel<Mapping>, FabricError> {
    Ok(ShmChannel::new(
        Producer::attach(tx, cfg).map_err(shm_err)?,
        Consumer::attach(rx, cfg).map_err(shm_err)?,
        domain,
        max_send,
    ))
}

/// Waits (within `timeout`) for one message with descriptors on `sock`.
async fn recv_setup(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: usize,
    timeout: Duration,
) -> Result<(usize, Vec<std::os::fd::OwnedFd>), FabricError> {
    let ready = Ready::new(sock)?;
    let work = async {
        loop {
            let mut g = ready.readable().await?;
            match recv_fds(sock, buf, fds) {
                Ok((0, _)) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(r) => return Ok(r),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => g.clear_ready(),
                Err(e) => return Err(FabricError::Io(e)),
            }
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FabricError::Timeout(timeout))?
}

/// A new ring of `cfg` in a sealed `memfd`, initialised, and its mapping.
fn new_ring(cfg: RingConfig, name: &std::ffi::CStr) -> Result<(Memfd, Mapping), FabricError> {
    let fd = Memfd::create(name, cfg.region_len()).map_err(shm_err)?;
    let map = fd.map()?;
    cfg.init(&map).map_err(shm_err)?;
    Ok((fd, map))
}

/// Maps a peer's sealed `memfd` of exactly `len` bytes.
fn verify(fd: OwnedFd, len: usize) -> Result<Mapping, FabricError> {
    Ok(Memfd::verify(fd, len).map_err(shm_err)?.map()?)
}

/// The host's side: after the HelloReply on `sock`, sets up the rings and doorbells and,
/// for a data channel, a pool arena for `pool_bytes` of receive pools (`None`: a control
/// channel, no arena, smaller rings); then waits for the IOC's acknowledgement.
pub async fn offer(
    sock: UnixStream,
    domain: DomainId,
    max_send: usize,
    pool_bytes: Option<u64>,
    timeout: Duration,
) -> Result<ShmTransport, FabricError> {
    let setup = Setup {
        data_size: pool_bytes.map_or(RING_DATA_CONTROL, |_| RING_DATA),
        max_payload: MAX_PAYLOAD,
        pool_size: pool_bytes.map_or(0, Setup::pool_size_for),
    };
    let cfg = ring(&setup)?;
    let (tx_fd, tx_map) = new_ring(cfg, c"splitnet-host-to-ioc")?;
    let (rx_fd, rx_map) = new_ring(cfg, c"splitnet-ioc-to-host")?;
    let pools = match pool_bytes {
        Some(_) => Some(PoolArena::new(c"splitnet-host-pools", setup.pool_size)?),
        None => None,
    };
    let mut fds = vec![tx_fd.as_fd(), rx_fd.as_fd()];
    fds.extend(pools.as_ref().map(|p| p.fd.as_fd()));
    if send_fds(&sock, &setup.emit(), &fds)? != SETUP_LEN {
        return Err(FabricError::Shm("the set-up was cut short".into()));
    }
    let mut ack = [0u8; ACK_LEN];
    let (n, fds) = recv_setup(&sock, &mut ack, usize::from(pools.is_some()), timeout).await?;
    let refused = || FabricError::Shm("the IOC refused the shared memory".into());
    let ioc_pools = Setup::parse_ack(&ack[..n]).map_err(|_| refused())?;
    let mut fds = fds.into_iter();
    let ioc_map = match (fds.next(), ioc_pools, &pools) {
        (Some(fd), len @ 1.., Some(_)) => {
            Some(verify(fd, usize::try_from(len).map_err(|_| refused())?)?)
        }
        (None, 0, None) => None,
        _ => return Err(refused()),
    };
    let mut ch = attach(tx_map, rx_map, cfg, domain, max_send)?;
    if let Some(m) = ioc_map {
        ch.set_peer_pools(m);
    }
    let mut t = ShmTransport::new(ch, sock);
    t.pools = pools.map(|p| p.map);
    Ok(t)
}

/// The IOC's side: after the HelloReply on `sock`, takes the host's set-up, checks it, and
/// acknowledges it: for a data channel with `pools`, the arena its pools for this host lie
/// in; for a control channel (`None`) with no arena, and the set-up must offer none. Anything
/// wrong is an error (the caller closes the connection: the host sees its end).
pub async fn accept(
    sock: UnixStream,
    domain: DomainId,
    max_send: usize,
    pools: Option<PoolArena>,
    timeout: Duration,
) -> Result<ShmTransport, FabricError> {
    let want = 2 + usize::from(pools.is_some());
    let mut buf = [0u8; SETUP_LEN];
    let (n, fds) = recv_setup(&sock, &mut buf, want, timeout).await?;
    let setup = Setup::parse(&buf[..n]).map_err(shm_err)?;
    if fds.len() != want {
        return Err(FabricError::Shm(format!(
            "the set-up needs {want} descriptors"
        )));
    }
    if (setup.pool_size > 0) != pools.is_some() {
        return Err(FabricError::Shm(match pools {
            Some(_) => "a data channel's set-up needs a pool arena".into(),
            None => "a control channel's set-up has no pool arena".into(),
        }));
    }
    // The IOC writes frames into the host's arena, and the pages it writes first are
    // charged to the IOC's memory: an arena larger than the IOC's own for the host would let
    // one host grow the IOC beyond its budget for a session.
    if let Some(p) = pools.as_ref().filter(|p| setup.pool_size > p.size()) {
        return Err(FabricError::Shm(format!(
            "the host's pool arena of {} bytes is larger than the IOC's for it ({} bytes: pools.max_granted_bytes)",
            setup.pool_size,
            p.size()
        )));
    }
    if pools.is_none() && setup.data_size != RING_DATA_CONTROL {
        return Err(FabricError::Shm(format!(
            "a control channel's rings are {RING_DATA_CONTROL} bytes, not {}",
            setup.data_size
        )));
    }
    let cfg = ring(&setup)?;
    let mut fds = fds.into_iter();
    let mut next = || {
        fds.next()
            .ok_or_else(|| FabricError::Shm("descriptor missing".into()))
    };
    let (rx_fd, tx_fd) = (next()?, next()?);
    let (rx_map, tx_map) = (
        verify(rx_fd, cfg.region_len())?,
        verify(tx_fd, cfg.region_len())?,
    );
    let host_pools = match &pools {
        Some(_) => Some(verify(
            next()?,
            usize::try_from(setup.pool_size).map_err(shm_err)?,
        )?),
        None => None,
    };
    let mut ch = attach(tx_map, rx_map, cfg, domain, max_send)?;
    if let Some(m) = host_pools {
        ch.set_peer_pools(m);
    }
    let ack = Setup::emit_ack(pools.as_ref().map_or(0, PoolArena::size));
    let fds: Vec<_> = pools.as_ref().map(|p| p.fd.as_fd()).into_iter().collect();
    if send_fds(&sock, &ack, &fds)? != ACK_LEN {
        return Err(FabricError::Shm("the answer was cut short".into()));
    }
    let mut t = ShmTransport::new(ch, sock);
    t.pools = pools.map(|p| p.map);
    Ok(t)
}

/// `r`, or the error `errno` gives when negative.
fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `r` as a byte count, or the error `errno` gives when negative.
fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(r).map_err(|_| io::Error::last_os_error())
}
