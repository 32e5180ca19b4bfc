//! A host's own receive queue on the NIC: LAN frames read straight into its pools.
//!
//! A host whose pools are shared memory and which has one queue gets a packet socket of its
//! own whose filter takes only the untagged unicast frames for its MAC, and every worker's
//! socket stops taking them ([`crate::shard::Shard::place`]): the kernel sorts the frames
//! before any copy, so the IOC never holds, in a host's memory, a frame meant for another.
//! The IOC reads the frames from that socket straight into free elements of the host's, a
//! batch with one `recvmmsg(2)` ([`splitnet_messaging::endpoint::Link::read_batch_in_place`]),
//! and posts the writes: each frame is copied once, by the kernel, where the general path
//! copies it into a send buffer and again into the element (a frame few enough bytes for
//! SendData is copied into one, and its element goes back). The socket's buffer is then the
//! host's receive ring, first in, first out and bounded in bytes; its overflows are counted
//! as the host's `rx_ring_full` and as LAN frames the kernel dropped.
//! Everything else for the host (group frames, tagged frames, frames from other hosts)
//! takes the general path, which keeps a quarter of each pool's elements for itself.

use crate::host::RxDrop;
use crate::host_frame::HEAD;
use crate::ioc::Ioc;
use crate::nic::HostRx;
use splitnet_fabric::Ready;
use splitnet_messaging::memory::SharedBytes;
use splitnet_messaging::vnet;
use splitnet_messaging::wire::Queue;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// The room a frame from the socket may need: an untagged GRO super-frame of 64 KiB of IPv6
/// payload, its IPv6 and Ethernet headers, and the virtio-net header. A larger frame (a
/// device with a larger GSO limit) is cut, dropped and counted as too large, as on the
/// general path.
pub const FRAME_MAX: u32 = (vnet::VNET_HDR_LEN + 14 + 40 + 65_535) as u32;
/// Frames read from a host's queue per wake-up.
const BUDGET: usize = 64;
/// Most frames one read takes (`recvmmsg(2)`), each into an element of its own.
const BATCH: usize = 16;
/// Most frames discarded from a queue as it closes (its buffer holds fewer).
const MAX_DISCARD: u64 = 1 << 16;
/// How long a host whose queue could not be had keeps the general path before its first
/// next try. Most causes pass (a worker still starting, a MAC its last session still holds,
/// the exclusion table full until a host leaves); one that lasts (a socket the kernel keeps
/// refusing) doubles the wait each time, up to [`PLACE_RETRY_MAX`]: a try refilters every
/// worker's socket twice.
pub const PLACE_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
pub const PLACE_RETRY_MAX: Duration = Duration::from_secs(64);

/// When a host whose queue could not be had tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaceRetry {
    /// Not before then.
    pub at: Instant,
    /// The wait that set `at`.
    pub wait: Duration,
}

impl PlaceRetry {
    /// The retry after a failed try at `now`, given the one before it.
    fn after(last: Option<PlaceRetry>, now: Instant) -> PlaceRetry {
        let wait = last.map_or(PLACE_RETRY, |r| (r.wait * 2).min(PLACE_RETRY_MAX));
        PlaceRetry {
            at: now + wait,
            wait,
        }
    }
}

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
    /// Gives host `session` a queue of its own on the NIC once it can take LAN frames read
    /// straight into its pools: its only queue, over shared memory, with a pool that can
    /// always lend an element for any frame of the NIC's. Called whenever that may have
    /// become true (the host connected, changed its MAC, advertised pools or credits);
    /// until then, or when the NIC cannot, its frames keep the general path. A failed try
    /// is made again, when one of those happens, [`PLACE_RETRY`] later, then less often.
    pub fn place_rx(&mut self, session: u64) {
        let Some(h) = self.hosts.get_mut(&session) else {
            return;
        };
        let Some(link) = h.link.as_ref() else {
            return;
        };
        if h.queue != Queue::SINGLE
            || h.placed.is_some()
            || h.place_retry.is_some_and(|r| Instant::now() < r.at)
            || !link.places_writes()
            || !link.session().initiator().may_take(FRAME_MAX)
        {
            return;
        }
        let mac = h.mac;
        if self.by_mac.get(&mac) != Some(&session) || !self.shard.place(mac) {
            h.place_retry = Some(PlaceRetry::after(h.place_retry, Instant::now()));
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
                h.place_retry = None;
            }
            Err(e) => {
                let retry = PlaceRetry::after(h.place_retry, Instant::now());
                h.place_retry = Some(retry);
                self.shard.unplace(mac);
                warn!(
                    session,
                    "LAN frames for the host take the general path for {:?}: {e}", retry.wait
                );
            }
        }
    }

    /// Shuts host `session`'s own queue, if it has one, and gives its frames back to the
    /// general path. The queue takes nothing from then on; the frames still in it are
    /// dropped and counted (`rx_ring_full`); those that arrive until the general sockets
    /// take the MAC's frames again (a few microseconds) are lost. The shut queue is closed
    /// with the session ([`crate::host::Host::shut_queue`]): closing a packet socket waits
    /// for an RCU grace period of the kernel's, tens of milliseconds on a busy machine, which
    /// would hold up the worker in the middle of its host's work.
    pub fn unplace_rx(&mut self, session: u64) {
        let Some(h) = self.hosts.get_mut(&session) else {
            return;
        };
        let Some(p) = h.placed.take() else {
            return;
        };
        if let Err(e) = p.rx.shut() {
            warn!(session, "cannot stop the host's own LAN queue: {e}");
        }
        let mut waiting = 0;
        while waiting < MAX_DISCARD {
            match p.rx.discard() {
                Ok(n) => waiting += n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // A failed read consumed its frame too.
                Err(_) => waiting += 1,
            }
        }
        let overflowed = p.rx.take_drops();
        self.stats.lan_rx += waiting;
        self.stats.lan_rx_dropped += overflowed;
        h.drop_rx_n(RxDrop::RingFull, waiting + overflowed);
        // Shut above, so it takes nothing more while it stays open.
        self.shard.unplace(p.mac);
        if let Some(h) = self.hosts.get_mut(&session) {
            h.shut_queue = Some(p);
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
        let mut progress = PlacedProgress::Budget;
        let (mut frames, mut bytes, mut too_large, mut unreadable) = (0, 0, 0, 0);
        let mut left = BUDGET;
        while left > 0 {
            let rx = &placed.rx;
            // Each frame's header is checked from a private copy, as on the general path
            // (the host may rewrite its element at any moment); a refused one is not posted.
            let read = |dst: &[SharedBytes<'_>], lens: &mut [usize]| {
                let n = rx.recv_batch_into(dst, lens)?;
                for (w, len) in dst.iter().zip(lens.iter_mut()).take(n) {
                    let mut head = [0u8; HEAD];
                    let k = (*len).min(HEAD).min(w.len());
                    w.copy_out(0, &mut head[..k]).map_err(io::Error::other)?;
                    if *len <= w.len() && vnet::check_head(&head[..k], *len).is_err() {
                        *len = 0;
                    }
                }
                Ok::<_, io::Error>(n)
            };
            match link.read_batch_in_place(FRAME_MAX, left.min(BATCH), read) {
                Some(Ok(b)) => {
                    stats.lan_rx += b.read as u64;
                    frames += b.posted as u64;
                    bytes += b.bytes;
                    too_large += b.dropped as u64;
                    // A short read may mean an error waits for the next read (recvmmsg
                    // returns what it read first): only `WouldBlock` says the queue is empty.
                    left = left.saturating_sub(b.read.max(1));
                }
                Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    progress = PlacedProgress::Drained;
                    break;
                }
                // The NIC went down (reported once): no frame was lost.
                Some(Err(e)) if e.kind() == io::ErrorKind::NetworkDown => left -= 1,
                // The kernel dropped a frame it could not hand over (an offload a
                // virtio-net header cannot describe): counted, and on to the next.
                Some(Err(e)) => {
                    stats.lan_rx += 1;
                    stats.lan_rx_unreadable += 1;
                    unreadable += 1;
                    left -= 1;
                    if let Some(held) = h.log.allow(std::time::Instant::now()) {
                        warn!(
                            session,
                            "a LAN frame for the host could not be read: {e} ({held} more since the last report)"
                        );
                    }
                }
                None => {
                    progress = PlacedProgress::Starved;
                    break;
                }
            }
        }
        placed.starved = progress == PlacedProgress::Starved;
        // Pools that can no longer lend an element for a frame of the NIC's (the host
        // advertised others) would leave its frames waiting forever.
        let stuck = placed.starved && !link.session().initiator().may_take(FRAME_MAX);
        // While it waits for credit its queue may overflow: counted now, so that the
        // host's statistics show it.
        let overflowed = if placed.starved {
            placed.rx.take_drops()
        } else {
            0
        };
        stats.lan_rx_dropped += overflowed;
        h.stats.rx_frames += frames;
        h.stats.rx_bytes += bytes;
        h.drop_rx_n(RxDrop::TooLarge, too_large);
        h.drop_rx_n(RxDrop::Unreadable, unreadable);
        h.drop_rx_n(RxDrop::RingFull, overflowed);
        if stuck {
            self.unplace_rx(session);
            return PlacedProgress::Drained;
        }
        progress
    }

    /// Adds the frames the hosts' own queues dropped since the last call to their counters
    /// (and to the LAN frames the kernel dropped).
    pub fn count_placed_drops(&mut self) {
        for h in self.hosts.values_mut() {
            if let Some(n) = h.placed.as_ref().map(|p| p.rx.take_drops()) {
                self.stats.lan_rx_dropped += n;
                h.drop_rx_n(RxDrop::RingFull, n);
            }
        }
    }
}
