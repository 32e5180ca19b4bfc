//! The shipped example configurations (systemd/host.toml, systemd/ioc.toml) parse, describe
//! the reference topology, and, as their comments claim, hold the defaults.

use crate::{load_host, load_ioc, parse_host, parse_ioc, Promiscuous};
use std::path::{Path, PathBuf};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../systemd")
        .join(name)
}

#[test]
fn host_example() {
    let path = example("host.toml");
    if !path.exists() {
        return;
    }
    let h = load_host(&path).unwrap();
    assert_eq!(h.fabric.ioc.to_string(), "10.200.0.2:7400");
    assert_eq!(h.interface.name, "sd0");
    let minimal = parse_host("[fabric]\nioc = \"10.200.0.2:7400\"", &path).unwrap();
    assert_eq!(h, minimal, "the example's values are the defaults");
}

#[test]
fn ioc_example() {
    let path = example("ioc.toml");
    if !path.exists() {
        return;
    }
    let i = load_ioc(&path).unwrap();
    assert_eq!(i.fabric.listen.to_string(), "10.200.0.2:7400");
    assert_eq!(i.lan.interface, "lan0");
    assert_eq!(i.lan.promiscuous, Promiscuous::Auto);
    let minimal = parse_ioc(
        "[fabric]\nlisten = \"10.200.0.2:7400\"\n[lan]\ninterface = \"lan0\"",
        &path,
    )
    .unwrap();
    assert_eq!(i, minimal, "the example's values are the defaults");
}
