//! vHubs: each host's VLANs (`[[auth.hosts]]` `vlan`, `vlans`) on the LAN, between hosts,
//! for floods and promiscuous hosts, on one worker and across two, and on a host's own LAN
//! queue.

use super::*;
use crate::nic::HostFrames;
use crate::vlan::VlanMode;
use splitnet_messaging::vnet::{self, insert_vlan};
use splitnet_netif::filter::Tagged;

/// A host of identity `node` with the VLAN mode `vlan`.
fn who(node: u64, vlan: VlanMode) -> Who {
    let mut w = Who::node(node);
    w.policy.vlan = vlan;
    w
}

fn join(ioc: &mut WorkerState, node: u64, vlan: VlanMode) -> (u64, Peer) {
    let (s, mut p) = connect_with(ioc, who(node, vlan), false, host_config(128));
    p.kept = Some(Vec::new());
    (s, p)
}

fn access(n: u16) -> VlanMode {
    VlanMode::of(Some(n), &[])
}

fn trunk(list: &[u16]) -> VlanMode {
    VlanMode::of(None, list)
}

/// `f` with an 802.1Q tag of VLAN `vid` (priority 5, to see it survive).
fn tagged(f: &[u8], vid: u16) -> Vec<u8> {
    let mut t = f.to_vec();
    let n = t.len();
    t.resize(n + 4, 0);
    let m = insert_vlan(&mut t, n, 0x8100, 0xa000 | vid).unwrap();
    t.truncate(m);
    t
}

/// What `p` received since the last call, taken.
fn got(ioc: &mut WorkerState, p: &mut Peer, s: u64) -> Vec<Vec<u8>> {
    pump(ioc, p, s, true);
    std::mem::take(p.kept.as_mut().unwrap())
}

/// Feeds `frames` from the LAN and lets every worker's hosts read.
fn lan(ioc: &mut WorkerState, nic: &FakeNic, frames: &[Vec<u8>]) {
    for f in frames {
        nic.arrive(f.clone());
    }
    while !nic.rx.borrow().is_empty() {
        from_lan::drive_lan(ioc, 0);
    }
}

#[test]
fn an_access_host_is_tagged_towards_the_lan_and_untagged_from_it() {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = join(&mut ioc, 1, access(10));
    let me = mac(&ioc, a);
    // To the LAN: its frames tagged with VLAN 10, a GSO frame's offsets past the tag.
    host_sends(
        &mut ioc,
        &mut pa,
        a,
        vec![frame(LAN_PEER, me, 100), tso_frame(LAN_PEER, me)],
    );
    let tx = nic.tx.borrow().clone();
    assert_eq!(tx.len(), 2);
    assert_eq!(vnet::outer_tag(&tx[0]), Some((0x8100, 10)));
    let mut back = tx[0].clone();
    let n = back.len();
    let n = vnet::strip_vlan(&mut back, n).unwrap();
    assert_eq!(
        &back[..n],
        &frame(LAN_PEER, me, 100)[..],
        "tag after the MACs, the rest as sent"
    );
    let gso = VnetHdr::parse(tx[1].first_chunk().unwrap());
    assert_eq!(
        (gso.csum_start, gso.hdr_len),
        (38, 58),
        "the GSO offsets count the tag"
    );
    assert!(vnet::check_frame(&tx[1]).is_ok());
    // A tagged frame from it, of its VLAN or another: dropped and counted.
    host_sends(
        &mut ioc,
        &mut pa,
        a,
        vec![
            tagged(&frame(LAN_PEER, me, 100), 10),
            tagged(&frame(LAN_PEER, me, 100), 20),
        ],
    );
    assert_eq!(nic.tx.borrow().len(), 2);
    assert_eq!(host(&ioc, a).drops.vlan, 2);
    assert!(ioc.metrics_text().contains("cause=\"tx_vlan\"} 2"));
    // From the LAN: VLAN 10's frames for it arrive untagged; VLAN 20's and untagged ones
    // never reach it.
    let untagged = frame(me, LAN_PEER, 300);
    lan(
        &mut ioc,
        &nic,
        &[
            tagged(&untagged, 10),
            tagged(&untagged, 20),
            untagged.clone(),
        ],
    );
    assert_eq!(got(&mut ioc, &mut pa, a), vec![untagged]);
    assert_eq!(
        ioc.stats.lan_filtered, 2,
        "the other two were for no host on their VLAN"
    );
}

#[test]
fn a_trunk_host_keeps_its_listed_tags_and_an_untagged_host_sends_no_tag() {
    let (mut ioc, nic) = ioc_with("");
    let (t, mut pt) = join(&mut ioc, 1, trunk(&[10, 30]));
    let (u, mut pu) = join(&mut ioc, 2, VlanMode::Untagged);
    let (mt, mu) = (mac(&ioc, t), mac(&ioc, u));
    let plain = frame(LAN_PEER, mt, 100);
    host_sends(
        &mut ioc,
        &mut pt,
        t,
        vec![
            tagged(&plain, 10),
            tagged(&plain, 30),
            tagged(&plain, 20),
            plain.clone(),
        ],
    );
    assert_eq!(
        *nic.tx.borrow(),
        vec![tagged(&plain, 10), tagged(&plain, 30)],
        "its listed VLANs, as sent"
    );
    assert_eq!(host(&ioc, t).drops.vlan, 2, "VLAN 20 and untagged refused");
    let plain_u = frame(LAN_PEER, mu, 100);
    host_sends(
        &mut ioc,
        &mut pu,
        u,
        vec![tagged(&plain_u, 10), plain_u.clone()],
    );
    assert_eq!(nic.tx.borrow().last(), Some(&plain_u));
    assert_eq!(nic.tx.borrow().len(), 3);
    assert_eq!(
        host(&ioc, u).drops.vlan,
        1,
        "the untagged host's tagged frame"
    );
    // From the LAN the trunk host gets its VLANs tagged, the untagged host untagged only.
    let to_t = frame(mt, LAN_PEER, 200);
    let to_u = frame(mu, LAN_PEER, 200);
    lan(
        &mut ioc,
        &nic,
        &[
            tagged(&to_t, 30),
            tagged(&to_t, 20),
            to_t.clone(),
            tagged(&to_u, 10),
            to_u.clone(),
        ],
    );
    assert_eq!(got(&mut ioc, &mut pt, t), vec![tagged(&to_t, 30)]);
    assert_eq!(got(&mut ioc, &mut pu, u), vec![to_u]);
}

#[test]
fn hosts_reach_each_other_by_vlan_each_seeing_the_tag_as_its_mode_says() {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = join(&mut ioc, 1, access(10));
    let (t, mut pt) = join(&mut ioc, 2, trunk(&[10]));
    let (b, mut pb) = join(&mut ioc, 3, access(20));
    let (u, mut pu) = join(&mut ioc, 4, VlanMode::Untagged);
    let (ma, mt, mb) = (mac(&ioc, a), mac(&ioc, t), mac(&ioc, b));
    // Access 10 to the trunk host: it arrives tagged 10.
    let f = frame(mt, ma, 100);
    host_sends(&mut ioc, &mut pa, a, vec![f.clone()]);
    let want = {
        let mut w = f.clone();
        let n = w.len();
        w.resize(n + 4, 0);
        insert_vlan(&mut w, n, 0x8100, 10).unwrap();
        w
    };
    assert_eq!(got(&mut ioc, &mut pt, t), vec![want]);
    // The trunk host's VLAN 10 to the access host: it arrives untagged.
    let g = frame(ma, mt, 100);
    host_sends(&mut ioc, &mut pt, t, vec![tagged(&g, 10)]);
    assert_eq!(got(&mut ioc, &mut pa, a), vec![g]);
    // Access 10 to access 20: not on its VLAN, so out to the LAN (tagged 10), never to B.
    host_sends(&mut ioc, &mut pa, a, vec![frame(mb, ma, 100)]);
    assert!(got(&mut ioc, &mut pb, b).is_empty());
    assert_eq!(
        vnet::outer_tag(nic.tx.borrow().last().unwrap()),
        Some((0x8100, 10))
    );
    // A broadcast from A reaches the trunk host (tagged) and the LAN, not B nor the
    // untagged host.
    let bcast = frame([0xff; 6], ma, 100);
    host_sends(&mut ioc, &mut pa, a, vec![bcast.clone()]);
    assert_eq!(got(&mut ioc, &mut pt, t), vec![tagged_plain(&bcast, 10)]);
    assert!(got(&mut ioc, &mut pb, b).is_empty());
    assert!(got(&mut ioc, &mut pu, u).is_empty());
    assert_eq!(nic.tx.borrow().last(), Some(&tagged_plain(&bcast, 10)));
    // Broadcasts from the LAN stay in their VLAN.
    let lb = frame([0xff; 6], LAN_PEER, 100);
    lan(
        &mut ioc,
        &nic,
        &[tagged(&lb, 20), lb.clone(), tagged(&lb, 10)],
    );
    assert_eq!(got(&mut ioc, &mut pb, b), vec![lb.clone()], "20 untagged");
    assert_eq!(
        got(&mut ioc, &mut pu, u),
        vec![lb.clone()],
        "untagged as it came"
    );
    assert_eq!(got(&mut ioc, &mut pa, a), vec![lb.clone()], "10 untagged");
    assert_eq!(
        got(&mut ioc, &mut pt, t),
        vec![tagged(&lb, 10)],
        "10 tagged"
    );
}

/// `f` tagged with VLAN `vid` and no priority, as the IOC tags an access host's frames.
fn tagged_plain(f: &[u8], vid: u16) -> Vec<u8> {
    let mut t = f.to_vec();
    let n = t.len();
    t.resize(n + 4, 0);
    insert_vlan(&mut t, n, 0x8100, vid).unwrap();
    t
}

#[test]
fn a_promiscuous_host_sees_only_its_vlans() {
    let (mut ioc, nic) = ioc_with("");
    let (p, mut pp) = join(&mut ioc, 1, access(10));
    pp.link.session_mut().cfg_request(CfgCode::SetPromisc, &[1]);
    pump(&mut ioc, &mut pp, p, true);
    assert!(host(&ioc, p).promisc);
    pp.kept = Some(Vec::new());
    let nobody = frame([0x02, 0x77, 0, 0, 0, 1], LAN_PEER, 100);
    lan(
        &mut ioc,
        &nic,
        &[tagged(&nobody, 20), nobody.clone(), tagged(&nobody, 10)],
    );
    assert_eq!(got(&mut ioc, &mut pp, p), vec![nobody]);
}

#[test]
fn across_workers_frames_keep_to_their_vlan() {
    let mut w = two_workers();
    let (a, mut pa) = join(&mut w[0].0, 1, access(10));
    let (b, mut pb) = join(&mut w[1].0, 2, access(10));
    let (c, mut pc) = join(&mut w[1].0, 3, access(20));
    let (ma, mb, mc) = (mac(&w[0].0, a), mac(&w[1].0, b), mac(&w[1].0, c));
    // A's broadcast and its unicast to B cross (tagged) and reach B untagged; C gets none,
    // nor A's unicast to C, which is not on VLAN 10.
    let bcast = frame([0xff; 6], ma, 100);
    let to_b = frame(mb, ma, 100);
    let to_c = frame(mc, ma, 100);
    host_sends(
        &mut w[0].0,
        &mut pa,
        a,
        vec![bcast.clone(), to_b.clone(), to_c],
    );
    let crossed = w[1].2.take();
    assert!(
        crossed.iter().all(|f| vnet::vlan_of(f) == Some(10)),
        "they cross tagged"
    );
    from_lan::deliver_crossed(&mut w[1].0, &crossed);
    assert_eq!(got(&mut w[1].0, &mut pb, b), vec![bcast, to_b]);
    assert!(got(&mut w[1].0, &mut pc, c).is_empty());
}

#[test]
fn an_access_hosts_own_queue_takes_its_vlans_frames_untagged() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm_as(&mut ioc, who(3, access(10)), large_pools());
    let own = mac(&ioc, s);
    let queue = nic.host_queue(own).expect("its own queue");
    assert_eq!(queue.takes.borrow().tagged, Tagged::vlan(10));
    assert_eq!(
        *nic.excluded_tags.lock().unwrap(),
        vec![(own, Tagged::vlan(10))]
    );
    peer.kept = Some(Vec::new());
    let plain = frame(own, LAN_PEER, 1400);
    // VLAN 10's frame goes to its own queue, the kernel having taken the tag out; an
    // untagged one and VLAN 20's stay on the general socket, which delivers neither.
    nic.arrive(tagged(&plain, 10));
    nic.arrive(plain.clone());
    nic.arrive(tagged(&plain, 20));
    assert_eq!(queue.frames.borrow().len(), 1);
    assert_eq!(nic.rx.borrow().len(), 2);
    from_lan::read_own_queue(&mut ioc, s);
    while !nic.rx.borrow().is_empty() {
        from_lan::drive_lan(&mut ioc, 0);
    }
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(peer.kept.as_ref().unwrap(), &vec![plain]);
    assert_eq!(host(&ioc, s).link.as_ref().unwrap().stats().tx_in_place, 1);
    assert_eq!(nic.violations.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn a_trunk_hosts_own_queue_takes_its_vlans_frames_tagged_and_its_untagged_ones() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm_as(&mut ioc, who(3, trunk(&[0, 10, 11, 30])), large_pools());
    let own = mac(&ioc, s);
    let queue = nic.host_queue(own).expect("its own queue");
    let takes = Tagged::of(true, [10, 11, 30]).unwrap();
    assert_eq!(
        *queue.takes.borrow(),
        HostFrames {
            tagged: takes.clone(),
            keep_tags: true
        }
    );
    assert_eq!(*nic.excluded_tags.lock().unwrap(), vec![(own, takes)]);
    peer.kept = Some(Vec::new());
    let plain = frame(own, LAN_PEER, 1400);
    let (on_11, on_30) = (tagged(&plain, 11), tagged(&plain, 30));
    // Its VLANs' frames and its untagged ones go to its own queue, as they came; VLAN 20's
    // and a priority-tagged one stay on the general socket, which delivers the latter as
    // it is (a priority tag is no VLAN: the frame counts as untagged).
    for f in [
        on_11.clone(),
        plain.clone(),
        tagged(&plain, 20),
        on_30.clone(),
        tagged(&plain, 0),
    ] {
        nic.arrive(f);
    }
    assert_eq!(queue.frames.borrow().len(), 3);
    assert_eq!(nic.rx.borrow().len(), 2);
    from_lan::read_own_queue(&mut ioc, s);
    while !nic.rx.borrow().is_empty() {
        from_lan::drive_lan(&mut ioc, 0);
    }
    pump(&mut ioc, &mut peer, s, true);
    let kept = peer.kept.as_ref().unwrap();
    assert_eq!(&kept[..3], &[on_11, plain.clone(), on_30]);
    assert_eq!(&kept[3..], &[tagged(&plain, 0)]);
    assert_eq!(host(&ioc, s).link.as_ref().unwrap().stats().tx_in_place, 3);
    assert_eq!(nic.violations.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn a_trunk_of_too_many_vlan_ranges_keeps_the_general_path_for_its_tagged_frames() {
    let (mut ioc, nic) = ioc_with("");
    let mut list: Vec<u16> = (1..200).step_by(2).collect();
    list.push(0);
    let (s, _peer) = connect_shm_as(&mut ioc, who(3, trunk(&list)), large_pools());
    let own = mac(&ioc, s);
    let queue = nic
        .host_queue(own)
        .expect("its own queue, for untagged frames");
    assert_eq!(queue.takes.borrow().tagged, Tagged::untagged());
    nic.arrive(tagged(&frame(own, LAN_PEER, 100), 7));
    assert!(queue.frames.borrow().is_empty());
    assert_eq!(nic.rx.borrow().len(), 1, "the general path");
}

#[test]
fn a_reload_that_changes_a_hosts_vlan_takes_effect_at_once_and_moves_its_own_queue() {
    use splitnet_config::key::Key as TextKey;
    use splitnet_config::{AdmittedHost, IocAuth};
    let (mut ioc, nic) = ioc_with("");
    let entry = |vlan: Option<u16>| AdmittedHost {
        name: "a".into(),
        public_key: TextKey([1; 32]),
        mac: None,
        extra_macs: vec![],
        promiscuous: false,
        queues: 1,
        vlan,
        vlans: vec![],
        port: None,
    };
    let auth = |vlan| IocAuth {
        hosts: vec![entry(vlan)],
        ..IocAuth::default()
    };
    ioc.cfg.auth = auth(Some(10));
    ioc.apply_policy();
    let mut w = who(1, access(10));
    w.key = Some([1; 32]);
    let (s, mut peer) = connect_shm_as(&mut ioc, w, large_pools());
    let own = mac(&ioc, s);
    assert_eq!(
        nic.host_queue(own).unwrap().takes.borrow().tagged,
        Tagged::vlan(10)
    );
    ioc.cfg.auth = auth(Some(20));
    ioc.apply_policy();
    assert!(ioc.hosts.contains_key(&s), "the session stays");
    assert_eq!(host(&ioc, s).policy.vlan, access(20));
    assert_eq!(
        nic.host_queue(own).unwrap().takes.borrow().tagged,
        Tagged::vlan(20),
        "its own queue now takes VLAN 20"
    );
    peer.kept = Some(Vec::new());
    let plain = frame(own, LAN_PEER, 200);
    nic.arrive(tagged(&plain, 10));
    while !nic.rx.borrow().is_empty() {
        from_lan::drive_lan(&mut ioc, 0);
    }
    pump(&mut ioc, &mut peer, s, true);
    assert!(
        peer.kept.as_ref().unwrap().is_empty(),
        "VLAN 10 no longer its"
    );
    assert_eq!(nic.violations.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn an_access_host_never_gets_a_frame_still_tagged_and_a_priority_tag_hides_no_vlan() {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = join(&mut ioc, 1, access(10));
    let (u, mut pu) = join(&mut ioc, 2, VlanMode::Untagged);
    let (ma, mu) = (mac(&ioc, a), mac(&ioc, u));
    // QinQ with VLAN 10 outside: the inner tag would remain; dropped.
    let inner = tagged(&frame(ma, LAN_PEER, 200), 5);
    let mut qinq = inner.clone();
    let n = qinq.len();
    qinq.resize(n + 4, 0);
    insert_vlan(&mut qinq, n, 0x88a8, 10).unwrap();
    lan(&mut ioc, &nic, &[qinq]);
    assert!(got(&mut ioc, &mut pa, a).is_empty());
    // An untagged host may not send VLAN 10's frames behind a priority tag.
    let mut hop = tagged_plain(&frame(LAN_PEER, mu, 100), 10);
    let n = hop.len();
    hop.resize(n + 4, 0);
    insert_vlan(&mut hop, n, 0x8100, 0xe000).unwrap();
    host_sends(&mut ioc, &mut pu, u, vec![hop]);
    assert!(nic.tx.borrow().is_empty());
    assert_eq!(host(&ioc, u).drops.vlan, 1);
}
