//! Send queue of a byte-stream channel: posted operations waiting for the transport.
//!
//! Posting only queues (no syscall); [`TxQueue::gather`] hands the transport every queued
//! operation at once as an I/O vector, so a batch of frames leaves in one vectored write.
//! Payloads are never copied: the header, an optional message prefix and the caller's
//! buffer are separate I/O slices.

use super::op::{Op, OpHeader, OP_HEADER_LEN};
use crate::memory::{SendBuf, SendBufCache};
use std::collections::VecDeque;
use std::io::IoSlice;

/// Largest message prefix an operation may carry before its buffer.
pub const MAX_PREFIX: usize = 16;

/// The payload of a posted operation.
#[derive(Debug)]
pub enum Payload {
    /// No payload.
    Empty,
    /// An owned message (control traffic).
    Bytes(Vec<u8>),
    /// A registered send buffer; returned through [`TxQueue::reclaim`] once sent.
    Buf(SendBuf),
}

impl Payload {
    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Empty => &[],
            Payload::Bytes(b) => b,
            Payload::Buf(b) => b.as_slice(),
        }
    }
}

#[derive(Debug)]
struct TxOp {
    header: [u8; OP_HEADER_LEN],
    prefix: [u8; MAX_PREFIX],
    prefix_len: usize,
    payload: Payload,
    /// A write whose payload the writer already placed in the peer's memory: only its
    /// header travels.
    placed: bool,
}

impl TxOp {
    fn parts(&self) -> [&[u8]; 3] {
        [
            &self.header,
            &self.prefix[..self.prefix_len],
            self.payload.as_slice(),
        ]
    }

    fn len(&self) -> usize {
        OP_HEADER_LEN + self.prefix_len + self.payload.as_slice().len()
    }

    /// Whether it carries a frame: an RDMA write (placed or not), or a send of a send
    /// buffer (SendData); control messages are owned bytes.
    fn is_frame(&self) -> bool {
        self.placed
            || matches!(self.payload, Payload::Buf(_))
            || !matches!(
                OpHeader::parse(&self.header),
                Ok(OpHeader { op: Op::Send, .. })
            )
    }
}

/// Queue of posted operations.
#[derive(Debug, Default)]
pub struct TxQueue {
    ops: VecDeque<TxOp>,
    /// Bytes of the front operation already written.
    sent: usize,
    queued: usize,
    /// Capacity of the send buffers held: among `ops` and in `done`.
    held: usize,
    done: Vec<SendBuf>,
}

impl TxQueue {
    /// An empty queue.
    pub fn new() -> TxQueue {
        TxQueue::default()
    }

    /// Posts an operation whose payload is `prefix` followed by `payload`.
    /// `prefix` longer than [`MAX_PREFIX`] is a caller bug and is truncated.
    pub fn post(&mut self, op: Op, prefix: &[u8], payload: Payload) {
        let mut p = [0u8; MAX_PREFIX];
        let prefix_len = prefix.len().min(MAX_PREFIX);
        p[..prefix_len].copy_from_slice(&prefix[..prefix_len]);
        let len = prefix_len + payload.as_slice().len();
        let header = OpHeader {
            op,
            len: len as u32,
        }
        .emit();
        let op = TxOp {
            header,
            prefix: p,
            prefix_len,
            payload,
            placed: false,
        };
        self.queued += op.len();
        if let Payload::Buf(b) = &op.payload {
            self.held += b.capacity();
        }
        self.ops.push_back(op);
    }

    /// Posts the header of a write of `len` bytes that this side placed in the peer's memory
    /// itself (a shared-memory pool): the header is all that travels.
    pub fn post_placed(&mut self, op: Op, len: u32) {
        let op = TxOp {
            header: OpHeader { op, len }.emit(),
            prefix: [0; MAX_PREFIX],
            prefix_len: 0,
            payload: Payload::Empty,
            placed: true,
        };
        self.queued += op.len();
        self.ops.push_back(op);
    }

    /// Keeps a send buffer whose bytes went out another way (placed in the peer's memory)
    /// until [`TxQueue::reclaim`].
    pub fn retire(&mut self, payload: Payload) {
        if let Payload::Buf(b) = payload {
            self.held += b.capacity();
            self.done.push(b);
        }
    }

    /// Operations not yet fully written.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when everything posted has been written.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.queued - self.sent
    }

    /// The parts (header, prefix, payload) of the first operation, if none of it has been
    /// written yet: a transport that moves whole operations (a shared-memory ring) takes it
    /// as one record, then calls [`TxQueue::advance`] with its length.
    /// The flag says the operation is a placed write (only its header travels).
    pub fn front(&self) -> Option<([&[u8]; 3], bool)> {
        self.ops
            .front()
            .filter(|_| self.sent == 0)
            .map(|op| (op.parts(), op.placed))
    }

    /// Fills `out` with the unwritten bytes, in order, and returns how many slices it used.
    pub fn gather<'a>(&'a self, out: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut skip = self.sent;
        'ops: for op in &self.ops {
            for part in op.parts() {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                let Some(slot) = out.get_mut(n) else {
                    break 'ops;
                };
                *slot = IoSlice::new(&part[skip..]);
                skip = 0;
                n += 1;
            }
        }
        n
    }

    /// Accounts for `n` bytes written by the transport.
    pub fn advance(&mut self, mut n: usize) {
        while let Some(front) = self.ops.front() {
            let remaining = front.len() - self.sent;
            if n < remaining {
                self.sent += n;
                return;
            }
            n -= remaining;
            self.sent = 0;
            self.queued -= front.len();
            if let Some(TxOp {
                payload: Payload::Buf(b),
                ..
            }) = self.ops.pop_front()
            {
                self.done.push(b);
            }
        }
    }

    /// Bytes of send buffers (their capacity) this queue holds: posted and not yet written,
    /// or written and not yet taken back with [`TxQueue::reclaim`].
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Returns the send buffers of written operations to `cache`.
    pub fn reclaim(&mut self, cache: &mut SendBufCache) {
        for b in self.done.drain(..) {
            self.held -= b.capacity();
            cache.put(b);
        }
    }

    /// Drops everything queued (the connection is gone); buffers go to [`TxQueue::reclaim`].
    /// Returns the frames among it (writes, and sends of a send buffer), the one half
    /// written included: frames posted and never delivered, for their owner to count.
    pub fn clear(&mut self) -> usize {
        let mut frames = 0;
        for op in self.ops.drain(..) {
            frames += usize::from(op.is_frame());
            if let Payload::Buf(b) = op.payload {
                self.done.push(b);
            }
        }
        self.sent = 0;
        self.queued = 0;
        frames
    }
}
