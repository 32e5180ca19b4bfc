//! The NIC as the IOC uses it: frames in and out, and its multicast filter.
//!
//! The daemon's NIC is a worker's AF_PACKET sockets in the NIC's fanout group
//! ([`LanQueues`]); the unit tests put a queue in its place, so that forwarding, quotas and
//! session ends run without root or an interface.

use splitnet_messaging::memory::SharedBytes;
use splitnet_netif::filter::Tagged;
use splitnet_netif::packet::{FilterHandle, PacketSocket};
use splitnet_netif::trunk::TrunkSocket;
use splitnet_netif::{fanout, filter};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use tracing::warn;

/// The NIC's frames for one host alone, which the kernel sorts out of the others
/// ([`Nic::host_rx`]) and the IOC reads straight into the host's shared memory.
pub trait HostRx: std::fmt::Debug {
    /// Receives one frame (virtio-net header first) into `dst`; returns its whole length,
    /// more than `dst`'s when it was cut, `WouldBlock` when none is waiting.
    fn recv_into(&self, dst: &SharedBytes<'_>) -> io::Result<usize>;
    /// Receives up to `dst.len()` frames, each into its range as [`HostRx::recv_into`]
    /// does, their whole lengths into `lens`; returns how many arrived (fewer when the
    /// queue ran out; `WouldBlock` when none was waiting).
    fn recv_batch_into(&self, dst: &[SharedBytes<'_>], lens: &mut [usize]) -> io::Result<usize> {
        let mut got = 0;
        for (d, len) in dst.iter().zip(lens.iter_mut()) {
            match self.recv_into(d) {
                Ok(n) => *len = n,
                Err(e) if got == 0 => return Err(e),
                Err(_) => break,
            }
            got += 1;
        }
        Ok(got)
    }
    /// Frames dropped since the last call because the queue was full.
    fn take_drops(&self) -> u64;
    /// The descriptor to wait on; `None` for a queue of a test.
    fn fd(&self) -> Option<BorrowedFd<'_>>;
    /// Takes no frame from now on; the ones waiting stay to be discarded.
    fn shut(&self) -> io::Result<()>;
    /// Drops frames waiting, unread (a batch of them at most); returns how many
    /// (`WouldBlock` when none was).
    fn discard(&self) -> io::Result<usize>;
}

/// Which of a MAC's frames a host's own queue takes ([`Nic::host_rx`]), and how it hands
/// them over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFrames {
    /// The frames, by the tag the kernel took out of each.
    pub tagged: Tagged,
    /// Their tags go back in (a trunk host's); else a tag stays out (an access host's
    /// frames, which it takes untagged).
    pub keep_tags: bool,
}

/// Sets which MACs' unicast frames a worker's NIC socket no longer receives (untagged, or
/// tagged with one of the host's VLANs, as [`Tagged`] says), because their hosts' own queues
/// do ([`HostRx`]);
/// usable from any worker's thread.
pub trait Exclusion: Send + std::fmt::Debug {
    /// Excludes exactly `macs` from now on, each as its host's own queue takes them.
    fn exclude(&self, macs: &[([u8; 6], Tagged)]) -> io::Result<()>;
}

/// A network interface carrying frames with a virtio-net header in front.
pub trait Nic: std::fmt::Debug {
    /// Receives up to `bufs.len()` frames from receive queue `queue`, their lengths into
    /// `lens`; returns how many arrived (fewer when the queue ran out; `WouldBlock` when none
    /// was waiting). A frame longer than its buffer is cut, and its whole length given
    /// (more than the buffer's). A NIC of one queue has queue 0 alone.
    fn recv_batch(
        &self,
        queue: usize,
        bufs: &mut [&mut [u8]],
        lens: &mut [usize],
    ) -> io::Result<usize>;
    /// Sends one frame.
    fn send(&self, frame: &[u8]) -> io::Result<usize>;
    /// Sends one frame made of `head` (private) and `rest` (in a host's shared pool).
    fn send_parts(&self, head: &[u8], rest: &SharedBytes<'_>) -> io::Result<usize> {
        let mut frame = head.to_vec();
        frame.resize(head.len() + rest.len(), 0);
        rest.copy_out(0, &mut frame[head.len()..])
            .map_err(io::Error::other)?;
        self.send(&frame)
    }
    /// Sends frames in order until one fails; returns how many were sent (an error when
    /// the first failed).
    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        for (i, f) in frames.iter().enumerate() {
            if let Err(e) = self.send(f) {
                return if i == 0 { Err(e) } else { Ok(i) };
            }
        }
        Ok(frames.len())
    }
    /// Frames dropped on receive since the last call because the IOC's receive ring (the
    /// socket's buffer) was full.
    fn take_drops(&self) -> u64 {
        0
    }
    /// Frames read from a mapped ring's slots since the last call.
    fn take_ring_frames(&self) -> u64 {
        0
    }
    /// Joins (`join`) or leaves a link-layer multicast group.
    fn set_multicast(&self, group: [u8; 6], join: bool) -> io::Result<()>;
    /// Adds (`add`) or removes a MAC in the NIC's unicast filter.
    fn set_unicast(&self, mac: [u8; 6], add: bool) -> io::Result<()>;
    /// Holds (`on`) the NIC in promiscuous mode, or lets it go.
    fn set_promisc(&self, on: bool) -> io::Result<()>;
    /// Steers received frames for each MAC of `table` to the worker it names (to its
    /// receive queues by flow hash), the rest by flow hash (a NIC shared by workers);
    /// nothing for a NIC of one worker.
    fn steer(&self, table: &[([u8; 6], u32)]) -> io::Result<()> {
        let _ = table;
        Ok(())
    }
    /// A queue of the NIC's unicast frames for `mac` alone that came as `frames` says. The
    /// workers' sockets keep receiving them too until `mac` is excluded ([`Exclusion`]),
    /// which comes first.
    fn host_rx(&self, mac: [u8; 6], frames: &HostFrames) -> io::Result<Box<dyn HostRx>> {
        let _ = (mac, frames);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// The handle that sets this socket's exclusions; `None` when it has none.
    fn exclusion(&self) -> io::Result<Option<Box<dyn Exclusion>>> {
        Ok(None)
    }
}

/// No NIC: the IOC's in ports mode (`lan.mode = "ports"`), where each host's frames go to
/// and come from its port ([`crate::port`]) and the switch owns the NIC. Nothing arrives;
/// a send is refused (none is made); filters have nothing to filter.
#[derive(Debug, Default)]
pub struct NoNic;

impl Nic for NoNic {
    fn recv_batch(&self, _: usize, _: &mut [&mut [u8]], _: &mut [usize]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    fn send(&self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "ports mode: frames go to the hosts' ports",
        ))
    }

    fn set_multicast(&self, _: [u8; 6], _: bool) -> io::Result<()> {
        Ok(())
    }

    fn set_unicast(&self, _: [u8; 6], _: bool) -> io::Result<()> {
        Ok(())
    }

    fn set_promisc(&self, _: bool) -> io::Result<()> {
        Ok(())
    }
}

/// Opens `queues` packet sockets per worker on `name` (its receive queues, each with a
/// mapped ring if `ring`), for `n` workers, in one fanout group when there are several: worker `w`'s are the group's sockets
/// `w * queues ..`, and until the workers steer their MACs every frame goes by flow hash.
pub fn open_lan(
    name: &str,
    n: usize,
    queues: usize,
    promisc: bool,
    ring: bool,
) -> io::Result<Vec<Vec<PacketSocket>>> {
    let mut socks = Vec::with_capacity(n * queues);
    let mut group = None;
    for _ in 0..n * queues {
        let s = if ring {
            PacketSocket::open_ring(name)?
        } else {
            PacketSocket::open(name)?
        };
        if n * queues > 1 {
            group = Some(s.join_fanout(group)?);
        }
        socks.push(s);
    }
    if let (Some(s), Some(_)) = (socks.first(), group) {
        s.set_fanout_program(&fanout::steering_program(&[], queues as u32))?;
    }
    let want = splitnet_netif::packet::RCVBUF as usize;
    if let Some(got) = socks.first().and_then(|s| s.rcvbuf().ok()) {
        if got < want {
            warn!(
                "the NIC's receive ring is {} KiB, not {} KiB: capped by net.core.rmem_max \
                 (SO_RCVBUFFORCE needs CAP_NET_ADMIN)",
                got >> 10,
                want >> 10
            );
        }
    }
    if promisc {
        if let Some(s) = socks.first() {
            s.set_promiscuous()?;
        }
    }
    let mut socks = socks.into_iter();
    Ok((0..n)
        .map(|_| socks.by_ref().take(queues).collect())
        .collect())
}

/// Most sockets a fanout group joined by number holds (the kernel's legacy
/// `PACKET_FANOUT_MAX`; beyond, joining fails with ENOSPC).
const FANOUT_MAX: usize = 256;

/// The receive queues each of `workers` workers gets: `wanted`, fewer where the fanout
/// group could not hold them all (said once).
pub fn rx_queues(wanted: usize, workers: usize) -> usize {
    let most = (FANOUT_MAX / workers.max(1)).max(1);
    if wanted > most {
        warn!(
            wanted,
            workers, "lan.rx_queues: {most} per worker, the most a fanout group holds"
        );
    }
    wanted.clamp(1, most)
}

/// A worker's receive queues on the NIC: its packet sockets in the NIC's fanout group (see
/// [`fanout`]), among which the kernel spreads the worker's frames by flow hash. The first
/// also sends, holds the multicast memberships and the promiscuous mode, and sets the group's
/// program; every one of them takes the workers' exclusions.
#[derive(Debug)]
pub struct LanQueues {
    socks: Vec<PacketSocket>,
}

impl LanQueues {
    /// The queues `socks` (at least one), the group's sockets `w * n ..` of worker `w`.
    pub fn new(socks: Vec<PacketSocket>) -> io::Result<LanQueues> {
        if socks.is_empty() {
            return Err(io::Error::other("no socket for this worker"));
        }
        Ok(LanQueues { socks })
    }

    /// The sockets, to wait on each.
    pub fn sockets(&self) -> &[PacketSocket] {
        &self.socks
    }

    fn first(&self) -> &PacketSocket {
        &self.socks[0]
    }
}

impl Nic for LanQueues {
    /// One `recvmmsg(2)` on that queue's socket.
    fn recv_batch(
        &self,
        queue: usize,
        bufs: &mut [&mut [u8]],
        lens: &mut [usize],
    ) -> io::Result<usize> {
        match self.socks.get(queue) {
            Some(s) => s.recv_batch(bufs, lens),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn send(&self, frame: &[u8]) -> io::Result<usize> {
        self.first().send(frame)
    }

    fn send_parts(&self, head: &[u8], rest: &SharedBytes<'_>) -> io::Result<usize> {
        self.first().send_parts(head, rest)
    }

    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        self.first().send_batch(frames)
    }

    /// Every queue's (a failed read counts nothing).
    fn take_drops(&self) -> u64 {
        self.socks.iter().map(|s| s.take_drops().unwrap_or(0)).sum()
    }

    fn take_ring_frames(&self) -> u64 {
        self.socks.iter().map(PacketSocket::take_ring_frames).sum()
    }

    fn set_multicast(&self, group: [u8; 6], join: bool) -> io::Result<()> {
        self.first().set_multicast(group, join)
    }

    fn set_unicast(&self, mac: [u8; 6], add: bool) -> io::Result<()> {
        self.first().set_unicast(mac, add)
    }

    fn set_promisc(&self, on: bool) -> io::Result<()> {
        self.first().set_promisc(on)
    }

    /// The group's program, each worker's MACs spread over its queues.
    fn steer(&self, table: &[([u8; 6], u32)]) -> io::Result<()> {
        let queues = self.socks.len() as u32;
        self.first()
            .set_fanout_program(&fanout::steering_program(table, queues))
    }

    /// A socket of its own on the interface, whose filter takes only `mac`'s frames (two
    /// for a trunk host that takes untagged ones too, [`TrunkSocket`]).
    fn host_rx(&self, mac: [u8; 6], frames: &HostFrames) -> io::Result<Box<dyn HostRx>> {
        let nic = self.first();
        Ok(match frames.keep_tags && frames.tagged.takes_tagged() {
            true => Box::new(TrunkSocket::open(nic, mac, &frames.tagged)?),
            false => Box::new(nic.open_sibling(&filter::only_to(&mac, &frames.tagged))?),
        })
    }

    /// A second descriptor of every queue's socket, whose filters it sets.
    fn exclusion(&self) -> io::Result<Option<Box<dyn Exclusion>>> {
        let handles = self
            .socks
            .iter()
            .map(PacketSocket::filter_handle)
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Some(Box::new(Exclusions(handles))))
    }
}

/// The exclusions of every receive queue of a worker.
#[derive(Debug)]
struct Exclusions(Vec<FilterHandle>);

impl Exclusion for Exclusions {
    fn exclude(&self, macs: &[([u8; 6], Tagged)]) -> io::Result<()> {
        self.0.iter().try_for_each(|h| h.exclude(macs))
    }
}

impl HostRx for PacketSocket {
    fn recv_into(&self, dst: &SharedBytes<'_>) -> io::Result<usize> {
        PacketSocket::recv_into(self, dst)
    }

    /// One `recvmmsg(2)` for the whole batch.
    fn recv_batch_into(&self, dst: &[SharedBytes<'_>], lens: &mut [usize]) -> io::Result<usize> {
        PacketSocket::recv_batch_into(self, dst, lens)
    }

    fn take_drops(&self) -> u64 {
        PacketSocket::take_drops(self).unwrap_or(0)
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }

    /// A filter that takes nothing.
    fn shut(&self) -> io::Result<()> {
        self.set_filter(&filter::nothing())
    }

    /// One `recvmmsg(2)` of up to 64 frames.
    fn discard(&self) -> io::Result<usize> {
        PacketSocket::discard(self)
    }
}

impl HostRx for TrunkSocket {
    /// One frame, as a batch of one.
    fn recv_into(&self, dst: &SharedBytes<'_>) -> io::Result<usize> {
        let mut len = [0];
        TrunkSocket::recv_batch_into(self, std::slice::from_ref(dst), &mut len)?;
        Ok(len[0])
    }

    /// One `recvmmsg(2)` for the whole batch from one of its sockets (a second when the
    /// first had none).
    fn recv_batch_into(&self, dst: &[SharedBytes<'_>], lens: &mut [usize]) -> io::Result<usize> {
        TrunkSocket::recv_batch_into(self, dst, lens)
    }

    fn take_drops(&self) -> u64 {
        TrunkSocket::take_drops(self).unwrap_or(0)
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }

    fn shut(&self) -> io::Result<()> {
        TrunkSocket::shut(self)
    }

    fn discard(&self) -> io::Result<usize> {
        TrunkSocket::discard(self)
    }
}

impl Exclusion for FilterHandle {
    fn exclude(&self, macs: &[([u8; 6], Tagged)]) -> io::Result<()> {
        self.set(&filter::all_but(macs))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fanout_group_holds_every_workers_queues() {
        assert_eq!(super::rx_queues(2, 2), 2);
        assert_eq!(super::rx_queues(16, 16), 16);
        assert_eq!(super::rx_queues(16, 64), 4, "64 workers: 256 sockets");
        assert_eq!(super::rx_queues(0, 1), 1);
        assert_eq!(super::rx_queues(3, 300), 1, "at least one each");
    }
}

#[cfg(test)]
pub mod fake {
    //! A NIC made of two queues, for tests.

    use super::{Exclusion, HostFrames, HostRx, Nic};
    use splitnet_messaging::memory::SharedBytes;
    use splitnet_messaging::vnet;
    use splitnet_netif::filter::Tagged;
    use std::cell::{Cell, RefCell};
    use std::collections::{HashMap, VecDeque};
    use std::io;
    use std::os::fd::BorrowedFd;
    use std::rc::Rc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// A MAC and the worker its frames go to.
    pub type Steer = ([u8; 6], u32);
    /// The MACs a socket excludes, each with the way its host's queue takes its frames,
    /// shared with the test.
    pub type Excluded = Arc<Mutex<Vec<([u8; 6], Tagged)>>>;

    /// Frames waiting to be received, and frames sent, shared with the test.
    #[derive(Debug, Default, Clone)]
    pub struct FakeNic {
        /// Frames the IOC will receive, in order.
        pub rx: Rc<RefCell<VecDeque<Vec<u8>>>>,
        /// Frames the IOC sent, in order.
        pub tx: Rc<RefCell<Vec<Vec<u8>>>>,
        /// Frames of this length are refused, as by a full device queue.
        pub refuse_len: Rc<Cell<Option<usize>>>,
        /// Calls of `send` and `send_batch`.
        pub sends: Rc<Cell<usize>>,
        /// Receive drops the NIC reports at its next `take_drops`.
        pub drops: Rc<Cell<u64>>,
        /// The last steering table set.
        pub steering: Rc<RefCell<Vec<Steer>>>,
        /// The queues of hosts' own opened ([`Nic::host_rx`]), by MAC: the IOC holds a
        /// second reference to each while it is open.
        pub hosts: Rc<RefCell<HashMap<[u8; 6], Rc<HostQueue>>>>,
        /// The MACs the socket excludes, as last set.
        pub excluded: Arc<Mutex<Vec<[u8; 6]>>>,
        /// The same with the way each host's queue takes its frames.
        pub excluded_tags: Excluded,
        /// The MACs whose host has its own queue open.
        open: Arc<Mutex<Vec<[u8; 6]>>>,
        /// Times the IOC got the order of a host's queue and the workers' filters wrong: a
        /// queue opened while its MAC was not excluded (both sockets would deliver its
        /// frames), or shut while its MAC still was (frames arriving then reach no socket).
        pub violations: Arc<AtomicUsize>,
        /// Multicast memberships joined or left (each a setsockopt under the kernel's rtnl
        /// lock on a real NIC).
        pub memberships: Cell<u64>,
        /// The NIC's unicast filter, as set.
        pub unicast: Rc<RefCell<Vec<[u8; 6]>>>,
        /// Whether the NIC is held promiscuous.
        pub promisc: Rc<Cell<bool>>,
        /// Opening a host's queue fails (as when the kernel refuses a socket).
        pub refuse_host_rx: Rc<Cell<bool>>,
        /// The read of `rx` after this many more fails, taking its frame, as when the kernel
        /// cannot hand a frame over.
        pub unreadable_after: Rc<Cell<Option<usize>>>,
        /// The error a batched read met after some frames, for the next read (as
        /// `recvmmsg(2)` keeps it).
        pending: Rc<Cell<Option<io::ErrorKind>>>,
    }

    /// A host's own queue of frames.
    #[derive(Debug, Default)]
    pub struct HostQueue {
        /// Frames waiting, in order.
        pub frames: RefCell<VecDeque<Vec<u8>>>,
        /// Drops it reports at its next `take_drops`.
        pub drops: Cell<u64>,
        /// It takes no more frames.
        pub shut: Cell<bool>,
        /// Which of its MAC's frames it takes, and how.
        pub takes: RefCell<HostFrames>,
        /// Frames the IOC read and gave to the host, or discarded.
        pub taken: Cell<u64>,
        /// The error a batched read met after some frames, for the next read.
        pending: Cell<Option<io::ErrorKind>>,
    }

    /// The IOC's end of a [`HostQueue`].
    #[derive(Debug)]
    struct FakeHostRx {
        q: Rc<HostQueue>,
        mac: [u8; 6],
        open: Arc<Mutex<Vec<[u8; 6]>>>,
        excluded: Excluded,
        violations: Arc<AtomicUsize>,
    }

    impl Drop for FakeHostRx {
        fn drop(&mut self) {
            self.open.lock().unwrap().retain(|m| *m != self.mac);
        }
    }

    impl HostRx for FakeHostRx {
        /// Shut, it counts as closed (it takes nothing).
        fn shut(&self) -> io::Result<()> {
            if self
                .excluded
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.0 == self.mac)
            {
                self.violations.fetch_add(1, Ordering::Relaxed);
            }
            self.q.shut.set(true);
            self.open.lock().unwrap().retain(|m| *m != self.mac);
            Ok(())
        }

        fn discard(&self) -> io::Result<usize> {
            self.q
                .frames
                .borrow_mut()
                .pop_front()
                .ok_or(io::ErrorKind::WouldBlock)?;
            self.q.taken.set(self.q.taken.get() + 1);
            Ok(1)
        }

        /// As `recvmmsg(2)`: a read that fails after some frames returns those, and the
        /// error at the next call.
        fn recv_batch_into(
            &self,
            dst: &[SharedBytes<'_>],
            lens: &mut [usize],
        ) -> io::Result<usize> {
            read_batch(&self.q.pending, dst.len().min(lens.len()), |i| {
                self.recv_into(&dst[i]).map(|n| lens[i] = n)
            })
        }

        /// An empty frame stands for one the kernel cannot hand over: it is consumed and
        /// the read fails, as `recv` does with EINVAL.
        fn recv_into(&self, dst: &SharedBytes<'_>) -> io::Result<usize> {
            let f = self
                .q
                .frames
                .borrow_mut()
                .pop_front()
                .ok_or(io::ErrorKind::WouldBlock)?;
            self.q.taken.set(self.q.taken.get() + 1);
            if f.is_empty() {
                return Err(io::ErrorKind::InvalidInput.into());
            }
            let n = f.len().min(dst.len());
            dst.copy_in(0, &f[..n]).map_err(io::Error::other)?;
            Ok(f.len())
        }

        fn take_drops(&self) -> u64 {
            self.q.drops.take()
        }

        fn fd(&self) -> Option<BorrowedFd<'_>> {
            None
        }
    }

    /// The fake's exclusions, shared with the test.
    #[derive(Debug)]
    struct FakeExclusion {
        excluded: Arc<Mutex<Vec<[u8; 6]>>>,
        tags: Excluded,
    }

    impl Exclusion for FakeExclusion {
        fn exclude(&self, macs: &[([u8; 6], Tagged)]) -> io::Result<()> {
            *self.excluded.lock().unwrap() = macs.iter().map(|e| e.0).collect();
            *self.tags.lock().unwrap() = macs.to_vec();
            Ok(())
        }
    }

    /// Whether a frame (virtio-net header first, its tags inline) came as `t` says, as the
    /// kernel's filter sees it once it took the outer tag out.
    fn came(frame: &[u8], t: &Tagged) -> bool {
        t.takes(vnet::outer_tag(frame).map(|(_, tci)| tci))
    }

    impl FakeNic {
        /// A frame arriving from the LAN, as the kernel's filters sort it: to the open
        /// queue of its destination's host that still takes frames, and to `rx` unless its
        /// destination is excluded (both, or neither, when the IOC got the order wrong).
        pub fn arrive(&self, frame: Vec<u8>) {
            let dst: [u8; 6] = frame[10..16].try_into().unwrap();
            let own = self
                .host_queue(dst)
                .filter(|q| !q.shut.get() && came(&frame, &q.takes.borrow().tagged));
            if let Some(q) = own {
                // Its socket gets it as the kernel hands it, the tag it took out back in
                // for a trunk host, else left out.
                let mut f = frame.clone();
                if !q.takes.borrow().keep_tags {
                    let n = f.len();
                    let n = vnet::strip_vlan(&mut f, n).unwrap_or(n);
                    f.truncate(n);
                }
                q.frames.borrow_mut().push_back(f);
            }
            let excluded = self
                .excluded_tags
                .lock()
                .unwrap()
                .iter()
                .any(|(m, t)| *m == dst && came(&frame, t));
            if !excluded {
                self.rx.borrow_mut().push_back(frame);
            }
        }

        /// The queue of `mac`'s host, while the IOC holds it open.
        pub fn host_queue(&self, mac: [u8; 6]) -> Option<Rc<HostQueue>> {
            if !self.open.lock().unwrap().contains(&mac) {
                return None;
            }
            self.hosts.borrow().get(&mac).cloned()
        }

        fn put(&self, frame: &[u8]) -> io::Result<usize> {
            if self.refuse_len.get() == Some(frame.len()) {
                return Err(io::Error::other("device queue full"));
            }
            self.tx.borrow_mut().push(frame.to_vec());
            Ok(frame.len())
        }
    }

    /// Up to `n` reads as `recvmmsg(2)` makes them (`read(i)` fills entry `i`): an error
    /// after some frames ends the batch and is kept in `pending` for the next call.
    fn read_batch(
        pending: &Cell<Option<io::ErrorKind>>,
        n: usize,
        mut read: impl FnMut(usize) -> io::Result<()>,
    ) -> io::Result<usize> {
        if let Some(e) = pending.take() {
            return Err(e.into());
        }
        for i in 0..n {
            match read(i) {
                Ok(()) => {}
                Err(e) if i == 0 => return Err(e),
                Err(e) => {
                    if e.kind() != io::ErrorKind::WouldBlock {
                        pending.set(Some(e.kind()));
                    }
                    return Ok(i);
                }
            }
        }
        Ok(n)
    }

    impl FakeNic {
        /// Receives the next frame, as a packet socket does (`WouldBlock`: none).
        fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
            let frame = self
                .rx
                .borrow_mut()
                .pop_front()
                .ok_or(io::ErrorKind::WouldBlock)?;
            match self.unreadable_after.get() {
                Some(0) => {
                    self.unreadable_after.set(None);
                    return Err(io::ErrorKind::InvalidInput.into());
                }
                Some(k) => self.unreadable_after.set(Some(k - 1)),
                None => {}
            }
            let n = frame.len().min(buf.len());
            buf[..n].copy_from_slice(&frame[..n]);
            // As the kernel with MSG_TRUNC: the whole length of a frame cut short.
            Ok(frame.len())
        }
    }

    impl Nic for FakeNic {
        /// As `recvmmsg(2)`: an error after some frames ends the batch and is returned by
        /// the next call.
        fn recv_batch(
            &self,
            queue: usize,
            bufs: &mut [&mut [u8]],
            lens: &mut [usize],
        ) -> io::Result<usize> {
            if queue != 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            read_batch(&self.pending, bufs.len().min(lens.len()), |i| {
                self.recv(bufs[i]).map(|n| lens[i] = n)
            })
        }

        fn send(&self, frame: &[u8]) -> io::Result<usize> {
            self.sends.set(self.sends.get() + 1);
            self.put(frame)
        }

        fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
            self.sends.set(self.sends.get() + 1);
            for (i, f) in frames.iter().enumerate() {
                if let Err(e) = self.put(f) {
                    return if i == 0 { Err(e) } else { Ok(i) };
                }
            }
            Ok(frames.len())
        }

        fn set_multicast(&self, _: [u8; 6], _: bool) -> io::Result<()> {
            self.memberships.set(self.memberships.get() + 1);
            Ok(())
        }

        fn set_unicast(&self, mac: [u8; 6], add: bool) -> io::Result<()> {
            let mut u = self.unicast.borrow_mut();
            match add {
                true => u.push(mac),
                false => u.retain(|m| *m != mac),
            }
            Ok(())
        }

        fn set_promisc(&self, on: bool) -> io::Result<()> {
            self.promisc.set(on);
            Ok(())
        }

        fn take_drops(&self) -> u64 {
            self.drops.take()
        }

        fn steer(&self, table: &[([u8; 6], u32)]) -> io::Result<()> {
            let mut t = table.to_vec();
            t.sort();
            *self.steering.borrow_mut() = t;
            Ok(())
        }

        fn host_rx(&self, mac: [u8; 6], frames: &HostFrames) -> io::Result<Box<dyn HostRx>> {
            if self.refuse_host_rx.get() {
                return Err(io::Error::other("the kernel refused a socket"));
            }
            let excluded = (mac, frames.tagged.clone());
            if !self.excluded_tags.lock().unwrap().contains(&excluded) {
                self.violations.fetch_add(1, Ordering::Relaxed);
            }
            let q = Rc::new(HostQueue {
                takes: RefCell::new(frames.clone()),
                ..HostQueue::default()
            });
            self.hosts.borrow_mut().insert(mac, q.clone());
            self.open.lock().unwrap().push(mac);
            Ok(Box::new(FakeHostRx {
                q,
                mac,
                open: self.open.clone(),
                excluded: self.excluded_tags.clone(),
                violations: self.violations.clone(),
            }))
        }

        fn exclusion(&self) -> io::Result<Option<Box<dyn Exclusion>>> {
            Ok(Some(Box::new(FakeExclusion {
                excluded: self.excluded.clone(),
                tags: self.excluded_tags.clone(),
            })))
        }
    }
}
