//! Connecting to the IOC: this host's identity (node id and keys), dialling the IOC's
//! address (TCP, or its local Unix socket with or without shared memory) and the handshake
//! of a queue's session.

use splitnet_config::{key, FabricAddr, HostAuth, HostFabric};
use splitnet_fabric::{self as fabric, DataPath, FabricChannel, HostKeys};
use splitnet_messaging::wire::{HelloReply, Queue};
use std::time::Duration;
use tracing::{info, warn};

/// Who this host is to one IOC, and where that IOC is.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The IOC's address (`fabric.ioc`, or one of `fabric.standby`).
    pub ioc: FabricAddr,
    /// Its node id (an IOC that admits by key derives the identity from the key instead).
    pub node_id: u64,
    /// Its keys, when the handshake is authenticated (`auth.ioc_public_key` is set).
    pub keys: Option<HostKeys>,
}

/// This host's keys from `[auth]`: with `ioc_public_key` set, the private key is read from
/// `private_key_file` or the credential `splitnet.key`; without it, the host connects
/// unauthenticated (which only an IOC with open admission accepts), and says so.
pub fn keys(auth: &HostAuth) -> Result<Option<HostKeys>, String> {
    let Some(ioc) = auth.ioc_public_key else {
        warn!("no auth.ioc_public_key: connecting without authentication, which only an IOC with auth.admission = \"open\" accepts");
        return Ok(None);
    };
    let path = key::private_key_path(auth.private_key_file.as_deref()).ok_or(
        "auth.ioc_public_key is set but this host has no private key: set auth.private_key_file, or give the credential splitnet.key (systemd LoadCredential=)",
    )?;
    let private = key::read_private_key(&path)?;
    let public = key::Key(fabric::auth::public_key(&private.0));
    info!(%public, ioc = %ioc, encrypt_data = auth.encrypt_data, "authenticating with this host key");
    Ok(Some(HostKeys {
        private: private.0,
        ioc: ioc.0,
        seal_data: auth.encrypt_data,
        flags: 0,
    }))
}

/// This host to each of its IOCs: the primary (`fabric.ioc`, with `id`'s keys) first, then
/// every standby of `fabric.standby` with its own public key. With a standby, every session
/// asks for the liveness interval (docs/protocol.md 6.4).
pub fn endpoints(cfg: &HostFabric, id: &Identity) -> Vec<Identity> {
    let liveness = match cfg.standby.is_empty() {
        true => 0,
        false => {
            let ms = u16::try_from(cfg.liveness_interval_ms).unwrap_or(u16::MAX);
            HelloReply::with_liveness(0, ms)
        }
    };
    let with = |ioc: &FabricAddr, key: Option<[u8; 32]>| {
        let mut e = id.clone();
        e.ioc = ioc.clone();
        if let Some(k) = e.keys.as_mut() {
            k.flags = liveness;
            if let Some(key) = key {
                k.ioc = key;
            }
        }
        e
    };
    std::iter::once(with(&cfg.ioc, None))
        .chain(
            cfg.standby
                .iter()
                .map(|s| with(&s.ioc, Some(s.public_key.0))),
        )
        .collect()
}

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

/// Opens both channels of `queue`'s session to the IOC of `id` (TCP, or its local Unix
/// socket) and completes the handshake (see [`fabric::connect`]); a `standby` session asks
/// for STANDBY (docs/protocol.md 6.5).
pub async fn connect(
    cfg: &HostFabric,
    pool_bytes: u64,
    id: &Identity,
    queue: Queue,
    first: u64,
    timeout: Duration,
    standby: bool,
) -> Result<(FabricChannel, FabricChannel, HelloReply), fabric::FabricError> {
    let node_id = id.node_id;
    let asked = id.keys.clone().map(|mut k| {
        if standby {
            k.flags |= HelloReply::STANDBY;
        }
        k
    });
    let keys = asked.as_ref();
    match &id.ioc {
        FabricAddr::Tcp(a) => {
            let dial = || fabric::dial_tcp(*a);
            fabric::connect(dial, DataPath::Stream, node_id, queue, first, timeout, keys).await
        }
        FabricAddr::Rdma(a) => {
            let dial = || fabric::dial_tcp(*a);
            let path = DataPath::Verbs { pool_bytes };
            fabric::connect(dial, path, node_id, queue, first, timeout, keys).await
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
                keys,
            )
            .await
        }
    }
}
