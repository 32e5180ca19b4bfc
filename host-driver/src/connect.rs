//! Connecting to the IOC: this host's node id, dialling the IOC's address (TCP, or its
//! local Unix socket with or without shared memory) and the handshake of a queue's session.

use splitnet_config::{FabricAddr, HostFabric};
use splitnet_fabric::{self as fabric, DataPath, FabricChannel};
use splitnet_messaging::wire::{HelloReply, Queue};
use std::time::Duration;

/// A stable identity for this host: its machine id and interface name, unless configured.
pub fn default_node_id(ifname: &str) -> u64 {
    let machine = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    // The fabric address distinguishes hosts that share a machine id (namespaces, clones).
    let host = splitnet_netif::hostname();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in machine
        .trim()
        .bytes()
        .chain(host.trim().bytes())
        .chain(ifname.bytes())
        .chain(netns_inode().to_le_bytes())
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn netns_inode() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Opens both channels of `queue`'s session to the IOC at `ioc` (TCP, or its local Unix
/// socket) and completes the handshake (see [`fabric::connect`]).
pub async fn connect(
    cfg: &HostFabric,
    pool_bytes: u64,
    node_id: u64,
    queue: Queue,
    first: u64,
    timeout: Duration,
) -> Result<(FabricChannel, FabricChannel, HelloReply), fabric::FabricError> {
    match &cfg.ioc {
        FabricAddr::Tcp(a) => {
            let dial = || fabric::dial_tcp(*a);
            fabric::connect(dial, DataPath::Stream, node_id, queue, first, timeout).await
        }
        FabricAddr::Unix(p) => {
            let path = if cfg.shared_memory {
                DataPath::Shm { pool_bytes }
            } else {
                DataPath::Stream
            };
            fabric::connect(
                || fabric::dial_unix(p),
                path,
                node_id,
                queue,
                first,
                timeout,
            )
            .await
        }
    }
}
