//! The express lane at the IOC (docs/protocol.md 6.6): offered in GetFeatures unless
//! `fabric.express = false`, taken from a host only where offered, and used towards a host
//! that agreed to it for a sparse flow's small frames.

use super::*;
use wire::features;

/// Sends `frame` from `peer` in the express lane (SendData on its control channel) and
/// lets both sides run.
fn send_express(ioc: &mut WorkerState, peer: &mut Peer, s: u64, frame: &[u8]) {
    let mut cache = SendBufCache::new(wire::MAX_SEND_DATA, 4);
    let mut b = cache.get().unwrap();
    assert!(b.fill_from(frame));
    peer.link.post_express(b);
    pump(ioc, peer, s, true);
}

/// Asks for `bits` with SetFeatures; the IOC's answer.
fn set_features(ioc: &mut WorkerState, peer: &mut Peer, s: u64, bits: u64) -> ErrorCode {
    cfg_replies(peer);
    let req = bits.to_be_bytes();
    peer.link
        .session_mut()
        .cfg_request(CfgCode::SetFeatures, &req);
    pump(ioc, peer, s, true);
    let replies = cfg_replies(peer);
    assert_eq!(replies.len(), 1, "{replies:?}");
    replies[0].1
}

/// The features the IOC offers (GetFeatures).
fn offered(ioc: &mut WorkerState, peer: &mut Peer, s: u64) -> u64 {
    peer.events.clear();
    peer.link
        .session_mut()
        .cfg_request(CfgCode::GetFeatures, &[]);
    pump(ioc, peer, s, true);
    peer.events
        .iter()
        .find_map(|e| match e {
            LinkEvent::CfgReply {
                code: CfgCode::GetFeatures,
                data,
                ..
            } => wire::parse_u64(data).ok(),
            _ => None,
        })
        .expect("a GetFeatures reply")
}

/// After frames of 84, 84, 1,400 and 84 bytes from the LAN to a host that agreed to the
/// lane (and one before it agreed): the first two took the lane, the large one turned
/// their flow bulk and the last followed it on the data channel.
fn assert_lane_until_bulk(ioc: &WorkerState, peer: &Peer, s: u64) {
    assert_eq!(
        peer.link.stats().rx_express,
        2,
        "the two frames before the large one"
    );
    assert_eq!(
        peer.frames, 3,
        "on the data channel: the first frame, the large one and the one after it"
    );
    assert_eq!(host(ioc, s).link.as_ref().unwrap().stats().tx_express, 2);
}

#[test]
fn a_host_frame_on_the_control_channel_passes_only_where_the_lane_is_offered() {
    for on in [true, false] {
        let (mut ioc, nic) = ioc_with(if on { "" } else { "express = false" });
        let (s, mut peer) = connect(&mut ioc, 3, false, 128);
        let own = mac(&ioc, s);
        let ping = frame(LAN_PEER, own, 84);
        send_express(&mut ioc, &mut peer, s, &ping);
        let sent: Vec<Vec<u8>> = nic.tx.borrow().clone();
        let d = host(&ioc, s).drops.not_negotiated;
        if on {
            assert_eq!(sent, vec![ping], "offered: forwarded to the LAN");
            assert_eq!((d, host(&ioc, s).stats.tx_frames), (0, 1));
        } else {
            assert!(sent.is_empty(), "not offered: not forwarded");
            assert_eq!(d, 1, "counted as not negotiated");
        }
        assert_eq!(host(&ioc, s).link.as_ref().unwrap().stats().rx_express, 1);
    }
}

#[test]
fn an_ioc_with_the_lane_off_neither_offers_nor_agrees_to_it() {
    let (mut ioc, _nic) = ioc_with("express = false");
    let (s, mut peer) = connect(&mut ioc, 3, false, 128);
    assert_eq!(offered(&mut ioc, &mut peer, s) & features::EXPRESS, 0);
    let bits = features::VNET_HDR | features::EXPRESS;
    assert_eq!(
        set_features(&mut ioc, &mut peer, s, bits),
        ErrorCode::Unsupported
    );
}

#[test]
fn a_sparse_flows_small_lan_frames_reach_an_agreeing_host_on_the_control_channel() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect(&mut ioc, 3, false, 128);
    let own = mac(&ioc, s);
    // Not agreed: a small LAN frame goes on the data channel.
    nic.rx.borrow_mut().push_back(frame(own, LAN_PEER, 84));
    from_lan::drive_lan(&mut ioc, 0);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!((peer.frames, peer.link.stats().rx_express), (1, 0));
    let bits = features::VNET_HDR | features::EXPRESS;
    assert_eq!(set_features(&mut ioc, &mut peer, s, bits), ErrorCode::Ok);
    // Agreed: the next ones take the lane; a frame beyond 1,024 bytes turns its flow bulk,
    // and its later small frames follow it on the data channel.
    for len in [84, 84, 1400, 84] {
        nic.rx.borrow_mut().push_back(frame(own, LAN_PEER, len));
        from_lan::drive_lan(&mut ioc, 0);
    }
    pump(&mut ioc, &mut peer, s, true);
    assert_lane_until_bulk(&ioc, &peer, s);
}

/// Issue 43: over shared memory a host's unicast LAN frames come from its own queue, read
/// straight into its pools; a sparse flow's small frames take the lane from there too, by
/// the same rule as on the general path.
#[test]
fn frames_from_a_hosts_own_queue_take_the_lane_by_the_same_rule() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm_with(&mut ioc, 3, large_pools());
    let own = mac(&ioc, s);
    nic.host_queue(own).expect("the host's own queue");
    nic.arrive(frame(own, LAN_PEER, 84));
    from_lan::read_own_queue(&mut ioc, s);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(
        (peer.frames, peer.link.stats().rx_express),
        (1, 0),
        "not agreed"
    );
    let bits = features::VNET_HDR | features::EXPRESS;
    assert_eq!(set_features(&mut ioc, &mut peer, s, bits), ErrorCode::Ok);
    peer.kept = Some(Vec::new());
    let sent: Vec<Vec<u8>> = [84, 84, 1400, 84]
        .iter()
        .map(|&len| frame(own, LAN_PEER, len))
        .collect();
    for f in &sent {
        nic.arrive(f.clone());
        from_lan::read_own_queue(&mut ioc, s);
    }
    pump(&mut ioc, &mut peer, s, true);
    assert_lane_until_bulk(&ioc, &peer, s);
    let bulk: Vec<usize> = peer.kept.as_ref().unwrap().iter().map(Vec::len).collect();
    assert!(
        peer.kept.as_ref().unwrap()[..] == sent[2..],
        "the large frame and the one after it on the data channel, in order: {bulk:?}"
    );
    assert_eq!(host(&ioc, s).stats.rx_frames, 5);
    assert_eq!(ioc.reg.stats().protection_errors, 0);
}
