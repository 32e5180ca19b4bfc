//! host-driver: the host module driver of the split NIC.
//!
//! It creates a TAP interface (`sd0`) that applications use like any NIC, connects to the
//! IOC over the fabric, learns its MAC, MTU and link state over CfgUtil, and moves frames
//! both ways as RDMA writes into the peer's pools. The carrier stays off until the fabric
//! is up, and the driver reconnects by itself, forever, when the IOC goes away.
#![deny(unsafe_code)]

mod announcement;
mod budget;
mod cfgutil;
mod connect;
mod connection;
mod datapath;
mod drops;
mod failover;
mod interface;
mod queues;
mod reconnect;
mod report;
mod snapshot;
mod spin;
mod supervisor;

use clap::Parser;
use splitnet_service as service;
use std::path::PathBuf;
use std::process::ExitCode;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "splitnet host driver: a TAP interface backed by a NIC on a remote I/O unit",
    long_about = "Creates the TAP interface named in the configuration (default sd0), connects to \
the ioc-driver over the fabric (TCP), and bridges frames between the two with the push-push \
protocol. The interface shows NO-CARRIER while the IOC is unreachable; the driver reconnects \
by itself. SIGTERM flushes the buffer pools with the IOC and exits 0."
)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(
        long,
        short,
        value_name = "PATH",
        default_value = "/etc/splitnet/host.toml"
    )]
    config: PathBuf,
    /// Validate the configuration, print a summary and exit.
    #[arg(long)]
    check_config: bool,
    /// Control socket for splitnetctl (overrides [control] socket; enables it).
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = match splitnet_config::load_host(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("host-driver: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        println!(
            "{}: ok (IOC {}, interface {})",
            cli.config.display(),
            cfg.fabric.ioc,
            cfg.interface.name
        );
        return ExitCode::SUCCESS;
    }
    service::init_logging(&cfg.log.level);
    let rt = match service::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("host-driver: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let control = cfg.control.socket_path(
        cli.control_socket,
        splitnet_control::host_socket(&cfg.interface.name),
    );
    let local = tokio::task::LocalSet::new();
    if cfg.fabric.busy_poll {
        // The main thread serves queue 0: it polls always (README "Polling before sleep").
        local.spawn_local(service::busy_poll());
    }
    match local.block_on(&rt, supervisor::run(cfg, control)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("host-driver: {e}");
            ExitCode::FAILURE
        }
    }
}
