//! The push-push endpoint: sans-IO state machines for both sides of a connection.

mod error;
pub mod handshake;
mod initiator;
mod link;
mod liveness;
mod outbox;
mod session;
mod target;

pub use error::ProtocolError;
pub use initiator::{send_data_prefix, Initiator, InitiatorConfig, Posted, Reservation, Route};
pub use link::{Link, LinkError, LinkEvent, LinkStats};
pub use liveness::{Keepalive, Liveness};
pub use outbox::{Lane, Outbox};
pub use session::{Batch, InPlace, Incoming, Session, SessionConfig};
pub use target::{
    Delivery, PoolGetOutcome, PoolSpec, PoolUsage, Target, TargetConfig, ELEMENT_OVERHEAD,
    KEEP_BYTES, MAX_ELEMENT_COUNT, MIN_ELEMENT_SIZE,
};
