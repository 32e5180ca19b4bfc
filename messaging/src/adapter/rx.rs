//! Receive side of a byte-stream channel: a sans-IO decoder that places RDMA writes.
//!
//! The caller asks [`RxStream::buffers`] where the next bytes from the transport belong,
//! reads into them with one vectored read, and reports the count with
//! [`RxStream::advance`]. While a header is awaited the bytes go to a read-ahead buffer;
//! once a write's header has passed every check of the [`Registry`], the first buffer *is*
//! the rest of the target element, so the payload goes from the socket straight into
//! registered memory, and the second is the read-ahead for what follows. After a large
//! write's payload only the next operation's header is read ahead, so a stream of
//! frames is placed with one read each and no copy; after small operations (credit
//! updates, SendData) a larger read-ahead takes several of them per read, and those bytes
//! are copied once. SEND payloads land in the receive buffer (the posted receive of a real
//! adapter).

use super::op::{Op, OpError, OpHeader, OP_HEADER_LEN};
use crate::memory::{DomainId, Handle, Placement, ProtectionError, Registry};
use thiserror::Error;

/// A completed incoming operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxCompletion {
    /// A SEND arrived; its bytes are [`RxStream::received`] until the next `advance`.
    Recv {
        /// Bytes received.
        len: usize,
    },
    /// An RDMA write was placed.
    Write {
        /// Region written.
        handle: Handle,
        /// Element written.
        element: u32,
        /// Bytes written.
        len: u32,
        /// Immediate data, for RDMA WRITE WITH IMMEDIATE.
        imm: Option<u32>,
    },
}

/// Why the incoming stream cannot continue. Each is fatal to the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RxError {
    /// A malformed operation header.
    #[error(transparent)]
    Op(#[from] OpError),
    /// A write refused by the memory protection checks.
    #[error("protection error: {0}")]
    Protection(#[from] ProtectionError),
    /// An RDMA write on a channel that carries none (the control channel).
    #[error("RDMA write on the control channel")]
    WriteNotAllowed,
    /// An RDMA write carried on a stream into a pool in shared memory, where only the writer
    /// places its bytes (a pool of a shared-memory session named on a socket).
    #[error("RDMA write carried into a pool in shared memory")]
    SharedPool,
    /// A SEND longer than the receive buffer.
    #[error("SEND of {len} bytes exceeds the receive buffer of {max}")]
    SendTooLong {
        /// Declared length.
        len: u32,
        /// Receive buffer size.
        max: usize,
    },
}

#[derive(Debug)]
enum State {
    Header {
        filled: usize,
    },
    Send {
        len: usize,
        filled: usize,
    },
    Write {
        placement: Placement,
        imm: Option<u32>,
        filled: usize,
    },
}

/// Bytes read ahead while a header is awaited, or after a small operation's payload. Small
/// operations (acknowledgements, SendData, credit updates) then arrive several per read; a
/// large write's payload beyond this is read straight into its element, so at most this
/// much of it is ever copied.
const READ_AHEAD: usize = 2048;
/// Writes at least this long are followed by a read-ahead of one operation header only: the
/// next write's payload then goes straight into its element too.
const LARGE_WRITE: u32 = 1024;

/// Incremental decoder of one channel's incoming operations.
#[derive(Debug)]
pub struct RxStream {
    domain: DomainId,
    state: State,
    header: [u8; OP_HEADER_LEN],
    recv: Box<[u8]>,
    received: usize,
    stage: Box<[u8]>,
    stage_pos: usize,
    stage_end: usize,
    /// Bytes of the last [`RxStream::buffers`] that went to the current payload (`None`:
    /// all went to the read-ahead).
    split: Option<usize>,
    writes: bool,
}

impl RxStream {
    /// A decoder for writes by `domain`, accepting SENDs of up to `max_send` bytes.
    pub fn new(domain: DomainId, max_send: usize) -> RxStream {
        RxStream {
            domain,
            state: State::Header { filled: 0 },
            header: [0; OP_HEADER_LEN],
            recv: vec![0u8; max_send].into_boxed_slice(),
            received: 0,
            stage: vec![0u8; READ_AHEAD].into_boxed_slice(),
            stage_pos: 0,
            stage_end: 0,
            split: None,
            writes: true,
        }
    }

    /// Whether RDMA writes are accepted; when not, a write header is refused before a
    /// byte is placed (the control channel carries no writes).
    pub fn set_writes_allowed(&mut self, allowed: bool) {
        self.writes = allowed;
    }

    /// Changes the largest SEND accepted. Takes effect at once unless a SEND is being
    /// received, in which case the buffer keeps its size (call between messages).
    pub fn set_max_send(&mut self, max_send: usize) {
        if !matches!(self.state, State::Send { .. }) && self.recv.len() != max_send {
            self.recv = vec![0u8; max_send].into_boxed_slice();
            self.received = 0;
        }
    }

    /// Changes the protection domain of the writer.
    pub fn set_domain(&mut self, domain: DomainId) {
        self.domain = domain;
    }

    /// Where the next bytes read from the transport go, in order: the rest of the current
    /// payload and the read-ahead that follows it (empty while a header is awaited: then
    /// the first is the read-ahead). Call only once [`RxStream::poll_staged`]
    /// returned `None` (nothing read ahead is left).
    pub fn buffers<'a>(&'a mut self, reg: &'a mut Registry) -> (&'a mut [u8], &'a mut [u8]) {
        let (payload, ahead): (&mut [u8], usize) = match &self.state {
            State::Header { .. } => {
                self.split = None;
                return (&mut self.stage[..], &mut []);
            }
            State::Send { len, filled } => (&mut self.recv[*filled..*len], READ_AHEAD),
            State::Write {
                placement, filled, ..
            } => {
                let dst = reg.placement_mut(placement);
                let filled = (*filled).min(dst.len());
                let ahead = if placement.len >= LARGE_WRITE {
                    OP_HEADER_LEN
                } else {
                    READ_AHEAD
                };
                (&mut dst[filled..], ahead)
            }
        };
        self.split = Some(payload.len());
        // A payload with no room left would read ahead forever without progress: read
        // nothing instead, which the channel reports as the end of the stream.
        let ahead = if payload.is_empty() { 0 } else { ahead };
        (payload, &mut self.stage[..ahead])
    }

    /// Accounts for `n` bytes read into [`RxStream::buffers`]; returns the operation that
    /// completed, if one did (what was read ahead is decoded by [`RxStream::poll_staged`]).
    pub fn advance(
        &mut self,
        n: usize,
        reg: &mut Registry,
    ) -> Result<Option<RxCompletion>, RxError> {
        self.stage_pos = 0;
        match self.split {
            None => {
                self.stage_end = n.min(self.stage.len());
                self.poll_staged(reg)
            }
            Some(first) => {
                let into_payload = n.min(first);
                self.stage_end = (n - into_payload).min(self.stage.len());
                self.filled(into_payload, reg)
            }
        }
    }

    /// Takes out the bytes read and not yet decoded (a header begun, then what was read
    /// ahead), for a stream whose bytes change form after a message (a data channel that
    /// turns sealed after its handshake). Call between operations.
    pub fn take_unread(&mut self) -> Vec<u8> {
        let mut unread = Vec::new();
        if let State::Header { filled } = self.state {
            unread.extend_from_slice(&self.header[..filled]);
            self.state = State::Header { filled: 0 };
        }
        unread.extend_from_slice(&self.stage[self.stage_pos..self.stage_end]);
        self.stage_pos = self.stage_end;
        unread
    }

    /// Decodes bytes read ahead; `None` once they are all consumed.
    pub fn poll_staged(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, RxError> {
        while self.stage_pos < self.stage_end {
            let avail = &self.stage[self.stage_pos..self.stage_end];
            let dst: &mut [u8] = match &self.state {
                State::Header { filled } => &mut self.header[*filled..],
                State::Send { len, filled } => &mut self.recv[*filled..*len],
                State::Write {
                    placement, filled, ..
                } => {
                    let d = reg.placement_mut(placement);
                    let f = (*filled).min(d.len());
                    &mut d[f..]
                }
            };
            let take = dst.len().min(avail.len());
            dst[..take].copy_from_slice(&avail[..take]);
            self.stage_pos += take;
            if let Some(c) = self.filled(take, reg)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// `n` more bytes of the current header or payload are in place.
    fn filled(&mut self, n: usize, reg: &mut Registry) -> Result<Option<RxCompletion>, RxError> {
        match &mut self.state {
            State::Header { filled } => {
                *filled += n;
                if *filled < OP_HEADER_LEN {
                    return Ok(None);
                }
                self.state = State::Header { filled: 0 };
                self.start(reg)
            }
            State::Send { len, filled } => {
                *filled += n;
                if *filled < *len {
                    return Ok(None);
                }
                self.received = *len;
                self.state = State::Header { filled: 0 };
                Ok(Some(RxCompletion::Recv { len: self.received }))
            }
            State::Write {
                placement,
                imm,
                filled,
            } => {
                *filled += n;
                if *filled < placement.len as usize {
                    return Ok(None);
                }
                let done = Self::finish(reg, placement, *imm);
                self.state = State::Header { filled: 0 };
                Ok(Some(done))
            }
        }
    }

    fn finish(reg: &mut Registry, p: &Placement, imm: Option<u32>) -> RxCompletion {
        reg.finish_write(p);
        RxCompletion::Write {
            handle: p.handle,
            element: p.element,
            len: p.len,
            imm,
        }
    }

    fn start(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, RxError> {
        let h = OpHeader::parse(&self.header)?;
        let (handle, addr, imm) = match h.op {
            Op::Send => {
                let len = h.len as usize;
                if len > self.recv.len() {
                    return Err(RxError::SendTooLong {
                        len: h.len,
                        max: self.recv.len(),
                    });
                }
                if len == 0 {
                    self.received = 0;
                    return Ok(Some(RxCompletion::Recv { len: 0 }));
                }
                self.state = State::Send { len, filled: 0 };
                return Ok(None);
            }
            _ if !self.writes => return Err(RxError::WriteNotAllowed),
            Op::Write { handle, addr } => (handle, addr, None),
            Op::WriteImm { handle, addr, imm } => (handle, addr, Some(imm)),
        };
        let placement = reg.begin_write(self.domain, handle, addr, h.len)?;
        if reg.is_shared(placement.handle) {
            reg.abort_write(&placement);
            return Err(RxError::SharedPool);
        }
        if placement.len == 0 {
            return Ok(Some(Self::finish(reg, &placement, imm)));
        }
        self.state = State::Write {
            placement,
            imm,
            filled: 0,
        };
        Ok(None)
    }

    /// Payload of the last [`RxCompletion::Recv`].
    pub fn received(&self) -> &[u8] {
        &self.recv[..self.received]
    }

    /// Ends the stream: a write cut short is aborted so its region can drain.
    pub fn abort(&mut self, reg: &mut Registry) {
        if let State::Write { placement, .. } = &self.state {
            reg.abort_write(placement);
        }
        self.state = State::Header { filled: 0 };
        self.stage_pos = 0;
        self.stage_end = 0;
    }
}
