//! The multicast groups the kernel has joined on an interface, as it lists them in
//! `/proc/self/net/igmp` and `/proc/self/net/igmp6` (the files of the caller's network
//! namespace, readable under `ProcSubset=pid`), so that a host that moved to another IOC can
//! report them again (as bonding's `resend_igmp` makes the kernel do). rtnetlink has no dump
//! of IPv4 memberships, hence the files. The parsers are pure and never panic on any text.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The IGMP version the kernel speaks on an interface: that of the querier it last heard
/// (`V1`, `V2`, `V3` in the file's Querier column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgmpVersion {
    /// IGMPv1 (RFC 1112).
    V1,
    /// IGMPv2 (RFC 2236).
    V2,
    /// IGMPv3 (RFC 3376), Linux's default.
    V3,
}

/// The IPv4 groups device `dev` has joined and the IGMP version it speaks; none (and V3)
/// when it has joined none or has no IPv4 configuration.
pub fn ipv4(dev: &str) -> io::Result<(IgmpVersion, Vec<Ipv4Addr>)> {
    Ok(parse_igmp(
        &std::fs::read_to_string("/proc/self/net/igmp")?,
        dev,
    ))
}

/// The IPv6 groups device `dev` has joined.
pub fn ipv6(dev: &str) -> io::Result<Vec<Ipv6Addr>> {
    match std::fs::read_to_string("/proc/self/net/igmp6") {
        Ok(text) => Ok(parse_igmp6(&text, dev)),
        // A kernel without IPv6 has no such file.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Device `dev`'s groups in the text of `/proc/net/igmp`: a line `idx<TAB>name : count
/// querier` per device, then a line per group beginning with a tab, the group in hex as
/// the kernel holds it in memory (network order read as a native word). Lines that do not
/// parse are skipped.
pub fn parse_igmp(text: &str, dev: &str) -> (IgmpVersion, Vec<Ipv4Addr>) {
    let (mut version, mut groups, mut ours) = (IgmpVersion::V3, Vec::new(), false);
    for line in text.lines().skip(1) {
        if !line.starts_with('\t') {
            let mut head = line.split(':');
            let name = head.next().and_then(|h| h.split_whitespace().nth(1));
            ours = name == Some(dev);
            if ours {
                version = match head.next().and_then(|t| t.split_whitespace().nth(1)) {
                    Some("V1") => IgmpVersion::V1,
                    Some("V2") => IgmpVersion::V2,
                    _ => IgmpVersion::V3,
                };
            }
            continue;
        }
        let word = line.split_whitespace().next();
        if let Some(w) = word
            .filter(|_| ours)
            .and_then(|w| u32::from_str_radix(w, 16).ok())
        {
            groups.push(Ipv4Addr::from(w.to_ne_bytes()));
        }
    }
    (version, groups)
}

/// Device `dev`'s groups in the text of `/proc/net/igmp6`: a line per group, `idx name
/// group users flags timer`, the group as 32 hex digits. Lines that do not parse are
/// skipped.
pub fn parse_igmp6(text: &str, dev: &str) -> Vec<Ipv6Addr> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace().skip(1);
            let (name, hex) = (f.next()?, f.next()?);
            (name == dev && hex.len() == 32)
                .then(|| u128::from_str_radix(hex, 16).ok())
                .flatten()
                .map(Ipv6Addr::from)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// As a little-endian kernel writes it: sd0 in IGMPv2 with 224.0.0.1 and 239.1.2.3.
    const IGMP: &str = "Idx\tDevice    : Count Querier\tGroup    Users Timer\tReporter\n\
        1\tlo        :     1      V3\n\
        \t\t\t\t010000E0     1 0:00000000\t\t0\n\
        7\tsd0       :     2      V2\n\
        \t\t\t\t030201EF     1 0:00000000\t\t0\n\
        \t\t\t\t010000E0     1 0:00000000\t\t0\n\
        8\tsd01      :     1      V3\n\
        \t\t\t\t040201EF     1 0:00000000\t\t0\n";

    const IGMP6: &str = "\
        1    lo              ff020000000000000000000000000001     1 0000000C 0\n\
        7    sd0             ff0200000000000000000001ff000001     1 00000004 0\n\
        7    sd0             ff0e0000000000000000000000000123     1 00000004 0\n\
        8    sd01            ff020000000000000000000000000002     1 0000000C 0\n";

    #[test]
    #[cfg(target_endian = "little")]
    fn igmp_lists_a_devices_groups_and_querier_version() {
        let (v, g) = parse_igmp(IGMP, "sd0");
        assert_eq!(v, IgmpVersion::V2);
        assert_eq!(
            g,
            [Ipv4Addr::new(239, 1, 2, 3), Ipv4Addr::new(224, 0, 0, 1)]
        );
        let (v, g) = parse_igmp(IGMP, "sd01");
        assert_eq!((v, g), (IgmpVersion::V3, vec![Ipv4Addr::new(239, 1, 2, 4)]));
        assert!(parse_igmp(IGMP, "sd").1.is_empty());
    }

    #[test]
    fn igmp6_lists_a_devices_groups() {
        let g = parse_igmp6(IGMP6, "sd0");
        assert_eq!(
            g,
            [
                "ff02::1:ff00:1".parse::<Ipv6Addr>().unwrap(),
                "ff0e::123".parse().unwrap()
            ]
        );
        assert!(parse_igmp6(IGMP6, "eth9").is_empty());
    }

    /// The files of this process's namespace parse: loopback has joined all-hosts
    /// (224.0.0.1) whenever IPv4 is configured on it, as Linux does for every device.
    #[test]
    fn this_namespaces_files_parse() {
        let (_, g) = ipv4("lo").unwrap();
        if !g.is_empty() {
            assert!(g.contains(&Ipv4Addr::new(224, 0, 0, 1)), "{g:?}");
        }
        assert!(ipv6("lo").unwrap().iter().all(|a| a.is_multicast()));
    }

    proptest! {
        #[test]
        fn any_text_parses_without_panicking(text in "[ \t\n0-9A-Fa-fVsdlo:x]{0,400}") {
            let _ = parse_igmp(&text, "sd0");
            let _ = parse_igmp6(&text, "sd0");
        }

        #[test]
        fn every_group_written_is_read_back(groups in prop::collection::vec(any::<u32>(), 0..20)) {
            let mut text = String::from("Idx\tDevice : Count Querier\n3\tsd0 :  1  V3\n");
            for g in &groups {
                let word = u32::from_ne_bytes(g.to_be_bytes());
                text.push_str(&format!("\t\t\t\t{word:08X}     1 0:00000000\t\t0\n"));
            }
            let want: Vec<Ipv4Addr> = groups.iter().map(|g| Ipv4Addr::from(*g)).collect();
            prop_assert_eq!(parse_igmp(&text, "sd0").1, want);
        }
    }
}
