//! `[pools]`, `[log]`, MAC addresses and file errors, shared by both files.

use super::{err, host, invalid, parse_error};
use crate::{load_host, load_ioc, ConfigError, MacAddr, PoolConfig, Pools};
use std::path::Path;

fn pools(lines: &str) -> Result<crate::HostConfig, ConfigError> {
    host(&format!("[pools]\n{lines}"))
}

fn one_pool(size: u32, count: u32) -> String {
    format!("advertise = [{{ element_size = {size}, element_count = {count} }}]")
}

#[test]
fn pool_defaults() {
    let p = Pools::default();
    assert_eq!(
        p.advertise,
        vec![
            PoolConfig {
                element_size: 2048,
                element_count: 256
            },
            PoolConfig {
                element_size: 65600,
                element_count: 64
            },
        ]
    );
    assert_eq!(p.send_data_max, 128);
    assert_eq!(p.credit_batch, 16);
    assert_eq!(p.max_granted_bytes, 64 << 20);
}

#[test]
fn advertise_count() {
    invalid(pools("advertise = []"), "pools.advertise");
    let seventeen = vec!["{ element_size = 256, element_count = 1 }"; 17].join(", ");
    invalid(
        pools(&format!("advertise = [{seventeen}]")),
        "pools.advertise",
    );
    let sixteen = vec!["{ element_size = 256, element_count = 1 }"; 16].join(", ");
    let h = pools(&format!("advertise = [{sixteen}]")).unwrap();
    assert_eq!(h.pools.advertise.len(), 16);
}

#[test]
fn element_size_rules() {
    let key = "pools.advertise[0].element_size";
    invalid(pools(&one_pool(248, 1)), key);
    invalid(pools(&one_pool((1 << 20) + 8, 1)), key);
    let r = invalid(pools(&one_pool(2050, 1)), key);
    assert!(r.contains("multiple of 8"), "{r}");
    pools(&one_pool(256, 1)).unwrap();
    pools(&one_pool(1 << 20, 1)).unwrap();
}

#[test]
fn element_count_rules() {
    let key = "pools.advertise[0].element_count";
    invalid(pools(&one_pool(2048, 0)), key);
    invalid(pools(&one_pool(2048, 4097)), key);
    pools(&one_pool(2048, 4096)).unwrap();
}

#[test]
fn index_names_the_pool() {
    let text = "advertise = [{ element_size = 2048, element_count = 1 }, \
                { element_size = 2048, element_count = 5000 }]";
    invalid(pools(text), "pools.advertise[1].element_count");
}

#[test]
fn pool_size_ceiling() {
    let text = format!("{}\nmax_granted_bytes = 4294967296", one_pool(1 << 20, 257));
    let r = invalid(pools(&text), "pools.advertise[0]");
    assert!(r.contains("256 MiB"), "{r}");
    let text = format!("{}\nmax_granted_bytes = 4294967296", one_pool(1 << 20, 256));
    pools(&text).unwrap();
}

#[test]
fn advertise_fits_the_grant() {
    let r = invalid(pools("max_granted_bytes = 1048576"), "pools.advertise");
    assert!(r.contains("max_granted_bytes"), "{r}");
    pools(&format!(
        "{}\nmax_granted_bytes = 1048576",
        one_pool(4096, 256)
    ))
    .unwrap();
}

#[test]
fn scalar_ranges() {
    invalid(pools("send_data_max = 1025"), "pools.send_data_max");
    assert_eq!(pools("send_data_max = 0").unwrap().pools.send_data_max, 0);
    invalid(pools("credit_batch = 0"), "pools.credit_batch");
    invalid(pools("credit_batch = 257"), "pools.credit_batch");
    invalid(
        pools("max_granted_bytes = 1048575"),
        "pools.max_granted_bytes",
    );
    invalid(
        pools("max_granted_bytes = 4294967297"),
        "pools.max_granted_bytes",
    );
}

#[test]
fn pool_entries_are_strict() {
    parse_error(
        pools("advertise = [{ element_size = 2048, element_count = 1, align = 8 }]"),
        &["align"],
    );
    parse_error(
        pools("advertise = [{ element_size = 2048 }]"),
        &["element_count"],
    );
}

#[test]
fn log_levels() {
    for l in ["error", "warn", "info", "debug", "trace"] {
        assert_eq!(host(&format!("[log]\nlevel = {l:?}")).unwrap().log.level, l);
    }
    for l in ["loud", "INFO", ""] {
        invalid(host(&format!("[log]\nlevel = {l:?}")), "log.level");
    }
}

#[test]
fn mac_text_form() {
    let m: MacAddr = "02:00:00:00:00:01".parse().unwrap();
    assert_eq!(m, MacAddr([2, 0, 0, 0, 0, 1]));
    assert_eq!(m.to_string(), "02:00:00:00:00:01");
    assert_eq!(
        "0A:BC:DE:F0:12:34".parse::<MacAddr>().unwrap().to_string(),
        "0a:bc:de:f0:12:34"
    );
    assert!(m.is_unicast() && !m.is_zero());
    assert!(!MacAddr([1, 0, 0, 0, 0, 0]).is_unicast());
    assert!(MacAddr([0; 6]).is_zero());
    for bad in [
        "",
        "02:00:00:00:00",
        "02:00:00:00:00:01:02",
        "2:00:00:00:00:01",
        "+2:00:00:00:00:01",
        "02-00-00-00-00-01",
        "02:00:00:00:00:0g",
        "020:0:00:00:00:01",
        "02:00:00:00:00:01:",
    ] {
        assert!(bad.parse::<MacAddr>().is_err(), "{bad:?} accepted");
    }
}

#[test]
fn unreadable_file_names_it() {
    let e = load_host(Path::new("/nonexistent/host.toml")).unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/host.toml: cannot read"),
        "{e}"
    );
    let e = err(load_ioc(Path::new("/nonexistent/ioc.toml")));
    assert!(e.starts_with("/nonexistent/ioc.toml"), "{e}");
}

#[test]
fn syntax_errors_name_the_line() {
    let m = parse_error(host("[interface\nname = \"sd0\""), &["line 3"]);
    assert!(!m.contains('\n'), "{m}");
}

#[test]
fn parse_errors_are_one_line_with_position() {
    let e = err(host("[interface]\nnmae = \"sd0\""));
    assert_eq!(
        e,
        "/etc/splitnet/test.toml: line 4, column 1 (`nmae = \"sd0\"`): unknown field `nmae`, \
         expected one of `name`, `mac`, `offload`, `queues`, `persist`"
    );
}

#[test]
fn parse_errors_quote_the_line_shortened() {
    let long = format!("[log]\nlevel = {:?}", "x".repeat(100));
    let m = parse_error(host(&format!("{long}\nbogus = 1")), &["line 5", "bogus"]);
    assert!(m.contains("(`bogus = 1`)"), "{m}");
    let m = parse_error(
        host(&format!("[interface]\nname = {}", "[".repeat(80))),
        &["line 4"],
    );
    assert!(m.contains("`..."), "{m}");
}

#[test]
fn scheduling_is_normal_by_default_and_checked_in_both_files() {
    use crate::{SchedClass, Scheduling};
    let h = host("").unwrap();
    assert_eq!(h.scheduling, Scheduling::default());
    assert_eq!(h.scheduling.class, SchedClass::Normal);
    let i = super::ioc("", "", "[scheduling]\nclass = \"fifo\"\npriority = 20").unwrap();
    assert_eq!(
        (i.scheduling.class, i.scheduling.priority),
        (SchedClass::Fifo, 20)
    );
    let n = host("[scheduling]\nclass = \"nice\"\nnice = -5").unwrap();
    assert_eq!(
        (n.scheduling.class, n.scheduling.nice),
        (SchedClass::Nice, -5)
    );
    invalid(host("[scheduling]\nnice = -21"), "scheduling.nice");
    invalid(host("[scheduling]\nnice = 20"), "scheduling.nice");
    invalid(
        super::ioc("", "", "[scheduling]\npriority = 0"),
        "scheduling.priority",
    );
    invalid(
        super::ioc("", "", "[scheduling]\npriority = 100"),
        "scheduling.priority",
    );
    parse_error(host("[scheduling]\nclass = \"idle\""), &["class"]);
    // A real-time thread must not poll: it would take its core from the applications.
    let why = invalid(
        host("spin_max_us = 50\n[scheduling]\nclass = \"fifo\""),
        "fabric.spin_max_us",
    );
    assert!(why.contains("fifo"), "{why}");
    assert!(host("spin_max_us = 50\n[scheduling]\nclass = \"nice\"").is_ok());
    // The same holds for the IOC's workers.
    let why = invalid(
        super::ioc("spin_max_us = 50", "", "[scheduling]\nclass = \"fifo\""),
        "fabric.spin_max_us",
    );
    assert!(why.contains("fifo"), "{why}");
    assert!(super::ioc("spin_max_us = 50", "", "[scheduling]\nclass = \"nice\"").is_ok());
}

#[test]
fn the_iocs_poll_before_sleep_is_off_by_default_and_bounded() {
    use std::time::Duration;
    let i = super::ioc("", "", "").unwrap();
    assert_eq!(
        i.fabric.spin_max(),
        Duration::ZERO,
        "polling off by default"
    );
    let i = super::ioc("spin_max_us = 200", "", "").unwrap();
    assert_eq!(i.fabric.spin_max(), Duration::from_micros(200));
    invalid(
        super::ioc("spin_max_us = 1001", "", ""),
        "fabric.spin_max_us",
    );
}

#[test]
fn busy_polling_is_off_by_default_and_excludes_polls_before_sleep_and_real_time() {
    assert!(!host("").unwrap().fabric.busy_poll);
    assert!(!super::ioc("", "", "").unwrap().fabric.busy_poll);
    assert!(host("busy_poll = true").unwrap().fabric.busy_poll);
    assert!(
        super::ioc("busy_poll = true\nworkers = 1", "", "")
            .unwrap()
            .fabric
            .busy_poll
    );
    // Each busy worker takes a core: one per core (workers = 0) would take them all.
    let why = invalid(super::ioc("busy_poll = true", "", ""), "fabric.busy_poll");
    assert!(why.contains("workers"), "{why}");
    // With a poll before sleep, or with real time: refused in both daemons, saying why.
    for (fabric, rest, word) in [
        ("busy_poll = true\nspin_max_us = 50", "", "spin_max_us"),
        ("busy_poll = true", "[scheduling]\nclass = \"fifo\"", "fifo"),
    ] {
        for why in [
            invalid(host(&format!("{fabric}\n{rest}")), "fabric.busy_poll"),
            invalid(
                super::ioc(&format!("{fabric}\nworkers = 1"), "", rest),
                "fabric.busy_poll",
            ),
        ] {
            assert!(why.contains(word), "{why}");
        }
    }
    assert!(host("busy_poll = true\n[scheduling]\nclass = \"nice\"").is_ok());
}
