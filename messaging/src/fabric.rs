//! The tokio shell around the sans-IO core: TCP channels, readiness and the handshake.
//!
//! A [`TcpLink`] owns a [`Link`] over two non-blocking TCP sockets (channel 0, control, and
//! channel 1, data) and their registrations with the tokio reactor. The daemons wait on
//! [`TcpLink::ready`] and then drive the link until the sockets would block; nothing here
//! buffers or copies frames.

use crate::adapter::{Channel, ChannelError, RxCompletion, StreamChannel};
use crate::endpoint::handshake::{self, HandshakeError};
use crate::endpoint::{Lane, Link, Session};
use crate::memory::{DomainId, Registry};
use crate::wire::{self, ErrorCode, Hello, HelloReply, Role};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;
use thiserror::Error;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::io::Interest;

/// A channel over a non-blocking TCP socket.
pub type TcpChannel = StreamChannel<TcpStream>;

/// Why setting up a fabric connection failed.
#[derive(Debug, Error)]
pub enum FabricError {
    /// Socket error.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The channel failed during set-up.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The handshake failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The peer did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// An RDMA write arrived before the handshake finished.
    #[error("RDMA write during the handshake")]
    EarlyWrite,
}

/// Readiness guard of a [`Ready`]: call `clear_ready()` on it after an operation hit
/// `WouldBlock` (tokio clears only if no new event arrived since the guard was taken, so no
/// wake-up is lost).
pub type Guard<'a> = AsyncFdReadyGuard<'a, OwnedFd>;

/// Readiness of one socket, registered with the reactor.
#[derive(Debug)]
pub struct Ready(AsyncFd<OwnedFd>);

impl Ready {
    /// Registers a duplicate of `sock`'s descriptor for read and write readiness.
    #[allow(unsafe_code)]
    pub fn new(sock: &impl AsFd) -> io::Result<Ready> {
        let fd = sock.as_fd().try_clone_to_owned()?;
        // SAFETY: the AsyncFd owns `fd`, a valid open descriptor that nothing else closes,
        // so it stays open and names the same socket until the AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
            .map(Ready)
            .map_err(io::Error::from)
    }

    /// Waits until the socket is readable.
    pub async fn readable(&self) -> io::Result<Guard<'_>> {
        self.0.readable().await
    }

    /// Waits until the socket is writable.
    pub async fn writable(&self) -> io::Result<Guard<'_>> {
        self.0.writable().await
    }
}

fn prepare(sock: &TcpStream) -> io::Result<()> {
    sock.set_nodelay(true)?;
    sock.set_nonblocking(true)
}

/// Sends one message and waits for one in return, within `timeout`.
async fn exchange(
    sock: TcpStream,
    msg: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<(TcpStream, Vec<u8>), FabricError> {
    prepare(&sock)?;
    let ready = Ready::new(&sock)?;
    let mut ch = StreamChannel::new(sock, DomainId(0), wire::MAX_MESSAGE_LEN);
    let mut reg = Registry::new(0);
    if let Some(m) = msg {
        ch.post(
            crate::adapter::Op::Send,
            &[],
            crate::adapter::Payload::Bytes(m),
        );
    }
    let work = async {
        loop {
            let mut g = ready.writable().await?;
            if ch.flush()? {
                break;
            }
            g.clear_ready();
        }
        loop {
            let mut g = ready.readable().await?;
            match ch.poll_recv(&mut reg)? {
                Some(RxCompletion::Recv { .. }) => return Ok(ch.received().to_vec()),
                Some(RxCompletion::Write { .. }) => return Err(FabricError::EarlyWrite),
                None => g.clear_ready(),
            }
        }
    };
    let reply = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FabricError::Timeout(timeout))??;
    drop(ready);
    Ok((ch.into_stream(), reply))
}

/// Sends one message without waiting for an answer (a refusal before closing).
pub async fn send_only(sock: TcpStream, msg: Vec<u8>, timeout: Duration) {
    let _ = prepare(&sock);
    let Ok(ready) = Ready::new(&sock) else { return };
    let mut ch = StreamChannel::new(sock, DomainId(0), 0);
    ch.post(
        crate::adapter::Op::Send,
        &[],
        crate::adapter::Payload::Bytes(msg),
    );
    let _ = tokio::time::timeout(timeout, async {
        while let Ok(mut g) = ready.writable().await {
            match ch.flush() {
                Ok(false) => g.clear_ready(),
                _ => return,
            }
        }
    })
    .await;
}

/// The connecting side: opens both channels to `addr` and completes the handshake.
pub async fn connect(
    addr: SocketAddr,
    node_id: u64,
    timeout: Duration,
) -> Result<(TcpStream, TcpStream, HelloReply), FabricError> {
    let max = wire::MAX_MESSAGE_LEN as u32;
    let open = |addr| async move {
        let s = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| FabricError::Timeout(timeout))??;
        Ok::<_, FabricError>(s.into_std()?)
    };
    let hello = handshake::hello(Role::Host, wire::CONTROL_CHANNEL, 0, node_id, max);
    let (ctrl, reply) = exchange(open(addr).await?, Some(hello), timeout).await?;
    let r = handshake::accept_reply(&reply)?;
    let hello = handshake::hello(Role::Host, 1, r.session, node_id, max);
    let (data, reply) = exchange(open(addr).await?, Some(hello), timeout).await?;
    let r2 = handshake::accept_reply(&reply)?;
    if r2.session != r.session {
        return Err(HandshakeError::Refused(ErrorCode::UnknownSession).into());
    }
    Ok((ctrl, data, r))
}

/// The listening side: reads the Hello of a new connection within `timeout`.
pub async fn accept_hello(
    sock: TcpStream,
    timeout: Duration,
) -> Result<(TcpStream, Hello, u16), FabricError> {
    let (sock, bytes) = exchange(sock, None, timeout).await?;
    let (hello, version) = handshake::accept_hello(&bytes)?;
    Ok((sock, hello, version))
}

/// The listening side: answers a Hello.
pub async fn reply_hello(
    sock: TcpStream,
    version: u16,
    status: ErrorCode,
    session: u64,
    timeout: Duration,
) {
    let msg = handshake::reply(version, status, session, wire::MAX_MESSAGE_LEN as u32);
    send_only(sock, msg, timeout).await;
}

/// Readiness of a link's two sockets.
#[derive(Debug)]
pub struct LinkReady {
    /// Channel 0.
    pub ctrl: Ready,
    /// Channel 1.
    pub data: Ready,
}

impl LinkReady {
    /// Readiness of a lane's socket.
    pub fn lane(&self, lane: Lane) -> &Ready {
        match lane {
            Lane::Control => &self.ctrl,
            Lane::Data => &self.data,
        }
    }
}

/// A connected peer over TCP: its link and the readiness of its two sockets.
#[derive(Debug)]
pub struct TcpLink {
    /// Reactor registrations.
    pub ready: LinkReady,
    /// The link.
    pub link: Link<TcpChannel>,
}

impl TcpLink {
    /// Wraps two handshaken sockets carrying writes by `session`'s domain.
    pub fn new(session: Session, ctrl: TcpStream, data: TcpStream) -> io::Result<TcpLink> {
        prepare(&ctrl)?;
        prepare(&data)?;
        let d = session.domain();
        let ready = LinkReady {
            ctrl: Ready::new(&ctrl)?,
            data: Ready::new(&data)?,
        };
        let max = wire::MAX_MESSAGE_LEN;
        Ok(TcpLink {
            ready,
            link: Link::new(
                session,
                StreamChannel::new(ctrl, d, max),
                StreamChannel::new(data, d, max),
            ),
        })
    }
}
