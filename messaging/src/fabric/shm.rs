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

use super::{FabricError, Ready};
use crate::adapter::shm::{ring_config, Consumer, Producer, RingConfig, ShmChannel};
use crate::adapter::{Channel, ChannelError, Op, Payload, RxCompletion};
use crate::memory::{DomainId, Registry, SendBufCache};
use crate::sys::eventfd::EventFd;
use crate::sys::shm::{recv_fds, send_fds, Mapping, Memfd};
use crate::wire;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The channel number a Hello names for a data channel over shared memory (local socket
/// only).
pub const SHM_CHANNEL: u8 = 2;
/// The set-up message's magic: the bytes `SNSH`.
pub const MAGIC: [u8; 4] = *b"SNSH";
/// The set-up layout version.
pub const VERSION: u16 = 1;
/// The IOC's answer to an accepted set-up.
pub const ACK: [u8; 4] = *b"SNOK";
/// Each ring's data area as a host sets it up: 2 MiB (about 30 largest frames, 1,400 of
/// 1,500 bytes).
pub const RING_DATA: u32 = 2 << 20;
/// The smallest and largest data areas the IOC accepts (it maps two per host).
pub const RING_DATA_RANGE: (u32, u32) = (256 << 10, 8 << 20);
/// Largest operation payload a ring carries: a SendData or a frame's RDMA write.
pub const MAX_PAYLOAD: u32 = wire::MAX_MESSAGE_LEN as u32;

/// What the host proposes: the rings' geometry (both rings alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// Each ring's data area in bytes.
    pub data_size: u32,
    /// Largest record payload (an operation header and its payload).
    pub max_payload: u32,
}

impl Setup {
    /// Its 16 bytes: magic, version (u16), reserved (u16), data size, largest payload, all
    /// big-endian.
    pub fn emit(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[8..12].copy_from_slice(&self.data_size.to_be_bytes());
        b[12..16].copy_from_slice(&self.max_payload.to_be_bytes());
        b
    }

    /// Parses and checks a set-up against the IOC's limits.
    pub fn parse(b: &[u8]) -> Result<Setup, String> {
        let b: &[u8; 16] = b
            .try_into()
            .map_err(|_| format!("set-up of {} bytes, not 16", b.len()))?;
        if b[..4] != MAGIC {
            return Err("not a shared-memory set-up".into());
        }
        let version = u16::from_be_bytes([b[4], b[5]]);
        if version != VERSION || b[6..8] != [0, 0] {
            return Err(format!(
                "set-up version {version} (this side speaks {VERSION})"
            ));
        }
        let data_size = u32::from_be_bytes([b[8], b[9], b[10], b[11]]);
        let max_payload = u32::from_be_bytes([b[12], b[13], b[14], b[15]]);
        let (lo, hi) = RING_DATA_RANGE;
        if !data_size.is_power_of_two() || !(lo..=hi).contains(&data_size) {
            return Err(format!(
                "ring of {data_size} bytes (a power of two from {lo} to {hi})"
            ));
        }
        if max_payload != MAX_PAYLOAD {
            return Err(format!(
                "records of {max_payload} bytes (not {MAX_PAYLOAD})"
            ));
        }
        Ok(Setup {
            data_size,
            max_payload,
        })
    }

    fn ring(&self) -> Result<RingConfig, FabricError> {
        ring_config(self.data_size, self.max_payload).map_err(|e| FabricError::Shm(e.to_string()))
    }
}

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
}

impl ShmTransport {
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

    fn wake(&mut self) {
        self.ch.wake();
        let _ = self.bell.drain();
    }
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
    let fd = Memfd::create(name, cfg.region_len()).map_err(|e| FabricError::Shm(e.to_string()))?;
    let map = fd.map()?;
    cfg.init(&map)
        .map_err(|e| FabricError::Shm(e.to_string()))?;
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
    let cfg = setup.ring()?;
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
    let map_err = |e: crate::adapter::shm::RingError| FabricError::Shm(e.to_string());
    let ch = ShmChannel::new(
        Producer::attach(tx_map, cfg).map_err(map_err)?,
        Consumer::attach(rx_map, cfg).map_err(map_err)?,
        domain,
        max_send,
    );
    Ok(ShmTransport {
        ch,
        bell,
        peer,
        sock,
    })
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
    let setup = Setup::parse(&buf[..n]).map_err(FabricError::Shm)?;
    let Ok::<[_; 3], _>([rx_fd, tx_fd, peer]) = fds.try_into() else {
        return Err(FabricError::Shm(
            "the set-up needs three descriptors".into(),
        ));
    };
    let cfg = setup.ring()?;
    let verify = |fd| -> Result<Mapping, FabricError> {
        let m = Memfd::verify(fd, cfg.region_len()).map_err(|e| FabricError::Shm(e.to_string()))?;
        Ok(m.map()?)
    };
    let (rx_map, tx_map) = (verify(rx_fd)?, verify(tx_fd)?);
    let map_err = |e: crate::adapter::shm::RingError| FabricError::Shm(e.to_string());
    let ch = ShmChannel::new(
        Producer::attach(tx_map, cfg).map_err(map_err)?,
        Consumer::attach(rx_map, cfg).map_err(map_err)?,
        domain,
        max_send,
    );
    let bell = EventFd::new()?;
    send_fds(&sock, &ACK, &[bell.as_fd()])?;
    Ok(ShmTransport {
        ch,
        bell,
        peer: EventFd::from_fd(peer),
        sock,
    })
}
