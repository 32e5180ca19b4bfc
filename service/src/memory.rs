//! The memory a daemon may use: the limit its control group sets (`MemoryMax=` under
//! systemd, the cgroup v2 file `memory.max`), held against the most its configuration can
//! take, so that an operator who serves more hosts than the unit was sized for hears it at
//! start instead of from the OOM killer under load.

use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// Bytes in a MiB, for the messages.
const MIB: u64 = 1 << 20;

/// `bytes` in MiB, rounded up.
pub fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

/// The most memory a configuration lets a daemon use, and how it adds up (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Bytes at most.
    pub bytes: u64,
    /// How they add up.
    pub terms: String,
}

impl Budget {
    /// The verdict against `limit`: `Err` with the line to log when the configuration may
    /// need more than the limit allows.
    pub fn check(&self, limit: Option<u64>) -> Result<String, String> {
        check(self.bytes, limit, &self.terms)
    }

    /// Logs the budget against the process's control group limit ([`cgroup_limit`]): a
    /// warning when it may exceed it.
    pub fn log(&self) {
        match self.check(cgroup_limit()) {
            Ok(line) => info!("{line}"),
            Err(line) => warn!("{line}"),
        }
    }
}

/// The tightest `memory.max` of the process's control group and its ancestors (cgroup v2),
/// or `None` when none is set or the hierarchy cannot be read (cgroup v1, no /sys).
pub fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = unified_path(&own)?;
    limit_under(Path::new("/sys/fs/cgroup"), path)
}

/// The path of the unified (v2) hierarchy in `/proc/self/cgroup`'s text ("0::/PATH").
pub fn unified_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The tightest limit of `memory.max` in the group at `path` under `root` and in every
/// group above it.
pub fn limit_under(root: &Path, path: &str) -> Option<u64> {
    let mut dir = PathBuf::from(root);
    let mut tightest = None;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        let text = std::fs::read_to_string(dir.join("memory.max")).unwrap_or_default();
        if let Some(n) = parse_max(&text) {
            tightest = Some(tightest.map_or(n, |t: u64| t.min(n)));
        }
    }
    tightest
}

/// A `memory.max` value: bytes, or `None` for "max" (no limit) and anything unreadable.
pub fn parse_max(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The most the kernel lets one TCP socket's buffers grow to, charged to its owner's memory:
/// the third fields of the `tcp_rmem` and `tcp_wmem` sysctls (Linux's defaults, 6 and 4 MiB,
/// when they cannot be read).
pub fn tcp_socket_max() -> u64 {
    let max = |path: &str, default: u64| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(default)
    };
    max("/proc/sys/net/ipv4/tcp_rmem", 6 << 20) + max("/proc/sys/net/ipv4/tcp_wmem", 4 << 20)
}

/// The `MemoryMax=` a unit file's text sets, in bytes (a number with an optional K, M, G or
/// T suffix, as systemd reads it), for checking a unit against a configuration's bound.
pub fn unit_memory_max(unit: &str) -> Option<u64> {
    let v = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("MemoryMax="))?;
    let (digits, shift) = match v.chars().last()? {
        'K' => (&v[..v.len() - 1], 10),
        'M' => (&v[..v.len() - 1], 20),
        'G' => (&v[..v.len() - 1], 30),
        'T' => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The verdict on a configuration that may use `bound` bytes under `limit`: `Err` with the
/// line to log when it may need more than the limit allows.
fn check(bound: u64, limit: Option<u64>, what: &str) -> Result<String, String> {
    let need = mib(bound);
    match limit {
        None => Ok(format!(
            "memory: this configuration may use up to {need} MiB ({what}); no memory limit"
        )),
        Some(l) if bound <= l => Ok(format!(
            "memory: this configuration may use up to {need} MiB ({what}), within the limit of {} MiB",
            l / MIB
        )),
        Some(l) => Err(format!(
            "memory: this configuration may use up to {need} MiB ({what}), more than the limit of {} MiB: \
             raise MemoryMax= (systemctl edit) or serve less; under load the kernel would kill the daemon",
            l / MIB
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_path_and_limits_are_read() {
        assert_eq!(
            unified_path("1:name=systemd:/x\n0::/system.slice/ioc-driver.service\n"),
            Some("/system.slice/ioc-driver.service")
        );
        assert_eq!(unified_path("12:memory:/x\n"), None, "cgroup v1 only");
        assert_eq!(parse_max("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_max("max\n"), None);
        assert_eq!(parse_max(""), None);
    }

    #[test]
    fn the_tightest_limit_above_the_group_counts() {
        let root = std::env::temp_dir().join(format!("splitnet-cg-{}", std::process::id()));
        let svc = root.join("system.slice/ioc.service");
        std::fs::create_dir_all(&svc).unwrap();
        std::fs::write(root.join("system.slice/memory.max"), "536870912\n").unwrap();
        std::fs::write(svc.join("memory.max"), "1073741824\n").unwrap();
        assert_eq!(
            limit_under(&root, "/system.slice/ioc.service"),
            Some(512 << 20),
            "the slice's tighter limit"
        );
        std::fs::write(root.join("system.slice/memory.max"), "max\n").unwrap();
        assert_eq!(
            limit_under(&root, "/system.slice/ioc.service"),
            Some(1 << 30)
        );
        std::fs::write(svc.join("memory.max"), "max\n").unwrap();
        assert_eq!(limit_under(&root, "/system.slice/ioc.service"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_units_memory_max_is_read_with_its_suffix() {
        assert_eq!(
            unit_memory_max("[Service]\nMemoryMax=224M\n"),
            Some(224 << 20)
        );
        assert_eq!(unit_memory_max("MemoryMax=2G"), Some(2 << 30));
        assert_eq!(unit_memory_max("MemoryMax=4096"), Some(4096));
        assert_eq!(unit_memory_max("MemoryMax=infinity"), None);
        assert_eq!(unit_memory_max("TasksMax=64"), None);
    }

    #[test]
    fn a_bound_beyond_the_limit_is_an_error_naming_both() {
        assert!(check(100 * MIB, None, "x").is_ok());
        assert!(check(100 * MIB, Some(100 * MIB), "x").is_ok());
        let e = check(100 * MIB + 1, Some(100 * MIB), "8 sessions").unwrap_err();
        assert!(
            e.contains("101 MiB (8 sessions)") && e.contains("limit of 100 MiB"),
            "{e}"
        );
        assert!(e.contains("MemoryMax="), "{e}");
    }
}
