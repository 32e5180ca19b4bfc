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
    /// An advertised pool with impossible geometry (empty, overflowing, reference in use).
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
    /// A BufferRecvPoolUpdate naming a pool the initiator never held (nor just flushed).
    #[error("credit returned for pool {0}, which was never advertised")]
    UnknownCreditPool(u32),
    /// An advertised pool beyond this side's limits (pool count, elements per pool).
    #[error("pool {pool_ref} refused: {why}")]
    PoolLimit {
        /// Pool reference advertised.
        pool_ref: u32,
        /// Which limit.
        why: &'static str,
    },
}

impl ProtocolError {
    /// The code sent to the peer in a Goodbye before the connection is closed (the code of
    /// [`ProtocolError::row`] in the error table of docs/protocol.md, section 7).
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::Wire(e) => e.code(),
            ProtocolError::CreditViolation { .. } | ProtocolError::UnknownCreditPool(_) => {
                ErrorCode::Credit
            }
            ProtocolError::PoolLimit { .. } => ErrorCode::ResourceLimit,
            ProtocolError::Unexpected { .. }
            | ProtocolError::UnknownPool(_)
            | ProtocolError::BadPool { .. }
            | ProtocolError::IdataMismatch { .. }
            | ProtocolError::NoSuchWrite { .. } => ErrorCode::Malformed,
        }
    }

    /// The row of the error table (docs/protocol.md, section 7) this error is.
    pub fn row(&self) -> &'static str {
        match self {
            ProtocolError::Wire(WireError::UnknownFunction(_)) => "E5",
            ProtocolError::Wire(WireError::UnsupportedVersion(_)) => "E6",
            ProtocolError::Wire(_) => "E7",
            ProtocolError::Unexpected {
                function:
                    Function::Hello | Function::HelloReply | Function::AuthHello | Function::AuthReply,
                ..
            } => "E8",
            ProtocolError::Unexpected { .. } => "E15",
            ProtocolError::IdataMismatch { .. } => "E9",
            ProtocolError::NoSuchWrite { .. } => "E10",
            ProtocolError::CreditViolation { .. } | ProtocolError::UnknownCreditPool(_) => "E11",
            ProtocolError::BadPool { .. } => "E12",
            ProtocolError::PoolLimit { .. } => "E13",
            ProtocolError::UnknownPool(_) => "E14",
        }
    }
}
