//! One peer connection's protocol state: our pools (target), the peer's pools (initiator),
//! and the dispatch of every message received after the handshake.
//!
//! Order of use, per readiness event of the shell:
//! 1. feed completions: [`Session::on_message`] for each received SEND, [`Session::on_write`]
//!    for each placed RDMA write;
//! 2. consume delivered frames ([`Session::frame`]) and [`Session::release`] them;
//! 3. post outgoing frames with [`Session::post_frame`];
//! 4. drain [`Session::poll_transmit`] onto the channels, then flush the channels.

use super::error::ProtocolError;
use super::initiator::{send_data_prefix, Element, Initiator, InitiatorConfig, Posted};
use super::outbox::{Lane, Outbox};
use super::target::{Delivery, PoolGetOutcome, PoolSpec, Target, TargetConfig};
use crate::adapter::{Channel, Op, Payload};
use crate::memory::{DomainId, Frame, Handle, Registry, RegistryError, SendBuf, SharedBytes};
use crate::wire::{self, CfgCode, ErrorCode, Message};

/// Configuration of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Pools advertised to the peer when the session starts.
    pub advertise: Vec<PoolSpec>,
    /// Target-side limits.
    pub target: TargetConfig,
    /// Initiator-side limits.
    pub initiator: InitiatorConfig,
}

/// What became of a frame read straight into the peer's element
/// ([`Session::read_in_place`]).
#[derive(Debug, PartialEq, Eq)]
pub enum InPlace<E> {
    /// Read, `n` bytes, and its write posted.
    Posted(usize),
    /// Read, `n` bytes, few enough for SendData: copied into one, and the element went
    /// back (a small frame costs no element and no credit, as on the send-buffer path).
    Inline(usize),
    /// Read, `n` bytes, and sent in the express lane (SendData on the control channel):
    /// copied out, and the element went back.
    Express(usize),
    /// The read found nothing; the element went back.
    Empty,
    /// The read said the frame had more bytes than the element holds (it was cut short), so
    /// it was dropped and the element went back.
    Dropped(usize),
    /// The read failed; the element went back.
    Failed(E),
}

/// What [`Session::read_batch_in_place`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batch {
    /// Elements offered to the read.
    pub offered: usize,
    /// Frames the read took (fewer than offered: it ran out of frames).
    pub read: usize,
    /// Frames posted: their writes, or SendData for those few enough for it.
    pub posted: usize,
    /// Of those, the ones sent inline (copied; their elements went back).
    pub inline: usize,
    /// Of those, the ones sent in the express lane (copied onto the control channel; their
    /// elements went back).
    pub express: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Frames the read said were longer than their element (cut short): dropped.
    pub dropped: usize,
}

/// What a received message means for the shell.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming<'a> {
    /// Handled inside (buffer management); nothing to do.
    Handled,
    /// New credits arrived: a source held back by backpressure may resume.
    Credits,
    /// A frame delivered inline (SendData); valid until the next receive.
    Inline(&'a [u8]),
    /// A SendData of `len` bytes longer than [`wire::MAX_INLINE`] that one of our pools
    /// could have held, a pool the peer already wrote into (so it knew it): not delivered
    /// (the shell counts it).
    RefusedInline {
        /// Bytes of the frame.
        len: usize,
    },
    /// A frame placed in one of our elements.
    Placed(Delivery),
    /// A CfgUtilRequest for the shell to answer with [`Session::cfg_reply`].
    CfgRequest {
        /// Transaction context to echo.
        txn: u64,
        /// Request code.
        code: CfgCode,
        /// Request data.
        data: &'a [u8],
    },
    /// A CfgUtilReply to one of our requests.
    CfgReply {
        /// Transaction context of our request.
        txn: u64,
        /// Request code.
        code: CfgCode,
        /// Status.
        status: ErrorCode,
        /// Reply data.
        data: &'a [u8],
    },
    /// A BufferRecvPoolGet was answered or declined.
    PoolGet(PoolGetOutcome),
    /// A flush finished: ours (every pool freed, our flush confirmed) if `complete`.
    Flushed {
        /// True when no pool of either side remains in use.
        complete: bool,
    },
    /// The peer is leaving.
    Goodbye(ErrorCode),
}

/// The protocol state of one peer connection.
#[derive(Debug)]
pub struct Session {
    domain: DomainId,
    config: SessionConfig,
    target: Target,
    initiator: Initiator,
    outbox: Outbox,
}

impl Session {
    /// A session with the peer in protection domain `domain`.
    pub fn new(domain: DomainId, config: SessionConfig) -> Session {
        Session {
            domain,
            target: Target::new(domain, config.target.clone()),
            initiator: Initiator::new(config.initiator.clone()),
            outbox: Outbox::new(),
            config,
        }
    }

    /// The peer's protection domain.
    pub fn domain(&self) -> DomainId {
        self.domain
    }

    /// Registers and advertises the configured pools.
    pub fn start(&mut self, reg: &mut Registry) -> Result<(), RegistryError> {
        for spec in self.config.advertise.clone() {
            self.target.advertise(reg, spec, &mut self.outbox)?;
        }
        Ok(())
    }

    /// Target side (our pools).
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Initiator side (the peer's pools).
    pub fn initiator(&self) -> &Initiator {
        &self.initiator
    }

    /// Initiator side, mutably (to take its completion counts).
    pub fn initiator_mut(&mut self) -> &mut Initiator {
        &mut self.initiator
    }

    /// Handles one received message (the payload of a SEND on `lane`).
    ///
    /// The lane tells the two flush directions apart (pool references of the two sides
    /// overlap): a target's BufferPoolFlushRequest and its reply travel on the control
    /// channel, an initiator's on the data channel, behind its writes.
    pub fn on_message<'a>(
        &mut self,
        reg: &mut Registry,
        lane: Lane,
        bytes: &'a [u8],
    ) -> Result<Incoming<'a>, ProtocolError> {
        let (header, msg) = Message::parse(bytes)?;
        let txn = header.txn;
        Ok(match msg {
            Message::Hello(_)
            | Message::HelloReply(_)
            | Message::AuthHello(_)
            | Message::AuthReply(_) => {
                return Err(ProtocolError::Unexpected {
                    function: header.function,
                    why: "handshake already complete",
                })
            }
            Message::Keepalive => Incoming::Handled,
            Message::Goodbye(g) => Incoming::Goodbye(g.code),
            Message::BufferRecvPool(entries) => {
                self.initiator.on_pools(&entries)?;
                Incoming::Credits
            }
            Message::BufferRecvPoolGet(get) => {
                Incoming::PoolGet(self.target.on_pool_get(reg, txn, &get, &mut self.outbox))
            }
            Message::BufferRecvPoolUpdate(runs) => {
                self.initiator.on_update(&runs)?;
                Incoming::Credits
            }
            Message::BufferPoolFlushRequest(refs) => {
                match lane {
                    // The peer as initiator stopped using our pools.
                    Lane::Data => {
                        self.target
                            .on_flush_request(reg, txn, &refs, &mut self.outbox)?
                    }
                    // The peer as target wants its pools back: what was in flight in
                    // them no longer counts (a sender waiting on its byte limit may go).
                    Lane::Control => {
                        self.initiator
                            .on_flush_request(txn, &refs, &mut self.outbox);
                        return Ok(Incoming::Credits);
                    }
                }
                Incoming::Handled
            }
            Message::BufferPoolFlushReply => {
                let done = match lane {
                    Lane::Data => self.target.on_flush_reply(reg, txn),
                    Lane::Control => self.initiator.on_flush_reply(txn),
                };
                if !done {
                    return Err(ProtocolError::Unexpected {
                        function: header.function,
                        why: "no flush with this transaction context",
                    });
                }
                Incoming::Flushed {
                    complete: self.is_flushed(),
                }
            }
            Message::SendData(frame)
                if frame.len() > wire::MAX_INLINE
                    && self.target.largest_element() >= frame.len() as u64 =>
            {
                Incoming::RefusedInline { len: frame.len() }
            }
            Message::SendData(frame) => Incoming::Inline(frame),
            Message::BufferRdmaIndicate(ind) => Incoming::Placed(self.target.on_indicate(&ind)?),
            Message::CfgUtilRequest(req) => Incoming::CfgRequest {
                txn,
                code: req.code,
                data: req.data,
            },
            Message::CfgUtilReply(rep) => Incoming::CfgReply {
                txn,
                code: rep.code,
                status: rep.status,
                data: rep.data,
            },
        })
    }

    /// Handles an RDMA write the adapter placed in one of our pools.
    pub fn on_write(
        &mut self,
        handle: Handle,
        element: u32,
        len: u32,
        imm: Option<u32>,
    ) -> Result<Option<Delivery>, ProtocolError> {
        self.target.on_write(handle, element, len, imm)
    }

    /// The bytes of a delivered frame.
    pub fn frame<'r>(&self, reg: &'r Registry, d: &Delivery) -> Frame<'r> {
        self.target.frame(reg, d)
    }

    /// The consumer is done with a delivered frame.
    pub fn release(&mut self, reg: &mut Registry, d: Delivery) {
        self.target.release(reg, d, &mut self.outbox);
    }

    /// Returns freed credits now.
    pub fn flush_credits(&mut self, reg: &mut Registry) {
        self.target.flush_credits(reg, &mut self.outbox);
    }

    /// Returns freed credits where the peer may be waiting for them (call at the end of a
    /// wake-up; see [`Target::flush_idle`]).
    pub fn flush_idle(&mut self, reg: &mut Registry) {
        self.target.flush_idle(reg, &mut self.outbox);
    }

    /// Routes a frame and posts it on the data channel.
    pub fn post_frame<C: Channel>(&mut self, data: &mut C, buf: SendBuf) -> Posted {
        self.initiator.post_frame(data, buf, &mut self.outbox)
    }

    /// Posts a frame as SendData on the control channel `ctrl`: the express lane.
    pub fn post_express<C: Channel>(&mut self, ctrl: &mut C, buf: SendBuf) {
        ctrl.post(Op::Send, &send_data_prefix(buf.len()), Payload::Buf(buf));
    }

    /// Reads a frame straight into an element of the peer's of at least `size` bytes and
    /// posts its write, over a transport whose peer's pools are shared memory: `read` gets
    /// the element's bytes ([`Channel::peer_window`]) and says how many the frame had;
    /// `express` is then asked, with the element's bytes and the frame's length, whether
    /// the frame takes the express lane: copied out, posted as SendData on `ctrl`, and the
    /// element goes back. `None` when the transport does not place writes or no such
    /// element is free (a quarter of each pool stays for frames read the other way); else
    /// what became of it.
    pub fn read_in_place<C: Channel, E>(
        &mut self,
        data: &mut C,
        ctrl: &mut C,
        size: u32,
        read: impl FnOnce(&SharedBytes<'_>) -> Result<usize, E>,
        express: impl FnOnce(&SharedBytes<'_>, usize) -> bool,
    ) -> Option<InPlace<E>> {
        if !data.places_writes() {
            return None;
        }
        let taken = self.initiator.take_element(size)?;
        let (got, copied) = match data.peer_window(taken.addr, taken.size as usize) {
            Some(window) => {
                let got = read(&window);
                let copied = match got {
                    Ok(n) if n > 0 && n <= taken.size as usize && express(&window, n) => {
                        copy_frame(&window, n)
                    }
                    _ => None,
                };
                (got, copied)
            }
            None => {
                self.initiator.untake(taken);
                return None;
            }
        };
        if let Some(frame) = copied {
            let n = frame.len();
            self.send_express(ctrl, taken, frame);
            return Some(InPlace::Express(n));
        }
        Some(match got {
            Ok(0) => {
                self.initiator.untake(taken);
                InPlace::Empty
            }
            Ok(n) => match self.post_read(data, taken, n) {
                Some(true) => InPlace::Inline(n),
                Some(false) => InPlace::Posted(n),
                None => InPlace::Dropped(n),
            },
            Err(e) => {
                self.initiator.untake(taken);
                InPlace::Failed(e)
            }
        })
    }

    /// Posts the `len` bytes read into `taken`: as SendData when few enough for it (then
    /// `Some(true)`), else as its placed write (`Some(false)`); `None` when dropped (longer
    /// than the element, or unreadable).
    fn post_read<C: Channel>(&mut self, data: &mut C, taken: Element, len: usize) -> Option<bool> {
        let inline = self.initiator.goes_inline(len);
        let posted = if inline {
            self.post_inline(data, taken, len)
        } else {
            self.initiator.post_placed(data, taken, len)
        };
        posted.then_some(inline)
    }

    /// Posts the `len` bytes read into `taken` as SendData, copied out of the element, which
    /// goes back. False when the element's bytes cannot be read (nothing posted).
    fn post_inline<C: Channel>(&mut self, data: &mut C, taken: Element, len: usize) -> bool {
        let frame = data
            .peer_window(taken.addr, len)
            .and_then(|w| copy_frame(&w, len));
        self.initiator.untake(taken);
        let copied = frame.is_some();
        if let Some(frame) = frame {
            data.post(Op::Send, &send_data_prefix(len), Payload::Bytes(frame));
        }
        copied
    }

    /// Sends `frame`, copied out of `taken`, in the express lane (SendData on `ctrl`); the
    /// element goes back.
    fn send_express<C: Channel>(&mut self, ctrl: &mut C, taken: Element, frame: Vec<u8>) {
        self.initiator.untake(taken);
        ctrl.post(
            Op::Send,
            &send_data_prefix(frame.len()),
            Payload::Bytes(frame),
        );
    }

    /// Reads up to `max` frames straight into free elements of the peer's of at least `size`
    /// bytes each, as [`Session::read_in_place`] does one: `read` gets the elements' bytes,
    /// fills as many as it has frames (their lengths into its second argument, in order; 0
    /// for a frame that is not to be posted) and says how many it read; `express`, asked of
    /// each frame in order, sends it in the express lane on `ctrl` instead. `None` when the
    /// transport does not place writes or no such element is free; else what became of the
    /// frames, or the read's error. Every element not posted in place goes back.
    pub fn read_batch_in_place<C: Channel, E>(
        &mut self,
        data: &mut C,
        ctrl: &mut C,
        size: u32,
        max: usize,
        read: impl FnOnce(&[SharedBytes<'_>], &mut [usize]) -> Result<usize, E>,
        mut express: impl FnMut(&SharedBytes<'_>, usize) -> bool,
    ) -> Option<Result<Batch, E>> {
        if !data.places_writes() {
            return None;
        }
        let taken: Vec<_> = std::iter::from_fn(|| self.initiator.take_element(size))
            .take(max)
            .collect();
        if taken.is_empty() {
            return None;
        }
        let mut lens = vec![0usize; taken.len()];
        let windows: Option<Vec<SharedBytes<'_>>> = taken
            .iter()
            .map(|t| data.peer_window(t.addr, t.size as usize))
            .collect();
        let got = match windows {
            Some(w) => read(&w, &mut lens).map(|n| n.min(w.len())),
            None => {
                taken.into_iter().for_each(|t| self.initiator.untake(t));
                return None;
            }
        };
        let n = match got {
            Ok(n) => n,
            Err(e) => {
                taken.into_iter().for_each(|t| self.initiator.untake(t));
                return Some(Err(e));
            }
        };
        let mut batch = Batch {
            offered: taken.len(),
            read: n,
            ..Batch::default()
        };
        for (i, (t, &len)) in taken.into_iter().zip(&lens).enumerate() {
            if i >= n || len == 0 {
                self.initiator.untake(t);
                continue;
            }
            if len <= t.size as usize {
                if let Some(frame) = data
                    .peer_window(t.addr, len)
                    .filter(|w| express(w, len))
                    .and_then(|w| copy_frame(&w, len))
                {
                    self.send_express(ctrl, t, frame);
                    batch.posted += 1;
                    batch.express += 1;
                    batch.bytes += len as u64;
                    continue;
                }
            }
            match self.post_read(data, t, len) {
                Some(inline) => {
                    batch.posted += 1;
                    batch.inline += usize::from(inline);
                    batch.bytes += len as u64;
                }
                None => batch.dropped += 1,
            }
        }
        Some(Ok(batch))
    }

    /// Queues a CfgUtilRequest; returns its transaction context.
    pub fn cfg_request(&mut self, code: CfgCode, data: &[u8]) -> u64 {
        let txn = self.outbox.txn();
        self.outbox.push(
            Lane::Control,
            txn,
            &Message::CfgUtilRequest(crate::wire::CfgRequest { code, data }),
        );
        txn
    }

    /// Queues the CfgUtilReply to request `txn`.
    pub fn cfg_reply(&mut self, txn: u64, code: CfgCode, status: ErrorCode, data: &[u8]) {
        self.outbox.push(
            Lane::Control,
            txn,
            &Message::CfgUtilReply(crate::wire::CfgReply { code, status, data }),
        );
    }

    /// Queues a message of the shell's own (keepalive, goodbye).
    pub fn send(&mut self, lane: Lane, msg: &Message<'_>) {
        let txn = self.outbox.txn();
        self.outbox.push(lane, txn, msg);
    }

    /// Starts a graceful shutdown: flush our pools (the peer must confirm it stopped
    /// writing) and stop using the peer's. Done when [`Session::is_flushed`].
    pub fn start_flush(&mut self, reg: &mut Registry) {
        let refs = self.target.pool_refs();
        if !refs.is_empty() {
            self.target.start_flush(reg, &refs, &mut self.outbox);
        }
        self.initiator.start_flush_all(&mut self.outbox);
    }

    /// True when none of our pools is left and our flush of the peer's pools was confirmed.
    pub fn is_flushed(&self) -> bool {
        self.target.is_empty() && !self.initiator.flush_pending()
    }

    /// Bytes of the messages queued and not yet taken by [`Session::poll_transmit`].
    pub fn queued_bytes(&self) -> usize {
        self.outbox.bytes()
    }

    /// The next message to post, with its channel.
    pub fn poll_transmit(&mut self) -> Option<(Lane, Vec<u8>)> {
        self.outbox.pop()
    }

    /// Frees everything after the connection died (channels already closed).
    pub fn teardown(&mut self, reg: &mut Registry) {
        self.target.teardown(reg);
        self.initiator.reset();
        while self.outbox.pop().is_some() {}
    }
}

/// The first `len` bytes of `w`, copied out of the peer's memory; `None` when they cannot be
/// read.
fn copy_frame(w: &SharedBytes<'_>, len: usize) -> Option<Vec<u8>> {
    let mut frame = vec![0u8; len];
    w.copy_out(0, &mut frame).is_ok().then_some(frame)
}
