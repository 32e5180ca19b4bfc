//! The adapter's operation header decoder on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::{OpHeader, OP_HEADER_LEN};

fuzz_target!(|data: [u8; OP_HEADER_LEN]| {
    if let Ok(h) = OpHeader::parse(&data) {
        assert_eq!(h.emit(), data);
    }
});
