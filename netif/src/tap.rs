//! A TAP device with a virtio-net header in front of every frame.
//!
//! The interface can be made persistent ([`Tap::set_persist`]): it then outlives the process
//! (the kernel turns its carrier off when the last descriptor closes), keeps its addresses,
//! routes, MAC and MTU, and the next [`Tap::open_queues`] re-attaches to it.

use super::netdev::{self, ifreq};
use super::{cvt, read, write};
use splitnet_messaging::memory::SharedBytes;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
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

/// An open TAP interface (non-blocking). Closing the last descriptor removes the
/// interface unless it is persistent ([`Tap::set_persist`]).
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
    reattached: bool,
}

impl Tap {
    /// Creates (or attaches to) TAP `name` with a 10-byte virtio-net header on every frame.
    pub fn open(name: &str) -> io::Result<Tap> {
        Tap::open_with(name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
    }

    /// Creates multi-queue TAP `name` with `queues` queues (at least 1), each its own
    /// descriptor: the kernel spreads the frames it sends over the queues by flow, and
    /// frames written to any queue enter its stack. One queue opens a plain TAP.
    ///
    /// An existing interface `name` (a persistent TAP that no process serves) is
    /// re-attached, as it is: a multi-queue one also with one queue. A single-queue one
    /// cannot take more queues, a TAP in use is busy, and any other kind of interface is
    /// refused; each error says which.
    pub fn open_queues(name: &str, queues: usize) -> io::Result<Vec<Tap>> {
        let existed = netdev::index(name).is_ok();
        let plain = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
        let mq = plain | IFF_MULTI_QUEUE;
        let first = match Tap::open_with(name, if queues <= 1 { plain } else { mq }) {
            Err(e) if existed && e.raw_os_error() == Some(libc::EINVAL) => {
                return match (queues <= 1).then(|| Tap::open_with(name, mq)) {
                    Some(Ok(t)) => Ok(vec![t]),
                    _ => Err(existing_refused(name, queues)),
                }
            }
            Err(e) if existed && e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{name} exists and another process serves it (another host-driver?)"),
                ))
            }
            r => r?,
        };
        if queues <= 1 {
            return Ok(vec![first]);
        }
        let flags = mq;
        let mut taps = Vec::with_capacity(queues);
        // The first queue may have been given a kernel-chosen name; the others attach to it.
        let name = first.name.clone();
        taps.push(first);
        for _ in 1..queues {
            taps.push(Tap::open_with(&name, flags)?);
        }
        Ok(taps)
    }

    /// Creates multi-queue TAP `name`, or attaches one more queue to it: a port of the
    /// IOC (`lan.mode = "ports"`), one descriptor per host queue, made persistent so that it
    /// outlives them (the kernel then turns its carrier on while a queue is attached, off
    /// while none is).
    pub fn attach_queue(name: &str) -> io::Result<Tap> {
        Tap::open_with(name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::EINVAL) if netdev::index(name).is_ok() => existing_refused(name, 2),
                _ => io::Error::new(e.kind(), format!("TAP {name}: {e}")),
            }
        })
    }

    fn open_with(name: &str, flags: libc::c_short) -> io::Result<Tap> {
        let existed = netdev::index(name).is_ok();
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
        let name: String = req
            .ifr_name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect();
        let reattached = existed;
        Ok(Tap {
            fd,
            name,
            reattached,
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when the interface existed before this descriptor attached to it (a persistent
    /// TAP left by an earlier process), false when opening it made it.
    pub fn reattached(&self) -> bool {
        self.reattached
    }

    /// Makes the interface persistent (`on`): it then outlives every descriptor, carrier
    /// off while none is open, with its addresses, routes, MAC and MTU. Off: it goes away
    /// when the last descriptor closes.
    pub fn set_persist(&self, on: bool) -> io::Result<()> {
        // SAFETY: TUNSETPERSIST takes its argument by value.
        cvt(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                TUNSETPERSIST as _,
                libc::c_ulong::from(on),
            )
        })?;
        Ok(())
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

    /// Reads one frame (virtio-net header first) straight into `dst`, in memory shared with
    /// the IOC.
    pub fn recv_into(&self, dst: &SharedBytes<'_>) -> io::Result<usize> {
        super::read_into(self.fd.as_fd(), dst)
    }

    /// Writes one frame whose first bytes are `head` (a private copy, the virtio-net
    /// header first) and the rest `tail`, in memory shared with the IOC.
    pub fn send_parts(&self, head: &[u8], tail: &SharedBytes<'_>) -> io::Result<usize> {
        super::write_parts(self.fd.as_fd(), head, tail)
    }

    /// Whether a frame waits to be read, without reading it.
    pub fn readable_now(&self) -> io::Result<bool> {
        super::readable_now(self.fd.as_fd())
    }
}

/// Why an existing interface `name` cannot serve `queues` queues.
fn existing_refused(name: &str, queues: usize) -> io::Error {
    let flags = std::fs::read_to_string(format!("/sys/class/net/{name}/tun_flags")).ok();
    let tap_flags = flags
        .as_deref()
        .and_then(|f| i64::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok());
    let why = match tap_flags {
        Some(f) if f & i64::from(IFF_TAP) == 0 => "is a TUN, not a TAP, interface".to_string(),
        Some(f) if f & i64::from(IFF_MULTI_QUEUE) == 0 => format!(
            "is a single-queue TAP and cannot take {queues} queues: remove it (ip link del \
             {name}; its addresses and routes go with it) to have it made anew"
        ),
        Some(_) => "is a TAP that refused to be attached".to_string(),
        None if flags.is_none() && queues > 1 => format!(
            "is not a TAP interface, or a single-queue TAP that cannot take {queues} queues"
        ),
        None => "is not a TAP interface".to_string(),
    };
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("{name} exists and {why}"),
    )
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    mod needs_root {
        use super::super::*;
        use crate::packet::tests::own_namespace;

        /// Issue 44: a port is a persistent multi-queue TAP: it outlives its queues, takes
        /// more, has carrier only while one is attached, joins and leaves a bridge, and goes
        /// once it is no longer persistent and its last queue closes.
        #[test]
        #[ignore = "needs root"]
        fn a_port_outlives_its_queues_and_joins_a_bridge() {
            own_namespace();
            let q = Tap::attach_queue("sdp-t").unwrap();
            q.set_persist(true).unwrap();
            let q2 = Tap::attach_queue("sdp-t").unwrap();
            assert!(q2.reattached());
            netdev::set_up("sdp-t").unwrap();
            assert!(netdev::is_running("sdp-t").unwrap(), "carrier with queues");
            drop((q, q2));
            assert!(netdev::index("sdp-t").is_ok(), "persistent");
            // This namespace's sysfs is not mounted: IFF_RUNNING, which trails the carrier.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while netdev::is_running("sdp-t").unwrap() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            assert!(
                !netdev::is_running("sdp-t").unwrap(),
                "no carrier without a queue"
            );
            let ok = std::process::Command::new("ip")
                .args(["link", "add", "br-t", "type", "bridge"])
                .status()
                .unwrap();
            assert!(ok.success(), "ip link add br-t type bridge");
            // As rtnetlink shows it (sysfs would show the namespace that mounted it).
            let master = || {
                let out = std::process::Command::new("ip")
                    .args(["-o", "link", "show", "sdp-t"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).contains("master br-t")
            };
            assert!(!master());
            netdev::set_bridge_port("br-t", "sdp-t", true).unwrap();
            assert!(master(), "a port of br-t");
            netdev::set_bridge_port("br-t", "sdp-t", false).unwrap();
            assert!(!master(), "out of br-t");
            let last = Tap::attach_queue("sdp-t").unwrap();
            last.set_persist(false).unwrap();
            drop(last);
            assert!(netdev::index("sdp-t").is_err(), "gone");
            // A single-queue TAP of that name takes no port's queue, and says why.
            let plain = Tap::open("sdp-p").unwrap();
            plain.set_persist(true).unwrap();
            drop(plain);
            let e = Tap::attach_queue("sdp-p").unwrap_err();
            assert!(e.to_string().contains("single-queue"), "{e}");
        }
    }
}
