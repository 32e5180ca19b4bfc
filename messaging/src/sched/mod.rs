//! Transmit scheduling: how much a sender keeps in flight, and in which order waiting frames
//! leave.
//!
//! Bulk traffic must not build a first-in, first-out queue that interactive traffic waits
//! behind. [`ByteLimit`] bounds the bytes posted to the peer and not yet completed to what
//! keeps the path busy (after Linux's byte queue limits); frames beyond it wait in a
//! [`FlowQueue`], one queue per flow with new flows served first (after fq_codel), so a ping
//! or a keystroke passes a bulk transfer. [`Scheduler`] puts the two together for one sender.
//! [`Deficit`] shares one server among several senders by bytes (deficit round robin).
//! All are pure state machines; the daemons feed them and the clock.
//!
//! The scheduling lives in the daemons, not only in the kernel's qdisc of sd0, because the
//! TAP driver of current kernels has no backpressure towards its qdisc: it tail-drops once
//! its ring is full, so a sender that stopped reading the TAP would queue in that ring
//! (first in, first out) instead of in fq_codel.

pub mod drr;
pub mod express;
pub mod fq;
pub mod limit;
pub mod scheduler;

pub use drr::Deficit;
pub use express::{Express, ExpressConfig, ExpressStats};
pub use fq::{FlowQueue, FqConfig};
pub use limit::{ByteLimit, LimitConfig, LimitStats};
pub use scheduler::Scheduler;
