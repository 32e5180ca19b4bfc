//! Wire formats: the common header, every message, CfgUtil payloads and the idata codec.
//!
//! All integers are big-endian (network order). Decoders take untrusted bytes: every
//! truncated, oversized, malformed or unknown input is a [`WireError`], never a panic, and no
//! allocation is sized by a field before that field has been checked against the bytes
//! actually present.

mod cfg;
mod error;
mod header;
mod idata;
mod message;
#[cfg(test)]
mod tests;

pub use cfg::{
    features, fmt_mac, parse_mac, parse_multicast, parse_u32, parse_u64, parse_u8, CfgCode,
    LinkChange, Mtu, Stats, MAX_MULTICAST,
};
pub use error::{ErrorCode, WireError};
pub use header::{Function, Header, HEADER_LEN};
pub use idata::Idata;
pub use message::{
    CfgReply, CfgRequest, Goodbye, Hello, HelloReply, Indicate, Message, PoolEntry, PoolGet,
    PoolRun, Queue, Role, MAX_FLUSH_REFS, MAX_POOL_ENTRIES, MAX_POOL_RUNS, POOL_ENTRY_LEN,
    POOL_RUN_LEN,
};

/// Protocol version this implementation speaks best.
pub const VERSION: u16 = 1;
/// Oldest protocol version this implementation speaks.
pub const MIN_VERSION: u16 = 1;
/// Largest message (header and body).
pub const MAX_MESSAGE_LEN: usize = 65_536 + 1024;
/// Largest frame a SendData carries: whatever fits the largest message.
pub const MAX_SEND_DATA: usize = MAX_MESSAGE_LEN - HEADER_LEN - 4;
/// Longest frame a sender may choose to send inline (the bound of `send_data_max`). A
/// longer SendData is allowed only for a frame no pool of the receiver can hold; any
/// other is refused and counted by the receiver.
pub const MAX_INLINE: usize = 1024;
/// Channel number of the control channel.
pub const CONTROL_CHANNEL: u8 = 0;
/// Most data channels (queue pairs) per session.
pub const MAX_DATA_CHANNELS: u8 = 16;
/// Most queues of one multi-queue host (each queue is a session of its own).
pub const MAX_QUEUES: u8 = 16;
