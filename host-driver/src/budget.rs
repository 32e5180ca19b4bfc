//! The most memory a configuration lets host-driver use, held at start against its control
//! group's limit (`MemoryMax=`, [`splitnet_service::memory`]); the unit's limit is sized
//! from it for the shipped configuration.
//!
//! For each TAP queue (a session of its own): its pools (`pools.max_granted_bytes`, their
//! bookkeeping included), its fabric sockets at the kernel's largest buffers, or over shared
//! memory its rings and the IOC's arena it writes into (taken as large as its own pools, as
//! with the shipped configurations: the IOC's arena is sized by the IOC's), or over RDMA its
//! control socket and the queue pair's pinned staging and receives, and its send buffers
//! (small ones too); and
//! the daemon itself.

use crate::datapath::{SEND_BUFFERS, SMALL_BUFFERS, SMALL_BUFFER_BYTES};
use splitnet_config::{FabricAddr, HostConfig};
use splitnet_messaging::adapter::shm::setup::{Setup, RING_DATA};
use splitnet_messaging::wire;
use splitnet_service::memory::{mib, Budget};

/// host-driver with no connection (code, runtime, stacks, allocator): 6 MiB resident
/// measured here, taken twice and more.
const BASE: u64 = 16 << 20;

/// What the configuration may take and how it adds up, with `tcp` bytes for a session's two
/// fabric sockets (twice [`splitnet_service::memory::tcp_socket_max`]).
pub fn budget(cfg: &HostConfig, tcp: u64) -> Budget {
    let pools = Setup::pool_size_for(cfg.pools.max_granted_bytes);
    let shm = cfg.fabric.shared_memory && matches!(cfg.fabric.ioc, FabricAddr::Unix(_));
    let transport = match (shm, &cfg.fabric.ioc) {
        (true, _) => tcp.max(4 * u64::from(RING_DATA) + pools),
        (false, FabricAddr::Rdma(_)) => tcp / 2 + splitnet_fabric::verbs::PINNED,
        (false, _) => tcp,
    };
    let send = SEND_BUFFERS * wire::MAX_SEND_DATA + SMALL_BUFFERS * SMALL_BUFFER_BYTES;
    let queue = pools + transport + send as u64;
    let queues = u64::from(cfg.interface.queues);
    Budget {
        bytes: queues * queue + BASE,
        terms: format!(
            "{queues} queues x {} MiB, {} MiB for the daemon",
            mib(queue),
            mib(BASE)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const TCP: u64 = 2 * ((6 + 4) << 20);

    fn config(text: &str) -> HostConfig {
        splitnet_config::parse_host(text, Path::new("host.toml")).unwrap()
    }

    #[test]
    fn the_shipped_configuration_fits_the_units_limit() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/");
        let text = std::fs::read_to_string(format!("{dir}host.toml")).unwrap();
        let unit = std::fs::read_to_string(format!("{dir}host-driver.service")).unwrap();
        let limit = splitnet_service::memory::unit_memory_max(&unit).expect("MemoryMax=");
        let Budget { bytes, terms } = budget(&config(&text), TCP);
        assert!(
            bytes <= limit,
            "{} MiB > {} MiB: {terms}",
            bytes >> 20,
            limit >> 20
        );
        assert!(bytes > limit / 2, "the limit is twice the bound: {terms}");
    }

    #[test]
    fn queues_pools_and_shared_memory_grow_the_budget() {
        let base = "[fabric]\nioc = \"10.0.0.1:7400\"\n[interface]\nname = \"sd0\"\n";
        let Budget { bytes: b, terms } = budget(&config(base), TCP);
        assert!(terms.starts_with("1 queues x "), "{terms}");
        let with = |extra: &str| budget(&config(&format!("{base}{extra}")), TCP).bytes;
        let queues = budget(
            &config(&base.replace("name = \"sd0\"", "name = \"sd0\"\nqueues = 4")),
            TCP,
        )
        .bytes;
        assert!(queues > 3 * b, "four queues");
        assert!(with("[pools]\nmax_granted_bytes = 268435456\n") > b + (190 << 20));
        let local = base.replace("10.0.0.1:7400", "unix:/run/splitnet/ioc.sock");
        let shm = budget(&config(&local), TCP).bytes;
        let arena = Setup::pool_size_for(64 << 20);
        assert_eq!(
            shm - b,
            4 * u64::from(RING_DATA) + arena - TCP,
            "rings and the IOC's arena it writes into, not sockets"
        );
        let over_socket = local.replace("[interface]", "shared_memory = false\n[interface]");
        assert_eq!(budget(&config(&over_socket), TCP).bytes, b);
    }
}
