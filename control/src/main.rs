//! splitnetctl: asks a running host-driver or ioc-driver what it is doing, over its control
//! socket.
#![deny(unsafe_code)]

mod render;

use clap::{Parser, Subcommand, ValueEnum};
use splitnet_control::client::{self, ClientError};
use splitnet_control::{Reply, Request, HOST_SOCKET, IOC_SOCKET};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Inspect a running splitnet daemon (host-driver or ioc-driver)",
    long_about = "Inspect a running splitnet daemon over its control socket \
(/run/host-driver/control.sock or /run/ioc-driver/control.sock, root only). With neither \
--socket nor --daemon, the one of the two that exists is used.\n\n\
Exit status: 0 answered, 1 the daemon could not be reached or refused, 2 usage error."
)]
struct Cli {
    /// Print the daemon's JSON document instead of a table (for scripts).
    #[arg(long, global = true)]
    json: bool,
    /// The control socket to use.
    #[arg(long, short, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
    /// Which daemon of this machine to ask (its default socket).
    #[arg(long, short, value_enum, global = true, conflicts_with = "socket")]
    daemon: Option<Daemon>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Daemon {
    /// host-driver (/run/host-driver/control.sock).
    Host,
    /// ioc-driver (/run/ioc-driver/control.sock).
    Ioc,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fabric state, peer, protocol version, offloads, uptime.
    Status,
    /// Every pool on both sides of every connection: size, credits, quiescing.
    Pools,
    /// The hosts an IOC serves: MAC, domain, counters.
    Hosts,
    /// Frames, bytes, drops, protocol and protection errors; the NIC's counters.
    Stats,
    /// A live view of throughput and credit occupancy (Ctrl-C ends it).
    Top {
        /// Seconds between samples.
        #[arg(long, short, default_value_t = 1.0, value_parser = parse_interval)]
        interval: f64,
        /// Stop after this many samples (default: run until interrupted).
        #[arg(long, short = 'n')]
        count: Option<u64>,
    },
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: seconds between 0.1 and 3600")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let socket = match pick_socket(&cli) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("splitnetctl: {msg}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Status => once(&socket, Request::Status, cli.json),
        Command::Pools => once(&socket, Request::Pools, cli.json),
        Command::Hosts => once(&socket, Request::Hosts, cli.json),
        Command::Stats => once(&socket, Request::Stats, cli.json),
        Command::Top { interval, count } => top(&socket, interval, count, cli.json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("splitnetctl: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// The socket named on the command line, or the one daemon socket that exists.
fn pick_socket(cli: &Cli) -> Result<PathBuf, String> {
    if let Some(s) = &cli.socket {
        return Ok(s.clone());
    }
    match cli.daemon {
        Some(Daemon::Host) => return Ok(HOST_SOCKET.into()),
        Some(Daemon::Ioc) => return Ok(IOC_SOCKET.into()),
        None => {}
    }
    let present: Vec<&str> = [HOST_SOCKET, IOC_SOCKET]
        .into_iter()
        .filter(|p| Path::new(p).exists())
        .collect();
    match present[..] {
        [one] => Ok(one.into()),
        [] => Err(format!(
            "no daemon socket found ({HOST_SOCKET}, {IOC_SOCKET}): is a daemon running? \
             (--socket PATH names another)"
        )),
        _ => Err("both host-driver and ioc-driver run here: choose with --daemon host|ioc".into()),
    }
}

/// Asks and turns an `error` reply into an error.
fn ask(socket: &Path, request: Request) -> Result<Reply, String> {
    match client::ask(socket, request) {
        Ok(Reply::Error(e)) => Err(format!("{}: {e}", socket.display())),
        Ok(r) => Ok(r),
        Err(e @ ClientError::Connect { .. }) => Err(format!("{e} (is the daemon running? root?)")),
        Err(e) => Err(e.to_string()),
    }
}

fn once(socket: &Path, request: Request, json: bool) -> Result<(), String> {
    let reply = ask(socket, request)?;
    if json {
        println!("{}", render::json(&reply));
    } else {
        print!("{}", render::text(&reply));
    }
    Ok(())
}

/// Samples `stats` and `pools` every `interval` seconds and shows rates and occupancy.
fn top(socket: &Path, interval: f64, count: Option<u64>, json: bool) -> Result<(), String> {
    let period = Duration::from_secs_f64(interval);
    let mut last = None;
    let mut n = 0u64;
    loop {
        let t = Instant::now();
        let Reply::Stats(stats) = ask(socket, Request::Stats)? else {
            return Err("stats: unexpected reply".into());
        };
        let Reply::Pools(pools) = ask(socket, Request::Pools)? else {
            return Err("pools: unexpected reply".into());
        };
        let frame = render::Top {
            stats: &stats,
            pools: &pools,
            previous: last.as_ref().map(|(s, at): &(_, Instant)| (s, t - *at)),
        };
        if json {
            println!("{}", frame.json());
        } else {
            print!("\x1b[H\x1b[2J{}", frame.text(socket));
        }
        last = Some((stats, t));
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(period.saturating_sub(t.elapsed()));
    }
}
