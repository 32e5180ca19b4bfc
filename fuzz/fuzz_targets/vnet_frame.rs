//! The virtio-net header and Ethernet checks, the flow hash, the VLAN tag's re-insertion,
//! reading and stripping, and the ECN mark, on arbitrary frames.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::ecn::{mark_ce, Mark};
use splitnet_messaging::vnet::{
    check_frame, flow_hash, gso_segment_l3_len, insert_vlan, insert_vlan_ahead, outer_tag,
    strip_vlan, vlan_of, VLAN_TAG_LEN, VNET_HDR_LEN,
};
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
            // A segment's length is at least its payload and never overflows.
            assert!(gso_segment_l3_len(data, &h) >= usize::from(h.gso_size));
        }
    }
    // Re-inserting a VLAN tag (TPID and TCI from the frame's last bytes) keeps a valid frame
    // valid, and leaves the buffer alone when it refuses.
    let tag: [u8; 4] = data
        .get(data.len().saturating_sub(4)..)
        .and_then(|t| t.try_into().ok())
        .unwrap_or([0x81, 0, 0, 1]);
    let mut buf = data.to_vec();
    buf.resize(data.len() + VLAN_TAG_LEN, 0);
    let tpid = u16::from_be_bytes([tag[0], tag[1]]);
    let tci = u16::from_be_bytes([tag[2], tag[3]]);
    match insert_vlan(&mut buf, data.len(), tpid, tci) {
        Some(n) => {
            assert_eq!(n, data.len() + VLAN_TAG_LEN);
            if check_frame(data).is_ok() {
                assert!(check_frame(&buf[..n]).is_ok());
            }
        }
        None => assert_eq!(&buf[..data.len()], data),
    }
    // Tagging a copy made 4 bytes in gives what tagging in place gives.
    let mut ahead = vec![0u8; VLAN_TAG_LEN];
    ahead.extend_from_slice(data);
    let mut in_place = data.to_vec();
    in_place.resize(data.len() + VLAN_TAG_LEN, 0);
    let a = insert_vlan(&mut in_place, data.len(), tpid, tci);
    assert_eq!(insert_vlan_ahead(&mut ahead, data.len(), tpid, tci), a);
    if let Some(n) = a {
        assert_eq!(&ahead[..n], &in_place[..n]);
    }
    // Reading the outer tag and stripping it never panics; a stripped valid frame stays
    // valid, and a refused strip changes nothing.
    let vid = vlan_of(data);
    assert!(vid.is_none() || outer_tag(data).is_some());
    let mut stripped = data.to_vec();
    match strip_vlan(&mut stripped, data.len()) {
        Some(n) => {
            assert_eq!(n + VLAN_TAG_LEN, data.len());
            if check_frame(data).is_ok() {
                assert!(check_frame(&stripped[..n]).is_ok());
            }
        }
        None => assert_eq!(stripped, data),
    }
    // An ECN mark changes only the ECN field and the IPv4 checksum (three bytes at most),
    // never the length, and a second one finds the mark.
    let mut marked = data.to_vec();
    match mark_ce(&mut marked) {
        Mark::Marked => {
            let changed = marked.iter().zip(data).filter(|(a, b)| a != b).count();
            assert!((1..=3).contains(&changed));
            assert_eq!(mark_ce(&mut marked.clone()), Mark::AlreadyMarked);
        }
        _ => assert_eq!(marked, data),
    }
});
