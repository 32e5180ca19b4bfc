//! host.toml: defaults and every rule of `[fabric]` and `[interface]`.

use super::{err, host, host_text, invalid, parse_error, P};
use crate::{FabricAddr, MacAddr};
use std::time::Duration;

#[test]
fn defaults() {
    let h = host("").unwrap();
    assert_eq!(h.fabric.ioc.to_string(), "10.0.0.1:7400");
    assert_eq!(h.fabric.keepalive_interval(), Duration::from_millis(200));
    assert_eq!(h.fabric.keepalive_timeout(), Duration::from_millis(750));
    assert_eq!(h.fabric.reconnect_min(), Duration::from_millis(100));
    assert_eq!(h.fabric.restart_grace(), Duration::from_secs(2));
    assert_eq!(h.fabric.reconnect_max(), Duration::from_millis(500));
    assert_eq!(h.fabric.node_id, None);
    assert_eq!(h.interface.name, "sd0");
    assert_eq!(h.interface.mac, None);
    assert!(h.interface.offload);
    assert_eq!(h.interface.queues, 1);
    assert!(h.interface.persist);
    assert_eq!(h.pools, crate::Pools::default());
    assert_eq!(h.log.level, "info");
}

#[test]
fn every_key_is_read() {
    let h = host(
        "keepalive_interval_ms = 10\nkeepalive_timeout_ms = 21\nreconnect_min_ms = 10\n\
         reconnect_max_ms = 10\nrestart_grace_ms = 0\nnode_id = 42\n\
         [interface]\nname = \"a-b_c.9\"\nmac = \"02:AB:cd:00:00:01\"\noffload = false\nqueues = 1\n\
         persist = false\n[log]\nlevel = \"trace\"",
    )
    .unwrap();
    assert_eq!(h.fabric.keepalive_interval_ms, 10);
    assert_eq!(h.fabric.keepalive_timeout_ms, 21);
    assert_eq!(h.fabric.reconnect_min_ms, 10);
    assert_eq!(h.fabric.reconnect_max_ms, 10);
    assert_eq!(h.fabric.restart_grace_ms, 0);
    assert_eq!(h.fabric.node_id, Some(42));
    assert_eq!(h.interface.name, "a-b_c.9");
    assert_eq!(h.interface.mac, Some(MacAddr([0x02, 0xab, 0xcd, 0, 0, 1])));
    assert!(!h.interface.offload);
    assert_eq!(h.interface.queues, 1);
    assert!(!h.interface.persist);
    assert_eq!(h.log.level, "trace");
}

#[test]
fn node_id_zero_means_derive() {
    assert_eq!(host("node_id = 0").unwrap().fabric.node_id, None);
}

#[test]
fn ioc_address() {
    parse_error(host_text("[interface]\nname = \"sd0\""), &["fabric"]);
    assert_eq!(
        super::err(host_text("")),
        format!("{P}: line 1, column 1: missing field `fabric`")
    );
    parse_error(host_text("[fabric]\nnode_id = 1"), &["ioc"]);
    parse_error(host_text("[fabric]\nioc = \"not an address\""), &["ioc"]);
    parse_error(host_text("[fabric]\nioc = \"10.0.0.1\""), &["ioc"]);
    invalid(host_text("[fabric]\nioc = \"0.0.0.0:7400\""), "fabric.ioc");
    invalid(host_text("[fabric]\nioc = \"10.0.0.1:0\""), "fabric.ioc");
    let h = host_text("[fabric]\nioc = \"[fd00::2]:7400\"").unwrap();
    assert!(matches!(h.fabric.ioc, FabricAddr::Tcp(a) if a.is_ipv6()));
    let h = host_text("[fabric]\nioc = \"unix:/run/ioc-driver/fabric.sock\"").unwrap();
    assert_eq!(
        h.fabric.ioc,
        FabricAddr::Unix("/run/ioc-driver/fabric.sock".into())
    );
    assert_eq!(h.fabric.ioc.to_string(), "unix:/run/ioc-driver/fabric.sock");
    assert!(h.fabric.shared_memory, "shared memory by default");
    let h = host_text("[fabric]\nioc = \"unix:/run/x.sock\"\nshared_memory = false").unwrap();
    assert!(!h.fabric.shared_memory);
    assert_eq!(
        h.fabric.spin_max(),
        Duration::ZERO,
        "polling off by default"
    );
    let h = host_text("[fabric]\nioc = \"unix:/run/x.sock\"\nspin_max_us = 50").unwrap();
    assert_eq!(h.fabric.spin_max(), Duration::from_micros(50));
    invalid(
        host_text("[fabric]\nioc = \"unix:/run/x.sock\"\nspin_max_us = 1001"),
        "fabric.spin_max_us",
    );
    parse_error(
        host_text("[fabric]\nioc = \"unix:fabric.sock\""),
        &["ioc", "absolute"],
    );
    let long = format!("[fabric]\nioc = \"unix:/{}\"", "x".repeat(107));
    parse_error(host_text(&long), &["ioc", "107 bytes"]);
    // rdma:ADDRESS:PORT: TCP to that address, the data channel over RDMA verbs.
    let h = host_text("[fabric]\nioc = \"rdma:10.201.0.1:7400\"").unwrap();
    assert_eq!(
        h.fabric.ioc,
        FabricAddr::Rdma("10.201.0.1:7400".parse().unwrap())
    );
    assert_eq!(h.fabric.ioc.to_string(), "rdma:10.201.0.1:7400");
    invalid(
        host_text("[fabric]\nioc = \"rdma:0.0.0.0:7400\""),
        "fabric.ioc",
    );
    parse_error(
        host_text("[fabric]\nioc = \"rdma:rxe0\""),
        &["rdma:ADDRESS:PORT"],
    );
}

#[test]
fn keepalive_interval_range() {
    invalid(
        host("keepalive_interval_ms = 9"),
        "fabric.keepalive_interval_ms",
    );
    invalid(
        host("keepalive_interval_ms = 60001\nkeepalive_timeout_ms = 600000"),
        "fabric.keepalive_interval_ms",
    );
    host("keepalive_interval_ms = 60000\nkeepalive_timeout_ms = 120001").unwrap();
}

#[test]
fn keepalive_timeout_exceeds_twice_interval() {
    let r = invalid(
        host("keepalive_interval_ms = 500\nkeepalive_timeout_ms = 1000"),
        "fabric.keepalive_timeout_ms",
    );
    assert!(r.contains("twice"), "{r}");
    host("keepalive_interval_ms = 500\nkeepalive_timeout_ms = 1001").unwrap();
    invalid(
        host("keepalive_timeout_ms = 400"),
        "fabric.keepalive_timeout_ms",
    );
}

#[test]
fn keepalive_timeout_ceiling() {
    invalid(
        host("keepalive_timeout_ms = 600001"),
        "fabric.keepalive_timeout_ms",
    );
    host("keepalive_timeout_ms = 600000").unwrap();
}

#[test]
fn reconnect_bounds() {
    invalid(host("reconnect_min_ms = 9"), "fabric.reconnect_min_ms");
    invalid(
        host("reconnect_min_ms = 60001\nreconnect_max_ms = 70000"),
        "fabric.reconnect_min_ms",
    );
    let r = invalid(
        host("reconnect_min_ms = 300\nreconnect_max_ms = 299"),
        "fabric.reconnect_max_ms",
    );
    assert!(r.contains("299"), "{r}");
    invalid(host("restart_grace_ms = 60001"), "fabric.restart_grace_ms");
    invalid(host("reconnect_max_ms = 600001"), "fabric.reconnect_max_ms");
    host("reconnect_min_ms = 60000\nreconnect_max_ms = 600000").unwrap();
}

#[test]
fn interface_name_too_long_message() {
    let e = err(host("[interface]\nname = \"averyveryverylongname\""));
    assert_eq!(
        e,
        format!("{P}: interface.name: \"averyveryverylongname\" is 21 bytes, at most 15 allowed")
    );
    host("[interface]\nname = \"fifteen-bytes-x\"").unwrap();
}

#[test]
fn interface_name_forms() {
    for bad in ["", ".", "..", "sd 0", "sd/0", "sd:0", "sé0", "sd0\\n"] {
        let text = format!("[interface]\nname = {bad:?}");
        invalid(host(&text), "interface.name");
    }
    for good in ["sd0", "a", "x.y", "my_tap-1", ".a", "..."] {
        let text = format!("[interface]\nname = {good:?}");
        assert_eq!(host(&text).unwrap().interface.name, good);
    }
}

#[test]
fn interface_mac() {
    let r = invalid(
        host("[interface]\nmac = \"03:00:00:00:00:01\""),
        "interface.mac",
    );
    assert!(r.contains("unicast"), "{r}");
    invalid(
        host("[interface]\nmac = \"ff:ff:ff:ff:ff:ff\""),
        "interface.mac",
    );
    let r = invalid(
        host("[interface]\nmac = \"00:00:00:00:00:00\""),
        "interface.mac",
    );
    assert!(r.contains("zero"), "{r}");
    parse_error(
        host("[interface]\nmac = \"zz:00:00:00:00:01\""),
        &["mac", "MAC"],
    );
    parse_error(host("[interface]\nmac = 5"), &["mac"]);
}

#[test]
fn interface_queues() {
    invalid(host("[interface]\nqueues = 0"), "interface.queues");
    invalid(host("[interface]\nqueues = 17"), "interface.queues");
    assert_eq!(
        host("[interface]\nqueues = 16").unwrap().interface.queues,
        16
    );
    assert_eq!(host("[interface]\nqueues = 2").unwrap().interface.queues, 2);
    parse_error(host("[interface]\nqueues = -1"), &["queues"]);
}

#[test]
fn unknown_keys_are_named() {
    parse_error(host("[interface]\nnmae = \"sd0\""), &["nmae"]);
    parse_error(host("keepalive_ms = 5"), &["keepalive_ms"]);
    parse_error(host("[pools]\nelement_size = 5"), &["element_size"]);
    parse_error(host("[log]\nfile = \"x\""), &["file"]);
    parse_error(host("[lan]\ninterface = \"lan0\""), &["lan"]);
}

#[test]
fn wrong_types_are_named() {
    parse_error(
        host("keepalive_interval_ms = \"200\""),
        &["keepalive_interval_ms"],
    );
    parse_error(host("[interface]\noffload = 1"), &["offload"]);
}

#[test]
fn metrics_listener_is_opt_in() {
    assert_eq!(host("").unwrap().metrics.listen, None);
    let h = host("[metrics]\nlisten = \"127.0.0.1:9701\"").unwrap();
    assert_eq!(h.metrics.listen.unwrap().port(), 9701);
    invalid(
        host("[metrics]\nlisten = \"127.0.0.1:0\""),
        "metrics.listen",
    );
}

#[test]
fn control_socket_is_on_by_default_and_checked() {
    let h = host("").unwrap();
    assert!(h.control.enabled);
    assert_eq!(h.control.socket, None);
    let h = host("[control]\nsocket = \"/run/x/c.sock\"").unwrap();
    assert_eq!(h.control.socket.unwrap().to_str(), Some("/run/x/c.sock"));
    assert!(!host("[control]\nenabled = false").unwrap().control.enabled);
    let why = invalid(host("[control]\nsocket = \"c.sock\""), "control.socket");
    assert!(why.contains("absolute"), "{why}");
    let long = format!("[control]\nsocket = \"/{}\"", "x".repeat(120));
    let why = invalid(host(&long), "control.socket");
    assert!(why.contains("longer than 107"), "{why}");
    parse_error(host("[control]\nport = 1"), &["port"]);
}

#[test]
fn auth_is_optional_and_takes_the_iocs_key() {
    let h = host("").unwrap();
    assert_eq!(h.auth.ioc_public_key, None);
    let h = host("[auth]\nioc_public_key = \"U0QzgGvlzWUEpnsepcHjRzxBZ/1eH8rZyHMjEYOA4BI=\"\nprivate_key_file = \"/k\"").unwrap();
    assert!(h.auth.ioc_public_key.is_some());
    assert_eq!(
        h.auth.private_key_file.as_deref(),
        Some(std::path::Path::new("/k"))
    );
    parse_error(host("[auth]\nioc_public_key = \"short\""), &["not a key"]);
}

#[test]
fn encrypting_the_data_channel_needs_the_iocs_key() {
    assert!(!host("").unwrap().auth.encrypt_data);
    let key = "ioc_public_key = \"U0QzgGvlzWUEpnsepcHjRzxBZ/1eH8rZyHMjEYOA4BI=\"";
    let h = host(&format!("[auth]\n{key}\nencrypt_data = true")).unwrap();
    assert!(h.auth.encrypt_data);
    let why = invalid(host("[auth]\nencrypt_data = true"), "auth.encrypt_data");
    assert!(why.contains("ioc_public_key"), "{why}");
    // Over RDMA the adapter writes frames into memory: nothing to seal them in.
    let rdma =
        format!("[fabric]\nioc = \"rdma:10.0.0.1:7400\"\n[auth]\n{key}\nencrypt_data = true");
    let why = invalid(host_text(&rdma), "auth.encrypt_data");
    assert!(why.contains("RDMA"), "{why}");
}

const KEY: &str = "U0QzgGvlzWUEpnsepcHjRzxBZ/1eH8rZyHMjEYOA4BI=";

#[test]
fn standby_iocs_are_read_in_order_with_their_keys() {
    let h = host("").unwrap();
    assert!(h.fabric.standby.is_empty());
    assert_eq!(h.fabric.liveness_interval(), Duration::from_millis(25));
    assert_eq!(h.fabric.liveness_misses, 4);
    assert_eq!(h.fabric.failback_after(), None);
    assert_eq!(h.fabric.announce_count, 3);
    assert_eq!(h.fabric.announce_interval(), Duration::from_millis(100));
    let h = host(&format!(
        "standby = [{{ ioc = \"10.0.0.2:7400\", public_key = \"{KEY}\" }}, {{ ioc = \"unix:/run/b.sock\", public_key = \"{KEY}\" }}]\n\
         liveness_interval_ms = 20\nliveness_misses = 3\nfailback_after_s = 30\nannounce_count = 5\nannounce_interval_ms = 50\n\
         [auth]\nioc_public_key = \"{KEY}\""
    ))
    .unwrap();
    let f = &h.fabric;
    assert_eq!(f.standby.len(), 2);
    assert_eq!(f.standby[0].ioc.to_string(), "10.0.0.2:7400");
    assert_eq!(f.standby[1].ioc.to_string(), "unix:/run/b.sock");
    assert_eq!(f.standby[0].public_key.to_string(), KEY);
    assert_eq!((f.liveness_interval_ms, f.liveness_misses), (20, 3));
    assert_eq!(f.failback_after(), Some(Duration::from_secs(30)));
    assert_eq!((f.announce_count, f.announce_interval_ms), (5, 50));
}

#[test]
fn standby_rules() {
    let one = format!("standby = [{{ ioc = \"10.0.0.2:7400\", public_key = \"{KEY}\" }}]\n");
    let auth = format!("[auth]\nioc_public_key = \"{KEY}\"");
    // A standby session is asked for in the authenticated handshake only.
    let why = invalid(host(&one), "fabric.standby");
    assert!(why.contains("auth.ioc_public_key"), "{why}");
    let twice =
        format!("standby = [{{ ioc = \"10.0.0.1:7400\", public_key = \"{KEY}\" }}]\n{auth}");
    assert!(invalid(host(&twice), "fabric.standby").contains("named twice"));
    let unspecified =
        format!("standby = [{{ ioc = \"0.0.0.0:7400\", public_key = \"{KEY}\" }}]\n{auth}");
    invalid(host(&unspecified), "fabric.standby");
    let five = (2..7)
        .map(|i| format!("{{ ioc = \"10.0.0.{i}:7400\", public_key = \"{KEY}\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    assert!(invalid(
        host(&format!("standby = [{five}]\n{auth}")),
        "fabric.standby"
    )
    .contains("at most 4"));
    parse_error(
        host(&format!(
            "standby = [{{ ioc = \"10.0.0.2:7400\" }}]\n{auth}"
        )),
        &["public_key"],
    );
    for (key, bad) in [
        ("fabric.liveness_interval_ms", "liveness_interval_ms = 5"),
        ("fabric.liveness_misses", "liveness_misses = 1"),
        ("fabric.failback_after_s", "failback_after_s = 0"),
        ("fabric.announce_count", "announce_count = 0"),
        ("fabric.announce_interval_ms", "announce_interval_ms = 5"),
    ] {
        invalid(host(&format!("{one}{bad}\n{auth}")), key);
    }
    assert!(host(&format!("{one}{auth}")).is_ok());
}
