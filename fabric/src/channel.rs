//! A link's channel, whichever transport it travels over: [`FabricChannel`].

#[cfg(feature = "verbs")]
use crate::verbs;
use crate::{auth, shm, Ready, SealedConn, Stream, StreamConn};
use splitnet_messaging::adapter::{Channel, ChannelError, Op, Payload, RxCompletion};
use splitnet_messaging::memory::{DomainId, Registry};
use splitnet_messaging::wire;
use std::io;

/// A link's channel: over its socket, or (a data channel between daemons on one machine)
/// over shared memory.
#[derive(Debug)]
// The socket channel is the common case and stays inline; the rarer shared-memory one is boxed.
#[allow(clippy::large_enum_variant)]
pub enum FabricChannel {
    /// Over the connection's socket.
    Stream(StreamConn),
    /// A control channel after an authenticated handshake, over its socket or an RDMA
    /// queue pair: every message sealed ([`FabricChannel::sealed`]).
    Sealed(Box<SealedConn<FabricChannel>>),
    /// Over shared-memory rings.
    Shm(Box<shm::ShmTransport>),
    /// Over an RDMA queue pair.
    #[cfg(feature = "verbs")]
    Verbs(Box<verbs::VerbsTransport>),
}

impl From<StreamConn> for FabricChannel {
    fn from(c: StreamConn) -> FabricChannel {
        FabricChannel::Stream(c)
    }
}

/// Forwards a [`Channel`] call to whichever transport the channel is.
macro_rules! each {
    ($self:expr, $c:ident => $e:expr) => {
        match $self {
            FabricChannel::Stream($c) => $e,
            FabricChannel::Sealed($c) => $e,
            FabricChannel::Shm($c) => $e,
            #[cfg(feature = "verbs")]
            FabricChannel::Verbs($c) => $e,
        }
    };
}

impl Channel for FabricChannel {
    fn post(&mut self, op: Op, prefix: &[u8], payload: Payload) {
        each!(self, c => c.post(op, prefix, payload))
    }
    fn flush(&mut self) -> Result<bool, ChannelError> {
        each!(self, c => c.flush())
    }
    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        each!(self, c => c.poll_recv(reg))
    }
    fn received(&self) -> &[u8] {
        each!(self, c => c.received())
    }
    fn reclaim(&mut self, cache: &mut splitnet_messaging::memory::SendBufCache) {
        each!(self, c => c.reclaim(cache))
    }
    fn pending(&self) -> usize {
        each!(self, c => c.pending())
    }
    fn held_bytes(&self) -> usize {
        each!(self, c => c.held_bytes())
    }
    fn set_writes_allowed(&mut self, allowed: bool) {
        each!(self, c => c.set_writes_allowed(allowed))
    }
    fn close(&mut self, reg: &mut Registry) -> usize {
        each!(self, c => c.close(reg))
    }
    fn prepare_sleep(&mut self) -> bool {
        each!(self, c => c.prepare_sleep())
    }
    fn wake(&mut self) {
        each!(self, c => c.wake())
    }
    fn withdraw(&mut self) {
        each!(self, c => c.withdraw())
    }
    fn input_pending(&mut self) -> bool {
        each!(self, c => c.input_pending())
    }
    fn take_rang_peer(&mut self) -> bool {
        each!(self, c => c.take_rang_peer())
    }
    fn places_writes(&self) -> bool {
        each!(self, c => c.places_writes())
    }
    fn peer_window(
        &self,
        addr: u64,
        len: usize,
    ) -> Option<splitnet_messaging::memory::SharedBytes<'_>> {
        each!(self, c => c.peer_window(addr, len))
    }
    fn post_placed(&mut self, op: Op, len: u32) {
        each!(self, c => c.post_placed(op, len))
    }
}

impl FabricChannel {
    /// `ch` (a control channel on its socket or queue pair) with its messages sealed by
    /// `sealer` from now on.
    pub fn sealed(mut ch: FabricChannel, sealer: auth::Sealer) -> FabricChannel {
        // A queue pair's receives already take a sealed message of the largest size.
        if let FabricChannel::Stream(c) = &mut ch {
            c.set_max_send(auth::sealed_len(wire::MAX_MESSAGE_LEN));
        }
        FabricChannel::Sealed(Box::new(SealedConn::new(ch, sealer)))
    }

    /// Whether its bytes travel sealed on its socket (a data channel whose host asked).
    pub fn is_sealed_stream(&self) -> bool {
        matches!(self, FabricChannel::Stream(c) if matches!(c.stream(), Stream::Sealed(_)))
    }

    pub(crate) fn set_domain(&mut self, domain: DomainId) {
        match self {
            FabricChannel::Stream(c) => c.set_domain(domain),
            FabricChannel::Sealed(c) => c.conn_mut().set_domain(domain),
            FabricChannel::Shm(c) => c.set_domain(domain),
            #[cfg(feature = "verbs")]
            FabricChannel::Verbs(c) => c.set_domain(domain),
        }
    }

    /// This side's pool arena, if the peer places its writes in this side's pools: the
    /// registry lays the session's pools out in it ([`Registry::attach_arena`]) before the
    /// session starts.
    pub fn pools(&self) -> Option<splitnet_messaging::memory::SharedRegion> {
        match self {
            FabricChannel::Stream(_) | FabricChannel::Sealed(_) => None,
            FabricChannel::Shm(t) => t.pools(),
            #[cfg(feature = "verbs")]
            FabricChannel::Verbs(t) => t.pools(),
        }
    }

    /// Whether the channel is in shared memory or on an RDMA queue pair (its readiness is
    /// a doorbell or a completion channel, never to be waited on for writing).
    pub(crate) fn is_shared_memory(&self) -> bool {
        match self {
            FabricChannel::Shm(_) => true,
            #[cfg(feature = "verbs")]
            FabricChannel::Verbs(_) => true,
            FabricChannel::Sealed(c) => c.conn().is_shared_memory(),
            FabricChannel::Stream(_) => false,
        }
    }

    /// Whether the channel travels over an RDMA queue pair.
    pub fn is_verbs(&self) -> bool {
        #[cfg(feature = "verbs")]
        if matches!(self, FabricChannel::Verbs(_)) {
            return true;
        }
        false
    }

    /// What the caller waits on for this channel's progress from now on: its socket, or the
    /// doorbell (readable also once the peer has gone). From this registration on, which
    /// lasts as long as the channel, a short read proves a socket empty (one read per
    /// wake-up: `StreamChannel::set_short_read_drains`). Not on a sealed stream, which hands
    /// out one record's bytes per read whatever else it holds, nor before (the handshake's
    /// waits register anew each time, and a new registration reports what is there, not
    /// what came after a short read).
    pub(crate) fn readiness(&mut self) -> io::Result<Ready> {
        match self {
            FabricChannel::Stream(c) => {
                c.set_short_read_drains(!matches!(c.stream(), Stream::Sealed(_)));
                Ready::new(c.stream())
            }
            FabricChannel::Sealed(c) => c.conn_mut().readiness(),
            // Only ever waited on to be readable (a doorbell, a completion channel).
            FabricChannel::Shm(t) => Ready::reading(t.bell()),
            #[cfg(feature = "verbs")]
            FabricChannel::Verbs(t) => Ready::reading(&t.fd()),
        }
    }
}
