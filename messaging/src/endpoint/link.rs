//! A connected peer: a [`Session`] with its control and data channels.
//!
//! This is the loop body both daemons, the tests and the benchmarks share: it turns channel
//! completions into session input, hands delivered frames to a sink and releases them, and
//! posts what the session wants sent. It performs no I/O of its own beyond the channels'
//! non-blocking reads and writes, and it never waits.

use super::error::ProtocolError;
use super::initiator::Posted;
use super::outbox::Lane;
use super::session::{Batch, InPlace, Incoming, Session};
use super::target::PoolGetOutcome;
use crate::adapter::{Channel, ChannelError, Op, Payload, RxCompletion, RxError};
use crate::memory::{Frame, Registry, SendBuf, SendBufCache, SharedBytes};
use crate::wire::{CfgCode, ErrorCode, Goodbye, Message};
use thiserror::Error;

/// Why a link failed. Either way the peer's connection is closed; nothing else is affected.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The channel failed, closed, or the adapter refused an operation.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
}

impl LinkError {
    /// The code this side sends in a Goodbye (on the control channel) before it closes the
    /// session: the code of the error table row ([`LinkError::row`]). `None` for a
    /// transport failure or a close by the peer: there is nobody left to tell.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            LinkError::Protocol(p) => Some(p.code()),
            LinkError::Channel(ChannelError::Rx(RxError::Protection(_)))
            | LinkError::Channel(ChannelError::Rx(RxError::WriteNotAllowed)) => {
                Some(ErrorCode::Protection)
            }
            LinkError::Channel(ChannelError::Rx(_)) => Some(ErrorCode::Malformed),
            LinkError::Channel(_) => None,
        }
    }

    /// The row of the error table (docs/protocol.md, section 7), `None` for a transport
    /// failure.
    pub fn row(&self) -> Option<&'static str> {
        Some(match self {
            LinkError::Protocol(p) => p.row(),
            LinkError::Channel(ChannelError::Rx(RxError::Op(_))) => "E1",
            LinkError::Channel(ChannelError::Rx(RxError::SendTooLong { .. })) => "E2",
            LinkError::Channel(ChannelError::Rx(RxError::Protection(_))) => "E3",
            LinkError::Channel(ChannelError::Rx(RxError::WriteNotAllowed)) => "E4",
            LinkError::Channel(_) => return None,
        })
    }

    /// True for a protection error (rows E3 and E4), counted apart from protocol errors.
    pub fn is_protection(&self) -> bool {
        self.code() == Some(ErrorCode::Protection)
    }
}

/// Something the shell must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// Credits arrived: resume a source held back by backpressure.
    Credits,
    /// A CfgUtilRequest to answer with [`Session::cfg_reply`].
    CfgRequest {
        /// Transaction context to echo.
        txn: u64,
        /// Request code.
        code: CfgCode,
        /// Request data.
        data: Vec<u8>,
    },
    /// A CfgUtilReply.
    CfgReply {
        /// Transaction context of the request.
        txn: u64,
        /// Request code.
        code: CfgCode,
        /// Status.
        status: ErrorCode,
        /// Reply data.
        data: Vec<u8>,
    },
    /// A BufferRecvPoolGet was answered or declined.
    PoolGet(PoolGetOutcome),
    /// A flush step completed; `complete` when nothing of either side remains.
    Flushed {
        /// Every pool flushed.
        complete: bool,
    },
    /// The peer said goodbye.
    Goodbye(ErrorCode),
    /// A frame the peer sent inline although one of our pools could hold it (longer than
    /// [`crate::wire::MAX_INLINE`]): refused, for the shell to count.
    RefusedInline {
        /// Bytes of the frame.
        len: usize,
    },
}

/// Frame and byte counters of a link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames received from the peer.
    pub rx_frames: u64,
    /// Bytes received from the peer.
    pub rx_bytes: u64,
    /// Frames posted to the peer.
    pub tx_frames: u64,
    /// Bytes posted to the peer.
    pub tx_bytes: u64,
    /// Frames sent inline as SendData.
    pub tx_inline: u64,
    /// Frames read straight into the peer's element (over shared memory).
    pub tx_in_place: u64,
    /// Times a frame met backpressure (no credit).
    pub tx_backpressure: u64,
    /// Frames refused as too large.
    pub tx_too_large: u64,
    /// Frames sent in the express lane (SendData on the control channel, of those counted
    /// in `tx_frames`).
    pub tx_express: u64,
    /// Frames received in the express lane (of those counted in `rx_frames`).
    pub rx_express: u64,
    /// BufferRecvPoolUpdate messages sent (credits returned to the peer).
    pub tx_credit_updates: u64,
}

impl std::ops::AddAssign for LinkStats {
    /// Adds another connection's counters (totals across reconnects).
    fn add_assign(&mut self, o: LinkStats) {
        self.rx_frames += o.rx_frames;
        self.rx_bytes += o.rx_bytes;
        self.tx_frames += o.tx_frames;
        self.tx_bytes += o.tx_bytes;
        self.tx_inline += o.tx_inline;
        self.tx_in_place += o.tx_in_place;
        self.tx_backpressure += o.tx_backpressure;
        self.tx_too_large += o.tx_too_large;
        self.tx_express += o.tx_express;
        self.rx_express += o.rx_express;
        self.tx_credit_updates += o.tx_credit_updates;
    }
}

/// A connected peer.
#[derive(Debug)]
pub struct Link<C> {
    session: Session,
    ctrl: C,
    data: C,
    stats: LinkStats,
}

impl<C: Channel> Link<C> {
    /// A link over two connected channels (handshake done). The control channel refuses
    /// RDMA writes from now on.
    pub fn new(session: Session, mut ctrl: C, data: C) -> Link<C> {
        ctrl.set_writes_allowed(false);
        Link {
            session,
            ctrl,
            data,
            stats: LinkStats::default(),
        }
    }

    /// The protocol state.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The protocol state, mutably.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Counters.
    pub fn stats(&self) -> LinkStats {
        LinkStats {
            tx_credit_updates: self.session.target().credit_updates(),
            ..self.stats
        }
    }

    /// The channel carrying `lane`.
    pub fn channel(&self, lane: Lane) -> &C {
        match lane {
            Lane::Control => &self.ctrl,
            Lane::Data => &self.data,
        }
    }

    /// Before sleeping on `lane`'s readiness ([`Channel::prepare_sleep`]): `false` when it
    /// should be polled again first.
    pub fn prepare_sleep(&mut self, lane: Lane) -> bool {
        match lane {
            Lane::Control => self.ctrl.prepare_sleep(),
            Lane::Data => self.data.prepare_sleep(),
        }
    }

    /// After waking on `lane` ([`Channel::wake`]).
    pub fn wake(&mut self, lane: Lane) {
        match lane {
            Lane::Control => self.ctrl.wake(),
            Lane::Data => self.data.wake(),
        }
    }

    /// After waking for something else than `lane` ([`Channel::withdraw`]).
    pub fn withdraw(&mut self, lane: Lane) {
        match lane {
            Lane::Control => self.ctrl.withdraw(),
            Lane::Data => self.data.withdraw(),
        }
    }

    /// The control channel, mutably (tests inject raw operations through it).
    pub fn control_channel_mut(&mut self) -> &mut C {
        &mut self.ctrl
    }

    /// The data channel, mutably (tests inject raw operations through it; a shell that polls
    /// before sleeping asks it [`Channel::input_pending`] and [`Channel::take_rang_peer`]).
    pub fn data_channel_mut(&mut self) -> &mut C {
        &mut self.data
    }

    /// Processes up to `budget` completions of `lane`. Frames go to `sink` (in a pool in shared
    /// memory, a frame stays there: see [`Frame`]) and are released
    /// when it returns. Returns true if the budget ran out before the channel was drained.
    pub fn poll(
        &mut self,
        reg: &mut Registry,
        lane: Lane,
        budget: usize,
        sink: &mut dyn FnMut(Frame<'_>),
        events: &mut Vec<LinkEvent>,
    ) -> Result<bool, LinkError> {
        let Link {
            session,
            ctrl,
            data,
            stats,
        } = self;
        let ch = match lane {
            Lane::Control => ctrl,
            Lane::Data => data,
        };
        for _ in 0..budget {
            let Some(completion) = ch.poll_recv(reg)? else {
                return Ok(false);
            };
            let delivery = match completion {
                RxCompletion::Recv { .. } => match session.on_message(reg, lane, ch.received())? {
                    Incoming::Handled => None,
                    Incoming::Inline(frame) => {
                        stats.rx_frames += 1;
                        stats.rx_bytes += frame.len() as u64;
                        stats.rx_express += u64::from(lane == Lane::Control);
                        sink(Frame::Private(frame));
                        None
                    }
                    Incoming::Placed(d) => Some(d),
                    Incoming::Credits => {
                        events.push(LinkEvent::Credits);
                        None
                    }
                    Incoming::CfgRequest { txn, code, data } => {
                        events.push(LinkEvent::CfgRequest {
                            txn,
                            code,
                            data: data.to_vec(),
                        });
                        None
                    }
                    Incoming::CfgReply {
                        txn,
                        code,
                        status,
                        data,
                    } => {
                        events.push(LinkEvent::CfgReply {
                            txn,
                            code,
                            status,
                            data: data.to_vec(),
                        });
                        None
                    }
                    Incoming::PoolGet(o) => {
                        events.push(LinkEvent::PoolGet(o));
                        None
                    }
                    Incoming::Flushed { complete } => {
                        events.push(LinkEvent::Flushed { complete });
                        None
                    }
                    Incoming::Goodbye(code) => {
                        events.push(LinkEvent::Goodbye(code));
                        None
                    }
                    Incoming::RefusedInline { len } => {
                        events.push(LinkEvent::RefusedInline { len });
                        None
                    }
                },
                RxCompletion::Write {
                    handle,
                    element,
                    len,
                    imm,
                } => session.on_write(handle, element, len, imm)?,
            };
            if let Some(d) = delivery {
                stats.rx_frames += 1;
                stats.rx_bytes += u64::from(d.len);
                sink(session.frame(reg, &d));
                session.release(reg, d);
            }
        }
        Ok(true)
    }

    /// Routes and posts one frame. Backpressure and too-large frames are handed back.
    pub fn post_frame(&mut self, buf: SendBuf) -> Posted {
        let len = buf.len() as u64;
        let posted = self.session.post_frame(&mut self.data, buf);
        match &posted {
            Posted::SendData => {
                self.stats.tx_inline += 1;
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += len;
            }
            Posted::Rdma => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += len;
            }
            Posted::Backpressure(_) => self.stats.tx_backpressure += 1,
            Posted::TooLarge(_) => self.stats.tx_too_large += 1,
        }
        posted
    }

    /// Sends a frame in the express lane: SendData on the control channel, where no bulk
    /// frame waits (docs/protocol.md 6.6; only once the peer agreed to EXPRESS). At most
    /// [`crate::wire::MAX_INLINE`] bytes, or the peer may refuse it (N1).
    pub fn post_express(&mut self, buf: SendBuf) {
        let len = buf.len();
        self.session.post_express(&mut self.ctrl, buf);
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += len as u64;
        self.stats.tx_express += 1;
    }

    /// Bytes of the express lane waiting to be written (its control channel's).
    pub fn express_pending(&self) -> usize {
        self.ctrl.pending()
    }

    /// Whether frames can be read straight into the peer's memory
    /// ([`Link::read_in_place`]): its data channel places writes.
    pub fn places_writes(&self) -> bool {
        self.data.places_writes()
    }

    /// Reads a frame straight into the peer's memory over shared memory and posts its write,
    /// or sends it in the express lane where `express` says so (see
    /// [`Session::read_in_place`]); a frame posted is counted as sent, one dropped as too
    /// large.
    pub fn read_in_place<E>(
        &mut self,
        size: u32,
        read: impl FnOnce(&SharedBytes<'_>) -> Result<usize, E>,
        express: impl FnOnce(&SharedBytes<'_>, usize) -> bool,
    ) -> Option<InPlace<E>> {
        let got = self
            .session
            .read_in_place(&mut self.data, &mut self.ctrl, size, read, express);
        match got {
            Some(InPlace::Express(n)) => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += n as u64;
                self.stats.tx_express += 1;
            }
            Some(InPlace::Posted(n)) => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += n as u64;
                self.stats.tx_in_place += 1;
            }
            Some(InPlace::Inline(n)) => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += n as u64;
                self.stats.tx_inline += 1;
            }
            Some(InPlace::Dropped(_)) => self.stats.tx_too_large += 1,
            _ => {}
        }
        got
    }

    /// Reads up to `max` frames straight into the peer's memory over shared memory and posts
    /// their writes, or sends them in the express lane where `express` says so (see
    /// [`Session::read_batch_in_place`]); frames posted are counted as sent, frames cut
    /// short as too large.
    pub fn read_batch_in_place<E>(
        &mut self,
        size: u32,
        max: usize,
        read: impl FnOnce(&[SharedBytes<'_>], &mut [usize]) -> Result<usize, E>,
        express: impl FnMut(&SharedBytes<'_>, usize) -> bool,
    ) -> Option<Result<Batch, E>> {
        let got = self.session.read_batch_in_place(
            &mut self.data,
            &mut self.ctrl,
            size,
            max,
            read,
            express,
        );
        if let Some(Ok(b)) = &got {
            self.stats.tx_frames += b.posted as u64;
            self.stats.tx_bytes += b.bytes;
            self.stats.tx_in_place += (b.posted - b.inline - b.express) as u64;
            self.stats.tx_inline += b.inline as u64;
            self.stats.tx_express += b.express as u64;
            self.stats.tx_too_large += b.dropped as u64;
        }
        got
    }

    /// Posts the session's queued messages and flushes both channels (the doorbell).
    /// Returns true when everything was written.
    pub fn flush(&mut self) -> Result<bool, LinkError> {
        while let Some((lane, msg)) = self.session.poll_transmit() {
            let ch = match lane {
                Lane::Control => &mut self.ctrl,
                Lane::Data => &mut self.data,
            };
            ch.post(Op::Send, &[], Payload::Bytes(msg));
        }
        let c = self.ctrl.flush()?;
        let d = self.data.flush()?;
        Ok(c && d)
    }

    /// Ends the session after `err`: queues a Goodbye with its code on the control channel
    /// (behind what is already queued there) and writes what the socket takes now. Returns
    /// the code sent, `None` when the error leaves nobody to tell. Close the link after.
    pub fn fail(&mut self, err: &LinkError) -> Option<ErrorCode> {
        let code = err.code()?;
        self.goodbye(code);
        Some(code)
    }

    /// Queues a Goodbye with `code` on the control channel (behind what is already queued
    /// there) and writes what the socket takes now; close the link after.
    pub fn goodbye(&mut self, code: ErrorCode) {
        self.session
            .send(Lane::Control, &Message::Goodbye(Goodbye { code }));
        let _ = self.flush();
    }

    /// Bytes queued by the session or posted, and not yet written, on either channel.
    pub fn pending(&self) -> usize {
        self.session.queued_bytes() + self.ctrl.pending() + self.data.pending()
    }

    /// Bytes of `lane` posted and not yet written (after [`Link::flush`] moved the
    /// session's messages onto the channels).
    pub fn pending_on(&self, lane: Lane) -> usize {
        self.channel(lane).pending()
    }

    /// Returns sent buffers to `cache`.
    pub fn reclaim(&mut self, cache: &mut SendBufCache) {
        self.data.reclaim(cache);
        self.ctrl.reclaim(cache);
    }

    /// Bytes of send buffers (their capacity) the link holds: queued frames, or written and
    /// not yet reclaimed.
    pub fn held_bytes(&self) -> usize {
        self.ctrl.held_bytes() + self.data.held_bytes()
    }

    /// Tears the link down: channels closed first (aborting writes in flight), every send
    /// buffer they held returned to `cache`, then every pool of the peer's domain freed.
    /// Returns the frames posted and never delivered, for the caller to count as lost.
    pub fn close(&mut self, reg: &mut Registry, cache: &mut SendBufCache) -> usize {
        let lost = self.ctrl.close(reg) + self.data.close(reg);
        self.reclaim(cache);
        self.session.teardown(reg);
        lost
    }
}
