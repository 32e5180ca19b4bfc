//! `[[auth.hosts]]` over time: a reload reaches live sessions, reserved MACs stay their
//! entries', and a key is one host.

use super::*;
use crate::gate::Policy;
use splitnet_config::key::Key as TextKey;
use splitnet_config::{Admission, AdmittedHost, IocAuth, MacAddr};

pub(super) const VM1: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];
const VM2: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 2];

/// An entry for the host of key `[n; 32]`.
pub(super) fn entry(
    n: u8,
    mac: Option<[u8; 6]>,
    extra: &[[u8; 6]],
    promiscuous: bool,
) -> AdmittedHost {
    AdmittedHost {
        name: format!("host{n}"),
        public_key: TextKey([n; 32]),
        mac: mac.map(MacAddr),
        extra_macs: extra.iter().copied().map(MacAddr).collect(),
        promiscuous,
        queues: 1,
        vlan: None,
        vlans: Vec::new(),
        port: None,
    }
}

pub(super) fn auth(hosts: Vec<AdmittedHost>) -> IocAuth {
    IocAuth {
        admission: Admission::Keys,
        hosts,
        ..IocAuth::default()
    }
}

/// An IOC whose `[auth]` is `a`.
pub(super) fn ioc_of(a: IocAuth) -> (WorkerState, FakeNic) {
    let (mut ioc, nic) = ioc_with("");
    ioc.cfg.auth = a;
    ioc.apply_policy();
    (ioc, nic)
}

/// Who the host of key `[n; 32]` is once its handshake proved the key, as admission
/// gives it.
pub(super) fn keyed(ioc: &WorkerState, n: u8) -> Who {
    let mut who = Who::node(u64::from(n) << 56);
    who.key = Some([n; 32]);
    who.policy = Policy::of(&ioc.cfg.auth, who.key.as_ref()).expect("admitted");
    who.generation = ioc.auth_generation;
    who
}

pub(super) fn connect_key(ioc: &mut WorkerState, n: u8) -> (u64, Peer) {
    let who = keyed(ioc, n);
    connect_with(ioc, who, false, host_config(128))
}

/// A reload: `[auth]` replaced and applied, as a worker does on `Cmd::Auth`.
fn reload(ioc: &mut WorkerState, a: IocAuth) {
    ioc.cfg.auth = a;
    ioc.apply_policy();
}

fn sessions_of(ioc: &WorkerState, n: u8) -> usize {
    ioc.hosts
        .values()
        .filter(|h| h.key == Some([n; 32]))
        .count()
}

#[test]
fn a_reload_takes_promiscuity_and_bridged_macs_from_a_connected_host_and_gives_new_ones() {
    let (mut ioc, nic) = ioc_of(auth(vec![entry(1, None, &[VM1], true)]));
    let (a, mut pa) = connect_key(&mut ioc, 1);
    pa.link.session_mut().cfg_request(CfgCode::SetPromisc, &[1]);
    pump(&mut ioc, &mut pa, a, true);
    assert!(host(&ioc, a).promisc);
    assert!(nic.promisc.get(), "the NIC held promiscuous for it");
    assert_eq!(ioc.by_mac.get(&VM1), Some(&a));
    host_sends(&mut ioc, &mut pa, a, vec![frame(LAN_PEER, VM1, 100)]);
    assert_eq!(nic.tx.borrow().len(), 1, "VM1 bridged behind A");

    reload(&mut ioc, auth(vec![entry(1, None, &[VM2], false)]));
    assert!(ioc.hosts.contains_key(&a), "the session stays");
    assert!(!host(&ioc, a).promisc, "promiscuity taken at once");
    assert!(!nic.promisc.get(), "and the NIC's with it");
    assert_eq!(ioc.by_mac.get(&VM1), None, "VM1 no longer A's");
    assert_eq!(
        ioc.by_mac.get(&VM2),
        Some(&a),
        "VM2 is, without a reconnect"
    );
    assert!(nic.unicast.borrow().contains(&VM2) && !nic.unicast.borrow().contains(&VM1));
    host_sends(
        &mut ioc,
        &mut pa,
        a,
        vec![frame(LAN_PEER, VM1, 100), frame(LAN_PEER, VM2, 100)],
    );
    assert_eq!(nic.tx.borrow().len(), 2, "only the frame from VM2 left");
    assert_eq!(host(&ioc, a).drops.spoofed, 1, "VM1's counted as spoofed");
    // A frame for no host no longer reaches it.
    let before = pa.frames;
    lan_to(&mut ioc, &nic, &mut pa, a, [0x02, 0x77, 0, 0, 0, 9]);
    assert_eq!(pa.frames, before, "no snooping after the reload");
    pa.link.session_mut().cfg_request(CfgCode::SetPromisc, &[1]);
    pump(&mut ioc, &mut pa, a, true);
    assert!(
        !host(&ioc, a).promisc,
        "and it cannot turn promiscuous again"
    );
}

#[test]
fn a_reload_ends_the_sessions_whose_mac_or_admission_changed() {
    let fixed = [0x02, 0x5d, 0, 0, 0, 0x41];
    let (mut ioc, _nic) = ioc_of(auth(vec![
        entry(1, Some(fixed), &[], false),
        entry(2, None, &[], false),
        entry(3, None, &[], false),
    ]));
    let (a, _pa) = connect_key(&mut ioc, 1);
    let (b, _pb) = connect_key(&mut ioc, 2);
    let (c, _pc) = connect_key(&mut ioc, 3);
    assert_eq!(mac(&ioc, a), fixed);
    let moved = [0x02, 0x5d, 0, 0, 0, 0x42];
    // A's mac changes, B's entry goes, C's stays as it was.
    reload(
        &mut ioc,
        auth(vec![
            entry(1, Some(moved), &[], false),
            entry(3, None, &[], false),
        ]),
    );
    assert!(
        !ioc.hosts.contains_key(&a),
        "a changed mac ends the session"
    );
    assert!(
        !ioc.hosts.contains_key(&b),
        "a removed entry ends the session"
    );
    assert!(ioc.hosts.contains_key(&c), "an unchanged entry keeps it");
    assert_eq!(ioc.by_mac.get(&fixed), None, "its old MAC is free");
    // A reconnects and takes the new one.
    let (a, _pa) = connect_key(&mut ioc, 1);
    assert_eq!(mac(&ioc, a), moved);
}

#[test]
fn open_admission_turned_to_keys_ends_the_sessions_without_a_key() {
    let mut open = auth(vec![entry(1, None, &[], false)]);
    open.admission = Admission::Open;
    let (mut ioc, _nic) = ioc_of(open);
    let (anon, _p) = connect(&mut ioc, 7, false, 128);
    let (a, _pa) = connect_key(&mut ioc, 1);
    assert!(host(&ioc, a).policy.promiscuous, "open admission's policy");
    reload(&mut ioc, auth(vec![entry(1, None, &[], false)]));
    assert!(
        !ioc.hosts.contains_key(&anon),
        "no key: no place under keys"
    );
    assert!(ioc.hosts.contains_key(&a), "an admitted key stays");
    assert!(
        !host(&ioc, a).policy.promiscuous,
        "and takes its entry's policy"
    );
}

#[test]
fn encrypt_data_turned_on_by_reload_ends_sessions_whose_data_travels_in_the_clear() {
    let (mut ioc, _nic) = ioc_of(auth(vec![
        entry(1, None, &[], false),
        entry(2, None, &[], false),
    ]));
    let mut clear = keyed(&ioc, 1);
    clear.clear_data = true;
    let (a, _pa) = connect_with(&mut ioc, clear, false, host_config(128));
    let (b, _pb) = connect_key(&mut ioc, 2);
    let mut next = ioc.cfg.auth.clone();
    next.encrypt_data = true;
    reload(&mut ioc, next);
    assert!(ioc.cfg.auth.encrypt_data, "the worker's copy follows");
    assert!(!ioc.hosts.contains_key(&a), "cleartext data channel ended");
    assert!(ioc.hosts.contains_key(&b), "a sealed one stays");
}

#[test]
fn no_host_takes_a_mac_another_entry_reserves_and_the_rightful_host_gets_its_macs_back() {
    let reserved = [0x02, 0x5d, 0, 0, 0, 0x51];
    let (mut ioc, nic) = ioc_of(auth(vec![
        entry(1, Some(reserved), &[VM1], false),
        entry(2, None, &[], false),
    ]));
    let (b, mut pb) = connect_key(&mut ioc, 2);
    // B asks, while A is away, for A's MAC and for its bridged machine's: refused.
    for m in [reserved, VM1] {
        pb.link.session_mut().cfg_request(CfgCode::SetMac, &m);
        pump(&mut ioc, &mut pb, b, true);
        assert_ne!(mac(&ioc, b), m, "reserved for host1");
    }
    host_sends(&mut ioc, &mut pb, b, vec![frame(LAN_PEER, VM1, 100)]);
    assert!(nic.tx.borrow().is_empty(), "nor may it send as A's machine");
    // A comes back and gets both.
    let (a, _pa) = connect_key(&mut ioc, 1);
    assert_eq!(mac(&ioc, a), reserved);
    assert_eq!(ioc.by_mac.get(&VM1), Some(&a));
    // A reload that gives B's current MAC to A's entry ends B's claim; A reconnects to it.
    let squatted = mac(&ioc, b);
    reload(
        &mut ioc,
        auth(vec![
            entry(1, Some(reserved), &[VM1, squatted], false),
            entry(2, None, &[], false),
        ]),
    );
    assert!(!ioc.hosts.contains_key(&b), "B held a MAC reserved for A");
    assert_eq!(ioc.by_mac.get(&squatted), Some(&a), "A has it at once");
}

#[test]
fn a_bridged_mac_moved_to_another_entry_by_reload_moves_with_it() {
    let (mut ioc, _nic) = ioc_of(auth(vec![
        entry(1, None, &[VM1], false),
        entry(2, None, &[], false),
    ]));
    let (a, _pa) = connect_key(&mut ioc, 1);
    let (b, _pb) = connect_key(&mut ioc, 2);
    assert_eq!(ioc.by_mac.get(&VM1), Some(&a));
    reload(
        &mut ioc,
        auth(vec![
            entry(1, None, &[], false),
            entry(2, None, &[VM1], false),
        ]),
    );
    assert!(ioc.hosts.contains_key(&a) && ioc.hosts.contains_key(&b));
    assert_eq!(ioc.by_mac.get(&VM1), Some(&b));
    assert!(host(&ioc, b).bridged.contains(&VM1));
    assert!(!host(&ioc, a).bridged.contains(&VM1));
}

#[test]
fn a_derived_mac_is_never_one_an_entry_reserves() {
    let (ioc, _nic) = ioc_of(auth(vec![entry(9, None, &[], false)]));
    let node = 12_345;
    // The MAC node 12345 would be given, now reserved for host9.
    let first = ioc.assign_mac(node);
    ioc.shard.release_mac(&*ioc.nic, first);
    let (mut ioc, _nic) = ioc_of(auth(vec![entry(9, Some(first), &[], false)]));
    // A host of open admission's policy (as a test's host is), of this configuration.
    let mut who = Who::node(node);
    who.generation = ioc.auth_generation;
    let (a, _pa) = connect_with(&mut ioc, who, false, host_config(128));
    assert_ne!(
        mac(&ioc, a),
        first,
        "reserved for host9, even while it is away"
    );
}

#[test]
fn one_key_opening_sessions_in_a_loop_holds_one_and_another_host_is_served() {
    let (mut ioc, nic) = ioc_of(auth(vec![
        entry(1, None, &[], false),
        entry(2, None, &[], false),
    ]));
    let mut last = None;
    for _ in 0..20 {
        let (s, p) = connect_key(&mut ioc, 1);
        assert_eq!(
            sessions_of(&ioc, 1),
            1,
            "the newest session replaces the older"
        );
        last = Some((s, p));
    }
    let (a, mut pa) = last.unwrap();
    let (b, mut pb) = connect_key(&mut ioc, 2);
    assert_eq!(ioc.hosts.len(), 2);
    let (ma, mb) = (mac(&ioc, a), mac(&ioc, b));
    assert_eq!(lan_to(&mut ioc, &nic, &mut pb, b, mb), (3, 0));
    assert_eq!(lan_to(&mut ioc, &nic, &mut pa, a, ma), (3, 0));
}

/// A host admitted under a policy a reload changed while it connected: it gets the policy
/// of now, and none when the reload took its admission away.
#[test]
fn a_host_that_connects_across_a_reload_gets_the_policy_of_now() {
    let (mut ioc, _nic) = ioc_of(auth(vec![
        entry(1, None, &[VM1], true),
        entry(2, None, &[], false),
    ]));
    let stale = keyed(&ioc, 1);
    let gone = keyed(&ioc, 2);
    reload(&mut ioc, auth(vec![entry(1, None, &[VM2], false)]));
    let (a, _pa) = connect_with(&mut ioc, stale, false, host_config(128));
    assert!(
        !host(&ioc, a).policy.promiscuous,
        "the promiscuity the reload took"
    );
    assert_eq!(ioc.by_mac.get(&VM2), Some(&a), "the bridged MAC of now");
    assert_eq!(ioc.by_mac.get(&VM1), None);
    // Host 2's entry went while it connected: its session is closed, its domain freed.
    let (session, token, link, _host_ends) = ioc_link(&mut ioc, false);
    assert!(ioc
        .add_host(session, token, gone, link, "test".into())
        .is_none());
    assert!(!ioc.hosts.contains_key(&session));
    assert!(ioc.reg.regions_of(DomainId(session)).is_empty());
}

#[test]
fn a_host_may_not_set_its_mac_to_one_of_its_bridged_machines() {
    let bridged = [0x02, 0x5d, 0, 0, 0, 0x61];
    let (mut ioc, _nic) = ioc_of(auth(vec![entry(1, None, &[bridged], false)]));
    let (a, mut pa) = connect_key(&mut ioc, 1);
    let own = mac(&ioc, a);
    pa.link.session_mut().cfg_request(CfgCode::SetMac, &bridged);
    pump(&mut ioc, &mut pa, a, true);
    assert_eq!(
        mac(&ioc, a),
        own,
        "a MAC is the host's or a machine's, not both"
    );
    assert_eq!(host(&ioc, a).bridged, vec![bridged]);
    assert_eq!(ioc.by_mac.get(&bridged), Some(&a));
}

/// Under key admission a control channel waiting for its data channel holds no place;
/// under open admission (any key gets in) it holds one, as one without a key does.
#[test]
fn only_a_waiting_control_channel_of_an_admitted_key_holds_no_place() {
    let (mut ioc, _nic) = ioc_with("max_hosts = 1");
    for counted in [false, true] {
        let (c, _h) = pair(false);
        let mut who = Who::node(9);
        who.key = Some([9; 32]);
        ioc.pending.insert(
            7,
            crate::state::Waiting {
                ch: channel(c, 7),
                session: 7,
                who,
                hold: None,
                counted,
            },
        );
        ioc.publish_load();
        assert_eq!(
            ioc.shard.admit(1),
            !counted,
            "a place left for a proven host (counted: {counted})"
        );
        ioc.pending.clear();
        ioc.publish_load();
    }
}
