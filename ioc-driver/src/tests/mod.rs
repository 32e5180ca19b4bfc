//! The IOC's forwarding, quotas and session ends, with hosts over loopback TCP and a NIC
//! made of queues: no root, no interface.

use crate::from_host;
use crate::from_lan::{self, LanProgress};
use crate::host_queue::{HostQueue, CFG_COSTLY_RATE, SMALL_BUFFER};
use crate::nic::fake::FakeNic;
use crate::own_queue::{OwnQueueProgress, OWN_QUEUE_RETRY, OWN_QUEUE_RETRY_MAX};
use crate::state::{Who, WorkerState};
use splitnet_config::Promiscuous;
use splitnet_fabric::FabricChannel;
use splitnet_messaging::adapter::StreamChannel;
use splitnet_messaging::endpoint::{Lane, Link, LinkEvent, PoolSpec, Session, SessionConfig};
use splitnet_messaging::memory::{DomainId, Frame, Registry, SendBufCache};
use splitnet_messaging::sched::Deficit;
use splitnet_messaging::testing;
use splitnet_messaging::vnet::{VnetHdr, VNET_HDR_LEN};
use splitnet_messaging::wire::{self, CfgCode, ErrorCode};
use std::future::Future;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

mod express;
mod policy;
mod standby;
mod vlan;

fn config(extra: &str) -> splitnet_config::IocConfig {
    let text =
        format!("[fabric]\nlisten = \"127.0.0.1:7400\"\n{extra}\n[lan]\ninterface = \"lan0\"\n");
    splitnet_config::parse_ioc(&text, Path::new("test.toml")).unwrap()
}

fn ioc_with(extra: &str) -> (WorkerState, FakeNic) {
    let nic = FakeNic::default();
    (
        WorkerState::new(config(extra), Box::new(nic.clone()), 1500, true),
        nic,
    )
}

/// A connected pair of non-blocking TCP sockets on loopback.
fn pair(small: bool) -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    for s in [&a, &b] {
        s.set_nonblocking(true).unwrap();
        s.set_nodelay(true).unwrap();
        if small {
            let r = socket2::SockRef::from(s);
            r.set_send_buffer_size(4096).unwrap();
            r.set_recv_buffer_size(4096).unwrap();
        }
    }
    (a, b)
}

fn channel(s: TcpStream, domain: u32) -> FabricChannel {
    StreamChannel::new(s.into(), DomainId(u64::from(domain)), wire::MAX_MESSAGE_LEN).into()
}

/// The host's end of a session, driven by the test.
struct Peer {
    link: Link<FabricChannel>,
    reg: Registry,
    frames: u64,
    /// The frames received, kept when set.
    kept: Option<Vec<Vec<u8>>>,
    events: Vec<LinkEvent>,
}

impl Peer {
    /// Reads its control channel (and its data channel if `data`), returns credits and
    /// writes what it has queued.
    fn step(&mut self, data: bool) {
        let Peer {
            link,
            reg,
            frames,
            kept,
            events,
        } = self;
        let _ = link.poll(reg, Lane::Control, 256, &mut |_| {}, events);
        if data {
            let mut sink = |f: Frame<'_>| {
                *frames += 1;
                if let Some(k) = kept.as_mut() {
                    let mut v = Vec::new();
                    f.copy_to(&mut v);
                    k.push(v);
                }
            };
            let _ = link.poll(reg, Lane::Data, 256, &mut sink, events);
        }
        link.session_mut().flush_credits(reg);
        let _ = link.flush();
    }
}

/// Host pools with room for many frames, so credit never runs out before the quota does.
fn host_config(send_data_max: usize) -> SessionConfig {
    let mut c = testing::config(send_data_max);
    c.advertise = vec![PoolSpec {
        element_size: 2048,
        element_count: 1024,
    }];
    c.target.max_granted_bytes = 16 << 20;
    c.target.credit_batch = 16;
    c
}

/// Connects a host over loopback (tiny socket buffers when `small`), admits it, and lets
/// both sides exchange their pools. Returns its session id.
fn connect(ioc: &mut WorkerState, node_id: u64, small: bool, send_data_max: usize) -> (u64, Peer) {
    connect_with(ioc, Who::node(node_id), small, host_config(send_data_max))
}

/// A new session's IOC side over loopback TCP (its data socket's buffers tiny when
/// `small`), its pools registered: its id, token and link, and the host's ends of its
/// control and data sockets.
fn ioc_link(
    ioc: &mut WorkerState,
    small: bool,
) -> (u64, u64, Link<FabricChannel>, (TcpStream, TcpStream)) {
    let (ictrl, hctrl) = pair(false);
    let (idata, hdata) = pair(small);
    let (session, token) = ioc.new_session();
    let mut s = Session::new(DomainId(session), ioc.cfg.pools.session_config());
    s.start(&mut ioc.reg).unwrap();
    let link = Link::new(
        s,
        channel(ictrl, session as u32),
        channel(idata, session as u32),
    );
    (session, token, link, (hctrl, hdata))
}

/// [`connect`] with the host's own session configuration.
fn connect_with(
    ioc: &mut WorkerState,
    who: Who,
    small: bool,
    config: SessionConfig,
) -> (u64, Peer) {
    let (session, token, link, (hctrl, hdata)) = ioc_link(ioc, small);
    let peer_addr = "127.0.0.1:1".to_string();
    ioc.add_host(session, token, who, link, peer_addr).unwrap();
    let mut reg = Registry::new(64 << 20);
    let mut hs = Session::new(DomainId(1), config);
    hs.start(&mut reg).unwrap();
    let mut peer = Peer {
        link: Link::new(hs, channel(hctrl, 1), channel(hdata, 1)),
        reg,
        frames: 0,
        kept: None,
        events: Vec::new(),
    };
    pump(ioc, &mut peer, session, true);
    (session, peer)
}

/// Connects a host whose channels are in shared memory (over Unix socket pairs, as through
/// `fabric.listen_local`), each side's pools in an arena the other places its writes in.
/// Returns its session id.
fn connect_shm(ioc: &mut WorkerState, node_id: u64) -> (u64, Peer) {
    connect_shm_with(ioc, node_id, host_config(128))
}

/// [`connect_shm`] with the host's own session configuration.
fn connect_shm_with(ioc: &mut WorkerState, node_id: u64, config: SessionConfig) -> (u64, Peer) {
    connect_shm_as(ioc, Who::node(node_id), config)
}

/// [`connect_shm_with`] for a host that admission gave `who`.
fn connect_shm_as(ioc: &mut WorkerState, who: Who, config: SessionConfig) -> (u64, Peer) {
    use splitnet_fabric::shm::{accept, offer, PoolArena};
    let unix = || {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        for s in [&a, &b] {
            s.set_nonblocking(true).unwrap();
        }
        (a, b)
    };
    let ((ictrl, hctrl), (idata, hdata)) = (unix(), unix());
    let (session, token) = ioc.new_session();
    let domain = DomainId(session);
    let arena = PoolArena::new(c"test-ioc-pools", 64 << 20).unwrap();
    ioc.reg.attach_arena(domain, arena.region()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let timeout = Duration::from_secs(5);
    let max = wire::MAX_MESSAGE_LEN;
    let (hc, ic, hd, id) = rt.block_on(async {
        let (hc, ic) = tokio::join!(
            offer(hctrl, DomainId(1), max, None, timeout),
            accept(ictrl, domain, max, None, timeout)
        );
        let (hd, id) = tokio::join!(
            offer(hdata, DomainId(1), max, Some(16 << 20), timeout),
            accept(idata, domain, max, Some(arena), timeout)
        );
        (hc, ic, hd, id)
    });
    let shm = |t: Result<_, _>| FabricChannel::Shm(Box::new(t.unwrap()));
    let (hc, ic, hd, id) = (shm(hc), shm(ic), shm(hd), shm(id));
    let mut s = Session::new(domain, ioc.cfg.pools.session_config());
    s.start(&mut ioc.reg).unwrap();
    let link = Link::new(s, ic, id);
    let peer_addr = "local".to_string();
    ioc.add_host(session, token, who, link, peer_addr).unwrap();
    let mut reg = Registry::new(64 << 20);
    reg.attach_arena(DomainId(1), hd.pools().unwrap()).unwrap();
    let mut hs = Session::new(DomainId(1), config);
    hs.start(&mut reg).unwrap();
    let mut peer = Peer {
        link: Link::new(hs, hc, hd),
        reg,
        frames: 0,
        kept: None,
        events: Vec::new(),
    };
    pump(ioc, &mut peer, session, true);
    (session, peer)
}

/// Lets the IOC's side of `session` and the host run until things settle.
fn pump(ioc: &mut WorkerState, peer: &mut Peer, session: u64, read_data: bool) {
    for _ in 0..20 {
        peer.step(read_data);
        let _ = from_host::drive_host(ioc, session, Lane::Control);
        let _ = from_host::drive_host(ioc, session, Lane::Data);
        let WorkerState { hosts, cache, .. } = ioc;
        if let Some(h) = hosts.get_mut(&session) {
            let _ = h.flush(cache);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An Ethernet frame with a virtio-net header: `len` bytes of IPv4 payload (not
/// ECN-capable: a backlog never marks it).
fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = VnetHdr::default().emit().to_vec();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00]);
    f.resize(VNET_HDR_LEN + 14 + len, 0x45);
    if let Some(tos) = f.get_mut(VNET_HDR_LEN + 15) {
        *tos = 0;
    }
    f
}

/// A TCP/IPv4 segmentation super-frame of 20,000 bytes of payload.
fn tso_frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = frame(dst, src, 20_000);
    let h = VnetHdr {
        flags: 1,
        gso_type: 1,
        hdr_len: 54,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
    };
    f[..VNET_HDR_LEN].copy_from_slice(&h.emit());
    f
}

const LAN_PEER: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

fn mac(ioc: &WorkerState, session: u64) -> [u8; 6] {
    ioc.hosts[&session].mac
}

/// Feeds `n` LAN frames for `to` through the NIC.
fn from_lan(ioc: &mut WorkerState, nic: &FakeNic, to: [u8; 6], n: usize) {
    for _ in 0..n {
        nic.rx.borrow_mut().push_back(frame(to, LAN_PEER, 1400));
    }
    for _ in 0..n {
        if nic.rx.borrow().is_empty() {
            return;
        }
        from_lan::drive_lan(ioc, 0);
    }
    assert!(
        nic.rx.borrow().is_empty(),
        "LAN receive stalled: {} send buffers in use",
        ioc.cache.in_use()
    );
}

fn host(ioc: &WorkerState, session: u64) -> &HostQueue {
    &ioc.hosts[&session]
}

/// Fills a host that does not read its data channel until its quota is in use.
fn stuck_host(ioc: &mut WorkerState, nic: &FakeNic) -> (u64, Peer) {
    let (slow, mut peer) = connect(ioc, 7, true, 128);
    let to = mac(ioc, slow);
    // More frames than its quota holds in small buffers (1,039 with max_hosts 8).
    from_lan(ioc, nic, to, 2000);
    pump(ioc, &mut peer, slow, false);
    let h = host(ioc, slow);
    assert!(
        !h.has_room(SMALL_BUFFER),
        "the slow host's quota is all queued"
    );
    assert!(h.drops.quota > 0, "frames beyond the quota are dropped");
    assert!(h.blocked, "its socket is full");
    (slow, peer)
}

#[test]
fn every_session_end_returns_every_send_buffer() {
    type End = fn(&mut WorkerState, u64);
    let ends: [(&str, End); 3] = [
        ("goodbye", |ioc, s| {
            ioc.remove_host(s, "host disconnected", None)
        }),
        ("over a limit", |ioc, s| {
            ioc.remove_host_over_limit(s, "too much unread")
        }),
        ("keepalive", |ioc, s| {
            ioc.remove_host(s, "silent beyond the keepalive timeout", None)
        }),
    ];
    for (what, end) in ends {
        let (mut ioc, nic) = ioc_with("");
        let (slow, _peer) = stuck_host(&mut ioc, &nic);
        assert!(ioc.cache.in_use() > 0);
        end(&mut ioc, slow);
        assert!(ioc.hosts.is_empty());
        assert_eq!(ioc.cache.in_use(), 0, "{what}: buffers leaked");
        assert_eq!(ioc.reg.stats().regions, 0, "{what}: pools left");
    }
}

#[test]
fn frames_a_session_end_drops_unsent_are_counted() {
    let (mut ioc, nic) = ioc_with("");
    let (slow, _peer) = stuck_host(&mut ioc, &nic);
    let h = host(&ioc, slow);
    // Every frame of 1,426 bytes, each in a small buffer.
    let (held, drops) = ((h.held() / SMALL_BUFFER) as u64, h.drops);
    assert!(h.pending() > 0, "frames wait on its full socket");
    ioc.remove_host(slow, "host disconnected", None);
    let lost = ioc.past_drops.lost_at_close - drops.lost_at_close;
    assert!(lost > 0, "frames posted on its link and never written");
    assert_eq!(
        lost, held,
        "every frame it held, counted once, as lost at close"
    );
    assert_eq!(
        ioc.past_drops.ring_full, drops.ring_full,
        "none counted as a full ring"
    );
    assert!(ioc.metrics_text().contains(&format!(
        "splitnet_ioc_dropped_total{{cause=\"rx_lost_at_close\"}} {lost}"
    )));
}

#[test]
fn a_lan_frame_no_pool_of_the_host_can_hold_goes_inline_not_dropped() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect(&mut ioc, 3, false, 128);
    let to = mac(&ioc, s);
    // Its pools' elements hold 2,048 bytes: the 4,000-byte frame travels as SendData, which
    // the host must take (docs/protocol.md, N1); only a frame beyond the largest SendData is
    // too large, and the LAN read cuts those first (lan_rx_truncated).
    for len in [4000, 100] {
        nic.rx.borrow_mut().push_back(frame(to, LAN_PEER, len));
    }
    from_lan::drive_lan(&mut ioc, 0);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(peer.frames, 2);
    assert_eq!(host(&ioc, s).drops, crate::counters::Drops::default());
    assert_eq!(host(&ioc, s).stats.rx_frames, 2);
}

#[test]
fn churn_under_load_keeps_the_pool_whole() {
    let (mut ioc, nic) = ioc_with("");
    for round in 0..20 {
        let (slow, _peer) = stuck_host(&mut ioc, &nic);
        ioc.remove_host(slow, "host disconnected", None);
        assert_eq!(ioc.cache.in_use(), 0, "round {round}");
    }
    // The LAN still reaches a new host.
    let (good, mut peer) = connect(&mut ioc, 9, false, 128);
    let to = mac(&ioc, good);
    from_lan(&mut ioc, &nic, to, 50);
    pump(&mut ioc, &mut peer, good, true);
    assert_eq!(peer.frames, 50);
}

#[test]
fn a_host_that_stops_reading_costs_only_itself() {
    let (mut ioc, nic) = ioc_with("");
    let (good, mut good_peer) = connect(&mut ioc, 1, false, 128);
    let (slow, _slow_peer) = stuck_host(&mut ioc, &nic);
    let (to_good, to_slow) = (mac(&ioc, good), mac(&ioc, slow));
    let mut sent = 0;
    for _ in 0..20 {
        from_lan(&mut ioc, &nic, to_slow, 100);
        from_lan(&mut ioc, &nic, to_good, 50);
        sent += 50;
        pump(&mut ioc, &mut good_peer, good, true);
    }
    assert_eq!(good_peer.frames, sent, "the good host got every frame");
    let g = host(&ioc, good);
    assert_eq!(g.stats.rx_dropped, 0);
    assert_eq!(g.drops, Default::default());
    let s = host(&ioc, slow);
    assert!(s.held() <= s.quota);
    assert!(
        s.drops.quota >= 2000,
        "the slow host's frames are dropped and counted"
    );
    assert_eq!(s.stats.rx_dropped, s.drops.quota + s.drops.ring_full);
    let quota_drops = s.drops.quota;
    let m = ioc.metrics_text();
    let line = format!(
        "splitnet_ioc_host_dropped_by_cause_total{{session=\"{slow}\",queue=\"0\",cause=\"rx_quota\"}} {quota_drops}"
    );
    assert!(m.contains(&line), "{line} not in the metrics");
}

/// A host that never reads, with one pool of `element_count` elements of `element_size`
/// bytes, over tiny sockets when `small`.
fn host_with_pool(
    ioc: &mut WorkerState,
    small: bool,
    element_size: u32,
    element_count: u32,
) -> (u64, Peer) {
    let mut config = host_config(128);
    config.advertise = vec![PoolSpec {
        element_size,
        element_count,
    }];
    connect_with(ioc, Who::node(9), small, config)
}

/// A host that never reads, with credit for four frames of `element_size` bytes: the rest
/// wait in its ring (or, too large for its pools, go inline).
fn host_without_credit(ioc: &mut WorkerState, element_size: u32) -> (u64, Peer) {
    host_with_pool(ioc, false, element_size, 4)
}

#[test]
fn a_hosts_share_holds_32_mtu_sized_frames_for_each_of_the_largest() {
    let (mut ioc, nic) = ioc_with("");
    let (s, _peer) = host_without_credit(&mut ioc, 2048);
    let to = mac(&ioc, s);
    // 1,000 frames of 1,426 bytes: 12 ms at 1 Gb/s, each in a small buffer, all kept; their
    // full-size buffers went back to be read into again.
    from_lan(&mut ioc, &nic, to, 1000);
    let h = host(&ioc, s);
    assert_eq!(h.drops, crate::counters::Drops::default());
    assert!(h.ring_waiting() >= 990, "{} wait", h.ring_waiting());
    assert!(h.held() <= 1000 * SMALL_BUFFER);
    assert_eq!(
        ioc.cache.in_use_bytes(),
        h.held(),
        "no full-size buffer held"
    );
    // A large frame takes the place of as many small ones as its buffer needs.
    for _ in 0..3 {
        nic.rx.borrow_mut().push_back(tso_frame(to, LAN_PEER));
    }
    from_lan::drive_lan(&mut ioc, 0);
    let h = host(&ioc, s);
    assert!(h.held() <= h.quota);
    let evicted = h.drops.quota;
    let need = (h.held() + 3 * wire::MAX_SEND_DATA).saturating_sub(h.quota);
    assert!(
        (1..=need.div_ceil(SMALL_BUFFER) as u64 + 32).contains(&evicted),
        "{evicted} evicted"
    );

    // Only frames of the largest size: a share holds 32 of them, as before small buffers.
    let (mut ioc, nic) = ioc_with("");
    let (s, _peer) = host_without_credit(&mut ioc, 65_600);
    let to = mac(&ioc, s);
    for _ in 0..100 {
        nic.rx.borrow_mut().push_back(tso_frame(to, LAN_PEER));
        from_lan::drive_lan(&mut ioc, 0);
    }
    let h = host(&ioc, s);
    assert!(h.held() <= h.quota);
    assert!(h.held() / wire::MAX_SEND_DATA <= 32);
    assert!(h.drops.quota >= 100 - 32 - 4, "{:?}", h.drops);
}

mod send_buffer_accounting {
    use super::*;
    use proptest::prelude::*;

    /// A burst of LAN frames for the host (small, MTU-sized or TSO), or the host reading.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Lan { frames: usize, kind: u8 },
        HostReads,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (1..300usize, 0..3u8).prop_map(|(frames, kind)| Step::Lan { frames, kind }),
            1 => Just(Step::HostReads),
        ]
    }

    proptest! {
        // Each case is a session over loopback TCP: few cases, many steps.
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Whatever arrives and whenever the host reads, the bytes counted against the host
        /// are exactly the send buffers it holds (the worker's in use: its ring and its
        /// link), never above its share, and everything goes back once it read all (over
        /// sockets that let it).
        #[test]
        fn a_hosts_held_bytes_are_the_buffers_it_holds(
            small_sockets in any::<bool>(),
            small_credits in 2..600u32,
            large_credits in 1..40u32,
            steps in prop::collection::vec(step(), 1..12),
        ) {
            let (mut ioc, nic) = ioc_with("");
            let mut config = host_config(128);
            config.advertise = vec![
                PoolSpec { element_size: 2048, element_count: small_credits },
                PoolSpec { element_size: 65_600, element_count: large_credits },
            ];
            let (s, mut peer) = connect_with(&mut ioc, Who::node(9), small_sockets, config);
            let to = mac(&ioc, s);
            for st in steps {
                match st {
                    Step::Lan { frames, kind } => {
                        for _ in 0..frames {
                            let f = match kind {
                                0 => frame(to, LAN_PEER, 46),
                                1 => frame(to, LAN_PEER, 1400),
                                _ => tso_frame(to, LAN_PEER),
                            };
                            nic.rx.borrow_mut().push_back(f);
                            from_lan::drive_lan(&mut ioc, 0);
                        }
                    }
                    Step::HostReads => pump(&mut ioc, &mut peer, s, true),
                }
                let h = host(&ioc, s);
                prop_assert!(h.held() <= h.quota, "{} of {}", h.held(), h.quota);
                prop_assert_eq!(ioc.cache.in_use_bytes(), h.held());
            }
            // Tiny loopback sockets send their last bytes by window probes, too slowly to
            // wait for here.
            if !small_sockets {
                pump(&mut ioc, &mut peer, s, true);
                let h = host(&ioc, s);
                prop_assert_eq!((h.held(), h.ring_waiting(), h.pending()), (0, 0, 0));
                prop_assert_eq!(ioc.cache.in_use_bytes(), 0);
            }
        }
    }
}

#[test]
fn a_large_frame_that_the_ring_cannot_make_room_for_costs_nothing_that_waits() {
    let (mut ioc, nic) = ioc_with("");
    // Credit for nearly its whole share of small frames, and a socket that takes almost
    // nothing: its frames wait on its link, a few in its ring.
    let (s, _peer) = host_with_pool(&mut ioc, true, 2048, 1075);
    let to = mac(&ioc, s);
    from_lan(&mut ioc, &nic, to, 1100);
    let h = host(&ioc, s);
    let (waiting, ring) = (h.ring_waiting(), h.ring_waiting() * SMALL_BUFFER);
    assert!(
        waiting > 0 && ring < wire::MAX_SEND_DATA,
        "{waiting} frames in the ring"
    );
    assert!(h.held() - ring + wire::MAX_SEND_DATA > h.quota);
    let quota_drops = h.drops.quota;
    // A TSO frame needs a full-size buffer: giving up the ring's small frames would not
    // make room for it, so it alone is dropped.
    nic.rx.borrow_mut().push_back(tso_frame(to, LAN_PEER));
    from_lan::drive_lan(&mut ioc, 0);
    let h = host(&ioc, s);
    assert_eq!(h.drops.quota, quota_drops + 1);
    assert_eq!(h.ring_waiting(), waiting, "nothing waiting given up");
}

#[test]
fn at_its_quota_a_host_still_takes_a_new_frame_in_place_of_its_longest_flows_oldest() {
    let (mut ioc, nic) = ioc_with("");
    // The host never reads: four frames take its credits, the rest wait in its ring.
    let (s, _peer) = host_without_credit(&mut ioc, 2048);
    let to = mac(&ioc, s);
    from_lan(&mut ioc, &nic, to, 1200);
    let h = host(&ioc, s);
    assert!(!h.has_room(SMALL_BUFFER), "its quota is in use");
    let held = h.held();
    assert!(h.ring_waiting() > 0, "frames wait in its ring");
    let quota_drops = h.drops.quota;
    // A broadcast reaches every host through a copy; at the quota it takes the place of the
    // oldest frame waiting instead of being dropped.
    nic.rx
        .borrow_mut()
        .push_back(frame([0xff; 6], LAN_PEER, 60));
    from_lan::drive_lan(&mut ioc, 0);
    let h = host(&ioc, s);
    assert_eq!(h.held(), held, "one small frame in place of another");
    assert_eq!(
        h.drops.quota,
        quota_drops + 1,
        "the evicted frame is counted"
    );
    let WorkerState { hosts, cache, .. } = &mut ioc;
    let waiting = hosts.get_mut(&s).unwrap().take_waiting();
    assert!(
        waiting
            .iter()
            .any(|b| b.as_slice()[VNET_HDR_LEN..VNET_HDR_LEN + 6] == [0xff; 6]),
        "the broadcast waits in the ring"
    );
    for b in waiting {
        cache.put(b);
    }
}

/// Polls a notification once: true if a wake-up was stored for the task.
fn woken(h: &HostQueue) -> bool {
    let mut n = pin!(h.wake.notified());
    let mut cx = Context::from_waker(Waker::noop());
    n.as_mut().poll(&mut cx).is_ready()
}

#[test]
fn a_full_socket_wakes_its_task_once_and_is_not_retried() {
    let (mut ioc, nic) = ioc_with("");
    let (slow, _peer) = stuck_host(&mut ioc, &nic);
    // The stuck host's task was told once; it now waits for writability.
    let _ = woken(host(&ioc, slow));
    for _ in 0..10 {
        ioc.kick_hosts();
        let to = mac(&ioc, slow);
        from_lan(&mut ioc, &nic, to, 5);
        assert!(
            !woken(host(&ioc, slow)),
            "a blocked host's task is not woken again"
        );
    }
    // Its own task finds the socket still full: it stays blocked and is not woken by the
    // kick that follows (the busy loop of issue 14).
    let WorkerState { hosts, cache, .. } = &mut ioc;
    let h = hosts.get_mut(&slow).unwrap();
    assert!(!h.flush(cache).unwrap());
    ioc.kick_hosts();
    assert!(!woken(host(&ioc, slow)));
    assert!(host(&ioc, slow).blocked);
}

#[test]
fn a_host_socket_that_fills_from_another_path_wakes_its_task() {
    let (mut ioc, nic) = ioc_with("");
    let (slow, mut peer) = connect(&mut ioc, 7, true, 128);
    let _ = woken(host(&ioc, slow));
    let to = mac(&ioc, slow);
    // Enough to fill its 4 KiB socket many times over; not so many that loopback TCP, whose
    // window stays below a segment with such buffers, sends the rest one probe at a time.
    from_lan(&mut ioc, &nic, to, 48);
    assert!(host(&ioc, slow).blocked);
    assert!(woken(host(&ioc, slow)), "told once to wait for writability");
    // Once the host reads again, its task writes everything out and is unblocked.
    for _ in 0..200 {
        pump(&mut ioc, &mut peer, slow, true);
        if !host(&ioc, slow).blocked && host(&ioc, slow).held() == 0 {
            break;
        }
    }
    assert!(!host(&ioc, slow).blocked);
    assert_eq!(host(&ioc, slow).held(), 0);
    assert_eq!(ioc.cache.in_use(), 0);
}

/// Frames the host writes into the IOC's pools: each goes to the NIC or is dropped and
/// counted with its cause.
fn host_sends(ioc: &mut WorkerState, peer: &mut Peer, session: u64, frames: Vec<Vec<u8>>) {
    let mut cache = SendBufCache::new(wire::MAX_SEND_DATA, 64);
    for f in frames {
        let mut b = cache.get().unwrap();
        assert!(b.fill_from(&f));
        let posted = peer.link.post_frame(b);
        assert!(
            matches!(
                posted,
                splitnet_messaging::endpoint::Posted::Rdma
                    | splitnet_messaging::endpoint::Posted::SendData
            ),
            "{posted:?}"
        );
        pump(ioc, peer, session, true);
        peer.link.reclaim(&mut cache);
    }
}

#[test]
fn frames_beyond_what_the_host_negotiated_are_dropped_and_counted() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect(&mut ioc, 3, false, 128);
    let own = mac(&ioc, s);
    let tso = tso_frame(LAN_PEER, own);
    let mut bad_flags = frame(LAN_PEER, own, 100);
    bad_flags[0] = 0x80;
    // The host turns its offloads off (as with lan.offload = false it must).
    peer.link.session_mut().cfg_request(
        CfgCode::SetFeatures,
        &wire::features::VNET_HDR.to_be_bytes(),
    );
    pump(&mut ioc, &mut peer, s, true);
    host_sends(
        &mut ioc,
        &mut peer,
        s,
        vec![
            frame(LAN_PEER, own, 1000),
            frame(LAN_PEER, [0x02, 0x5d, 9, 9, 9, 9], 1000),
            frame(LAN_PEER, own, 1501),
            tso,
            bad_flags,
            frame(LAN_PEER, own, 1500),
        ],
    );
    assert_eq!(
        nic.tx.borrow().len(),
        2,
        "only the two good frames reach the LAN"
    );
    let d = host(&ioc, s).drops;
    assert_eq!(
        (d.spoofed, d.over_mtu, d.not_negotiated, d.bad_offload),
        (1, 1, 1, 1)
    );
    assert_eq!(host(&ioc, s).stats.tx_dropped, 4);
    assert_eq!(host(&ioc, s).stats.tx_frames, 2);
}

#[test]
fn over_shared_memory_frames_are_placed_in_the_peers_pools_both_ways() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm(&mut ioc, 3);
    let own = mac(&ioc, s);
    let mut tso = tso_frame(LAN_PEER, own);
    for (i, b) in tso.iter_mut().enumerate().skip(60) {
        *b = i as u8;
    }
    let small = frame(LAN_PEER, own, 1000);
    let spoofed = frame(LAN_PEER, [0x02, 0x5d, 9, 9, 9, 9], 1000);
    host_sends(
        &mut ioc,
        &mut peer,
        s,
        vec![small.clone(), tso.clone(), spoofed],
    );
    // Placed in the IOC's pools, checked from a private head, sent whole and exact: the
    // small frame through a batch slot, the TSO frame from the pool.
    assert_eq!(*nic.tx.borrow(), vec![small, tso]);
    assert_eq!(host(&ioc, s).drops.spoofed, 1);
    assert_eq!(host(&ioc, s).stats.tx_frames, 2);
    // And the LAN's frames are placed in the host's pools, and arrive exact.
    peer.kept = Some(Vec::new());
    from_lan(&mut ioc, &nic, own, 20);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(peer.frames, 20);
    let kept = peer.kept.take().unwrap();
    assert!(kept.iter().all(|f| *f == frame(own, LAN_PEER, 1400)));
    assert_eq!(ioc.reg.stats().protection_errors, 0);
    assert_eq!(peer.reg.stats().protection_errors, 0);
}

#[test]
fn extra_source_macs_are_allowed() {
    let (mut ioc, nic) = ioc_with("");
    ioc.extra_macs = vec![[0x02, 0x00, 0, 0, 0, 7]];
    let (s, mut peer) = connect(&mut ioc, 3, false, 128);
    host_sends(
        &mut ioc,
        &mut peer,
        s,
        vec![frame(LAN_PEER, [0x02, 0x00, 0, 0, 0, 7], 100)],
    );
    assert_eq!(nic.tx.borrow().len(), 1);
    assert_eq!(host(&ioc, s).drops.spoofed, 0);
}

#[test]
fn sendata_that_belongs_in_a_pool_is_refused_and_counted() {
    let nic = FakeNic::default();
    let mut ioc = WorkerState::new(config(""), Box::new(nic.clone()), 9000, true);
    // This host sends every frame up to 2000 bytes inline.
    let (s, mut peer) = connect(&mut ioc, 3, false, 2000);
    let own = mac(&ioc, s);
    host_sends(
        &mut ioc,
        &mut peer,
        s,
        vec![
            frame(LAN_PEER, own, 900),
            // Written into the IOC's large pool: from now on the host knows it.
            frame(LAN_PEER, own, 3000),
            frame(LAN_PEER, own, 1400),
        ],
    );
    assert_eq!(
        nic.tx.borrow().len(),
        2,
        "the 1400-byte SendData is refused"
    );
    assert_eq!(host(&ioc, s).drops.oversize_inline, 1);
    assert_eq!(host(&ioc, s).stats.tx_dropped, 1);
}

/// Posts `n` frames of `len` bytes from `src` to the LAN and writes them to the IOC's
/// socket, without letting the IOC read them.
fn post_unread(peer: &mut Peer, src: [u8; 6], len: usize, n: usize) {
    let mut cache = SendBufCache::new(wire::MAX_SEND_DATA, 64);
    for _ in 0..n {
        let mut b = cache.get().unwrap();
        assert!(b.fill_from(&frame(LAN_PEER, src, len)));
        assert!(matches!(
            peer.link.post_frame(b),
            splitnet_messaging::endpoint::Posted::Rdma
        ));
    }
    for _ in 0..100 {
        if peer.link.flush().unwrap() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
}

#[test]
fn backlogged_hosts_share_the_worker_by_bytes_not_by_frames() {
    let nic = FakeNic::default();
    let mut ioc = WorkerState::new(config(""), Box::new(nic.clone()), 9000, true);
    let (a, mut pa) = connect(&mut ioc, 3, false, 128);
    let (b, mut pb) = connect(&mut ioc, 4, false, 128);
    let (ma, mb) = (mac(&ioc, a), mac(&ioc, b));
    // A small quantum, so that a few frames show a turn's end.
    for s in [a, b] {
        ioc.hosts.get_mut(&s).unwrap().drr = Deficit::new(20_000);
    }
    // Each frame is its payload, an Ethernet header and a virtio-net header; it costs its
    // host its bytes and FRAME_COST.
    let size = |len: usize| (len + 14 + VNET_HDR_LEN) as u64;
    let cost = |len: usize| (len + 14 + VNET_HDR_LEN + from_host::FRAME_COST) as i64;
    post_unread(&mut pa, ma, 5000, 12);
    post_unread(&mut pb, mb, 500, 8);
    let sent_by = |src: [u8; 6]| -> (usize, u64) {
        let tx = nic.tx.borrow();
        let of: Vec<_> = tx
            .iter()
            .filter(|f| f[VNET_HDR_LEN + 6..][..6] == src)
            .collect();
        (of.len(), of.iter().map(|f| f.len() as u64).sum())
    };
    // A's turn ends once its frames spend the quantum (the frame that overdraws it goes):
    // 4 of its 12, where a budget of frames would have let all 12 go.
    let drained = from_host::drive_host(&mut ioc, a, Lane::Data).unwrap();
    assert!(!drained, "A still has frames");
    assert_eq!(sent_by(ma), (4, 4 * size(5000)));
    assert_eq!(host(&ioc, a).drr.balance(), 20_000 - 4 * cost(5000));
    // B's 8 small frames fit in its quantum: all go, and B is drained.
    let drained = from_host::drive_host(&mut ioc, b, Lane::Data).unwrap();
    assert!(drained);
    assert_eq!(sent_by(mb), (8, 8 * size(500)));
    // A's next turns pay its overdraft first, then go on until it is drained.
    let mut turns = 1;
    loop {
        turns += 1;
        if from_host::drive_host(&mut ioc, a, Lane::Data).unwrap() {
            break;
        }
        assert!(turns < 10, "A never drained");
    }
    assert_eq!(sent_by(ma).0, 12);
    // 26,104 of cost in the first turn, then 3 frames (19,578) a turn while it pays the
    // 6,104 it overdrew, the last 2 in the fourth.
    assert_eq!(turns, 4);
    // A debt carries over a drained turn; credit does not.
    let balance = host(&ioc, a).drr.balance();
    assert!(balance <= 0, "{balance}");
    assert_eq!(host(&ioc, b).drr.balance(), 0);
}

#[test]
fn lan_frames_leave_in_order_in_batches_and_a_refused_one_is_counted() {
    let nic = FakeNic::default();
    let mut ioc = WorkerState::new(config(""), Box::new(nic.clone()), 9000, true);
    let (s, mut peer) = connect(&mut ioc, 3, false, 128);
    let own = mac(&ioc, s);
    // Small frames go into the batch's slots, the 5000-byte one straight to the NIC: the
    // LAN must still see them in the order the host sent them.
    let lens = [100, 1400, 200, 5000, 300, 1500, 400];
    nic.refuse_len.set(Some(frame(LAN_PEER, own, 200).len()));
    let mut cache = SendBufCache::new(wire::MAX_SEND_DATA, 64);
    for &len in &lens {
        let mut b = cache.get().unwrap();
        assert!(b.fill_from(&frame(LAN_PEER, own, len)));
        peer.link.post_frame(b);
    }
    let sends = nic.sends.get();
    pump(&mut ioc, &mut peer, s, true);
    let sent: Vec<usize> = nic
        .tx
        .borrow()
        .iter()
        .map(|f| f.len() - VNET_HDR_LEN - 14)
        .collect();
    assert_eq!(sent, [100, 1400, 5000, 300, 1500, 400]);
    assert!(
        nic.sends.get() - sends < lens.len(),
        "frames written together share system calls"
    );
    let h = host(&ioc, s);
    assert_eq!(
        (h.stats.tx_frames, h.drops.nic, h.stats.tx_dropped),
        (6, 1, 1)
    );
    assert_eq!((ioc.stats.lan_tx, ioc.stats.lan_tx_errors), (6, 1));
}

#[test]
fn receive_ring_overflows_the_nic_reports_are_counted_once() {
    let (mut ioc, nic) = ioc_with("");
    nic.drops.set(5);
    from_lan::count_nic_drops(&mut ioc);
    from_lan::count_nic_drops(&mut ioc);
    assert_eq!(ioc.stats.lan_rx_dropped, 5, "taken from the NIC once");
    nic.drops.set(2);
    from_lan::count_nic_drops(&mut ioc);
    assert!(ioc
        .metrics_text()
        .contains("\nsplitnet_ioc_lan_rx_dropped_total 7\n"));
}

#[test]
fn set_mac_follows_the_policy() {
    let (mut ioc, _nic) = ioc_with("");
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    let (b, _pb) = connect(&mut ioc, 2, false, 128);
    let taken = mac(&ioc, b);
    for (want, ok) in [
        ([0x02, 0x77, 0, 0, 0, 1], false), // outside mac_base's prefix
        (taken, false),                    // another host's
        ([0x03, 0x5d, 0, 0, 0, 1], false), // a group address
        ([0x02, 0x5d, 0, 0, 0, 1], true),
    ] {
        pa.link.session_mut().cfg_request(CfgCode::SetMac, &want);
        pump(&mut ioc, &mut pa, a, true);
        assert_eq!(mac(&ioc, a) == want, ok, "{want:02x?}");
    }
}

/// Frames the LAN sends to `to`: how many reached host `session`, and how many the IOC
/// filtered as for no host.
fn lan_to(
    ioc: &mut WorkerState,
    nic: &FakeNic,
    peer: &mut Peer,
    session: u64,
    to: [u8; 6],
) -> (u64, u64) {
    let (got, filtered) = (peer.frames, ioc.stats.lan_filtered);
    from_lan(ioc, nic, to, 3);
    pump(ioc, peer, session, true);
    (peer.frames - got, ioc.stats.lan_filtered - filtered)
}

#[test]
fn the_mac_table_follows_set_mac_and_session_ends() {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    let (b, mut pb) = connect(&mut ioc, 2, false, 128);
    let (old, mac_b) = (mac(&ioc, a), mac(&ioc, b));
    assert_eq!(lan_to(&mut ioc, &nic, &mut pa, a, old), (3, 0));
    let new = [0x02, 0x5d, 0, 0, 0, 9];
    pa.link.session_mut().cfg_request(CfgCode::SetMac, &new);
    pump(&mut ioc, &mut pa, a, true);
    assert_eq!(mac(&ioc, a), new);
    assert_eq!(
        lan_to(&mut ioc, &nic, &mut pa, a, new),
        (3, 0),
        "the new MAC reaches A"
    );
    assert_eq!(
        lan_to(&mut ioc, &nic, &mut pa, a, old),
        (0, 3),
        "the old one nobody"
    );
    // The old MAC is free again: B may take it.
    pb.link.session_mut().cfg_request(CfgCode::SetMac, &old);
    pump(&mut ioc, &mut pb, b, true);
    assert_eq!(mac(&ioc, b), old);
    assert_eq!(lan_to(&mut ioc, &nic, &mut pb, b, old), (3, 0));
    assert_eq!(lan_to(&mut ioc, &nic, &mut pb, b, mac_b), (0, 3));
    ioc.remove_host(a, "test", None);
    assert_eq!(
        lan_to(&mut ioc, &nic, &mut pb, b, new),
        (0, 3),
        "A's MAC left with it"
    );
    assert_eq!(ioc.by_mac.len(), 1);
    assert_eq!(ioc.by_mac.get(&old), Some(&b));
}

#[test]
fn session_ids_are_not_reused_and_tokens_differ() {
    let (mut ioc, _nic) = ioc_with("");
    let (s1, t1) = ioc.new_session();
    let (s2, t2) = ioc.new_session();
    assert!(s2 > s1);
    assert_ne!(t1, t2);
    assert_ne!(t1, s1);
}

#[test]
fn quotas_leave_the_lan_a_buffer_whatever_the_hosts_hold() {
    for max in [1, 2, 8, 16, 64] {
        let p = crate::state::buffer_plan(max);
        let (n, full) = (max as usize, wire::MAX_SEND_DATA);
        assert!(p.quota >= 8 * full);
        // Every session at its quota in full-size buffers leaves the LAN one, and each may
        // hold all its quota in small ones.
        assert!(p.buffers > p.quota / full * n, "max_hosts {max}");
        assert!(p.small >= p.quota / SMALL_BUFFER * n, "max_hosts {max}");
    }
}

/// Two workers, each with its NIC socket and its inbox.
fn two_workers() -> Vec<(WorkerState, FakeNic, crate::shard::InboxRx)> {
    crate::shard::Shard::set(2)
        .into_iter()
        .map(|(shard, inbox)| {
            let nic = FakeNic::default();
            let ioc = WorkerState::worker(config(""), Box::new(nic.clone()), 1500, true, shard);
            (ioc, nic, inbox)
        })
        .collect()
}

#[test]
fn frames_cross_to_the_worker_of_their_host_and_never_back_to_the_lan() {
    let mut w = two_workers();
    let (a, mut pa) = connect(&mut w[0].0, 1, false, 128);
    let (b, mut pb) = connect(&mut w[1].0, 2, false, 128);
    let (mac_a, mac_b) = (mac(&w[0].0, a), mac(&w[1].0, b));
    // Each worker's MAC is steered to its socket.
    let mut want = vec![(mac_a, 0), (mac_b, 1)];
    want.sort();
    assert_eq!(*w[1].1.steering.borrow(), want);
    // LAN frames for B that reached worker 0's socket cross to worker 1.
    let nic0 = w[0].1.clone();
    from_lan(&mut w[0].0, &nic0, mac_b, 3);
    assert_eq!(w[0].0.stats.crossed_out, 3);
    let crossed = w[1].2.take();
    assert_eq!(crossed.len(), 3);
    from_lan::deliver_crossed(&mut w[1].0, &crossed);
    pump(&mut w[1].0, &mut pb, b, true);
    assert_eq!(pb.frames, 3, "B got the LAN's frames");
    // A's unicast to B crosses; its broadcast goes to the LAN once and crosses once.
    let to_b = frame(mac_b, mac_a, 200);
    let bcast = frame([0xff; 6], mac_a, 200);
    host_sends(&mut w[0].0, &mut pa, a, vec![to_b.clone(), bcast.clone()]);
    assert_eq!(
        *w[0].1.tx.borrow(),
        vec![bcast.clone()],
        "only the broadcast left"
    );
    assert_eq!(host(&w[0].0, a).stats.tx_frames, 2);
    let crossed = w[1].2.take();
    assert_eq!(crossed, vec![to_b, bcast]);
    from_lan::deliver_crossed(&mut w[1].0, &crossed);
    pump(&mut w[1].0, &mut pb, b, true);
    assert_eq!(pb.frames, 5, "B got A's two frames");
    assert!(
        w[1].1.tx.borrow().is_empty(),
        "nothing crossed went to the LAN again"
    );
    assert_eq!(w[1].0.stats.crossed_in, 5);
    // B's MAC is worker 1's: A may not take it; once B leaves it is free.
    pa.link.session_mut().cfg_request(CfgCode::SetMac, &mac_b);
    pump(&mut w[0].0, &mut pa, a, true);
    assert_eq!(mac(&w[0].0, a), mac_a);
    // A frame for B read by worker 0 just before B leaves crosses to a worker where B is gone:
    // a frame for no host, counted there.
    from_lan(&mut w[0].0, &nic0, mac_b, 1);
    let late = w[1].2.take();
    w[1].0.remove_host(b, "test", None);
    let filtered = w[1].0.stats.lan_filtered;
    from_lan::deliver_crossed(&mut w[1].0, &late);
    assert_eq!(w[1].0.stats.lan_filtered, filtered + 1);
    assert_eq!(*w[0].1.steering.borrow(), vec![(mac_a, 0)]);
    pa.link.session_mut().cfg_request(CfgCode::SetMac, &mac_b);
    pump(&mut w[0].0, &mut pa, a, true);
    assert_eq!(mac(&w[0].0, a), mac_b);
    // A LAN frame for nobody is filtered on the worker that read it, and crosses nowhere.
    from_lan(&mut w[0].0, &nic0, [0x02, 9, 9, 9, 9, 9], 2);
    assert_eq!(w[0].0.stats.lan_filtered, 2);
    assert!(w[1].2.take().is_empty());
}

#[test]
fn a_full_inbox_drops_and_counts_and_admission_spans_the_workers() {
    let mut w = two_workers();
    let (_b, _pb) = connect(&mut w[1].0, 2, false, 128);
    let mac_b = w[1].0.hosts.values().next().map(|h| h.mac).unwrap();
    let nic0 = w[0].1.clone();
    // 64 KiB frames: the inbox holds INBOX_BYTES of them, nobody reads it.
    let big = frame(mac_b, LAN_PEER, 60_000);
    let n = crate::shard::INBOX_BYTES / big.len() + 5;
    for _ in 0..n {
        nic0.rx.borrow_mut().push_back(big.clone());
        from_lan::drive_lan(&mut w[0].0, 0);
    }
    let s = w[0].0.stats;
    assert_eq!(s.crossed_out + s.cross_dropped, n as u64);
    assert!(s.cross_dropped >= 5, "{s:?}");
    assert_eq!(
        w[0].0.cache.in_use(),
        0,
        "no buffer waits for the other worker"
    );
    // max_hosts counts the sessions of both workers.
    let max = w[0].0.cfg.fabric.max_hosts as usize;
    let admitted = (0..max).filter(|_| w[0].0.shard.admit(max)).count();
    assert_eq!(admitted, max - 1, "worker 1's host holds one place");
}

#[test]
fn a_frame_for_no_host_reaches_the_promiscuous_hosts_of_every_worker() {
    let mut w = two_workers();
    let (a, mut pa) = connect(&mut w[0].0, 1, false, 128);
    let (b, mut pb) = connect(&mut w[1].0, 2, false, 128);
    for (i, (s, p)) in [(a, &mut pa), (b, &mut pb)].into_iter().enumerate() {
        p.link.session_mut().cfg_request(CfgCode::SetPromisc, &[1]);
        pump(&mut w[i].0, p, s, true);
        assert!(host(&w[i].0, s).promisc);
    }
    // Read by worker 0: its own promiscuous host gets it, and worker 1's through the inbox.
    let nic0 = w[0].1.clone();
    from_lan(&mut w[0].0, &nic0, [0x02, 9, 9, 9, 9, 9], 2);
    pump(&mut w[0].0, &mut pa, a, true);
    assert_eq!(pa.frames, 2, "worker 0's promiscuous host");
    let crossed = w[1].2.take();
    assert_eq!(crossed.len(), 2);
    from_lan::deliver_crossed(&mut w[1].0, &crossed);
    pump(&mut w[1].0, &mut pb, b, true);
    assert_eq!(pb.frames, 2, "worker 1's promiscuous host");
    assert_eq!(w[0].0.stats.lan_filtered, 0);
}

/// Host pools with elements large enough for any frame of the NIC's, besides small ones.
fn large_pools() -> SessionConfig {
    let mut c = host_config(128);
    c.advertise.push(PoolSpec {
        element_size: 65_600,
        element_count: 64,
    });
    c
}

#[test]
fn over_shared_memory_a_hosts_lan_frames_are_read_straight_into_its_pools() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm_with(&mut ioc, 3, large_pools());
    let own = mac(&ioc, s);
    // Its frames leave the general socket for a queue of its own, first.
    assert_eq!(*nic.excluded.lock().unwrap(), vec![own]);
    let queue = nic.host_queue(own).expect("the host's own queue");
    let mut tso = tso_frame(own, LAN_PEER);
    for (i, b) in tso.iter_mut().enumerate().skip(60) {
        *b = i as u8;
    }
    let small = frame(own, LAN_PEER, 200);
    let mut sent = Vec::new();
    for i in 0..60 {
        let f = if i % 2 == 0 {
            small.clone()
        } else {
            tso.clone()
        };
        nic.arrive(f.clone());
        sent.push(f);
    }
    assert!(nic.rx.borrow().is_empty());
    // Before the host reads, 3/4 of its 64 large elements take frames; then the queue
    // waits for credit, keeping the rest (the last quarter stays for the general path).
    peer.kept = Some(Vec::new());
    assert_eq!(
        from_lan::read_own_queue(&mut ioc, s),
        OwnQueueProgress::Starved
    );
    assert!(host(&ioc, s).own_queue.as_ref().unwrap().starved);
    assert_eq!(queue.frames.borrow().len(), 12);
    // It reads and gives credit back: the rest follows, every frame exact and in order.
    for _ in 0..5 {
        pump(&mut ioc, &mut peer, s, true);
        from_lan::read_own_queue(&mut ioc, s);
    }
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(
        from_lan::read_own_queue(&mut ioc, s),
        OwnQueueProgress::Drained
    );
    assert!(queue.frames.borrow().is_empty());
    assert_eq!(peer.kept.as_ref().unwrap(), &sent);
    let h = host(&ioc, s);
    assert_eq!(h.stats.rx_frames, 60);
    assert_eq!(h.stats.rx_dropped, 0);
    assert_eq!(h.link.as_ref().unwrap().stats().tx_in_place, 60);
    assert_eq!(ioc.stats.lan_rx, 60);
    assert_eq!(ioc.cache.in_use(), 0, "no send buffer was used");
    // Frames few enough for SendData (acknowledgements) go inline, costing no element.
    let credits = host(&ioc, s)
        .link
        .as_ref()
        .unwrap()
        .session()
        .initiator()
        .credits();
    for _ in 0..5 {
        nic.arrive(frame(own, LAN_PEER, 50));
    }
    assert_eq!(
        from_lan::read_own_queue(&mut ioc, s),
        OwnQueueProgress::Drained
    );
    let link = host(&ioc, s).link.as_ref().unwrap();
    assert_eq!(link.session().initiator().credits(), credits);
    assert_eq!(link.stats().tx_inline, 5);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(peer.kept.as_ref().unwrap().len(), 65);
    // Its queue's overflows are its own drops.
    queue.drops.set(7);
    from_lan::count_nic_drops(&mut ioc);
    assert_eq!(host(&ioc, s).drops.ring_full, 7);
    assert_eq!(ioc.reg.stats().protection_errors, 0);
    assert_eq!(peer.reg.stats().protection_errors, 0);
    assert_eq!(nic.violations.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn a_hosts_own_queue_follows_its_mac_and_closes_with_its_session() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm_with(&mut ioc, 3, large_pools());
    let (t, _tcp) = connect(&mut ioc, 4, false, 128);
    let old = mac(&ioc, s);
    // A host over TCP has none.
    assert!(nic.host_queue(mac(&ioc, t)).is_none());
    let new = [0x02, 0x5d, 0, 0, 0, 9];
    peer.link.session_mut().cfg_request(CfgCode::SetMac, &new);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(mac(&ioc, s), new);
    assert!(
        nic.host_queue(old).is_none(),
        "the old MAC's queue is closed"
    );
    assert!(nic.host_queue(new).is_some());
    assert_eq!(*nic.excluded.lock().unwrap(), vec![new]);
    // The old MAC's frames reach the general socket again, and nobody.
    nic.arrive(frame(old, LAN_PEER, 100));
    assert_eq!(nic.rx.borrow().len(), 1);
    ioc.remove_host(s, "test", None);
    assert!(nic.host_queue(new).is_none());
    assert!(nic.excluded.lock().unwrap().is_empty());
    assert_eq!(nic.violations.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn a_host_whose_pools_cannot_always_lend_an_element_for_a_nic_frame_keeps_the_general_path() {
    let (mut ioc, nic) = ioc_with("");
    // Elements of 2,048 bytes only; or one large element, which the quarter kept for the
    // general path leaves out.
    let mut one_large = host_config(128);
    one_large.advertise.push(PoolSpec {
        element_size: 65_600,
        element_count: 1,
    });
    for (node, config) in [(3, host_config(128)), (4, one_large)] {
        let (s, mut peer) = connect_shm_with(&mut ioc, node, config);
        let own = mac(&ioc, s);
        assert!(nic.host_queue(own).is_none());
        assert_eq!(lan_to(&mut ioc, &nic, &mut peer, s, own), (3, 0));
    }
    assert!(nic.excluded.lock().unwrap().is_empty());
}

#[test]
fn a_closing_queue_counts_what_it_held_and_frames_it_cannot_deliver_are_counted() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm_with(&mut ioc, 3, large_pools());
    let own = mac(&ioc, s);
    let queue = nic.host_queue(own).expect("the host's own queue");
    // A frame the kernel cannot hand over (an empty one here), after another and before
    // two more in the same batch: counted, and every other frame read.
    let good = frame(own, LAN_PEER, 100);
    let mut bad_flags = frame(own, LAN_PEER, 100);
    bad_flags[0] = 0x80;
    let mut too_large = frame(own, LAN_PEER, 70_000);
    too_large[0] = 0;
    for f in [
        good.clone(),
        Vec::new(),
        good.clone(),
        bad_flags,
        too_large,
        good.clone(),
    ] {
        queue.frames.borrow_mut().push_back(f);
    }
    let lan_rx = ioc.stats.lan_rx;
    assert_eq!(
        from_lan::read_own_queue(&mut ioc, s),
        OwnQueueProgress::Drained
    );
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(peer.frames, 3);
    let h = host(&ioc, s);
    assert_eq!((h.drops.unreadable, h.drops.too_large), (1, 1));
    assert_eq!(ioc.stats.lan_rx_unreadable, 1, "in the IOC's count too");
    assert_eq!(
        ioc.stats.lan_rx_bad_frame, 1,
        "the header the check refused"
    );
    assert_eq!(h.stats.rx_frames, 3);
    assert_eq!(
        ioc.stats.lan_rx,
        lan_rx + 6,
        "the header the check refused too"
    );
    // Frames waiting when the queue closes, and its overflows, are counted as dropped.
    for _ in 0..3 {
        nic.arrive(good.clone());
    }
    queue.drops.set(2);
    let (lan_rx, lan_dropped) = (ioc.stats.lan_rx, ioc.stats.lan_rx_dropped);
    ioc.close_own_queue(s);
    assert!(queue.shut.get() && queue.frames.borrow().is_empty());
    assert!(nic.host_queue(own).is_none());
    let d = host(&ioc, s).drops;
    assert_eq!(
        (d.lost_at_close, d.ring_full),
        (3, 2),
        "waiting: lost at close"
    );
    assert_eq!(ioc.stats.lan_rx, lan_rx + 3);
    assert_eq!(ioc.stats.lan_rx_dropped, lan_dropped + 2);
    // Placing it again (as credits do) reopens it; a SetMac to the MAC it has keeps it.
    ioc.open_own_queue(s);
    let queue = nic.host_queue(own).expect("reopened");
    nic.arrive(good.clone());
    peer.link.session_mut().cfg_request(CfgCode::SetMac, &own);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(queue.frames.borrow().len(), 1, "nothing discarded");
    assert!(nic.host_queue(own).is_some());
    assert_eq!(nic.violations.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn every_worker_excludes_a_placed_mac_and_a_worker_that_cannot_keeps_it_general() {
    let mut w = two_workers();
    let excluded = |w: &[(WorkerState, FakeNic, crate::shard::InboxRx)], i: usize| {
        w[i].1.excluded.lock().unwrap().clone()
    };
    let (s, _peer) = connect_shm_with(&mut w[1].0, 3, large_pools());
    let own = mac(&w[1].0, s);
    assert_eq!(excluded(&w, 0), vec![own]);
    assert_eq!(excluded(&w, 1), vec![own]);
    w[1].0.remove_host(s, "test", None);
    assert!(excluded(&w, 0).is_empty() && excluded(&w, 1).is_empty());
    // An IOC whose workers have not all said how to exclude places nothing...
    let mut shards = crate::shard::Shard::set(2).into_iter();
    let shard = shards.next().expect("two shards").0;
    let nic = FakeNic::default();
    let mut ioc = WorkerState::worker(config(""), Box::new(nic.clone()), 1500, true, shard);
    let before = Instant::now();
    let (s, _peer) = connect_shm_with(&mut ioc, 3, large_pools());
    let own = mac(&ioc, s);
    assert!(nic.host_queue(own).is_none());
    assert!(nic.excluded.lock().unwrap().is_empty());
    let due = host(&ioc, s).own_queue_retry.expect("a retry is due").at;
    assert!(due >= before + OWN_QUEUE_RETRY);
    // ...and tries again, when its time has come, once the other worker excludes too.
    let (shard, _inbox) = shards.next().expect("two shards");
    let other = FakeNic::default();
    let _worker = WorkerState::worker(config(""), Box::new(other.clone()), 1500, true, shard);
    retry_at(&mut ioc, s, Instant::now() + Duration::from_secs(3600));
    ioc.open_own_queue(s);
    assert!(nic.host_queue(own).is_none(), "tried before its time");
    retry_at(&mut ioc, s, Instant::now());
    ioc.open_own_queue(s);
    assert!(
        nic.host_queue(own).is_some(),
        "placed once every worker excludes"
    );
    assert_eq!(*other.excluded.lock().unwrap(), vec![own]);
    assert_eq!(host(&ioc, s).own_queue_retry, None);
}

/// Moves host `s`'s next try at its own queue to `at`.
fn retry_at(ioc: &mut WorkerState, s: u64, at: Instant) {
    let h = ioc.hosts.get_mut(&s).expect("host");
    h.own_queue_retry.as_mut().expect("a retry").at = at;
}

#[test]
fn a_host_whose_queue_cannot_be_opened_keeps_the_general_path_and_tries_again_less_often() {
    let (mut ioc, nic) = ioc_with("");
    nic.refuse_host_rx.set(true);
    let before = Instant::now();
    let (s, mut peer) = connect_shm_with(&mut ioc, 3, large_pools());
    let own = mac(&ioc, s);
    // Its frames stay with the general socket, which takes them again at once.
    assert!(nic.host_queue(own).is_none());
    assert!(nic.excluded.lock().unwrap().is_empty());
    let first = host(&ioc, s).own_queue_retry.expect("a retry");
    assert_eq!(first.wait, OWN_QUEUE_RETRY);
    assert!(first.at >= before + OWN_QUEUE_RETRY);
    from_lan(&mut ioc, &nic, own, 4);
    pump(&mut ioc, &mut peer, s, true);
    assert_eq!(peer.frames, 4, "the general path delivers");
    assert_eq!(
        host(&ioc, s).own_queue_retry,
        Some(first),
        "credits before its time"
    );
    // Its time come, the credits its reads give back try again; refused, it waits longer
    // each time, up to OWN_QUEUE_RETRY_MAX.
    let mut waits = Vec::new();
    for _ in 0..7 {
        retry_at(&mut ioc, s, Instant::now());
        from_lan(&mut ioc, &nic, own, 4);
        pump(&mut ioc, &mut peer, s, true);
        waits.push(
            host(&ioc, s)
                .own_queue_retry
                .expect("a retry")
                .wait
                .as_secs(),
        );
    }
    assert_eq!(waits, [2, 4, 8, 16, 32, 64, 64]);
    assert_eq!(OWN_QUEUE_RETRY_MAX.as_secs(), 64);
    assert_eq!(peer.frames, 32);
    assert!(nic.excluded.lock().unwrap().is_empty());
    // Once the socket can be had, the next credits place it.
    nic.refuse_host_rx.set(false);
    retry_at(&mut ioc, s, Instant::now());
    from_lan(&mut ioc, &nic, own, 4);
    pump(&mut ioc, &mut peer, s, true);
    assert!(nic.host_queue(own).is_some(), "placed");
    assert_eq!(host(&ioc, s).own_queue_retry, None);
    assert_eq!(*nic.excluded.lock().unwrap(), vec![own]);
    nic.arrive(frame(own, LAN_PEER, 1400));
    assert!(
        nic.rx.borrow().is_empty(),
        "the host's frames reach its own queue"
    );
    assert_eq!(nic.violations.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn a_nic_frame_the_kernel_cannot_hand_over_is_counted_and_the_frames_behind_it_are_read() {
    // The failed frame first in a batch, then in the middle of one.
    for (at, want) in [
        (
            0,
            vec![
                LanProgress::Budget,
                LanProgress::Budget,
                LanProgress::Drained,
            ],
        ),
        (
            1,
            vec![
                LanProgress::Budget,
                LanProgress::Budget,
                LanProgress::Budget,
                LanProgress::Drained,
            ],
        ),
    ] {
        let (mut ioc, nic) = ioc_with("");
        let (s, mut peer) = connect(&mut ioc, 1, false, 128);
        let own = mac(&ioc, s);
        for _ in 0..4 {
            nic.rx.borrow_mut().push_back(frame(own, LAN_PEER, 1400));
        }
        nic.unreadable_after.set(Some(at));
        let lan_rx = ioc.stats.lan_rx;
        // Neither a failed read nor a short batch says the socket is empty: the worker
        // reads on until one does.
        let mut got = Vec::new();
        while got.last() != Some(&LanProgress::Drained) && got.len() < 8 {
            got.push(from_lan::drive_lan(&mut ioc, 0));
        }
        assert_eq!(got, want, "the failed frame at {at}");
        assert!(nic.rx.borrow().is_empty());
        assert_eq!(ioc.stats.lan_rx_unreadable, 1);
        pump(&mut ioc, &mut peer, s, true);
        assert_eq!(peer.frames, 3, "the frames around it");
        assert_eq!(
            ioc.stats.lan_rx,
            lan_rx + 4,
            "the lost frame counted as read"
        );
        assert!(ioc
            .metrics_text()
            .contains("splitnet_ioc_lan_rx_unreadable_total 1"));
    }
}

/// The CfgUtil replies `peer` received since the last call, by status.
fn cfg_replies(peer: &mut Peer) -> Vec<(CfgCode, ErrorCode)> {
    let replies = peer
        .events
        .iter()
        .filter_map(|e| match e {
            LinkEvent::CfgReply { code, status, .. } => Some((*code, *status)),
            _ => None,
        })
        .collect();
    peer.events.clear();
    replies
}

/// Issue 27, item 3: a host that floods SetMulticast with alternating lists of 64 groups is
/// answered Busy beyond its rate, so the NIC's memberships change only for the few that
/// pass; a list beyond 64 groups is refused; the other host's requests are answered as
/// ever.
#[test]
fn a_set_multicast_storm_costs_the_nic_only_what_the_hosts_rate_allows() {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    let (b, mut pb) = connect(&mut ioc, 2, false, 128);
    pump(&mut ioc, &mut pa, a, true);
    pump(&mut ioc, &mut pb, b, true);
    cfg_replies(&mut pa);
    cfg_replies(&mut pb);
    let list = |k: u8| -> Vec<u8> {
        (0..64u8)
            .flat_map(|i| [0x01, 0x00, 0x5e, k, 0, i])
            .collect()
    };
    let before = nic.memberships.get();
    for n in 0..200u8 {
        pa.link
            .session_mut()
            .cfg_request(CfgCode::SetMulticast, &list(n % 2));
    }
    pump(&mut ioc, &mut pa, a, true);
    let replies = cfg_replies(&mut pa);
    let ok = replies.iter().filter(|r| r.1 == ErrorCode::Ok).count();
    let busy = replies.iter().filter(|r| r.1 == ErrorCode::Busy).count();
    assert_eq!(replies.len(), 200, "every request answered");
    assert!(ok <= CFG_COSTLY_RATE.1 as usize + 2, "{ok} applied");
    assert_eq!(ok + busy, 200);
    assert_eq!(ioc.stats.cfg_rate_limited, busy as u64);
    // Each applied list swaps 64 groups for 64 others: two memberships per group.
    assert!(
        nic.memberships.get() - before <= ok as u64 * 128,
        "{} memberships",
        nic.memberships.get() - before
    );
    // The other host is answered as ever.
    pb.link.session_mut().cfg_request(CfgCode::GetStats, &[]);
    pump(&mut ioc, &mut pb, b, true);
    assert_eq!(
        cfg_replies(&mut pb),
        vec![(CfgCode::GetStats, ErrorCode::Ok)]
    );
    // A list of more groups than the IOC keeps for a host: the host takes every multicast
    // frame instead, and the NIC joins none of them for it.
    let (c, mut pc) = connect(&mut ioc, 3, false, 128);
    pump(&mut ioc, &mut pc, c, true);
    cfg_replies(&mut pc);
    let long: Vec<u8> = (0..65u8)
        .flat_map(|i| [0x01, 0x00, 0x5e, 9, 0, i])
        .collect();
    let before = nic.memberships.get();
    pc.link
        .session_mut()
        .cfg_request(CfgCode::SetMulticast, &long);
    pump(&mut ioc, &mut pc, c, true);
    assert_eq!(
        cfg_replies(&mut pc),
        vec![(CfgCode::SetMulticast, ErrorCode::Ok)]
    );
    assert!(host(&ioc, c).allmulti_overflow && host(&ioc, c).multicast.is_empty());
    assert_eq!(
        nic.memberships.get(),
        before,
        "no membership for an overflowing list"
    );
}

/// Frames each of `peers` (with their sessions) gets when one frame to `to` comes from the LAN.
fn from_lan_to_each(
    ioc: &mut WorkerState,
    nic: &FakeNic,
    peers: &mut [(&mut Peer, u64)],
    to: [u8; 6],
) -> Vec<u64> {
    from_lan(ioc, nic, to, 1);
    peers
        .iter_mut()
        .map(|(p, s)| {
            let before = p.frames;
            pump(ioc, p, *s, true);
            p.frames - before
        })
        .collect()
}

/// Multicast frames reach the hosts that joined their group (or take every one: all-multicast
/// mode, promiscuous), broadcast frames every host; a host's own multicast reaches the others
/// on the same terms.
#[test]
fn multicast_reaches_only_the_hosts_that_joined() {
    let (mut ioc, nic) = ioc_with("");
    let group = [0x01, 0x00, 0x5e, 0, 0, 0xfb];
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    let (b, mut pb) = connect(&mut ioc, 2, false, 128);
    let (c, mut pc) = connect(&mut ioc, 3, false, 128);
    pa.link
        .session_mut()
        .cfg_request(CfgCode::SetMulticast, &group);
    pump(&mut ioc, &mut pa, a, true);
    let each = |ioc: &mut WorkerState, pa: &mut Peer, pb: &mut Peer, pc: &mut Peer, to| {
        from_lan_to_each(ioc, &nic, &mut [(pa, a), (pb, b), (pc, c)], to)
    };
    assert_eq!(
        each(&mut ioc, &mut pa, &mut pb, &mut pc, group),
        [1, 0, 0],
        "only A joined"
    );
    assert_eq!(
        each(&mut ioc, &mut pa, &mut pb, &mut pc, [0xff; 6]),
        [1, 1, 1],
        "broadcast"
    );
    let nobody = [0x01, 0x00, 0x5e, 0, 0, 9];
    assert_eq!(
        each(&mut ioc, &mut pa, &mut pb, &mut pc, nobody),
        [0, 0, 0],
        "a group nobody joined"
    );
    // B in all-multicast mode (SetPromisc 2) gets every group.
    pb.link.session_mut().cfg_request(CfgCode::SetPromisc, &[2]);
    pump(&mut ioc, &mut pb, b, true);
    assert!(host(&ioc, b).allmulti && !host(&ioc, b).promisc);
    assert_eq!(each(&mut ioc, &mut pa, &mut pb, &mut pc, group), [1, 1, 0]);
    // C's own multicast reaches A (joined) and B (all-multicast) only.
    let (fa, fb) = (pa.frames, pb.frames);
    let src = mac(&ioc, c);
    host_sends(&mut ioc, &mut pc, c, vec![frame(group, src, 100)]);
    pump(&mut ioc, &mut pa, a, true);
    pump(&mut ioc, &mut pb, b, true);
    assert_eq!((pa.frames - fa, pb.frames - fb), (1, 1));
}

/// Issue 27, item 3: a SetMac the policy refuses, or for another host's MAC, leaves the
/// host's own LAN queue open (it used to be closed and reopened, refiltering every
/// worker's socket, for every request).
#[test]
fn a_refused_set_mac_leaves_the_hosts_own_queue_alone() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect_shm_with(&mut ioc, 3, large_pools());
    let (b, _pb) = connect(&mut ioc, 4, false, 128);
    let own = mac(&ioc, s);
    let q = nic.host_queue(own).expect("the host has its own queue");
    for bad in [[0x02, 0x77, 0, 0, 0, 1], mac(&ioc, b)] {
        peer.link.session_mut().cfg_request(CfgCode::SetMac, &bad);
        pump(&mut ioc, &mut peer, s, true);
        assert_eq!(mac(&ioc, s), own);
    }
    let now = nic.host_queue(own).expect("still open");
    assert!(
        Rc::ptr_eq(&q, &now) && !q.shut.get(),
        "the same queue, never shut"
    );
}

/// Issue 27, item 4: storm control. A host's broadcast frames beyond its rate (here 1 a
/// second, 2 at once) are dropped and counted against it; the LAN and the other host get
/// only those within it.
#[test]
fn a_hosts_broadcast_storm_is_cut_to_its_rate_and_counted() {
    let nic = FakeNic::default();
    let mut cfg = config("");
    cfg.lan.storm_control_pps = 1;
    let mut ioc = WorkerState::new(cfg, Box::new(nic.clone()), 1500, true);
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    let (b, mut pb) = connect(&mut ioc, 2, false, 128);
    pump(&mut ioc, &mut pb, b, true);
    let start = Instant::now();
    let storm: Vec<Vec<u8>> = (0..40)
        .map(|_| frame([0xff; 6], mac(&ioc, a), 200))
        .collect();
    host_sends(&mut ioc, &mut pa, a, storm);
    pump(&mut ioc, &mut pb, b, true);
    // At most the burst and what the rate refilled while the test ran.
    let allowed = 2 + start.elapsed().as_secs() + 1;
    let to_lan = nic.tx.borrow().len() as u64;
    assert!(to_lan <= allowed, "{to_lan} of 40 reached the LAN");
    assert_eq!(pb.frames, to_lan, "host B got what the LAN got");
    assert_eq!(host(&ioc, a).drops.storm, 40 - to_lan);
    assert_eq!(host(&ioc, a).stats.tx_dropped, 40 - to_lan);
}

/// Issue 27, item 5: a promiscuous host gets the LAN's frames for nobody, never those for
/// the IOC machine's own address.
#[test]
fn a_promiscuous_host_never_gets_the_ioc_machines_own_frames() {
    let (mut ioc, nic) = ioc_with("");
    let own_nic = [0x02, 0x99, 0, 0, 0, 1];
    ioc.nic_mac = Some(own_nic);
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    pa.link.session_mut().cfg_request(CfgCode::SetPromisc, &[1]);
    pump(&mut ioc, &mut pa, a, true);
    assert!(host(&ioc, a).promisc);
    assert_eq!(
        lan_to(&mut ioc, &nic, &mut pa, a, [0x02, 0x42, 0, 0, 0, 7]),
        (3, 0),
        "frames for nobody reach the promiscuous host"
    );
    assert_eq!(
        lan_to(&mut ioc, &nic, &mut pa, a, own_nic),
        (0, 3),
        "the IOC machine's own frames reach no host"
    );
}

/// Issue 30: a LAN frame longer than a send buffer (a GRO frame beyond 64 KiB) is cut by the
/// read: it is counted and dropped, never forwarded as if whole; the next one arrives.
#[test]
fn a_lan_frame_cut_by_the_read_is_counted_and_dropped() {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    let own = mac(&ioc, a);
    nic.rx
        .borrow_mut()
        .push_back(frame(own, LAN_PEER, wire::MAX_SEND_DATA + 100));
    from_lan::drive_lan(&mut ioc, 0);
    assert_eq!(ioc.stats.lan_rx_truncated, 1);
    assert_eq!(lan_to(&mut ioc, &nic, &mut pa, a, own), (3, 0));
    assert_eq!(pa.frames, 3, "only the whole frames reached the host");
    assert!(ioc
        .metrics_text()
        .contains("\nsplitnet_ioc_lan_rx_truncated_total 1\n"));
}

/// Issue 30: a TSO frame whose segments exceed the MTU by their headers alone (gso_size equal
/// to the MTU) is dropped as over the MTU; one whose segments fit it passes.
#[test]
fn a_tso_frame_is_held_to_the_mtu_with_its_headers() {
    let (mut ioc, nic) = ioc_with("");
    let (s, mut peer) = connect(&mut ioc, 3, false, 128);
    let own = mac(&ioc, s);
    let tso = |gso_size: u16| {
        let mut f = tso_frame(LAN_PEER, own);
        let h = VnetHdr {
            gso_size,
            ..VnetHdr::parse(f[..VNET_HDR_LEN].try_into().unwrap())
        };
        f[..VNET_HDR_LEN].copy_from_slice(&h.emit());
        f
    };
    host_sends(&mut ioc, &mut peer, s, vec![tso(1500), tso(1460)]);
    assert_eq!(
        nic.tx.borrow().len(),
        1,
        "the segments of 20 + 20 + 1460 bytes only"
    );
    assert_eq!(host(&ioc, s).drops.over_mtu, 1);
}

/// Issue 30: a LAN frame whose virtio-net header fails the checks is counted and dropped.
#[test]
fn a_lan_frame_with_a_bad_header_is_counted_and_dropped() {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = connect(&mut ioc, 1, false, 128);
    let own = mac(&ioc, a);
    let mut bad = frame(own, LAN_PEER, 200);
    bad[0] = 0x80; // an unknown virtio-net flag
    nic.rx.borrow_mut().push_back(bad);
    from_lan::drive_lan(&mut ioc, 0);
    assert_eq!(ioc.stats.lan_rx_bad_frame, 1);
    assert_eq!(lan_to(&mut ioc, &nic, &mut pa, a, own), (3, 0));
    assert_eq!(pa.frames, 3, "only the good frames reached the host");
    assert!(ioc
        .metrics_text()
        .contains("\nsplitnet_ioc_lan_rx_bad_frame_total 1\n"));
}

/// A host whose policy (`[[auth.hosts]]`) lists bridged machines and forbids promiscuous
/// mode: it sends from them, frames to them reach it (and no promiscuous host), another host
/// cannot send from them, and its SetPromisc is refused.
#[test]
fn a_hosts_policy_bridges_its_machines_and_decides_promiscuity() {
    let (mut ioc, nic) = ioc_with("");
    let vm = [0x02, 0xaa, 0, 0, 0, 1];
    let mut who = Who::node(1);
    who.policy = crate::gate::Policy {
        name: Some("a".into()),
        mac: None,
        extra_macs: vec![vm],
        promiscuous: false,
        queues: 1,
        vlan: crate::vlan::VlanMode::Untagged,
        port: None,
    };
    let (a, mut pa) = connect_with(&mut ioc, who, false, host_config(128));
    let (b, mut pb) = connect(&mut ioc, 2, false, 128);
    // B may be promiscuous (open policy), A may not.
    pb.link.session_mut().cfg_request(CfgCode::SetPromisc, &[1]);
    pump(&mut ioc, &mut pb, b, true);
    assert!(host(&ioc, b).promisc);
    pa.link.session_mut().cfg_request(CfgCode::SetPromisc, &[1]);
    pump(&mut ioc, &mut pa, a, true);
    assert!(
        !host(&ioc, a).promisc,
        "A's policy forbids promiscuous mode"
    );
    // A frame for the bridged machine reaches A, not the promiscuous B.
    let b_before = pb.frames;
    assert_eq!(lan_to(&mut ioc, &nic, &mut pa, a, vm), (3, 0));
    pump(&mut ioc, &mut pb, b, true);
    assert_eq!(
        pb.frames, b_before,
        "a bridged machine's frames are A's alone"
    );
    // A sends from it; B cannot.
    host_sends(&mut ioc, &mut pa, a, vec![frame(LAN_PEER, vm, 100)]);
    assert_eq!(nic.tx.borrow().len(), 1);
    host_sends(&mut ioc, &mut pb, b, vec![frame(LAN_PEER, vm, 100)]);
    assert_eq!(
        nic.tx.borrow().len(),
        1,
        "B may not send as A's bridged machine"
    );
    assert_eq!(host(&ioc, b).drops.spoofed, 1);
    assert_eq!(
        ioc.shard.claim_mac(&nic, std::iter::once(vm)),
        None,
        "A's while A is here"
    );
    // When A leaves, its bridged MAC leaves the forwarding table with it: free to claim.
    ioc.remove_host(a, "test", None);
    assert_eq!(ioc.by_mac.get(&vm), None);
    assert_eq!(ioc.shard.claim_mac(&nic, std::iter::once(vm)), Some(vm));
}

#[test]
fn auto_promiscuity_puts_the_hosts_macs_in_the_nics_filter_and_holds_promisc_for_a_promiscuous_host(
) {
    let (mut ioc, nic) = ioc_with("");
    let (a, mut pa) = connect(&mut ioc, 3, false, 128);
    let (b, _pb) = connect(&mut ioc, 4, false, 128);
    let (ma, mb) = (mac(&ioc, a), mac(&ioc, b));
    let filter = || {
        let mut f = nic.unicast.borrow().clone();
        f.sort();
        f
    };
    let mut both = vec![ma, mb];
    both.sort();
    assert_eq!(filter(), both, "each host's MAC in the unicast filter");
    assert!(
        !nic.promisc.get(),
        "no host promiscuous: neither is the NIC"
    );
    let cfg = |p: &mut Peer, code, data: &[u8]| p.link.session_mut().cfg_request(code, data);
    cfg(&mut pa, CfgCode::SetPromisc, &[1]);
    pump(&mut ioc, &mut pa, a, true);
    assert!(nic.promisc.get(), "held promiscuous for host A");
    // A new MAC replaces the old one in the filter.
    let moved = [ma[0], ma[1], ma[2], 0x77, 0x77, 0x77];
    cfg(&mut pa, CfgCode::SetMac, &moved);
    pump(&mut ioc, &mut pa, a, true);
    assert_eq!(mac(&ioc, a), moved);
    assert!(filter().contains(&moved) && !filter().contains(&ma));
    cfg(&mut pa, CfgCode::SetPromisc, &[0]);
    pump(&mut ioc, &mut pa, a, true);
    assert!(!nic.promisc.get(), "let go with the last promiscuous host");
    ioc.remove_host(a, "test", None);
    assert_eq!(filter(), [mb], "a host's MAC leaves the filter with it");
    ioc.remove_host(b, "test", None);
    assert!(filter().is_empty());
    // "on" and "off" leave the NIC as it was opened.
    for setting in [Promiscuous::On, Promiscuous::Off] {
        let nic = FakeNic::default();
        let mut cfg = config("");
        cfg.lan.promiscuous = setting;
        let mut ioc = WorkerState::new(cfg, Box::new(nic.clone()), 1500, true);
        let _ = connect(&mut ioc, 3, false, 128);
        assert!(
            nic.unicast.borrow().is_empty() && !nic.promisc.get(),
            "{setting:?}"
        );
    }
}

#[test]
fn an_ecn_flow_towards_a_backlogged_host_is_marked_and_a_plain_one_is_not() {
    // Two hosts at most: a quota of 128 full-size send buffers each.
    let (mut ioc, nic) = ioc_with("max_hosts = 2");
    let mut cfg = host_config(128);
    cfg.advertise = vec![PoolSpec {
        element_size: 16 << 10,
        element_count: 8,
    }];
    cfg.target.credit_batch = 1;
    // Little credit: the host's frames wait in its receive ring, its backlog grows.
    let (s, mut peer) = connect_with(&mut ioc, Who::node(7), false, cfg);
    let to = mac(&ioc, s);
    // A 15,000-byte frame of an ECT(0) flow, or of a Not-ECT flow (another source address).
    let ip_frame = |ect: bool| {
        let mut f = frame(to, LAN_PEER, 15_000);
        let ip = VNET_HDR_LEN + 14;
        f[ip + 1] = if ect { 0b10 } else { 0 };
        f[ip + 12] = if ect { 1 } else { 2 };
        f
    };
    for _ in 0..100 {
        nic.rx.borrow_mut().push_back(ip_frame(true));
        nic.rx.borrow_mut().push_back(ip_frame(false));
    }
    while !nic.rx.borrow().is_empty() {
        from_lan::drive_lan(&mut ioc, 0);
    }
    let marked = host(&ioc, s).ce_marked;
    assert!(marked > 0, "the host's backlog went past half its share");
    peer.kept = Some(Vec::new());
    for _ in 0..10 {
        pump(&mut ioc, &mut peer, s, true);
    }
    let kept = peer.kept.take().unwrap();
    let ip = VNET_HDR_LEN + 14;
    let ce = |f: &Vec<u8>| f[ip + 1] & 3 == 3;
    let (ect, plain): (Vec<_>, Vec<_>) = kept.iter().partition(|f| f[ip + 12] == 1);
    assert_eq!(ect.iter().filter(|f| ce(f)).count() as u64, marked);
    assert!(
        plain.iter().all(|f| f[ip + 1] == 0),
        "a Not-ECT frame is never marked"
    );
    let h = host(&ioc, s);
    assert_eq!(
        kept.len() as u64 + h.stats.rx_dropped,
        200,
        "every frame delivered or counted"
    );
    let line =
        format!("splitnet_ioc_host_rx_ce_marked_total{{session=\"{s}\",queue=\"0\"}} {marked}");
    assert!(
        ioc.metrics_text().contains(&line),
        "{line} not in the metrics"
    );
}

#[test]
fn freed_buffers_wake_every_receive_queue_waiting_for_them() {
    let (ioc, _nic) = ioc_with("");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let woken = Rc::new(std::cell::Cell::new(0));
    local.block_on(&rt, async {
        // Two receive queues' tasks out of buffers, as `worker::lan` waits.
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (freed, woken) = (ioc.buffers_freed.clone(), woken.clone());
                tokio::task::spawn_local(async move {
                    freed.notified().await;
                    woken.set(woken.get() + 1);
                })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(woken.get(), 0);
        ioc.wake_readers();
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        assert_eq!(woken.get(), 2, "both queues read again");
        tasks.iter().for_each(|t| t.abort());
    });
}
