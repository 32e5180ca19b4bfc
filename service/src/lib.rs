//! What both daemons need to be good system services: systemd notifications and a
//! watchdog fed from the data path, logging set up from the configuration or `RUST_LOG`,
//! and the current-thread runtime they run on; the metrics endpoint ([`metrics`]), the
//! control socket `splitnetctl` talks to ([`control`]), rate limits for log lines a peer can
//! provoke ([`loglimit`]), the capabilities a daemon run by hand as root gives up
//! ([`privilege`]), and its memory limit against what its configuration may use
//! ([`memory`]).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod control;
pub mod loglimit;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod privilege;

use std::io;

/// Sends log lines to stderr (journald under systemd) at `level`, unless `RUST_LOG` says
/// otherwise; colours only on a terminal.
pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_target(false)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .init();
}

/// The single-threaded runtime a daemon's event loop runs on.
pub fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// An answer an operator's request waits for: it owns what it needs, so the daemon's state
/// is borrowed only while it is asked, never while the answer is awaited.
pub type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = String>>>;

/// What a daemon shows operators: its metrics text and its control-socket answers. Each
/// returns at once with an [`Answer`] to await: a daemon whose state lies in other threads
/// asks them and bounds the wait, so the thread serving operators never waits on another.
pub trait Introspect {
    /// Counters in Prometheus text format.
    fn render_metrics(&self) -> Answer;
    /// The JSON answer to one control-socket request line.
    fn answer_line(&self, line: &str) -> Answer;
}

/// An operator endpoint that could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The metrics address could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Metrics {
        /// Address.
        addr: std::net::SocketAddr,
        /// Cause.
        source: io::Error,
    },
    /// The control socket could not be bound.
    #[error("cannot listen on control socket {}: {source}", path.display())]
    Control {
        /// Socket path.
        path: std::path::PathBuf,
        /// Cause.
        source: io::Error,
    },
}

/// Opens the metrics listener and the control socket (each when configured) and serves
/// them from `state` on tasks of the current `LocalSet`, for as long as it runs.
pub async fn serve_operators<T: Introspect + 'static>(
    state: std::rc::Rc<std::cell::RefCell<T>>,
    metrics_addr: Option<std::net::SocketAddr>,
    control_path: Option<std::path::PathBuf>,
) -> Result<(), EndpointError> {
    if let Some(addr) = metrics_addr {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| EndpointError::Metrics { addr, source })?;
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
        let st = state.clone();
        tokio::task::spawn_local(metrics::serve(l, move || st.borrow().render_metrics()));
    }
    if let Some(path) = control_path {
        let sock = control::ControlSocket::bind(&path)
            .await
            .map_err(|source| EndpointError::Control {
                path: path.clone(),
                source,
            })?;
        tracing::info!(path = %path.display(), "control socket (splitnetctl)");
        tokio::task::spawn_local(sock.serve(move |line| state.borrow().answer_line(line)));
    }
    Ok(())
}
