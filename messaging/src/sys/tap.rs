//! A TAP device with a virtio-net header in front of every frame.

use super::netdev::ifreq;
use super::{cvt, read, write};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const TUNSETCARRIER: libc::c_ulong = 0x4004_54e2;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// Bytes of the virtio-net header in front of every frame.
pub const VNET_HDR_LEN: usize = 10;

/// Offloads the kernel accepted on the TAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offloads {
    /// Partial checksums.
    pub csum: bool,
    /// TCP segmentation (v4 and v6, with ECN).
    pub tso: bool,
    /// UDP segmentation.
    pub uso: bool,
}

/// An open TAP interface (non-blocking). Closing it removes the interface.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
}

impl Tap {
    /// Creates (or attaches to) TAP `name` with a 10-byte virtio-net header on every frame.
    pub fn open(name: &str) -> io::Result<Tap> {
        Tap::open_with(name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
    }

    /// Creates multi-queue TAP `name` with `queues` queues (at least 1), each its own
    /// descriptor: the kernel spreads the frames it sends over the queues by flow, and
    /// frames written to any queue enter its stack. One queue opens a plain TAP.
    pub fn open_queues(name: &str, queues: usize) -> io::Result<Vec<Tap>> {
        if queues <= 1 {
            return Ok(vec![Tap::open(name)?]);
        }
        let flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE;
        let first = Tap::open_with(name, flags)?;
        let mut taps = Vec::with_capacity(queues);
        // The first queue may have been given a kernel-chosen name; the others attach to it.
        let name = first.name.clone();
        taps.push(first);
        for _ in 1..queues {
            taps.push(Tap::open_with(&name, flags)?);
        }
        Ok(taps)
    }

    fn open_with(name: &str, flags: libc::c_short) -> io::Result<Tap> {
        let path = c"/dev/net/tun";
        // SAFETY: `path` is NUL-terminated; the result is checked before it is owned.
        let raw = cvt(unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `raw` was just returned by open(2) and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = ifreq(name)?;
        req.ifr_ifru.ifru_flags = flags;
        // SAFETY: TUNSETIFF reads and writes the ifreq, valid for the call.
        cvt(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req as *mut libc::ifreq) })?;
        let hdr: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, valid for the call.
        cvt(unsafe {
            libc::ioctl(
                fd.as_raw_fd(),
                TUNSETVNETHDRSZ as _,
                &hdr as *const libc::c_int,
            )
        })?;
        let name = req
            .ifr_name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect();
        Ok(Tap { fd, name })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn set_offload(&self, flags: libc::c_uint) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        cvt(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                TUNSETOFFLOAD as _,
                flags as libc::c_ulong,
            )
        })?;
        Ok(())
    }

    /// Enables checksum and segmentation offloads (USO where the kernel has it), or none.
    pub fn enable_offloads(&self, on: bool) -> io::Result<Offloads> {
        if !on {
            self.set_offload(0)?;
            return Ok(Offloads::default());
        }
        let tso = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
        if self.set_offload(tso | TUN_F_USO4 | TUN_F_USO6).is_ok() {
            return Ok(Offloads {
                csum: true,
                tso: true,
                uso: true,
            });
        }
        self.set_offload(tso)?;
        Ok(Offloads {
            csum: true,
            tso: true,
            uso: false,
        })
    }

    /// Sets the carrier: applications see NO-CARRIER while it is off.
    pub fn set_carrier(&self, on: bool) -> io::Result<()> {
        let v: libc::c_int = on.into();
        // SAFETY: TUNSETCARRIER reads one int through the pointer, valid for the call.
        cvt(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                TUNSETCARRIER as _,
                &v as *const libc::c_int,
            )
        })?;
        Ok(())
    }

    /// Reads one frame (virtio-net header first).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        read(&self.fd, buf)
    }

    /// Writes one frame (virtio-net header first).
    pub fn send(&self, frame: &[u8]) -> io::Result<usize> {
        write(&self.fd, frame)
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
