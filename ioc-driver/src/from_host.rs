//! Frames and messages from a host: each frame it wrote is checked against what it
//! negotiated and forwarded (to the LAN, to another host here, or through another worker's
//! inbox), and each event of its link handled.
//!
//! Group frames (broadcast, multicast) go to every other host on their VLAN and to the LAN.
//! A unicast frame goes to the host owning its destination MAC when that host is on the
//! frame's VLAN, else to the LAN. An access host's frame gets its VLAN's tag first
//! ([`crate::vlan`]).

use crate::cfgutil;
use crate::counters::{IocStats, TxDrop};
use crate::deliver::{cross, deliver_all, deliver_copy, targets};
use crate::host_frame::{HostFrame, HEAD};
use crate::host_queue::HostQueue;
use crate::lan_tx::LanTx;
use crate::nic::Nic;
use crate::report;
use crate::shard::Shard;
use crate::state::WorkerState;
use crate::vlan::Ingress;
use splitnet_messaging::endpoint::{Lane, LinkEvent, PoolGetOutcome};
use splitnet_messaging::memory::{Frame, SendBufCache};
use splitnet_messaging::vnet;
use splitnet_messaging::wire::features;
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;
use tracing::{debug, info, warn};

/// Completions handled per channel per wake-up.
pub const RX_BUDGET: usize = 256;
/// What a frame costs its worker besides its bytes, in bytes of [`HostQueue::drr`]'s
/// quantum: a host of small frames takes as much of the worker as one of large frames.
pub const FRAME_COST: usize = 1500;

/// What the IOC holds every host's frames to (see [`HostQueue::check_tx`]), and where it sends
/// them.
#[derive(Debug, Clone, Copy)]
pub struct TxPolicy<'a> {
    /// Offloads offered to hosts.
    pub offered: u64,
    /// Source MACs any host may use besides its own.
    pub extra_macs: &'a [[u8; 6]],
    /// Each host's MAC, to its first queue's session ([`WorkerState::by_mac`]).
    pub by_mac: &'a HashMap<[u8; 6], u64>,
    /// The other workers and their hosts.
    pub shard: &'a Shard,
}

/// Forwards one frame a host's session (`from`) wrote into the IOC's pool, if it passes
/// [`HostQueue::check_tx`]; a frame that does not is dropped and counted against the host.
/// Frames for the LAN go through `lan` (sent in batches: see [`LanTx`]), which counts them
/// for the host when the NIC has taken them.
#[allow(clippy::too_many_arguments)]
pub fn from_host(
    from: u64,
    frame: HostFrame<'_>,
    hosts: &mut BTreeMap<u64, HostQueue>,
    nic: &dyn Nic,
    lan: &mut LanTx,
    cache: &mut SendBufCache,
    stats: &mut IocStats,
    keys: &RandomState,
    policy: &TxPolicy<'_>,
    scratch: &mut Vec<u8>,
) {
    let Some(h) = hosts.get_mut(&from) else {
        return;
    };
    let ingress = match h.check_tx(frame.head(), frame.len(), policy.offered, policy.extra_macs) {
        Ok(i) => i,
        Err((why, text)) => {
            h.drop_tx(why);
            if let Some(held) = h.log.allow(std::time::Instant::now()) {
                warn!(
                    session = from,
                    "dropping a frame from the host: {text} ({held} more dropped since the last report)"
                );
            }
            return;
        }
    };
    // Ports mode: every frame goes to the host's port, as it came (the switch forwards it,
    // and tags it as the port's VLAN settings say).
    if let Some(port) = h.port.as_ref() {
        match port.send(frame) {
            Ok(_) => {
                h.stats.tx_frames += 1;
                h.stats.tx_bytes += frame.len() as u64;
            }
            Err(e) => {
                debug!(session = from, "the port refused a frame: {e}");
                h.drop_tx(TxDrop::Nic);
            }
        }
        return;
    }
    // An access host's frame travels on with its VLAN's tag: a private copy with the tag in
    // (checked above as it came; the tag moves its offsets, and insert_vlan_ahead moves
    // them). Copied 4 bytes in, so that only its header and MACs move for the tag.
    let frame = match ingress {
        Ingress::AsIs => frame,
        Ingress::Tag(vid) => {
            let n = frame.len();
            scratch.resize(n + vnet::VLAN_TAG_LEN, 0);
            frame.copy_to(&mut scratch[vnet::VLAN_TAG_LEN..]);
            match vnet::insert_vlan_ahead(scratch, n, 0x8100, vid) {
                Some(m) => HostFrame::Private(&scratch[..m]),
                None => return h.drop_tx(TxDrop::Vlan),
            }
        }
    };
    let head = frame.head();
    let vlan = vnet::vlan_of(head);
    let dst = vnet::dst_mac(head);
    let sender = hosts.get(&from).map_or(from, |h| h.first);
    if vnet::is_group(&dst) {
        // Storm control, counted on the host's first queue's rate: every queue of a host
        // shares it.
        let storm = hosts
            .get_mut(&sender)
            .and_then(|f| f.storm.as_mut())
            .is_some_and(|r| !r.allow(Instant::now()));
        if storm {
            if let Some(h) = hosts.get_mut(&from) {
                h.drop_tx(TxDrop::Storm);
            }
            return;
        }
        let to = targets(hosts, head, keys, |h| {
            h.session != sender && h.wants_group(&dst)
        });
        deliver_all(&to, hosts, frame, vlan, cache);
        cross(policy.shard, policy.shard.others(), frame, stats);
        lan.send(from, frame, nic, hosts, stats);
        return;
    }
    // A host here that is not on the frame's VLAN does not own its MAC there: the frame
    // goes to the LAN, as a switch sends a MAC unknown on a VLAN to its uplink.
    let owner = policy
        .by_mac
        .get(&dst)
        .filter(|&&s| s != sender)
        .and_then(|s| hosts.get(s))
        .filter(|h| h.policy.vlan.egress(vlan).is_some())
        .map(|h| h.steer(head, keys));
    let elsewhere = policy.shard.owner(&dst);
    match owner.and_then(|s| hosts.get_mut(&s)) {
        Some(to) => deliver_copy(to, frame, vlan, cache),
        None => match elsewhere {
            Some(w) => {
                cross(policy.shard, [w], frame, stats);
            }
            None => return lan.send(from, frame, nic, hosts, stats),
        },
    }
    if let Some(h) = hosts.get_mut(&from) {
        h.stats.tx_frames += 1;
        h.stats.tx_bytes += frame.len() as u64;
    }
}

/// Drives one lane of a host's link: its frames are forwarded, its messages handled.
/// Returns whether the lane is drained, or the error that ends the host's session.
pub fn drive_host(st: &mut WorkerState, session: u64, lane: Lane) -> Result<bool, HostEnd> {
    let offered = report::offered(&st.cfg);
    let WorkerState {
        reg,
        nic,
        lan_tx,
        cache,
        hosts,
        by_mac,
        stats,
        flow_keys,
        extra_macs,
        shard,
        vlan_scratch,
        ..
    } = &mut *st;
    let policy = TxPolicy {
        offered,
        extra_macs,
        by_mac,
        shard,
    };
    let Some(mut link) = hosts.get_mut(&session).and_then(|h| h.link.take()) else {
        return Err(HostEnd::Gone);
    };
    let mut events = Vec::new();
    let mut head = [0u8; HEAD];
    let mut drr = hosts.get(&session).map(|h| h.drr);
    let bytes = Cell::new(0);
    // A frame on the control channel is the express lane's, which this IOC must offer
    // (docs/protocol.md 6.6: a host's further queue may use it before its first queue's
    // SetFeatures is answered); else it is dropped as an unnegotiated feature.
    let express = offered & features::EXPRESS != 0;
    let mut sink = |frame: Frame<'_>| {
        if lane == Lane::Control && !express {
            if let Some(h) = hosts.get_mut(&session) {
                h.drop_tx(TxDrop::NotNegotiated);
            }
            return;
        }
        // A frame in a shared pool is checked from a private copy of its head
        // (see [`HostFrame`]).
        let frame = HostFrame::new(frame, &mut head);
        bytes.set(bytes.get() + frame.len() + FRAME_COST);
        from_host(
            session,
            frame,
            hosts,
            &**nic,
            lan_tx,
            cache,
            stats,
            flow_keys,
            &policy,
            vlan_scratch,
        )
    };
    // Frames share the worker by deficit round robin among its hosts; messages of the
    // control channel are few and small, and are read up to the budget.
    let r = match (lane, drr.as_mut()) {
        (Lane::Data, Some(drr)) => drr.serve(RX_BUDGET, || {
            let before = bytes.get();
            let more = link.poll(reg, lane, 1, &mut sink, &mut events)?;
            Ok(more.then(|| bytes.get() - before))
        }),
        _ => link.poll(reg, lane, RX_BUDGET, &mut sink, &mut events),
    };
    lan_tx.flush(&**nic, hosts, stats);
    if let (Some(h), Some(drr)) = (hosts.get_mut(&session), drr) {
        h.drr = drr;
    }
    link.session_mut().flush_idle(reg);
    if let Some(h) = hosts.get_mut(&session) {
        h.link = Some(link);
    }
    st.kick_hosts();
    // Events first: a Goodbye read just before the end of stream explains it.
    let ev = on_events(st, session, events);
    match (r, ev) {
        (_, Err(why)) => Err(HostEnd::Closed(why)),
        (Err(e), Ok(())) => Err(HostEnd::Failed(e)),
        (Ok(more), Ok(())) => Ok(!more),
    }
}

/// Handles what a host's link reported. `Err` ends the host's session.
pub fn on_events(st: &mut WorkerState, session: u64, events: Vec<LinkEvent>) -> Result<(), String> {
    for ev in events {
        match ev {
            LinkEvent::CfgRequest { txn, code, data } => {
                cfgutil::cfg_request(st, session, txn, code, &data)
            }
            LinkEvent::Goodbye(code) => {
                return Err(format!("host disconnected ({code:?})"));
            }
            LinkEvent::PoolGet(o) => match o {
                PoolGetOutcome::Granted(_) => info!(session, ?o, "BufferRecvPoolGet"),
                PoolGetOutcome::Declined(_) => debug!(session, ?o, "BufferRecvPoolGet"),
            },
            LinkEvent::Credits => {
                if let Some(h) = st.hosts.get_mut(&session) {
                    h.send_queued(&mut st.cache);
                }
                // Pools advertised: its own LAN queue, if they allow.
                st.open_own_queue(session);
            }
            LinkEvent::RefusedInline { len } => {
                if let Some(h) = st.hosts.get_mut(&session) {
                    h.drop_tx(TxDrop::OversizeInline);
                    if let Some(held) = h.log.allow(Instant::now()) {
                        warn!(session, len, "dropping a SendData frame that belongs in a pool ({held} more dropped since the last report)");
                    }
                }
            }
            LinkEvent::CfgReply { .. } | LinkEvent::Flushed { .. } => {}
        }
    }
    Ok(())
}

/// Why a host's session ends.
#[derive(Debug)]
pub enum HostEnd {
    /// Already removed.
    Gone,
    /// It said goodbye or was refused at the session level.
    Closed(String),
    /// Its link failed (transport, protocol or protection error).
    Failed(splitnet_messaging::endpoint::LinkError),
    /// It exceeded what the IOC lets one host hold (it does not read its channels).
    Limit(String),
}
