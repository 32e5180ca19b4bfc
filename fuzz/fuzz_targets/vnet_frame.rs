//! The virtio-net header and Ethernet checks, and the flow hash, on arbitrary frames.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::vnet::{check_frame, flow_hash, VNET_HDR_LEN};
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;

fuzz_target!(|data: &[u8]| {
    // The flow hash reads any bytes (a frame from the LAN or a host) without panicking.
    let _ = flow_hash(data, &BuildHasherDefault::<DefaultHasher>::default());
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
