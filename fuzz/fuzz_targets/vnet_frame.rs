//! The virtio-net header and Ethernet checks on arbitrary frames.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::vnet::{check_frame, VNET_HDR_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = check_frame(data) {
        let len = data.len() - VNET_HDR_LEN;
        if h.flags & 1 != 0 {
            assert!(usize::from(h.csum_start) + usize::from(h.csum_offset) + 2 <= len);
        }
        if h.is_gso() {
            assert!(h.gso_size > 0 && usize::from(h.hdr_len) <= len);
        }
    }
});
