//! splitnet's fabric: the transports a link's channels travel over and the tokio shell that
//! sets them up around the sans-IO core (`splitnet-messaging`).
//!
//! * This module: stream channels over TCP (between machines) and Unix sockets (between
//!   daemons on one machine), their readiness with the tokio reactor, dialing, the handshake
//!   and [`RegisteredLink`], a link with its registrations.
//! * [`shm`]: channels in shared memory (on one machine), with all of that transport's
//!   `unsafe` (mappings, descriptor passing, the doorbell) in its two submodules.
//! * `verbs` (feature `verbs`, on by default): both channels over RDMA queue pairs
//!   (rdma-core), libibverbs and librdmacm loaded at run time.
//! * [`FabricChannel`]: a link's channel, whichever transport it travels over.
//!
//! A [`RegisteredLink`] owns a [`Link`] over two non-blocking stream sockets (channel 0,
//! control, and channel 1, data: TCP between machines, Unix stream sockets between daemons
//! on one machine) and their registrations with the tokio reactor. The daemons wait on
//! [`RegisteredLink::ready`] and then drive the link until the sockets would block; nothing here
//! buffers or copies frames.
//!
//! `unsafe` is denied but in six places, each with its `// SAFETY:` notes: the two `shm`
//! submodules, the three `verbs` submodules that call libibverbs and librdmacm (`sys`,
//! `device`, `cm`), and
//! [`Ready`]'s registration with the reactor, which tokio declares unsafe (the descriptor
//! must stay open while registered: it is a duplicate the `Ready` owns).

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
mod channel;
mod sealed;
pub mod sealed_stream;
pub mod shm;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use channel::FabricChannel;
pub use sealed::SealedConn;
pub use sealed_stream::SealedStream;

use splitnet_messaging::adapter::{
    Channel, ChannelError, Op, Payload, RxCompletion, StreamChannel,
};
use splitnet_messaging::endpoint::handshake::{self, HandshakeError};
use splitnet_messaging::endpoint::{Lane, Link, Session};
use splitnet_messaging::memory::{DomainId, Registry};
use splitnet_messaging::wire::{self, ErrorCode, Hello, HelloReply, Queue, Role};
use std::future::Future;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use thiserror::Error;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::io::Interest;

/// A fabric connection's socket: TCP, or a Unix stream socket (same bytes either way), or
/// a data channel's TCP socket whose bytes travel sealed.
#[derive(Debug)]
pub enum Stream {
    /// Between machines.
    Tcp(TcpStream),
    /// Between daemons on one machine.
    Unix(UnixStream),
    /// A data channel between machines whose host asked for encryption
    /// ([`sealed_stream`]).
    Sealed(Box<SealedStream<Stream>>),
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Stream {
        Stream::Tcp(s)
    }
}

impl From<UnixStream> for Stream {
    fn from(s: UnixStream) -> Stream {
        Stream::Unix(s)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Sealed(s) => s.read(buf),
        }
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_vectored(bufs),
            Stream::Unix(s) => s.read_vectored(bufs),
            Stream::Sealed(s) => s.read_vectored(bufs),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Sealed(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Sealed(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(_) | Stream::Unix(_) => Ok(()),
            Stream::Sealed(s) => s.flush(),
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
            Stream::Sealed(s) => s.inner().as_fd(),
        }
    }
}

/// A channel over a non-blocking fabric socket: the handshake, the control channel, and the
/// data channel unless it uses shared memory.
pub type StreamConn = StreamChannel<Stream>;

/// Opens a TCP connection to `addr`.
pub async fn dial_tcp(addr: SocketAddr) -> io::Result<Stream> {
    Ok(Stream::Tcp(
        tokio::net::TcpStream::connect(addr).await?.into_std()?,
    ))
}

/// Opens a Unix stream connection to the socket at `path`.
pub async fn dial_unix(path: &Path) -> io::Result<Stream> {
    Ok(Stream::Unix(
        tokio::net::UnixStream::connect(path).await?.into_std()?,
    ))
}

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
    /// The shared-memory set-up failed.
    #[error("shared memory: {0}")]
    Shm(String),
    /// An RDMA data channel could not be set up (no device, a refused set-up).
    #[error("RDMA: {0}")]
    Verbs(String),
    /// An RDMA write arrived before the handshake finished.
    #[error("RDMA write during the handshake")]
    EarlyWrite,
    /// The authenticated handshake failed (docs/protocol.md 5.1).
    #[error(transparent)]
    Auth(#[from] auth::AuthError),
    /// The peer answered an authenticated Hello without proving its key.
    #[error("the IOC answered without proving its key (is it set up for authentication?)")]
    Unauthenticated,
    /// The host asked for a sealed data channel and the IOC did not agree.
    #[error(
        "the IOC does not seal the data channel (auth.encrypt_data needs an IOC that supports it)"
    )]
    NotSealed,
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
    pub fn new(sock: &impl AsFd) -> io::Result<Ready> {
        Ready::register(sock, Interest::READABLE | Interest::WRITABLE)
    }

    /// Registers a duplicate of `sock`'s descriptor for read readiness only, for what is
    /// never waited on to become writable (a doorbell, a TAP, a packet socket, a completion
    /// channel): interest in writability wakes the thread each time the kernel reports
    /// room to write, as a Unix socket does whenever its peer reads a datagram of it, a
    /// wake-up for nothing on every doorbell rung. [`Ready::writable`] never completes.
    pub fn reading(sock: &impl AsFd) -> io::Result<Ready> {
        Ready::register(sock, Interest::READABLE)
    }

    #[allow(unsafe_code)]
    fn register(sock: &impl AsFd, interest: Interest) -> io::Result<Ready> {
        let fd = sock.as_fd().try_clone_to_owned()?;
        // SAFETY: the AsyncFd owns `fd`, a valid open descriptor that nothing else closes,
        // so it stays open and names the same socket until the AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(fd, interest) }
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

impl AsFd for Ready {
    /// The registered descriptor (a duplicate of the socket's, doorbell's or channel's).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.get_ref().as_fd()
    }
}

fn prepare(sock: &Stream) -> io::Result<()> {
    match sock {
        Stream::Tcp(s) => {
            s.set_nodelay(true)?;
            s.set_nonblocking(true)
        }
        Stream::Unix(s) => s.set_nonblocking(true),
        Stream::Sealed(s) => prepare(s.inner()),
    }
}

/// A channel for a new connection; its domain is set, and RDMA writes are accepted, once
/// the handshake has named the session ([`RegisteredLink::new`]).
fn channel(sock: Stream, max_send: usize) -> io::Result<StreamConn> {
    prepare(&sock)?;
    let mut ch = StreamChannel::new(sock, DomainId(0), max_send);
    ch.set_writes_allowed(false);
    Ok(ch)
}

/// Largest SEND an accepted connection takes before its Hello is read: a Hello with room to
/// spare, so that a connection that never completes its handshake holds about 2 KiB.
const HELLO_MAX: usize = 256;

/// Writes everything posted on `ch`, within `timeout`.
pub async fn flush(ch: &mut StreamConn, timeout: Duration) -> Result<(), FabricError> {
    let ready = Ready::new(ch.stream())?;
    let work = async {
        loop {
            let mut g = ready.writable().await?;
            if ch.flush()? {
                return Ok::<(), FabricError>(());
            }
            g.clear_ready();
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FabricError::Timeout(timeout))?
}

/// Waits for the next message on `ch`, within `timeout`. The channel keeps whatever was
/// read ahead, so nothing that follows the message is lost.
pub async fn recv_message(ch: &mut StreamConn, timeout: Duration) -> Result<Vec<u8>, FabricError> {
    let ready = Ready::new(ch.stream())?;
    let mut reg = Registry::new(0);
    let work = async {
        loop {
            let mut g = ready.readable().await?;
            match ch.poll_recv(&mut reg)? {
                Some(RxCompletion::Recv { .. }) => return Ok(ch.received().to_vec()),
                Some(RxCompletion::Write { .. }) => return Err(FabricError::EarlyWrite),
                None => g.clear_ready(),
            }
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FabricError::Timeout(timeout))?
}

/// How a host's data channel travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// On its connection, like the control channel.
    Stream,
    /// Over shared memory set up on its connection (a Unix socket to the IOC's
    /// `fabric.listen_local`: see [`shm`]), with a pool arena for `pool_bytes` of this
    /// side's receive pools.
    Shm {
        /// Bytes of receive pools the arena must hold.
        pool_bytes: u64,
    },
    /// Over an RDMA queue pair set up on its TCP connection (see [`verbs`]), with a pool
    /// arena for `pool_bytes` of this side's receive pools.
    #[cfg(feature = "verbs")]
    Verbs {
        /// Bytes of receive pools the arena must hold.
        pool_bytes: u64,
    },
}

/// The keys of an authenticated handshake, on the host: its own private key and the IOC's
/// public key.
#[derive(Debug, Clone)]
pub struct HostKeys {
    /// This host's private key.
    pub private: auth::Key,
    /// The IOC's public key.
    pub ioc: auth::Key,
    /// Ask that the data channel's bytes travel sealed when it is on its socket
    /// ([`sealed_stream`]); the IOC must agree.
    pub seal_data: bool,
    /// Further flags asked on the data channel's AuthHello ([`HelloReply::STANDBY`],
    /// [`HelloReply::LIVENESS`] with its interval); what the IOC agreed comes back in the
    /// returned [`HelloReply::flags`].
    pub flags: u32,
}

/// The connecting side: opens both channels of `queue`'s session with `dial` (see
/// [`dial_tcp`], [`dial_unix`]) and completes the handshake, both channels over `path`,
/// each authenticated with `keys` when given (a control channel on its socket then seals its
/// messages). A further queue (index above 0) names `first`, the session of the host's
/// first queue, which it joins; the first queue passes 0.
#[allow(clippy::too_many_arguments)]
pub async fn connect<D, F>(
    dial: D,
    path: DataPath,
    node_id: u64,
    queue: Queue,
    first: u64,
    timeout: Duration,
    keys: Option<&HostKeys>,
) -> Result<(FabricChannel, FabricChannel, HelloReply), FabricError>
where
    D: Fn() -> F,
    F: Future<Output = io::Result<Stream>>,
{
    let max = wire::MAX_MESSAGE_LEN as u32;
    let dial = &dial;
    let open = |channel_no: u8, session: u64, data: bool| async move {
        let s = tokio::time::timeout(timeout, dial())
            .await
            .map_err(|_| FabricError::Timeout(timeout))??;
        let mut ch = channel(s, wire::MAX_MESSAGE_LEN)?;
        let hello = handshake::hello(Role::Host, channel_no, queue, session, node_id, max);
        // Sealing is asked for a data channel that stays on its socket.
        let seal = keys.is_some_and(|k| k.seal_data) && channel_no == 1 && data;
        // What the session asks for goes on its data channel's AuthHello.
        let flags = match keys.filter(|_| data) {
            Some(k) if seal => HelloReply::SEALED_DATA | k.flags,
            Some(k) => k.flags,
            None => 0,
        };
        let initiator = match keys {
            Some(k) => {
                let mut i = auth::Initiator::new(&k.private, &k.ioc)?;
                let first = i.hello_asking(&hello, auth::timestamp(), flags)?;
                ch.post(Op::Send, &[], Payload::Bytes(first));
                Some(i)
            }
            None => {
                ch.post(Op::Send, &[], Payload::Bytes(hello));
                None
            }
        };
        flush(&mut ch, timeout).await?;
        let bytes = recv_message(&mut ch, timeout).await?;
        let (reply, sealer) = match (initiator, auth::reply_body(&bytes)) {
            (Some(i), Some(body)) => {
                let (reply, sealer) = i.reply(body)?;
                (reply, Some(sealer))
            }
            (_, _) => (bytes, None),
        };
        match handshake::accept_reply(&reply) {
            // An IOC that accepts an authenticated Hello must prove its key in the answer.
            Ok(_) if keys.is_some() && sealer.is_none() => {
                goodbye(ch, ErrorCode::Unauthenticated, timeout).await;
                Err(FabricError::Unauthenticated)
            }
            // Asked to seal and not agreed to: the host does not send in the clear what
            // its operator wants sealed.
            Ok(r) if seal && r.flags & HelloReply::SEALED_DATA == 0 => {
                goodbye(ch, ErrorCode::Unauthenticated, timeout).await;
                Err(FabricError::NotSealed)
            }
            Ok(r) => Ok::<_, FabricError>((ch, r, sealer)),
            Err(e) => {
                // A reply this side cannot use (a version it does not speak): say why.
                if let Some(code) = e.code() {
                    goodbye(ch, code, timeout).await;
                }
                Err(e.into())
            }
        }
    };
    let (ctrl_no, data_no) = match path {
        DataPath::Stream => (wire::CONTROL_CHANNEL, 1),
        DataPath::Shm { .. } => (shm::SHM_CONTROL_CHANNEL, shm::SHM_CHANNEL),
        #[cfg(feature = "verbs")]
        DataPath::Verbs { .. } => (verbs::VERBS_CONTROL_CHANNEL, verbs::VERBS_CHANNEL),
    };
    let (ctrl, r, sealer, ctrl_no) = match open(ctrl_no, first, false).await {
        // An IOC that predates control channels in shared memory takes channel 3 for a data
        // channel naming no session: the control channel then stays on its socket.
        Err(FabricError::Handshake(HandshakeError::Refused {
            status: ErrorCode::UnknownSession,
            ..
        })) if ctrl_no != wire::CONTROL_CHANNEL => {
            let (c, r, sealer) = open(wire::CONTROL_CHANNEL, first, false).await?;
            (c, r, sealer, wire::CONTROL_CHANNEL)
        }
        r => r.map(|(c, r, sealer)| (c, r, sealer, ctrl_no))?,
    };
    let ctrl = match ctrl_no {
        wire::CONTROL_CHANNEL => FabricChannel::Stream(ctrl),
        #[cfg(feature = "verbs")]
        verbs::VERBS_CONTROL_CHANNEL => {
            let (sock, unread) = ctrl.into_parts();
            let t = verbs::offer(sock, unread, None, VERBS_MAX_ARENA, timeout).await?;
            FabricChannel::Verbs(Box::new(t))
        }
        _ => FabricChannel::Shm(Box::new(shm_offer(ctrl, None, timeout).await?)),
    };
    // Sealed after an authenticated handshake, but in shared memory (on this machine).
    let ctrl = match sealer {
        Some(s) if ctrl_no != shm::SHM_CONTROL_CHANNEL => FabricChannel::sealed(ctrl, s),
        _ => ctrl,
    };
    let (data, r2, data_sealer) = open(data_no, r.session, true).await?;
    if r2.session != r.session || r2.version != r.version {
        goodbye(data, ErrorCode::Malformed, timeout).await;
        goodbye_on(ctrl, ErrorCode::Malformed, timeout).await;
        return Err(HandshakeError::Unexpected("the data channel's HelloReply to match").into());
    }
    let data = match (path, data_sealer) {
        (DataPath::Stream, Some(sealer)) if r2.flags & HelloReply::SEALED_DATA != 0 => {
            FabricChannel::Stream(sealed_data_channel(data, sealer)?)
        }
        (DataPath::Stream, _) => FabricChannel::Stream(data),
        (DataPath::Shm { pool_bytes }, _) => {
            FabricChannel::Shm(Box::new(shm_offer(data, Some(pool_bytes), timeout).await?))
        }
        #[cfg(feature = "verbs")]
        (DataPath::Verbs { pool_bytes }, _) => {
            let size = splitnet_messaging::adapter::shm::setup::Setup::pool_size_for(pool_bytes);
            let arena = shm::PoolArena::new(c"splitnet-verbs-pools", size)?;
            let (sock, unread) = data.into_parts();
            let t = verbs::offer(sock, unread, Some(arena.region()), VERBS_MAX_ARENA, timeout);
            FabricChannel::Verbs(Box::new(t.await?))
        }
    };
    // What the IOC agreed of the session's flags, from its data channel's answer.
    Ok((
        ctrl,
        data,
        HelloReply {
            flags: r2.flags,
            ..r
        },
    ))
}

/// Largest pool arena a peer may announce over verbs (the IOC's is bounded by its
/// `pools.max_granted_bytes`, at most 1 GiB).
#[cfg(feature = "verbs")]
pub const VERBS_MAX_ARENA: u64 = 1 << 30;

/// A data channel whose handshake agreed to seal it, once its answer is on the socket: its
/// stream carries sealed records from now on, the bytes already read ahead of the answer
/// being the first of them.
pub fn sealed_data_channel(
    ch: StreamConn,
    sealer: auth::Sealer,
) -> Result<StreamConn, FabricError> {
    let (stream, unread) = ch.into_parts();
    let sealed = SealedStream::with_unread(stream, sealer, &unread)?;
    Ok(channel(
        Stream::Sealed(Box::new(sealed)),
        wire::MAX_MESSAGE_LEN,
    )?)
}

/// The host's shared-memory set-up on a channel whose HelloReply it read (see
/// [`shm::offer`]).
async fn shm_offer(
    ch: StreamConn,
    pool_bytes: Option<u64>,
    timeout: Duration,
) -> Result<shm::ShmTransport, FabricError> {
    let Stream::Unix(sock) = ch.into_stream() else {
        return Err(FabricError::Shm("shared memory needs a Unix socket".into()));
    };
    let max = wire::MAX_MESSAGE_LEN;
    shm::offer(sock, DomainId(0), max, pool_bytes, timeout).await
}

/// Sends Goodbye with `code` on a channel whose handshake failed, and closes it.
async fn goodbye(mut ch: StreamConn, code: ErrorCode, timeout: Duration) {
    post_goodbye(&mut ch, code);
    let _ = flush(&mut ch, timeout).await;
}

/// [`goodbye`] on a channel on its socket or in shared memory, where it is published at
/// once (a peer still reading the ring finds it; one that waits for the data channel's
/// Hello just times out).
async fn goodbye_on(ch: FabricChannel, code: ErrorCode, timeout: Duration) {
    match ch {
        FabricChannel::Stream(c) => goodbye(c, code, timeout).await,
        FabricChannel::Sealed(mut c) => {
            post_goodbye(&mut *c, code);
            match c.conn_mut() {
                FabricChannel::Stream(s) => drop(flush(s, timeout).await),
                other => drop(other.flush()),
            }
        }
        FabricChannel::Shm(mut t) => {
            post_goodbye(&mut *t, code);
            let _ = t.flush();
        }
        #[cfg(feature = "verbs")]
        FabricChannel::Verbs(mut t) => {
            post_goodbye(&mut *t, code);
            let _ = t.flush();
        }
    }
}

/// Queues a Goodbye with `code` on `ch`.
fn post_goodbye(ch: &mut impl Channel, code: ErrorCode) {
    let mut msg = Vec::new();
    wire::Message::Goodbye(wire::Goodbye { code }).emit(0, &mut msg);
    ch.post(Op::Send, &[], Payload::Bytes(msg));
}

/// A connection whose Hello the listening side read.
#[derive(Debug)]
pub struct Accepted {
    /// The connection.
    pub ch: StreamConn,
    /// Its Hello.
    pub hello: Hello,
    /// The version to answer with.
    pub version: u16,
    /// The authenticated handshake, when the Hello came in an AuthHello: who the peer
    /// proved to be, and what writes the answer.
    pub auth: Option<Box<auth::Responder>>,
}

/// The listening side: reads the Hello of a new connection within `timeout`, authenticated
/// with this side's `key` when it comes in an AuthHello.
///
/// A connection whose first operation is not a usable Hello (an operation header, a SEND
/// longer than [`HELLO_MAX`] or an RDMA write: Malformed; an undecodable Hello, or another
/// message: its code; no common version: UnsupportedVersion; a `max_message` below
/// [`wire::MAX_MESSAGE_LEN`]: Malformed) is answered with a HelloReply carrying that status
/// and this side's highest version, and closed; so is an AuthHello that does not prove a
/// key to this side's key (Unauthenticated), answered without proof since no handshake
/// came about. A timeout or a transport failure closes it without an answer.
pub async fn accept_hello(
    sock: Stream,
    timeout: Duration,
    key: Option<&auth::Key>,
) -> Result<Accepted, FabricError> {
    let mut ch = channel(sock, HELLO_MAX)?;
    let bytes = match recv_message(&mut ch, timeout).await {
        Ok(bytes) => bytes,
        Err(e @ (FabricError::EarlyWrite | FabricError::Channel(ChannelError::Rx(_)))) => {
            refuse(ch, None, wire::VERSION, ErrorCode::Malformed, timeout).await;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let (hello, mut responder) = match (auth::is_hello(&bytes), key) {
        (true, Some(key)) => match auth::Responder::accept(key, &bytes) {
            Ok((r, hello)) => (hello, Some(Box::new(r))),
            Err(e) => {
                refuse(ch, None, wire::VERSION, ErrorCode::Unauthenticated, timeout).await;
                return Err(e.into());
            }
        },
        (true, None) => {
            refuse(ch, None, wire::VERSION, ErrorCode::Unauthenticated, timeout).await;
            return Err(FabricError::Unauthenticated);
        }
        (false, _) => (bytes, None),
    };
    match handshake::accept_hello(&hello) {
        Ok((hello, version)) => {
            ch.set_max_send(wire::MAX_MESSAGE_LEN);
            Ok(Accepted {
                ch,
                hello,
                version,
                auth: responder,
            })
        }
        Err(e) => {
            let code = e.code().unwrap_or(ErrorCode::Malformed);
            refuse(ch, responder.as_deref_mut(), wire::VERSION, code, timeout).await;
            Err(e.into())
        }
    }
}

/// The listening side: queues a HelloReply on `ch` (sent by the next flush, ahead of
/// anything posted after it), in an AuthReply that proves this side's key when the Hello
/// was authenticated.
pub fn post_reply(
    ch: &mut StreamConn,
    auth: Option<&mut auth::Responder>,
    version: u16,
    status: ErrorCode,
    session: u64,
) -> Result<(), FabricError> {
    post_reply_agreeing(ch, auth, version, status, session, 0)
}

/// [`post_reply`] agreeing to `flags` of what the AuthHello asked for
/// ([`HelloReply::SEALED_DATA`]).
pub fn post_reply_agreeing(
    ch: &mut StreamConn,
    auth: Option<&mut auth::Responder>,
    version: u16,
    status: ErrorCode,
    session: u64,
    flags: u32,
) -> Result<(), FabricError> {
    let max = wire::MAX_MESSAGE_LEN as u32;
    let msg = handshake::reply_agreeing(version, status, session, max, flags);
    let msg = match auth {
        Some(r) => r.reply(&msg)?,
        None => msg,
    };
    ch.post(Op::Send, &[], Payload::Bytes(msg));
    Ok(())
}

/// The listening side: refuses a connection with `status` and closes it.
pub async fn refuse(
    mut ch: StreamConn,
    auth: Option<&mut auth::Responder>,
    version: u16,
    status: ErrorCode,
    timeout: Duration,
) {
    if post_reply(&mut ch, auth, version, status, 0).is_ok() {
        let _ = flush(&mut ch, timeout).await;
    }
}

/// The listening side: the control channel of an accepted connection once its reply was
/// posted: sealed when the Hello was authenticated.
pub fn control_channel(
    ch: StreamConn,
    auth: Option<Box<auth::Responder>>,
) -> Result<FabricChannel, FabricError> {
    Ok(match auth {
        Some(r) => FabricChannel::sealed(FabricChannel::Stream(ch), r.into_sealer()?),
        None => FabricChannel::Stream(ch),
    })
}

/// Readiness of a link's two channels.
#[derive(Debug)]
pub struct LinkReady {
    /// Channel 0: its socket, or for shared memory this side's doorbell of that channel.
    pub ctrl: Ready,
    /// Channel 1: its socket, or for shared memory this side's doorbell (rung for records
    /// and for room alike: never wait for it to be writable).
    pub data: Ready,
    /// For each channel (control, data), whether it is in shared memory. Its doorbell is
    /// readable once the peer has gone too, and polling it then fails.
    pub shm: [bool; 2],
}

impl LinkReady {
    /// Whether waiting for `lane` to be writable makes sense (a socket), rather than for its
    /// doorbell (shared memory).
    pub fn writable(&self, lane: Lane) -> bool {
        !self.shm[lane_index(lane)]
    }

    /// Whether the data channel is in shared memory.
    pub fn is_shared_memory(&self) -> bool {
        !self.writable(Lane::Data)
    }

    /// Completes when a lane has input to poll. `sleeps` says per lane (control, data) what
    /// [`Link::prepare_sleep`] answered: a lane that may not sleep has records waiting in its
    /// ring and is ready at once (`None`: no readiness to clear), after a unit of tokio's
    /// cooperative budget, so that a peer keeping its ring full cannot hold the thread from
    /// everyone else; a lane that sleeps is ready when its socket or doorbell is readable.
    pub async fn input(&self, sleeps: [bool; 2]) -> io::Result<(Lane, Option<Guard<'_>>)> {
        use tokio::task::coop::consume_budget;
        tokio::select! {
            _ = consume_budget(), if !sleeps[0] => Ok((Lane::Control, None)),
            _ = consume_budget(), if !sleeps[1] => Ok((Lane::Data, None)),
            g = self.ctrl.readable(), if sleeps[0] => g.map(|g| (Lane::Control, Some(g))),
            g = self.data.readable(), if sleeps[1] => g.map(|g| (Lane::Data, Some(g))),
        }
    }

    /// Readiness of a lane's socket.
    pub fn lane(&self, lane: Lane) -> &Ready {
        match lane {
            Lane::Control => &self.ctrl,
            Lane::Data => &self.data,
        }
    }
}

/// Whether a Hello's channel number opens a session's control channel: on its socket, in
/// shared memory ([`shm::SHM_CONTROL_CHANNEL`]) or on an RDMA queue pair
/// ([`verbs::VERBS_CONTROL_CHANNEL`]).
pub fn is_control(channel: u8) -> bool {
    #[cfg(feature = "verbs")]
    if channel == verbs::VERBS_CONTROL_CHANNEL {
        return true;
    }
    channel == shm::SHM_CONTROL_CHANNEL || channel == wire::CONTROL_CHANNEL
}

/// Index of `lane` in per-channel arrays.
fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Control => 0,
        Lane::Data => 1,
    }
}

/// A connected peer's [`Link`], registered with the reactor: the link and the readiness of
/// its two channels (sockets or doorbells).
#[derive(Debug)]
pub struct RegisteredLink {
    /// Reactor registrations.
    pub ready: LinkReady,
    /// The link.
    pub link: Link<FabricChannel>,
}

impl RegisteredLink {
    /// Wraps two handshaken channels: the data channel now carries writes by `session`'s
    /// domain; the control channel carries none.
    pub fn new(
        session: Session,
        ctrl: impl Into<FabricChannel>,
        data: impl Into<FabricChannel>,
    ) -> io::Result<RegisteredLink> {
        let (mut ctrl, mut data) = (ctrl.into(), data.into());
        let d = session.domain();
        ctrl.set_domain(d);
        data.set_domain(d);
        data.set_writes_allowed(true);
        let ready = LinkReady {
            ctrl: ctrl.readiness()?,
            data: data.readiness()?,
            shm: [ctrl.is_shared_memory(), data.is_shared_memory()],
        };
        Ok(RegisteredLink {
            ready,
            link: Link::new(session, ctrl, data),
        })
    }
}
