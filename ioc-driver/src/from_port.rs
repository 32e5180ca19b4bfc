//! Frames from a host's port (`lan.mode = "ports"`): what the switch sent out of the port's
//! queue of one session, read a batch at a time and delivered to that session, filtered
//! as the host's NIC would ([`crate::port::admits`]).

use crate::from_lan::LanProgress;
use crate::port::admits;
use crate::state::WorkerState;
use splitnet_messaging::vnet;
use std::io;
use std::time::Instant;
use tracing::warn;

/// Frames read from a port's queue per wake-up (one `read(2)` each: a TAP has no batch).
const PORT_BATCH: usize = splitnet_netif::packet::RECV_BATCH;

/// Reads up to a batch of frames from session `session`'s queue of its port and delivers
/// those its host takes.
pub fn drive_port(st: &mut WorkerState, session: u64) -> LanProgress {
    let WorkerState {
        hosts,
        cache,
        stats,
        log,
        ..
    } = &mut *st;
    let Some(port) = hosts.get(&session).and_then(|h| h.port.clone()) else {
        return LanProgress::Drained;
    };
    let mut progress = LanProgress::Budget;
    for _ in 0..PORT_BATCH {
        let Some(mut buf) = cache.get() else {
            progress = LanProgress::NoBuffers;
            break;
        };
        let len = match port.recv(buf.space()) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                cache.put(buf);
                progress = LanProgress::Drained;
                break;
            }
            Err(e) => {
                cache.put(buf);
                stats.lan_rx += 1;
                stats.lan_rx_unreadable += 1;
                if let Some(held) = log.allow(Instant::now()) {
                    warn!(session, port = %port.name, "a frame of the port could not be read: {e} ({held} more since the last report)");
                }
                continue;
            }
        };
        stats.lan_rx += 1;
        if len > buf.space().len() {
            stats.lan_rx_truncated += 1;
            cache.put(buf);
            continue;
        }
        buf.set_len(len);
        if vnet::check_frame(buf.as_slice()).is_err() {
            stats.lan_rx_bad_frame += 1;
            cache.put(buf);
            continue;
        }
        let dst = vnet::dst_mac(buf.as_slice());
        // The first queue holds the host's filter (promiscuity, groups).
        let first = hosts.get(&session).map_or(session, |h| h.first);
        let vlan = vnet::vlan_of(buf.as_slice());
        let takes = hosts.get(&first).is_some_and(|f| {
            f.policy.vlan.takes_from_port(vlan)
                && admits(&dst, &f.mac, &f.bridged, |g| f.wants_group(g), f.promisc)
        });
        match hosts.get_mut(&session).filter(|_| takes) {
            Some(h) => h.post(buf, cache),
            None => {
                stats.lan_filtered += 1;
                cache.put(buf);
            }
        }
    }
    st.kick_hosts();
    progress
}
