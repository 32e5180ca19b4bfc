//! host.toml: the host driver's configuration.

use crate::common::{
    ifname, keepalive, range, unicast, Control, FabricAddr, Log, MacAddr, Metrics, Pools,
    Scheduling,
};
use crate::error::Invalid;
use crate::key::Key;
use serde::Deserialize;
use std::time::Duration;

/// The whole host.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// `[fabric]`: how to reach the IOC.
    pub fabric: HostFabric,
    /// `[interface]`: the TAP.
    #[serde(default)]
    pub interface: Interface,
    /// `[pools]`: receive memory advertised to the IOC.
    #[serde(default)]
    pub pools: Pools,
    /// `[log]`.
    #[serde(default)]
    pub log: Log,
    /// `[scheduling]`: the data-path threads' scheduling class.
    #[serde(default)]
    pub scheduling: Scheduling,
    /// `[metrics]`: the opt-in Prometheus endpoint.
    #[serde(default)]
    pub metrics: Metrics,
    /// `[control]`: the socket of splitnetctl.
    #[serde(default)]
    pub control: Control,
    /// `[auth]`: this host's key and its IOC's.
    #[serde(default)]
    pub auth: HostAuth,
}

/// The `[auth]` section of host.toml.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostAuth {
    /// The IOC's public key: the handshake proves both keys. Absent: no authentication,
    /// which only an IOC with `auth.admission = "open"` accepts.
    #[serde(default)]
    pub ioc_public_key: Option<Key>,
    /// This host's private key file; absent: the credential `splitnet.key` (systemd
    /// `LoadCredential=`).
    #[serde(default)]
    pub private_key_file: Option<std::path::PathBuf>,
    /// Ask that the data channel's bytes travel sealed (encrypted and authenticated) when it
    /// runs over TCP; needs `ioc_public_key`. Off by default: on a fabric the operator
    /// controls, frames go as they would on the wire.
    #[serde(default)]
    pub encrypt_data: bool,
}

/// The `[fabric]` section of host.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFabric {
    /// IOC address (`ADDRESS:PORT`, or `unix:PATH` for an IOC on this machine); both
    /// channels connect here.
    pub ioc: FabricAddr,
    /// Keepalive interval (ms).
    #[serde(default = "default_interval")]
    pub keepalive_interval_ms: u64,
    /// Silence after which the IOC counts as gone (ms).
    #[serde(default = "default_timeout")]
    pub keepalive_timeout_ms: u64,
    /// First reconnect delay (ms).
    #[serde(default = "default_reconnect_min")]
    pub reconnect_min_ms: u64,
    /// Longest reconnect delay (ms).
    #[serde(default = "default_reconnect_max")]
    pub reconnect_max_ms: u64,
    /// How long sd0 keeps its carrier while an IOC that said it is restarting (Goodbye
    /// Restarting) comes back, reconnecting every `reconnect_min_ms` meanwhile (ms; 0: none).
    #[serde(default = "default_restart_grace")]
    pub restart_grace_ms: u64,
    /// With `ioc = "unix:PATH"`: both channels over shared memory (the default) rather
    /// than over the socket.
    #[serde(default = "crate::common::yes")]
    pub shared_memory: bool,
    /// The longest the driver polls what would wake it (the IOC's ring, the completion
    /// queue or the fabric's sockets, and the TAP) before it sleeps (us; 0..=1000; 0, the default, never
    /// polls). The poll adapts below it
    /// (halt-polling style). Off by default: on the 2-core reference machine it did not pay.
    #[serde(default = "default_spin_max")]
    pub spin_max_us: u64,
    /// Poll always: the driver's data-path threads never sleep, each taking a core, as DPDK
    /// users dedicate cores (off by default; README "Polling before sleep").
    #[serde(default)]
    pub busy_poll: bool,
    /// Stable identity of this host; `None` (key absent or 0) derives one at run time.
    #[serde(default)]
    pub node_id: Option<u64>,
    /// Further IOCs on the same LAN, each kept as a warm standby session (handshake done,
    /// pools advertised, no frames) that takes over when the active IOC is lost; tried in
    /// this order, after `ioc` (the primary). Needs `auth.ioc_public_key` (the primary's),
    /// and this host's entry on every IOC needs the same `mac`.
    #[serde(default)]
    pub standby: Vec<StandbyIoc>,
    /// With a standby: the Keepalive interval asked of every IOC (ms, 10..=1000); an IOC
    /// that sends nothing for `liveness_interval_ms * liveness_misses` counts as gone.
    #[serde(default = "default_liveness_interval")]
    pub liveness_interval_ms: u64,
    /// With a standby: Keepalive intervals missed before the active IOC counts as gone
    /// (2..=20).
    #[serde(default = "default_liveness_misses")]
    pub liveness_misses: u32,
    /// With a standby: go back to the primary (`ioc`) once it has been a ready standby for
    /// this long (s, 1..=86400); absent, the default: never (stay until the active fails).
    #[serde(default)]
    pub failback_after_s: Option<u64>,
    /// After a move to another IOC: how many times sd0's addresses are announced to the
    /// LAN through it (gratuitous ARP, unsolicited neighbour advertisements), 1..=10.
    #[serde(default = "default_announce_count")]
    pub announce_count: u32,
    /// Time between those announcements (ms, 10..=10000).
    #[serde(default = "default_announce_interval")]
    pub announce_interval_ms: u64,
    /// Use the express lane where the IOC offers it (docs/protocol.md 6.6): frames of sparse
    /// flows go as SendData on the control channel, ahead of the bulk. Off by default: on
    /// the 2-core reference machine it shortened a ping beside a full-speed upload but
    /// lengthened one beside a download or a 2 Gb/s transfer (README, "The express lane").
    #[serde(default)]
    pub express: bool,
}

/// One standby IOC of `fabric.standby`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandbyIoc {
    /// Its address, as `fabric.ioc`.
    pub ioc: FabricAddr,
    /// Its public key: the handshake proves it, as `auth.ioc_public_key` the primary's.
    pub public_key: Key,
}

fn default_liveness_interval() -> u64 {
    25
}
fn default_liveness_misses() -> u32 {
    4
}
fn default_announce_count() -> u32 {
    3
}
fn default_announce_interval() -> u64 {
    100
}

fn default_spin_max() -> u64 {
    0
}

pub(crate) fn default_interval() -> u64 {
    200
}
pub(crate) fn default_timeout() -> u64 {
    750
}
fn default_reconnect_min() -> u64 {
    100
}
fn default_reconnect_max() -> u64 {
    500
}
fn default_restart_grace() -> u64 {
    2000
}

impl HostFabric {
    /// Keepalive interval.
    pub fn keepalive_interval(&self) -> Duration {
        Duration::from_millis(self.keepalive_interval_ms)
    }
    /// Keepalive timeout.
    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_millis(self.keepalive_timeout_ms)
    }
    /// First reconnect delay.
    pub fn reconnect_min(&self) -> Duration {
        Duration::from_millis(self.reconnect_min_ms)
    }
    /// Longest reconnect delay.
    pub fn reconnect_max(&self) -> Duration {
        Duration::from_millis(self.reconnect_max_ms)
    }
    /// How long the carrier stays while a restarting IOC comes back.
    pub fn restart_grace(&self) -> Duration {
        Duration::from_millis(self.restart_grace_ms)
    }
    /// Longest poll before sleeping, over shared memory.
    pub fn spin_max(&self) -> Duration {
        Duration::from_micros(self.spin_max_us)
    }
    /// The Keepalive interval asked of every IOC when there is a standby.
    pub fn liveness_interval(&self) -> Duration {
        Duration::from_millis(self.liveness_interval_ms)
    }
    /// How long the primary must have been a ready standby before the host goes back to
    /// it (`None`: never).
    pub fn failback_after(&self) -> Option<Duration> {
        self.failback_after_s.map(Duration::from_secs)
    }
    /// Time between announcements after a move.
    pub fn announce_interval(&self) -> Duration {
        Duration::from_millis(self.announce_interval_ms)
    }
}

/// The `[interface]` section of host.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Interface {
    /// TAP name.
    pub name: String,
    /// MAC address overriding the one the IOC assigns.
    pub mac: Option<MacAddr>,
    /// Checksum and segmentation offload pass-through.
    pub offload: bool,
    /// TAP queues, each served by a thread of its own over a fabric session of its own
    /// (1..=16; more than one where the host gives the driver more than one core).
    pub queues: u16,
    /// The interface outlives the driver (a persistent TAP): carrier off while no driver
    /// serves it, addresses, routes, MAC and MTU kept, re-attached by the next driver.
    /// `false`: it goes away when the driver stops, as a plain TAP does.
    pub persist: bool,
}

impl Default for Interface {
    fn default() -> Interface {
        Interface {
            name: "sd0".into(),
            mac: None,
            offload: true,
            queues: 1,
            persist: true,
        }
    }
}

impl HostConfig {
    /// Maps values with a "use the default" meaning onto it (`node_id = 0` is absent).
    pub(crate) fn normalize(&mut self) {
        self.fabric.node_id = self.fabric.node_id.filter(|&id| id != 0);
    }

    /// Checks `fabric.standby` and the settings that go with it.
    fn validate_standby(&self) -> Result<(), Invalid> {
        let f = &self.fabric;
        range(
            "fabric.liveness_interval_ms",
            f.liveness_interval_ms,
            10,
            1000,
        )?;
        range("fabric.liveness_misses", f.liveness_misses.into(), 2, 20)?;
        if let Some(s) = f.failback_after_s {
            range("fabric.failback_after_s", s, 1, 86_400)?;
        }
        range("fabric.announce_count", f.announce_count.into(), 1, 10)?;
        range(
            "fabric.announce_interval_ms",
            f.announce_interval_ms,
            10,
            10_000,
        )?;
        if f.standby.is_empty() {
            return Ok(());
        }
        if f.standby.len() > 4 {
            return Err(Invalid::new(
                "fabric.standby",
                format!("{} standby IOCs; at most 4", f.standby.len()),
            ));
        }
        if self.auth.ioc_public_key.is_none() {
            return Err(Invalid::new(
                "fabric.standby",
                "needs auth.ioc_public_key: a standby session is asked for in the authenticated handshake, each IOC proving its key",
            ));
        }
        for (i, s) in f.standby.iter().enumerate() {
            if let FabricAddr::Tcp(a) | FabricAddr::Rdma(a) = s.ioc {
                if a.port() == 0 || a.ip().is_unspecified() {
                    return Err(Invalid::new(
                        "fabric.standby",
                        format!("{a} is not a connectable address"),
                    ));
                }
            }
            let before = std::iter::once(&f.ioc).chain(f.standby[..i].iter().map(|s| &s.ioc));
            if before.into_iter().any(|a| *a == s.ioc) {
                return Err(Invalid::new(
                    "fabric.standby",
                    format!(
                        "{} is named twice (an IOC is the primary or one standby)",
                        s.ioc
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        let f = &self.fabric;
        keepalive(f.keepalive_interval_ms, f.keepalive_timeout_ms)?;
        range("fabric.reconnect_min_ms", f.reconnect_min_ms, 10, 60_000)?;
        range(
            "fabric.reconnect_max_ms",
            f.reconnect_max_ms,
            f.reconnect_min_ms,
            600_000,
        )?;
        range("fabric.restart_grace_ms", f.restart_grace_ms, 0, 60_000)?;
        crate::common::polling(f.spin_max_us, f.busy_poll, &self.scheduling)?;
        if let FabricAddr::Tcp(a) | FabricAddr::Rdma(a) = f.ioc {
            if a.port() == 0 || a.ip().is_unspecified() {
                return Err(Invalid::new(
                    "fabric.ioc",
                    format!("{a} is not a connectable address"),
                ));
            }
        }
        if self.auth.encrypt_data && matches!(f.ioc, FabricAddr::Rdma(_)) {
            return Err(Invalid::new(
                "auth.encrypt_data",
                "cannot seal a data channel over RDMA (fabric.ioc = \"rdma:...\"): the adapter writes frames into memory",
            ));
        }
        if self.auth.encrypt_data && self.auth.ioc_public_key.is_none() {
            return Err(Invalid::new(
                "auth.encrypt_data",
                "needs auth.ioc_public_key: the keys of the handshake seal the data channel",
            ));
        }
        self.validate_standby()?;
        ifname("interface.name", &self.interface.name)?;
        if let Some(mac) = self.interface.mac {
            unicast("interface.mac", mac)?;
        }
        // The protocol's limit (wire::MAX_QUEUES), as a multi-queue TAP allows many more.
        if !(1..=16).contains(&self.interface.queues) {
            return Err(Invalid::new(
                "interface.queues",
                format!(
                    "{} queues requested; between 1 and 16",
                    self.interface.queues
                ),
            ));
        }
        self.pools.validate()?;
        self.metrics.validate()?;
        self.control.validate()?;
        self.scheduling.validate()?;
        self.log.validate()
    }
}
