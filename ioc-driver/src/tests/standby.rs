//! Standby sessions (docs/protocol.md 6.4): admitted and warm, claiming nothing and carrying
//! no frame until the host activates them; activated, they hold the host's MACs as an
//! active session does.

use super::policy::{auth, connect_key, entry, ioc_of, keyed, VM1};
use super::*;
use crate::conformance::{block_on, code, row, spawn_ioc};
use crate::state::liveness_interval;
use std::path::Path;

const OWN: [u8; 6] = [0x02, 0x5d, 0, 0, 0, 0x61];
const OTHER: [u8; 6] = [0x02, 0x5d, 0, 0, 0, 0x62];

/// Host 1 (its entry's `mac` OWN, VM1 bridged behind it) connected as a standby.
fn standby_host() -> (WorkerState, FakeNic, u64, Peer) {
    let (mut ioc, nic) = ioc_of(auth(vec![
        entry(1, Some(OWN), &[VM1], true),
        entry(2, Some(OTHER), &[], false),
    ]));
    ioc.cfg.lan.promiscuous = Promiscuous::Auto;
    let mut who = keyed(&ioc, 1);
    who.standby = true;
    let (s, p) = connect_with(&mut ioc, who, false, host_config(128));
    (ioc, nic, s, p)
}

fn ask(ioc: &mut WorkerState, peer: &mut Peer, s: u64, code: CfgCode, data: &[u8]) -> ErrorCode {
    peer.events.clear();
    peer.link.session_mut().cfg_request(code, data);
    pump(ioc, peer, s, true);
    let replies = cfg_replies(peer);
    let answer = replies.iter().find(|(c, _)| *c == code);
    answer.map(|(_, st)| *st).expect("answered")
}

#[test]
fn a_standby_claims_nothing_gets_nothing_and_sends_nothing() {
    let (mut ioc, nic, s, mut p) = standby_host();
    assert!(host(&ioc, s).standby);
    assert_eq!(mac(&ioc, s), OWN, "its entry's MAC, as GetMac says");
    assert!(ioc.by_mac.is_empty(), "no MAC in the forwarding table");
    assert!(nic.unicast.borrow().is_empty(), "none in the NIC's filter");
    assert_eq!(
        ioc.shard.owner(&OWN),
        None,
        "none in the workers' directory"
    );
    // Neither its own MAC, nor a bridged one, nor a flood reaches it.
    assert_eq!(lan_to(&mut ioc, &nic, &mut p, s, OWN).0, 0);
    assert_eq!(lan_to(&mut ioc, &nic, &mut p, s, VM1).0, 0);
    assert_eq!(lan_to(&mut ioc, &nic, &mut p, s, [0xff; 6]).0, 0);
    // What it sends is dropped and counted, never put on the LAN.
    host_sends(&mut ioc, &mut p, s, vec![frame(LAN_PEER, OWN, 100)]);
    assert!(nic.tx.borrow().is_empty());
    assert_eq!(host(&ioc, s).drops.standby, 1);
    assert!(ioc.metrics_text().contains("tx_standby"));
    // It may ask, and not change what it would claim.
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::GetMac, &[]),
        ErrorCode::Ok
    );
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::GetLink, &[]),
        ErrorCode::Ok
    );
    for (code, data) in [
        (CfgCode::SetPromisc, vec![1]),
        (CfgCode::SetMulticast, vec![0x01, 0, 0x5e, 0, 0, 1]),
        (CfgCode::SetMac, OTHER.to_vec()),
    ] {
        assert_eq!(
            ask(&mut ioc, &mut p, s, code, &data),
            ErrorCode::Refused,
            "{code:?}"
        );
    }
    assert!(!host(&ioc, s).promisc && host(&ioc, s).multicast.is_empty());
    assert!(!nic.promisc.get());
    // A reload that gives other hosts their policy leaves it claiming nothing.
    let a = ioc.cfg.auth.clone();
    ioc.cfg.auth = a;
    ioc.apply_policy();
    assert!(ioc.by_mac.is_empty() && host(&ioc, s).bridged.is_empty());
}

#[test]
fn an_activation_refused_for_want_of_its_port_claims_nothing() {
    let (mut ioc, nic, s, mut p) = standby_host();
    // Ports mode, and the host's port is not there (its setup failed, say).
    ioc.ports = true;
    ioc.hosts.get_mut(&s).expect("connected").policy.port = Some("sdp-unit-none".into());
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::Activate, &[]),
        ErrorCode::Refused
    );
    assert!(host(&ioc, s).standby, "still a standby");
    assert_eq!(ioc.shard.owner(&OWN), None, "its MAC not claimed");
    assert!(ioc.by_mac.is_empty() && nic.unicast.borrow().is_empty());
    // Back in shared mode the same host activates: nothing was left claimed.
    ioc.ports = false;
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::Activate, &[]),
        ErrorCode::Ok
    );
    assert_eq!(ioc.by_mac.get(&OWN), Some(&s));
}

#[test]
fn activating_claims_the_hosts_macs_and_the_frames_flow() {
    let (mut ioc, nic, s, mut p) = standby_host();
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::Activate, &[1]),
        ErrorCode::Malformed
    );
    assert!(host(&ioc, s).standby, "a malformed request changes nothing");
    p.events.clear();
    p.link.session_mut().cfg_request(CfgCode::Activate, &[]);
    pump(&mut ioc, &mut p, s, true);
    let reply = p.events.iter().find_map(|e| match e {
        LinkEvent::CfgReply {
            code: CfgCode::Activate,
            status,
            data,
            ..
        } => Some((*status, data.clone())),
        _ => None,
    });
    assert_eq!(
        reply,
        Some((ErrorCode::Ok, VM1.to_vec())),
        "Ok, naming the bridged MAC now held here for the host to announce"
    );
    assert!(!host(&ioc, s).standby);
    assert_eq!(ioc.activations, 1);
    assert_eq!(ioc.by_mac.get(&OWN), Some(&s));
    assert_eq!(ioc.by_mac.get(&VM1), Some(&s), "its bridged machine too");
    assert!(nic.unicast.borrow().contains(&OWN) && nic.unicast.borrow().contains(&VM1));
    assert_eq!(lan_to(&mut ioc, &nic, &mut p, s, OWN).0, 3);
    assert_eq!(lan_to(&mut ioc, &nic, &mut p, s, VM1).0, 3);
    host_sends(&mut ioc, &mut p, s, vec![frame(LAN_PEER, OWN, 100)]);
    assert_eq!(nic.tx.borrow().len(), 1);
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::SetPromisc, &[1]),
        ErrorCode::Ok
    );
    // Asked again: already active.
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::Activate, &[]),
        ErrorCode::Ok
    );
    assert_eq!(ioc.activations, 1);
    // The session's end releases what activation claimed.
    ioc.remove_host(s, "test", None);
    assert!(ioc.by_mac.is_empty());
    assert_eq!(ioc.shard.owner(&OWN), None);
}

#[test]
fn an_active_session_of_the_same_host_is_replaced_by_its_standby_and_activation_takes_its_mac() {
    // The host was active here, moved away (this IOC's NIC lost link, or its fabric was
    // cut one way), and connects back as a standby: its old session ends, its MAC is free.
    let (mut ioc, _nic) = ioc_of(auth(vec![entry(1, Some(OWN), &[], false)]));
    let (old, _po) = connect_key(&mut ioc, 1);
    assert_eq!(ioc.by_mac.get(&OWN), Some(&old));
    let mut who = keyed(&ioc, 1);
    who.standby = true;
    let (s, mut p) = connect_with(&mut ioc, who, false, host_config(128));
    assert!(
        !ioc.hosts.contains_key(&old),
        "the older session is replaced"
    );
    assert!(ioc.by_mac.is_empty(), "its MAC released with it");
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::Activate, &[]),
        ErrorCode::Ok
    );
    assert_eq!(ioc.by_mac.get(&OWN), Some(&s));
}

#[test]
fn activation_is_refused_while_another_host_holds_the_mac_and_for_a_further_queue() {
    // Open admission: a host without a key may have taken the MAC (no entry reserves it
    // for the standby's key here), and keeps it.
    let (mut ioc, _nic) = ioc_with("");
    let (a, _pa) = connect(&mut ioc, 7, false, 128);
    let taken = mac(&ioc, a);
    let mut who = Who::node(8);
    who.standby = true;
    who.policy.mac = Some(taken);
    let (s, mut p) = connect_with(&mut ioc, who, false, host_config(128));
    assert_eq!(
        ask(&mut ioc, &mut p, s, CfgCode::Activate, &[]),
        ErrorCode::Refused
    );
    assert!(host(&ioc, s).standby);
    assert_eq!(ioc.by_mac.get(&taken), Some(&a), "the holder keeps it");
    // A further queue cannot join a standby (its queues join once it is active).
    let mut further = Who::node(8);
    further.queue = wire::Queue { index: 1, count: 2 };
    further.first = host(&ioc, s).token;
    assert!(ioc.first_queue(&further).is_none());
}

#[test]
fn a_reload_that_takes_a_standbys_mac_away_ends_it() {
    let (mut ioc, _nic, s, _p) = standby_host();
    let mut a = ioc.cfg.auth.clone();
    a.hosts[0].mac = None;
    ioc.cfg.auth = a;
    ioc.apply_policy();
    assert!(!ioc.hosts.contains_key(&s));
}

#[test]
fn the_liveness_interval_kept_lies_between_the_floor_and_the_iocs_own() {
    assert_eq!(liveness_interval(25, 200), 25);
    assert_eq!(liveness_interval(1, 200), 10);
    assert_eq!(liveness_interval(5000, 200), 200);
    assert_eq!(
        liveness_interval(25, 5),
        10,
        "the floor wins over a tiny keepalive"
    );
    assert_eq!(liveness_interval(60_000, 100_000), 60_000);
}

/// Table 7.2, H15: a data channel that asks for STANDBY for a host whose entry has no
/// `mac`, or for a further queue, is refused with the row's status in its AuthReply; the
/// same host with a `mac` is admitted as a standby (the IOC agrees to the flag).
#[test]
fn h15_standby_without_a_mac_or_for_a_further_queue() {
    use splitnet_fabric::auth;
    use splitnet_fabric::FabricError;
    use splitnet_messaging::endpoint::handshake::HandshakeError;
    use splitnet_messaging::wire::{HelloReply, Queue};
    let cells = row("H15");
    assert_eq!(cells[4], "HelloReply in an AuthReply", "{cells:?}");
    let ioc_key = auth::generate().unwrap();
    let (with_mac, without) = (auth::generate().unwrap(), auth::generate().unwrap());
    let pubkey = |k| splitnet_config::key::Key(auth::public_key(k));
    let text = format!(
        "[fabric]\nlisten = \"127.0.0.1:7400\"\nworkers = 2\n[lan]\ninterface = \"lan0\"\n\
         [auth]\nadmission = \"keys\"\n\
         [[auth.hosts]]\nname = \"a\"\npublic_key = \"{}\"\nmac = \"02:5d:00:00:00:0a\"\nqueues = 2\n\
         [[auth.hosts]]\nname = \"b\"\npublic_key = \"{}\"\n",
        pubkey(&with_mac),
        pubkey(&without),
    );
    let cfg = splitnet_config::parse_ioc(&text, Path::new("test.toml")).unwrap();
    let addr = spawn_ioc(cfg, Some(ioc_key), |_| {});
    // Host `private`'s queue `queue` (of a host whose first is `first`) asking `flags`:
    // the agreed flags and the session, or why not.
    let open = |private, queue, first, flags| {
        let keys = splitnet_fabric::HostKeys {
            private,
            ioc: auth::public_key(&ioc_key),
            seal_data: false,
            flags,
        };
        block_on(splitnet_fabric::connect(
            || splitnet_fabric::dial_tcp(addr),
            splitnet_fabric::DataPath::Stream,
            7,
            queue,
            first,
            Duration::from_secs(2),
            Some(&keys),
        ))
        .map(|(ctrl, data, reply)| (reply.flags, reply.session, ctrl, data))
    };
    let refused = |r: &Result<_, FabricError>| {
        matches!(r, Err(FabricError::Handshake(HandshakeError::Refused { status, .. }))
            if status.to_u16() == code("H15"))
    };
    let no_mac = open(without, Queue::SINGLE, 0, HelloReply::STANDBY);
    assert!(refused(&no_mac), "an entry without a mac");
    // Host a's first queue, active; its second asks to be a standby.
    let two = |index| Queue { index, count: 2 };
    let (_, first, _c, _d) = open(with_mac, two(0), 0, 0).expect("a's first queue");
    let further = open(with_mac, two(1), first, HelloReply::STANDBY);
    assert!(refused(&further), "a further queue as a standby");
    assert!(
        open(with_mac, two(1), first, 0).is_ok(),
        "not as a standby: joined"
    );
    let (ok, ..) = open(with_mac, Queue::SINGLE, 0, HelloReply::STANDBY)
        .expect("a standby with a mac is admitted");
    assert_ne!(ok & HelloReply::STANDBY, 0, "agreed to the standby");
}
