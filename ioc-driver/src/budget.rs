//! The most memory a configuration lets the IOC use, held at start against its control
//! group's limit (`MemoryMax=`, [`splitnet_service::memory`]); the unit's limit is sized
//! from it for the shipped configuration.
//!
//! Every term is a bound the IOC enforces, counting what the kernel charges to its memory
//! group as well as what it allocates: for each session its pools (one budget with their
//! bookkeeping, `pools.max_granted_bytes`; over shared memory, as much again at most in the
//! host's arena, whose pages the IOC writes first), its fabric sockets at the kernel's
//! largest buffers or its rings (over RDMA: its control socket and the queue pair's pinned
//! staging and receives), its control backlog and its own LAN queue; for each worker
//! its send buffers and its NIC socket; and the daemon itself.

use crate::host_queue::SMALL_BUFFER;
use crate::state::{buffer_plan, MAX_CONTROL_BACKLOG};
use splitnet_config::IocConfig;
use splitnet_messaging::adapter::shm::setup::{Setup, RING_DATA};
use splitnet_messaging::wire;
use splitnet_netif::packet::RCVBUF;
use splitnet_netif::rx_ring::RING_BYTES;
use splitnet_service::memory::{mib, Budget};

/// The IOC serving no host (code, runtimes, stacks, allocator): 6.5 MiB resident measured
/// here, taken twice.
const BASE: u64 = 16 << 20;
/// The NIC socket's send buffer (set with its receive buffer, [`RCVBUF`]).
const NIC_SNDBUF: u64 = 4 << 20;

/// The budget of `cfg` run with `workers` workers, with `tcp` bytes for a session's two
/// fabric sockets (twice [`splitnet_service::memory::tcp_socket_max`]).
pub fn budget(cfg: &IocConfig, workers: usize, tcp: u64) -> Budget {
    let sessions = u64::from(cfg.fabric.max_hosts);
    let pools = Setup::pool_size_for(cfg.pools.max_granted_bytes);
    // Over shared memory: four rings, and the host's arena (no larger than the IOC's own).
    let rings = 4 * u64::from(RING_DATA);
    let transport = tcp
        .max(rings + pools)
        .max(tcp / 2 + splitnet_fabric::verbs::PINNED);
    let session = pools + transport + MAX_CONTROL_BACKLOG as u64 + RCVBUF as u64;
    let plan = buffer_plan(cfg.fabric.max_hosts);
    // Each receive queue's socket holds up to RCVBUF, and its mapped ring if it has one; the
    // first also sends.
    let ring = if cfg.lan.rx_ring {
        RING_BYTES as u64
    } else {
        0
    };
    let nic = u64::from(cfg.lan.rx_queues) * (RCVBUF as u64 + ring) + NIC_SNDBUF;
    let worker = (plan.buffers * wire::MAX_SEND_DATA + plan.small * SMALL_BUFFER) as u64 + nic;
    let workers = workers as u64;
    Budget {
        bytes: sessions * session + workers * worker + BASE,
        terms: format!(
            "{sessions} sessions x {} MiB, {workers} workers x {} MiB, {} MiB for the daemon",
            mib(session),
            mib(worker),
            mib(BASE)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(text: &str) -> IocConfig {
        splitnet_config::parse_ioc(text, Path::new("ioc.toml")).unwrap()
    }

    #[test]
    fn the_shipped_configuration_fits_the_units_limit() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/ioc.toml"))
                .unwrap();
        let unit = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../systemd/ioc-driver.service"
        ))
        .unwrap();
        let limit = splitnet_service::memory::unit_memory_max(&unit).expect("MemoryMax=");
        let cfg = config(&text);
        // Up to one worker per session, and Linux's default socket limits.
        let b = budget(&cfg, cfg.fabric.max_hosts as usize, 2 * ((6 + 4) << 20));
        assert!(
            b.bytes <= limit,
            "{} MiB > {} MiB: {}",
            b.bytes >> 20,
            limit >> 20,
            b.terms
        );
        assert!(
            b.bytes > limit / 2,
            "the limit is twice the bound: {}",
            b.terms
        );
    }

    #[test]
    fn each_term_grows_the_budget() {
        let base =
            "[fabric]\nlisten = \"127.0.0.1:7400\"\nmax_hosts = 4\n[lan]\ninterface = \"lan0\"\n";
        let b = budget(&config(base), 1, 20 << 20);
        let more_hosts = budget(
            &config(&base.replace("max_hosts = 4", "max_hosts = 8")),
            1,
            20 << 20,
        );
        let more_workers = budget(&config(base), 2, 20 << 20);
        let more_queues = budget(&config(&format!("{base}rx_queues = 4\n")), 1, 20 << 20);
        let rings = budget(&config(&format!("{base}rx_ring = true\n")), 1, 20 << 20);
        let bigger_sockets = budget(&config(base), 1, 200 << 20);
        let bigger_pools = budget(
            &config(&format!("{base}[pools]\nmax_granted_bytes = 268435456\n")),
            1,
            20 << 20,
        );
        for (what, x) in [
            ("hosts", &more_hosts),
            ("workers", &more_workers),
            ("receive queues", &more_queues),
            ("mapped rings", &rings),
            ("sockets", &bigger_sockets),
            ("pools", &bigger_pools),
        ] {
            assert!(x.bytes > b.bytes, "{what}: {} vs {}", x.terms, b.terms);
        }
        // Four sessions of 64 MiB of pools each, and as much in their hosts' arenas at most.
        assert!(b.bytes > 4 * (128 << 20), "{}", b.terms);
        assert!(b.terms.starts_with("4 sessions x "), "{}", b.terms);
    }
}
