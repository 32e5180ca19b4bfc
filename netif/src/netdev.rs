//! Interface ioctls: index, MTU, MAC address and flags, by name.

use super::cvt;
use std::ffi::CStr;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
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

/// `SIOCBRADDIF` and `SIOCBRDELIF` (linux/sockios.h): a port joins or leaves a bridge.
const SIOCBRADDIF: libc::c_ulong = 0x89a2;
const SIOCBRDELIF: libc::c_ulong = 0x89a3;

/// Makes `port` a port of Linux bridge `bridge` (`join`), or takes it out.
pub fn set_bridge_port(bridge: &str, port: &str, join: bool) -> io::Result<()> {
    let index = index(port)?;
    let mut r = ifreq(bridge)?;
    r.ifr_ifru.ifru_ifindex = index as libc::c_int;
    ioctl(if join { SIOCBRADDIF } else { SIOCBRDELIF }, &mut r)
}

/// The bridge (or other master) `name` is a port of, if any, as sysfs shows it (the
/// namespace's that mounted it: the daemon's own).
pub fn master(name: &str) -> io::Result<Option<String>> {
    ifreq(name)?;
    match std::fs::read_link(format!("/sys/class/net/{name}/master")) {
        Ok(p) => Ok(p.file_name().map(|f| f.to_string_lossy().into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
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

/// Whether the interface is promiscuous for any reason (a user's flag, a bridge, a packet
/// socket's hold, a unicast filter it cannot hold): the kernel's own flags, from sysfs (the
/// `SIOCGIFFLAGS` ioctl shows only the flag users set).
pub fn is_promiscuous(name: &str) -> io::Result<bool> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/flags"))?;
    let flags = u32::from_str_radix(text.trim().trim_start_matches("0x"), 16)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(flags & libc::IFF_PROMISC as u32 != 0)
}

/// The link-layer multicast groups joined on `name` (what `ip maddr show dev NAME` lists as
/// `link`), sorted, from `/proc/self/net/dev_mcast` (of this network namespace).
pub fn multicast(name: &str) -> io::Result<Vec<[u8; 6]>> {
    Ok(parse_dev_mcast(
        &std::fs::read_to_string("/proc/self/net/dev_mcast")?,
        name,
    ))
}

/// Parses `/proc/net/dev_mcast` (`index name users global address-in-hex` per line) for
/// the groups of `name`; malformed lines are skipped.
pub fn parse_dev_mcast(text: &str, name: &str) -> Vec<[u8; 6]> {
    let mut groups: Vec<[u8; 6]> = text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_, ifname, hex) = (f.next()?, f.next()?, f.nth(2)?);
            if ifname != name || hex.len() != 12 {
                return None;
            }
            let mut mac = [0u8; 6];
            for (i, b) in mac.iter_mut().enumerate() {
                *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            Some(mac)
        })
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// The IPv4 and IPv6 addresses assigned to `name`, link-local and tentative ones included,
/// in the order `getifaddrs(3)` lists them. An interface that exists with no address gives
/// empty lists; one that does not exist is a `NotFound` error (the list names every
/// interface, with an `AF_PACKET` entry, whether it has addresses or not).
pub fn addresses(name: &str) -> io::Result<(Vec<Ipv4Addr>, Vec<Ipv6Addr>)> {
    ifreq(name)?;
    let list = IfAddrs::new()?;
    let (mut v4, mut v6, mut seen) = (Vec::new(), Vec::new(), false);
    for entry in list
        .iter()
        .filter(|e| entry_name(e) == Some(name.as_bytes()))
    {
        seen = true;
        match entry_addr(entry) {
            Some(EntryAddr::V4(a)) => v4.push(a),
            Some(EntryAddr::V6(a)) => v6.push(a),
            None => {}
        }
    }
    if !seen {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {name:?}"),
        ));
    }
    Ok((v4, v6))
}

/// The list `getifaddrs(3)` returns, freed when dropped (also on an early return).
struct IfAddrs(*mut libc::ifaddrs);

impl IfAddrs {
    fn new() -> io::Result<IfAddrs> {
        let mut head = std::ptr::null_mut();
        // SAFETY: getifaddrs writes the head of a list it allocated into `head`, which is
        // owned from here on and freed by `Drop`; on failure it writes nothing to free.
        cvt(unsafe { libc::getifaddrs(&mut head) })?;
        Ok(IfAddrs(head))
    }

    /// The entries, borrowed from the list, so none outlives it.
    fn iter(&self) -> impl Iterator<Item = &libc::ifaddrs> {
        // SAFETY: the head and every `ifa_next` are null or point at an entry of the list,
        // valid until `freeifaddrs`, which only `Drop` calls, after this borrow ends.
        std::iter::successors(unsafe { self.0.as_ref() }, |e| unsafe {
            e.ifa_next.as_ref()
        })
    }
}

impl Drop for IfAddrs {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the list came from getifaddrs and is freed once, here.
            unsafe { libc::freeifaddrs(self.0) };
        }
    }
}

/// An entry's interface name.
fn entry_name(e: &libc::ifaddrs) -> Option<&[u8]> {
    if e.ifa_name.is_null() {
        return None;
    }
    // SAFETY: a non-null `ifa_name` is a NUL-terminated string that lives as long as the
    // entry.
    Some(unsafe { CStr::from_ptr(e.ifa_name) }.to_bytes())
}

/// An IP address of an entry.
enum EntryAddr {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

/// An entry's address, if it is IPv4 or IPv6.
fn entry_addr(e: &libc::ifaddrs) -> Option<EntryAddr> {
    // SAFETY: a non-null `ifa_addr` points at a socket address that lives as long as the
    // entry; every one starts with its family.
    let family = unsafe { e.ifa_addr.as_ref() }?.sa_family;
    match i32::from(family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a whole `sockaddr_in`; read unaligned, as the
            // list's layout does not promise its alignment.
            let sin = unsafe { e.ifa_addr.cast::<libc::sockaddr_in>().read_unaligned() };
            Some(EntryAddr::V4(Ipv4Addr::from(
                sin.sin_addr.s_addr.to_ne_bytes(),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a whole `sockaddr_in6`; read unaligned, as
            // above.
            let sin6 = unsafe { e.ifa_addr.cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(EntryAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{addresses, parse_dev_mcast};
    use std::io;
    use std::net::Ipv4Addr;

    #[test]
    fn the_loopback_has_its_address_and_a_missing_interface_is_not_found() {
        let (v4, _) = addresses("lo").unwrap();
        assert!(v4.contains(&Ipv4Addr::LOCALHOST), "{v4:?}");
        let e = addresses("nosuchif0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = addresses("").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn dev_mcast_lines_of_one_interface_are_parsed_and_the_rest_skipped() {
        let text = "2    lo              1     0     333300000001\n\
                    5    sd0             1     0     333300000001\n\
                    5    sd0             2     0     01005e000001\n\
                    5    sd0             1     0     3333ff000001\n\
                    5    sd0             1     0     zz3300000001\n\
                    5    sd0\n\
                    6    sd01            1     0     01005e0000fb\n";
        assert_eq!(
            parse_dev_mcast(text, "sd0"),
            vec![
                [0x01, 0x00, 0x5e, 0, 0, 1],
                [0x33, 0x33, 0, 0, 0, 1],
                [0x33, 0x33, 0xff, 0, 0, 1],
            ]
        );
        assert!(parse_dev_mcast(text, "eth9").is_empty());
        assert!(parse_dev_mcast("", "sd0").is_empty());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
            let _ = parse_dev_mcast(&text, "sd0");
        }
    }
}
