//! How splitnetctl prints the daemons' documents: aligned text for people, JSON for scripts.

use splitnet_control::report::{
    Counters, Direction, Hosts, NicStats, Pools, Reply, Role, Stats, Status,
};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// The reply as pretty JSON.
pub fn json(reply: &Reply) -> String {
    serde_json::to_string_pretty(reply).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The reply as text.
pub fn text(reply: &Reply) -> String {
    match reply {
        Reply::Status(s) => status(s),
        Reply::Pools(p) => pools(p),
        Reply::Hosts(h) => hosts(h),
        Reply::Stats(s) => stats(s),
        Reply::Reloaded(what) => format!("{what}\n"),
        Reply::Upgraded(u) => format!(
            "upgraded: process {} serves now (ready {} ms after its start); process {} is ending\n",
            u.new_pid, u.ready_ms, u.old_pid
        ),
        Reply::NotUpgraded(why) => format!("not upgraded, the running process serves on: {why}\n"),
        Reply::Error(e) => format!("error: {e}\n"),
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(" ")
    }
}

fn duration(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

fn status(s: &Status) -> String {
    let mut o = String::new();
    let f = &s.fabric;
    let i = &s.interface;
    let daemon = match s.role {
        Role::Host => "host-driver",
        Role::Ioc => "ioc-driver",
    };
    let _ = writeln!(
        o,
        "{daemon} {} (pid {}), up {}",
        s.version,
        s.pid,
        duration(s.uptime_s)
    );
    let _ = write!(o, "fabric:     {} {}", f.state, f.address);
    if let Some(v) = f.protocol_version {
        let _ = write!(o, ", protocol v{v}");
    }
    if let Some(n) = f.session {
        let _ = write!(o, ", session {n}");
    }
    if let Some(c) = f.connected_s {
        let _ = write!(o, ", connected {}", duration(c));
    }
    if let (Some(h), Some(m)) = (f.hosts, f.max_hosts) {
        let _ = write!(o, ", hosts {h}/{m}");
    }
    let _ = writeln!(o, ", connects {}", f.connects);
    for r in &f.iocs {
        let _ = writeln!(o, "  ioc {:<28} {}", r.address, r.role);
    }
    for m in &f.moves {
        let took = m
            .took_ms
            .map_or("not completed".to_string(), |t| format!("{t} ms"));
        let _ = writeln!(
            o,
            "  moved {} -> {} ({}), {took}, {} ago",
            m.from,
            m.to,
            m.cause,
            duration(m.ago_s)
        );
    }
    let _ = writeln!(
        o,
        "interface:  {} {} mtu {} carrier {} promisc {} multicast {}",
        i.name,
        i.mac,
        i.mtu,
        if i.carrier { "up" } else { "down" },
        yes_no(i.promisc),
        i.multicast
    );
    let _ = writeln!(o, "offloads:   {}", list(&i.offloads));
    o
}

fn pools(p: &Pools) -> String {
    let mut o = String::new();
    if p.peers.is_empty() {
        o.push_str("no connection\n");
    }
    for peer in &p.peers {
        let _ = writeln!(o, "{}", peer.peer);
        let _ = writeln!(
            o,
            "  receive pools (ours)  {:>4} {:>8} {:>7} {:>8} {:>6} {:>6}  state",
            "ref", "elem", "count", "granted", "busy", "free"
        );
        for l in &peer.local {
            let _ = writeln!(
                o,
                "                        {:>4} {:>8} {:>7} {:>8} {:>6} {:>6}  {}",
                l.pool_ref,
                l.element_size,
                l.element_count,
                l.credits_outstanding,
                l.busy,
                l.free,
                l.state
            );
        }
        let _ = writeln!(
            o,
            "  send pools (peer's)   {:>4} {:>8} {:>7} {:>8} {:>6}",
            "ref", "elem", "count", "credits", "in use"
        );
        for r in &peer.remote {
            let _ = writeln!(
                o,
                "                        {:>4} {:>8} {:>7} {:>8} {:>6}",
                r.pool_ref, r.element_size, r.element_count, r.credits, r.in_use
            );
        }
    }
    o
}

fn hosts(h: &Hosts) -> String {
    let mut o = String::new();
    // As wide as the longest address (a local host's `unix:PATH (pid N), shared memory`
    // is longer than any `ip:port`), so the columns after it stay aligned.
    let aw = h
        .hosts
        .iter()
        .map(|e| e.address.chars().count())
        .fold(21, usize::max);
    // The admitted hosts' names (`-`: not admitted by key).
    let name = |e: &splitnet_control::report::HostEntry| match e.name.as_str() {
        "" => "-".to_string(),
        n => n.to_string(),
    };
    let nw = h
        .hosts
        .iter()
        .map(|e| name(e).chars().count())
        .fold(4, usize::max);
    let _ = writeln!(
        o,
        "{:>7}  {:>5}  {:<nw$}  {:<17}  {:<aw$}  {:>6}  {:>5}  {:>8}  {:>12}  {:>12}  {:>8}  {:>11}",
        "session",
        "queue",
        "name",
        "mac",
        "address",
        "domain",
        "mtu",
        "up",
        "tx frames",
        "rx frames",
        "dropped",
        "buffers KiB"
    );
    for e in &h.hosts {
        let _ = writeln!(
            o,
            "{:>7}  {:>5}  {:<nw$}  {:<17}  {:<aw$}  {:>6}  {:>5}  {:>8}  {:>12}  {:>12}  {:>8}  {:>11}",
            e.session,
            format!("{}/{}", e.queue, e.queues),
            name(e),
            e.mac,
            e.address,
            e.domain,
            e.mtu,
            duration(e.connected_s),
            e.counters.tx.frames,
            e.counters.rx.frames,
            e.counters.tx.dropped + e.counters.rx.dropped,
            format!("{}/{}", e.buffer_bytes >> 10, e.buffer_quota_bytes >> 10)
        );
        if !e.port.is_empty() {
            let _ = writeln!(o, "         port: {}", e.port);
        }
        if e.standby {
            o.push_str(
                "         standby: claims no MAC, carries no frame until its host activates it\n",
            );
        }
        if !e.drops.is_empty() {
            drops(&mut o, &e.drops);
        }
    }
    if h.hosts.is_empty() {
        o.push_str("(no host connected)\n");
    }
    o
}

fn direction(o: &mut String, name: &str, d: &Direction) {
    let _ = writeln!(
        o,
        "  {name:<4} {:>14} frames {:>18} bytes {:>10} dropped",
        d.frames, d.bytes, d.dropped
    );
}

fn counters(o: &mut String, title: &str, c: &Counters) {
    let _ = writeln!(o, "{title}");
    direction(o, "tx", &c.tx);
    direction(o, "rx", &c.rx);
    let _ = writeln!(
        o,
        "  protocol errors {}, protection errors {}",
        c.protocol_errors, c.protection_errors
    );
}

fn nic(o: &mut String, role: Role, n: &NicStats) {
    let title = match role {
        Role::Ioc => "NIC (kernel counters)",
        Role::Host => {
            "TAP (kernel counters; tx dropped: the kernel's queue to host-driver was full)"
        }
    };
    let _ = writeln!(o, "{title}");
    direction(o, "tx", &n.tx);
    direction(o, "rx", &n.rx);
    let _ = writeln!(o, "  errors: rx {}, tx {}", n.rx_errors, n.tx_errors);
}

fn stats(s: &Stats) -> String {
    let mut o = String::new();
    let to = match s.role {
        Role::Host => "fabric (tx: to the IOC)",
        Role::Ioc => "fabric (tx: to the hosts)",
    };
    counters(&mut o, to, &s.fabric);
    let _ = writeln!(
        o,
        "  inline (SendData) {}, waited for credit {}, credits held {} ({} in use), credit updates sent {}",
        s.tx_inline, s.tx_backpressure, s.credits, s.credits_in_use, s.credit_updates
    );
    let _ = writeln!(
        o,
        "  express lane: tx {}, rx {}",
        s.tx_express, s.rx_express
    );
    if let Some(n) = &s.nic {
        nic(&mut o, s.role, n);
    }
    if let Some(c) = &s.ioc {
        counters(&mut o, "at the IOC for this host (tx: IOC to host)", c);
    }
    drops(&mut o, &s.drops);
    if let Some((used, all)) = s.send_buffer_bytes {
        let _ = writeln!(
            o,
            "  send buffers queued towards hosts: {} KiB of {} KiB",
            used >> 10,
            all >> 10
        );
    }
    if let Some(l) = &s.tx_limit {
        let _ = writeln!(
            o,
            "  in flight to the IOC at most {} bytes (grown {}, shrunk {}, held back {}); {} frames queued, {} dropped by the flow queue, {} marked CE",
            l.limit_bytes, l.grown, l.shrunk, l.held_back, l.queued, l.queue_drops, l.ce_marked
        );
    }
    o
}

fn drops(o: &mut String, d: &std::collections::BTreeMap<String, u64>) {
    if !d.is_empty() {
        let list: Vec<String> = d.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(o, "  drops by cause: {}", list.join(", "));
    }
}

/// One frame of `splitnetctl top`.
pub struct Top<'a> {
    /// The sample now.
    pub stats: &'a Stats,
    /// Pools now.
    pub pools: &'a Pools,
    /// The previous sample and the time since it.
    pub previous: Option<(&'a Stats, Duration)>,
}

/// Rates between two samples of one direction: (frames/s, bits/s).
fn rate(now: &Direction, before: &Direction, dt: Duration) -> (f64, f64) {
    let s = dt.as_secs_f64().max(1e-3);
    (
        now.frames.saturating_sub(before.frames) as f64 / s,
        now.bytes.saturating_sub(before.bytes) as f64 * 8.0 / s,
    )
}

fn bits(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.2} Gb/s", b / 1e9),
        b if b >= 1e6 => format!("{:.1} Mb/s", b / 1e6),
        b => format!("{:.0} kb/s", b / 1e3),
    }
}

fn bar(used: u32, total: u32, width: usize) -> String {
    let filled = if total == 0 {
        0
    } else {
        (used as usize * width).div_ceil(total as usize).min(width)
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

impl Top<'_> {
    fn rates(&self) -> Option<((f64, f64), (f64, f64))> {
        let (before, dt) = self.previous?;
        Some((
            rate(&self.stats.fabric.tx, &before.fabric.tx, dt),
            rate(&self.stats.fabric.rx, &before.fabric.rx, dt),
        ))
    }

    /// The frame as one JSON line: rates and occupancy.
    pub fn json(&self) -> String {
        let r = self.rates();
        let occupancy: Vec<_> = self
            .pools
            .peers
            .iter()
            .map(|p| {
                serde_json::json!({
                    "peer": p.peer,
                    "local_granted": p.local.iter().map(|l| l.credits_outstanding).sum::<u32>(),
                    "local_elements": p.local.iter().map(|l| l.element_count).sum::<u32>(),
                    "remote_in_use": p.remote.iter().map(|r| r.in_use).sum::<u32>(),
                    "remote_elements": p.remote.iter().map(|r| r.element_count).sum::<u32>(),
                })
            })
            .collect();
        serde_json::json!({
            "tx_frames_per_s": r.map(|r| r.0 .0),
            "tx_bits_per_s": r.map(|r| r.0 .1),
            "rx_frames_per_s": r.map(|r| r.1 .0),
            "rx_bits_per_s": r.map(|r| r.1 .1),
            "stats": self.stats,
            "occupancy": occupancy,
        })
        .to_string()
    }

    /// The frame as a screen.
    pub fn text(&self, socket: &Path) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "splitnetctl top: {}  (Ctrl-C ends)\n", socket.display());
        match self.rates() {
            Some(((tf, tb), (rf, rb))) => {
                let _ = writeln!(o, "  tx {:>12} {:>12.0} frames/s", bits(tb), tf);
                let _ = writeln!(o, "  rx {:>12} {:>12.0} frames/s", bits(rb), rf);
            }
            None => o.push_str("  (rates after the next sample)\n\n"),
        }
        let s = self.stats;
        let _ = writeln!(
            o,
            "  dropped tx {} rx {}, waited for credit {}, protocol errors {}, protection errors {}\n",
            s.fabric.tx.dropped,
            s.fabric.rx.dropped,
            s.tx_backpressure,
            s.fabric.protocol_errors,
            s.fabric.protection_errors
        );
        for p in &self.pools.peers {
            let _ = writeln!(o, "  {}", p.peer);
            for l in &p.local {
                let _ = writeln!(
                    o,
                    "    rx pool {:>3} {} {:>5}/{:<5} granted to the peer {}",
                    l.pool_ref,
                    bar(l.credits_outstanding, l.element_count, 30),
                    l.credits_outstanding,
                    l.element_count,
                    l.state
                );
            }
            for r in &p.remote {
                let _ = writeln!(
                    o,
                    "    tx pool {:>3} {} {:>5}/{:<5} in use",
                    r.pool_ref,
                    bar(r.in_use, r.element_count, 30),
                    r.in_use,
                    r.element_count
                );
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_control::report::{Counters, HostEntry};
    use std::collections::BTreeMap;

    #[test]
    fn bars_round_up_and_clamp() {
        assert_eq!(bar(0, 10, 10), "[..........]");
        assert_eq!(bar(1, 100, 10), "[#.........]");
        assert_eq!(bar(10, 10, 10), "[##########]");
        assert_eq!(bar(20, 10, 10), "[##########]");
        assert_eq!(bar(5, 0, 4), "[....]");
    }

    #[test]
    fn rates_use_the_interval_and_never_go_negative() {
        let a = Direction {
            frames: 100,
            bytes: 1_000,
            dropped: 0,
        };
        let b = Direction {
            frames: 300,
            bytes: 251_000,
            dropped: 0,
        };
        assert_eq!(rate(&b, &a, Duration::from_secs(2)), (100.0, 1_000_000.0));
        // A daemon restart resets the counters: no negative rate.
        assert_eq!(rate(&a, &b, Duration::from_secs(1)), (0.0, 0.0));
    }

    #[test]
    fn the_hosts_table_stays_aligned_whatever_the_address() {
        let entry = |session, address: &str| HostEntry {
            name: String::new(),
            session,
            node_id: 1,
            queue: 0,
            queues: 1,
            address: address.into(),
            mac: "02:5d:00:ad:f3:73".into(),
            domain: 7,
            mtu: 1500,
            promisc: false,
            multicast: 0,
            offloads: vec![],
            connected_s: 61,
            counters: Counters::default(),
            buffer_bytes: 0,
            buffer_quota_bytes: 2 << 20,
            in_place: 0,
            ce_marked: 0,
            drops: BTreeMap::new(),
            bridged: vec![],
            standby: false,
            port: String::new(),
        };
        let h = Hosts {
            hosts: vec![
                entry(1, "10.200.0.1:41234"),
                entry(
                    2,
                    "unix:/run/ioc-driver/fabric.sock (pid 4242), shared memory",
                ),
            ],
        };
        let text = hosts(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // Every column has a fixed width once the address column fits the longest address,
        // so every line is as long as the header.
        for l in &lines {
            assert_eq!(l.chars().count(), lines[0].chars().count(), "{text}");
        }
        assert!(lines[2].contains("(pid 4242), shared memory   "), "{text}");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(59), "59s");
        assert_eq!(duration(61), "1m01s");
        assert_eq!(duration(3 * 3600 + 120), "3h02m");
        assert_eq!(duration(2 * 86_400 + 3600), "2d01h");
    }
}
