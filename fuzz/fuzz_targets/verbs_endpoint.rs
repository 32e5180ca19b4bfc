//! The set-up message each side of a data channel over RDMA verbs sends the other: any bytes
//! give an error or an endpoint within the limits that round-trips; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use splitnet_fabric::verbs::{Endpoint, ENDPOINT_LEN};

fuzz_target!(|data: &[u8]| {
    let max = 1 << 24;
    if let Ok(e) = Endpoint::parse(data, max) {
        assert_eq!(data.len(), ENDPOINT_LEN);
        assert!(e.arena_len <= max && e.arena_len > 0);
        assert_eq!(&e.emit()[..], data);
    }
});
