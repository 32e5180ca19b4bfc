//! Errors of the push-push endpoint: what a peer did wrong, mapped to wire error codes.

use crate::wire::{ErrorCode, Function, WireError};
use thiserror::Error;

/// A protocol violation by the peer. Fatal to the peer's session, never to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// The message could not be decoded.
    #[error("malformed message: {0}")]
    Wire(#[from] WireError),
    /// A message that is valid on the wire but not in this state or on this channel.
    #[error("unexpected {function:?}: {why}")]
    Unexpected {
        /// The message's function.
        function: Function,
        /// Why it is unexpected.
        why: &'static str,
    },
    /// A pool reference that names no live pool.
    #[error("unknown pool {0}")]
    UnknownPool(u32),
    /// An advertised pool with impossible or unbounded geometry.
    #[error("pool {pool_ref} refused: {why}")]
    BadPool {
        /// Pool reference advertised.
        pool_ref: u32,
        /// What is wrong.
        why: &'static str,
    },
    /// Immediate data that does not describe the write it came with.
    #[error("immediate data {imm:#010x} does not match the write (pool {pool_ref}, element {element}, {len} bytes)")]
    IdataMismatch {
        /// The immediate data received.
        imm: u32,
        /// Pool actually written.
        pool_ref: u32,
        /// Element actually written.
        element: u32,
        /// Bytes actually written.
        len: u32,
    },
    /// A BufferRDMAIndicate for an element that holds no unindicated write of that length.
    #[error("indication for pool {pool_ref} element {element} ({len} bytes) matches no write")]
    NoSuchWrite {
        /// Pool named.
        pool_ref: u32,
        /// Element named.
        element: u32,
        /// Length named.
        len: u32,
    },
    /// A credit returned for an element that was not in use.
    #[error("credit returned for pool {pool_ref} element {element}, which was not in use")]
    CreditViolation {
        /// Pool named.
        pool_ref: u32,
        /// Element named.
        element: u32,
    },
    /// A SendData frame larger than the agreed limit.
    #[error("SendData of {len} bytes exceeds {max}")]
    FrameTooLarge {
        /// Frame length.
        len: usize,
        /// Limit.
        max: usize,
    },
}

impl ProtocolError {
    /// The code sent to the peer in a Goodbye before the connection is closed.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::Wire(e) => e.code(),
            ProtocolError::CreditViolation { .. } => ErrorCode::Credit,
            ProtocolError::BadPool { .. } => ErrorCode::ResourceLimit,
            _ => ErrorCode::Malformed,
        }
    }
}
