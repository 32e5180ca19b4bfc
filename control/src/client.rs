//! A blocking client of the control socket: one request, one reply.

use crate::report::{Reply, Request};
use crate::MAX_REPLY;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Why a request got no reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached (daemon not running, no permission).
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The exchange failed half way.
    #[error("{path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The daemon answered something that is not a reply document.
    #[error("{path}: malformed reply: {source}")]
    Malformed {
        /// The socket.
        path: PathBuf,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// The reply was larger than [`MAX_REPLY`].
    #[error("{path}: reply larger than {MAX_REPLY} bytes")]
    TooLarge {
        /// The socket.
        path: PathBuf,
    },
}

/// Asks the daemon listening on `path` one question.
pub fn ask(path: &Path, request: Request) -> Result<Reply, ClientError> {
    let io_err = |source| ClientError::Io {
        path: path.to_owned(),
        source,
    };
    let mut sock = UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_owned(),
        source,
    })?;
    // The daemon has the request's time to answer.
    let timeout = request.answer_timeout();
    sock.set_read_timeout(Some(timeout)).map_err(io_err)?;
    sock.set_write_timeout(Some(timeout)).map_err(io_err)?;
    sock.write_all(format!("{request}\n").as_bytes())
        .map_err(io_err)?;
    let mut body = Vec::new();
    sock.take(MAX_REPLY + 1)
        .read_to_end(&mut body)
        .map_err(io_err)?;
    if body.len() as u64 > MAX_REPLY {
        return Err(ClientError::TooLarge {
            path: path.to_owned(),
        });
    }
    serde_json::from_slice(&body).map_err(|source| ClientError::Malformed {
        path: path.to_owned(),
        source,
    })
}
