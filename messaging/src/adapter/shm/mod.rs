//! Building blocks of a shared-memory transport for co-located daemons
//! (`docs/transports.md`, "Shared-memory rings").
//!
//! * [`ring`]: a single-producer single-consumer ring of variable-length records with
//!   doorbell suppression, hardened against a hostile peer.
//! * [`channel`]: a [`crate::adapter::Channel`] over two rings, with the checks of the TCP
//!   path.
//! * [`setup`]: what a host proposes when it sets up shared memory with the IOC.
//! * [`spin`]: how long a consumer polls before it sleeps (adaptive, halt-polling style).
//!
//! All are sans-IO over [`crate::memory::SharedMem`], memory a peer may rewrite at any
//! moment: mapping it, passing it, the doorbell and the waiting belong to the caller
//! (`splitnet-fabric`'s `shm` module).

pub mod channel;
#[cfg(any(test, feature = "test-utils"))]
pub mod harness;
pub mod ring;
pub mod setup;
pub mod spin;
#[cfg(test)]
pub(crate) mod tests;

pub use channel::{
    heap_pair, ring_config, ShmChannel, ShmError, KIND_OP, KIND_PLACED, MAX_IDLE_WAKES,
};
pub use ring::{ConfigError, Consumer, Producer, PushError, Pushed, Record, RingConfig, RingError};
pub use spin::{Idle, Spin, SpinConfig, SpinCounts};
