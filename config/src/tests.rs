//! Configuration tests: defaults, each validation rule, unknown keys, the shipped examples.

use super::*;
use proptest::prelude::*;
use std::path::Path;

const P: &str = "/etc/splitnet/test.toml";

fn host(extra: &str) -> Result<HostConfig, ConfigError> {
    parse_host(
        &format!("[fabric]\nioc = \"10.0.0.1:7400\"\n{extra}"),
        Path::new(P),
    )
}

fn ioc(extra: &str) -> Result<IocConfig, ConfigError> {
    parse_ioc(
        &format!("[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\ninterface = \"lan0\"\n{extra}"),
        Path::new(P),
    )
}

fn err(r: Result<impl std::fmt::Debug, ConfigError>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn defaults() {
    let h = host("").unwrap();
    assert_eq!(h.interface.name, "sd0");
    assert!(h.interface.offload);
    assert_eq!(h.fabric.keepalive_interval_ms, 200);
    assert_eq!(h.fabric.keepalive_timeout_ms, 750);
    assert_eq!(h.pools.advertise.len(), 2);
    assert_eq!(h.log.level, "info");
    let i = ioc("").unwrap();
    assert_eq!(i.fabric.max_hosts, 8);
    assert_eq!(i.lan.promiscuous, Promiscuous::Auto);
    assert_eq!(i.lan.mac_base, MacAddr([2, 0x5d, 0, 0, 0, 0]));
}

#[test]
fn shipped_examples_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd");
    let h = load_host(&root.join("host.toml")).unwrap();
    assert_eq!(h.fabric.ioc.to_string(), "10.200.0.2:7400");
    let i = load_ioc(&root.join("ioc.toml")).unwrap();
    assert_eq!(i.lan.interface, "lan0");
}

#[test]
fn errors_name_file_and_key() {
    let e = err(host("[interface]\nname = \"averyveryverylongname\""));
    assert!(e.starts_with(P), "{e}");
    assert!(e.contains("interface.name"), "{e}");
    assert!(e.contains("21 bytes"), "{e}");
    let e = err(host("[interface]\nname = \"sd 0\""));
    assert!(e.contains("interface.name"), "{e}");
    let e = err(host("[interface]\nmac = \"03:00:00:00:00:01\""));
    assert!(e.contains("interface.mac") && e.contains("unicast"), "{e}");
    let e = err(host("[interface]\nmac = \"zz:00:00:00:00:01\""));
    assert!(e.contains("MAC"), "{e}");
    let e = err(host(
        "[pools]\nadvertise = [{ element_size = 100, element_count = 4 }]",
    ));
    assert!(e.contains("pools.advertise[0].element_size"), "{e}");
    let e = err(host(
        "[pools]\nadvertise = [{ element_size = 2048, element_count = 0 }]",
    ));
    assert!(e.contains("pools.advertise[0].element_count"), "{e}");
    let e = err(host("[pools]\nadvertise = []"));
    assert!(e.contains("pools.advertise"), "{e}");
    let e = err(host("[pools]\nmax_granted_bytes = 1048576"));
    assert!(e.contains("exceed"), "{e}");
    let e = err(host("[pools]\nsend_data_max = 5000"));
    assert!(e.contains("pools.send_data_max"), "{e}");
    let e = err(host("[log]\nlevel = \"loud\""));
    assert!(e.contains("log.level"), "{e}");
    let e = err(parse_host(
        "[fabric]\nioc = \"10.0.0.1:7400\"\nkeepalive_interval_ms = 500\nkeepalive_timeout_ms = 900",
        Path::new(P),
    ));
    assert!(e.contains("fabric.keepalive_timeout_ms"), "{e}");
    let e = err(parse_host("[fabric]\nioc = \"0.0.0.0:7400\"", Path::new(P)));
    assert!(e.contains("fabric.ioc"), "{e}");
    let e = err(parse_host(
        "[fabric]\nioc = \"not an address\"",
        Path::new(P),
    ));
    assert!(e.contains("ioc"), "{e}");
    let e = err(ioc("[lan]\nmtu = 20"));
    assert!(e.contains("lan") || e.contains("duplicate"), "{e}");
    let e = err(parse_ioc(
        "[fabric]\nlisten = \"10.0.0.1:7400\"\nmax_hosts = 0\n[lan]\ninterface = \"lan0\"",
        Path::new(P),
    ));
    assert!(e.contains("fabric.max_hosts"), "{e}");
    let e = err(parse_ioc(
        "[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\ninterface = \"lan0\"\nmtu = 20",
        Path::new(P),
    ));
    assert!(e.contains("lan.mtu"), "{e}");
    let e = err(parse_ioc(
        "[fabric]\nlisten = \"10.0.0.1:7400\"\n[lan]\ninterface = \"lan0\"\npromiscuous = \"maybe\"",
        Path::new(P),
    ));
    assert!(e.contains("promiscuous") || e.contains("maybe"), "{e}");
}

#[test]
fn unknown_and_missing_keys_are_refused() {
    let e = err(host("[interface]\nnmae = \"sd0\""));
    assert!(e.contains("nmae"), "{e}");
    let e = err(parse_host("[interface]\nname = \"sd0\"", Path::new(P)));
    assert!(e.contains("fabric"), "{e}");
    let e = err(parse_ioc(
        "[fabric]\nlisten = \"10.0.0.1:7400\"",
        Path::new(P),
    ));
    assert!(e.contains("lan"), "{e}");
}

#[test]
fn missing_file_is_a_clear_error() {
    let e = load_host(Path::new("/nonexistent/host.toml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/host.toml"));
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,300}") {
        let _ = parse_host(&s, Path::new(P));
        let _ = parse_ioc(&s, Path::new(P));
    }
}
