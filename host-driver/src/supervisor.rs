//! The host driver's life: TAP up, connect with backoff, configure over CfgUtil, move
//! frames until the fabric is lost or a signal arrives, and start again.
//!
//! With several TAP queues, each further queue is served by a thread of its own over a
//! session of its own ([`crate::queues`]); the first queue's thread (this one) also carries
//! the configuration. The queues connect, and reconnect, together: when one ends, all do.

use crate::cfgutil::feature_bits;
use crate::connect::{self, connect, default_node_id, Identity};
use crate::connection::{Conn, End, Stop};
use crate::queues::Queues;
use crate::reconnect::{Ended, Reconnect};
use crate::report::Reporter;
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
    let keep: &[Capability] = if rdma {
        &[Capability::CAP_NET_ADMIN, Capability::CAP_IPC_LOCK]
    } else {
        &[Capability::CAP_NET_ADMIN]
    };
    service::privilege::keep_only_logged(keep);
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
    loop {
        watchdog.kick(Instant::now());
        notify::status(&format!("connecting to IOC {}", cfg.fabric.ioc));
        let connect = async {
            let timeout = cfg.fabric.keepalive_timeout();
            let (ctrl, data, reply) = connect(
                &cfg.fabric,
                cfg.pools.max_granted_bytes,
                &id,
                queue,
                0,
                timeout,
            )
            .await
            .map_err(|e| format!("IOC {} unreachable: {e}", cfg.fabric.ioc))?;
            // The further queues join the first queue's session before any frame moves.
            let queues = Queues::start(&cfg, &more_taps, &id, reply.session).await?;
            Ok::<_, String>((ctrl, data, reply, queues))
        };
        let conn = tokio::select! {
            c = connect => c,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        let (ctrl, data, reply, mut queues) = match conn {
            Ok(c) => c,
            Err(e) => {
                let next = retry.failed(Instant::now());
                if next.carrier_off {
                    let _ = tap.set_carrier(false);
                    warn!("the IOC did not come back within fabric.restart_grace_ms; carrier off");
                }
                match retry.holding() {
                    true => info!("{e}; the IOC is restarting: retrying in {:?}", next.wait),
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
            ioc = %cfg.fabric.ioc,
            session = reply.session,
            version = reply.version,
            queues = queue.count,
            data_sealed = data.is_sealed_stream(),
            "fabric up"
        );
        snap.borrow_mut().connected(reply.session, reply.version);
        let report = Reporter::first(snap.clone(), queues.counters());
        let mut conn = Conn::new(&cfg, queue, &tap, &tap_ready, ctrl, data, report)?;
        conn.keep_mtu(std::mem::take(&mut keep_mtu));
        if held {
            conn.carrier_held();
        }
        let mut stop = Stop::new(&mut term, &mut int, queues.ended());
        let end = conn.run(&mut stop, &mut ready_sent, &mut watchdog).await;
        let ended = match end {
            End::Restarting => Ended::Restarting,
            _ => Ended::Lost,
        };
        if matches!(end, End::Shutdown) || retry.ended(ended, Instant::now()) {
            let _ = tap.set_carrier(false);
        }
        queues.stop();
        conn.close();
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
            End::Restarting => info!(
                "the IOC is restarting; carrier kept for up to {:?} while reconnecting",
                cfg.fabric.restart_grace()
            ),
        }
    }
}
