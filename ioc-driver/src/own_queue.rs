//! A host's own receive queue on the NIC: LAN frames read straight into its pools.
//!
//! A host whose pools are shared memory and which has one queue gets a packet socket of its
//! own whose filter takes only the unicast frames for its MAC on its VLANs (untagged for an
//! untagged host; its VLAN's, handed over untagged, for an access host; its VLANs', their
//! tags put back, and untagged ones where its list has 0, for a trunk host, from two sockets
//! behind one descriptor: [`splitnet_netif::trunk`]), and every worker's socket stops taking
//! them (`Shard::place`): the kernel sorts the frames before any copy, so the IOC never
//! holds, in a host's memory, a frame meant for another.
//! The IOC reads the frames from that socket straight into free elements of the host's, a
//! batch with one `recvmmsg(2)` ([`splitnet_messaging::endpoint::Link::read_batch_in_place`]),
//! and posts the writes: each frame is copied once, by the kernel, where the general path
//! copies it into a send buffer and again into the element (a frame few enough bytes for
//! SendData is copied into one, and its element goes back). The socket's buffer is then the
//! host's receive ring, first in, first out and bounded in bytes; its overflows are counted
//! as the host's `rx_ring_full` and as LAN frames the kernel dropped.
//! Everything else for the host (group frames, other VLANs' frames, frames from other hosts)
//! takes the general path, which keeps a quarter of each pool's elements for itself.

use crate::host_frame::HEAD;
use crate::nic::{HostFrames, HostRx, Nic};
use splitnet_fabric::{FabricChannel, Ready};
use splitnet_messaging::endpoint::Link;
use splitnet_messaging::memory::SharedBytes;
use splitnet_messaging::vnet;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The room a frame from the socket may need: the largest IP packet GRO and GSO build (at
/// most 64 KiB with its header: `gro_max_size`, `gso_max_size`), an Ethernet header and a
/// VLAN tag, the virtio-net header, and 36 bytes to spare (65,599 bytes; hosts advertise
/// 65,600-byte elements). A larger frame (a device with a larger GSO limit) is cut, dropped
/// and counted as too large, as on the general path.
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
/// refusing) doubles the wait each time, up to [`OWN_QUEUE_RETRY_MAX`]: a try refilters every
/// worker's socket twice.
pub const OWN_QUEUE_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
pub const OWN_QUEUE_RETRY_MAX: Duration = Duration::from_secs(64);

/// When a host whose queue could not be had tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnQueueRetry {
    /// Not before then.
    pub at: Instant,
    /// The wait that set `at`.
    pub wait: Duration,
}

impl OwnQueueRetry {
    /// The retry after a failed try at `now`, given the one before it.
    pub fn after(last: Option<OwnQueueRetry>, now: Instant) -> OwnQueueRetry {
        let wait = last.map_or(OWN_QUEUE_RETRY, |r| (r.wait * 2).min(OWN_QUEUE_RETRY_MAX));
        OwnQueueRetry {
            at: now + wait,
            wait,
        }
    }
}

/// A host's own queue of LAN frames.
#[derive(Debug)]
pub struct OwnQueue {
    /// The queue.
    pub rx: Box<dyn HostRx>,
    /// Its readiness (none for a test's queue).
    pub ready: Option<Rc<Ready>>,
    /// The MAC it receives for.
    pub mac: [u8; 6],
    /// Frames wait and no element was free: read again when credit comes back.
    pub starved: bool,
}

/// How far [`OwnQueue::read`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnQueueProgress {
    /// The queue is empty (or the host has no queue of its own).
    Drained,
    /// The budget ran out; more may be waiting.
    Budget,
    /// Frames may wait, and no element of the host's is free for them.
    Starved,
}

/// What one [`OwnQueue::read`] did, for the host's and the IOC's counters.
#[derive(Debug)]
pub struct Read {
    /// How far it got.
    pub progress: OwnQueueProgress,
    /// Frames the socket gave (posted or dropped).
    pub read: u64,
    /// Frames posted to the host, and their bytes.
    pub frames: u64,
    /// Bytes of those frames.
    pub bytes: u64,
    /// Frames too large for the host's elements.
    pub too_large: u64,
    /// Frames whose virtio-net or Ethernet header failed the check (as on the general
    /// path, `lan_rx_bad_frame`).
    pub bad_frame: u64,
    /// Frames the kernel failed to hand over.
    pub unreadable: u64,
    /// The last read error of those, for the log.
    pub error: Option<io::Error>,
    /// Frames the socket's buffer overflowed with while the host had no free element.
    pub overflowed: u64,
    /// The host's pools can no longer lend an element for a frame of the NIC's (it
    /// advertised others): the queue must close, or its frames would wait forever.
    pub stuck: bool,
}

/// What shutting a queue found in it.
#[derive(Debug)]
pub struct Shut {
    /// The socket could not be stopped (it is closed with the session all the same).
    pub error: Option<io::Error>,
    /// Frames that waited in it, discarded.
    pub discarded: u64,
    /// Frames its buffer had overflowed with.
    pub overflowed: u64,
}

impl OwnQueue {
    /// A queue of its own on `nic` for the unicast frames to `mac` that came as `frames`
    /// says, with its readiness. Every worker's socket must already exclude them
    /// (`Shard::place`).
    pub fn open(nic: &dyn Nic, mac: [u8; 6], frames: &HostFrames) -> io::Result<OwnQueue> {
        let rx = nic.host_rx(mac, frames)?;
        let ready = rx.fd().map(|fd| Ready::reading(&fd)).transpose()?;
        Ok(OwnQueue {
            rx,
            ready: ready.map(Rc::new),
            mac,
            starved: false,
        })
    }

    /// Stops the queue taking frames and discards what waits in it. The queue stays open
    /// (closing a packet socket waits for an RCU grace period of the kernel's, tens of
    /// milliseconds on a busy machine): the caller keeps it until the session ends.
    pub fn shut(&self) -> Shut {
        let error = self.rx.shut().err();
        let mut discarded = 0;
        while discarded < MAX_DISCARD {
            match self.rx.discard() {
                Ok(n) => discarded += n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // A failed read consumed its frame too.
                Err(_) => discarded += 1,
            }
        }
        Shut {
            error,
            discarded,
            overflowed: self.rx.take_drops(),
        }
    }

    /// Frames the socket's buffer overflowed with since the last call.
    pub fn take_drops(&self) -> u64 {
        self.rx.take_drops()
    }

    /// Reads frames into the free elements of `link`'s peer pools and posts them, up to the
    /// budget or until no element is free; a frame `express` picks (given its bytes and
    /// length) goes in the express lane instead, its element back.
    pub fn read(
        &mut self,
        link: &mut Link<FabricChannel>,
        mut express: impl FnMut(&SharedBytes<'_>, usize) -> bool,
    ) -> Read {
        let mut r = Read {
            progress: OwnQueueProgress::Budget,
            read: 0,
            frames: 0,
            bytes: 0,
            too_large: 0,
            bad_frame: 0,
            unreadable: 0,
            error: None,
            overflowed: 0,
            stuck: false,
        };
        let mut left = BUDGET;
        while left > 0 {
            let (rx, bad) = (&self.rx, &mut r.bad_frame);
            // Each frame's header is checked from a private copy, as on the general path
            // (the host may rewrite its element at any moment); a refused one is not posted.
            let check = |dst: &[SharedBytes<'_>], lens: &mut [usize]| {
                let n = rx.recv_batch_into(dst, lens)?;
                for (w, len) in dst.iter().zip(lens.iter_mut()).take(n) {
                    let mut head = [0u8; HEAD];
                    let k = (*len).min(HEAD).min(w.len());
                    w.copy_out(0, &mut head[..k]).map_err(io::Error::other)?;
                    if *len <= w.len() && vnet::check_head(&head[..k], *len).is_err() {
                        *len = 0;
                        *bad += 1;
                    }
                }
                Ok::<_, io::Error>(n)
            };
            match link.read_batch_in_place(FRAME_MAX, left.min(BATCH), check, &mut express) {
                Some(Ok(b)) => {
                    r.read += b.read as u64;
                    r.frames += b.posted as u64;
                    r.bytes += b.bytes;
                    r.too_large += b.dropped as u64;
                    // A short read may mean an error waits for the next read (recvmmsg
                    // returns what it read first): only `WouldBlock` says the queue is empty.
                    left = left.saturating_sub(b.read.max(1));
                }
                Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    r.progress = OwnQueueProgress::Drained;
                    break;
                }
                // The NIC went down (reported once): no frame was lost.
                Some(Err(e)) if e.kind() == io::ErrorKind::NetworkDown => left -= 1,
                // The kernel dropped a frame it could not hand over (an offload a
                // virtio-net header cannot describe): counted, and on to the next.
                Some(Err(e)) => {
                    r.unreadable += 1;
                    r.error = Some(e);
                    left -= 1;
                }
                None => {
                    r.progress = OwnQueueProgress::Starved;
                    break;
                }
            }
        }
        self.starved = r.progress == OwnQueueProgress::Starved;
        r.stuck = self.starved && !link.session().initiator().may_take(FRAME_MAX);
        // While it waits for credit its queue may overflow: counted now, so that the
        // host's statistics show it.
        if self.starved {
            r.overflowed = self.rx.take_drops();
        }
        r
    }
}
