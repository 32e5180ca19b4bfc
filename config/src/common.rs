//! Sections and value types shared by both daemons: pools, logging, MAC addresses,
//! interface names and range checks.

use crate::error::Invalid;
use serde::{Deserialize, Deserializer};
use splitnet_messaging::endpoint::{InitiatorConfig, PoolSpec, SessionConfig, TargetConfig};
use std::fmt;
use std::str::FromStr;

/// A MAC address (`"02:00:00:00:00:01"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// True for a unicast address (group bit, bit 0 of the first octet, clear).
    pub fn is_unicast(&self) -> bool {
        self.0[0] & 1 == 0
    }

    /// True for 00:00:00:00:00:00.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 6]
    }
}

impl FromStr for MacAddr {
    type Err = String;

    /// Parses six colon-separated pairs of hex digits.
    fn from_str(s: &str) -> Result<MacAddr, String> {
        let bad = || format!("{s:?} is not a MAC address (xx:xx:xx:xx:xx:xx)");
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for b in mac.iter_mut() {
            let p = parts
                .next()
                .filter(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_hexdigit()))
                .ok_or_else(bad)?;
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where the IOC's fabric listens, as a host dials it: `ADDRESS:PORT` over TCP (another
/// machine), or `unix:PATH`, a Unix stream socket (daemons on one machine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricAddr {
    /// TCP.
    Tcp(std::net::SocketAddr),
    /// A Unix stream socket's path.
    Unix(std::path::PathBuf),
    /// TCP for the handshake and the control channel, the data channel over an RDMA queue
    /// pair on the device that holds the connection's address (`rdma:ADDRESS:PORT`).
    Rdma(std::net::SocketAddr),
}

impl FromStr for FabricAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<FabricAddr, String> {
        match s.strip_prefix("unix:") {
            Some(path) if path.starts_with('/') && path.len() < 108 => {
                Ok(FabricAddr::Unix(path.into()))
            }
            Some(path) => Err(format!(
                "unix:{path}: an absolute path of at most 107 bytes is required"
            )),
            None => match s.strip_prefix("rdma:") {
                Some(a) => a.parse().map(FabricAddr::Rdma),
                None => s.parse().map(FabricAddr::Tcp),
            }
            .map_err(|_| format!("{s}: not ADDRESS:PORT, rdma:ADDRESS:PORT or unix:PATH")),
        }
    }
}

impl fmt::Display for FabricAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricAddr::Tcp(a) => a.fmt(f),
            FabricAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            FabricAddr::Rdma(a) => write!(f, "rdma:{a}"),
        }
    }
}

impl<'de> Deserialize<'de> for FabricAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<FabricAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One receive pool: element size and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Bytes per element.
    pub element_size: u32,
    /// Number of elements.
    pub element_count: u32,
}

fn default_advertise() -> Vec<PoolConfig> {
    vec![
        PoolConfig {
            element_size: 2048,
            element_count: 256,
        },
        PoolConfig {
            element_size: 65_600,
            element_count: 64,
        },
    ]
}

/// The `[pools]` section: receive memory this side advertises to its peer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pools {
    /// Pools advertised when a connection starts.
    pub advertise: Vec<PoolConfig>,
    /// Frames of at most this many bytes go inline as SendData.
    pub send_data_max: usize,
    /// Free elements gathered before they are returned in one BufferRecvPoolUpdate.
    pub credit_batch: u32,
    /// Pool memory granted to the peer at most (advertised plus BufferRecvPoolGet).
    pub max_granted_bytes: u64,
}

impl Default for Pools {
    fn default() -> Pools {
        Pools {
            advertise: default_advertise(),
            send_data_max: 128,
            credit_batch: 16,
            max_granted_bytes: 64 << 20,
        }
    }
}

impl Pools {
    /// The protocol's session settings these pools give, the same on both sides: the pools
    /// to advertise, the credit and grant bounds, and the pool asked for with
    /// BufferRecvPoolGet when the peer's run out (the largest element size).
    pub fn session_config(&self) -> SessionConfig {
        let advertise: Vec<PoolSpec> = self
            .advertise
            .iter()
            .map(|p| PoolSpec {
                element_size: p.element_size,
                element_count: p.element_count,
            })
            .collect();
        let largest = advertise.iter().max_by_key(|p| p.element_size).copied();
        SessionConfig {
            target: TargetConfig {
                credit_batch: self.credit_batch,
                max_granted_bytes: self.max_granted_bytes,
                max_pools: 16,
                max_element_size: 1 << 20,
            },
            initiator: InitiatorConfig {
                send_data_max: self.send_data_max,
                max_pools: 16,
                max_elements: 65_536,
                pool_get: largest,
            },
            advertise,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        let n = self.advertise.len();
        if !(1..=16).contains(&n) {
            return Err(Invalid::new(
                "pools.advertise",
                format!("{n} pools given, 1 to 16 allowed"),
            ));
        }
        let mut total: u64 = 0;
        for (i, p) in self.advertise.iter().enumerate() {
            let key = |f: &str| format!("pools.advertise[{i}].{f}");
            range(&key("element_size"), p.element_size.into(), 256, 1 << 20)?;
            if p.element_size % 8 != 0 {
                return Err(Invalid::new(
                    key("element_size"),
                    format!("{} is not a multiple of 8", p.element_size),
                ));
            }
            range(&key("element_count"), p.element_count.into(), 1, 4096)?;
            let bytes = u64::from(p.element_size) * u64::from(p.element_count);
            if bytes > 256 << 20 {
                return Err(Invalid::new(
                    format!("pools.advertise[{i}]"),
                    format!("{bytes} bytes in one pool, at most 256 MiB allowed"),
                ));
            }
            total += bytes;
        }
        range("pools.send_data_max", self.send_data_max as u64, 0, 1024)?;
        range("pools.credit_batch", self.credit_batch.into(), 1, 256)?;
        range(
            "pools.max_granted_bytes",
            self.max_granted_bytes,
            1 << 20,
            4 << 30,
        )?;
        if total > self.max_granted_bytes {
            return Err(Invalid::new(
                "pools.advertise",
                format!(
                    "{total} bytes advertised exceed pools.max_granted_bytes ({})",
                    self.max_granted_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// The `[metrics]` section: counters in Prometheus text format over HTTP, off unless a
/// listening address is given.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Where to serve `GET /metrics` (e.g. "127.0.0.1:9701"); absent: no listener.
    pub listen: Option<std::net::SocketAddr>,
}

impl Metrics {
    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        match self.listen {
            Some(a) if a.port() == 0 => Err(Invalid::new(
                "metrics.listen",
                format!("{a}: a fixed port is required"),
            )),
            _ => Ok(()),
        }
    }
}

/// The `[control]` section: the Unix socket `splitnetctl` talks to (root only).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    /// Listen on the control socket at all.
    pub enabled: bool,
    /// Where; absent: the daemon's default (/run/host-driver/control.sock for sd0,
    /// /run/host-driver/control-IFNAME.sock for another interface,
    /// /run/ioc-driver/control.sock).
    pub socket: Option<std::path::PathBuf>,
}

impl Default for Control {
    fn default() -> Control {
        Control {
            enabled: true,
            socket: None,
        }
    }
}

impl Control {
    /// The socket to listen on: `explicit` (a command-line override, which also enables
    /// it), else the configured path or `default`; `None` when disabled.
    pub fn socket_path(
        &self,
        explicit: Option<std::path::PathBuf>,
        default: impl Into<std::path::PathBuf>,
    ) -> Option<std::path::PathBuf> {
        match explicit {
            Some(p) => Some(p),
            None if self.enabled => Some(self.socket.clone().unwrap_or_else(|| default.into())),
            None => None,
        }
    }

    /// Longest socket path the kernel takes (`sun_path` less its terminating NUL).
    const MAX_PATH: usize = 107;

    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        let Some(p) = &self.socket else {
            return Ok(());
        };
        let shown = p.display();
        if !p.is_absolute() {
            return Err(Invalid::new(
                "control.socket",
                format!("{shown}: an absolute path is required"),
            ));
        }
        if p.as_os_str().len() > Self::MAX_PATH {
            return Err(Invalid::new(
                "control.socket",
                format!("{shown}: longer than {} bytes", Self::MAX_PATH),
            ));
        }
        Ok(())
    }
}

/// The `[log]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// error, warn, info, debug or trace (RUST_LOG overrides it).
    pub level: String,
}

impl Default for Log {
    fn default() -> Log {
        Log {
            level: "info".into(),
        }
    }
}

impl Log {
    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        match self.level.as_str() {
            "error" | "warn" | "info" | "debug" | "trace" => Ok(()),
            other => Err(Invalid::new(
                "log.level",
                format!("{other:?} is not one of error, warn, info, debug, trace"),
            )),
        }
    }
}

/// The `[scheduling]` section: the class each daemon's data-path threads run in (host-driver's
/// queue threads, ioc-driver's workers), so that they can run ahead of bulk applications as
/// the kernel's own data path (softirqs) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scheduling {
    /// `"normal"` (the default: as any process), `"nice"` (the `nice` level below) or
    /// `"fifo"` (real time at `priority`, ahead of every normal thread; the kernel's
    /// real-time throttling must be on).
    pub class: SchedClass,
    /// The nice level with class `"nice"`: -20..=19 (default -10).
    pub nice: i32,
    /// The real-time priority with class `"fifo"`: 1..=99 (default 10).
    pub priority: u32,
}

/// A scheduling class of [`Scheduling`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedClass {
    /// `SCHED_OTHER` at the process's nice level.
    #[default]
    Normal,
    /// `SCHED_OTHER` at [`Scheduling::nice`].
    Nice,
    /// `SCHED_FIFO` at [`Scheduling::priority`].
    Fifo,
}

impl Default for Scheduling {
    fn default() -> Scheduling {
        Scheduling {
            class: SchedClass::Normal,
            nice: -10,
            priority: 10,
        }
    }
}

impl Scheduling {
    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        if !(-20..=19).contains(&self.nice) {
            return Err(Invalid::new(
                "scheduling.nice",
                format!("{} is out of range -20..=19", self.nice),
            ));
        }
        range("scheduling.priority", self.priority.into(), 1, 99)
    }
}

/// Checks a daemon's polling, the same in both: `fabric.spin_max_us` within 0..=1000, and
/// neither it nor `fabric.busy_poll` with real time (a real-time thread that polls holds its
/// core from every normal thread, the applications included, until the kernel's throttling
/// stops it); `busy_poll` (a thread that never sleeps) excludes a poll before sleep.
pub(crate) fn polling(spin_max_us: u64, busy: bool, s: &Scheduling) -> Result<(), Invalid> {
    range("fabric.spin_max_us", spin_max_us, 0, 1000)?;
    let fifo = s.class == SchedClass::Fifo;
    if busy && spin_max_us > 0 {
        return Err(Invalid::new(
            "fabric.busy_poll",
            "polls always: fabric.spin_max_us (a poll before sleeping) must be 0 with it",
        ));
    }
    if busy && fifo {
        return Err(Invalid::new(
            "fabric.busy_poll",
            "cannot be set with scheduling.class = \"fifo\": a real-time thread that never sleeps holds its core from every normal thread",
        ));
    }
    if fifo && spin_max_us > 0 {
        return Err(Invalid::new(
            "fabric.spin_max_us",
            "must be 0 with scheduling.class = \"fifo\": a real-time thread that polls takes its core from every normal thread, the applications included",
        ));
    }
    Ok(())
}

/// Checks a MAC address that must be a non-zero unicast address.
pub(crate) fn unicast(key: &str, mac: MacAddr) -> Result<(), Invalid> {
    if mac.is_zero() {
        Err(Invalid::new(key, format!("{mac} is the all-zero address")))
    } else if !mac.is_unicast() {
        Err(Invalid::new(
            key,
            format!("{mac} is a group address; a unicast address is required"),
        ))
    } else {
        Ok(())
    }
}

/// Checks `v` against `lo..=hi`.
pub(crate) fn range(key: &str, v: u64, lo: u64, hi: u64) -> Result<(), Invalid> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(Invalid::new(
            key,
            format!("{v} is out of range {lo}..={hi}"),
        ))
    }
}

/// Checks a Linux interface name.
pub(crate) fn ifname(key: &str, name: &str) -> Result<(), Invalid> {
    let n = name.len();
    if n == 0 {
        return Err(Invalid::new(key, "is empty; an interface name is required"));
    }
    if n > 15 {
        return Err(Invalid::new(
            key,
            format!("{name:?} is {n} bytes, at most 15 allowed"),
        ));
    }
    if name == "." || name == ".." {
        return Err(Invalid::new(key, format!("{name:?} is not a valid name")));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(Invalid::new(
            key,
            format!("{name:?} contains {c:?}; only letters, digits, '_', '.', '-' allowed"),
        ));
    }
    Ok(())
}

/// Checks a keepalive interval and timeout pair.
pub(crate) fn keepalive(interval_ms: u64, timeout_ms: u64) -> Result<(), Invalid> {
    range("fabric.keepalive_interval_ms", interval_ms, 10, 60_000)?;
    if timeout_ms <= 2 * interval_ms {
        return Err(Invalid::new(
            "fabric.keepalive_timeout_ms",
            format!("{timeout_ms} must exceed twice fabric.keepalive_interval_ms ({interval_ms})"),
        ));
    }
    range("fabric.keepalive_timeout_ms", timeout_ms, 0, 600_000)
}

/// `true`, for `#[serde(default = ...)]`.
pub(crate) fn yes() -> bool {
    true
}
