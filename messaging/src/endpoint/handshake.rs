//! Connection set-up: Hello / HelloReply and version negotiation.
//!
//! The connecting side (the host) opens the control channel and sends Hello with session 0
//! and the range of versions it speaks; the listening side (the IOC) answers HelloReply with
//! the highest common version and a new session token, or with an error status (no common
//! version: UnsupportedVersion) and closes. A connecting side that cannot use the reply (a
//! version it does not speak) answers Goodbye with the code and closes.
//! Each data channel then connects and sends Hello naming that session id and its channel
//! number; the reply confirms it. A Hello is accepted whatever version its header carries,
//! so that negotiation itself never depends on the version.

use crate::wire::{self, ErrorCode, Hello, HelloReply, Message, Queue, Role};

/// Highest version both ranges contain.
pub fn negotiate(min: u16, max: u16) -> Option<u16> {
    let hi = max.min(wire::VERSION);
    let lo = min.max(wire::MIN_VERSION);
    (lo <= hi).then_some(hi)
}

/// Encodes a Hello for `channel` of `session` (0 to open a new session), serving `queue`.
pub fn hello(
    role: Role,
    channel: u8,
    queue: Queue,
    session: u64,
    node_id: u64,
    max_message: u32,
) -> Vec<u8> {
    let msg = Message::Hello(Hello {
        min_version: wire::MIN_VERSION,
        max_version: wire::VERSION,
        role,
        channel,
        queue,
        session,
        node_id,
        max_message,
    });
    let mut out = Vec::with_capacity(msg.encoded_len());
    msg.emit(0, &mut out);
    out
}

/// Encodes a HelloReply.
pub fn reply(version: u16, status: ErrorCode, session: u64, max_message: u32) -> Vec<u8> {
    reply_agreeing(version, status, session, max_message, 0)
}

/// Encodes a HelloReply agreeing to `flags` of what an AuthHello asked for
/// ([`HelloReply::SEALED_DATA`]).
pub fn reply_agreeing(
    version: u16,
    status: ErrorCode,
    session: u64,
    max_message: u32,
    flags: u32,
) -> Vec<u8> {
    let msg = Message::HelloReply(HelloReply {
        version,
        status,
        flags,
        session,
        max_message,
    });
    let mut out = Vec::with_capacity(msg.encoded_len());
    msg.emit(0, &mut out);
    out
}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Not a decodable handshake message.
    #[error("malformed handshake: {0}")]
    Wire(#[from] wire::WireError),
    /// Some other message came first.
    #[error("expected {0}, got another message")]
    Unexpected(&'static str),
    /// The peer refused with this status.
    #[error("peer refused the connection: {status:?} (it speaks versions up to {version})")]
    Refused {
        /// The HelloReply's status.
        status: ErrorCode,
        /// The HelloReply's version: on a refusal, the highest the listener speaks.
        version: u16,
    },
    /// No common protocol version.
    #[error(
        "no common protocol version (peer speaks {min}..={max}, we speak {}..={})",
        wire::MIN_VERSION,
        wire::VERSION
    )]
    NoCommonVersion {
        /// Peer's lowest version.
        min: u16,
        /// Peer's highest version.
        max: u16,
    },
    /// The peer's `max_message` is below [`wire::MAX_MESSAGE_LEN`], the largest SEND
    /// version 1 requires both sides to accept.
    #[error("peer accepts SENDs of at most {0} bytes, below the {max} version 1 requires", max = wire::MAX_MESSAGE_LEN)]
    SmallMaxMessage(u32),
}

impl HandshakeError {
    /// The status this side answers with (in a HelloReply from the listening side, in a
    /// Goodbye from the connecting side) before it closes the connection; `None` when the
    /// peer refused first.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            HandshakeError::Wire(e) => Some(e.code()),
            HandshakeError::Unexpected(_) | HandshakeError::SmallMaxMessage(_) => {
                Some(ErrorCode::Malformed)
            }
            HandshakeError::NoCommonVersion { .. } => Some(ErrorCode::UnsupportedVersion),
            HandshakeError::Refused { .. } => None,
        }
    }
}

/// Parses the Hello a listener receives; returns it and the version to use.
pub fn accept_hello(bytes: &[u8]) -> Result<(Hello, u16), HandshakeError> {
    match Message::parse(bytes)?.1 {
        Message::Hello(h) => match negotiate(h.min_version, h.max_version) {
            Some(_) if (h.max_message as usize) < wire::MAX_MESSAGE_LEN => {
                Err(HandshakeError::SmallMaxMessage(h.max_message))
            }
            Some(v) => Ok((h, v)),
            None => Err(HandshakeError::NoCommonVersion {
                min: h.min_version,
                max: h.max_version,
            }),
        },
        _ => Err(HandshakeError::Unexpected("Hello")),
    }
}

/// Parses the HelloReply a connecting side receives.
pub fn accept_reply(bytes: &[u8]) -> Result<HelloReply, HandshakeError> {
    match Message::parse(bytes)?.1 {
        Message::HelloReply(r) if r.status == ErrorCode::Ok => {
            match negotiate(r.version, r.version) {
                Some(_) if (r.max_message as usize) < wire::MAX_MESSAGE_LEN => {
                    Err(HandshakeError::SmallMaxMessage(r.max_message))
                }
                Some(_) => Ok(r),
                None => Err(HandshakeError::NoCommonVersion {
                    min: r.version,
                    max: r.version,
                }),
            }
        }
        Message::HelloReply(r) => Err(HandshakeError::Refused {
            status: r.status,
            version: r.version,
        }),
        _ => Err(HandshakeError::Unexpected("HelloReply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_highest_common() {
        assert_eq!(negotiate(1, 1), Some(1));
        assert_eq!(negotiate(1, 9), Some(wire::VERSION));
        assert_eq!(negotiate(wire::VERSION + 1, 9), None);
        assert_eq!(negotiate(0, 0), None);
    }

    #[test]
    fn hello_round_trip_and_refusal() {
        let h = hello(Role::Host, 0, Queue { index: 2, count: 3 }, 0, 42, 70000);
        let (got, v) = accept_hello(&h).unwrap();
        assert_eq!(got.node_id, 42);
        assert_eq!(got.queue, Queue { index: 2, count: 3 });
        assert_eq!(v, wire::VERSION);
        let r = reply(v, ErrorCode::Ok, 7, 70000);
        assert_eq!(accept_reply(&r).unwrap().session, 7);
        let r = reply(v, ErrorCode::Busy, 0, 0);
        assert_eq!(
            accept_reply(&r),
            Err(HandshakeError::Refused {
                status: ErrorCode::Busy,
                version: v
            })
        );
        assert!(matches!(
            accept_hello(&r),
            Err(HandshakeError::Unexpected(_))
        ));
    }
}
