//! The data path between the TAP and the IOC: frames read from the TAP into send buffers
//! (or straight into the IOC's pools over shared memory), through the flow queue and its
//! byte limit onto the fabric; frames from the IOC checked and written to the TAP.

use crate::drops::Drops;
use splitnet_control::report::TxLimit;
use splitnet_fabric::{FabricChannel, Guard};
use splitnet_messaging::ecn::{self, Mark};
use splitnet_messaging::endpoint::{InPlace, Lane, Link, LinkEvent, Posted};
use splitnet_messaging::memory::{Frame, Registry, SendBuf, SendBufCache, SharedBytes};
use splitnet_messaging::sched::{ExpressConfig, FqConfig, LimitConfig, Scheduler};
use splitnet_messaging::vnet;
use splitnet_messaging::wire;
use splitnet_netif::tap::Tap;
use std::io;
use std::time::Instant;
use tracing::{debug, info, warn};

/// Frames read from the TAP per wake-up before the fabric is flushed.
const TAP_BATCH: usize = 64;
/// The largest frame the TAP gives: its virtio-net header, Ethernet with a VLAN tag, and an
/// IP packet of 64 KiB (a TSO super-frame). A frame is read straight into an IOC element only
/// if the element holds this much, since the read cannot know the frame's size first.
const TAP_FRAME_MAX: u32 = (vnet::VNET_HDR_LEN + 18 + 65_535) as u32;
/// Completions handled per channel per wake-up; credits go back after each batch, so a
/// small batch returns them sooner to the IOC, whose frames for this host wait for them.
const RX_BUDGET: usize = 32;
/// Bytes of one flow waiting in the flow queue beyond which its ECN-capable frames are
/// marked Congestion Experienced as they are read: an eighth of its share, half what the
/// byte limit lets go in flight at most over shared memory (twice its most over a byte
/// stream), so that an ECN sender keeps a short standing queue and slows down long before
/// the queue must drop (or, with back-pressure, leave frames in the TAP).
const MARK_BYTES: u64 = 512 << 10;
/// The largest frame a send buffer holds, and so the largest the flow queue is given.
const SEND_BUFFER_BYTES: u32 = wire::MAX_SEND_DATA as u32;
/// Send buffers: bounds the frames in flight to the IOC.
pub const SEND_BUFFERS: usize = 256;
/// A small send buffer's size: an MTU-sized frame with its virtio-net header and a tag.
pub const SMALL_BUFFER_BYTES: usize = 2048;
/// Small send buffers, which a frame read into a send buffer moves to when it fits one
/// (a copy of at most 2 KiB), so that a backlog of small frames does not hold the send
/// buffers the next reads need: 1,280 frames wait at most (these and the send buffers), 15 ms
/// of MTU-sized frames at 1 Gb/s, where 192 were 2 ms. Measured: e2e 28's UDP fragments at
/// 300 Mb/s lost 365 frames in host-driver's flow queue in one run with 192.
pub const SMALL_BUFFERS: usize = 1024;

/// Bytes the express lane (the control channel) may have unwritten before a sparse flow's
/// frame goes the bulk way instead: the lane stays a short queue.
const EXPRESS_BACKLOG: usize = 64 << 10;
/// Bytes of a frame read in place that are copied out to find its flow: its virtio-net
/// header, Ethernet with a tag, IPv4 with options or IPv6, and the ports.
const FLOW_HEAD: usize = 128;

/// Whether the TAP is worth waiting for: the kernel sends on a queue only while the first
/// queue has the carrier on; and with every send buffer queued (in the flow queue or on the
/// fabric socket), or a flow queue that could not take the next frame without dropping,
/// nothing is read: returned credits or the socket's writability wake the loop instead, so
/// a full socket never makes it spin.
pub fn tap_wanted(sending: bool, room: bool) -> bool {
    sending && room
}

/// Frames from the TAP on their way to the IOC: the send buffers and the flow queue.
pub struct Outbound {
    cache: SendBufCache,
    /// Frames read from the TAP waiting for credit or the byte limit, by flow.
    tx: Scheduler<SendBuf>,
    /// The frames to the IOC it dropped, by cause.
    drops: Drops,
    /// Frames the flow queue could not take without dropping stay in the TAP queue's ring.
    backpressure: bool,
    /// The express lane is agreed with the IOC: sparse flows' frames go past the flow
    /// queue as SendData on the control channel.
    express: bool,
}

impl Outbound {
    /// Every send buffer free, the flow queue empty, bytes in flight held to `limit`.
    ///
    /// With `backpressure` (one of several TAP queues) a frame the flow queue could not take
    /// without dropping another is left in the TAP queue's ring: the kernel hashes each flow
    /// to one queue, so what waits there is mostly one bulk flow's, bounded by its socket's
    /// send buffer, while the other queues, a ping's among them, are served. A single queue
    /// is read even when the flow queue is full, which then drops from its longest flow:
    /// its ring is first in, first out for every flow, and only reading it lets a sparse
    /// flow pass a bulk one (measured: a 4 MiB share per flow made those drops rare).
    pub fn new(limit: LimitConfig, backpressure: bool) -> Outbound {
        Outbound {
            cache: SendBufCache::new(SEND_BUFFER_BYTES as usize, SEND_BUFFERS)
                .with_small(SMALL_BUFFER_BYTES, SMALL_BUFFERS),
            tx: Scheduler::new(
                FqConfig {
                    mark_bytes: Some(MARK_BYTES),
                    // Every buffer's frame may wait (their bytes stay under max_bytes).
                    max_frames: SEND_BUFFERS + SMALL_BUFFERS,
                    ..FqConfig::default()
                },
                Some(limit),
                Instant::now(),
            )
            .with_express(ExpressConfig::default(), Instant::now()),
            drops: Drops::default(),
            backpressure,
            express: false,
        }
    }

    /// Turns the express lane on once the IOC agreed to it (off for a new connection).
    pub fn set_express(&mut self, on: bool) {
        self.express = on;
    }

    /// Whether the flow queue takes another frame from the TAP now.
    fn takes_more(&self) -> bool {
        !self.backpressure || self.tx.has_room(SEND_BUFFER_BYTES)
    }

    /// Whether a frame may be read from the TAP: a send buffer is free to read it into and,
    /// with back-pressure, the flow queue takes it, whatever its flow, without dropping
    /// another. Otherwise the frames wait in this TAP queue's ring, as behind a NIC's full
    /// transmit ring; the kernel counts the ring's overflows as sd0's transmit drops.
    pub fn can_read(&self) -> bool {
        self.cache.has_free() && self.takes_more()
    }

    /// The send buffers, for the link to give back the ones it is done with.
    pub fn buffers(&mut self) -> &mut SendBufCache {
        &mut self.cache
    }

    /// Reads frames from `tap` into the flow queue and sends what the byte limit lets
    /// through on `link`. Returns true when the TAP is drained.
    pub fn read_tap(&mut self, tap: &Tap, link: &mut Link<FabricChannel>) -> bool {
        let mut drained = false;
        for _ in 0..TAP_BATCH {
            // With back-pressure, a frame the flow queue could not take without dropping
            // waits in the TAP.
            if !self.takes_more() {
                break;
            }
            // Nothing waits and the limit lets one more go: over shared memory the frame is
            // read straight into an element of the IOC's, and no copy of it is made here.
            let inflight = link.session().initiator().inflight_bytes();
            if link.places_writes() && self.tx.may_bypass(inflight) {
                let read = |dst: &SharedBytes<'_>| tap.recv_into(dst);
                // The frame's flow decides its lane, as for a frame read into a send buffer.
                let (on, open) = (self.express, link.express_pending() < EXPRESS_BACKLOG);
                let tx = &mut self.tx;
                let lane = |w: &SharedBytes<'_>, n: usize| {
                    let mut head = [0u8; FLOW_HEAD];
                    let head = &mut head[..n.min(FLOW_HEAD)];
                    on && w.copy_out(0, head).is_ok()
                        && tx.express(tx.flow(head), n as u32, Instant::now(), open)
                };
                match link.read_in_place(TAP_FRAME_MAX, read, lane) {
                    Some(InPlace::Posted(_) | InPlace::Inline(_) | InPlace::Express(_)) => continue,
                    Some(InPlace::Dropped(n)) => {
                        warn!(len = n, "frame larger than an IOC element; dropped");
                        continue;
                    }
                    Some(InPlace::Empty) => {
                        drained = true;
                        break;
                    }
                    Some(InPlace::Failed(e)) => {
                        if e.kind() != io::ErrorKind::WouldBlock {
                            self.drops.tx_tap_read += 1;
                            warn!("TAP read failed: {e}");
                        }
                        drained = true;
                        break;
                    }
                    // No element that large is free: a send buffer.
                    None => {}
                }
            }
            let Some(mut buf) = self.cache.get() else {
                break;
            };
            match tap.recv(buf.space()) {
                Ok(n) => buf.set_len(n),
                Err(e) => {
                    self.cache.put(buf);
                    if e.kind() != io::ErrorKind::WouldBlock {
                        self.drops.tx_tap_read += 1;
                        warn!("TAP read failed: {e}");
                    }
                    drained = true;
                    break;
                }
            }
            self.take(buf, link);
        }
        self.send_queued(link);
        drained
    }

    /// Sends `frame` (an Ethernet frame this driver made: an announcement after a move to
    /// another IOC) as if sd0 had sent it, behind a virtio-net header asking for nothing.
    /// False when no send buffer is free for it (it is not sent).
    pub fn inject(&mut self, frame: &[u8], link: &mut Link<FabricChannel>) -> bool {
        let len = vnet::VNET_HDR_LEN + frame.len();
        let Some(mut buf) = self.cache.get() else {
            return false;
        };
        let Some(space) = buf.space().get_mut(..len) else {
            self.cache.put(buf);
            return false;
        };
        space[..vnet::VNET_HDR_LEN].fill(0);
        space[vnet::VNET_HDR_LEN..].copy_from_slice(frame);
        buf.set_len(len);
        self.take(buf, link);
        self.send_queued(link);
        true
    }

    /// Takes a frame read from the TAP: a sparse flow's goes in the express lane, every
    /// other into the flow queue ([`Outbound::queue`]).
    fn take(&mut self, buf: SendBuf, link: &mut Link<FabricChannel>) {
        if !self.express {
            return self.queue(buf);
        }
        let buf = self.cache.shrink(buf);
        let flow = self.tx.flow(buf.as_slice());
        let open = link.express_pending() < EXPRESS_BACKLOG;
        if self
            .tx
            .express(flow, buf.len() as u32, Instant::now(), open)
        {
            link.post_express(buf);
        } else {
            self.queue_flow(buf, flow);
        }
    }

    /// Takes a frame read from the TAP into the flow queue: in a small buffer when it fits
    /// one, marked Congestion Experienced when its flow has a standing queue, and what the
    /// flow queue drops for it counted.
    fn queue(&mut self, buf: SendBuf) {
        let buf = self.cache.shrink(buf);
        let flow = self.tx.flow(buf.as_slice());
        self.queue_flow(buf, flow);
    }

    /// As [`Outbound::queue`], the frame already shrunk and its flow known.
    fn queue_flow(&mut self, buf: SendBuf, flow: u64) {
        let Outbound {
            tx, cache, drops, ..
        } = self;
        let len = buf.len() as u32;
        let mark = |b: &mut SendBuf| ecn::mark_ce(b.as_mut_slice()) == Mark::Marked;
        tx.push_marking(flow, len, buf, mark, &mut |b| {
            cache.put(b);
            drops.tx_flow_queue += 1;
        });
        if !self.backpressure {
            self.keep_one_free();
        }
    }

    /// With one TAP queue, a send buffer stays free to read the next frame into: while none
    /// is, the longest flow's oldest frames are dropped (and counted), as a full queue's
    /// frames are. The TAP's ring is first in, first out for every flow, so only reading it
    /// lets a sparse flow's frame pass a bulk one; a small frame then moves to a small
    /// buffer and frees the one it was read into.
    fn keep_one_free(&mut self) {
        while !self.cache.has_free() {
            let Some(old) = self.tx.evict() else {
                return;
            };
            self.cache.put(old);
            self.drops.tx_flow_queue += 1;
        }
    }

    /// Posts queued frames on `link`, the one held back for credit first, then the flow
    /// queue's choice, while the byte limit lets more go in flight.
    fn send_queued(&mut self, link: &mut Link<FabricChannel>) {
        // One clock read per turn, not per frame: the express lane's count of a flow's
        // silence is off by the turn's microseconds, against its 100 ms.
        let now = Instant::now();
        loop {
            let inflight = link.session().initiator().inflight_bytes();
            let Some(buf) = self.tx.next(inflight, now) else {
                return;
            };
            if !self.post(link, buf) {
                return;
            }
        }
    }

    /// Posts a frame; false when it is held back for lack of credit.
    fn post(&mut self, link: &mut Link<FabricChannel>, buf: SendBuf) -> bool {
        match link.post_frame(buf) {
            Posted::SendData | Posted::Rdma => true,
            Posted::Backpressure(b) => {
                self.tx.hold(b);
                false
            }
            Posted::TooLarge(b) => {
                warn!(len = b.len(), "frame larger than any IOC pool; dropped");
                self.cache.put(b);
                true
            }
        }
    }

    /// Credits came back on `link`: the byte limit learns what completed, and the queued
    /// frames it now lets through are sent.
    pub fn on_credits(&mut self, link: &mut Link<FabricChannel>) {
        let ini = link.session_mut().initiator_mut();
        let done = ini.take_completed();
        let inflight = ini.inflight_bytes();
        self.tx.completed(done, inflight, Instant::now());
        self.send_queued(link);
    }

    /// The byte limit and the flow queue, as operators see them.
    pub fn limit(&self) -> TxLimit {
        let l = self.tx.stats().unwrap_or_default();
        TxLimit {
            limit_bytes: l.limit,
            grown: l.grown,
            shrunk: l.shrunk,
            held_back: l.held_back,
            queued: self.tx.waiting() as u64,
            queue_drops: self.drops.tx_flow_queue,
            ce_marked: self.tx.marked(),
        }
    }

    /// The frames to the IOC it dropped, by cause.
    pub fn drops(&self) -> Drops {
        self.drops
    }

    /// The connection is over, and its link closed with `unsent` frames posted and never
    /// written: those and the frames still waiting here are lost (counted, their buffers
    /// back in the cache). Logs every drop of the connection.
    pub fn close(&mut self, unsent: usize) {
        let waiting: Vec<SendBuf> = self.tx.drain().collect();
        self.drops.tx_lost_at_close += (waiting.len() + unsent) as u64;
        for b in waiting {
            self.cache.put(b);
        }
        if self.drops.tx() > 0 {
            info!(drops = ?self.drops, "frames to the IOC dropped");
        }
    }
}

/// Polls `lane` of `link` (up to [`RX_BUDGET`] completions): frames from the IOC go to
/// `tap` (those it refuses, or whose header is bad, counted in `drops`), everything else
/// into `events`. Clears `guard`'s readiness once the lane is drained; an error is the end
/// of the connection.
pub fn poll_lane(
    link: &mut Link<FabricChannel>,
    reg: &mut Registry,
    tap: Option<&Tap>,
    drops: &mut Drops,
    lane: Lane,
    guard: Option<Guard<'_>>,
    events: &mut Vec<LinkEvent>,
) -> Result<(), String> {
    let mut sink = |frame: Frame<'_>| {
        // A frame in a shared pool: its header is checked from a private copy, and that
        // copy is what the TAP gets, followed by the rest straight from the pool.
        let mut head = [0u8; vnet::VNET_HDR_LEN];
        let checked = match frame {
            Frame::Private(b) => vnet::check_frame(b),
            Frame::Shared(_) => {
                let n = frame.head(&mut head);
                vnet::check_head(&head[..n], frame.len())
            }
        };
        let Some(tap) = tap else {
            // A standby session carries no frame (docs/protocol.md 6.5): never a duplicate
            // of one the active IOC delivers.
            drops.rx_standby += 1;
            return;
        };
        let sent = match (checked, frame) {
            (Err(e), _) => {
                drops.rx_bad_header += 1;
                warn!("dropping frame from the IOC: {e}");
                return;
            }
            (Ok(_), Frame::Private(b)) => tap.send(b),
            (Ok(_), Frame::Shared(s)) => tap.send_parts(&head, &s.after(head.len())),
        };
        if let Err(e) = sent {
            drops.rx_tap_write += 1;
            debug!("TAP write failed: {e}");
        }
    };
    match link.poll(reg, lane, RX_BUDGET, &mut sink, events) {
        Ok(true) => Ok(()),
        Ok(false) => {
            if let Some(mut g) = guard {
                g.clear_ready();
            }
            Ok(())
        }
        Err(e) => {
            // The error table (docs/protocol.md, section 7): Goodbye with the row's code
            // on the control channel, then the session (every queue) ends.
            match link.fail(&e) {
                Some(code) => Err(format!(
                    "IOC broke the protocol: {e}; sent Goodbye({code:?})"
                )),
                None => Err(e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_waiting_or_unsent_when_the_connection_ends_are_counted_as_lost() {
        let mut out = Outbound::new(LimitConfig::default(), false);
        for i in 0..5u8 {
            let mut b = out.cache.get().unwrap();
            let mut f = [0x45u8; 80];
            f[vnet::VNET_HDR_LEN + 12 + 2 + 19] = i;
            assert!(b.fill_from(&f));
            let flow = out.tx.flow(b.as_slice());
            out.tx.push(flow, 80, b, &mut |_| panic!("dropped"));
        }
        let held = out.tx.next(0, Instant::now()).unwrap();
        out.tx.hold(held);
        assert_eq!(out.tx.waiting(), 5);
        out.close(3);
        assert_eq!(out.drops().tx_lost_at_close, 8, "5 waiting, 3 on the link");
        assert_eq!(out.drops().tx(), 8);
        assert_eq!(out.cache.in_use(), 0, "their buffers back");
        assert_eq!(out.tx.waiting(), 0);
    }

    /// A frame of `len` bytes (at least 64) of the UDP flow from `port`, as the TAP gives
    /// it, in one of `out`'s send buffers.
    fn read_frame(out: &mut Outbound, port: u16, len: usize) -> SendBuf {
        let mut f = vec![0u8; len];
        let eth = vnet::VNET_HDR_LEN;
        f[eth + 12..eth + 14].copy_from_slice(&[0x08, 0x00]);
        f[eth + 14] = 0x45;
        f[eth + 23] = 17;
        f[eth + 34..eth + 36].copy_from_slice(&port.to_be_bytes());
        let mut b = out.cache.get().expect("a send buffer to read into");
        assert!(b.fill_from(&f));
        b
    }

    #[test]
    fn a_backlog_of_small_frames_drops_nothing_and_leaves_the_send_buffers_free() {
        let mut out = Outbound::new(LimitConfig::default(), false);
        // More small frames than there are send buffers, none sent (the IOC is late).
        for _ in 0..SMALL_BUFFERS {
            let b = read_frame(&mut out, 5001, 1514);
            out.queue(b);
        }
        assert_eq!(out.drops().tx_flow_queue, 0);
        assert_eq!(out.tx.waiting(), SMALL_BUFFERS);
        assert!(out.can_read(), "every send buffer free for the next read");
        // One more than the small buffers: it stays in the send buffer it was read into.
        let b = read_frame(&mut out, 5001, 1514);
        out.queue(b);
        assert_eq!(out.drops().tx_flow_queue, 0);
        assert_eq!(out.cache.in_use(), SMALL_BUFFERS + 1);
        // They leave in order, whole.
        let first = out.tx.next(0, Instant::now()).unwrap();
        assert_eq!((first.capacity(), first.len()), (SMALL_BUFFER_BYTES, 1514));
    }

    #[test]
    fn with_one_queue_a_send_buffer_stays_free_for_a_sparse_flows_frame() {
        let mut out = Outbound::new(LimitConfig::default(), false);
        // A bulk flow's mid-sized GSO frames fill every send buffer but one: within its
        // share in bytes and the queue's in frames.
        for _ in 0..SEND_BUFFERS {
            let b = read_frame(&mut out, 5001, 8000);
            out.queue(b);
        }
        assert_eq!(
            out.drops().tx_flow_queue,
            1,
            "the bulk flow's oldest made room"
        );
        assert!(out.can_read());
        assert_eq!(out.tx.waiting(), SEND_BUFFERS - 1);
        // A ping's frame is read and moves to a small buffer: nothing more is dropped.
        let b = read_frame(&mut out, 7, 98);
        out.queue(b);
        assert!(out.can_read(), "its send buffer is free again");
        assert_eq!(out.drops().tx_flow_queue, 1);
        assert_eq!(out.tx.waiting(), SEND_BUFFERS);
    }

    #[test]
    fn with_backpressure_no_frame_is_dropped_for_a_free_buffer() {
        let mut out = Outbound::new(LimitConfig::default(), true);
        for _ in 0..SEND_BUFFERS {
            let b = read_frame(&mut out, 5001, 8000);
            out.queue(b);
        }
        assert_eq!(out.drops().tx_flow_queue, 0);
        assert!(!out.can_read(), "the next frames wait in the TAP's ring");
    }

    #[test]
    fn the_tap_waits_while_no_send_buffer_is_free() {
        assert!(tap_wanted(true, true));
        assert!(
            !tap_wanted(true, false),
            "every buffer queued: no busy loop"
        );
        assert!(!tap_wanted(false, true));
    }

    /// Queues one bulk flow's TSO frames (never posted: no credit) until the flow queue
    /// could not take another without dropping; returns how many.
    fn fill_one_flow(out: &mut Outbound) -> usize {
        let mut queued = 0;
        while out.tx.has_room(SEND_BUFFER_BYTES) {
            let mut b = out.cache.get().unwrap();
            let mut f = vec![0u8; SEND_BUFFER_BYTES as usize];
            f[vnet::VNET_HDR_LEN + 12] = 0x08;
            assert!(b.fill_from(&f));
            let flow = out.tx.flow(b.as_slice());
            out.tx
                .push(flow, SEND_BUFFER_BYTES, b, &mut |_| panic!("dropped"));
            queued += 1;
        }
        queued
    }

    #[test]
    fn with_backpressure_the_tap_waits_while_a_flow_fills_its_share() {
        let mut out = Outbound::new(LimitConfig::default(), true);
        assert!(out.can_read());
        let queued = fill_one_flow(&mut out);
        assert_eq!(
            queued,
            (4 << 20) / SEND_BUFFER_BYTES as usize,
            "a flow's 4 MiB share"
        );
        assert!(
            out.cache.has_free(),
            "buffers are left: the share stopped it"
        );
        assert!(!out.can_read());
        // One frame leaves: the next one fits again.
        let b = out.tx.next(0, Instant::now()).unwrap();
        out.cache.put(b);
        assert!(out.can_read());
        // A single queue is read on (its flow queue then drops from its longest flow).
        let mut single = Outbound::new(LimitConfig::default(), false);
        assert_eq!(fill_one_flow(&mut single), queued);
        assert!(single.can_read());
    }
}
