//! splitnet messaging layer: the push-push protocol of seed 002 over a software channel
//! adapter.
//!
//! * [`wire`]: byte layouts of every message and the 32-bit immediate-data codec.
//! * [`memory`]: registered regions, handles, protection domains, the send-buffer cache.
//! * [`adapter`]: queue pairs and the RDMA operation framing over byte-stream transports.
//! * [`endpoint`]: the sans-IO push-push state machines (target and initiator sides).
//! * [`vnet`]: checks of the virtio-net header and Ethernet frame carried by every frame.
//!
//! Behind features, the shells the daemons stand on: `fabric` (tokio: TCP channels,
//! readiness, handshake), `sys` (TAP, AF_PACKET and interface ioctls, the only `unsafe`),
//! `service` (systemd notifications, watchdog, logging) and `testing` (`test-utils`: the
//! in-process and TCP two-peer harness).
//!
//! Nothing here performs I/O on its own or reads a clock: the daemons feed bytes, readiness
//! and time in and carry the resulting operations out.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod adapter;
pub mod endpoint;
#[cfg(feature = "tokio")]
pub mod fabric;
pub mod memory;
pub mod sched;
#[cfg(feature = "service")]
pub mod service;
#[cfg(feature = "sys")]
pub mod sys;
#[cfg(any(test, feature = "test-utils"))]
pub mod testing;
pub mod vnet;
pub mod wire;
