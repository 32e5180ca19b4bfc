//! `rogue noisy ADDR KIND SECONDS`: a host that speaks the protocol correctly and makes its
//! IOC work as hard as one host can, for SECONDS, while the tests watch another host of the
//! same worker. KIND is one of:
//! - `setmac`: SetMac requests back to back, alternating between two MACs of the IOC's
//!   range (each would reopen the host's packet socket and refilter every worker's);
//! - `setmulticast`: SetMulticast back to back, 64 groups then none (each would join or leave
//!   64 groups on the NIC under the kernel's rtnl lock);
//! - `broadcast`: broadcast frames as fast as the IOC's credits let it write them.
//!
//! It prints what it sent and how the IOC answered; the IOC's counters tell the rest.

use super::{msg, send, write_frame, Conn, WAIT};
use splitnet_messaging::adapter::{Channel, RxCompletion};
use splitnet_messaging::wire::{CfgCode, CfgRequest, ErrorCode, Message, PoolEntry};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What a storm did.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    ok: u64,
    busy: u64,
    other: u64,
}

/// Runs storm `kind` for `seconds`; returns what went wrong (nothing when the IOC kept the
/// session and answered every request: a request unanswered ends the storm as a failure).
pub fn storm(addr: &str, kind: &str, seconds: u64) -> Vec<&'static str> {
    let (mut c, mac) = match super::host_with_mac(addr, 0x5702, None, "noisy host") {
        Ok(c) => c,
        Err(missed) => return missed,
    };
    let end = Instant::now() + Duration::from_secs(seconds);
    let tally = match kind {
        "setmac" => {
            let mut other = mac;
            other[5] ^= 1;
            let macs = [other, mac];
            requests(&mut c, end, CfgCode::SetMac, |i| macs[i % 2].to_vec())
        }
        "setmulticast" => {
            let groups: Vec<u8> = (0..64u8).flat_map(|g| [1, 0, 0x5e, 0, 9, g]).collect();
            requests(&mut c, end, CfgCode::SetMulticast, |i| {
                if i % 2 == 0 {
                    groups.clone()
                } else {
                    Vec::new()
                }
            })
        }
        "broadcast" => broadcast(&mut c, mac, end),
        _ => {
            eprintln!("noisy host: unknown storm {kind}");
            return vec!["kind"];
        }
    };
    let Some(tally) = tally else {
        println!("noisy host: the IOC closed the session");
        return vec!["the IOC kept the noisy host"];
    };
    if kind == "broadcast" {
        println!("broadcast: wrote {} frames", tally.sent);
        return Vec::new();
    }
    println!(
        "{kind}: sent {} answered ok {} busy {} other {}",
        tally.sent, tally.ok, tally.busy, tally.other
    );
    Vec::new()
}

/// Sends CfgUtil request `code` (its data from `data(i)` for the i-th) back to back until
/// `end`, each after the answer to the one before. `None` if the session ended.
fn requests(
    c: &mut Conn,
    end: Instant,
    code: CfgCode,
    data: impl Fn(usize) -> Vec<u8>,
) -> Option<Tally> {
    let mut t = Tally::default();
    while Instant::now() < end {
        let d = data(t.sent as usize);
        send(
            &mut c.ctrl,
            msg(&Message::CfgUtilRequest(CfgRequest { code, data: &d })),
        );
        t.sent += 1;
        let status = answer(c, code)?;
        match status {
            ErrorCode::Ok => t.ok += 1,
            ErrorCode::Busy => t.busy += 1,
            _ => t.other += 1,
        }
    }
    Some(t)
}

/// The status of the next answer to request `code`; messages between are skipped. `None` if
/// the session ended or nothing came within [`WAIT`].
fn answer(c: &mut Conn, code: CfgCode) -> Option<ErrorCode> {
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        let m = super::recv(&mut c.ctrl, &mut c.reg)?;
        if let Ok((_, Message::CfgUtilReply(r))) = Message::parse(&m) {
            if r.code == code {
                return Some(r.status);
            }
        }
    }
    None
}

/// Writes broadcast frames from `mac` into the IOC's smallest pool as fast as its credits
/// come back, until `end`. `None` if the session ended.
fn broadcast(c: &mut Conn, mac: [u8; 6], end: Instant) -> Option<Tally> {
    let pool: PoolEntry = *c.pools.iter().min_by_key(|p| p.element_size)?;
    let mut free: VecDeque<u32> = (0..pool.element_count).collect();
    let frame = super::frame_from(mac, 1000.min(pool.element_size as usize));
    let mut t = Tally::default();
    while Instant::now() < end {
        match free.pop_front() {
            Some(e) => {
                write_frame(&mut c.data, &pool, e, &frame);
                t.sent += 1;
            }
            // Out of credit: wait for the IOC's BufferRecvPoolUpdate.
            None => match c.ctrl.poll_recv(&mut c.reg) {
                Ok(Some(RxCompletion::Recv { .. })) => {
                    if let Ok((_, Message::BufferRecvPoolUpdate(runs))) =
                        Message::parse(c.ctrl.received())
                    {
                        for r in runs.iter().filter(|r| r.pool_ref == pool.pool_ref) {
                            free.extend(r.first..r.first.saturating_add(r.count));
                        }
                    }
                }
                Ok(_) => {}
                Err(e) if super::idle(&e) => {}
                Err(_) => return None,
            },
        }
    }
    Some(t)
}
