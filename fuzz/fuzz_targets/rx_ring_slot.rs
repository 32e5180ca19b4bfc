//! A mapped receive ring's slot header (TPACKET_V2) over arbitrary bytes: a header that
//! parses describes a frame inside its slot, after the slot's own header.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::vnet::VNET_HDR_LEN;
use splitnet_netif::rx_ring::parse_slot;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = parse_slot(data) {
        assert!(s.data.start >= 32 && s.data.start <= s.data.end && s.data.end <= data.len());
        assert!(s.whole >= VNET_HDR_LEN);
        assert!(s.tag.is_some() || s.status & (1 << 4) == 0);
    }
});
