//! The data channel over shared memory, between daemons on one machine.
//!
//! A host on the IOC's machine opens its data channel on the IOC's local Unix socket with a
//! Hello naming channel [`SHM_CHANNEL`]. After the HelloReply, the two sides set up
//! shared memory over that socket (`SCM_RIGHTS`):
//!
//! 1. The host sends a 16-byte [`Setup`] with three descriptors: the ring it produces into
//!    (host to IOC), the ring the IOC produces into (IOC to host), both sealed `memfd`s it
//!    created and initialised, and its doorbell (an `eventfd`).
//! 2. The IOC checks the setup against its limits, verifies each `memfd` (sealed against
//!    shrinking and growing, exactly the ring's size), maps it, checks the ring headers, and
//!    answers [`ACK`] with its own doorbell.
//!
//! Then each operation travels as a ring record ([`ShmChannel`]); each side sleeps on the
//! doorbell it created and rings the peer's when the peer asked to be woken. The socket
//! carries nothing more: its end of stream says that the peer is gone.

pub use crate::adapter::shm::setup::SHM_CHANNEL;

use super::{FabricError, Ready};
use crate::adapter::shm::setup::{Setup, ACK, MAX_PAYLOAD, RING_DATA};
use crate::adapter::shm::{Consumer, Producer, RingConfig, ShmChannel};
use crate::adapter::{Channel, ChannelError, Op, Payload, RxCompletion};
use crate::memory::{DomainId, Registry, SendBufCache};
use crate::sys::eventfd::EventFd;
use crate::sys::shm::{recv_fds, send_fds, Mapping, Memfd};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A data channel over shared-memory rings, with its doorbells and the socket that
/// outlives the set-up as a sign of life.
#[derive(Debug)]
pub struct ShmTransport {
    ch: ShmChannel<Mapping>,
    /// This side's doorbell (created here): readable when the peer rang.
    bell: EventFd,
    /// The peer's doorbell.
    peer: EventFd,
    sock: UnixStream,
    /// This side rang the peer since [`Channel::take_rang_peer`] last looked.
    rang: bool,
}

impl ShmTransport {
    fn new(ch: ShmChannel<Mapping>, bell: EventFd, peer: EventFd, sock: UnixStream) -> Self {
        ShmTransport {
            ch,
            bell,
            peer,
            sock,
            rang: false,
        }
    }

    /// Changes the protection domain whose writes this channel carries.
    pub fn set_domain(&mut self, domain: DomainId) {
        self.ch.set_domain(domain);
    }

    /// This side's doorbell, to wait on.
    pub fn bell(&self) -> &EventFd {
        &self.bell
    }

    /// The set-up socket: readable (end of stream) once the peer has gone.
    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// Rings the peer if what this side did is what it waits for.
    fn ring_peer(&mut self) -> Result<(), ChannelError> {
        if self.ch.take_doorbell() {
            self.peer.ring()?;
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

    fn held_buffers(&self) -> usize {
        self.ch.held_buffers()
    }

    fn set_writes_allowed(&mut self, allowed: bool) {
        self.ch.set_writes_allowed(allowed);
    }

    fn close(&mut self, reg: &mut Registry) {
        self.ch.close(reg);
    }

    fn prepare_sleep(&mut self) -> bool {
        self.ch.prepare_sleep()
    }

    fn input_pending(&mut self) -> bool {
        self.ch.input_pending()
    }

    fn take_rang_peer(&mut self) -> bool {
        std::mem::take(&mut self.rang)
    }

    fn wake(&mut self) {
        self.ch.wake();
        if matches!(self.bell.drain(), Ok(n) if n > 0) {
            self.ch.rang();
        }
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

/// The host's side: after the HelloReply on `sock`, sets up the rings and doorbells and
/// waits for the IOC's acknowledgement.
pub async fn offer(
    sock: UnixStream,
    domain: DomainId,
    max_send: usize,
    timeout: Duration,
) -> Result<ShmTransport, FabricError> {
    let setup = Setup {
        data_size: RING_DATA,
        max_payload: MAX_PAYLOAD,
    };
    let cfg = ring(&setup)?;
    let (tx_fd, tx_map) = new_ring(cfg, c"splitnet-host-to-ioc")?;
    let (rx_fd, rx_map) = new_ring(cfg, c"splitnet-ioc-to-host")?;
    let bell = EventFd::new()?;
    let sent = send_fds(
        &sock,
        &setup.emit(),
        &[tx_fd.as_fd(), rx_fd.as_fd(), bell.as_fd()],
    )?;
    if sent != 16 {
        return Err(FabricError::Shm("the set-up was cut short".into()));
    }
    let mut ack = [0u8; 4];
    let (n, mut fds) = recv_setup(&sock, &mut ack, 1, timeout).await?;
    if n != 4 || ack != ACK || fds.len() != 1 {
        return Err(FabricError::Shm("the IOC refused the shared memory".into()));
    }
    let peer = EventFd::from_fd(fds.remove(0));
    let ch = attach(tx_map, rx_map, cfg, domain, max_send)?;
    Ok(ShmTransport::new(ch, bell, peer, sock))
}

/// The IOC's side: after the HelloReply on `sock`, takes the host's set-up, checks it, and
/// acknowledges it. Anything wrong is an error (the caller closes the connection: the host
/// sees its end).
pub async fn accept(
    sock: UnixStream,
    domain: DomainId,
    max_send: usize,
    timeout: Duration,
) -> Result<ShmTransport, FabricError> {
    let mut buf = [0u8; 16];
    let (n, fds) = recv_setup(&sock, &mut buf, 3, timeout).await?;
    let setup = Setup::parse(&buf[..n]).map_err(shm_err)?;
    let Ok::<[_; 3], _>([rx_fd, tx_fd, peer]) = fds.try_into() else {
        return Err(FabricError::Shm(
            "the set-up needs three descriptors".into(),
        ));
    };
    let cfg = ring(&setup)?;
    let verify = |fd| -> Result<Mapping, FabricError> {
        let m = Memfd::verify(fd, cfg.region_len()).map_err(shm_err)?;
        Ok(m.map()?)
    };
    let (rx_map, tx_map) = (verify(rx_fd)?, verify(tx_fd)?);
    let ch = attach(tx_map, rx_map, cfg, domain, max_send)?;
    let bell = EventFd::new()?;
    send_fds(&sock, &ACK, &[bell.as_fd()])?;
    Ok(ShmTransport::new(ch, bell, EventFd::from_fd(peer), sock))
}
