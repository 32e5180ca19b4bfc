//! The kernel's interface reports (rtnetlink datagrams) as the daemons read them: any bytes
//! give interface states or an error, never a panic, and no more states than messages could
//! fit in them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use splitnet_netif::link_watch::parse;

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    let _ = parse(data, &mut out);
    // A message is at least a netlink header and an interface header (16 + 16 bytes).
    assert!(out.len() <= data.len() / 32);
});
