//! Messages an endpoint wants sent, in order, each tagged with the channel it must use.

use crate::wire::Message;
use std::collections::VecDeque;

/// Which channel a message travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Channel 0: buffer management and CfgUtil.
    Control,
    /// Channel 1: messages that must stay ordered with the RDMA writes (SendData,
    /// BufferRDMAIndicate and the initiator's flush messages).
    Data,
}

/// Encoded messages waiting for the shell to post them.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: VecDeque<(Lane, Vec<u8>)>,
    bytes: usize,
    next_txn: u64,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// A fresh transaction context.
    pub fn txn(&mut self) -> u64 {
        self.next_txn = self.next_txn.wrapping_add(1);
        self.next_txn
    }

    /// Encodes `msg` with `txn` and queues it on `lane`.
    pub fn push(&mut self, lane: Lane, txn: u64, msg: &Message<'_>) {
        let mut bytes = Vec::with_capacity(msg.encoded_len());
        msg.emit(txn, &mut bytes);
        self.bytes += bytes.len();
        self.queue.push_back((lane, bytes));
    }

    /// The next message to post.
    pub fn pop(&mut self) -> Option<(Lane, Vec<u8>)> {
        let m = self.queue.pop_front()?;
        self.bytes -= m.1.len();
        Some(m)
    }

    /// Bytes of the messages waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}
