//! sd0 itself: the watch that turns what Linux tools change on it (MTU, promiscuous mode,
//! multicast groups) into CfgUtil requests, and its carrier.

use crate::cfgutil::Settings;
use splitnet_messaging::endpoint::Session;
use splitnet_messaging::wire::{self, CfgCode};
use splitnet_netif::netdev;
use splitnet_netif::tap::Tap;
use splitnet_service::notify;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The watch of sd0's settings.
pub struct Watch {
    /// Next time the TAP's settings are compared with what the IOC knows.
    next: Instant,
}

impl Watch {
    /// A watch that looks at its first turn.
    pub fn new() -> Watch {
        Watch {
            next: Instant::now(),
        }
    }

    /// Maps what Linux tools did to the TAP onto CfgUtil (requests on `session`):
    /// `ip link set sd0 mtu N` becomes SetMtu (refused at once beyond the IOC's maximum, and
    /// reverted if the IOC refuses), `ip link set sd0 promisc on|off` (and allmulticast) becomes SetPromisc.
    /// Looks every watch period once the MTU is agreed, and returns whether it looked.
    pub fn poll(&mut self, now: Instant, s: &mut Settings, session: &mut Session) -> bool {
        if now < self.next || !s.mtu_known {
            return false;
        }
        self.next = now + Duration::from_millis(250);
        if s.mtu_pending.is_none() {
            if let Ok(cur) = netdev::mtu(&s.name) {
                // Asked of the IOC below, or already agreed: nothing more to keep.
                s.keep_mtu = false;
                if cur != s.mtu {
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
            }
        }
        if let Ok(flags) = netdev::flags(&s.name) {
            let promisc = flags & libc::IFF_PROMISC != 0;
            let allmulti = !promisc && flags & libc::IFF_ALLMULTI != 0;
            if (promisc, allmulti) != (s.promisc, s.allmulti) {
                s.promisc = promisc;
                s.allmulti = allmulti;
                info!(promisc, allmulti, "promiscuous mode changed on {}", s.name);
                // 0 off, 1 promiscuous, 2 every multicast frame (docs/protocol.md 3.2).
                let mode = if promisc { 1 } else { u8::from(allmulti) * 2 };
                session.cfg_request(CfgCode::SetPromisc, &[mode]);
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

/// sd0's carrier: on while the IOC's link is up and sd0 has the MAC and MTU agreed.
pub struct Carrier {
    on: bool,
}

impl Carrier {
    /// The carrier of a new connection: off.
    pub fn off() -> Carrier {
        Carrier { on: false }
    }

    /// Whether the carrier is on.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Turns `tap`'s carrier on or off as `s` wants it, and tells systemd the data path is
    /// ready the first time it is on (`ready_sent`).
    pub fn update(&mut self, s: &Settings, tap: &Tap, ready_sent: &mut bool) {
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
