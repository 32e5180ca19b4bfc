//! sd0 itself: the watch that turns what Linux tools change on it (MTU, promiscuous mode,
//! multicast groups) into CfgUtil requests, and its carrier.

use crate::cfgutil::Settings;
use splitnet_messaging::endpoint::Session;
use splitnet_messaging::wire::{self, CfgCode};
use splitnet_netif::link_watch::{self, LinkState, LinkWatch};
use splitnet_netif::netdev;
use splitnet_netif::tap::Tap;
use splitnet_service::notify;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The watch of sd0's settings: its MTU and flags as the kernel reports them (rtnetlink, the
/// promiscuity and all-multicast counts included: a bridge that takes sd0 as a port makes it
/// promiscuous without any flag a user sets), its multicast groups read every look (the
/// kernel reports no change of a link-layer group list). Without an rtnetlink socket, the MTU
/// and the user's flags are read every look too.
pub struct Watch {
    /// Next time sd0's settings are looked at.
    next: Instant,
    /// The rtnetlink socket and sd0's index, while the kernel's reports are followed.
    follow: Option<(LinkWatch, u32)>,
    states: Vec<LinkState>,
    /// sd0's promiscuity and all-multicast as last reported: taken once the MTU is agreed
    /// if they came before.
    reported: Option<(bool, bool)>,
}

impl Watch {
    /// A watch of interface `name` that looks at its first turn; it follows the kernel's
    /// reports when `follow` (the first queue's connection) and an rtnetlink socket opens.
    pub fn new(name: &str, follow: bool) -> Watch {
        let follow = follow
            .then(|| {
                let index = netdev::index(name)?;
                let mut w = LinkWatch::open()?;
                w.request(index)?;
                Ok::<_, std::io::Error>((w, index))
            })
            .and_then(|r| {
                r.map_err(|e| warn!("cannot follow {name} through rtnetlink ({e}): reading its MTU and flags every {LOOK:?} instead"))
                    .ok()
            });
        Watch {
            next: Instant::now(),
            follow,
            states: Vec::new(),
            reported: None,
        }
    }

    /// The rtnetlink socket, to wait on (`None`: sd0 is read every look instead).
    pub fn socket(&self) -> Option<&LinkWatch> {
        self.follow.as_ref().map(|(w, _)| w)
    }

    /// Reads the kernel's reports and asks the IOC for what changed on sd0 (on `session`).
    /// Returns whether the socket is drained.
    pub fn on_reports(&mut self, s: &mut Settings, session: &mut Session) -> bool {
        let Some((w, index)) = self.follow.as_mut() else {
            return true;
        };
        self.states.clear();
        match w.read(&mut self.states) {
            Ok(()) => {}
            Err(e) if link_watch::overrun(&e) => {
                debug!("rtnetlink reports dropped; asking again");
                let _ = w.request(*index);
                return false;
            }
            Err(e) => {
                warn!("following {} through rtnetlink failed ({e}): reading its MTU and flags every {LOOK:?} instead", s.name);
                self.follow = None;
                return true;
            }
        }
        let index = *index;
        for st in self.states.iter().filter(|st| st.index == index) {
            if let Some(mtu) = st.mtu {
                mtu_seen(mtu, s, session);
            }
            let flags = (st.promiscuous(), st.all_multicast());
            self.reported = Some(flags);
            flags_seen(flags.0, flags.1, s, session);
        }
        true
    }

    /// Maps what Linux tools did to the TAP onto CfgUtil (requests on `session`):
    /// `ip link set sd0 mtu N` becomes SetMtu (refused at once beyond the IOC's maximum, and
    /// reverted if the IOC refuses), `ip link set sd0 promisc on|off` (and allmulticast) becomes
    /// SetPromisc, a change of its multicast groups SetMulticast. Looks every [`LOOK`] once the
    /// MTU is agreed, and returns whether it looked.
    pub fn poll(&mut self, now: Instant, s: &mut Settings, session: &mut Session) -> bool {
        if now < self.next || !s.mtu_known {
            return false;
        }
        self.next = now + LOOK;
        if let (Some(_), Some((promisc, allmulti))) = (&self.follow, self.reported) {
            flags_seen(promisc, allmulti, s, session);
        } else if self.follow.is_none() {
            if let Ok(cur) = netdev::mtu(&s.name) {
                mtu_seen(cur, s, session);
            }
            if let Ok(flags) = netdev::flags(&s.name) {
                let promisc = flags & libc::IFF_PROMISC != 0;
                flags_seen(
                    promisc,
                    !promisc && flags & libc::IFF_ALLMULTI != 0,
                    s,
                    session,
                );
            }
        }
        match netdev::multicast(&s.name) {
            Ok(mut groups) => {
                groups.truncate(wire::MAX_MULTICAST);
                if groups != s.multicast {
                    info!(
                        groups = groups.len(),
                        "multicast groups changed on {}", s.name
                    );
                    let data: Vec<u8> = groups.iter().flatten().copied().collect();
                    s.multicast = groups;
                    session.cfg_request(CfgCode::SetMulticast, &data);
                }
            }
            Err(e) => debug!("cannot read the multicast groups of {}: {e}", s.name),
        }
        true
    }
}

/// How often sd0's multicast groups (and without rtnetlink its MTU and flags) are read.
pub const LOOK: Duration = Duration::from_millis(250);

/// sd0's MTU is `cur`: asks the IOC for it (SetMtu) if it changed and the IOC allows it,
/// else puts the agreed one back.
fn mtu_seen(cur: u32, s: &mut Settings, session: &mut Session) {
    if !s.mtu_known || s.mtu_pending.is_some() {
        return;
    }
    // Asked of the IOC below, or already agreed: nothing more to keep.
    s.keep_mtu = false;
    if cur == s.mtu {
        return;
    }
    if cur > s.mtu_max || cur < 68 {
        warn!(
            "MTU {cur} on {} refused: the IOC allows 68..={}; back to {}",
            s.name, s.mtu_max, s.mtu
        );
        let _ = netdev::set_mtu(&s.name, s.mtu);
    } else {
        info!(mtu = cur, "MTU changed on {}; asking the IOC", s.name);
        s.mtu_pending = Some(cur);
        session.cfg_request(CfgCode::SetMtu, &cur.to_be_bytes());
    }
}

/// sd0 is `promisc` or all-multicast (`allmulti`) now: tells the IOC if that changed
/// (SetPromisc 0 off, 1 promiscuous, 2 every multicast frame: docs/protocol.md 3.2).
fn flags_seen(promisc: bool, allmulti: bool, s: &mut Settings, session: &mut Session) {
    if !s.mtu_known || (promisc, allmulti) == (s.promisc, s.allmulti) {
        return;
    }
    s.promisc = promisc;
    s.allmulti = allmulti;
    info!(promisc, allmulti, "promiscuous mode changed on {}", s.name);
    let mode = if promisc { 1 } else { u8::from(allmulti) * 2 };
    session.cfg_request(CfgCode::SetPromisc, &[mode]);
}

/// sd0's carrier: on while the IOC's link is up and sd0 has the MAC and MTU agreed.
pub struct Carrier {
    on: bool,
    /// On from before the connection (a restarting IOC's): left so until the session knows
    /// the MAC and MTU.
    held: bool,
}

impl Carrier {
    /// The carrier of a new connection: off, or on and `held` through a restarting IOC.
    pub fn new(held: bool) -> Carrier {
        Carrier { on: held, held }
    }

    /// Whether the carrier is on.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Turns `tap`'s carrier on or off as `s` wants it, and tells systemd the data path is
    /// ready the first time it is on (`ready_sent`).
    pub fn update(&mut self, s: &Settings, tap: &Tap, ready_sent: &mut bool) {
        if self.held && !(s.mac_known && s.mtu_known) {
            return;
        }
        self.held = false;
        let want = s.mac_known && s.mtu_known && s.ioc_nic_up;
        if want != self.on {
            match tap.set_carrier(want) {
                Ok(()) => {
                    self.on = want;
                    info!(carrier = want, "carrier");
                }
                Err(e) => warn!("cannot set carrier: {e}"),
            }
        }
        if want && !*ready_sent {
            *ready_sent = true;
            notify::ready("fabric up, data path ready");
        }
    }
}
