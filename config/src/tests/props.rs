//! Properties: arbitrary input never panics, accepted values obey the rules, MACs round-trip.

use super::{host_text, ioc_text};
use crate::{ConfigError, MacAddr};
use proptest::prelude::*;

/// A value that is sometimes valid, sometimes of the wrong type or out of range.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|v| v.to_string()),
        (0u64..70_000).prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        "\\PC{0,20}".prop_map(|s| format!("{s:?}")),
        Just("true".to_string()),
        Just("\"10.0.0.1:7400\"".to_string()),
        Just("\"02:00:00:00:00:01\"".to_string()),
        Just("[{ element_size = 2048, element_count = 16 }]".to_string()),
    ]
}

/// Key lines for a table, drawn from the real keys and a stray one.
fn lines(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(keys), value()), 0..6).prop_map(|kv| {
        let mut seen = std::collections::HashSet::new();
        kv.into_iter()
            .filter(|(k, _)| seen.insert(*k))
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect()
    })
}

const HOST_FABRIC: &[&str] = &[
    "ioc",
    "keepalive_interval_ms",
    "keepalive_timeout_ms",
    "reconnect_min_ms",
    "reconnect_max_ms",
    "node_id",
    "stray",
];
const INTERFACE: &[&str] = &["name", "mac", "offload", "queues", "stray"];
const POOLS: &[&str] = &[
    "advertise",
    "send_data_max",
    "credit_batch",
    "max_granted_bytes",
    "stray",
];
const IOC_FABRIC: &[&str] = &[
    "listen",
    "max_hosts",
    "keepalive_interval_ms",
    "keepalive_timeout_ms",
    "handshake_timeout_ms",
];
const LAN: &[&str] = &["interface", "promiscuous", "mac_base", "mtu", "offload"];

fn is_config_error(e: &ConfigError) -> bool {
    !e.to_string().is_empty()
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,300}") {
        if let Err(e) = host_text(&s) {
            prop_assert!(is_config_error(&e));
        }
        if let Err(e) = ioc_text(&s) {
            prop_assert!(is_config_error(&e));
        }
    }

    #[test]
    fn host_like_text_is_valid_when_accepted(
        f in lines(HOST_FABRIC), i in lines(INTERFACE), p in lines(POOLS)
    ) {
        let text = format!("[fabric]\nioc = \"10.0.0.1:7400\"\n{f}[interface]\n{i}[pools]\n{p}");
        if let Ok(h) = host_text(&text) {
            let fb = &h.fabric;
            prop_assert!((10..=60_000).contains(&fb.keepalive_interval_ms));
            prop_assert!(fb.keepalive_timeout_ms > 2 * fb.keepalive_interval_ms);
            prop_assert!(fb.keepalive_timeout_ms <= 600_000);
            prop_assert!(fb.reconnect_min_ms <= fb.reconnect_max_ms);
            prop_assert!(fb.node_id != Some(0));
            prop_assert!((1..=16).contains(&h.interface.queues));
            prop_assert!(h.interface.mac.iter().all(|m| m.is_unicast() && !m.is_zero()));
            prop_assert!(h.pools.send_data_max <= 1024);
            prop_assert!((1..=256).contains(&h.pools.credit_batch));
        }
    }

    #[test]
    fn ioc_like_text_is_valid_when_accepted(f in lines(IOC_FABRIC), l in lines(LAN)) {
        let text = format!("[fabric]\n{f}[lan]\n{l}");
        if let Ok(c) = ioc_text(&text) {
            prop_assert!((1..=64).contains(&c.fabric.max_hosts));
            prop_assert!((100..=60_000).contains(&c.fabric.handshake_timeout_ms));
            prop_assert!(c.fabric.keepalive_timeout_ms > 2 * c.fabric.keepalive_interval_ms);
            prop_assert!(c.lan.mac_base.is_unicast());
            prop_assert!(c.lan.mtu.iter().all(|m| (68..=65_535).contains(m)));
        }
    }

    #[test]
    fn mac_round_trips(b in any::<[u8; 6]>()) {
        let m = MacAddr(b);
        prop_assert_eq!(m.to_string().parse::<MacAddr>(), Ok(m));
        prop_assert_eq!(m.to_string().to_uppercase().parse::<MacAddr>(), Ok(m));
    }
}
