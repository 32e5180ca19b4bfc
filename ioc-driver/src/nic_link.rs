//! The NIC as the kernel reports it: its link (up and running) and its MTU, followed through
//! rtnetlink ([`LinkWatch`]) so a change reaches the hosts at once. Where the socket cannot
//! be had (a unit that forbids `AF_NETLINK`), both are read every [`POLL`] instead, and the
//! log says so once.

use splitnet_fabric::Ready;
use splitnet_netif::link_watch::{self, LinkState, LinkWatch};
use splitnet_netif::netdev;
use std::io;
use std::time::Duration;
use tracing::{debug, warn};

/// How often the NIC is read when no rtnetlink socket could be opened.
pub const POLL: Duration = Duration::from_millis(250);

/// What the hosts are told of the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicLink {
    /// Up and running.
    pub up: bool,
    /// Its MTU (the configured `lan.mtu` when set: then the NIC's is not followed).
    pub mtu: u32,
}

/// Follows one NIC.
#[derive(Debug)]
pub struct NicFollow {
    name: String,
    index: u32,
    /// `Some` MTU when configured (`lan.mtu`): the NIC's own is not followed.
    fixed_mtu: Option<u32>,
    /// The socket and its readiness; `None` while polled.
    watch: Option<(LinkWatch, Ready)>,
    last: NicLink,
    states: Vec<LinkState>,
}

impl NicFollow {
    /// Starts following NIC `name`, whose state is `now`.
    pub fn new(name: &str, now: NicLink, fixed_mtu: Option<u32>) -> NicFollow {
        let watch = netdev::index(name).and_then(|index| {
            let mut w = LinkWatch::open()?;
            // Its state now, in case it changed since `now` was read.
            w.request(index)?;
            let ready = Ready::reading(&w)?;
            Ok((index, (w, ready)))
        });
        let (index, watch) = match watch {
            Ok((i, w)) => (i, Some(w)),
            Err(e) => {
                warn!(lan = name, "cannot follow the NIC through rtnetlink ({e}): reading its state every {POLL:?} instead");
                (0, None)
            }
        };
        NicFollow {
            name: name.to_string(),
            index,
            fixed_mtu,
            watch,
            last: now,
            states: Vec::new(),
        }
    }

    /// Follows nothing (ports mode: the IOC has no NIC); `now` stays the state.
    pub fn nothing(now: NicLink) -> NicFollow {
        NicFollow {
            name: String::new(),
            index: 0,
            fixed_mtu: Some(now.mtu),
            watch: None,
            last: now,
            states: Vec::new(),
        }
    }

    /// Whether the NIC is read by polling ([`NicFollow::poll`]) rather than followed.
    pub fn polled(&self) -> bool {
        self.watch.is_none()
    }

    /// Stops following (the socket failed): the NIC is polled from now on.
    pub fn poll_instead(&mut self) {
        self.watch = None;
    }

    /// The NIC's state when it differs from the last one returned, read now (polling).
    pub fn poll(&mut self) -> Option<NicLink> {
        if self.name.is_empty() {
            return None;
        }
        let up = netdev::is_running(&self.name).unwrap_or(self.last.up);
        let mtu = match self.fixed_mtu {
            Some(m) => m,
            None => netdev::mtu(&self.name).unwrap_or(self.last.mtu),
        };
        take(&mut self.last, NicLink { up, mtu })
    }

    /// Waits for the kernel's next report of a change; returns the NIC's new state (never
    /// returns while polled).
    pub async fn changed(&mut self) -> io::Result<NicLink> {
        let Some((watch, ready)) = self.watch.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            let mut g = ready.readable().await?;
            self.states.clear();
            match watch.read(&mut self.states) {
                Ok(()) => g.clear_ready(),
                // The kernel dropped reports: ask for the NIC's state again.
                Err(e) if link_watch::overrun(&e) => {
                    debug!("rtnetlink reports dropped; asking again");
                    watch.request(self.index)?;
                }
                Err(e) => return Err(e),
            }
            let mut next = self.last;
            for s in self.states.iter().filter(|s| s.index == self.index) {
                // As `netdev::is_running` reads it: up, with carrier.
                next.up = s.up && s.carrier;
                if let (None, Some(m)) = (self.fixed_mtu, s.mtu) {
                    next.mtu = m;
                }
            }
            if let Some(n) = take(&mut self.last, next) {
                return Ok(n);
            }
        }
    }
}

/// `next` when it differs from `last`, which becomes it.
fn take(last: &mut NicLink, next: NicLink) -> Option<NicLink> {
    (next != *last).then(|| {
        *last = next;
        next
    })
}
