//! The opt-in metrics endpoint: `GET /metrics` answered with counters in Prometheus text
//! format.
//!
//! Written by hand: it answers one fixed request on a local socket, one connection at a
//! time, and closes; an HTTP server crate (hyper and its stack) would be most of the
//! daemon's dependency tree for that.

use std::fmt::Write as _;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::debug;

/// Longest request accepted (request line and headers).
const MAX_REQUEST: usize = 4096;
/// Time a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves `render()` at `/metrics` until the task is dropped.
pub async fn serve(listener: TcpListener, render: impl Fn() -> crate::Answer) {
    loop {
        let Ok((mut sock, peer)) = listener.accept().await else {
            continue;
        };
        let mut buf = vec![0u8; MAX_REQUEST];
        let mut n = 0;
        let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
            while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut buf[n..]).await {
                    Ok(0) | Err(_) => return false,
                    Ok(k) => n += k,
                }
            }
            true
        })
        .await;
        if !matches!(read, Ok(true)) {
            debug!(%peer, "metrics: incomplete request");
            continue;
        }
        let ok = buf.starts_with(b"GET /metrics ") || buf.starts_with(b"GET /metrics?");
        let (status, body) = if ok {
            ("200 OK", render().await)
        } else {
            ("404 Not Found", "only GET /metrics is served\n".to_string())
        };
        let head = format!(
            "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, async {
            sock.write_all(head.as_bytes()).await?;
            sock.write_all(body.as_bytes()).await
        })
        .await;
    }
}

/// Builds a Prometheus text exposition.
#[derive(Debug, Default)]
pub struct Exposition(String);

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Adds a metric with its help line and one unlabelled sample.
    pub fn metric(&mut self, name: &str, kind: &str, help: &str, value: u64) -> &mut Self {
        let _ = writeln!(
            self.0,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
        self
    }

    /// Adds the help and type lines of a labelled metric; samples follow with `sample`.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// Adds one labelled sample (`labels` like `session="1",mac="02:.."`).
    pub fn sample(&mut self, name: &str, labels: &str, value: u64) -> &mut Self {
        let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
        self
    }

    /// The text.
    pub fn finish(self) -> String {
        self.0
    }
}
