//! What a peer sends of a data channel over RDMA verbs besides protocol messages: the set-up
//! endpoint, the private data of a connection request and its key notices (one, or a list). Any bytes give an error or a value within the
//! limits that round-trips; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use splitnet_fabric::verbs::{
    Endpoint, KeyNotice, Request, ENDPOINT_LEN, KEY_NOTICE_LEN, REQUEST_LEN,
};

fuzz_target!(|data: &[u8]| {
    let max = 1 << 24;
    if let Ok(e) = Endpoint::parse(data, max) {
        assert_eq!(data.len(), ENDPOINT_LEN);
        assert!(e.arena_len <= max && (e.arena_len > 0 || e.arena_addr == 0));
        assert_eq!(&e.emit()[..], data);
    }
    if let Some(r) = Request::parse(data) {
        assert_eq!(&r.emit()[..], &data[..REQUEST_LEN]);
    }
    if let Some(n) = KeyNotice::parse(data, max) {
        assert!(n.len > 0 && n.off + n.len <= max);
        assert_eq!(&n.emit()[..], data);
    }
    if let Some(list) = KeyNotice::parse_list(data, max) {
        assert_eq!(list.len() * KEY_NOTICE_LEN, data.len());
        let again: Vec<u8> = list.iter().flat_map(|n| n.emit()).collect();
        assert_eq!(&again[..], data);
    }
});
