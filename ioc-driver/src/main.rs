//! ioc-driver: the I/O unit module driver of the split NIC.
//!
//! It owns one LAN interface through an AF_PACKET socket, listens on the fabric, and serves
//! one or more hosts at once, each in its own protection domain with its own pools: LAN
//! frames go to the host whose MAC they name (group frames to every host), host frames go to
//! the LAN or, host to host, straight across inside the IOC.
//!
//! The main thread ([`supervisor`]) starts one [`worker`] thread per core, each with its own
//! [`state`]; it reads each connection's Hello and hands it to its worker, whose
//! [`admission`] completes the handshake and whose [`session_task`]s serve the hosts. Frames
//! flow [`from_lan`] and [`from_host`] through [`deliver`] to host queues ([`host_queue`],
//! [`own_queue`]) and through [`lan_tx`] to the [`nic`]; [`shard`] is what the workers
//! share, [`cfgutil`] answers hosts' requests, [`counters`] and [`report`] are what
//! operators see.
#![deny(unsafe_code)]

mod admission;
mod budget;
mod cfgutil;
#[cfg(test)]
mod conformance;
mod counters;
mod deliver;
mod from_host;
mod from_lan;
mod from_port;
mod gate;
mod host_frame;
mod host_queue;
mod lan_tx;
mod listeners;
mod nic;
mod nic_link;
mod own_queue;
mod port;
mod rate;
mod report;
mod session_task;
mod shard;
mod spin;
mod state;
mod supervisor;
#[cfg(test)]
mod tests;
mod upgrade;
mod vlan;
mod worker;

use clap::Parser;
use splitnet_service as service;
use std::path::PathBuf;
use std::process::ExitCode;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "splitnet IOC driver: bridges a NIC to remote hosts over the push-push fabric",
    long_about = "Opens the LAN interface named in the configuration with an AF_PACKET socket \
(virtio-net headers, so offloads pass through), listens for host drivers on the fabric address, \
and forwards frames between the LAN and every connected host. A host that breaks the protocol \
or the memory protection rules is disconnected; the others are not affected. SIGTERM flushes \
every host's pools and exits 0."
)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(
        long,
        short,
        value_name = "PATH",
        default_value = "/etc/splitnet/ioc.toml"
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
    let cfg = match splitnet_config::load_ioc(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ioc-driver: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        println!(
            "{}: ok (listen {}, LAN {})",
            cli.config.display(),
            cfg.fabric.listen,
            cfg.lan.interface
        );
        return ExitCode::SUCCESS;
    }
    service::init_logging(&cfg.log.level);
    let rt = match service::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ioc-driver: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = tokio::task::LocalSet::new();
    let control = cfg
        .control
        .socket_path(cli.control_socket, splitnet_control::IOC_SOCKET);
    match local.block_on(&rt, supervisor::run(cfg, cli.config.clone(), control)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("ioc-driver: {e}");
            ExitCode::FAILURE
        }
    }
}
