//! What both daemons need to be good system services: systemd notifications and a
//! watchdog fed from the data path, logging set up from the configuration or `RUST_LOG`,
//! and the current-thread runtime they run on; the metrics endpoint ([`metrics`]), the
//! control socket `splitnetctl` talks to ([`control`]), rate limits for log lines a peer can
//! provoke ([`loglimit`]), the capabilities a daemon run by hand as root gives up
//! ([`privilege`]), its memory limit against what its configuration may use
//! ([`memory`]), the listening sockets it keeps across a restart ([`fdstore`]) and hands
//! to its successor in an upgrade ([`handover`]).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod control;
pub mod fdstore;
pub mod handover;
pub mod loglimit;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod privilege;
pub mod process;
pub mod sched;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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

/// A task that never sleeps, for `fabric.busy_poll`: it yields each time it runs, so the
/// runtime it is spawned on never blocks; between its turns the runtime polls its reactor
/// and timers without waiting (tokio defers a yielded task until it has), and the thread
/// takes a core. Runs until its runtime ends.
pub async fn busy_poll() {
    loop {
        tokio::task::yield_now().await;
    }
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

/// The name a metrics listener is handed to a successor under ([`handover`]).
pub const KEPT_METRICS: &str = "metrics";
/// The name a control socket is handed to a successor under.
pub const KEPT_CONTROL: &str = "control";

/// The operator endpoints a daemon serves ([`serve_operators`]).
#[derive(Debug, Default)]
pub struct Operators {
    /// The metrics listener (a copy of its descriptor) and its task.
    metrics: Option<(OwnedFd, JoinHandle<()>)>,
    /// The control socket, its task, and what ends that task between requests.
    control: Option<(OwnedFd, JoinHandle<()>, oneshot::Sender<()>)>,
}

impl Operators {
    /// The listening sockets, by the names a successor takes them under.
    pub fn sockets(&self) -> impl Iterator<Item = (&'static str, BorrowedFd<'_>)> {
        let metrics = self
            .metrics
            .iter()
            .map(|(fd, _)| (KEPT_METRICS, fd.as_fd()));
        let control = self
            .control
            .iter()
            .map(|(fd, ..)| (KEPT_CONTROL, fd.as_fd()));
        metrics.chain(control)
    }

    /// Stops answering (a successor answers now): the metrics at once, the control socket
    /// once the request in hand is answered (the one that asked for the upgrade).
    pub async fn stop(self) {
        if let Some((_, task)) = self.metrics {
            task.abort();
        }
        if let Some((_, task, stop)) = self.control {
            let _ = stop.send(());
            let _ = task.await;
        }
    }
}

/// Serves the metrics endpoint at `metrics_addr` and the control socket at `control_path`
/// (each if given) on the current thread's local task set, taking up the listening sockets
/// a predecessor handed over ([`KEPT_METRICS`], [`KEPT_CONTROL`] in `kept`) when they are
/// still for that address and path.
pub async fn serve_operators<T: Introspect + 'static>(
    state: std::rc::Rc<std::cell::RefCell<T>>,
    metrics_addr: Option<std::net::SocketAddr>,
    control_path: Option<std::path::PathBuf>,
    kept: &mut fdstore::Inherited,
) -> Result<Operators, EndpointError> {
    let mut ops = Operators::default();
    let passed_metrics = kept.remove(KEPT_METRICS).map(std::net::TcpListener::from);
    let passed_control = kept
        .remove(KEPT_CONTROL)
        .map(std::os::unix::net::UnixListener::from);
    if let Some(addr) = metrics_addr {
        let l = match passed_metrics.filter(|l| l.local_addr().is_ok_and(|a| a == addr)) {
            Some(l) => l
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(l)),
            None => tokio::net::TcpListener::bind(addr).await,
        }
        .map_err(|source| EndpointError::Metrics { addr, source })?;
        let fd = l
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| EndpointError::Metrics { addr, source })?;
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
        let st = state.clone();
        let task =
            tokio::task::spawn_local(metrics::serve(l, move || st.borrow().render_metrics()));
        ops.metrics = Some((fd, task));
    }
    if let Some(path) = control_path {
        let err = |source| EndpointError::Control {
            path: path.clone(),
            source,
        };
        let sock = match passed_control.and_then(|l| control::ControlSocket::adopt(l, &path)) {
            Some(sock) => sock,
            None => control::ControlSocket::bind(&path).await.map_err(err)?,
        };
        let fd = sock.as_fd().try_clone_to_owned().map_err(err)?;
        tracing::info!(path = %path.display(), "control socket (splitnetctl)");
        let (stop, stopped) = oneshot::channel();
        let task = tokio::task::spawn_local(
            sock.serve(move |line| state.borrow().answer_line(line), stopped),
        );
        ops.control = Some((fd, task, stop));
    }
    Ok(ops)
}
