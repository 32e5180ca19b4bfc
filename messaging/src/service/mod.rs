//! What both daemons need to be good system services: systemd notifications and a
//! watchdog fed from the data path, logging set up from the configuration or `RUST_LOG`,
//! and the current-thread runtime they run on.

pub mod control;
pub mod metrics;
pub mod notify;

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
