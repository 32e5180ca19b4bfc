//! The software channel adapter: queue pairs, RDMA operations and their transports.
//!
//! Operations are SEND, RDMA WRITE and RDMA WRITE WITH IMMEDIATE ([`Op`]). Incoming writes
//! are checked by the [`crate::memory::Registry`] before a byte is placed and then read
//! from the transport straight into the target element.

mod channel;
mod op;
mod pipe;
mod rx;
pub mod shm;
#[cfg(test)]
mod tests;
mod tx;

pub use channel::{Channel, ChannelError, StreamChannel};
pub use op::{Op, OpError, OpHeader, OP_HEADER_LEN};
pub use pipe::{pipe, PipeEnd};
pub use rx::{RxCompletion, RxError, RxStream};
pub use tx::{Payload, TxQueue, MAX_PREFIX};
