//! Every CfgUtil payload decoder on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = wire::Mtu::parse(data) {
        assert_eq!(&m.emit()[..], data);
    }
    if let Ok(s) = wire::Stats::parse(data) {
        assert_eq!(&s.emit()[..], data);
    }
    if let Ok(l) = wire::LinkChange::parse(data) {
        assert_eq!(&l.emit()[..], data);
    }
    let _ = wire::parse_mac(data);
    let _ = wire::parse_u8(data);
    let _ = wire::parse_u32(data);
    let _ = wire::parse_u64(data);
    if let Ok(list) = wire::parse_multicast(data) {
        assert!(list.len() <= wire::MAX_MULTICAST);
    }
});
