//! A host's own receive queue on the NIC: LAN frames read straight into its pools.
//!
//! A host whose pools are shared memory and which has one queue gets a packet socket of its
//! own whose filter takes only the untagged unicast frames for its MAC, and every worker's
//! socket stops taking them ([`crate::shard::Shard::place`]): the kernel sorts the frames
//! before any copy, so the IOC never holds, in a host's memory, a frame meant for another.
//! The IOC reads each frame from that socket straight into a free element of the host's
//! ([`splitnet_messaging::endpoint::Link::read_in_place`]) and posts the write: the frame
//! is copied once, by the kernel, where the general path copies it into a send buffer and
//! again into the element. The socket's buffer is then the host's receive ring, first in,
//! first out and bounded in bytes; its overflows are counted as the host's `rx_ring_full`.
//! Everything else for the host (group frames, tagged frames, frames from other hosts)
//! takes the general path, which keeps a quarter of each pool's elements for itself.

use crate::host::RxDrop;
use crate::host_frame::HEAD;
use crate::ioc::Ioc;
use crate::nic::HostRx;
use splitnet_messaging::endpoint::InPlace;
use splitnet_messaging::fabric::Ready;
use splitnet_messaging::memory::SharedBytes;
use splitnet_messaging::vnet;
use splitnet_messaging::wire::Queue;
use std::io;
use std::rc::Rc;
use tracing::{debug, warn};

/// The room a frame from the socket may need: an untagged GRO super-frame of 64 KiB of IPv6
/// payload, its IPv6 and Ethernet headers, and the virtio-net header. A larger frame (a
/// device with a larger GSO limit) is cut, dropped and counted as too large, as on the
/// general path.
pub const FRAME_MAX: u32 = (vnet::VNET_HDR_LEN + 14 + 40 + 65_535) as u32;
/// Frames read from a host's queue per wake-up.
const BUDGET: usize = 64;

/// A host's own queue of LAN frames.
#[derive(Debug)]
pub struct Placed {
    /// The queue.
    pub rx: Box<dyn HostRx>,
    /// Its readiness (none for a test's queue).
    pub ready: Option<Rc<Ready>>,
    /// The MAC it receives for.
    pub mac: [u8; 6],
    /// Frames wait and no element was free: read again when credit comes back.
    pub starved: bool,
}

/// How far [`Ioc::drive_placed`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacedProgress {
    /// The queue is empty (or the host has no queue of its own).
    Drained,
    /// The budget ran out; more may be waiting.
    Budget,
    /// Frames may wait, and no element of the host's is free for them.
    Starved,
}

impl Ioc {
    /// Gives host `session` a queue of its own on the NIC, when it can take LAN frames read
    /// straight into its pools: its only queue, over shared memory. Otherwise, or when the
    /// NIC cannot, its frames keep the general path.
    pub fn place_rx(&mut self, session: u64) {
        let Some(h) = self.hosts.get_mut(&session) else {
            return;
        };
        let places = h.link.as_ref().is_some_and(|l| l.places_writes());
        if h.queue != Queue::SINGLE || h.placed.is_some() || !places {
            return;
        }
        let mac = h.mac;
        if self.by_mac.get(&mac) != Some(&session) || !self.shard.place(mac) {
            return;
        }
        let opened = self.nic.host_rx(mac).and_then(|rx| {
            let ready = rx.fd().map(|fd| Ready::new(&fd)).transpose()?;
            Ok(Placed {
                rx,
                ready: ready.map(Rc::new),
                mac,
                starved: false,
            })
        });
        match opened {
            Ok(p) => {
                debug!(session, "LAN frames for the host are read into its pools");
                h.placed = Some(p);
            }
            Err(e) => {
                self.shard.unplace(mac);
                warn!(
                    session,
                    "LAN frames for the host take the general path: {e}"
                );
            }
        }
    }

    /// Closes host `session`'s own queue, if it has one, and gives its frames back to the
    /// general path. Frames waiting in the queue are dropped and counted.
    pub fn unplace_rx(&mut self, session: u64) {
        let Some(h) = self.hosts.get_mut(&session) else {
            return;
        };
        if let Some(p) = h.placed.take() {
            h.drop_rx_n(RxDrop::RingFull, p.rx.take_drops());
            drop(p.rx);
            self.shard.unplace(p.mac);
        }
    }

    /// Reads frames from host `session`'s own queue into its pools, while elements are free.
    pub fn drive_placed(&mut self, session: u64) -> PlacedProgress {
        let Ioc { hosts, stats, .. } = self;
        let Some(h) = hosts.get_mut(&session) else {
            return PlacedProgress::Drained;
        };
        let (Some(link), Some(placed)) = (h.link.as_mut(), h.placed.as_mut()) else {
            return PlacedProgress::Drained;
        };
        // Pools that cannot hold a frame of the socket's (the host's own choice) would
        // leave its frames waiting forever: they take the general path instead.
        let ini = link.session().initiator();
        let unfit = ini.pools().next().is_some() && ini.pools().all(|p| p.element_size < FRAME_MAX);
        let mut progress = PlacedProgress::Budget;
        let (mut frames, mut bytes, mut too_large) = (0u64, 0u64, 0u64);
        for _ in 0..BUDGET {
            let rx = &placed.rx;
            // The frame's header is checked from a private copy, as on the general path
            // (the host may rewrite its element at any moment).
            let read = |dst: &SharedBytes<'_>| {
                let n = rx.recv_into(dst)?;
                let mut head = [0u8; HEAD];
                let k = n.min(HEAD).min(dst.len());
                dst.copy_out(0, &mut head[..k]).map_err(io::Error::other)?;
                if n <= dst.len() && vnet::check_head(&head[..k], n).is_err() {
                    return Err(io::Error::from(io::ErrorKind::InvalidData));
                }
                Ok(n)
            };
            match link.read_in_place(FRAME_MAX, read) {
                Some(InPlace::Posted(n)) => {
                    stats.lan_rx += 1;
                    frames += 1;
                    bytes += n as u64;
                }
                Some(InPlace::Dropped(_)) => {
                    stats.lan_rx += 1;
                    too_large += 1;
                }
                // A frame the check refused, as the general path refuses it.
                Some(InPlace::Failed(e)) if e.kind() == io::ErrorKind::InvalidData => {
                    stats.lan_rx += 1;
                }
                Some(InPlace::Empty | InPlace::Failed(_)) => {
                    progress = PlacedProgress::Drained;
                    break;
                }
                None => {
                    progress = PlacedProgress::Starved;
                    break;
                }
            }
        }
        placed.starved = progress == PlacedProgress::Starved;
        let give_up = placed.starved && unfit;
        h.stats.rx_frames += frames;
        h.stats.rx_bytes += bytes;
        h.drop_rx_n(RxDrop::TooLarge, too_large);
        if give_up {
            self.unplace_rx(session);
            return PlacedProgress::Drained;
        }
        progress
    }

    /// Adds the frames the hosts' own queues dropped since the last call to their counters.
    pub fn count_placed_drops(&mut self) {
        for h in self.hosts.values_mut() {
            if let Some(n) = h.placed.as_ref().map(|p| p.rx.take_drops()) {
                h.drop_rx_n(RxDrop::RingFull, n);
            }
        }
    }
}
