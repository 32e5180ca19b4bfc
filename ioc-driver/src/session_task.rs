//! One task per connected host session (queue): wait for its channels, its own LAN queue
//! or its timers, then drive what woke it (from the host, from its own queue), flush what
//! waits for it, and end the session when its link fails or goes silent.

use crate::from_host::{self, HostEnd};
use crate::from_lan::{self, LanProgress};
use crate::from_port;
use crate::own_queue::OwnQueueProgress;
use crate::spin;
use crate::state::{WorkerState, MAX_CONTROL_BACKLOG};
use splitnet_fabric::{Guard, LinkReady, Ready};
use splitnet_messaging::endpoint::{Lane, Liveness};
use splitnet_messaging::wire::Message;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;
use tokio::sync::Notify;

/// Serves host `session` until its session ends; then removes it.
///
/// The task waits for its sockets, its keepalive timer, or a wake-up from another path that
/// found its socket full. While its socket is full it waits for writability and nothing
/// else writes to it, so a host that stops reading costs the IOC no work at all.
pub async fn serve(
    ioc: Rc<RefCell<WorkerState>>,
    session: u64,
    ready: LinkReady,
    wake: Rc<Notify>,
) {
    // Ports mode: its port's queue waits for send buffers (all queued towards hosts).
    let mut port_starved = false;
    let end = loop {
        let (pending, deadline, sleep_ctrl, sleep, placed, port, freed) = {
            let mut ioc = ioc.borrow_mut();
            let freed = ioc.buffers_freed.clone();
            match ioc.hosts.get_mut(&session) {
                Some(h) => {
                    // Shared memory: ask for the doorbells; records may be waiting already.
                    let mut sleep = |lane| h.link.as_mut().is_none_or(|l| l.prepare_sleep(lane));
                    let (c, d) = (sleep(Lane::Control), sleep(Lane::Data));
                    // The host's own LAN queue, waited on while its pools have room.
                    let placed = h.own_queue.as_ref().filter(|p| !p.starved);
                    let placed = placed.and_then(|p| p.ready.clone());
                    // Its port's queue, waited on while send buffers are free.
                    let port = h.port.clone();
                    let pending = h.pending() > 0;
                    (pending, h.keepalive.deadline(), c, d, placed, port, freed)
                }
                None => return,
            }
        };
        let mut placed_woke = false;
        let mut port_woke = false;
        let deadline = tokio::time::Instant::from_std(deadline);
        let (ctrl_writable, data_writable) =
            (ready.writable(Lane::Control), ready.writable(Lane::Data));
        // What this task waits to read is in the worker's poll before sleep, if it has one
        // (not what it does not read now: a level-readable socket would end every poll).
        let port_ready = port.as_deref().map(|p| &p.ready).filter(|_| !port_starved);
        let _polled = [
            sleep_ctrl.then(|| spin::watch(&ready.ctrl)),
            sleep.then(|| spin::watch(&ready.data)),
            placed.as_deref().map(spin::watch),
            port_ready.map(spin::watch),
        ];
        let step = tokio::select! {
            r = ready.input([sleep_ctrl, sleep]) => r.map(|(lane, g)| (Some(lane), g)),
            g = ready.data.writable(), if pending && data_writable => g.map(|g| (None, Some(g))),
            g = ready.ctrl.writable(), if pending && ctrl_writable => g.map(|g| (None, Some(g))),
            g = readable(placed.as_deref()) => {
                placed_woke = true;
                g.map(|g| (None, Some(g)))
            }
            g = readable(port_ready), if !port_starved => {
                port_woke = true;
                g.map(|g| (None, Some(g)))
            }
            _ = freed.notified(), if port_starved && port.is_some() => {
                port_woke = true;
                Ok((None, None))
            }
            _ = wake.notified() => Ok((None, None)),
            _ = tokio::time::sleep_until(deadline) => Ok((None, None)),
        };
        if let Some(l) = ioc
            .borrow_mut()
            .hosts
            .get_mut(&session)
            .and_then(|h| h.link.as_mut())
        {
            // The control channel's doorbell is read only when it woke this task (its
            // request stays armed otherwise, and is rung at most once); the data channel's
            // request is withdrawn every time, as it carries the traffic, and its doorbell
            // read only when it woke this task (one syscall less per wake-up by the host's
            // own LAN queue; a ring meanwhile wakes the task next).
            if matches!(step, Ok((Some(Lane::Control), Some(_)))) {
                l.wake(Lane::Control);
            }
            if matches!(step, Ok((Some(Lane::Data), Some(_)))) {
                l.wake(Lane::Data);
            } else {
                l.withdraw(Lane::Data);
            }
        }
        let (lane, guard) = match step {
            Ok(s) => s,
            Err(e) => break Err(HostEnd::Closed(format!("socket error: {e}"))),
        };
        // More waiting in its own LAN queue, or on the lane whose turn it had (its deficit
        // spent, see `HostQueue::drr`): the worker's other hosts run first.
        let more = {
            let mut st = ioc.borrow_mut();
            let now = Instant::now();
            let result = match lane {
                Some(lane) => {
                    if let Some(h) = st.hosts.get_mut(&session) {
                        h.keepalive.on_rx(now);
                    }
                    from_host::drive_host(&mut st, session, lane)
                }
                None => Ok(false),
            };
            let starved = st
                .hosts
                .get(&session)
                .and_then(|h| h.own_queue.as_ref())
                .is_some_and(|p| p.starved);
            // Its own LAN queue, when it woke this task or waits for credit (which came back
            // if this wake-up was the host's).
            let placed_progress = (result.is_ok() && (placed_woke || starved))
                .then(|| from_lan::read_own_queue(&mut st, session));
            let port_progress =
                (result.is_ok() && port_woke).then(|| from_port::drive_port(&mut st, session));
            port_starved = port_progress == Some(LanProgress::NoBuffers);
            let lane_more = lane.is_some() && matches!(result, Ok(false));
            match result {
                Ok(drained) => {
                    let WorkerState { hosts, cache, .. } = &mut *st;
                    let Some(h) = hosts.get_mut(&session) else {
                        return;
                    };
                    match h.keepalive.poll(now) {
                        Liveness::Idle => {}
                        Liveness::SendKeepalive => {
                            if let Some(l) = h.link.as_mut() {
                                l.session_mut().send(Lane::Control, &Message::Keepalive);
                            }
                        }
                        Liveness::Expired => {
                            break Err(HostEnd::Closed(
                                "silent beyond the keepalive timeout".into(),
                            ))
                        }
                    }
                    let flushed = match h.flush(cache) {
                        Ok(f) => f,
                        Err(e) => break Err(HostEnd::Failed(e)),
                    };
                    let unread = h.link.as_ref().map_or(0, |l| l.pending_on(Lane::Control));
                    if unread > MAX_CONTROL_BACKLOG {
                        break Err(HostEnd::Limit(format!(
                            "{unread} bytes of control messages unread (at most {MAX_CONTROL_BACKLOG})"
                        )));
                    }
                    st.kick_hosts();
                    if let Some(mut g) = guard {
                        // Readable and drained, or writable and still full: wait for the next edge.
                        let clear = if port_woke {
                            port_progress == Some(LanProgress::Drained)
                        } else if placed_woke {
                            placed_progress == Some(OwnQueueProgress::Drained)
                        } else {
                            (lane.is_some() && drained) || (lane.is_none() && !flushed)
                        };
                        if clear {
                            g.clear_ready();
                        }
                    }
                }
                // A peer that leaves sends Goodbye on the control channel and closes both;
                // the other channel's end of stream may be seen first. The control channel
                // is read anew (its last short read says nothing of what came since).
                Err(HostEnd::Failed(e)) if lane == Some(Lane::Data) => {
                    if let Some(l) = st.hosts.get_mut(&session).and_then(|h| h.link.as_mut()) {
                        l.withdraw(Lane::Control);
                    }
                    match from_host::drive_host(&mut st, session, Lane::Control) {
                        Err(HostEnd::Closed(why)) => break Err(HostEnd::Closed(why)),
                        _ => break Err(HostEnd::Failed(e)),
                    }
                }
                Err(e) => break Err(e),
            }
            placed_progress == Some(OwnQueueProgress::Budget)
                || port_progress == Some(LanProgress::Budget)
                || lane_more
        };
        if more {
            tokio::task::yield_now().await;
        }
    };
    let mut st = ioc.borrow_mut();
    match end {
        Err(HostEnd::Gone) | Ok(()) => {}
        Err(HostEnd::Closed(why)) => st.remove_host(session, &why, None),
        Err(HostEnd::Limit(why)) => st.remove_host_over_limit(session, &why),
        Err(HostEnd::Failed(e)) => {
            let why = e.to_string();
            st.remove_host(session, &why, Some(&e));
        }
    }
}

/// Waits until `ready` is readable; forever when there is none.
async fn readable(ready: Option<&Ready>) -> std::io::Result<Guard<'_>> {
    match ready {
        Some(r) => r.readable().await,
        None => std::future::pending().await,
    }
}
