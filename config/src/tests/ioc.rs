//! ioc.toml: defaults and every rule of `[fabric]` and `[lan]`.

use super::{invalid, ioc, ioc_text, parse_error};
use crate::{MacAddr, Promiscuous};
use std::time::Duration;

#[test]
fn defaults() {
    let i = ioc("", "", "").unwrap();
    assert_eq!(i.fabric.listen.to_string(), "10.0.0.1:7400");
    assert_eq!(i.fabric.max_hosts, 8);
    assert_eq!(i.fabric.keepalive_interval(), Duration::from_millis(200));
    assert_eq!(i.fabric.keepalive_timeout(), Duration::from_millis(750));
    assert_eq!(i.fabric.handshake_timeout(), Duration::from_millis(2000));
    assert_eq!(i.lan.interface, "lan0");
    assert_eq!(i.lan.promiscuous, Promiscuous::Auto);
    assert_eq!(i.lan.mac_base, MacAddr([0x02, 0x5d, 0, 0, 0, 0]));
    assert_eq!(i.lan.mtu, None);
    assert_eq!(i.lan.storm_control_pps, 5000);
    assert!(i.lan.offload);
    assert!(i.lan.extra_source_macs.is_empty());
    assert_eq!(i.lan.set_mac, crate::SetMacPolicy::Prefix);
    assert_eq!(i.fabric.max_handshakes, 32);
    assert_eq!(i.fabric.workers, 0);
    assert_eq!(i.fabric.listen_local, None);
    assert!(!i.fabric.rdma, "RDMA data channels off by default");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(
        i.fabric.worker_count(),
        cores.min(i.fabric.max_hosts as usize)
    );
    assert_eq!(i.pools, crate::Pools::default());
    assert_eq!(i.log.level, "info");
}

#[test]
fn every_key_is_read() {
    let i = ioc(
        "max_hosts = 64\nkeepalive_interval_ms = 100\nkeepalive_timeout_ms = 201\nhandshake_timeout_ms = 100\nmax_handshakes = 5\nworkers = 3\nlisten_local = \"/run/ioc-driver/fabric.sock\"\nrdma = true",
        "promiscuous = \"off\"\nmac_base = \"06:11:22:33:44:55\"\nmtu = 9000\noffload = false\nextra_source_macs = [\"02:00:00:00:00:07\"]\nset_mac = \"any\"",
        "[log]\nlevel = \"warn\"\n[auth]\nadmission = \"open\"",
    )
    .unwrap();
    assert_eq!(i.fabric.max_hosts, 64);
    assert_eq!(i.fabric.keepalive_interval_ms, 100);
    assert_eq!(i.fabric.keepalive_timeout_ms, 201);
    assert_eq!(i.fabric.handshake_timeout_ms, 100);
    assert_eq!(i.lan.promiscuous, Promiscuous::Off);
    assert_eq!(i.lan.mac_base.to_string(), "06:11:22:33:44:55");
    assert_eq!(i.lan.mtu, Some(9000));
    assert!(!i.lan.offload);
    assert_eq!(i.fabric.max_handshakes, 5);
    assert_eq!(i.fabric.workers, 3);
    assert_eq!(i.fabric.worker_count(), 3);
    assert!(i.fabric.rdma);
    assert_eq!(
        i.fabric.listen_local.as_deref(),
        Some(std::path::Path::new("/run/ioc-driver/fabric.sock"))
    );
    assert_eq!(i.lan.extra_source_macs, vec![MacAddr([2, 0, 0, 0, 0, 7])]);
    assert_eq!(i.lan.set_mac, crate::SetMacPolicy::Any);
    assert_eq!(i.log.level, "warn");
}

#[test]
fn required_keys() {
    parse_error(ioc_text("[fabric]\nlisten = \"10.0.0.1:7400\""), &["lan"]);
    parse_error(ioc_text("[lan]\ninterface = \"lan0\""), &["fabric"]);
    // Shared mode (the default) needs its NIC.
    invalid(
        ioc_text("[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\nmtu = 1500"),
        "lan.interface",
    );
    parse_error(
        ioc_text("[fabric]\nmax_hosts = 2\n[lan]\ninterface = \"lan0\""),
        &["listen"],
    );
}

#[test]
fn listen_address() {
    let i = ioc_text("[fabric]\nlisten = \"0.0.0.0:7400\"\n[lan]\ninterface = \"lan0\"").unwrap();
    assert!(i.fabric.listen.ip().is_unspecified());
    invalid(
        ioc_text("[fabric]\nlisten = \"10.0.0.1:0\"\n[lan]\ninterface = \"lan0\""),
        "fabric.listen",
    );
    parse_error(
        ioc_text("[fabric]\nlisten = \"lan0:7400\"\n[lan]\ninterface = \"lan0\""),
        &["listen"],
    );
}

#[test]
fn max_hosts_range() {
    invalid(ioc("max_hosts = 0", "", ""), "fabric.max_hosts");
    invalid(ioc("max_hosts = 65", "", ""), "fabric.max_hosts");
    ioc("max_hosts = 1", "", "").unwrap();
}

#[test]
fn keepalive_rules() {
    invalid(
        ioc("keepalive_interval_ms = 9", "", ""),
        "fabric.keepalive_interval_ms",
    );
    invalid(
        ioc("keepalive_interval_ms = 375", "", ""),
        "fabric.keepalive_timeout_ms",
    );
    invalid(
        ioc("keepalive_timeout_ms = 600001", "", ""),
        "fabric.keepalive_timeout_ms",
    );
}

#[test]
fn handshake_timeout_range() {
    invalid(
        ioc("handshake_timeout_ms = 99", "", ""),
        "fabric.handshake_timeout_ms",
    );
    invalid(
        ioc("handshake_timeout_ms = 60001", "", ""),
        "fabric.handshake_timeout_ms",
    );
    ioc("handshake_timeout_ms = 60000", "", "").unwrap();
}

#[test]
fn lan_interface_name() {
    let text = "[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\ninterface = \"averyveryverylongname\"";
    let r = invalid(ioc_text(text), "lan.interface");
    assert!(r.contains("at most 15"), "{r}");
    for bad in ["", ".", "..", "eth 0"] {
        let text = format!("[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\ninterface = {bad:?}");
        invalid(ioc_text(&text), "lan.interface");
    }
}

#[test]
fn promiscuous_values() {
    for (s, p) in [
        ("auto", Promiscuous::Auto),
        ("on", Promiscuous::On),
        ("off", Promiscuous::Off),
    ] {
        let lan = format!("promiscuous = {s:?}");
        assert_eq!(ioc("", &lan, "").unwrap().lan.promiscuous, p);
    }
    parse_error(ioc("", "promiscuous = \"maybe\"", ""), &["maybe"]);
    parse_error(ioc("", "promiscuous = \"On\"", ""), &["On"]);
    parse_error(ioc("", "promiscuous = true", ""), &["promiscuous"]);
}

#[test]
fn mac_base_rules() {
    let r = invalid(
        ioc("", "mac_base = \"03:5d:00:00:00:00\"", ""),
        "lan.mac_base",
    );
    assert!(r.contains("unicast"), "{r}");
    invalid(
        ioc("", "mac_base = \"00:00:00:00:00:00\"", ""),
        "lan.mac_base",
    );
    parse_error(ioc("", "mac_base = \"02:5d:00:00:00\"", ""), &["mac_base"]);
}

#[test]
fn mtu_range() {
    invalid(ioc("", "mtu = 67", ""), "lan.mtu");
    invalid(ioc("", "mtu = 65536", ""), "lan.mtu");
    assert_eq!(ioc("", "mtu = 68", "").unwrap().lan.mtu, Some(68));
    assert_eq!(ioc("", "mtu = 65535", "").unwrap().lan.mtu, Some(65535));
    invalid(
        ioc("", "storm_control_pps = 10000001", ""),
        "lan.storm_control_pps",
    );
    invalid(ioc("", "rx_queues = 0", ""), "lan.rx_queues");
    invalid(ioc("", "rx_queues = 17", ""), "lan.rx_queues");
    assert_eq!(ioc("", "rx_queues = 16", "").unwrap().lan.rx_queues, 16);
    assert!(!ioc("", "", "").unwrap().lan.rx_ring, "off by default");
    assert!(ioc("", "rx_ring = true", "").unwrap().lan.rx_ring);
    assert!(ioc("", "rx_ring = 1", "").is_err(), "a boolean");
    assert_eq!(
        ioc("", "", "").unwrap().lan.rx_queues,
        crate::ioc::DEFAULT_RX_QUEUES
    );
    assert_eq!(
        ioc("", "storm_control_pps = 0", "")
            .unwrap()
            .lan
            .storm_control_pps,
        0
    );
}

#[test]
fn unknown_keys_are_named() {
    parse_error(ioc("", "promisc = \"on\"", ""), &["promisc"]);
    parse_error(ioc("reconnect_min_ms = 100", "", ""), &["reconnect_min_ms"]);
    parse_error(ioc("", "", "[interface]\nname = \"sd0\""), &["interface"]);
}

#[test]
fn shared_sections_are_validated() {
    invalid(
        ioc("", "", "[pools]\ncredit_batch = 0"),
        "pools.credit_batch",
    );
    invalid(ioc("", "", "[log]\nlevel = \"loud\""), "log.level");
}

#[test]
fn source_macs_and_set_mac_policy() {
    for (lan, key) in [
        (
            "extra_source_macs = [\"01:00:5e:00:00:01\"]",
            "lan.extra_source_macs",
        ),
        (
            "extra_source_macs = [\"00:00:00:00:00:00\"]",
            "lan.extra_source_macs",
        ),
    ] {
        invalid(ioc("", lan, ""), key);
    }
    // Under key admission every bridged MAC belongs to one host's entry.
    let all = "extra_source_macs = [\"02:00:00:00:00:07\"]";
    assert!(invalid(ioc("", all, ""), "lan.extra_source_macs").contains("extra_macs"));
    assert!(ioc("", all, "[auth]\nadmission = \"open\"").is_ok());
    parse_error(ioc("", "set_mac = \"sometimes\"", ""), &["sometimes"]);
    invalid(ioc("max_handshakes = 0", "", ""), "fabric.max_handshakes");
    invalid(ioc("workers = 65", "", ""), "fabric.workers");
    invalid(
        ioc("listen_local = \"fabric.sock\"", "", ""),
        "fabric.listen_local",
    );
    invalid(
        ioc("listen_local_group = \"splitnet\"", "", ""),
        "fabric.listen_local_group",
    );
    invalid(
        ioc(
            "listen_local = \"/run/s.sock\"\nlisten_local_group = \"a:b\"",
            "",
            "",
        ),
        "fabric.listen_local_group",
    );
    let g = ioc(
        "listen_local = \"/run/s.sock\"\nlisten_local_group = \"splitnet\"",
        "",
        "",
    )
    .unwrap();
    assert_eq!(g.fabric.listen_local_group.as_deref(), Some("splitnet"));
    let base = [0x02, 0x5d, 0, 0, 0, 0];
    let p = crate::SetMacPolicy::Prefix;
    assert!(p.allows([0x02, 0x5d, 0, 1, 2, 3], base));
    assert!(!p.allows([0x02, 0x5e, 0, 1, 2, 3], base));
    assert!(!p.allows([0x03, 0x5d, 0, 1, 2, 3], base), "group address");
    assert!(crate::SetMacPolicy::Any.allows([0x02, 0x5e, 0, 1, 2, 3], base));
    assert!(!crate::SetMacPolicy::Any.allows([0; 6], base));
    assert!(!crate::SetMacPolicy::Off.allows([0x02, 0x5d, 0, 1, 2, 3], base));
}

const KEY_A: &str = "U0QzgGvlzWUEpnsepcHjRzxBZ/1eH8rZyHMjEYOA4BI=";
const KEY_B: &str = "cGAmDL/g05qnxWUt8LXpFm20s0iHIzo2xnn5d69XWxE=";

#[test]
fn auth_admits_by_key_by_default_and_lists_hosts() {
    let i = ioc("", "", "").unwrap();
    assert_eq!(i.auth.admission, crate::Admission::Keys);
    assert!(i.auth.hosts.is_empty());
    assert_eq!(i.auth.private_key_file, None);
    let rest = format!(
        "[auth]\nprivate_key_file = \"/etc/splitnet/ioc.key\"\n\
         [[auth.hosts]]\nname = \"a\"\npublic_key = \"{KEY_A}\"\nmac = \"02:5d:00:00:00:01\"\n\
         [[auth.hosts]]\nname = \"b\"\npublic_key = \"{KEY_B}\"\n"
    );
    let i = ioc("", "", &rest).unwrap();
    assert_eq!(i.auth.hosts.len(), 2);
    let a: crate::key::Key = KEY_A.parse().unwrap();
    let found = i.auth.host(&a.0).unwrap();
    assert_eq!(found.name, "a");
    assert_eq!(found.mac, Some(MacAddr([2, 0x5d, 0, 0, 0, 1])));
    assert_eq!(i.auth.hosts[1].mac, None);
    assert!(
        !i.auth.hosts[1].promiscuous,
        "promiscuous only when the policy says so"
    );
    assert!(i.auth.hosts[1].extra_macs.is_empty());
    assert_eq!(i.auth.hosts[1].queues, 1, "one queue unless set");
    assert_eq!(
        found.reserved_macs().collect::<Vec<_>>(),
        vec![[2, 0x5d, 0, 0, 0, 1]]
    );
    let open = ioc("", "", "[auth]\nadmission = \"open\"").unwrap();
    assert_eq!(open.auth.admission, crate::Admission::Open);
}

#[test]
fn a_hosts_queues_are_bounded() {
    let entry =
        |q: &str| format!("[[auth.hosts]]\nname = \"a\"\npublic_key = \"{KEY_A}\"\nqueues = {q}\n");
    assert_eq!(ioc("", "", &entry("16")).unwrap().auth.hosts[0].queues, 16);
    invalid(ioc("", "", &entry("0")), "auth.hosts.queues");
    invalid(ioc("", "", &entry("17")), "auth.hosts.queues");
}

#[test]
fn a_hosts_vlans_are_access_or_trunk() {
    let entry = |v: &str| format!("[[auth.hosts]]\nname = \"a\"\npublic_key = \"{KEY_A}\"\n{v}\n");
    let h = ioc("", "", &entry("vlan = 10")).unwrap();
    assert_eq!(
        (h.auth.hosts[0].vlan, h.auth.hosts[0].vlans.len()),
        (Some(10), 0)
    );
    let h = ioc("", "", &entry("vlans = [0, 10, 4094]")).unwrap();
    assert_eq!(h.auth.hosts[0].vlans, vec![0, 10, 4094]);
    let h = ioc("", "", &entry("")).unwrap();
    assert_eq!(
        (h.auth.hosts[0].vlan, h.auth.hosts[0].vlans.len()),
        (None, 0)
    );
    for (v, key) in [
        ("vlan = 0", "auth.hosts.vlan"),
        ("vlan = 4095", "auth.hosts.vlan"),
        ("vlans = [4095]", "auth.hosts.vlans"),
        ("vlans = [10, 10]", "auth.hosts.vlans"),
        ("vlan = 10\nvlans = [20]", "auth.hosts.vlan"),
    ] {
        invalid(ioc("", "", &entry(v)), key);
    }
    let many: Vec<String> = (1..=65).map(|n| n.to_string()).collect();
    invalid(
        ioc("", "", &entry(&format!("vlans = [{}]", many.join(",")))),
        "auth.hosts.vlans",
    );
}

#[test]
fn a_reload_may_change_auth_but_its_key_file_and_every_other_section_need_a_restart() {
    let base = ioc("", "", "").unwrap();
    let hosts =
        format!("[[auth.hosts]]\nname = \"a\"\npublic_key = \"{KEY_A}\"\npromiscuous = true\n");
    let auth = ioc(
        "",
        "",
        &format!("[auth]\nencrypt_data = true\nadmission = \"open\"\n{hosts}"),
    )
    .unwrap();
    assert!(base.restart_needed(&auth).is_empty());
    assert!(base.restart_needed(&base).is_empty());
    let key = ioc("", "", "[auth]\nprivate_key_file = \"/k\"").unwrap();
    assert_eq!(base.restart_needed(&key), ["auth.private_key_file"]);
    let many = ioc("max_hosts = 9", "mtu = 9000", "[log]\nlevel = \"warn\"").unwrap();
    assert_eq!(base.restart_needed(&many), ["[fabric]", "[lan]", "[log]"]);
    let more = ioc("", "", "[pools]\ncredit_batch = 3\n[metrics]\nlisten = \"127.0.0.1:9\"\n[control]\nenabled = false").unwrap();
    assert_eq!(
        base.restart_needed(&more),
        ["[pools]", "[metrics]", "[control]"]
    );
}

#[test]
fn auth_refuses_bad_keys_duplicates_and_bad_names() {
    let host = |name: &str, key: &str, mac: &str| {
        format!("[[auth.hosts]]\nname = \"{name}\"\npublic_key = \"{key}\"\n{mac}\n")
    };
    parse_error(
        ioc("", "", &host("a", "AAAA", "")),
        &["not a key", "genkey"],
    );
    parse_error(ioc("", "", "[auth]\nadmission = \"maybe\""), &["maybe"]);
    let twice = format!("{}{}", host("a", KEY_A, ""), host("b", KEY_A, ""));
    assert!(invalid(ioc("", "", &twice), "auth.hosts").contains("same public key"));
    let twice = format!("{}{}", host("a", KEY_A, ""), host("a", KEY_B, ""));
    assert!(invalid(ioc("", "", &twice), "auth.hosts").contains("same name"));
    let m = "mac = \"02:00:00:00:00:09\"";
    let twice = format!("{}{}", host("a", KEY_A, m), host("b", KEY_B, m));
    assert!(invalid(ioc("", "", &twice), "auth.hosts").contains("same mac"));
    invalid(ioc("", "", &host("", KEY_A, "")), "auth.hosts.name");
    // Bridged machines' MACs: unicast, no more than 64, never another host's.
    let extra = |list: &str| format!("extra_macs = [{list}]");
    let i = ioc("", "", &host("a", KEY_A, &extra("\"02:aa:00:00:00:01\"")));
    assert_eq!(
        i.unwrap().auth.hosts[0].extra_macs,
        vec![MacAddr([2, 0xaa, 0, 0, 0, 1])]
    );
    invalid(
        ioc("", "", &host("a", KEY_A, &extra("\"01:aa:00:00:00:01\""))),
        "auth.hosts.extra_macs",
    );
    let many: Vec<String> = (0..65)
        .map(|n| format!("\"02:aa:00:00:00:{n:02x}\""))
        .collect();
    invalid(
        ioc("", "", &host("a", KEY_A, &extra(&many.join(",")))),
        "auth.hosts.extra_macs",
    );
    let twice = format!(
        "{}{}",
        host("a", KEY_A, "mac = \"02:aa:00:00:00:01\""),
        host("b", KEY_B, &extra("\"02:aa:00:00:00:01\""))
    );
    assert!(invalid(ioc("", "", &twice), "auth.hosts").contains("same mac 02:aa:00:00:00:01"));
    let own = host(
        "a",
        KEY_A,
        &format!(
            "mac = \"02:aa:00:00:00:01\"\n{}",
            extra("\"02:aa:00:00:00:01\"")
        ),
    );
    assert!(invalid(ioc("", "", &own), "auth.hosts").contains("twice"));
    invalid(
        ioc("", "", &host("a", KEY_A, "mac = \"01:00:5e:00:00:01\"")),
        "auth.hosts.mac",
    );
}

/// An ioc.toml in ports mode: `lan` lines, then `rest`.
fn ports(lan: &str, rest: &str) -> Result<crate::IocConfig, crate::ConfigError> {
    ioc_text(&format!(
        "[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\nmode = \"ports\"\n{lan}\n{rest}"
    ))
}

fn hosts(entries: &[(&str, &str, Option<&str>)]) -> String {
    let mut s = String::new();
    for (name, key, port) in entries {
        s += &format!("[[auth.hosts]]\nname = \"{name}\"\npublic_key = \"{key}\"\n");
        if let Some(p) = port {
            s += &format!("port = \"{p}\"\n");
        }
    }
    s
}

#[test]
fn ports_mode_names_a_port_per_host() {
    assert_eq!(ioc("", "", "").unwrap().lan.mode, crate::LanMode::Shared);
    let two = hosts(&[("web 1", KEY_A, None), ("b", KEY_B, Some("vif-b"))]);
    let i = ports(
        "bridge = \"br0\"\nport_hook = \"/usr/lib/splitnet/port-ovs\"",
        &two,
    )
    .unwrap();
    assert_eq!(i.lan.mode, crate::LanMode::Ports);
    assert_eq!(i.lan.bridge.as_deref(), Some("br0"));
    assert_eq!(
        i.auth.hosts[0].port_name(),
        "sdp-web-1",
        "derived, the space made a dash"
    );
    assert_eq!(i.auth.hosts[1].port_name(), "vif-b", "as set");
    let long = hosts(&[("a-very-long-host-name", KEY_A, None)]);
    let i = ports("", &long).unwrap();
    assert_eq!(i.auth.hosts[0].port_name(), "sdp-a-very-long");
    assert_eq!(
        i.auth.hosts[0].port_name().len(),
        15,
        "IFNAMSIZ less its NUL"
    );
}

#[test]
fn ports_mode_refuses_clashes_bad_names_and_shared_mode_keys() {
    let clash = hosts(&[
        ("a-very-long-name-1", KEY_A, None),
        ("a-very-long-name-2", KEY_B, None),
    ]);
    let r = invalid(ports("", &clash), "auth.hosts.port");
    assert!(r.contains("both have port \"sdp-a-very-long\""), "{r}");
    let same = hosts(&[("a", KEY_A, Some("p0")), ("b", KEY_B, Some("p0"))]);
    invalid(ports("", &same), "auth.hosts.port");
    let long = hosts(&[("a", KEY_A, Some("a-sixteen-bytes!"))]);
    let r = invalid(ports("", &long), "auth.hosts.port");
    assert!(r.contains("at most 15"), "{r}");
    // The clash is a ports-mode error only: shared mode has no ports.
    ioc("", "", &clash).unwrap();
    let r = invalid(ports("interface = \"lan0\"", ""), "lan.interface");
    assert!(r.contains("ports"), "{r}");
    invalid(ioc("", "bridge = \"br0\"", ""), "lan.bridge");
    invalid(ioc("", "port_hook = \"/bin/true\"", ""), "lan.port_hook");
    invalid(ports("port_hook = \"hook\"", ""), "lan.port_hook");
    invalid(ports("bridge = \"\"", ""), "lan.bridge");
    let text = "[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\nmode = \"switch\"";
    parse_error(ioc_text(text), &["switch", "shared", "ports"]);
}
