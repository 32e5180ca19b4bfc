//! Ports mode (`lan.mode = "ports"`): every admitted host has a network device of its own on
//! the IOC's machine, its port, which the operator's Linux bridge or Open vSwitch switches
//! (README, "Ports mode"), as Xen's netback gives each guest a `vif` in dom0.
//!
//! The main thread keeps one persistent multi-queue TAP per `[[auth.hosts]]` entry
//! ([`Ports`]): made at start and by reloads, joined to `lan.bridge`, announced to
//! `lan.port_hook`, removed with its entry. A worker attaches one queue per session of the
//! host ([`PortQueue`]): the host's frames, checked against its policy, are written to it, and
//! the frames the switch sends out of it are read and delivered to the host through the
//! same data path as the NIC's, filtered as a NIC's receive filter would ([`admits`]). The
//! kernel turns the port's carrier on while a queue is attached and off while none is, so
//! the switch sees the host's link follow its session.

use crate::host_frame::HostFrame;
use splitnet_config::{AdmittedHost, IocAuth, Lan};
use splitnet_fabric::Ready;
use splitnet_netif::netdev;
use splitnet_netif::tap::Tap;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::mpsc;
use tracing::{info, warn};

/// A port's own MAC: never a host's, so that a bridge never takes a frame for the host as
/// its own (Xen's vifs use it too).
pub const PORT_MAC: [u8; 6] = [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff];

/// How often the workers read their ports' MTUs ([`PortQueue::mtu_changed`]): a switch's
/// change reaches the host within this (an ioctl per port each time).
pub const FOLLOW: std::time::Duration = std::time::Duration::from_millis(250);

/// One queue of a host's port, attached by the worker that serves the session.
#[derive(Debug)]
pub struct PortQueue {
    /// The port's name.
    pub name: String,
    tap: Tap,
    /// The queue's readiness.
    pub ready: Ready,
    /// The port's MTU when last read ([`PortQueue::mtu_changed`]).
    known_mtu: Cell<u32>,
}

impl PortQueue {
    /// Attaches a queue to port `name`, which [`Ports`] made (a port that does not exist is
    /// refused: attaching would make a device no one removes).
    pub fn open(name: &str) -> io::Result<PortQueue> {
        if netdev::index(name).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("port {name} does not exist"),
            ));
        }
        let tap = Tap::attach_queue(name)?;
        let ready = Ready::reading(&tap)?;
        Ok(PortQueue {
            name: name.to_string(),
            tap,
            ready,
            known_mtu: Cell::new(netdev::mtu(name).unwrap_or(1500)),
        })
    }

    /// The port's MTU, as the switch set it (1,500 if it cannot be read).
    pub fn mtu(&self) -> u32 {
        netdev::mtu(&self.name).unwrap_or(1500)
    }

    /// `(before, now)` when the port's MTU changed since it was last read (the switch, or
    /// an operator's `ip link set PORT mtu N`, changed it), read now.
    pub fn mtu_changed(&self) -> Option<(u32, u32)> {
        let now = self.mtu();
        let before = self.known_mtu.replace(now);
        (now != before).then_some((before, now))
    }

    /// Writes one frame from the host (virtio-net header first) into the switch.
    pub fn send(&self, frame: HostFrame<'_>) -> io::Result<usize> {
        match frame {
            HostFrame::Private(b) => self.tap.send(b),
            HostFrame::Shared { head, rest } => self.tap.send_parts(head, &rest),
        }
    }

    /// Reads one frame the switch sent out of the port (virtio-net header first).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.tap.recv(buf)
    }
}

/// Whether a host takes a frame for `dst` that its port received, as a NIC's filter decides:
/// its own MAC and its bridged machines', broadcast and the multicast groups it joined
/// (`joined`), and anything while it is promiscuous. A bridge floods frames for unknown
/// MACs to every port; this keeps them from a host that did not ask for them.
pub fn admits(
    dst: &[u8; 6],
    mac: &[u8; 6],
    bridged: &[[u8; 6]],
    joined: impl Fn(&[u8; 6]) -> bool,
    promisc: bool,
) -> bool {
    promisc
        || dst == mac
        || bridged.contains(dst)
        || (dst[0] & 1 == 1 && (*dst == [0xff; 6] || joined(dst)))
}

/// What a port hook is told of ([`Hooks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The port was made (or found at start).
    Add,
    /// The host's MAC or policy changed.
    Change,
    /// The host's active session took the port (its carrier is on): the MAC is known.
    Up,
    /// The host's active session left the port (its carrier is off).
    Down,
    /// The port is about to be removed.
    Remove,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Add => "add",
            Action::Change => "change",
            Action::Up => "up",
            Action::Down => "down",
            Action::Remove => "remove",
        }
    }
}

/// A port and the policy of its host, as a hook sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The port's name.
    pub port: String,
    /// The host's name in `[[auth.hosts]]`.
    pub host: String,
    /// The host's MAC: its entry's, or the one its session has (none known yet: empty).
    pub mac: Option<[u8; 6]>,
    /// Its bridged machines' MACs.
    pub extra_macs: Vec<[u8; 6]>,
    /// Its access VLAN.
    pub vlan: Option<u16>,
    /// Its trunk VLANs.
    pub vlans: Vec<u16>,
    /// Whether it may turn promiscuous.
    pub promiscuous: bool,
    /// Queues it may open.
    pub queues: u16,
    /// The MTU its sd0 has (none known yet: empty).
    pub mtu: Option<u32>,
}

impl PortSpec {
    /// The port of entry `h`.
    pub fn of(h: &AdmittedHost) -> PortSpec {
        PortSpec {
            port: h.port_name(),
            host: h.name.clone(),
            mac: h.mac.map(|m| m.0),
            extra_macs: h.extra_macs.iter().map(|m| m.0).collect(),
            vlan: h.vlan,
            vlans: h.vlans.clone(),
            promiscuous: h.promiscuous,
            queues: h.queues,
            mtu: None,
        }
    }

    /// The hook's environment: `SPLITNET_PORT`, `SPLITNET_HOST`, `SPLITNET_MAC` (empty
    /// while unknown), `SPLITNET_EXTRA_MACS` (space-separated), `SPLITNET_VLAN` (the access
    /// VLAN, empty for none), `SPLITNET_TRUNKS` (comma-separated, as OVS `trunks=` takes
    /// them), `SPLITNET_PROMISCUOUS` (`yes` or `no`), `SPLITNET_QUEUES`, `SPLITNET_MTU`
    /// (the host's, empty while unknown).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mac = |m: &[u8; 6]| splitnet_messaging::wire::fmt_mac(m);
        let join =
            |v: &[u16], sep: &str| v.iter().map(u16::to_string).collect::<Vec<_>>().join(sep);
        vec![
            ("SPLITNET_PORT", self.port.clone()),
            ("SPLITNET_HOST", self.host.clone()),
            (
                "SPLITNET_MAC",
                self.mac.as_ref().map(mac).unwrap_or_default(),
            ),
            (
                "SPLITNET_EXTRA_MACS",
                self.extra_macs
                    .iter()
                    .map(mac)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            (
                "SPLITNET_VLAN",
                self.vlan.map(|v| v.to_string()).unwrap_or_default(),
            ),
            ("SPLITNET_TRUNKS", join(&self.vlans, ",")),
            (
                "SPLITNET_PROMISCUOUS",
                if self.promiscuous { "yes" } else { "no" }.into(),
            ),
            ("SPLITNET_QUEUES", self.queues.to_string()),
            (
                "SPLITNET_MTU",
                self.mtu.map(|m| m.to_string()).unwrap_or_default(),
            ),
        ]
    }
}

/// Runs `lan.port_hook`, one call at a time in the order asked, on a thread of its own (a
/// slow hook never holds the IOC's loops): `HOOK add|change|up|down|remove`, with [`PortSpec::env`]
/// and `SPLITNET_BRIDGE` (`lan.bridge`, empty for none). A hook that fails is logged.
#[derive(Debug, Clone)]
pub struct Hooks {
    tx: Option<mpsc::Sender<(Action, PortSpec)>>,
    /// Set once a successor took the ports over (an upgrade): `down` calls not yet run are
    /// skipped, or one could undo the successor's `up` of the same port.
    handed_over: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Hooks {
    /// No hook.
    pub fn none() -> Hooks {
        Hooks {
            tx: None,
            handed_over: Default::default(),
        }
    }

    /// A successor process serves the ports now: no `down` of this process runs after this.
    pub fn hand_over(&self) {
        self.handed_over
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Hooks that run `hook`, or none, and the thread that runs them (it ends once every
    /// clone of the hooks is dropped and the calls asked are done).
    pub fn spawn(
        hook: Option<PathBuf>,
        bridge: Option<String>,
    ) -> (Hooks, Option<std::thread::JoinHandle<()>>) {
        let Some(hook) = hook else {
            return (Hooks::none(), None);
        };
        let (tx, rx) = mpsc::channel::<(Action, PortSpec)>();
        let bridge = bridge.unwrap_or_default();
        let handed_over = std::sync::Arc::<std::sync::atomic::AtomicBool>::default();
        let skip = handed_over.clone();
        let spawned = std::thread::Builder::new()
            .name("ioc-port-hook".into())
            .spawn(move || {
                for (action, spec) in rx {
                    if action == Action::Down && skip.load(std::sync::atomic::Ordering::SeqCst) {
                        info!(port = %spec.port, "port hook's down skipped: the successor has the port");
                        continue;
                    }
                    run_hook(&hook, action, &spec, &bridge);
                }
            });
        match spawned {
            Ok(t) => (
                Hooks {
                    tx: Some(tx),
                    handed_over,
                },
                Some(t),
            ),
            Err(e) => {
                warn!("lan.port_hook is not run: no thread for it: {e}");
                (Hooks::none(), None)
            }
        }
    }

    /// Runs the hook for `spec` (after the calls asked before).
    pub fn run(&self, action: Action, spec: &PortSpec) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((action, spec.clone()));
        }
    }
}

/// Longest one hook call may run; then it is killed with what it started, so that one hung
/// call cannot hold every call behind it (port-ovs gives ovs-vsctl 10 s).
const HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long what a hook started may keep its standard error open after it exited.
const HOOK_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Most bytes of a hook's standard error kept for the log; the rest is read and dropped.
const HOOK_STDERR_MAX: u64 = 4096;

/// How a hook call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HookEnd {
    /// It exited with `status`, having said `said` on its standard error.
    Exited {
        status: std::process::ExitStatus,
        said: String,
    },
    /// It ran beyond its time and was killed, with its process group.
    TimedOut,
    /// It could not be started.
    NotRun(String),
}

/// Runs `hook` once, in a process group of its own, for at most `timeout`.
fn call_hook(mut cmd: std::process::Command, timeout: std::time::Duration) -> HookEnd {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = match cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return HookEnd::NotRun(e.to_string()),
    };
    let stderr = child.stderr.take();
    let (said_tx, said_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut said = Vec::new();
        if let Some(mut e) = stderr {
            let _ = e.by_ref().take(HOOK_STDERR_MAX).read_to_end(&mut said);
            let _ = io::copy(&mut e, &mut io::sink());
        }
        let _ = said_tx.send(String::from_utf8_lossy(&said).trim().to_string());
    });
    let until = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            _ => break None,
        }
    };
    match status {
        Some(status) => {
            // What it started may hold its standard error open: a moment's grace, then it
            // goes (its group is not empty while it does, so the group's id is still its).
            let said = said_rx.recv_timeout(HOOK_GRACE).unwrap_or_else(|_| {
                kill_group(&child);
                said_rx.recv().unwrap_or_default()
            });
            HookEnd::Exited { status, said }
        }
        None => {
            kill_group(&child);
            let _ = child.wait();
            let _ = said_rx.recv();
            HookEnd::TimedOut
        }
    }
}

/// Kills the process group `child` leads (its own, [`call_hook`]); a group already gone is
/// no error worth a word.
fn kill_group(child: &std::process::Child) {
    let _ = splitnet_service::process::kill_group(child.id());
}

fn run_hook(hook: &std::path::Path, action: Action, spec: &PortSpec, bridge: &str) {
    let mut cmd = std::process::Command::new(hook);
    cmd.arg(action.as_str())
        .envs(spec.env())
        .env("SPLITNET_BRIDGE", bridge);
    match call_hook(cmd, HOOK_TIMEOUT) {
        HookEnd::Exited { status, said } if status.success() => {
            info!(port = %spec.port, host = %spec.host, action = action.as_str(), "port hook ran");
            // A hook that succeeds may still have a word for the operator.
            if !said.is_empty() {
                warn!(port = %spec.port, action = action.as_str(), "port hook: {said}");
            }
        }
        HookEnd::Exited { status, said } => warn!(
            port = %spec.port,
            host = %spec.host,
            action = action.as_str(),
            "port hook {} failed ({status}): {said}",
            hook.display(),
        ),
        HookEnd::TimedOut => warn!(
            port = %spec.port,
            host = %spec.host,
            action = action.as_str(),
            "port hook {} ran beyond {} s: killed",
            hook.display(),
            HOOK_TIMEOUT.as_secs()
        ),
        HookEnd::NotRun(e) => warn!(
            port = %spec.port,
            action = action.as_str(),
            "port hook {} could not run: {e}",
            hook.display()
        ),
    }
}

/// The ports of every `[[auth.hosts]]` entry, kept by the main thread.
#[derive(Debug)]
pub struct Ports {
    /// Each port made, by name.
    made: BTreeMap<String, PortSpec>,
    bridge: Option<String>,
    offload: bool,
    /// The hook, also run by the workers as their hosts' sessions take and leave ports.
    pub hooks: Hooks,
    hook_thread: Option<std::thread::JoinHandle<()>>,
}

impl Ports {
    /// No port yet, made as `lan` says.
    pub fn new(lan: &Lan) -> Ports {
        let (hooks, hook_thread) = Hooks::spawn(lan.port_hook.clone(), lan.bridge.clone());
        Ports {
            made: BTreeMap::new(),
            bridge: lan.bridge.clone(),
            offload: lan.offload,
            hooks,
            hook_thread,
        }
    }

    /// At exit, once the workers are gone: waits up to `deadline` for the hook's calls
    /// still asked (the `down` of every port a session left), so that a switch never keeps
    /// a binding for an IOC that stopped. The ports themselves stay for the next IOC.
    pub fn finish(self, deadline: std::time::Duration) {
        let Some(t) = self.hook_thread else {
            return;
        };
        drop(self.hooks);
        let until = std::time::Instant::now() + deadline;
        while !t.is_finished() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        match t.is_finished() {
            true => {
                let _ = t.join();
            }
            false => {
                warn!("lan.port_hook: calls still running after {deadline:?} are not waited for")
            }
        }
    }

    /// Makes the port of every entry of `auth` that has none (an existing one, left by an
    /// earlier IOC, is taken as it is), tells the hook of entries whose policy changed, and
    /// removes the ports of entries gone. A port that cannot be made is logged, and its
    /// host's sessions are refused until a reload makes it.
    pub fn sync(&mut self, auth: &IocAuth) {
        self.make_wanted(auth);
        self.remove_gone(auth);
    }

    /// The first half of [`Ports::sync`], before a reload reaches the workers: the ports of
    /// new entries are there (and their hook's `add` queued) before a session can take one.
    pub fn make_wanted(&mut self, auth: &IocAuth) {
        for (port, spec) in wanted(auth) {
            match self.made.get(&port) {
                Some(old) if *old == spec => {}
                Some(_) => {
                    self.hooks.run(Action::Change, &spec);
                    self.made.insert(port, spec);
                }
                None => match make(&port, self.offload, self.bridge.as_deref()) {
                    Ok(()) => {
                        info!(%port, host = %spec.host, bridge = ?self.bridge, "port ready");
                        self.hooks.run(Action::Add, &spec);
                        self.made.insert(port, spec);
                    }
                    Err(e) => warn!(%port, host = %spec.host, "cannot make the host's port: {e}"),
                },
            }
        }
    }

    /// The second half of [`Ports::sync`], once the workers ended the sessions of entries
    /// gone (their hook's `down` before this `remove`): removes those entries' ports.
    pub fn remove_gone(&mut self, auth: &IocAuth) {
        let want = wanted(auth);
        let gone: Vec<String> = self
            .made
            .keys()
            .filter(|p| !want.contains_key(*p))
            .cloned()
            .collect();
        for port in gone {
            if let Some(spec) = self.made.remove(&port) {
                self.hooks.run(Action::Remove, &spec);
                match remove(&port) {
                    Ok(()) => info!(%port, host = %spec.host, "port removed with its entry"),
                    Err(e) => warn!(%port, "cannot remove the port: {e}"),
                }
            }
        }
    }
}

/// Each entry's port, by name.
fn wanted(auth: &IocAuth) -> BTreeMap<String, PortSpec> {
    auth.hosts
        .iter()
        .map(|h| (h.port_name(), PortSpec::of(h)))
        .collect()
}

/// Makes (or takes) persistent multi-queue TAP `port`: its own MAC [`PORT_MAC`], offloads
/// as `offload` says, up, and a port of `bridge` if one is named.
fn make(port: &str, offload: bool, bridge: Option<&str>) -> io::Result<()> {
    let q = Tap::attach_queue(port)?;
    q.set_persist(true)?;
    q.enable_offloads(offload)?;
    netdev::set_mac(port, PORT_MAC)?;
    netdev::set_up(port)?;
    if let Some(b) = bridge {
        if netdev::master(port)?.as_deref() != Some(b) {
            netdev::set_bridge_port(b, port, true)
                .map_err(|e| io::Error::new(e.kind(), format!("joining bridge {b}: {e}")))?;
        }
    }
    Ok(())
}

/// Removes port `port`: it goes once the last queue attached to it closes (a worker ends
/// the sessions of an entry that is gone).
fn remove(port: &str) -> io::Result<()> {
    Tap::attach_queue(port)?.set_persist(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [2, 0x5d, 0, 0, 0, 1];

    fn sh(script: &str) -> std::process::Command {
        let mut c = std::process::Command::new("/bin/sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn a_hook_beyond_its_time_is_killed_with_what_it_started() {
        let dir = std::env::temp_dir().join(format!("splitnet-hook-kill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let late = dir.join("late");
        // The hook and a child it left behind would each write `late` after a second.
        let script = format!("(sleep 1; touch {0}) & sleep 1; touch {0}", late.display());
        let end = call_hook(sh(&script), std::time::Duration::from_millis(100));
        assert_eq!(end, HookEnd::TimedOut);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(!late.exists(), "neither the hook nor its child ran on");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `log` once it holds `len` bytes (the hook thread's calls done), or after 10 s.
    fn read_when(log: &std::path::Path, len: usize) -> String {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let got = std::fs::read_to_string(log).unwrap_or_default();
            if got.len() >= len || std::time::Instant::now() >= until {
                return got;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// How `cmd`, which must exit within 20 s, exited, and what it said.
    fn exited(cmd: std::process::Command) -> (std::process::ExitStatus, String) {
        match call_hook(cmd, std::time::Duration::from_secs(20)) {
            HookEnd::Exited { status, said } => (status, said),
            end => panic!("it exited: {end:?}"),
        }
    }

    #[test]
    fn a_hook_that_exits_leaving_a_child_on_its_standard_error_ends() {
        let (status, said) = exited(sh("echo started >&2; sleep 30 & exit 0"));
        assert!(status.success());
        assert_eq!(
            said, "started",
            "its child killed after the grace, its words kept"
        );
    }

    #[test]
    fn a_hooks_standard_error_is_kept_bounded() {
        let (status, said) = exited(sh(
            "echo one >&2; head -c 100000 /dev/zero | tr '\\0' x >&2; exit 3",
        ));
        assert_eq!(status.code(), Some(3));
        assert!(said.starts_with("one"), "{said:.40}");
        assert!(said.len() <= HOOK_STDERR_MAX as usize);
        let missing = std::process::Command::new("/nonexistent/splitnet-hook");
        assert!(matches!(
            call_hook(missing, std::time::Duration::from_secs(1)),
            HookEnd::NotRun(_)
        ));
    }

    #[test]
    fn a_port_passes_what_a_nics_filter_would() {
        let none = |_: &[u8; 6]| false;
        let bridged = [[2, 0, 0, 0, 0, 9]];
        assert!(admits(&MAC, &MAC, &[], none, false));
        assert!(admits(&[0xff; 6], &MAC, &[], none, false), "broadcast");
        assert!(admits(&bridged[0], &MAC, &bridged, none, false));
        let other = [2, 0x5d, 0, 0, 0, 2];
        assert!(
            !admits(&other, &MAC, &bridged, none, false),
            "another host's unicast"
        );
        assert!(admits(&other, &MAC, &[], none, true), "promiscuous");
        let group = [0x33, 0x33, 0, 0, 0, 1];
        assert!(
            !admits(&group, &MAC, &[], none, false),
            "a group not joined"
        );
        assert!(admits(&group, &MAC, &[], |g| *g == group, false));
        assert!(
            !admits(&other, &MAC, &[], |_| true, false),
            "joined groups say nothing of unicast"
        );
    }

    #[test]
    fn a_hook_sees_the_port_and_its_policy() {
        let spec = PortSpec {
            port: "sdp-a".into(),
            host: "a".into(),
            mac: Some(MAC),
            extra_macs: vec![[2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, 10]],
            vlan: None,
            vlans: vec![10, 20],
            promiscuous: false,
            queues: 2,
            mtu: Some(9000),
        };
        let env: BTreeMap<_, _> = spec.env().into_iter().collect();
        assert_eq!(env["SPLITNET_PORT"], "sdp-a");
        assert_eq!(env["SPLITNET_MAC"], "02:5d:00:00:00:01");
        assert_eq!(
            env["SPLITNET_EXTRA_MACS"],
            "02:00:00:00:00:09 02:00:00:00:00:0a"
        );
        assert_eq!(env["SPLITNET_VLAN"], "");
        assert_eq!(env["SPLITNET_TRUNKS"], "10,20");
        assert_eq!(env["SPLITNET_PROMISCUOUS"], "no");
        assert_eq!(env["SPLITNET_QUEUES"], "2");
        assert_eq!(env["SPLITNET_MTU"], "9000");
        let unknown = PortSpec {
            mac: None,
            mtu: None,
            ..spec
        };
        let env: BTreeMap<_, _> = unknown.env().into_iter().collect();
        assert_eq!(env["SPLITNET_MAC"], "", "not known yet");
        assert_eq!(env["SPLITNET_MTU"], "", "not known yet");
    }

    /// The hook runs in the order asked, with the action as its argument and the port in
    /// its environment.
    #[test]
    fn hooks_run_in_order_with_their_environment() {
        let dir = std::env::temp_dir().join(format!("splitnet-hook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let hook = dir.join("hook");
        std::fs::write(
            &hook,
            format!(
                "#!/bin/sh\necho \"$1 $SPLITNET_PORT $SPLITNET_BRIDGE\" >>{}\n",
                log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (hooks, _thread) = Hooks::spawn(Some(hook), Some("br0".into()));
        let spec = |p: &str| PortSpec {
            port: p.into(),
            host: p.into(),
            mac: None,
            extra_macs: vec![],
            vlan: Some(10),
            vlans: vec![],
            promiscuous: true,
            queues: 1,
            mtu: None,
        };
        hooks.run(Action::Add, &spec("p1"));
        hooks.run(Action::Up, &spec("p1"));
        hooks.run(Action::Change, &spec("p1"));
        hooks.run(Action::Down, &spec("p1"));
        hooks.run(Action::Remove, &spec("p2"));
        let want = "add p1 br0\nup p1 br0\nchange p1 br0\ndown p1 br0\nremove p2 br0\n";
        assert_eq!(read_when(&log, want.len()), want);
        // Handed over to a successor: its downs are skipped, the rest still runs.
        hooks.hand_over();
        hooks.run(Action::Down, &spec("p1"));
        hooks.run(Action::Remove, &spec("p3"));
        let want = format!("{want}remove p3 br0\n");
        assert_eq!(read_when(&log, want.len()), want);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
