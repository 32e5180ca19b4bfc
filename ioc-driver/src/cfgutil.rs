//! The IOC's side of CfgUtil: a host's requests for its MAC, MTU, link state, counters,
//! promiscuity, multicast groups and offloads, each answered with a status and checked
//! against the IOC's configuration (`lan.set_mac`, the NIC's MTU, the offloads offered).

use crate::host_queue::MAX_HOST_GROUPS;
use crate::report;
use crate::state::WorkerState;
use splitnet_messaging::wire::{self, features, CfgCode, ErrorCode, Stats};
use std::time::Instant;
use tracing::warn;

/// Answers a host's CfgUtilRequest. The host's first queue carries its configuration;
/// its other queues may only ask for their own counters.
pub fn cfg_request(st: &mut WorkerState, session: u64, txn: u64, code: CfgCode, data: &[u8]) {
    let (mtu_max, nic_up, offered) = (st.mtu, st.nic_up, report::offered(&st.cfg));
    // Ports mode: the host's MTU is at most its port's, as the switch set it.
    let port_mtu = st.hosts.get(&session).and_then(|h| h.port.as_ref());
    let mtu_max = port_mtu.map_or(mtu_max, |p| p.mtu());
    let (set_mac, mac_base) = (st.cfg.lan.set_mac, st.cfg.lan.mac_base.0);
    // Each host asks at its own rate: beyond it the answer is Busy, and it costs the
    // worker nothing more (the requests that change the NIC or its filters, slower still).
    let costly = matches!(
        code,
        CfgCode::SetMac | CfgCode::SetMulticast | CfgCode::SetPromisc | CfgCode::SetMtu
    );
    let now = Instant::now();
    let Some(host) = st.hosts.get_mut(&session) else {
        return;
    };
    if !host.cfg_rate.allow(now) || (costly && !host.cfg_costly_rate.allow(now)) {
        st.stats.cfg_rate_limited += 1;
        if let Some(held) = host.log.allow(now) {
            warn!(session, ?code, "CfgUtil request over the host's rate: answered Busy ({held} more held back since the last report)");
        }
        if let Some(link) = host.link.as_mut() {
            link.session_mut()
                .cfg_reply(txn, code, ErrorCode::Busy, &[]);
        }
        return;
    }
    if code == CfgCode::Activate {
        let status = match data.is_empty() {
            true => st.activate(session),
            false => ErrorCode::Malformed,
        };
        let Some(h) = st.hosts.get_mut(&session) else {
            return;
        };
        // The bridged MACs held here for the host, for it to announce (protocol.md 3.2).
        let reply: Vec<u8> = match status {
            ErrorCode::Ok => h.bridged.iter().flatten().copied().collect(),
            _ => Vec::new(),
        };
        if let Some(link) = h.link.as_mut() {
            link.session_mut().cfg_reply(txn, code, status, &reply);
        }
        return;
    }
    if code == CfgCode::GetStats {
        st.count_own_queue_drops();
    }
    // A host's own LAN queue closes before its MAC may change (and reopens after): a MAC
    // it gives up is never excluded from the general sockets once another host may take
    // it. A request for the MAC it has, or for one the policy or another host here
    // refuses, changes nothing and costs nothing.
    let (current, key, bridged) = match st.hosts.get(&session) {
        Some(h) => (Some(h.mac), h.key, h.bridged.clone()),
        None => (None, None, Vec::new()),
    };
    let may_take = |m: [u8; 6]| {
        Some(m) != current
            && set_mac.allows(m, mac_base)
            && !st.reserved_for_other(&m, key.as_ref())
            && !bridged.contains(&m)
            && st.by_mac.get(&m).is_none_or(|&s| s == session)
    };
    if code == CfgCode::SetMac && wire::parse_mac(data).is_ok_and(may_take) {
        st.close_own_queue(session);
        if let Some(h) = st.hosts.get_mut(&session) {
            h.own_queue_retry = None;
        }
    }
    // The first queue reports the counters of all the host's queues together.
    let node_stats = (code == CfgCode::GetStats).then(|| host_stats(st, session));
    let (by_mac, shard, nic, reserved) = (&mut st.by_mac, &st.shard, &st.nic, &st.reserved);
    let Some(host) = st.hosts.get_mut(&session) else {
        return;
    };
    // A further queue asks only for its counters; a standby changes nothing it would
    // claim or make the NIC do until it is activated.
    // A further queue may ask for its counters and for the features (which tell it whether
    // the express lane is offered); everything else is the first queue's.
    let further_may = matches!(code, CfgCode::GetStats | CfgCode::GetFeatures);
    if (!host.queue.is_first() && !further_may) || (host.standby && costly) {
        if let Some(link) = host.link.as_mut() {
            link.session_mut()
                .cfg_reply(txn, code, ErrorCode::Refused, &[]);
        }
        return;
    }
    let mut reply: Vec<u8> = Vec::new();
    let status = match code {
        CfgCode::GetMac => {
            reply.extend_from_slice(&host.mac);
            ErrorCode::Ok
        }
        CfgCode::SetMac => match wire::parse_mac(data) {
            // Never a MAC another entry of `[[auth.hosts]]` reserves, present or not.
            // Nor one of its bridged machines' (a MAC is the host's or a machine's).
            Ok(mac)
                if set_mac.allows(mac, mac_base)
                    && reserved.get(&mac).is_none_or(|k| Some(k) == key.as_ref())
                    && !host.bridged.contains(&mac)
                    && by_mac.get(&mac).is_none_or(|&s| s == session)
                    && shard.move_mac(&**nic, host.mac, mac) =>
            {
                by_mac.remove(&host.mac);
                by_mac.insert(mac, session);
                host.mac = mac;
                ErrorCode::Ok
            }
            Ok(_) => ErrorCode::Refused,
            Err(_) => ErrorCode::Malformed,
        },
        CfgCode::GetMtu => {
            reply.extend_from_slice(
                &wire::Mtu {
                    current: host.mtu,
                    max: mtu_max,
                }
                .emit(),
            );
            ErrorCode::Ok
        }
        CfgCode::SetMtu => match wire::parse_u32(data) {
            Ok(m) if (68..=mtu_max).contains(&m) => {
                host.mtu = m;
                ErrorCode::Ok
            }
            Ok(_) => ErrorCode::Refused,
            Err(_) => ErrorCode::Malformed,
        },
        CfgCode::GetLink => {
            reply.push(u8::from(nic_up));
            ErrorCode::Ok
        }
        CfgCode::GetStats => {
            reply.extend_from_slice(&node_stats.unwrap_or(host.stats).emit());
            ErrorCode::Ok
        }
        CfgCode::SetPromisc => match wire::parse_u8(data) {
            // Promiscuous only where the host's policy allows it (`[[auth.hosts]]
            // promiscuous`); all-multicast (2) always.
            Ok(1) if !host.policy.promiscuous => ErrorCode::Refused,
            Ok(v @ (0..=2)) => {
                host.promisc = v == 1;
                host.allmulti = v == 2;
                ErrorCode::Ok
            }
            _ => ErrorCode::Malformed,
        },
        CfgCode::SetMulticast => match wire::parse_multicast(data) {
            // More groups than the IOC keeps for a host: it gets every multicast frame, as
            // behind a NIC whose filter overflows, and none is joined on the NIC for it.
            Ok(list) if list.iter().all(|m| m[0] & 1 == 1) => {
                let overflow = list.len() > MAX_HOST_GROUPS;
                host.multicast = if overflow { Vec::new() } else { list };
                host.allmulti_overflow = overflow;
                ErrorCode::Ok
            }
            Ok(_) => ErrorCode::Refused,
            Err(_) => ErrorCode::Malformed,
        },
        CfgCode::GetFeatures => {
            reply.extend_from_slice(&offered.to_be_bytes());
            ErrorCode::Ok
        }
        CfgCode::SetFeatures => match wire::parse_u64(data) {
            // Every frame carries a virtio-net header; offloads only as offered.
            Ok(f) if f & features::VNET_HDR != 0 && f & !offered == 0 => {
                host.features = f;
                ErrorCode::Ok
            }
            Ok(_) => ErrorCode::Unsupported,
            Err(_) => ErrorCode::Malformed,
        },
        CfgCode::LinkChange | CfgCode::Activate | CfgCode::Other(_) => ErrorCode::Unsupported,
    };
    let (mac, mtu, features) = (host.mac, host.mtu, host.features);
    if let Some(link) = host.link.as_mut() {
        link.session_mut().cfg_reply(txn, code, status, &reply);
    }
    if code == CfgCode::SetMac {
        st.sync_nic_filter();
        st.open_own_queue(session);
    }
    if matches!(code, CfgCode::SetMac | CfgCode::SetMtu) && status == ErrorCode::Ok {
        st.port_changed(session, crate::port::Action::Change);
    }
    if code == CfgCode::SetMulticast && status == ErrorCode::Ok {
        st.sync_multicast();
    }
    if code == CfgCode::SetPromisc && status == ErrorCode::Ok {
        st.sync_nic_filter();
        st.publish_promisc();
    }
    // The other queues show the first queue's address, MTU and features.
    if matches!(
        code,
        CfgCode::SetMac | CfgCode::SetMtu | CfgCode::SetFeatures
    ) && status == ErrorCode::Ok
    {
        for h in st.hosts.values_mut().filter(|h| h.first == session) {
            h.mac = mac;
            h.mtu = mtu;
            h.features = features;
        }
    }
}

/// Counters of `session`; on a host's first queue, of all its queues together.
fn host_stats(st: &WorkerState, session: u64) -> Stats {
    let mut sum = Stats::default();
    match st.hosts.get(&session) {
        Some(h) if h.queue.is_first() => {
            for q in h.queues.iter().filter_map(|s| st.hosts.get(s)) {
                sum += q.stats;
            }
        }
        Some(h) => sum = h.stats,
        None => {}
    }
    sum
}
