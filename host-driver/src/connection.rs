//! One queue's connection to the IOC: its session set up on the handshaken channels, the
//! event loop that moves frames, answers the IOC and keeps the link alive until the
//! connection ends, and the pool flush on shutdown.

use crate::announcement::{self, Announce};
use crate::cfgutil::{feature_bits, Settings};
use crate::datapath::{self, tap_wanted, Outbound};
use crate::drops::Drops;
use crate::interface::{Carrier, Watch};
use crate::reconnect::Ended;
use crate::report::{Reporter, StatusLine};
use crate::spin;
use splitnet_config::HostConfig;
use splitnet_fabric::{self as fabric, FabricChannel, RegisteredLink};
use splitnet_messaging::endpoint::{Keepalive, Lane, LinkEvent, Liveness, Session};
use splitnet_messaging::memory::{DomainId, Registry};
use splitnet_messaging::sched::LimitConfig;
use splitnet_messaging::wire::{self, CfgCode, ErrorCode, HelloReply, Message, Queue};
use splitnet_netif::netdev;
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
    /// The IOC's NIC is down while a standby's is up ([`Conn::move_on_nic_down`]): move.
    NicDown,
    /// A promoted standby's IOC answered Activate Ok at this instant: the session is the
    /// host's active one; run it again.
    Activated(Instant),
    /// The host goes back to the primary IOC (`fabric.failback_after_s`).
    Failback,
}

/// Why a standby session stopped ([`Conn::run_standby`]).
pub enum StandbyEnd {
    /// It is ready to take over (`true`: it answered, its MAC is sd0's, its NIC is up), or
    /// no longer: run it again.
    Ready(bool),
    /// It cannot serve as this host's standby (its MAC is not sd0's): said why.
    Refused(String),
    /// Its session ended.
    Lost(String),
}

/// What a queue's session is to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// It carries sd0's frames.
    Active,
    /// A warm standby: no frame, sd0 untouched.
    Standby,
    /// Promoted: Activate sent, frames held until the IOC answers.
    Activating,
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
    poll: Option<spin::Poll>,
    role: Role,
    /// A standby's IOC: its MAC matches sd0's (`None`: not answered yet), its NIC is up.
    standby_mac: Option<bool>,
    standby_nic: bool,
    /// End the session when the IOC's NIC goes down: a standby's is up.
    move_on_nic_down: bool,
    /// The IOC reported its NIC's state (GetLink or LinkChange).
    nic_reported: bool,
    /// Offloads configured (`interface.offload`), set on sd0 when a standby is promoted.
    offload: bool,
    /// Rounds of sd0's addresses after a move, and the configured count and interval.
    announce: Option<Announce>,
    announce_cfg: (u32, Duration),
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
        let mut c = Conn::open(cfg, queue, tap, tap_ready, ctrl, data, report, features)?;
        match queue.is_first() {
            true => c.settings.request_initial(c.tl.link.session_mut()),
            false => c.settings.request_features(c.tl.link.session_mut()),
        }
        Ok(c)
    }

    /// The session of `queue` on the channels, sd0's `features` told to the IOC; nothing
    /// asked yet.
    #[allow(clippy::too_many_arguments)]
    fn open(
        cfg: &HostConfig,
        queue: Queue,
        tap: &'a Tap,
        tap_ready: &'a fabric::Ready,
        ctrl: FabricChannel,
        data: FabricChannel,
        report: Reporter,
        features: u64,
    ) -> io::Result<Conn<'a>> {
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
        let tl = RegisteredLink::new(session, ctrl, data)?;
        // Over a byte stream what is in flight waits in the socket ahead of every later
        // frame: a smaller limit than over the shared-memory ring (see LimitConfig::stream).
        let limit = match tl.link.places_writes() {
            true => LimitConfig::default(),
            false => LimitConfig::stream(),
        };
        let poll = spin::Poll::configured(cfg, &tl.ready, tap);
        let settings = Settings::new(cfg, features, queue.is_first());
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
            poll,
            role: Role::Active,
            standby_mac: None,
            standby_nic: false,
            move_on_nic_down: false,
            nic_reported: false,
            offload: cfg.interface.offload,
            announce: None,
            announce_cfg: (cfg.fabric.announce_count, cfg.fabric.announce_interval()),
        })
    }

    /// A standby session to another IOC on the handshaken channels (STANDBY agreed): its
    /// pools advertised, sd0 untouched; it asks only for the MAC and the link state.
    pub fn standby(
        cfg: &HostConfig,
        tap: &'a Tap,
        tap_ready: &'a fabric::Ready,
        ctrl: FabricChannel,
        data: FabricChannel,
        report: Reporter,
    ) -> io::Result<Conn<'a>> {
        let queue = Queue {
            index: 0,
            count: cfg.interface.queues as u8,
        };
        let mut c = Conn::open(cfg, queue, tap, tap_ready, ctrl, data, report, 0)?;
        c.role = Role::Standby;
        c.watch = Watch::new(&cfg.interface.name, false);
        c.watch_ready = None;
        let s = c.tl.link.session_mut();
        s.cfg_request(CfgCode::GetMac, &[]);
        s.cfg_request(CfgCode::GetLink, &[]);
        Ok(c)
    }

    /// The IOC's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Reports as the session of IOC `peer` to `report` (a promoted standby takes the
    /// snapshot over).
    pub fn serve_as(&mut self, peer: String, report: Reporter) {
        self.peer = peer;
        self.report = report;
    }

    /// Keeps the liveness interval the IOC agreed in `flags` (docs/protocol.md 6.4): the IOC
    /// counts as gone after `misses` of them without a word.
    pub fn agree_liveness(&mut self, flags: u32, misses: u32, keepalive: Duration) {
        let Some(ms) = HelloReply::liveness_ms(flags) else {
            return;
        };
        let timeout = Duration::from_millis(u64::from(ms)) * misses;
        let interval = keepalive.min(timeout / 2);
        self.keepalive = Keepalive::new(interval, timeout, Instant::now());
    }

    /// Whether this standby may take over: it answered, its MAC is sd0's, its NIC is up.
    pub fn standby_ready(&self) -> bool {
        self.standby_mac == Some(true) && self.standby_nic
    }

    /// End the active session when its IOC's NIC goes down (a standby's is up): `on`.
    pub fn move_on_nic_down(&mut self, on: bool) {
        self.move_on_nic_down = on;
    }

    /// Makes this standby the host's active session: Activate is sent, and once the IOC
    /// answers Ok the frames flow, sd0's settings are asked for as on a new connection
    /// (its MAC and MTU kept) and its addresses announced. The carrier stays on meanwhile.
    pub fn promote(&mut self) -> io::Result<()> {
        let features = feature_bits(&self.tap.enable_offloads(self.offload)?);
        self.settings.features = features;
        self.settings.keep_mtu = true;
        self.role = Role::Activating;
        self.carrier = Carrier::new(true);
        self.watch = Watch::new(&self.settings.name, true);
        self.watch_ready = self
            .watch
            .socket()
            .and_then(|w| fabric::Ready::reading(w).ok());
        self.tl
            .link
            .session_mut()
            .cfg_request(CfgCode::Activate, &[]);
        Ok(())
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

    /// Moves frames until `stop` fires (a signal: [`End::Shutdown`], after which the caller
    /// flushes the pools with [`Conn::shutdown`]) or the connection is lost. The first queue also keeps sd0's settings and carrier, sends
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
        if self.move_on_nic_down && self.nic_reported && !self.settings.ioc_nic_up {
            return End::NicDown;
        }
        loop {
            if let Err(e) = self.tl.link.flush() {
                return End::Lost(e.to_string());
            }
            self.tl.link.reclaim(self.out.buffers());
            if first {
                self.carrier.update(&self.settings, self.tap, ready_sent);
            }
            // A promoted standby sends nothing until its IOC holds the host's MACs.
            let sending = self.role == Role::Active && (self.carrier.is_on() || !first);
            let tap_wanted = tap_wanted(sending, self.out.can_read());
            let pending = self.tl.link.pending() > 0;
            let due = self.announce.as_ref().map(Announce::next);
            let deadline = self.keepalive.deadline().min(due.unwrap_or(far_future()));
            let deadline = tokio::time::Instant::from_std(deadline);
            // Shared memory: ask for the doorbell; records may be waiting already (a queue
            // pair: arm it). Before sleeping, poll a while (adaptively) for what would wake
            // us: over a socket the control lane too.
            let polls_ctrl = self.poll.as_ref().is_some_and(|p| p.covers(Lane::Control));
            let mut sleep = self.tl.link.prepare_sleep(Lane::Data);
            let mut sleep_ctrl = polls_ctrl && self.tl.link.prepare_sleep(Lane::Control);
            let mut idle_since = None;
            if sleep && (sleep_ctrl || !polls_ctrl) {
                (sleep, idle_since) = spin::poll_before_sleep(
                    self.poll.as_mut(),
                    &mut self.tl.link,
                    self.tap,
                    tap_wanted,
                );
            }
            if !polls_ctrl {
                sleep_ctrl = self.tl.link.prepare_sleep(Lane::Control);
            }
            let RegisteredLink { ready, link } = &mut self.tl;
            let (ctrl_writable, data_writable) =
                (ready.writable(Lane::Control), ready.writable(Lane::Data));
            let mut rx_seen = false;
            // Woken by what a poll before sleeping could have caught (the doorbell, the TAP).
            let mut woke_for_input = false;
            let step: Result<(), String> = tokio::select! {
                r = stop.wait() => match r {
                    Reason::Signal => return End::Shutdown,
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
                            woke_for_input |= lane == Lane::Data || polls_ctrl;
                        }
                        rx_seen = true;
                        datapath::poll_lane(link, &mut self.reg, Some(self.tap), &mut self.rx_drops, lane, g, &mut events)
                    }
                    Err(e) => Err(e.to_string()),
                },
                g = ready.data.writable(), if pending && data_writable => flush_on_writable(g, link),
                g = ready.ctrl.writable(), if pending && ctrl_writable => flush_on_writable(g, link),
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
                // data channel's end of stream may be seen first. The control channel is
                // read anew (its last short read says nothing of what came since).
                self.tl.link.withdraw(Lane::Control);
                let _ = datapath::poll_lane(
                    &mut self.tl.link,
                    &mut self.reg,
                    Some(self.tap),
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
            spin::woke(self.poll.as_mut(), idle_since, woke_for_input, now);
            if rx_seen {
                self.keepalive.on_rx(now);
            }
            for ev in events.drain(..) {
                if let Some(end) = self.on_event(ev) {
                    return end;
                }
            }
            self.announce_due(now);
            self.tl.link.session_mut().flush_idle(&mut self.reg);
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
            if self.keepalive_expired(now) {
                return End::Lost("IOC silent beyond the keepalive timeout".into());
            }
        }
    }

    fn on_event(&mut self, ev: LinkEvent) -> Option<End> {
        match ev {
            LinkEvent::Credits => self.out.on_credits(&mut self.tl.link),
            LinkEvent::CfgReply {
                code: CfgCode::Activate,
                status,
                data,
                ..
            } => {
                if status != ErrorCode::Ok {
                    return Some(End::Lost(format!(
                        "the standby IOC refused to take the host over ({status:?})"
                    )));
                }
                let now = Instant::now();
                info!(ioc = %self.peer, "standby IOC activated: it holds the host's MACs, frames flow");
                self.role = Role::Active;
                self.settings.request_initial(self.tl.link.session_mut());
                let (count, interval) = self.announce_cfg;
                self.announce = Announce::new(count, interval, now, &data);
                self.announce_due(now);
                return Some(End::Activated(now));
            }
            LinkEvent::CfgReply {
                code, status, data, ..
            } => {
                if code == CfgCode::GetLink && status == ErrorCode::Ok {
                    self.nic_reported = true;
                }
                let session = self.tl.link.session_mut();
                if let Some(c) = self
                    .settings
                    .on_reply(session, self.tap, code, status, &data)
                {
                    self.report.ioc_counters(c);
                }
                self.out.set_express(self.settings.express);
            }
            LinkEvent::CfgRequest { txn, code, data } => {
                let first = self.queue.is_first();
                let session = self.tl.link.session_mut();
                self.settings.on_request(session, first, txn, code, &data);
                if code == CfgCode::LinkChange && first {
                    self.nic_reported = true;
                }
            }
            LinkEvent::Goodbye(code) => return Some(End::goodbye(code)),
            LinkEvent::PoolGet(o) => debug!(?o, "pool request from the IOC"),
            LinkEvent::Flushed { .. } => {}
            LinkEvent::RefusedInline { len } => {
                self.rx_drops.rx_refused_inline += 1;
                debug!(len, "refused a SendData frame one of our pools could hold");
            }
        }
        if self.move_on_nic_down && self.nic_reported && !self.settings.ioc_nic_up {
            return Some(End::NicDown);
        }
        None
    }

    /// The keepalive timer's turn at `now`: a Keepalive sent after an interval of silence;
    /// true when nothing came from the IOC for the timeout.
    fn keepalive_expired(&mut self, now: Instant) -> bool {
        match self.keepalive.poll(now) {
            Liveness::Idle => false,
            Liveness::SendKeepalive => {
                let s = self.tl.link.session_mut();
                s.send(Lane::Control, &Message::Keepalive);
                false
            }
            Liveness::Expired => true,
        }
    }

    /// Announces sd0 through this IOC when a round is due (after a move): the frames of
    /// [`announcement::frames`].
    fn announce_due(&mut self, now: Instant) {
        let Some((bridged, last)) = self.announce.as_mut().and_then(|a| a.due(now)) else {
            return;
        };
        let name = &self.settings.name;
        let frames = announcement::frames(name, bridged);
        if last {
            self.announce = None;
        }
        match frames {
            Ok(frames) => {
                let sent: usize = frames
                    .iter()
                    .map(|f| usize::from(self.out.inject(f, &mut self.tl.link)))
                    .sum();
                debug!(sent, frames = frames.len(), "announced {name}");
            }
            Err(e) => warn!("cannot read the addresses of {name} to announce them: {e}"),
        }
    }

    /// Keeps a standby session warm until it ends or its readiness changes: its pools
    /// advertised, Keepalives both ways, its MAC checked against sd0's and its NIC's state
    /// followed; any frame it would deliver dropped (`rx_standby`), sd0 never touched.
    pub async fn run_standby(&mut self) -> StandbyEnd {
        let mut events = Vec::new();
        let was_ready = self.standby_ready();
        loop {
            if let Err(e) = self.tl.link.flush() {
                return StandbyEnd::Lost(e.to_string());
            }
            self.tl.link.reclaim(self.out.buffers());
            let pending = self.tl.link.pending() > 0;
            let deadline = tokio::time::Instant::from_std(self.keepalive.deadline());
            let sleeps = [Lane::Control, Lane::Data].map(|l| self.tl.link.prepare_sleep(l));
            let RegisteredLink { ready, link } = &mut self.tl;
            let (ctrl_writable, data_writable) =
                (ready.writable(Lane::Control), ready.writable(Lane::Data));
            let step = tokio::select! {
                r = ready.input(sleeps) => match r {
                    Ok((lane, g)) => {
                        if g.is_some() {
                            link.wake(lane);
                        }
                        self.keepalive.on_rx(Instant::now());
                        datapath::poll_lane(link, &mut self.reg, None, &mut self.rx_drops, lane, g, &mut events)
                    }
                    Err(e) => Err(e.to_string()),
                },
                g = ready.data.writable(), if pending && data_writable => flush_on_writable(g, link),
                g = ready.ctrl.writable(), if pending && ctrl_writable => flush_on_writable(g, link),
                _ = tokio::time::sleep_until(deadline) => Ok(()),
            };
            if let Err(why) = step {
                return StandbyEnd::Lost(why);
            }
            for ev in events.drain(..) {
                match ev {
                    LinkEvent::Goodbye(code) => {
                        return StandbyEnd::Lost(format!("IOC closed the connection ({code:?})"))
                    }
                    LinkEvent::CfgReply {
                        code: CfgCode::GetMac,
                        status: ErrorCode::Ok,
                        data,
                        ..
                    } => {
                        let theirs = wire::parse_mac(&data).ok();
                        let ours = netdev::mac(&self.settings.name).ok();
                        if theirs.is_none() || theirs != ours {
                            return StandbyEnd::Refused(format!(
                                "it gives this host the MAC {}, and {} has {}: the host's [[auth.hosts]] entry needs the same `mac` on every IOC",
                                theirs.map_or("(none)".into(), |m| wire::fmt_mac(&m)),
                                self.settings.name,
                                ours.map_or("(none)".into(), |m| wire::fmt_mac(&m)),
                            ));
                        }
                        self.standby_mac = Some(true);
                    }
                    LinkEvent::CfgReply {
                        code: CfgCode::GetLink,
                        status: ErrorCode::Ok,
                        data,
                        ..
                    } => self.standby_nic = wire::parse_u8(&data) == Ok(1),
                    LinkEvent::CfgRequest { txn, code, data } => {
                        let status = match (code, wire::LinkChange::parse(&data)) {
                            (CfgCode::LinkChange, Ok(c)) => {
                                self.standby_nic = c.up;
                                ErrorCode::Ok
                            }
                            (CfgCode::LinkChange, Err(_)) => ErrorCode::Malformed,
                            _ => ErrorCode::Unsupported,
                        };
                        self.tl.link.session_mut().cfg_reply(txn, code, status, &[]);
                    }
                    LinkEvent::CfgReply { code, status, .. } if status != ErrorCode::Ok => {
                        return StandbyEnd::Refused(format!("it refused {code:?} ({status:?})"));
                    }
                    _ => {}
                }
            }
            self.tl.link.session_mut().flush_credits(&mut self.reg);
            self.refresh_counters();
            if self.keepalive_expired(Instant::now()) {
                return StandbyEnd::Lost("IOC silent beyond the agreed liveness".into());
            }
            if self.standby_ready() != was_ready {
                return StandbyEnd::Ready(self.standby_ready());
            }
        }
    }

    /// After [`End::Shutdown`] (SIGTERM): flush pools with the IOC (both directions), say
    /// goodbye, stop.
    pub async fn shutdown(&mut self) {
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
                Some(self.tap),
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
    }

    /// Ends the session with a Goodbye (`code`), for a host that leaves this IOC.
    pub fn goodbye(&mut self, code: ErrorCode) {
        self.tl.link.goodbye(code);
    }

    /// Its counters to where it reports: the snapshot (first queue, with the further
    /// queues' added in) or its published counters.
    fn refresh_counters(&self) {
        let drops = self.rx_drops + self.out.drops();
        let polls = self
            .poll
            .as_ref()
            .map(spin::Poll::counts)
            .unwrap_or_default();
        let link = &self.tl.link;
        match self.queue.is_first() {
            true => {
                let carrier = self.carrier.is_on();
                self.report
                    .refresh_snapshot(link, drops, polls, self.out.limit(), carrier)
            }
            false => self.report.publish(link, drops, polls),
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

/// A socket the link waits to write on became writable: flushes what waits, and clears the
/// readiness once the socket is full again.
fn flush_on_writable(
    g: io::Result<fabric::Guard<'_>>,
    link: &mut splitnet_messaging::endpoint::Link<FabricChannel>,
) -> Result<(), String> {
    let mut g = g.map_err(|e| e.to_string())?;
    match link.flush() {
        Ok(true) => Ok(()),
        Ok(false) => {
            g.clear_ready();
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// An instant no timer reaches.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

/// Waits until the kernel's reports are readable; forever when they are not followed.
async fn reports(ready: Option<&fabric::Ready>) -> io::Result<fabric::Guard<'_>> {
    match ready {
        Some(r) => r.readable().await,
        None => std::future::pending().await,
    }
}
