//! splitnet's protocol core: the push-push messaging protocol of seed 002 over a software
//! channel adapter, sans-IO.
//!
//! * [`wire`]: byte layouts of every message and the 32-bit immediate-data codec.
//! * [`memory`]: registered regions, handles, protection domains, the send-buffer cache, and
//!   memory shared with a peer that may rewrite it at any moment.
//! * [`adapter`]: the [`adapter::Channel`] trait (a queue pair), the RDMA operation framing
//!   over byte streams, and the shared-memory ring channel with its hostile-peer model.
//! * [`endpoint`]: the push-push state machines (target and initiator sides), the session
//!   and the link of a host's two channels.
//! * [`sched`]: transmit scheduling (per-flow fair queueing and a byte limit in flight).
//! * [`ecn`]: marking a frame Congestion Experienced instead of dropping it.
//! * [`vnet`]: checks of the virtio-net header and Ethernet frame carried by every frame.
//! * `testing` (feature `test-utils`): the in-process two-peer harness.
//!
//! Nothing here performs I/O on its own, reads a clock or uses `unsafe`: the daemons (through
//! `splitnet-fabric` for the transports and `splitnet-netif` for the Linux interfaces) feed
//! bytes, readiness and time in and carry the resulting operations out.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod adapter;
pub mod ecn;
pub mod endpoint;
pub mod memory;
pub mod sched;
#[cfg(any(test, feature = "test-utils"))]
pub mod testing;
pub mod vnet;
pub mod wire;
