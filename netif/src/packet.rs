//! An `AF_PACKET` socket owning a NIC, with a virtio-net header on every frame.
//!
//! The kernel takes the outermost VLAN tag (802.1Q, or 802.1ad in QinQ) out of a frame it
//! receives and reports it beside the frame (`PACKET_AUXDATA`); [`PacketSocket::recv`] puts
//! it back where it was, so the frame a host gets is the frame that was on the wire. Frames
//! sent carry their tags inline and leave as they are.

use super::bpf::Insn;
use super::rx_ring::{self, RxRing, Slot, TP_STATUS_VLAN_TPID_VALID, TP_STATUS_VLAN_VALID};
use super::{cvt, netdev, write};
use splitnet_messaging::memory::SharedBytes;
use splitnet_messaging::vnet::{
    insert_vlan, tag_bytes, tagged_header, VLAN_TAG_AT, VLAN_TAG_LEN, VNET_HDR_LEN,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const PACKET_ADD_MEMBERSHIP: libc::c_int = 1;
const PACKET_DROP_MEMBERSHIP: libc::c_int = 2;
const PACKET_MR_MULTICAST: libc::c_ushort = 0;
const PACKET_MR_PROMISC: libc::c_ushort = 1;
const PACKET_MR_UNICAST: libc::c_ushort = 3;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_AUXDATA: libc::c_int = 8;
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_FANOUT_DATA: libc::c_int = 22;
const PACKET_FANOUT_CBPF: u32 = 6;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_COPY_THRESH: libc::c_int = 7;
const PACKET_VERSION: libc::c_int = 10;
const TPACKET_V2: libc::c_int = 1;
/// The group ignores frames sent on the interface, as [`PACKET_IGNORE_OUTGOING`] does for
/// one socket (a socket in a group receives through the group's hook, not its own).
const PACKET_FANOUT_FLAG_IGNORE_OUTGOING: u32 = 0x4000;
/// The kernel picks an unused group id (for the group's first socket).
const PACKET_FANOUT_FLAG_UNIQUEID: u32 = 0x2000;
const ETH_P_ALL: u16 = 0x0003;
const ETH_P_8021Q: u16 = 0x8100;

/// `struct tpacket_auxdata` of `<linux/if_packet.h>`: what the kernel says about a received
/// frame beside it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AuxData {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
}

/// Room for one `PACKET_AUXDATA` control message (`CMSG_SPACE(20)` is 40 on 64-bit Linux),
/// aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgSpace([u8; 64]);

/// `struct tpacket_stats` of `<linux/if_packet.h>`: frames received and dropped since the
/// last read (reading resets them).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

/// Bytes of frames the socket holds for the IOC before the kernel drops what arrives: the
/// NIC's receive ring as the IOC sees it (the kernel doubles the value for its accounting).
/// What waits here waits first in, first out, before the IOC's flow queues; a smaller ring
/// shortens that wait (256 KiB halved a ping's during a download over TCP) but drops when
/// the IOC runs late on shared cores, which cost 5-20% of the throughput from the LAN here
/// (README, "Latency under load"), so the ring stays at 4 MiB.
pub const RCVBUF: libc::c_int = 4 << 20;

/// Most frames one [`PacketSocket::recv_batch`] takes.
pub const RECV_BATCH: usize = 64;
/// Most frames one [`PacketSocket::send_batch`] sends.
pub const SEND_BATCH: usize = 64;

/// A raw packet socket bound to one interface (non-blocking).
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
    /// The mapped receive ring, when the socket has one ([`PacketSocket::open_ring`]).
    ring: Option<RxRing>,
}

/// Sets the receive buffer to `bytes`: with SO_RCVBUFFORCE, which passes over
/// net.core.rmem_max (208 KiB on many distributions) given CAP_NET_ADMIN, which the IOC
/// holds; without it, SO_RCVBUF up to that cap ([`PacketSocket::rcvbuf`] says what the
/// kernel granted).
fn set_rcvbuf(fd: &OwnedFd, bytes: libc::c_int) {
    if setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &bytes).is_err() {
        let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &bytes);
    }
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` points to a valid T of size_of::<T>() bytes for the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Reads a socket option of type `T` (plain old data: an integer or a `repr(C)` struct of
/// them, whose default is all zeros).
fn getsockopt<T: Default + Copy>(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes of the sizes given for the call.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

impl PacketSocket {
    /// Opens a socket on `ifname` receiving every frame but its own, with virtio-net headers
    /// in both directions.
    pub fn open(ifname: &str) -> io::Result<PacketSocket> {
        PacketSocket::open_filtered(netdev::index(ifname)?, None, false)
    }

    /// Opens a socket as [`PacketSocket::open`] does, receiving through a mapped ring
    /// ([`super::rx_ring`]): frames that fit a slot arrive without a system call, longer ones
    /// as before, all in the order they came.
    pub fn open_ring(ifname: &str) -> io::Result<PacketSocket> {
        PacketSocket::open_filtered(netdev::index(ifname)?, None, true)
    }

    /// Whether frames arrive through a mapped ring.
    pub fn has_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// Frames read from the mapped ring's slots (not from the socket's queue) since the
    /// last call; 0 without a ring.
    pub fn take_ring_frames(&self) -> u64 {
        self.ring.as_ref().map_or(0, RxRing::take_taken)
    }

    /// Bytes of frames the socket's buffer holds (what the kernel granted of [`RCVBUF`], which
    /// it doubles for its accounting; halved back here).
    pub fn rcvbuf(&self) -> io::Result<usize> {
        let v: libc::c_int = getsockopt(&self.fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
        Ok(usize::try_from(v).unwrap_or(0) / 2)
    }

    /// Opens a second socket on this one's interface receiving only the frames `filter`
    /// takes (see [`super::filter`]), from its very first frame; otherwise as
    /// [`PacketSocket::open`].
    pub fn open_sibling(&self, filter: &[Insn]) -> io::Result<PacketSocket> {
        PacketSocket::open_filtered(self.ifindex, Some(filter), false)
    }

    /// The socket of [`PacketSocket::open`], with `filter` set before it receives anything.
    fn open_filtered(
        ifindex: u32,
        filter: Option<&[Insn]>,
        ring: bool,
    ) -> io::Result<PacketSocket> {
        let proto = ETH_P_ALL.to_be();
        // Protocol 0: the socket receives nothing until it is bound below, to one interface
        // and with its filter already set (a socket opened with ETH_P_ALL would queue the
        // frames of every interface meanwhile).
        // SAFETY: plain socket(2) call; the result is checked before it is owned.
        let raw = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        // SAFETY: `raw` was just returned by socket(2) and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        setsockopt(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, &one)?;
        // Our own transmissions must not come back as receptions (Linux >= 4.20).
        setsockopt(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &one)?;
        // The VLAN tag the kernel strips, reported beside each frame (recv puts it back).
        setsockopt(&fd, libc::SOL_PACKET, PACKET_AUXDATA, &one)?;
        set_rcvbuf(&fd, RCVBUF);
        let sndbuf: libc::c_int = 4 << 20;
        let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &sndbuf);
        if let Some(prog) = filter {
            set_filter(&fd, prog)?;
        }
        // Before the socket is bound, so that no frame waits in its queue outside the ring.
        let ring = if ring {
            setsockopt(&fd, libc::SOL_PACKET, PACKET_VERSION, &TPACKET_V2)?;
            // Frames too long for a slot are queued whole as well (any non-zero value).
            setsockopt(&fd, libc::SOL_PACKET, PACKET_COPY_THRESH, &one)?;
            setsockopt(&fd, libc::SOL_PACKET, PACKET_RX_RING, &rx_ring::request())?;
            Some(RxRing::map(fd.as_fd())?)
        } else {
            None
        };
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid before the fields are set.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as libc::c_ushort;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(PacketSocket { fd, ifindex, ring })
    }

    /// Puts the NIC in promiscuous mode for as long as the socket is open.
    pub fn set_promiscuous(&self) -> io::Result<()> {
        self.membership(PACKET_MR_PROMISC, None, true)
    }

    /// Turns this socket's hold on the NIC's promiscuous mode on or off (the kernel counts
    /// holds: the NIC stays promiscuous while anything holds it).
    pub fn set_promisc(&self, on: bool) -> io::Result<()> {
        self.membership(PACKET_MR_PROMISC, None, on)
    }

    /// Adds (`add`) or removes a MAC in the NIC's unicast filter (`PACKET_MR_UNICAST`): frames
    /// to it arrive without promiscuous mode where the NIC filters unicast addresses; where
    /// it cannot, the kernel turns it promiscuous while the filter holds any. Counted as
    /// multicast joins are.
    pub fn set_unicast(&self, mac: [u8; 6], add: bool) -> io::Result<()> {
        self.membership(PACKET_MR_UNICAST, Some(mac), add)
    }

    fn membership(
        &self,
        mr_type: libc::c_ushort,
        mac: Option<[u8; 6]>,
        add: bool,
    ) -> io::Result<()> {
        let mut mr_address = [0u8; 8];
        if let Some(m) = mac {
            mr_address[..6].copy_from_slice(&m);
        }
        let mreq = libc::packet_mreq {
            mr_ifindex: self.ifindex as libc::c_int,
            mr_type,
            mr_alen: if mac.is_some() { 6 } else { 0 },
            mr_address,
        };
        let op = if add {
            PACKET_ADD_MEMBERSHIP
        } else {
            PACKET_DROP_MEMBERSHIP
        };
        setsockopt(&self.fd, libc::SOL_PACKET, op, &mreq)
    }

    /// Joins (`join`) or leaves a link-layer multicast group on the NIC: the group enters or
    /// leaves the NIC's multicast filter (`ip maddr show`) for as long as the socket is open.
    /// The kernel counts joins, so each join needs exactly one leave.
    pub fn set_multicast(&self, group: [u8; 6], join: bool) -> io::Result<()> {
        self.membership(PACKET_MR_MULTICAST, Some(group), join)
    }

    /// Joins a `PACKET_FANOUT` group steered by a classic BPF program (see
    /// [`super::fanout`]): a new group with an id the kernel picks when `group` is `None`,
    /// else the group named. Returns the group's id. Sockets are numbered in the order they
    /// join; until a program is set, every frame goes to the first.
    pub fn join_fanout(&self, group: Option<u16>) -> io::Result<u16> {
        let flags = PACKET_FANOUT_FLAG_IGNORE_OUTGOING
            | if group.is_none() {
                PACKET_FANOUT_FLAG_UNIQUEID
            } else {
                0
            };
        let arg: u32 = u32::from(group.unwrap_or(0)) | ((PACKET_FANOUT_CBPF | flags) << 16);
        setsockopt(&self.fd, libc::SOL_PACKET, PACKET_FANOUT, &arg)?;
        let val: u32 = getsockopt(&self.fd, libc::SOL_PACKET, PACKET_FANOUT)?;
        Ok(val as u16)
    }

    /// Frames the kernel dropped since the last call because the socket's buffer was full
    /// ([`RCVBUF`]): the overflows of the NIC's receive ring, as a NIC counts them.
    pub fn take_drops(&self) -> io::Result<u64> {
        let st: TpacketStats = getsockopt(&self.fd, libc::SOL_PACKET, PACKET_STATISTICS)?;
        // With a ring, also the long frames the full buffer could not queue whole: the
        // kernel cut them into their slots and did not count them.
        let cut = self.ring.as_ref().map_or(0, RxRing::take_cut);
        Ok(u64::from(st.tp_drops) + cut)
    }

    /// Sets the program of the fanout group this socket is in (for every socket of it).
    pub fn set_fanout_program(&self, prog: &[Insn]) -> io::Result<()> {
        setsockopt(
            &self.fd,
            libc::SOL_PACKET,
            PACKET_FANOUT_DATA,
            &fprog(prog)?,
        )
    }

    /// Replaces the socket's receive filter (see [`FilterHandle::set`]).
    pub fn set_filter(&self, prog: &[Insn]) -> io::Result<()> {
        set_filter(&self.fd, prog)
    }

    /// Drops up to [`RECV_BATCH`] frames waiting, unread, with one `recvmmsg(2)`; returns
    /// how many (`WouldBlock`: none).
    pub fn discard(&self) -> io::Result<usize> {
        if let Some(ring) = &self.ring {
            let mut slots = 0;
            while slots < RECV_BATCH {
                match ring.with_next(rx_ring::is_queued) {
                    None => break,
                    Some(false) => ring.release(),
                    // Its frame waits in the queue: the slot goes back with it.
                    Some(true) => {
                        let read = self.discard_queued(1);
                        let consumed = consumed_by(&read);
                        (0..consumed).for_each(|_| ring.release());
                        if consumed == 0 {
                            read?;
                            break;
                        }
                    }
                }
                slots += 1;
            }
            return if slots == 0 {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(slots)
            };
        }
        self.discard_queued(RECV_BATCH)
    }

    /// Drops up to `n` frames of the socket's queue with one `recvmmsg(2)`.
    fn discard_queued(&self, n: usize) -> io::Result<usize> {
        let n = n.min(RECV_BATCH);
        // Room for each frame's virtio-net header, which the kernel refuses to cut (EINVAL).
        let mut heads = [[0u8; 16]; RECV_BATCH];
        let mut iovs = heads.each_mut().map(|h| libc::iovec {
            iov_base: h.as_mut_ptr().cast(),
            iov_len: h.len(),
        });
        // SAFETY: each iovec names an entry of `heads`, writable and unmoved for the call.
        unsafe { self.recv_each(&mut iovs[..n], &mut [0; RECV_BATCH]) }
    }

    /// A second descriptor of this socket, to set its receive filter from another thread.
    pub fn filter_handle(&self) -> io::Result<FilterHandle> {
        Ok(FilterHandle(self.fd.try_clone()?))
    }

    /// Receives one frame (virtio-net header first) straight into the bytes `dst` names in
    /// shared memory, with one `recv(2)`: the kernel writes them. Returns the frame's whole
    /// length, which is more than `dst`'s when the frame did not fit (then cut). The VLAN
    /// tag the kernel took out, if any, is not put back: use it on a socket whose filter
    /// takes untagged frames, or those of one VLAN for a host that gets them untagged
    /// ([`super::filter::only_to`]).
    pub fn recv_into(
        &self,
        dst: &splitnet_messaging::memory::SharedBytes<'_>,
    ) -> io::Result<usize> {
        super::recv_into(self.fd.as_fd(), dst, libc::MSG_TRUNC)
    }

    /// Receives one frame (virtio-net header first) as it was on the wire: a VLAN tag the
    /// kernel took out is put back after the MAC addresses, with the TPID it had (0x8100
    /// where the kernel does not say), and the header's offsets moved past it. The last
    /// [`VLAN_TAG_LEN`] bytes of `buf` are kept free for the tag.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut lens = [0usize];
        self.recv_batch(&mut [buf], &mut lens)?;
        Ok(lens[0])
    }

    /// Receives up to `bufs.len()` frames (at most [`RECV_BATCH`]) with one `recvmmsg(2)`,
    /// each as [`PacketSocket::recv`] does; their lengths go to `lens`: a frame too long for
    /// its buffer is cut, and its length is its whole length, beyond the buffer's (the
    /// caller counts and drops it). Returns how many arrived: fewer than asked when the
    /// socket ran out, `WouldBlock` when none was there.
    pub fn recv_batch(&self, bufs: &mut [&mut [u8]], lens: &mut [usize]) -> io::Result<usize> {
        match &self.ring {
            Some(ring) => self.recv_ring(ring, bufs, lens),
            None => self.recv_queued(bufs, lens),
        }
    }

    /// [`PacketSocket::recv_batch`] through the ring: each slot's frame copied out, a run
    /// of frames too long for their slots read from the socket's queue with one
    /// `recvmmsg(2)`, in the ring's order.
    fn recv_ring(
        &self,
        ring: &RxRing,
        bufs: &mut [&mut [u8]],
        lens: &mut [usize],
    ) -> io::Result<usize> {
        let n = bufs.len().min(lens.len()).min(RECV_BATCH);
        let mut i = 0;
        while i < n {
            let Some(queued) = ring.with_next(rx_ring::is_queued) else {
                break;
            };
            if queued {
                // A run of slots whose frames wait in the queue: each slot goes back
                // only once its frame was read (or consumed by a failed read), so
                // that the ring and the queue stay in step.
                let mut run = 1;
                while i + run < n && ring.with_ahead(run, rx_ring::is_queued) == Some(true) {
                    run += 1;
                }
                let read = self.recv_queued(&mut bufs[i..i + run], &mut lens[i..i + run]);
                (0..consumed_by(&read)).for_each(|_| ring.release());
                match read {
                    Ok(got) if got == run => i += got,
                    Ok(got) => {
                        i += got;
                        break;
                    }
                    Err(e) if i == 0 => return Err(e),
                    Err(_) => break,
                }
                continue;
            }
            // The frame in its slot, copied out unless the kernel cut it (`None`).
            let Some(taken) = ring.with_next(|b| {
                rx_ring::parse_slot(b).map(|s| (!s.cut()).then(|| take_slot(b, &s, bufs[i])))
            }) else {
                break;
            };
            match taken {
                Ok(Some(len)) => {
                    lens[i] = len;
                    ring.release();
                    ring.count_taken();
                    i += 1;
                }
                Ok(None) => {
                    ring.release();
                    ring.count_cut();
                }
                // The kernel wrote a header that describes no frame in its slot (never
                // seen): that frame could not be read; the next call takes the next one.
                Err(e) if i == 0 => {
                    ring.release();
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
                Err(_) => break,
            }
        }
        if i == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(i)
    }

    /// [`PacketSocket::recv_batch`] from the socket's queue: one `recvmmsg(2)`.
    fn recv_queued(&self, bufs: &mut [&mut [u8]], lens: &mut [usize]) -> io::Result<usize> {
        let n = bufs.len().min(lens.len()).min(RECV_BATCH);
        // SAFETY: iovec and mmsghdr are plain old data; all-zero is valid before the fields
        // are set.
        let mut iovs: [libc::iovec; RECV_BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; RECV_BATCH] = unsafe { std::mem::zeroed() };
        let mut spaces: [CmsgSpace; RECV_BATCH] = std::array::from_fn(|_| CmsgSpace([0; 64]));
        for i in 0..n {
            iovs[i] = libc::iovec {
                iov_base: bufs[i].as_mut_ptr().cast(),
                iov_len: bufs[i].len().saturating_sub(VLAN_TAG_LEN),
            };
            let h = &mut msgs[i].msg_hdr;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = spaces[i].0.as_mut_ptr().cast();
            h.msg_controllen = spaces[i].0.len() as _;
        }
        // SAFETY: the first `n` entries of `msgs` point at `iovs` (each the first bytes of
        // a buffer of `bufs`, less the tag's room) and at `spaces`, all valid and writable
        // and unmoved for the whole call; the kernel fills at most `n` of them.
        let got = unsafe { self.recvmmsg(&mut msgs[..n]) }?;
        for i in 0..got {
            let whole = msgs[i].msg_len as usize;
            // MSG_TRUNC: the frame's whole length, even when the buffer took only its start;
            // a cut frame says so with a length beyond its buffer, and keeps no tag.
            lens[i] = if whole > iovs[i].iov_len {
                whole.max(bufs[i].len() + 1)
            } else {
                restore_tag(bufs[i], whole, &msgs[i].msg_hdr)
            };
        }
        Ok(got)
    }

    /// Receives up to `dst.len()` frames (at most [`RECV_BATCH`]) with one `recvmmsg(2)`,
    /// each straight into its range of shared memory as [`PacketSocket::recv_into`] does
    /// one; their whole lengths go to `lens`. Returns how many arrived (`WouldBlock`: none).
    pub fn recv_batch_into(
        &self,
        dst: &[splitnet_messaging::memory::SharedBytes<'_>],
        lens: &mut [usize],
    ) -> io::Result<usize> {
        let n = dst.len().min(RECV_BATCH);
        // SAFETY: iovec is plain old data; all-zero is valid before the fields are set.
        let mut iovs: [libc::iovec; RECV_BATCH] = unsafe { std::mem::zeroed() };
        for (iov, d) in iovs.iter_mut().zip(dst) {
            let (base, len) = super::shared_range(d)?;
            *iov = libc::iovec {
                iov_base: base,
                iov_len: len,
            };
        }
        // SAFETY: the first `n` iovecs each name a range inside a live slice of atomics (see
        // `super::read_into`), valid for the call; the kernel's writes race only with the
        // peer's, which changes bytes, not memory safety.
        unsafe { self.recv_each(&mut iovs[..n], lens) }
    }

    /// Receives up to `dst.len()` frames (at most [`RECV_BATCH`]) with one `recvmmsg(2)`,
    /// each straight into its range of shared memory as it was on the wire: the kernel
    /// writes the frame around a gap of [`VLAN_TAG_LEN`] bytes after its MAC addresses, the
    /// tag it took out goes there, and the header's offsets move past it (as
    /// [`PacketSocket::recv`] does, without moving the frame). For a socket whose filter
    /// takes tagged frames alone ([`super::filter::only_to`]). Their whole lengths go to
    /// `lens`, beyond a range's when the frame did not fit (then cut), 0 for a frame refused
    /// because its tag cannot go back (it came untagged, or its header's offsets would
    /// overflow with the tag): delivered without it, it would reach the host on a VLAN that
    /// is not its own. Returns how many arrived (`WouldBlock`: none).
    pub fn recv_batch_tagged_into(
        &self,
        dst: &[SharedBytes<'_>],
        lens: &mut [usize],
    ) -> io::Result<usize> {
        const GAP_END: usize = VLAN_TAG_AT + VLAN_TAG_LEN;
        let n = dst.len().min(lens.len()).min(RECV_BATCH);
        // SAFETY: iovec and mmsghdr are plain old data; all-zero is valid before the fields
        // are set.
        let mut iovs: [[libc::iovec; 2]; RECV_BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; RECV_BATCH] = unsafe { std::mem::zeroed() };
        let mut spaces: [CmsgSpace; RECV_BATCH] = std::array::from_fn(|_| CmsgSpace([0; 64]));
        for i in 0..n {
            let (base, len) = super::shared_range(&dst[i])?;
            if len < GAP_END {
                return Err(io::ErrorKind::InvalidInput.into());
            }
            iovs[i] = [
                libc::iovec {
                    iov_base: base,
                    iov_len: VLAN_TAG_AT,
                },
                libc::iovec {
                    iov_base: base.wrapping_byte_add(GAP_END),
                    iov_len: len - GAP_END,
                },
            ];
            let h = &mut msgs[i].msg_hdr;
            h.msg_iov = iovs[i].as_mut_ptr();
            h.msg_iovlen = 2;
            h.msg_control = spaces[i].0.as_mut_ptr().cast();
            h.msg_controllen = spaces[i].0.len() as _;
        }
        // SAFETY: the first `n` entries of `msgs` point at `iovs` and `spaces`, unmoved for
        // the call; each iovec names a range inside a live slice of atomics (see
        // `super::read_into`: the kernel's writes race only with the peer's, which changes
        // bytes, not memory safety), the two of a frame its range less the gap.
        let got = unsafe { self.recvmmsg(&mut msgs[..n]) }?;
        for i in 0..got {
            let whole = msgs[i].msg_len as usize;
            lens[i] = if whole + VLAN_TAG_LEN > dst[i].len() {
                // Cut: its length with the tag, beyond the range.
                whole + VLAN_TAG_LEN
            } else {
                place_tag(&dst[i], whole, auxdata(&msgs[i].msg_hdr)).unwrap_or(0)
            };
        }
        Ok(got)
    }

    /// One `recvmmsg(2)` with `MSG_TRUNC` into `msgs`; how many it filled (at most
    /// `msgs.len()`).
    ///
    /// # Safety
    ///
    /// Each entry's iovecs and control buffer must name memory valid for writes of their
    /// lengths, unmoved for the whole call.
    unsafe fn recvmmsg(&self, msgs: &mut [libc::mmsghdr]) -> io::Result<usize> {
        // SAFETY: the caller's promise for every buffer the entries name; `msgs` itself is
        // a live slice the kernel fills at most `msgs.len()` entries of.
        let got = cvt(unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                msgs.len() as libc::c_uint,
                libc::MSG_TRUNC,
                std::ptr::null_mut(),
            )
        })?;
        Ok((got as usize).min(msgs.len()))
    }

    /// Receives up to `iovs.len()` frames (at most [`RECV_BATCH`]) with one `recvmmsg(2)`
    /// and `MSG_TRUNC`, each into its iovec; their whole lengths go to `lens`.
    ///
    /// # Safety
    ///
    /// Each iovec must name memory valid for writes of its length for the whole call.
    unsafe fn recv_each(&self, iovs: &mut [libc::iovec], lens: &mut [usize]) -> io::Result<usize> {
        let n = iovs.len().min(lens.len()).min(RECV_BATCH);
        // SAFETY: mmsghdr is plain old data; all-zero is valid before the fields are set.
        let mut msgs: [libc::mmsghdr; RECV_BATCH] = unsafe { std::mem::zeroed() };
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()).take(n) {
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the first `n` entries of `msgs` point at `iovs`, unmoved for the call, each
        // naming writable memory (the caller's promise); the kernel fills at most `n`.
        let got = unsafe { self.recvmmsg(&mut msgs[..n]) }?;
        for (len, m) in lens.iter_mut().zip(&msgs).take(got) {
            *len = m.msg_len as usize;
        }
        Ok(got)
    }

    /// Sends one frame (virtio-net header first).
    pub fn send(&self, frame: &[u8]) -> io::Result<usize> {
        write(&self.fd, frame)
    }

    /// Sends one frame made of `head` (private) and `rest` (in shared memory), with one
    /// `writev(2)`.
    pub fn send_parts(
        &self,
        head: &[u8],
        rest: &splitnet_messaging::memory::SharedBytes<'_>,
    ) -> io::Result<usize> {
        super::write_parts(self.fd.as_fd(), head, rest)
    }

    /// Sends up to [`SEND_BATCH`] frames with one `sendmmsg(2)`, in order. Returns how many
    /// the kernel took, from the first: fewer than given when one failed after the first
    /// (the next call reports its error); an error when the first failed.
    pub fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let n = frames.len().min(SEND_BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: iovec and mmsghdr are plain old data; all-zero is valid before the fields
        // are set (no address: the socket is bound to its interface).
        let mut iovs: [libc::iovec; SEND_BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; SEND_BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            iovs[i] = libc::iovec {
                iov_base: frames[i].as_ptr().cast_mut().cast(),
                iov_len: frames[i].len(),
            };
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the first `n` entries of `msgs` point at `iovs`, each naming a frame of
        // `frames`, valid for reads and unmoved for the whole call; the kernel only reads
        // them and writes `msg_len` of the entries it sent.
        let sent = cvt(unsafe {
            libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), n as libc::c_uint, 0)
        })?;
        Ok((sent as usize).min(n))
    }
}

/// A packet socket's second descriptor, whose receive filter it sets from any thread.
#[derive(Debug)]
pub struct FilterHandle(OwnedFd);

impl FilterHandle {
    /// Replaces the socket's receive filter (see [`super::filter`]): frames already queued
    /// stay, frames that arrive from now on pass the new one.
    pub fn set(&self, prog: &[Insn]) -> io::Result<()> {
        set_filter(&self.0, prog)
    }
}

/// `prog` as the kernel takes it.
fn fprog(prog: &[Insn]) -> io::Result<libc::sock_fprog> {
    Ok(libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: prog.as_ptr().cast_mut(),
    })
}

/// Sets socket `fd`'s receive filter (`SO_ATTACH_FILTER`; the kernel copies the program).
fn set_filter(fd: &OwnedFd, prog: &[Insn]) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog(prog)?)
}

/// Puts back the VLAN tag the kernel reported beside the `n`-byte frame in `buf` (see
/// [`PacketSocket::recv`]); returns the frame's length.
fn restore_tag(buf: &mut [u8], n: usize, msg: &libc::msghdr) -> usize {
    put_tag(buf, n, auxdata(msg))
}

/// Puts back the VLAN tag `aux` reports beside the `n`-byte frame in `buf`; returns the
/// frame's length.
fn put_tag(buf: &mut [u8], n: usize, aux: Option<AuxData>) -> usize {
    let Some(aux) = aux else {
        return n;
    };
    if aux.tp_status & TP_STATUS_VLAN_VALID == 0 {
        return n;
    }
    let tpid = if aux.tp_status & TP_STATUS_VLAN_TPID_VALID != 0 {
        aux.tp_vlan_tpid
    } else {
        ETH_P_8021Q
    };
    // A frame too short for its MAC addresses or offsets the tag would overflow: as
    // received (the checks downstream refuse what is not a frame).
    insert_vlan(buf, n, tpid, aux.tp_vlan_tci).unwrap_or(n)
}

/// How many frames of the socket's queue a read that gave `read` took off it: the frames
/// it gave; after an error, one when the error was the frame's own (`EINVAL`: the kernel
/// could not describe it with a virtio-net header, and freed it; a later frame's is
/// reported at the next call, which then takes nothing), else none (an error the socket
/// held, as `ENETDOWN`).
fn consumed_by(read: &io::Result<usize>) -> usize {
    match read {
        Ok(n) => *n,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => 1,
        Err(_) => 0,
    }
}

/// Copies the whole frame of `slot` (`s` its header, not [`Slot::cut`]) into `buf` as
/// [`PacketSocket::recv`] gives it, the VLAN tag the kernel took out put back; returns its
/// length, beyond `buf`'s when it does not fit.
fn take_slot(slot: &[u8], s: &Slot, buf: &mut [u8]) -> usize {
    let room = buf.len().saturating_sub(VLAN_TAG_LEN);
    let data = &slot[s.data.clone()];
    if data.len() > room {
        return s.whole.max(buf.len() + 1);
    }
    buf[..data.len()].copy_from_slice(data);
    let aux = s.tag.map(|(tpid, tci)| AuxData {
        tp_status: TP_STATUS_VLAN_VALID | tpid.map_or(0, |_| TP_STATUS_VLAN_TPID_VALID),
        tp_vlan_tci: tci,
        tp_vlan_tpid: tpid.unwrap_or(0),
        ..AuxData::default()
    });
    put_tag(buf, data.len(), aux)
}

/// Finishes a frame of `n` bytes that the kernel wrote around the gap after its MAC
/// addresses in `dst` ([`PacketSocket::recv_batch_tagged_into`]): the tag `aux` reports
/// goes into the gap and the header's offsets count it. Returns the tagged frame's length;
/// `None` when the frame has no tag to put back (or is too short to have come with one),
/// when the offsets would overflow with it, or when the memory cannot be written.
fn place_tag(dst: &SharedBytes<'_>, n: usize, aux: Option<AuxData>) -> Option<usize> {
    let a = aux.filter(|a| a.tp_status & TP_STATUS_VLAN_VALID != 0)?;
    if n < VLAN_TAG_AT {
        return None;
    }
    let mut hdr = [0u8; VNET_HDR_LEN];
    dst.copy_out(0, &mut hdr).ok()?;
    let hdr = tagged_header(&hdr)?;
    let tpid = if a.tp_status & TP_STATUS_VLAN_TPID_VALID != 0 {
        a.tp_vlan_tpid
    } else {
        ETH_P_8021Q
    };
    dst.copy_in(0, &hdr).ok()?;
    dst.copy_in(VLAN_TAG_AT, &tag_bytes(tpid, a.tp_vlan_tci))
        .ok()?;
    Some(n + VLAN_TAG_LEN)
}

/// The `PACKET_AUXDATA` control message of a received `msg`, if the kernel sent one.
fn auxdata(msg: &libc::msghdr) -> Option<AuxData> {
    // SAFETY: the CMSG_* macros walk the control buffer `msg` describes, which recvmsg
    // filled and which lives as long as `msg`; each header is checked for the level, type
    // and a length covering the payload before its data is read (unaligned, by copy).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            let want = libc::CMSG_LEN(std::mem::size_of::<AuxData>() as u32) as usize;
            if (*c).cmsg_level == libc::SOL_PACKET
                && (*c).cmsg_type == PACKET_AUXDATA
                && (*c).cmsg_len as usize >= want
            {
                return Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(c).cast::<AuxData>(),
                ));
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::filter::{all_but, only_to, Tagged};
    use splitnet_messaging::memory::HeapShared;
    use splitnet_messaging::memory::SharedBytes;
    use splitnet_messaging::vnet::VNET_HDR_LEN;

    /// Moves this test's thread into a network namespace of its own with its loopback up.
    /// Needs root (CAP_SYS_ADMIN); without it the test fails, saying so: the tests that call
    /// this are `#[ignore = "needs root"]`, in [`needs_root`], and `tests/run-all.sh` runs
    /// them as root.
    pub(crate) fn own_namespace() {
        // SAFETY: geteuid(2) has no preconditions.
        let euid = unsafe { libc::geteuid() };
        // SAFETY: unshare(2) changes only the calling thread's namespaces.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            r,
            0,
            "needs root (CAP_SYS_ADMIN) for a network namespace of its own (euid {euid}): unshare: {}",
            io::Error::last_os_error()
        );
        netdev::set_up("lo").unwrap();
    }

    /// A frame to `dst` with a virtio-net header and, if `vlan`, an 802.1Q tag.
    pub(crate) fn frame(dst: [u8; 6], vlan: Option<u16>, fill: u8) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR_LEN];
        f.extend_from_slice(&dst);
        f.extend_from_slice(&[2, 0, 0, 0, 0, 0x99]);
        if let Some(tci) = vlan {
            f.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
            f.extend_from_slice(&tci.to_be_bytes());
        }
        f.extend_from_slice(&[0x88, 0xb5]);
        f.extend_from_slice(&[fill; 60]);
        f
    }

    /// The next `n` frames `s` receives (loopback delivers them from a softirq, which may
    /// run late), then what else it holds; fewer if they do not come within 5 s.
    fn drain(s: &PacketSocket, n: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 2048];
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match s.recv(&mut buf) {
                Ok(len) => out.push(buf[..len].to_vec()),
                Err(_) if out.len() >= n || std::time::Instant::now() > until => return out,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
    }

    /// Waits (up to 5 s) until `s` holds a frame.
    pub(crate) fn wait_readable(s: impl AsFd) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !crate::readable_now(s.as_fd()).unwrap() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The aux data of a frame the kernel took a tag out of (`tpid` when it says which).
    fn aux(tci: u16, tpid: Option<u16>) -> Option<AuxData> {
        let mut a = AuxData {
            tp_status: TP_STATUS_VLAN_VALID,
            tp_vlan_tci: tci,
            ..AuxData::default()
        };
        if let Some(t) = tpid {
            a.tp_status |= TP_STATUS_VLAN_TPID_VALID;
            a.tp_vlan_tpid = t;
        }
        Some(a)
    }

    /// Issue 41: the tag goes into the gap and the header's offsets move past it; a frame
    /// without a tag, too short for one, or whose offsets would overflow is refused, its
    /// memory left as it was.
    #[test]
    fn place_tag_fills_the_gap_or_refuses() {
        let mem = HeapShared::new(256);
        let dst = SharedBytes::new(&mem, 0, 256).unwrap();
        // A frame needing its checksum (start 34, offset 16) and segmented (hdr_len 54).
        let mut hdr = [0u8; VNET_HDR_LEN];
        hdr[0] = 1;
        hdr[1] = 1;
        hdr[2..4].copy_from_slice(&54u16.to_le_bytes());
        hdr[4..6].copy_from_slice(&1400u16.to_le_bytes());
        hdr[6..8].copy_from_slice(&34u16.to_le_bytes());
        hdr[8..10].copy_from_slice(&16u16.to_le_bytes());
        let put = |h: &[u8; VNET_HDR_LEN]| {
            dst.copy_in(0, h).unwrap();
            dst.copy_in(VNET_HDR_LEN, &[7; 12]).unwrap();
            dst.copy_in(VLAN_TAG_AT + VLAN_TAG_LEN, &[9; 60]).unwrap();
        };
        let n = VLAN_TAG_AT + 60;
        put(&hdr);
        assert_eq!(place_tag(&dst, n, aux(0xa00a, Some(0x88a8))), Some(n + 4));
        let mut got = vec![0u8; n + 4];
        dst.copy_out(0, &mut got).unwrap();
        assert_eq!(&got[2..4], &58u16.to_le_bytes(), "hdr_len counts the tag");
        assert_eq!(
            &got[6..8],
            &38u16.to_le_bytes(),
            "csum_start counts the tag"
        );
        assert_eq!(
            &got[8..10],
            &16u16.to_le_bytes(),
            "csum_offset is the L4 header's own"
        );
        assert_eq!(
            &got[VLAN_TAG_AT..VLAN_TAG_AT + 4],
            &[0x88, 0xa8, 0xa0, 0x0a]
        );
        assert_eq!(&got[VLAN_TAG_AT + 4..], &[9; 60][..]);
        put(&hdr);
        assert_eq!(place_tag(&dst, n, aux(5, None)), Some(n + 4));
        dst.copy_out(0, &mut got).unwrap();
        assert_eq!(
            &got[VLAN_TAG_AT..VLAN_TAG_AT + 4],
            &[0x81, 0x00, 0, 5],
            "802.1Q when unsaid"
        );
        // Refused, nothing written.
        put(&hdr);
        let before = {
            let mut b = vec![0u8; n + 4];
            dst.copy_out(0, &mut b).unwrap();
            b
        };
        assert_eq!(place_tag(&dst, n, None), None, "no aux data");
        assert_eq!(place_tag(&dst, n, Some(AuxData::default())), None, "no tag");
        assert_eq!(
            place_tag(&dst, VLAN_TAG_AT - 1, aux(5, None)),
            None,
            "too short"
        );
        let mut huge = hdr;
        huge[6..8].copy_from_slice(&65533u16.to_le_bytes());
        dst.copy_in(0, &huge).unwrap();
        assert_eq!(
            place_tag(&dst, n, aux(5, None)),
            None,
            "csum_start would overflow"
        );
        dst.copy_in(0, &hdr).unwrap();
        let mut after = vec![0u8; n + 4];
        dst.copy_out(0, &mut after).unwrap();
        assert_eq!(after, before);
    }

    /// The tests that need root (a network namespace of their own): ignored in a plain
    /// `cargo test`; `tests/run-all.sh` runs every test in a module named `needs_root` as
    /// root (`--ignored needs_root::`), and fails if one cannot get what it needs.
    mod needs_root {
        use super::*;

        /// Issue 30: the receive ring is the size asked for whatever net.core.rmem_max says,
        /// since the IOC (root here) may force it: twice rmem_max is granted whole.
        #[test]
        #[ignore = "needs root"]
        fn the_receive_ring_is_forced_past_rmem_max() {
            own_namespace();
            let max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let s = PacketSocket::open("lo").unwrap();
            assert_eq!(s.rcvbuf().unwrap(), RCVBUF as usize);
            let more = libc::c_int::try_from(max * 2).unwrap();
            set_rcvbuf(&s.fd, more);
            assert_eq!(s.rcvbuf().unwrap(), max * 2, "past rmem_max ({max})");
        }

        /// Issue 30: a frame longer than its buffer is never taken for a whole one: its length
        /// comes back beyond the buffer's, and the next frame is read whole.
        #[test]
        #[ignore = "needs root"]
        fn a_frame_too_long_for_its_buffer_says_so() {
            own_namespace();
            let s = PacketSocket::open("lo").unwrap();
            let mut long = frame([2, 0, 0, 0, 0, 1], None, 1);
            long.resize(1000, 7);
            let short = frame([2, 0, 0, 0, 0, 1], None, 2);
            s.send(&long).unwrap();
            s.send(&short).unwrap();
            let (mut a, mut b) = ([0u8; 200], [0u8; 200]);
            let mut lens = [0usize; 2];
            let mut got = 0;
            let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while got < 2 && std::time::Instant::now() < until {
                let mut bufs: [&mut [u8]; 2] = [&mut a, &mut b];
                let (done, rest) = lens.split_at_mut(got);
                let _ = done;
                match s.recv_batch(&mut bufs[got..], rest) {
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(got, 2);
            assert_eq!(lens[0], 1000, "the cut frame's whole length");
            assert_eq!(lens[1], short.len());
            assert_eq!(&b[..short.len()], &short[..]);
        }

        /// Issue 43: through the mapped ring, frames that fit a slot and longer ones (read from
        /// the socket's queue) arrive in the order sent and as sent, tags put back; a frame too
        /// long for its buffer says so; a full ring drops and counts what it drops.
        #[test]
        #[ignore = "needs root"]
        fn the_mapped_ring_gives_every_frame_in_order() {
            own_namespace();
            let tx = PacketSocket::open("lo").unwrap();
            let rx = PacketSocket::open_ring("lo").unwrap();
            assert!(rx.has_ring());
            let dst = [2, 0, 0, 0, 0, 1];
            let long = |fill: u8, len: usize| {
                let mut f = frame(dst, None, fill);
                f.resize(len, fill);
                f
            };
            let sent = [
                frame(dst, None, 1),
                long(2, 3000),
                frame(dst, Some(0x2005), 3),
                long(4, 9000),
                long(5, 1500),
                long(6, rx_ring::SLOT),
                frame(dst, None, 7),
            ];
            for f in &sent {
                tx.send(f).unwrap();
            }
            let mut bufs = vec![vec![0u8; 10_000]; sent.len()];
            let mut lens = vec![0usize; sent.len()];
            let mut got = 0;
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while got < sent.len() && std::time::Instant::now() < until {
                wait_readable(&rx);
                let mut refs: Vec<&mut [u8]> =
                    bufs[got..].iter_mut().map(|b| b.as_mut_slice()).collect();
                match rx.recv_batch(&mut refs, &mut lens[got..]) {
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(got, sent.len());
            for (i, f) in sent.iter().enumerate() {
                assert_eq!(&bufs[i][..lens[i]], &f[..], "frame {i}");
            }
            assert_eq!(
                rx.take_ring_frames(),
                4,
                "those up to 1,500 bytes from their slots"
            );
            assert_eq!(tx.take_ring_frames(), 0, "no ring");
            // Cut: its whole length, beyond the buffer's; the next one whole.
            tx.send(&long(8, 1200)).unwrap();
            tx.send(&frame(dst, None, 9)).unwrap();
            let (mut a, mut b) = ([0u8; 300], [0u8; 300]);
            let mut lens = [0usize; 2];
            let mut got = 0;
            while got < 2 && std::time::Instant::now() < until {
                wait_readable(&rx);
                let mut bufs: [&mut [u8]; 2] = [&mut a, &mut b];
                got += rx
                    .recv_batch(&mut bufs[got..], &mut lens[got..])
                    .unwrap_or(0);
            }
            assert_eq!(lens, [1200, frame(dst, None, 9).len()]);
            // A full ring: what does not fit is dropped and counted, the rest read in order.
            assert_eq!(rx.take_drops().unwrap(), 0);
            let more = rx_ring::SLOTS + 100;
            for i in 0..more {
                tx.send(&frame(dst, None, i as u8)).unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            let mut buf = [0u8; 200];
            let mut read = Vec::new();
            while let Ok(n) = rx.recv(&mut buf) {
                read.push(buf[n - 1]);
            }
            let drops = rx.take_drops().unwrap() as usize;
            assert_eq!(read.len(), rx_ring::SLOTS, "the ring's slots, then drops");
            assert_eq!(drops, more - read.len());
            assert!(read.iter().enumerate().all(|(i, &b)| b == i as u8));
            // Discarding releases slots (and queued frames) and the ring fills again.
            tx.send(&long(1, 4000)).unwrap();
            tx.send(&frame(dst, None, 2)).unwrap();
            tx.send(&frame(dst, None, 3)).unwrap();
            wait_readable(&rx);
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(rx.discard().unwrap(), 3);
            assert_eq!(rx.discard().unwrap_err().kind(), io::ErrorKind::WouldBlock);
            tx.send(&long(4, 5000)).unwrap();
            wait_readable(&rx);
            let mut big = vec![0u8; 6000];
            assert_eq!(
                rx.recv(&mut big).unwrap(),
                5000,
                "the queue held only this one"
            );
            // An error the socket holds (the link went down) takes no frame off the queue:
            // the long frame and its slot come at the next call, in step.
            let down = std::process::Command::new("ip")
                .args(["link", "set", "lo", "down"])
                .status()
                .unwrap();
            assert!(down.success());
            netdev::set_up("lo").unwrap();
            // The sender holds the error too, and reports it at its next send.
            let e = tx.send(&long(5, 3000)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NetworkDown, "{e}");
            tx.send(&long(5, 3000)).unwrap();
            tx.send(&frame(dst, None, 6)).unwrap();
            wait_readable(&rx);
            std::thread::sleep(std::time::Duration::from_millis(50));
            let (mut a, mut b) = (vec![0u8; 4000], vec![0u8; 4000]);
            let mut lens = [0usize; 2];
            let e = rx.recv_batch(&mut [&mut a, &mut b], &mut lens).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NetworkDown, "{e}");
            assert_eq!(rx.recv_batch(&mut [&mut a, &mut b], &mut lens).unwrap(), 2);
            assert_eq!(
                (&a[..lens[0]], &b[..lens[1]]),
                (&long(5, 3000)[..], &frame(dst, None, 6)[..])
            );
            // A long frame the full buffer cannot queue whole is cut into its slot: lost,
            // and counted as the buffer's drop, never handed over cut.
            assert_eq!(rx.take_drops().unwrap(), 0);
            set_rcvbuf(&rx.fd, 1);
            for fill in 7..10 {
                tx.send(&long(fill, 3000)).unwrap();
            }
            tx.send(&frame(dst, None, 10)).unwrap();
            wait_readable(&rx);
            std::thread::sleep(std::time::Duration::from_millis(50));
            let mut got = Vec::new();
            while let Ok(n) = rx.recv(&mut big) {
                got.push((n, big[n - 1]));
            }
            let cut = rx.take_drops().unwrap();
            assert!(cut >= 1, "the buffer held {got:?}");
            assert_eq!(
                got.len() as u64 + cut,
                4,
                "every frame read or counted: {got:?}"
            );
            assert_eq!(got.last(), Some(&(frame(dst, None, 10).len(), 10)));
            assert!(got
                .iter()
                .all(|&(n, _)| n == 3000 || n == frame(dst, None, 10).len()));
        }

        /// The kernel sorts a NIC's frames between a host's own socket and the general one, as
        /// the filters say: each frame arrives once, a tagged one on the general socket with its
        /// tag put back, and a host's socket writes its frames straight into shared memory.
        #[test]
        #[ignore = "needs root"]
        fn the_kernel_sorts_frames_between_a_hosts_socket_and_the_general_one() {
            own_namespace();
            let (mine, other) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
            let general = PacketSocket::open("lo").unwrap();
            general
                .filter_handle()
                .unwrap()
                .set(&all_but(&[(mine, Tagged::untagged())]))
                .unwrap();
            let host = general
                .open_sibling(&only_to(&mine, &Tagged::untagged()))
                .unwrap();
            let sent = [
                frame(mine, None, 1),
                frame(other, None, 2),
                frame(mine, Some(7), 3),
                frame([0xff; 6], None, 4),
                frame(mine, None, 5),
            ];
            for f in &sent {
                general.send(f).unwrap();
            }
            let got = drain(&general, 3);
            assert_eq!(got, vec![sent[1].clone(), sent[2].clone(), sent[3].clone()]);
            let mem = HeapShared::new(4096);
            let dst = SharedBytes::new(&mem, 3, 1000).unwrap();
            for want in [&sent[0], &sent[4]] {
                wait_readable(&host);
                assert_eq!(host.recv_into(&dst).unwrap(), want.len());
                let mut back = vec![0u8; want.len()];
                dst.copy_out(0, &mut back).unwrap();
                assert_eq!(&back, want);
            }
            assert_eq!(
                host.recv_into(&dst).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
            // A frame longer than the room says its whole length.
            general.send(&frame(mine, None, 6)).unwrap();
            let small = SharedBytes::new(&mem, 0, 20).unwrap();
            wait_readable(&host);
            assert_eq!(host.recv_into(&small).unwrap(), sent[0].len());
            // Several frames with one call, the cut one saying its whole length.
            let windows = [
                SharedBytes::new(&mem, 0, 1000).unwrap(),
                SharedBytes::new(&mem, 1000, 20).unwrap(),
                SharedBytes::new(&mem, 2000, 1000).unwrap(),
            ];
            for f in [&sent[0], &sent[4]] {
                general.send(f).unwrap();
            }
            let mut lens = [0usize; 3];
            let mut got = 0;
            while got < 2 {
                wait_readable(&host);
                got += host
                    .recv_batch_into(&windows[got..], &mut lens[got..])
                    .unwrap();
            }
            assert_eq!(lens, [sent[0].len(), sent[4].len(), 0]);
            let mut back = vec![0u8; sent[0].len()];
            windows[0].copy_out(0, &mut back).unwrap();
            assert_eq!(back, sent[0]);
            // Shut, the host's socket takes nothing more; what it held is discarded.
            general.send(&sent[4]).unwrap();
            wait_readable(&host);
            host.set_filter(&crate::filter::nothing()).unwrap();
            general.send(&sent[0]).unwrap();
            // With the exclusion lifted, the general socket takes the host's frames again.
            general.filter_handle().unwrap().set(&all_but(&[])).unwrap();
            general.send(&sent[0]).unwrap();
            assert_eq!(drain(&general, 1), vec![sent[0].clone()]);
            assert_eq!(host.discard().unwrap(), 1);
            assert_eq!(
                host.discard().unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
            assert_eq!(host.take_drops().unwrap(), 0);
        }

        /// Issue 41: a trunk host's socket takes its VLANs' frames, and reads each straight
        /// into shared memory as it was on the wire, the tag the kernel took out back in its
        /// place (of either TPID), the frame never moved; one too long says its whole length
        /// with the tag; one that came untagged is refused.
        #[test]
        #[ignore = "needs root"]
        fn a_trunk_hosts_socket_reads_its_tagged_frames_whole_into_shared_memory() {
            own_namespace();
            let mine = [2, 0, 0, 0, 0, 1];
            let trunk = Tagged::of(false, [7, 8, 9, 100]).unwrap();
            let general = PacketSocket::open("lo").unwrap();
            general
                .filter_handle()
                .unwrap()
                .set(&all_but(&[(mine, trunk.clone())]))
                .unwrap();
            let host = general.open_sibling(&only_to(&mine, &trunk)).unwrap();
            let mut qinq = frame(mine, Some(100), 3);
            qinq[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14].copy_from_slice(&[0x88, 0xa8]);
            let sent = [
                frame(mine, Some(7), 1),
                frame(mine, Some(0x2000 | 9), 2),
                qinq,
                frame(mine, Some(10), 4),
                frame(mine, None, 5),
            ];
            for f in &sent {
                general.send(f).unwrap();
            }
            assert_eq!(drain(&general, 2), vec![sent[3].clone(), sent[4].clone()]);
            let mem = HeapShared::new(8192);
            let windows: Vec<_> = (0..3)
                .map(|i| SharedBytes::new(&mem, i * 2000, 1000).unwrap())
                .collect();
            let mut lens = [0usize; 3];
            let mut got = 0;
            while got < 3 {
                wait_readable(&host);
                got += host
                    .recv_batch_tagged_into(&windows[got..], &mut lens[got..])
                    .unwrap();
            }
            for (i, w) in windows.iter().enumerate() {
                assert_eq!(lens[i], sent[i].len());
                let mut back = vec![0u8; lens[i]];
                w.copy_out(0, &mut back).unwrap();
                assert_eq!(back, sent[i], "frame {i}");
            }
            // Too long for its range: its whole length, with the tag.
            general.send(&sent[0]).unwrap();
            let small = [SharedBytes::new(&mem, 0, 40).unwrap()];
            wait_readable(&host);
            host.recv_batch_tagged_into(&small, &mut lens[..1]).unwrap();
            assert_eq!(lens[0], sent[0].len());
            // An untagged frame read this way is refused (length 0): without a tag it would
            // reach a trunk host on a VLAN that is not its own.
            let plain = general
                .open_sibling(&only_to(&mine, &Tagged::untagged()))
                .unwrap();
            general.send(&frame(mine, None, 6)).unwrap();
            wait_readable(&plain);
            assert_eq!(
                plain
                    .recv_batch_tagged_into(&windows[..1], &mut lens[..1])
                    .unwrap(),
                1
            );
            assert_eq!(lens[0], 0);
        }
    }
}
