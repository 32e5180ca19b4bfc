//! ioc.toml: the I/O unit driver's configuration.

use crate::common::{
    ifname, keepalive, range, unicast, Control, Log, MacAddr, Metrics, Pools, Scheduling,
};
use crate::error::Invalid;
use crate::host::{default_interval, default_timeout};
use crate::key::Key;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

/// The whole ioc.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IocConfig {
    /// `[fabric]`: where hosts connect.
    pub fabric: IocFabric,
    /// `[lan]`: the NIC.
    pub lan: Lan,
    /// `[pools]`: receive memory advertised to each host.
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
    /// `[auth]`: who may connect, and this IOC's key.
    #[serde(default)]
    pub auth: IocAuth,
}

/// The `[auth]` section of ioc.toml.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IocAuth {
    /// Who becomes a host: only the listed keys, or anyone (a lab).
    #[serde(default)]
    pub admission: Admission,
    /// This IOC's private key file; absent: the credential `splitnet.key` (systemd
    /// `LoadCredential=`).
    #[serde(default)]
    pub private_key_file: Option<std::path::PathBuf>,
    /// `[[auth.hosts]]`: the admitted hosts.
    #[serde(default)]
    pub hosts: Vec<AdmittedHost>,
    /// Refuse a data channel over TCP whose host did not ask for it sealed (a host's
    /// `auth.encrypt_data`). Off: each host decides; a host that asks is always agreed to.
    #[serde(default)]
    pub encrypt_data: bool,
}

/// Who may become a host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    /// Only the hosts of `[[auth.hosts]]`, each proving its key (the default).
    #[default]
    Keys,
    /// Anyone who reaches the fabric, with or without a key: a lab setting, logged loudly.
    Open,
}

/// One admitted host: its public key and its policy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmittedHost {
    /// A name for logs and reports (1 to 64 printable characters).
    pub name: String,
    /// The host's public key (`splitnetctl pubkey` of its private key).
    pub public_key: Key,
    /// The host's MAC; absent: derived from its key under `lan.mac_base`.
    #[serde(default)]
    pub mac: Option<MacAddr>,
    /// MACs of machines bridged behind the host (containers, VMs): it may send from them,
    /// and frames to them reach it without promiscuous mode (at most 64).
    #[serde(default)]
    pub extra_macs: Vec<MacAddr>,
    /// Whether it may turn promiscuous (then it also gets the LAN's frames for no host).
    #[serde(default)]
    pub promiscuous: bool,
    /// Queues the host may open (sessions of its key at once: one per queue of sd0); 1 to
    /// [`MAX_HOST_QUEUES`], 1 unless set. Sessions beyond are refused (Busy).
    #[serde(default = "default_queues")]
    pub queues: u16,
    /// Access VLAN (1 to 4094): the host sends and receives untagged frames, which travel on
    /// this VLAN (tagged towards the NIC); its tagged frames are dropped.
    #[serde(default)]
    pub vlan: Option<u16>,
    /// Trunk VLANs (1 to 4094; 0: untagged frames too): the host sends and receives its
    /// frames tagged with these VLANs only (at most [`MAX_TRUNK_VLANS`]).
    #[serde(default)]
    pub vlans: Vec<u16>,
    /// With `lan.mode = "ports"`: the name of the host's port on the IOC's machine; absent:
    /// derived from `name` ([`AdmittedHost::port_name`]).
    #[serde(default)]
    pub port: Option<String>,
}

/// What a port's name derived from a host's name starts with.
pub const PORT_PREFIX: &str = "sdp-";

/// Most VLANs a trunk host's entry lists.
pub const MAX_TRUNK_VLANS: usize = 64;

/// Most queues one host's entry may allow.
pub const MAX_HOST_QUEUES: u16 = 16;

fn default_queues() -> u16 {
    1
}

impl AdmittedHost {
    /// Every MAC the entry reserves for its host: its `mac`, if set, and its `extra_macs`.
    pub fn reserved_macs(&self) -> impl Iterator<Item = [u8; 6]> + '_ {
        self.mac.iter().chain(self.extra_macs.iter()).map(|m| m.0)
    }

    /// The host's port (`lan.mode = "ports"`): `port`, or [`PORT_PREFIX`] and the name's
    /// ASCII letters, digits, `-` and `_` (others become `-`), cut to the 15 bytes of an
    /// interface name.
    pub fn port_name(&self) -> String {
        if let Some(p) = &self.port {
            return p.clone();
        }
        let tail = self.name.chars().map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            _ => '-',
        });
        PORT_PREFIX.chars().chain(tail).take(15).collect()
    }
}

impl IocAuth {
    /// The admitted host whose public key is `key`.
    pub fn host(&self, key: &[u8; 32]) -> Option<&AdmittedHost> {
        self.hosts.iter().find(|h| &h.public_key.0 == key)
    }

    /// Checks that every entry's port name is an interface name and none is another's
    /// (`lan.mode = "ports"`; a derived name that clashes needs a `port` of its own).
    pub(crate) fn validate_ports(&self) -> Result<(), Invalid> {
        let mut seen: HashMap<String, &str> = HashMap::new();
        for h in &self.hosts {
            let port = h.port_name();
            ifname("auth.hosts.port", &port)?;
            if let Some(other) = seen.insert(port.clone(), &h.name) {
                return Err(Invalid::new(
                    "auth.hosts.port",
                    format!(
                        "hosts {other:?} and {:?} would both have port {port:?}: give one a `port` of its own",
                        h.name
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), Invalid> {
        range("auth.hosts", self.hosts.len() as u64, 0, 1024)?;
        for (i, h) in self.hosts.iter().enumerate() {
            let bad_name = h.name.is_empty()
                || h.name.chars().count() > 64
                || h.name.chars().any(|c| c.is_control());
            if bad_name {
                return Err(Invalid::new(
                    "auth.hosts.name",
                    format!("{:?}: 1 to 64 printable characters are required", h.name),
                ));
            }
            if let Some(mac) = h.mac {
                unicast("auth.hosts.mac", mac)?;
            }
            range("auth.hosts.extra_macs", h.extra_macs.len() as u64, 0, 64)?;
            if let Some(v) = h.vlan {
                range("auth.hosts.vlan", v.into(), 1, 4094)?;
                if !h.vlans.is_empty() {
                    return Err(Invalid::new(
                        "auth.hosts.vlan",
                        format!(
                            "host {:?} has both vlan (access) and vlans (trunk): one or the other",
                            h.name
                        ),
                    ));
                }
            }
            range(
                "auth.hosts.vlans",
                h.vlans.len() as u64,
                0,
                MAX_TRUNK_VLANS as u64,
            )?;
            for (j, v) in h.vlans.iter().enumerate() {
                range("auth.hosts.vlans", (*v).into(), 0, 4094)?;
                if h.vlans[..j].contains(v) {
                    return Err(Invalid::new(
                        "auth.hosts.vlans",
                        format!("host {:?} lists vlan {v} twice", h.name),
                    ));
                }
            }
            range(
                "auth.hosts.queues",
                h.queues.into(),
                1,
                MAX_HOST_QUEUES.into(),
            )?;
            for mac in &h.extra_macs {
                unicast("auth.hosts.extra_macs", *mac)?;
            }
            let macs = |h: &AdmittedHost| h.reserved_macs().collect::<Vec<_>>();
            let mine = macs(h);
            if let Some(m) = mine
                .iter()
                .enumerate()
                .find(|(j, m)| mine[..*j].contains(m))
            {
                return Err(Invalid::new(
                    "auth.hosts",
                    format!("host {:?} lists mac {} twice", h.name, MacAddr(*m.1)),
                ));
            }
            for other in &self.hosts[..i] {
                let shared = macs(other).into_iter().find(|m| mine.contains(m));
                let clash = if other.name == h.name {
                    Some(format!("name {:?}", h.name))
                } else if other.public_key == h.public_key {
                    Some(format!("public key {}", h.public_key))
                } else {
                    shared.map(|m| format!("mac {}", MacAddr(m)))
                };
                if let Some(what) = clash {
                    return Err(Invalid::new(
                        "auth.hosts",
                        format!("two hosts have the same {what}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The `[fabric]` section of ioc.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IocFabric {
    /// Listening address.
    pub listen: SocketAddr,
    /// Sessions served at once: one per host, one per queue of a multi-queue host.
    #[serde(default = "default_max_hosts")]
    pub max_hosts: u32,
    /// Keepalive interval (ms).
    #[serde(default = "default_interval")]
    pub keepalive_interval_ms: u64,
    /// Silence after which a host counts as gone (ms).
    #[serde(default = "default_timeout")]
    pub keepalive_timeout_ms: u64,
    /// Time a new connection has to complete its handshake (ms).
    #[serde(default = "default_handshake")]
    pub handshake_timeout_ms: u64,
    /// Connections allowed in their handshake at once; more are closed at once.
    #[serde(default = "default_max_handshakes")]
    pub max_handshakes: u32,
    /// A Unix stream socket hosts on this machine may connect to as well (`unix:PATH` in
    /// their `fabric.ioc`); none unless set.
    #[serde(default)]
    pub listen_local: Option<std::path::PathBuf>,
    /// The group (a name in /etc/group, or a number) whose members may connect to
    /// `listen_local` besides root and the IOC's own user: the socket is given to it with
    /// mode 0660; none unless set.
    #[serde(default)]
    pub listen_local_group: Option<String>,
    /// Worker threads the sessions are spread over; 0 (the default): one per core, at
    /// most `max_hosts`.
    #[serde(default)]
    pub workers: u32,
    /// Accept data channels over RDMA verbs (hosts with `fabric.ioc = "rdma:..."`), on the
    /// RDMA device whose GID table holds the address a host connected to; off by default.
    #[serde(default)]
    pub rdma: bool,
    /// Offer hosts the express lane (docs/protocol.md 6.6): frames of sparse flows go as
    /// SendData on the control channel, ahead of the bulk, both ways; on by default.
    #[serde(default = "crate::common::yes")]
    pub express: bool,
    /// The longest a worker polls its sockets, doorbells and NIC queues before it sleeps
    /// (us; 0..=1000; 0, the default, never polls). The poll adapts below it (halt-polling
    /// style), as host-driver's does. Off by default: on the 2-core reference machine it
    /// did not pay (README "Polling before sleep").
    #[serde(default)]
    pub spin_max_us: u64,
    /// Poll always: the workers never sleep, each taking a core, as DPDK users dedicate
    /// cores (off by default; needs `workers` set; README "Polling before sleep").
    #[serde(default)]
    pub busy_poll: bool,
}

fn default_max_hosts() -> u32 {
    8
}
fn default_handshake() -> u64 {
    2000
}
fn default_max_handshakes() -> u32 {
    32
}

impl IocFabric {
    /// How many workers to run: `workers`, or with 0 one per core the process may use;
    /// never more than `max_hosts` (a worker without a host would do nothing).
    pub fn worker_count(&self) -> usize {
        let n = match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        };
        n.clamp(1, self.max_hosts.max(1) as usize)
    }
    /// Keepalive interval.
    pub fn keepalive_interval(&self) -> Duration {
        Duration::from_millis(self.keepalive_interval_ms)
    }
    /// Keepalive timeout.
    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_millis(self.keepalive_timeout_ms)
    }
    /// Handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    /// The workers' longest poll before they sleep (zero: no poll).
    pub fn spin_max(&self) -> Duration {
        Duration::from_micros(self.spin_max_us)
    }
}

/// Promiscuous mode of the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Promiscuous {
    /// The hosts' MACs in the NIC's unicast filter; promiscuous while a host is, or where the
    /// NIC cannot filter unicast addresses (the kernel's choice).
    #[default]
    Auto,
    /// Always on.
    On,
    /// Never: only frames for the NIC's own MAC and group addresses arrive.
    Off,
}

/// How the IOC joins its hosts to the LAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LanMode {
    /// The IOC is the hosts' switch on `lan.interface`, which it reads and writes with
    /// AF_PACKET.
    #[default]
    Shared,
    /// Every admitted host has a network device of its own on the IOC's machine, its port,
    /// which a bridge or Open vSwitch switches.
    Ports,
}

/// The `[lan]` section of ioc.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lan {
    /// Shared (the IOC switches on the NIC) or ports (a device per host).
    #[serde(default)]
    pub mode: LanMode,
    /// The NIC (shared mode; not opened in ports mode).
    #[serde(default)]
    pub interface: String,
    /// Ports mode: the Linux bridge every port joins as it is made.
    #[serde(default)]
    pub bridge: Option<String>,
    /// Ports mode: a program run as each port is added, changed and removed, with the port,
    /// host and policy in its environment (README, "Ports mode").
    #[serde(default)]
    pub port_hook: Option<std::path::PathBuf>,
    /// Promiscuous mode.
    #[serde(default)]
    pub promiscuous: Promiscuous,
    /// Prefix of the MACs assigned to hosts (first three octets used).
    #[serde(default = "default_mac_base")]
    pub mac_base: MacAddr,
    /// MTU offered to hosts; absent takes the NIC's.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Offload pass-through on the NIC side.
    #[serde(default = "default_true")]
    pub offload: bool,
    /// Source MACs a host may send from besides its own (virtual machines bridged behind
    /// a host); frames from any other source are dropped and counted.
    #[serde(default)]
    pub extra_source_macs: Vec<MacAddr>,
    /// Which addresses a host may take with SetMac.
    #[serde(default)]
    pub set_mac: SetMacPolicy,
    /// Storm control: broadcast and multicast frames one host may send per second (twice
    /// that at once); beyond, they are dropped and counted. 0: no limit.
    #[serde(default = "default_storm_control_pps")]
    pub storm_control_pps: u32,
    /// Receive queues of each worker on the NIC: packet sockets in the NIC's fanout group
    /// among which the kernel spreads each worker's frames by flow hash, read round robin,
    /// so that a bulk flow's backlog waits in its own queue and not in front of a ping.
    #[serde(default = "default_rx_queues")]
    pub rx_queues: u32,
    /// Each receive queue reads the NIC through a ring mapped from the kernel
    /// (`PACKET_RX_RING`): frames of a usual MTU without a system call, longer ones as
    /// without it. Off by default (README, "The NIC's mapped ring").
    #[serde(default)]
    pub rx_ring: bool,
}

fn default_storm_control_pps() -> u32 {
    5000
}

/// Most receive queues per worker.
pub const MAX_RX_QUEUES: u32 = 16;

fn default_rx_queues() -> u32 {
    DEFAULT_RX_QUEUES
}

/// Receive queues per worker unless configured: one, by measurement (README, "Measured":
/// on two shared cores a second queue per worker cost the busy worker more than the wait it
/// saved a ping).
pub const DEFAULT_RX_QUEUES: u32 = 1;

/// Which MAC addresses a host may set for itself (CfgUtil SetMac).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SetMacPolicy {
    /// Unicast addresses under `mac_base`'s first three octets, not used by another host.
    #[default]
    Prefix,
    /// Any unicast address not used by another host.
    Any,
    /// None: hosts keep the MAC the IOC assigned.
    Off,
}

impl SetMacPolicy {
    /// True when a host may take `mac` (`base`: the configured prefix); whether another
    /// host uses it is checked apart.
    pub fn allows(self, mac: [u8; 6], base: [u8; 6]) -> bool {
        let unicast = mac[0] & 1 == 0 && mac != [0; 6];
        match self {
            SetMacPolicy::Prefix => unicast && mac[..3] == base[..3],
            SetMacPolicy::Any => unicast,
            SetMacPolicy::Off => false,
        }
    }
}

fn default_mac_base() -> MacAddr {
    MacAddr([0x02, 0x5d, 0, 0, 0, 0])
}
fn default_true() -> bool {
    true
}

impl IocConfig {
    /// What differs between this configuration and `new` that a reload cannot apply, by
    /// section or key (empty: `new` can be reloaded). A reload applies `[auth]` but for
    /// `auth.private_key_file`; everything else needs a restart.
    pub fn restart_needed(&self, new: &IocConfig) -> Vec<&'static str> {
        let differs = [
            ("[fabric]", self.fabric != new.fabric),
            ("[lan]", self.lan != new.lan),
            ("[pools]", self.pools != new.pools),
            ("[log]", self.log != new.log),
            ("[scheduling]", self.scheduling != new.scheduling),
            ("[metrics]", self.metrics != new.metrics),
            ("[control]", self.control != new.control),
            (
                "auth.private_key_file",
                self.auth.private_key_file != new.auth.private_key_file,
            ),
        ];
        differs
            .into_iter()
            .filter_map(|(name, changed)| changed.then_some(name))
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        let f = &self.fabric;
        if f.listen.port() == 0 {
            return Err(Invalid::new(
                "fabric.listen",
                format!("{}: a fixed port is required", f.listen),
            ));
        }
        range("fabric.max_hosts", f.max_hosts.into(), 1, 64)?;
        range("fabric.max_handshakes", f.max_handshakes.into(), 1, 1024)?;
        range("fabric.workers", f.workers.into(), 0, 64)?;
        if let Some(p) = &f.listen_local {
            let bytes = p.as_os_str().len();
            if !p.is_absolute() || bytes > 107 {
                return Err(Invalid::new(
                    "fabric.listen_local",
                    format!(
                        "{}: an absolute path of at most 107 bytes is required",
                        p.display()
                    ),
                ));
            }
        }
        if let Some(g) = &f.listen_local_group {
            if f.listen_local.is_none() {
                return Err(Invalid::new(
                    "fabric.listen_local_group",
                    "is set without fabric.listen_local",
                ));
            }
            if g.is_empty() || g.len() > 32 || g.contains(|c: char| c == ':' || c.is_whitespace()) {
                return Err(Invalid::new(
                    "fabric.listen_local_group",
                    format!("{g:?} is not a group name or number"),
                ));
            }
        }
        keepalive(f.keepalive_interval_ms, f.keepalive_timeout_ms)?;
        range(
            "fabric.handshake_timeout_ms",
            f.handshake_timeout_ms,
            100,
            60_000,
        )?;
        crate::common::polling(f.spin_max_us, f.busy_poll, &self.scheduling)?;
        if f.busy_poll && f.workers == 0 {
            return Err(Invalid::new(
                "fabric.busy_poll",
                "needs fabric.workers set to the cores the workers may take: each busy worker takes a core, and workers = 0 (one per core) would take them all",
            ));
        }
        match self.lan.mode {
            LanMode::Shared => {
                ifname("lan.interface", &self.lan.interface)?;
                for (key, set) in [
                    ("lan.bridge", self.lan.bridge.is_some()),
                    ("lan.port_hook", self.lan.port_hook.is_some()),
                ] {
                    if set {
                        return Err(Invalid::new(key, "applies to lan.mode = \"ports\" only"));
                    }
                }
            }
            LanMode::Ports => {
                if !self.lan.interface.is_empty() {
                    return Err(Invalid::new(
                        "lan.interface",
                        "is not opened with lan.mode = \"ports\" (the bridge or switch owns the NIC): remove it",
                    ));
                }
                if let Some(b) = &self.lan.bridge {
                    ifname("lan.bridge", b)?;
                }
                if let Some(p) = &self.lan.port_hook {
                    if !p.is_absolute() {
                        return Err(Invalid::new(
                            "lan.port_hook",
                            format!("{}: an absolute path is required", p.display()),
                        ));
                    }
                }
                self.auth.validate_ports()?;
            }
        }
        unicast("lan.mac_base", self.lan.mac_base)?;
        range(
            "lan.extra_source_macs",
            self.lan.extra_source_macs.len() as u64,
            0,
            256,
        )?;
        for mac in &self.lan.extra_source_macs {
            unicast("lan.extra_source_macs", *mac)?;
        }
        if !self.lan.extra_source_macs.is_empty() && self.auth.admission == Admission::Keys {
            return Err(Invalid::new(
                "lan.extra_source_macs",
                "would let every host send from these MACs; with auth.admission = \"keys\" \
                 list each in the extra_macs of the host it is bridged behind",
            ));
        }
        if let Some(mtu) = self.lan.mtu {
            range("lan.mtu", mtu.into(), 68, 65_535)?;
        }
        range(
            "lan.storm_control_pps",
            self.lan.storm_control_pps.into(),
            0,
            10_000_000,
        )?;
        range(
            "lan.rx_queues",
            self.lan.rx_queues.into(),
            1,
            MAX_RX_QUEUES.into(),
        )?;
        self.pools.validate()?;
        self.metrics.validate()?;
        self.control.validate()?;
        self.auth.validate()?;
        self.scheduling.validate()?;
        self.log.validate()
    }
}
