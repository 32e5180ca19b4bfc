//! One queue's connection to the IOC: its session set up on the handshaken channels, the
//! event loop that moves frames, answers the IOC and keeps the link alive until the
//! connection ends, and the pool flush on shutdown.

use crate::cfgutil::{feature_bits, Settings};
use crate::datapath::{self, tap_wanted, Outbound};
use crate::drops::Drops;
use crate::interface::{Carrier, Watch};
use crate::reconnect::Ended;
use crate::report::{Reporter, StatusLine};
use crate::spin;
use splitnet_config::HostConfig;
use splitnet_fabric::{self as fabric, FabricChannel, RegisteredLink};
use splitnet_messaging::adapter::shm::Spin;
use splitnet_messaging::endpoint::{Keepalive, Lane, LinkEvent, Liveness, Session};
use splitnet_messaging::memory::{DomainId, Registry};
use splitnet_messaging::sched::LimitConfig;
use splitnet_messaging::wire::{ErrorCode, Message, Queue};
use splitnet_netif::tap::Tap;
use splitnet_service::notify;
use std::io;
use std::time::{Duration, Instant};
use tokio::signal::unix::Signal;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Time allowed for the pool flush on shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a connection ended.
pub enum End {
    /// SIGTERM or SIGINT: exit.
    Shutdown,
    /// The IOC went away or broke the protocol: reconnect.
    Lost(String),
    /// The IOC said it is restarting (Goodbye Restarting): reconnect at once, the carrier
    /// kept for a while ([`crate::reconnect`]).
    Restarting,
}

impl End {
    /// How a Goodbye with `code` ends the connection.
    fn goodbye(code: ErrorCode) -> End {
        match code {
            ErrorCode::Restarting => End::Restarting,
            code => End::Lost(format!("IOC closed the connection ({code:?})")),
        }
    }
}

/// What ends a connection from outside: a signal, or the end of another queue's
/// connection (every queue's thread holds one).
pub struct Stop<'s> {
    term: &'s mut Signal,
    int: &'s mut Signal,
    /// Set when any queue's connection ended, to how it ended.
    ended: watch::Receiver<Option<Ended>>,
}

/// Why a [`Stop`] fired.
enum Reason {
    Signal,
    /// Another queue's connection ended so (a restarting IOC says so on each).
    QueueEnded(Ended),
}

impl<'s> Stop<'s> {
    /// Stops on SIGTERM (`term`), SIGINT (`int`) or once `ended` is set.
    pub fn new(
        term: &'s mut Signal,
        int: &'s mut Signal,
        ended: watch::Receiver<Option<Ended>>,
    ) -> Stop<'s> {
        Stop { term, int, ended }
    }

    /// Waits for a signal or the end of another queue (cancel-safe).
    async fn wait(&mut self) -> Reason {
        tokio::select! {
            _ = self.term.recv() => Reason::Signal,
            _ = self.int.recv() => Reason::Signal,
            e = self.ended.wait_for(Option::is_some) => {
                Reason::QueueEnded(e.ok().and_then(|e| *e).unwrap_or(Ended::Lost))
            }
        }
    }
}

/// One queue's connection to the IOC.
pub struct Conn<'a> {
    /// The TAP queue it serves; the first also carries the configuration and the carrier.
    queue: Queue,
    tap: &'a Tap,
    tap_ready: &'a fabric::Ready,
    peer: String,
    tl: RegisteredLink,
    reg: Registry,
    /// Frames from the TAP on their way to the IOC.
    out: Outbound,
    keepalive: Keepalive,
    /// sd0's settings agreed with the IOC (the first queue's connection).
    settings: Settings,
    /// Next look at sd0's settings, and the kernel's reports of them.
    watch: Watch,
    /// Readiness of those reports' socket (`None`: not followed).
    watch_ready: Option<fabric::Ready>,
    carrier: Carrier,
    /// Frames from the IOC dropped, by cause (those to it: [`Outbound::drops`]).
    rx_drops: Drops,
    /// Where it reports: the snapshot (first queue) or its published counters.
    report: Reporter,
    /// Over shared memory: how long to poll before sleeping (`None`: never poll).
    spin: Option<Spin>,
}

impl<'a> Conn<'a> {
    /// Sets up `queue`'s session on the handshaken channels `ctrl` and `data` (its pools,
    /// and, on the first queue, the CfgUtil requests for sd0's settings); reports to
    /// `report`.
    pub fn new(
        cfg: &HostConfig,
        queue: Queue,
        tap: &'a Tap,
        tap_ready: &'a fabric::Ready,
        ctrl: FabricChannel,
        data: FabricChannel,
        report: Reporter,
    ) -> io::Result<Conn<'a>> {
        // Offloads as configured, again for each IOC (the last one may have refused them);
        // they belong to the interface, so the first queue sets them.
        let features = match queue.is_first() {
            true => feature_bits(&tap.enable_offloads(cfg.interface.offload)?),
            false => 0,
        };
        let sc = cfg.pools.session_config();
        let mut reg = Registry::new(cfg.pools.max_granted_bytes);
        // Over shared memory the IOC places its frames straight into the pools.
        if let Some(arena) = data.pools() {
            reg.attach_arena(DomainId(1), arena)
                .map_err(|e| io::Error::other(format!("cannot lay out pools: {e}")))?;
        }
        let mut session = Session::new(DomainId(1), sc);
        session
            .start(&mut reg)
            .map_err(|e| io::Error::other(format!("cannot register pools: {e}")))?;
        let mut tl = RegisteredLink::new(session, ctrl, data)?;
        // Over a byte stream what is in flight waits in the socket ahead of every later
        // frame: a smaller limit than over the shared-memory ring (see LimitConfig::stream).
        let limit = match tl.link.places_writes() {
            true => LimitConfig::default(),
            false => LimitConfig::stream(),
        };
        let spin = spin::configured(cfg, &tl.ready);
        let settings = Settings::new(cfg, features);
        if queue.is_first() {
            settings.request_initial(tl.link.session_mut());
        }
        let watch = Watch::new(&cfg.interface.name, queue.is_first());
        let watch_ready = watch.socket().and_then(|w| fabric::Ready::reading(w).ok());
        Ok(Conn {
            queue,
            tap,
            tap_ready,
            peer: cfg.fabric.ioc.to_string(),
            tl,
            reg,
            out: Outbound::new(limit, queue.count > 1),
            keepalive: Keepalive::new(
                cfg.fabric.keepalive_interval(),
                cfg.fabric.keepalive_timeout(),
                Instant::now(),
            ),
            settings,
            watch,
            watch_ready,
            carrier: Carrier::new(false),
            rx_drops: Drops::default(),
            report,
            spin,
        })
    }

    /// sd0's carrier was kept on through a restarting IOC: it stays until the new session
    /// knows the MAC and MTU, then follows the IOC's NIC as usual.
    pub fn carrier_held(&mut self) {
        self.carrier = Carrier::new(true);
    }

    /// The TAP was re-attached and this is its first connection (`keep`): its MTU, and
    /// its MAC if the IOC's, are kept rather than set anew.
    pub fn keep_mtu(&mut self, keep: bool) {
        self.settings.keep_mtu = keep;
    }

    /// Moves frames until `stop` fires (a signal: the pools are flushed first) or the
    /// connection is lost. The first queue also keeps sd0's settings and carrier, sends
    /// READY=1 once (`ready_sent`) and the STATUS= line; every queue kicks `watchdog`.
    pub async fn run(
        &mut self,
        stop: &mut Stop<'_>,
        ready_sent: &mut bool,
        watchdog: &mut notify::Watchdog,
    ) -> End {
        let mut events = Vec::new();
        let mut status = StatusLine::new(self.tl.link.stats());
        let first = self.queue.is_first();
        loop {
            if let Err(e) = self.tl.link.flush() {
                return End::Lost(e.to_string());
            }
            self.tl.link.reclaim(self.out.buffers());
            if first {
                self.carrier.update(&self.settings, self.tap, ready_sent);
            }
            let tap_wanted = tap_wanted(self.carrier.is_on() || !first, self.out.can_read());
            let pending = self.tl.link.pending() > 0;
            let deadline = tokio::time::Instant::from_std(self.keepalive.deadline());
            // Shared memory: ask for the doorbell; records may be waiting already. Before
            // sleeping, poll a while (adaptively) for what would wake us.
            let mut sleep = self.tl.link.prepare_sleep(Lane::Data);
            let mut idle_since = None;
            if sleep {
                (sleep, idle_since) = spin::poll_before_sleep(
                    self.spin.as_mut(),
                    &mut self.tl.link,
                    self.tap,
                    tap_wanted,
                );
            }
            let sleep_ctrl = self.tl.link.prepare_sleep(Lane::Control);
            let RegisteredLink { ready, link } = &mut self.tl;
            let (ctrl_writable, data_writable) =
                (ready.writable(Lane::Control), ready.writable(Lane::Data));
            let mut rx_seen = false;
            // Woken by what a poll before sleeping could have caught (the doorbell, the TAP).
            let mut woke_for_input = false;
            let step: Result<(), String> = tokio::select! {
                r = stop.wait() => match r {
                    Reason::Signal => return self.shutdown().await,
                    Reason::QueueEnded(Ended::Restarting) => return End::Restarting,
                    Reason::QueueEnded(Ended::Lost) => return End::Lost("another queue's connection ended".into()),
                },
                g = self.tap_ready.readable(), if tap_wanted => match g {
                    Ok(mut g) => {
                        woke_for_input = true;
                        if self.out.read_tap(self.tap, link) {
                            g.clear_ready();
                        }
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                },
                r = ready.input([sleep_ctrl, sleep]) => match r {
                    Ok((lane, g)) => {
                        if g.is_some() {
                            // Woken by that lane's doorbell (or socket): withdraw its request.
                            link.wake(lane);
                            woke_for_input |= lane == Lane::Data;
                        }
                        rx_seen = true;
                        datapath::poll_lane(link, &mut self.reg, self.tap, &mut self.rx_drops, lane, g, &mut events)
                    }
                    Err(e) => Err(e.to_string()),
                },
                g = ready.data.writable(), if pending && data_writable => match g {
                    Ok(mut g) => match link.flush() {
                        Ok(true) => Ok(()),
                        Ok(false) => { g.clear_ready(); Ok(()) }
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                },
                g = ready.ctrl.writable(), if pending && ctrl_writable => match g {
                    Ok(mut g) => match link.flush() {
                        Ok(true) => Ok(()),
                        Ok(false) => { g.clear_ready(); Ok(()) }
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                },
                g = reports(self.watch_ready.as_ref()) => {
                    match g {
                        Ok(mut g) => {
                            if self.watch.on_reports(&mut self.settings, link.session_mut()) {
                                g.clear_ready();
                            }
                        }
                        Err(e) => {
                            warn!("waiting for rtnetlink reports failed: {e}");
                            self.watch_ready = None;
                        }
                    }
                    Ok(())
                },
                _ = tokio::time::sleep_until(deadline) => Ok(()),
            };
            if let Err(why) = step {
                // A leaving IOC sends Goodbye on the control channel and closes both; the
                // data channel's end of stream may be seen first.
                let _ = datapath::poll_lane(
                    &mut self.tl.link,
                    &mut self.reg,
                    self.tap,
                    &mut self.rx_drops,
                    Lane::Control,
                    None,
                    &mut events,
                );
                for ev in events.drain(..) {
                    if let LinkEvent::Goodbye(code) = ev {
                        return End::goodbye(code);
                    }
                }
                return End::Lost(why);
            }
            let now = Instant::now();
            spin::woke(self.spin.as_mut(), idle_since, woke_for_input, now);
            if rx_seen {
                self.keepalive.on_rx(now);
            }
            for ev in events.drain(..) {
                if let Some(end) = self.on_event(ev) {
                    return end;
                }
            }
            self.tl.link.session_mut().flush_credits(&mut self.reg);
            // What this wake-up moved (a frame read from the TAP, the frames credits let go,
            // credits returned) goes out before the housekeeping below, which reads /proc:
            // a sparse ping waited for it on every wake-up.
            if let Err(e) = self.tl.link.flush() {
                return End::Lost(e.to_string());
            }
            // The keepalive timer turns this loop at least every keepalive interval.
            watchdog.kick(now);
            if first {
                let session = self.tl.link.session_mut();
                if self.watch.poll(now, &mut self.settings, session) {
                    self.report.refresh_details(now, session, &self.settings);
                }
                status.update(now, self.tl.link.stats(), &self.peer, self.carrier.is_on());
            }
            self.refresh_counters();
            match self.keepalive.poll(now) {
                Liveness::Idle => {}
                Liveness::SendKeepalive => self
                    .tl
                    .link
                    .session_mut()
                    .send(Lane::Control, &Message::Keepalive),
                Liveness::Expired => {
                    return End::Lost("IOC silent beyond the keepalive timeout".into())
                }
            }
        }
    }

    fn on_event(&mut self, ev: LinkEvent) -> Option<End> {
        match ev {
            LinkEvent::Credits => self.out.on_credits(&mut self.tl.link),
            LinkEvent::CfgReply {
                code, status, data, ..
            } => {
                let session = self.tl.link.session_mut();
                if let Some(c) = self
                    .settings
                    .on_reply(session, self.tap, code, status, &data)
                {
                    self.report.ioc_counters(c);
                }
            }
            LinkEvent::CfgRequest { txn, code, data } => {
                let first = self.queue.is_first();
                let session = self.tl.link.session_mut();
                self.settings.on_request(session, first, txn, code, &data);
            }
            LinkEvent::Goodbye(code) => return Some(End::goodbye(code)),
            LinkEvent::PoolGet(o) => debug!(?o, "pool request from the IOC"),
            LinkEvent::Flushed { .. } => {}
            LinkEvent::RefusedInline { len } => {
                self.rx_drops.rx_refused_inline += 1;
                debug!(len, "refused a SendData frame one of our pools could hold");
            }
        }
        None
    }

    /// SIGTERM: flush pools with the IOC (both directions), say goodbye, stop.
    async fn shutdown(&mut self) -> End {
        if self.queue.is_first() {
            notify::stopping();
            info!("shutting down: flushing pools with the IOC");
            let _ = self.tap.set_carrier(false);
        }
        self.tl.link.session_mut().start_flush(&mut self.reg);
        let deadline = tokio::time::Instant::now() + FLUSH_TIMEOUT;
        let mut events = Vec::new();
        while !self.tl.link.session().is_flushed() {
            if self.tl.link.flush().is_err() {
                break;
            }
            let sleeps = [Lane::Control, Lane::Data].map(|l| self.tl.link.prepare_sleep(l));
            let RegisteredLink { ready, link } = &mut self.tl;
            let r = tokio::select! {
                r = ready.input(sleeps) => r,
                _ = tokio::time::sleep_until(deadline) => break,
            };
            let Ok((lane, g)) = r else { break };
            if g.is_some() {
                link.wake(lane);
            }
            if datapath::poll_lane(
                link,
                &mut self.reg,
                self.tap,
                &mut self.rx_drops,
                lane,
                g,
                &mut events,
            )
            .is_err()
            {
                break;
            }
            events.clear();
        }
        let flushed = self.tl.link.session().is_flushed();
        self.tl.link.goodbye(ErrorCode::ShuttingDown);
        if flushed {
            info!("pools flushed");
        } else {
            warn!("pool flush incomplete within {FLUSH_TIMEOUT:?}");
        }
        End::Shutdown
    }

    /// Its counters to where it reports: the snapshot (first queue, with the further
    /// queues' added in) or its published counters.
    fn refresh_counters(&self) {
        let drops = self.rx_drops + self.out.drops();
        let link = &self.tl.link;
        match self.queue.is_first() {
            true => {
                let carrier = self.carrier.is_on();
                self.report
                    .refresh_snapshot(link, drops, self.out.limit(), carrier)
            }
            false => self.report.publish(link, drops),
        }
    }

    /// Closes the link, giving back its pools and send buffers; the frames lost with it are
    /// counted and reported, and every drop of the connection logged.
    pub fn close(mut self) {
        let unsent = self.tl.link.close(&mut self.reg, self.out.buffers());
        self.out.close(unsent);
        if self.rx_drops.rx() > 0 {
            info!(drops = ?self.rx_drops, "frames from the IOC dropped");
        }
        self.refresh_counters();
    }
}

/// Waits until the kernel's reports are readable; forever when they are not followed.
async fn reports(ready: Option<&fabric::Ready>) -> io::Result<fabric::Guard<'_>> {
    match ready {
        Some(r) => r.readable().await,
        None => std::future::pending().await,
    }
}
