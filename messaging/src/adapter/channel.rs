//! Channels: the queue-pair interface every transport implements.

use super::op::Op;
use super::rx::{RxCompletion, RxError, RxStream};
use super::tx::{Payload, TxQueue};
use crate::memory::{DomainId, Registry, SendBufCache, SharedBytes};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use thiserror::Error;

/// Slices handed to one vectored write.
const IOV_BATCH: usize = 64;

/// Why a channel stopped.
#[derive(Debug, Error)]
pub enum ChannelError {
    /// The peer closed the channel.
    #[error("channel closed by peer")]
    Closed,
    /// The transport failed.
    #[error("transport error: {0}")]
    Io(#[from] io::Error),
    /// The peer sent something the adapter refuses.
    #[error(transparent)]
    Rx(#[from] RxError),
    /// The peer corrupted or misused a shared-memory channel (its rings, its doorbell).
    #[error(transparent)]
    Shm(#[from] super::shm::ShmError),
}

/// A queue pair of the channel adapter: a send queue, a receive queue and their completions.
///
/// Posting is free of syscalls; [`Channel::flush`] is the doorbell that hands everything
/// posted since the last flush to the transport in one batch. A transport over real RDMA
/// verbs or shared memory implements this trait directly; byte-stream transports (TCP and
/// the in-process pipe) get it from [`StreamChannel`].
pub trait Channel {
    /// Queues an operation whose payload is `prefix` followed by `payload`.
    fn post(&mut self, op: Op, prefix: &[u8], payload: Payload);
    /// Pushes posted operations to the transport. `Ok(true)` when all were written,
    /// `Ok(false)` when the transport would block first.
    fn flush(&mut self) -> Result<bool, ChannelError>;
    /// Drives incoming operations, placing RDMA writes through `reg`, until one completes
    /// (`Some`) or the transport has nothing more (`None`).
    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError>;
    /// Payload of the last [`RxCompletion::Recv`].
    fn received(&self) -> &[u8];
    /// Returns the send buffers of completed operations to `cache`.
    fn reclaim(&mut self, cache: &mut SendBufCache);
    /// Bytes posted but not yet written.
    fn pending(&self) -> usize;
    /// Bytes of send buffers (their capacity) the channel holds: posted, or written and not
    /// yet reclaimed.
    fn held_bytes(&self) -> usize;
    /// Whether incoming RDMA writes are accepted (refused before placement when not: the
    /// control channel carries none).
    fn set_writes_allowed(&mut self, allowed: bool);
    /// Tears the queue pair down: aborts a write in progress and drops what is queued; the
    /// send buffers of dropped operations come back through [`Channel::reclaim`]. Returns
    /// the frames dropped (writes and SendData posted and never delivered).
    fn close(&mut self, reg: &mut Registry) -> usize;
    /// Whether this side may put writes' payloads in the peer's memory itself
    /// ([`Channel::peer_window`], [`Channel::post_placed`]): a transport whose peer's pools
    /// are shared memory. `false` (the default) for a byte stream.
    fn places_writes(&self) -> bool {
        false
    }
    /// The `len` bytes at `addr` of the peer's memory, where this side may put a write's
    /// payload itself (a frame read straight into the peer's element) and then post only its
    /// header with [`Channel::post_placed`]. `None` when it does not place writes (the
    /// default) or the bytes lie outside the peer's memory.
    fn peer_window(&self, addr: u64, len: usize) -> Option<SharedBytes<'_>> {
        let _ = (addr, len);
        None
    }
    /// Posts write `op` of `len` bytes whose payload this side already put in the peer's
    /// memory through [`Channel::peer_window`]. A transport that places writes overrides it;
    /// the default, for one that does not and so is never asked, carries `len` zero bytes so
    /// that its stream stays whole.
    fn post_placed(&mut self, op: Op, len: u32) {
        self.post(op, &[], Payload::Bytes(vec![0; len as usize]));
    }
    /// Before the caller sleeps on the channel's readiness: asks to be woken by what the
    /// peer does next. `false`: something may be waiting already, poll again instead. A
    /// socket needs no asking (it is always `true`).
    fn prepare_sleep(&mut self) -> bool {
        true
    }
    /// After the caller woke up: withdraws what [`Channel::prepare_sleep`] asked.
    fn wake(&mut self) {}
    /// After the caller woke up for something else than this channel's readiness: withdraws
    /// what [`Channel::prepare_sleep`] asked, without reading a doorbell that did not wake it
    /// (if it rang, its readiness wakes the caller next, and [`Channel::wake`] reads it).
    fn withdraw(&mut self) {
        self.wake();
    }
    /// For a caller that polls before it sleeps: whether input may be waiting, found
    /// without a system call. A socket cannot tell (always `false`).
    fn input_pending(&mut self) -> bool {
        false
    }
    /// Whether this side rang the peer's doorbell since the last call: the peer was asleep
    /// and is waking up. A socket never rings (always `false`).
    fn take_rang_peer(&mut self) -> bool {
        false
    }
}

/// A [`Channel`] over a non-blocking byte stream (a TCP socket, an in-process pipe).
#[derive(Debug)]
pub struct StreamChannel<S> {
    stream: S,
    rx: RxStream,
    tx: TxQueue,
    /// Whether a read that fills less than it asked for proves the stream empty then
    /// ([`StreamChannel::set_short_read_drains`]).
    short_read_drains: bool,
    /// The last read filled less than it asked for, on a stream where that proves it empty;
    /// until the caller's next wake-up ([`Channel::wake`]), which may be for bytes that came
    /// since.
    drained: bool,
}

impl<S: Read + Write> StreamChannel<S> {
    /// Wraps a non-blocking stream carrying writes by `domain` and SENDs of up to `max_send`.
    pub fn new(stream: S, domain: DomainId, max_send: usize) -> StreamChannel<S> {
        StreamChannel {
            stream,
            rx: RxStream::new(domain, max_send),
            tx: TxQueue::new(),
            short_read_drains: false,
            drained: false,
        }
    }

    /// Says that a read filling less than it asked for proves the stream empty at that
    /// moment (`readv(2)` on a TCP or Unix stream socket without passed descriptors; not a
    /// stream that hands out one record at a time). Then, until the caller's next wake-up
    /// ([`Channel::wake`], which it must call on each wake-up by the stream's readiness),
    /// a [`Channel::poll_recv`] with nothing decoded left says the stream is empty without
    /// another read: one read call per wake-up spared, as tokio does for its sockets. An
    /// edge-triggered reactor reports the bytes that came since the short read.
    pub fn set_short_read_drains(&mut self, yes: bool) {
        self.short_read_drains = yes;
        self.drained = false;
    }

    /// The underlying stream.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// Changes the protection domain whose writes this channel carries (set once the
    /// handshake has named the session).
    pub fn set_domain(&mut self, domain: DomainId) {
        self.rx.set_domain(domain);
    }

    /// Gives the stream back (between messages, e.g. after a handshake).
    pub fn into_stream(self) -> S {
        self.stream
    }

    /// Gives the stream back with the bytes already read from it and not yet decoded
    /// (between messages): they belong to whatever reads the stream next.
    pub fn into_parts(mut self) -> (S, Vec<u8>) {
        let unread = self.rx.take_unread();
        (self.stream, unread)
    }

    /// Changes the largest SEND accepted (between messages: a connection accepts only a
    /// Hello until its handshake is done, so a half-open one costs little memory).
    pub fn set_max_send(&mut self, max_send: usize) {
        self.rx.set_max_send(max_send);
    }

    /// The underlying stream, mutably (tests inject raw bytes through it).
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }
}

impl<S: Read + Write> Channel for StreamChannel<S> {
    fn post(&mut self, op: Op, prefix: &[u8], payload: Payload) {
        self.tx.post(op, prefix, payload);
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        while !self.tx.is_empty() {
            let mut iov = [IoSlice::new(&[]); IOV_BATCH];
            let n = self.tx.gather(&mut iov);
            match self.stream.write_vectored(&iov[..n]) {
                Ok(0) => return Err(ChannelError::Closed),
                Ok(k) => self.tx.advance(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(true)
    }

    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        loop {
            if let Some(c) = self.rx.poll_staged(reg)? {
                return Ok(Some(c));
            }
            if std::mem::take(&mut self.drained) {
                return Ok(None);
            }
            let (payload, ahead) = self.rx.buffers(reg);
            let asked = payload.len() + ahead.len();
            let mut iov = [IoSliceMut::new(payload), IoSliceMut::new(ahead)];
            let k = if iov[1].is_empty() { 1 } else { 2 };
            match self.stream.read_vectored(&mut iov[..k]) {
                Ok(0) => return Err(ChannelError::Closed),
                Ok(n) => {
                    self.drained = self.short_read_drains && n < asked;
                    if let Some(c) = self.rx.advance(n, reg)? {
                        return Ok(Some(c));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn received(&self) -> &[u8] {
        self.rx.received()
    }

    fn reclaim(&mut self, cache: &mut SendBufCache) {
        self.tx.reclaim(cache);
    }

    /// A wake-up by the stream's readiness may be for bytes that came after the last short
    /// read: the next poll reads.
    fn wake(&mut self) {
        self.drained = false;
    }

    fn pending(&self) -> usize {
        self.tx.queued_bytes()
    }

    fn held_bytes(&self) -> usize {
        self.tx.held_bytes()
    }

    fn set_writes_allowed(&mut self, allowed: bool) {
        self.rx.set_writes_allowed(allowed);
    }

    fn close(&mut self, reg: &mut Registry) -> usize {
        self.rx.abort(reg);
        self.tx.clear()
    }
}
