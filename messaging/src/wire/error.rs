//! Decoding errors and the protocol's error codes.

use thiserror::Error;

/// Status and reason codes carried on the wire (HelloReply, Goodbye, CfgUtilReply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Success.
    Ok,
    /// No common protocol version.
    UnsupportedVersion,
    /// A message or operation could not be decoded.
    Malformed,
    /// A message function this side does not know.
    UnknownFunction,
    /// An RDMA write failed the memory protection checks.
    Protection,
    /// Credits were misused (written beyond, returned twice).
    Credit,
    /// A configured resource bound would be exceeded.
    ResourceLimit,
    /// A data channel named a session that does not exist.
    UnknownSession,
    /// The sender is shutting down (a clean disconnect).
    ShuttingDown,
    /// The request is not supported.
    Unsupported,
    /// The request is understood but refused.
    Refused,
    /// The peer stopped answering.
    Timeout,
    /// The listener is at capacity.
    Busy,
    /// The handshake did not prove an admitted key (docs/protocol.md 5.1).
    Unauthenticated,
    /// The sender stops and is back soon at the same address, whose listening socket stays
    /// open meanwhile (a clean disconnect: reconnect at once, keep the link up).
    Restarting,
    /// A code this implementation does not know (kept so it can be logged).
    Other(u16),
}

impl ErrorCode {
    /// The wire value.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::Ok => 0,
            ErrorCode::UnsupportedVersion => 1,
            ErrorCode::Malformed => 2,
            ErrorCode::UnknownFunction => 3,
            ErrorCode::Protection => 4,
            ErrorCode::Credit => 5,
            ErrorCode::ResourceLimit => 6,
            ErrorCode::UnknownSession => 7,
            ErrorCode::ShuttingDown => 8,
            ErrorCode::Unsupported => 9,
            ErrorCode::Refused => 10,
            ErrorCode::Timeout => 11,
            ErrorCode::Busy => 12,
            ErrorCode::Unauthenticated => 13,
            ErrorCode::Restarting => 14,
            ErrorCode::Other(v) => v,
        }
    }

    /// Decodes a wire value; unknown values become [`ErrorCode::Other`].
    pub fn from_u16(v: u16) -> ErrorCode {
        match v {
            0 => ErrorCode::Ok,
            1 => ErrorCode::UnsupportedVersion,
            2 => ErrorCode::Malformed,
            3 => ErrorCode::UnknownFunction,
            4 => ErrorCode::Protection,
            5 => ErrorCode::Credit,
            6 => ErrorCode::ResourceLimit,
            7 => ErrorCode::UnknownSession,
            8 => ErrorCode::ShuttingDown,
            9 => ErrorCode::Unsupported,
            10 => ErrorCode::Refused,
            11 => ErrorCode::Timeout,
            12 => ErrorCode::Busy,
            13 => ErrorCode::Unauthenticated,
            14 => ErrorCode::Restarting,
            v => ErrorCode::Other(v),
        }
    }
}

/// Why bytes from the fabric are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer bytes than the layout needs.
    #[error("truncated: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        have: usize,
    },
    /// Longer than [`super::MAX_MESSAGE_LEN`].
    #[error("message of {0} bytes exceeds the maximum")]
    TooLong(usize),
    /// Unknown function code.
    #[error("unknown function {0:#06x}")]
    UnknownFunction(u16),
    /// Version outside the supported range.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u16),
    /// Bytes left after a complete body.
    #[error("{0} trailing bytes after the message body")]
    TrailingBytes(usize),
    /// A reserved field is not zero.
    #[error("reserved field is not zero")]
    Reserved,
    /// A list that must have at least one entry is empty.
    #[error("empty list")]
    EmptyList,
    /// A list longer than a message can hold.
    #[error("{count} entries exceed the maximum of {max}")]
    TooMany {
        /// Entries declared.
        count: usize,
        /// Maximum.
        max: usize,
    },
    /// A declared length that disagrees with the bytes present.
    #[error("declared length {declared} but {actual} bytes follow")]
    LengthMismatch {
        /// Declared.
        declared: usize,
        /// Present.
        actual: usize,
    },
    /// A field with a value outside its domain.
    #[error("bad value {value} for {field}")]
    BadField {
        /// Field name.
        field: &'static str,
        /// Value found.
        value: u64,
    },
    /// A Hello's queue index not below its queue count, or a count above the maximum.
    #[error(
        "queue {index} of {count} (the index must be below the count, the count at most {max})"
    )]
    BadQueue {
        /// Queue index.
        index: u8,
        /// Queue count.
        count: u8,
        /// Most queues.
        max: u8,
    },
    /// A field larger than allowed.
    #[error("{field} = {value} exceeds {max}")]
    TooLarge {
        /// Field name.
        field: &'static str,
        /// Value found.
        value: u64,
        /// Maximum.
        max: u64,
    },
}

impl WireError {
    /// The code reported to the peer for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::UnknownFunction(_) => ErrorCode::UnknownFunction,
            WireError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            _ => ErrorCode::Malformed,
        }
    }
}
