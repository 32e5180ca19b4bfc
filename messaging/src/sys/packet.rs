//! An `AF_PACKET` socket owning a NIC, with a virtio-net header on every frame.

use super::{cvt, netdev, read, write};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const PACKET_ADD_MEMBERSHIP: libc::c_int = 1;
const PACKET_DROP_MEMBERSHIP: libc::c_int = 2;
const PACKET_MR_MULTICAST: libc::c_ushort = 0;
const PACKET_MR_PROMISC: libc::c_ushort = 1;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const ETH_P_ALL: u16 = 0x0003;

/// A raw packet socket bound to one interface (non-blocking).
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
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

impl PacketSocket {
    /// Opens a socket on `ifname` receiving every frame but its own, with virtio-net headers
    /// in both directions.
    pub fn open(ifname: &str) -> io::Result<PacketSocket> {
        let ifindex = netdev::index(ifname)?;
        let proto = ETH_P_ALL.to_be();
        // SAFETY: plain socket(2) call; the result is checked before it is owned.
        let raw = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::c_int::from(proto),
            )
        })?;
        // SAFETY: `raw` was just returned by socket(2) and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        setsockopt(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, &one)?;
        // Our own transmissions must not come back as receptions (Linux >= 4.20).
        setsockopt(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &one)?;
        let buf: libc::c_int = 4 << 20;
        let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &buf);
        let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &buf);
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
        Ok(PacketSocket { fd, ifindex })
    }

    /// Puts the NIC in promiscuous mode for as long as the socket is open.
    pub fn set_promiscuous(&self) -> io::Result<()> {
        let mreq = libc::packet_mreq {
            mr_ifindex: self.ifindex as libc::c_int,
            mr_type: PACKET_MR_PROMISC,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        setsockopt(&self.fd, libc::SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mreq)
    }

    /// Joins (`join`) or leaves a link-layer multicast group on the NIC: the group enters or
    /// leaves the NIC's multicast filter (`ip maddr show`) for as long as the socket is open.
    /// The kernel counts joins, so each join needs exactly one leave.
    pub fn set_multicast(&self, group: [u8; 6], join: bool) -> io::Result<()> {
        let mut mr_address = [0u8; 8];
        mr_address[..6].copy_from_slice(&group);
        let mreq = libc::packet_mreq {
            mr_ifindex: self.ifindex as libc::c_int,
            mr_type: PACKET_MR_MULTICAST,
            mr_alen: 6,
            mr_address,
        };
        let op = if join {
            PACKET_ADD_MEMBERSHIP
        } else {
            PACKET_DROP_MEMBERSHIP
        };
        setsockopt(&self.fd, libc::SOL_PACKET, op, &mreq)
    }

    /// Receives one frame (virtio-net header first).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        read(&self.fd, buf)
    }

    /// Sends one frame (virtio-net header first).
    pub fn send(&self, frame: &[u8]) -> io::Result<usize> {
        write(&self.fd, frame)
    }
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
