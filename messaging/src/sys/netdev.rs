//! Interface ioctls: index, MTU, MAC address and flags, by name.

use super::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Longest interface name (without the terminating NUL).
pub const IFNAMSIZ_MAX: usize = libc::IFNAMSIZ - 1;

/// An `ifreq` for `name`.
pub(crate) fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() > IFNAMSIZ_MAX || name.bytes().any(|b| b == 0 || b == b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid interface name {name:?}"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

/// A socket to issue interface ioctls on.
fn ctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before it is owned.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ioctl(req: libc::c_ulong, ifr: &mut libc::ifreq) -> io::Result<()> {
    let s = ctl_socket()?;
    // SAFETY: `ifr` is a valid, initialised ifreq for the duration of the call; every request
    // passed here reads or writes an ifreq.
    cvt(unsafe { libc::ioctl(s.as_raw_fd(), req as _, ifr as *mut libc::ifreq) })?;
    Ok(())
}

/// Interface index of `name`.
pub fn index(name: &str) -> io::Result<u32> {
    let mut r = ifreq(name)?;
    ioctl(libc::SIOCGIFINDEX, &mut r)?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member of the union.
    Ok(unsafe { r.ifr_ifru.ifru_ifindex } as u32)
}

/// MTU of `name`.
pub fn mtu(name: &str) -> io::Result<u32> {
    let mut r = ifreq(name)?;
    ioctl(libc::SIOCGIFMTU, &mut r)?;
    // SAFETY: SIOCGIFMTU filled the mtu member of the union.
    Ok(unsafe { r.ifr_ifru.ifru_mtu } as u32)
}

/// Sets the MTU of `name`.
pub fn set_mtu(name: &str, mtu: u32) -> io::Result<()> {
    let mut r = ifreq(name)?;
    r.ifr_ifru.ifru_mtu = mtu as libc::c_int;
    ioctl(libc::SIOCSIFMTU, &mut r)
}

/// MAC address of `name`.
pub fn mac(name: &str) -> io::Result<[u8; 6]> {
    let mut r = ifreq(name)?;
    ioctl(libc::SIOCGIFHWADDR, &mut r)?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
    let data = unsafe { r.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(data) {
        *m = d as u8;
    }
    Ok(mac)
}

/// Sets the MAC address of `name` (the interface must be down for some drivers; a TAP
/// accepts it any time).
pub fn set_mac(name: &str, mac: [u8; 6]) -> io::Result<()> {
    let mut r = ifreq(name)?;
    // SAFETY: writing plain data into the hwaddr member of the union.
    unsafe {
        r.ifr_ifru.ifru_hwaddr.sa_family = libc::ARPHRD_ETHER;
        for (d, m) in r.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(mac) {
            *d = m as libc::c_char;
        }
    }
    ioctl(libc::SIOCSIFHWADDR, &mut r)
}

/// Interface flags (`IFF_*`).
pub fn flags(name: &str) -> io::Result<i32> {
    let mut r = ifreq(name)?;
    ioctl(libc::SIOCGIFFLAGS, &mut r)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    Ok(i32::from(unsafe { r.ifr_ifru.ifru_flags }) & 0xffff)
}

/// Sets the interface administratively up.
pub fn set_up(name: &str) -> io::Result<()> {
    let f = flags(name)?;
    let mut r = ifreq(name)?;
    r.ifr_ifru.ifru_flags = (f | libc::IFF_UP) as libc::c_short;
    ioctl(libc::SIOCSIFFLAGS, &mut r)
}

/// True when the interface is up and has carrier. The carrier is read from sysfs, which
/// follows the driver at once; `IFF_RUNNING` (the fallback) trails it by up to a second
/// because the kernel's link watcher updates the operational state lazily.
pub fn is_running(name: &str) -> io::Result<bool> {
    let f = flags(name)?;
    if f & libc::IFF_UP == 0 {
        return Ok(false);
    }
    match std::fs::read_to_string(format!("/sys/class/net/{name}/carrier")) {
        Ok(c) => Ok(c.trim() == "1"),
        Err(_) => Ok(f & libc::IFF_RUNNING != 0),
    }
}
