//! splitnetctl: asks a running host-driver or ioc-driver what it is doing, over its control
//! socket.
#![deny(unsafe_code)]

mod render;

use clap::{Parser, Subcommand, ValueEnum};
use splitnet_control::client::{self, ClientError};
use splitnet_control::{host_socket, Reply, Request, HOST_DIR, HOST_SOCKET, IOC_SOCKET};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Inspect a running splitnet daemon (host-driver or ioc-driver)",
    long_about = "Inspect a running splitnet daemon over its control socket \
(/run/host-driver/control.sock, or control-IFNAME.sock there for an interface other than sd0, \
or /run/ioc-driver/control.sock; root only). With neither --socket, --daemon nor --interface, \
the one daemon socket that exists is used. The options go anywhere on the line.\n\n\
Exit status: 0 answered, 1 the daemon could not be reached (none running) or refused, 2 usage \
error (including several daemons running and none chosen), 3 upgrade refused: the new process \
the daemon started did not start (the running one serves on)."
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
    /// The host-driver of this TAP interface (its default socket; implies --daemon host).
    #[arg(long, value_name = "IFNAME", global = true, conflicts_with = "socket")]
    interface: Option<String>,
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
    /// Makes ioc-driver read its configuration again and apply [auth] to every session (what
    /// `systemctl reload ioc-driver` runs); exits 1, saying why, when the file is invalid or
    /// changes what needs a restart (nothing is applied then).
    Reload,
    /// Makes ioc-driver start its binary again (the new one, after a package upgrade) and
    /// hand it its listening sockets; once the new process is ready it becomes the
    /// service's main process and the old one tells its hosts it is restarting, so they
    /// reconnect at once (what the package runs on an upgrade). Exits 3, the old process
    /// serving on, when the new one does not start; 1 when the daemon cannot be asked.
    Upgrade,
    /// A live view of throughput and credit occupancy (Ctrl-C ends it).
    Top {
        /// Seconds between samples.
        #[arg(long, short, default_value_t = 1.0, value_parser = parse_interval)]
        interval: f64,
        /// Stop after this many samples (default: run until interrupted).
        #[arg(long, short = 'n')]
        count: Option<u64>,
    },
    /// Prints a new private key (base64), for a host's or the IOC's key file
    /// (umask 077; splitnetctl genkey > /etc/splitnet/host.key).
    Genkey,
    /// Reads a private key on standard input and prints its public key, for the other
    /// side's configuration (auth.hosts on the IOC, auth.ioc_public_key on a host).
    Pubkey,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: seconds between 0.1 and 3600")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(result) = keys(&cli.command) {
        return match result {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(msg) => {
                eprintln!("splitnetctl: {msg}");
                ExitCode::FAILURE
            }
        };
    }
    let socket = match pick_socket(&cli, &present_sockets()) {
        Ok(s) => s,
        Err(Unpicked::NoDaemon(msg)) => {
            eprintln!("splitnetctl: {msg}");
            return ExitCode::FAILURE;
        }
        Err(Unpicked::Ambiguous(msg)) => {
            eprintln!("splitnetctl: {msg}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Status => once(&socket, Request::Status, cli.json),
        Command::Pools => once(&socket, Request::Pools, cli.json),
        Command::Hosts => once(&socket, Request::Hosts, cli.json),
        Command::Stats => once(&socket, Request::Stats, cli.json),
        Command::Reload => once(&socket, Request::Reload, cli.json),
        Command::Upgrade => return upgrade(&socket, cli.json),
        Command::Top { interval, count } => top(&socket, interval, count, cli.json),
        Command::Genkey | Command::Pubkey => unreachable!("answered by keys() above"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("splitnetctl: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// The key commands, which need no daemon: the line to print, or why not. `None` for the
/// other commands.
fn keys(command: &Command) -> Option<Result<String, String>> {
    use splitnet_config::key::Key;
    use splitnet_fabric::auth;
    use std::io::Read;
    match command {
        Command::Genkey => Some(
            auth::generate()
                .map(|k| Key(k).to_string())
                .map_err(|e| format!("cannot make a key: {e}")),
        ),
        Command::Pubkey => {
            let mut text = String::new();
            let read = std::io::stdin().take(1024).read_to_string(&mut text);
            Some(match read {
                Err(e) => Err(format!(
                    "cannot read the private key on standard input: {e}"
                )),
                Ok(_) => text
                    .parse::<Key>()
                    .map(|k| Key(auth::public_key(&k.0)).to_string())
                    .map_err(|e| format!("standard input: {e}")),
            })
        }
        _ => None,
    }
}

/// Why no socket was chosen.
#[derive(Debug, PartialEq, Eq)]
enum Unpicked {
    /// No daemon runs here (exit 1: nothing to reach).
    NoDaemon(String),
    /// Several do and the command line did not choose (exit 2: usage).
    Ambiguous(String),
}

/// The control sockets of the daemons running here: every host-driver's (one per
/// interface) and the IOC's.
fn present_sockets() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(HOST_DIR)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n == "control.sock" || (n.starts_with("control-") && n.ends_with(".sock"))
            })
        })
        .collect();
    found.sort();
    if Path::new(IOC_SOCKET).exists() {
        found.push(IOC_SOCKET.into());
    }
    found
}

/// The socket named on the command line, or the one daemon socket of `present` that the
/// command line allows.
fn pick_socket(cli: &Cli, present: &[PathBuf]) -> Result<PathBuf, Unpicked> {
    if let Some(s) = &cli.socket {
        return Ok(s.clone());
    }
    if let Some(ifname) = &cli.interface {
        return Ok(host_socket(ifname));
    }
    let is_host = |p: &&PathBuf| p.starts_with(HOST_DIR);
    let list = |v: &[&PathBuf]| {
        v.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match cli.daemon {
        Some(Daemon::Ioc) => Ok(IOC_SOCKET.into()),
        Some(Daemon::Host) => match present.iter().filter(is_host).collect::<Vec<_>>()[..] {
            [] => Ok(HOST_SOCKET.into()),
            [one] => Ok(one.clone()),
            ref several => Err(Unpicked::Ambiguous(format!(
                "several host-drivers run here ({}): choose with --interface IFNAME",
                list(several)
            ))),
        },
        None => match present.iter().collect::<Vec<_>>()[..] {
            [] => Err(Unpicked::NoDaemon(format!(
                "no daemon socket found ({HOST_DIR}/control*.sock, {IOC_SOCKET}): is a daemon \
                 running? (--socket PATH names another)"
            ))),
            [one] => Ok(one.clone()),
            ref several => Err(Unpicked::Ambiguous(format!(
                "several daemons run here ({}): choose with --daemon host|ioc, --interface \
                 IFNAME or --socket PATH",
                list(several)
            ))),
        },
    }
}

/// `upgrade`: 0 once the new process serves, 3 when the new binary did not start (the old
/// one serves on: a caller must not restart the service onto that binary), 1 when the
/// daemon could not be asked, could not try, or the hand-over went wrong otherwise (a
/// restart is then the way).
fn upgrade(socket: &Path, json: bool) -> ExitCode {
    match ask(socket, Request::Upgrade) {
        Ok(reply @ Reply::NotUpgraded(_)) => {
            match json {
                true => println!("{}", render::json(&reply)),
                false => eprint!("splitnetctl: {}", render::text(&reply)),
            }
            ExitCode::from(3)
        }
        Ok(reply @ Reply::Upgraded(_)) => {
            match json {
                true => println!("{}", render::json(&reply)),
                false => print!("{}", render::text(&reply)),
            }
            ExitCode::SUCCESS
        }
        Ok(other) => {
            eprintln!(
                "splitnetctl: upgrade: unexpected reply {}",
                render::json(&other)
            );
            ExitCode::FAILURE
        }
        Err(msg) => {
            eprintln!("splitnetctl: {msg}");
            ExitCode::FAILURE
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut argv = vec!["splitnetctl"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn global_options_go_anywhere_on_the_line() {
        for args in [
            &["--json", "status"][..],
            &["status", "--json"],
            &["-s", "/x.sock", "status", "--json"],
            &["status", "--json", "-s", "/x.sock"],
            &["stats", "-s", "/x.sock", "--json"],
            &["top", "-n", "1", "--json", "--socket", "/x.sock"],
        ] {
            let c = cli(args);
            assert!(c.json, "{args:?}");
        }
        assert_eq!(
            cli(&["pools", "-d", "ioc"]).daemon.map(|d| d as u8),
            Some(1)
        );
        assert_eq!(
            cli(&["hosts", "--interface", "sd1"]).interface.as_deref(),
            Some("sd1")
        );
        // top's -i stays its interval.
        let c = cli(&["top", "-i", "0.5", "--json"]);
        assert!(matches!(c.command, Command::Top { interval, .. } if interval == 0.5));
        // A socket and a daemon together are refused (exit 2).
        let e =
            Cli::try_parse_from(["splitnetctl", "status", "-s", "/x", "-d", "ioc"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn the_one_running_daemon_is_asked_and_none_is_not_a_usage_error() {
        let host = PathBuf::from(HOST_SOCKET);
        let sd1 = PathBuf::from("/run/host-driver/control-sd1.sock");
        let ioc = PathBuf::from(IOC_SOCKET);
        let status = cli(&["status", "--json"]);
        assert!(matches!(
            pick_socket(&status, &[]),
            Err(Unpicked::NoDaemon(_))
        ));
        assert_eq!(
            pick_socket(&status, std::slice::from_ref(&sd1)),
            Ok(sd1.clone())
        );
        assert_eq!(
            pick_socket(&status, std::slice::from_ref(&ioc)),
            Ok(ioc.clone())
        );
        assert!(matches!(
            pick_socket(&status, &[host.clone(), ioc.clone()]),
            Err(Unpicked::Ambiguous(_))
        ));
        let as_host = cli(&["--json", "-d", "host", "status"]);
        assert_eq!(
            pick_socket(&as_host, &[sd1.clone(), ioc.clone()]),
            Ok(sd1.clone())
        );
        assert!(matches!(
            pick_socket(&as_host, &[host.clone(), sd1.clone()]),
            Err(Unpicked::Ambiguous(m)) if m.contains("--interface")
        ));
        let by_name = cli(&["status", "--interface", "sd1"]);
        assert_eq!(pick_socket(&by_name, &[host.clone(), sd1.clone()]), Ok(sd1));
        let by_name = cli(&["status", "--interface", "sd0"]);
        assert_eq!(pick_socket(&by_name, &[]), Ok(host));
    }
}
