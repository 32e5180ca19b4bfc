//! The host driver's life: TAP up, connect with backoff, configure over CfgUtil, move
//! frames until the fabric is lost or a signal arrives, and start again.
//!
//! With several TAP queues, each further queue is served by a thread of its own over a
//! session of its own ([`crate::queues`]); the first queue's thread (this one) also carries
//! the configuration. The queues connect, and reconnect, together: when one ends, all do.

use crate::cfgutil::feature_bits;
use crate::connect::{self, connect, default_node_id, Identity};
use crate::connection::{Conn, End, StandbyEnd, Stop};
use crate::failover::{Cause, Failover, Next};
use crate::queues::Queues;
use crate::reconnect::{Ended, Reconnect};
use crate::report::{Reporter, SharedCounters};
use crate::snapshot::Snapshot;
use splitnet_config::HostConfig;
use splitnet_control::report::{offload_names, Interface};
use splitnet_fabric as fabric;
use splitnet_messaging::wire::{self, Queue};
use splitnet_netif::netdev;
use splitnet_netif::tap::Tap;
use splitnet_service::privilege::Capability;
use splitnet_service::{self as service, notify};
use std::cell::RefCell;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use thiserror::Error;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

/// A start-up failure: the one line printed before exiting.
#[derive(Debug, Error)]
pub enum StartError {
    /// The TAP could not be created.
    #[error("cannot create TAP interface {name}: {source} (needs CAP_NET_ADMIN and /dev/net/tun)")]
    Tap {
        /// Interface name.
        name: String,
        /// Cause.
        source: io::Error,
    },
    /// The metrics listener or the control socket could not be opened.
    #[error(transparent)]
    Endpoint(#[from] service::EndpointError),
    /// This host's keys could not be read.
    #[error("{0}")]
    Keys(String),
    /// Signal handlers or reactor registration failed.
    #[error("cannot set up the event loop: {0}")]
    Runtime(#[from] io::Error),
}

/// Runs until SIGTERM/SIGINT. Only start-up failures are errors; an unreachable IOC is not.
pub async fn run(cfg: HostConfig, control_socket: Option<PathBuf>) -> Result<(), StartError> {
    let cfg = Arc::new(cfg);
    let name = cfg.interface.name.clone();
    let id = Arc::new(Identity {
        ioc: cfg.fabric.ioc.clone(),
        node_id: cfg.fabric.node_id.unwrap_or_else(|| default_node_id(&name)),
        keys: connect::keys(&cfg.auth).map_err(StartError::Keys)?,
    });
    let tap_err = |source| StartError::Tap {
        name: name.clone(),
        source,
    };
    let mut more_taps: Vec<Arc<Tap>> = Tap::open_queues(&name, cfg.interface.queues.into())
        .map_err(tap_err)?
        .into_iter()
        .map(Arc::new)
        .collect();
    if more_taps.is_empty() {
        return Err(tap_err(io::Error::other("no TAP queue opened")));
    }
    let tap = more_taps.remove(0);
    // Persistent: sd0 outlives this process (restart, upgrade, crash), and the next driver
    // re-attaches to it with its addresses, routes, MAC and MTU.
    tap.set_persist(cfg.interface.persist).map_err(tap_err)?;
    let mut keep_mtu = tap.reattached();
    if tap.reattached() {
        info!(interface = %name, "re-attached to the existing interface: addresses, routes, MAC and MTU kept");
    }
    let offloads = tap
        .enable_offloads(cfg.interface.offload)
        .map_err(|source| StartError::Tap {
            name: name.clone(),
            source,
        })?;
    tap.set_carrier(false)?;
    info!(interface = %name, ?offloads, "TAP ready, carrier off until the fabric is up");
    crate::budget::budget(&cfg, 2 * service::memory::tcp_socket_max()).log();
    // Run by hand as root: from here on only sd0's settings (MTU, MAC, carrier) need a
    // capability, and over RDMA pinning the registered memory beyond RLIMIT_MEMLOCK (units
    // raise LimitMEMLOCK instead). Before any thread starts (a further queue's).
    let rdma = matches!(cfg.fabric.ioc, splitnet_config::FabricAddr::Rdma(_));
    let mut keep = vec![Capability::CAP_NET_ADMIN];
    if rdma {
        keep.push(Capability::CAP_IPC_LOCK);
    }
    // The queue threads take their class (scheduling.class) as they start: with the
    // capability where the daemon has it (by hand as root), else by the unit's limits.
    let class = crate::queues::sched_class(&cfg.scheduling);
    if class != service::sched::Class::Normal {
        keep.push(Capability::CAP_SYS_NICE);
    }
    service::privilege::keep_only_logged(&keep);
    // This thread serves queue 0 (and the standby beside it): the data path's class.
    service::sched::apply(class).map_err(|e| io::Error::other(format!("scheduling: {e}")))?;
    let tap_ready = fabric::Ready::reading(&tap)?;
    let snap = Rc::new(RefCell::new(Snapshot::new(
        cfg.fabric.ioc.to_string(),
        Interface {
            name: name.clone(),
            mac: netdev::mac(&name)
                .map(|m| wire::fmt_mac(&m))
                .unwrap_or_default(),
            mtu: netdev::mtu(&name).unwrap_or(0),
            carrier: false,
            promisc: false,
            multicast: 0,
            offloads: offload_names(feature_bits(&offloads)),
        },
    )));
    // Restarted, never handed over: nothing is passed to take up.
    let mut passed = service::fdstore::Inherited::default();
    service::serve_operators(
        snap.clone(),
        cfg.metrics.listen,
        control_socket,
        &mut passed,
    )
    .await?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let f = &cfg.fabric;
    let mut retry = Reconnect::new(f.reconnect_min(), f.reconnect_max(), f.restart_grace());
    let mut ready_sent = false;
    let mut watchdog = notify::Watchdog::from_env();
    let queue = Queue {
        index: 0,
        count: cfg.interface.queues as u8,
    };
    let ends: Vec<Arc<Identity>> = connect::endpoints(&cfg.fabric, &id)
        .into_iter()
        .map(Arc::new)
        .collect();
    let mut fo = Failover::new(
        ends.len(),
        f.failback_after(),
        f.reconnect_min(),
        STANDBY_RETRY_MAX,
    );
    // The warm standby beside the active session, and its session's token.
    let mut standby: Option<(Conn, usize, u64)> = None;
    // The IOC to connect to first when none is active, and whether sd0 keeps its carrier.
    let mut next_try = 0;
    let mut promoted: Option<(Conn, usize, u64)> = None;
    // A promoted standby's session, whose further queues join it once it is active.
    let mut further: Option<u64>;
    loop {
        watchdog.kick(Instant::now());
        let (mut conn, mut queues, at) = match promoted.take() {
            Some((mut conn, at, session)) => {
                // Its further queues join once the IOC answers Activate: a standby's
                // session takes none (docs/protocol.md 6.5).
                further = Some(session);
                let queues = Queues::none();
                let report = Reporter::first(snap.clone(), queues.counters());
                conn.serve_as(ends[at].ioc.to_string(), report);
                (conn, queues, at)
            }
            None => {
                further = None;
                let at = next_try % ends.len();
                let e = &ends[at];
                notify::status(&format!("connecting to IOC {}", e.ioc));
                let connect = async {
                    let timeout = cfg.fabric.keepalive_timeout();
                    let (ctrl, data, reply) = connect(
                        &cfg.fabric,
                        cfg.pools.max_granted_bytes,
                        e,
                        queue,
                        0,
                        timeout,
                        false,
                    )
                    .await
                    .map_err(|err| format!("IOC {} unreachable: {err}", e.ioc))?;
                    // The further queues join the first queue's session before any frame moves.
                    let queues = Queues::start(&cfg, &more_taps, e, reply.session).await?;
                    Ok::<_, String>((ctrl, data, reply, queues))
                };
                let conn = tokio::select! {
                    c = connect => c,
                    _ = term.recv() => return Ok(()),
                    _ = int.recv() => return Ok(()),
                };
                let (ctrl, data, reply, queues) = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        next_try += 1;
                        // Every IOC tried once in a row before waiting.
                        if next_try % ends.len() != 0 {
                            warn!("{e}; trying the next IOC");
                            continue;
                        }
                        let next = retry.failed(Instant::now());
                        if next.carrier_off {
                            let _ = tap.set_carrier(false);
                            warn!("the IOC did not come back within fabric.restart_grace_ms; carrier off");
                        }
                        match retry.holding() {
                            true => {
                                info!("{e}; the IOC is restarting: retrying in {:?}", next.wait)
                            }
                            false => warn!("{e}; retrying in {:?}", next.wait),
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(next.wait) => {}
                            _ = term.recv() => return Ok(()),
                            _ = int.recv() => return Ok(()),
                        }
                        continue;
                    }
                };
                let held = retry.holding();
                retry.connected();
                info!(
                    ioc = %e.ioc,
                    session = reply.session,
                    version = reply.version,
                    queues = queue.count,
                    data_sealed = data.is_sealed_stream(),
                    "fabric up"
                );
                snap.borrow_mut().connected(reply.session, reply.version);
                let report = Reporter::first(snap.clone(), queues.counters());
                let mut conn = Conn::new(&cfg, queue, &tap, &tap_ready, ctrl, data, report)?;
                conn.serve_as(
                    e.ioc.to_string(),
                    Reporter::first(snap.clone(), queues.counters()),
                );
                conn.agree_liveness(reply.flags, f.liveness_misses, f.keepalive_interval());
                conn.keep_mtu(std::mem::take(&mut keep_mtu));
                if held {
                    conn.carrier_held();
                }
                (conn, queues, at)
            }
        };
        fo.connected(at);
        next_try = at;
        snap.borrow_mut().ioc = ends[at].ioc.to_string();
        // The active session runs with the standby beside it; either one's news turns the
        // loop (both are cancel-safe between their steps).
        let end = loop {
            snap.borrow_mut().failover(&fo, &ends);
            conn.move_on_nic_down(standby.as_ref().is_some_and(|(s, _, _)| s.standby_ready()));
            let mut stop = Stop::new(&mut term, &mut int, queues.ended());
            let side = side(&cfg, &ends, &tap, &tap_ready, &mut standby, &fo);
            let timer = fo
                .next_timer(Instant::now())
                .map(tokio::time::Instant::from_std);
            let news = tokio::select! {
                biased;
                end = conn.run(&mut stop, &mut ready_sent, &mut watchdog) => Err(end),
                n = side => Ok(Some(n)),
                _ = sleep_until(timer) => Ok(None),
            };
            drop(stop);
            let now = Instant::now();
            match news {
                Err(End::Activated(when)) => {
                    if let Some(m) = fo.activated(when) {
                        info!(from = %ends[m.from].ioc, to = %ends[m.to].ioc, cause = %m.cause, took_ms = m.took.map_or(0, |d| d.as_millis() as u64), "moved to the standby IOC");
                    }
                    if let Some(session) = further.take().filter(|_| !more_taps.is_empty()) {
                        match Queues::start(&cfg, &more_taps, &ends[at], session).await {
                            Ok(q) => {
                                queues = q;
                                let report = Reporter::first(snap.clone(), queues.counters());
                                conn.serve_as(ends[at].ioc.to_string(), report);
                            }
                            Err(e) => {
                                break End::Lost(format!(
                                    "the standby IOC took the host over, and {e}"
                                ))
                            }
                        }
                    }
                }
                Err(end) => break end,
                Ok(Some(n)) => on_side(n, &mut fo, &mut standby, now),
                Ok(None) if fo.failback_due(now) => {
                    info!(primary = %ends[0].ioc, "failing back to the primary IOC (fabric.failback_after_s)");
                    break End::Failback;
                }
                Ok(None) => {}
            }
        };
        let now = Instant::now();
        let cause = match &end {
            End::NicDown => Cause::NicDown,
            End::Lost(why) if why.contains("silent") => Cause::Silent,
            _ => Cause::Closed,
        };
        if matches!(end, End::Shutdown) {
            conn.shutdown().await;
            if let Some((mut s, _, _)) = standby.take() {
                s.goodbye(wire::ErrorCode::ShuttingDown);
                s.close();
            }
        }
        queues.stop();
        // Leaving an IOC that may still live (its NIC down, a failback): it gives the
        // host's MACs up as its session ends.
        if matches!(end, End::NicDown | End::Failback) {
            conn.goodbye(wire::ErrorCode::Refused);
        }
        conn.close();
        let next = match end {
            End::Failback => fo.fail_back(now).map_or(Next::Reconnect, Next::Promote),
            End::Shutdown => Next::Reconnect,
            _ => fo.active_ended(cause, now),
        };
        if let (Next::Promote(to), Some((mut s, i, session))) = (next, standby.take()) {
            if i == to {
                warn!(from = %ends[at].ioc, to = %ends[to].ioc, %cause, "the active IOC is gone: moving to the standby");
                match s.promote() {
                    Ok(()) => {
                        promoted = Some((s, i, session));
                        snap.borrow_mut().connected(session, 1);
                        continue;
                    }
                    Err(e) => warn!("cannot take sd0's offloads for the standby: {e}"),
                }
            }
        }
        let ended = match end {
            End::Restarting => Ended::Restarting,
            _ => Ended::Lost,
        };
        if matches!(end, End::Shutdown) || retry.ended(ended, now) {
            let _ = tap.set_carrier(false);
        }
        snap.borrow_mut().disconnected();
        match end {
            End::Shutdown => {
                if cfg.interface.persist {
                    info!(
                        "stopped; {name} stays (carrier off) until a host-driver serves it again"
                    );
                } else {
                    info!("stopped; {name} goes with it (interface.persist = false)");
                }
                return Ok(());
            }
            End::Lost(why) => {
                warn!("fabric lost: {why}; carrier off, reconnecting");
            }
            End::NicDown | End::Failback | End::Activated(_) => {
                warn!("left the IOC; reconnecting");
            }
            End::Restarting => info!(
                "the IOC is restarting; carrier kept for up to {:?} while reconnecting",
                cfg.fabric.restart_grace()
            ),
        }
    }
}

/// Longest wait before a failed standby is tried again.
const STANDBY_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// What happened beside the active session.
enum Side<'a> {
    /// A standby session to IOC `.1` came up (token `.2`).
    Up(Box<Conn<'a>>, usize, u64),
    /// Trying IOC `.0` as a standby failed.
    Failed(usize, String),
    /// The warm standby stopped.
    Standby(StandbyEnd),
}

/// Keeps the standby: runs the warm one until it has news, or opens one when
/// [`Failover::standby_to_try`] names an IOC; waits forever otherwise.
async fn side<'a>(
    cfg: &Arc<HostConfig>,
    ends: &[Arc<Identity>],
    tap: &'a Tap,
    tap_ready: &'a fabric::Ready,
    standby: &mut Option<(Conn<'a>, usize, u64)>,
    fo: &Failover,
) -> Side<'a> {
    if let Some((s, _, _)) = standby.as_mut() {
        return Side::Standby(s.run_standby().await);
    }
    let Some(i) = fo.standby_to_try(Instant::now()) else {
        return std::future::pending().await;
    };
    let e = &ends[i];
    let timeout = cfg.fabric.keepalive_timeout();
    let queue = Queue {
        index: 0,
        count: cfg.interface.queues as u8,
    };
    let pools = cfg.pools.max_granted_bytes;
    let (ctrl, data, reply) = match connect(&cfg.fabric, pools, e, queue, 0, timeout, true).await {
        Ok(c) => c,
        Err(err) => return Side::Failed(i, err.to_string()),
    };
    if reply.flags & wire::HelloReply::STANDBY == 0 {
        return Side::Failed(i, "it does not keep standby sessions (an older IOC)".into());
    }
    let report = Reporter::further(SharedCounters::default());
    match Conn::standby(cfg, tap, tap_ready, ctrl, data, report) {
        Ok(mut c) => {
            let f = &cfg.fabric;
            c.agree_liveness(reply.flags, f.liveness_misses, f.keepalive_interval());
            c.serve_as(
                e.ioc.to_string(),
                Reporter::further(SharedCounters::default()),
            );
            Side::Up(Box::new(c), i, reply.session)
        }
        Err(err) => Side::Failed(i, err.to_string()),
    }
}

/// Takes the standby's news into `fo` (and `standby`).
fn on_side<'a>(
    n: Side<'a>,
    fo: &mut Failover,
    standby: &mut Option<(Conn<'a>, usize, u64)>,
    now: Instant,
) {
    match n {
        Side::Up(c, i, session) => {
            info!(ioc = %c.peer(), session, "standby session up");
            fo.standby_up(i);
            *standby = Some((*c, i, session));
        }
        Side::Failed(i, why) => {
            warn!(standby = i, "cannot keep a standby session: {why}");
            fo.standby_failed(i, now);
        }
        Side::Standby(StandbyEnd::Ready(r)) => {
            info!(ready = r, "standby IOC ready to take over");
            fo.standby_ready_now(r, now);
        }
        Side::Standby(end) => {
            let Some((s, i, _)) = standby.take() else {
                return;
            };
            match end {
                StandbyEnd::Refused(why) => {
                    tracing::error!(ioc = %s.peer(), "the standby IOC cannot serve this host: {why}")
                }
                StandbyEnd::Lost(why) => warn!(ioc = %s.peer(), "standby session lost: {why}"),
                StandbyEnd::Ready(_) => {}
            }
            s.close();
            fo.standby_failed(i, now);
        }
    }
}

/// Sleeps until `at`; forever without it.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
