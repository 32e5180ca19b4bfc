//! Following network interfaces as the kernel reports them (rtnetlink, group `RTNLGRP_LINK`):
//! every change of an interface's MTU, flags, carrier or promiscuity arrives as a
//! `RTM_NEWLINK` message, so a driver follows it at once instead of polling.
//!
//! [`parse`] turns the kernel's bytes into [`LinkState`]s (pure, fuzzed); [`LinkWatch`] is the
//! socket. The messages are decoded by the `netlink-packet-route` crate; the socket is a few
//! system calls, written here as the rest of this crate's sockets are.

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST,
};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// What the kernel says of one interface in one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkState {
    /// Its index.
    pub index: u32,
    /// Its MTU, when the message carries it.
    pub mtu: Option<u32>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Up and operational (`IFF_RUNNING`): what a driver calls its link up.
    pub running: bool,
    /// The carrier (`IFF_LOWER_UP`).
    pub carrier: bool,
    /// `IFF_PROMISC` as a user set it (`ip link set DEV promisc on`).
    pub promisc_flag: bool,
    /// `IFF_ALLMULTI` as a user set it.
    pub allmulti_flag: bool,
    /// The kernel's promiscuity count (`IFLA_PROMISCUITY`): users, bridges that took the
    /// interface as a port, packet sockets that asked for it.
    pub promiscuity: Option<u32>,
    /// The kernel's all-multicast count (`IFLA_ALLMULTI`, kernels from 6.8 on).
    pub allmulti: Option<u32>,
}

impl LinkState {
    /// Whether the interface receives every frame: a user or anything in the kernel asked.
    pub fn promiscuous(&self) -> bool {
        self.promisc_flag || self.promiscuity.unwrap_or(0) > 0
    }

    /// Whether it receives every multicast frame (and is not promiscuous).
    pub fn all_multicast(&self) -> bool {
        !self.promiscuous() && (self.allmulti_flag || self.allmulti.unwrap_or(0) > 0)
    }
}

/// Why the kernel's bytes could not be read.
#[derive(Debug, thiserror::Error)]
#[error("an rtnetlink message that does not decode: {0}")]
pub struct ParseError(String);

/// Appends the state of every `RTM_NEWLINK` of an interface in `bytes` (one datagram of
/// messages) to `out`; other messages (a bridge's reports of its ports among them) are skipped. An error leaves what was read before it in `out`.
pub fn parse(bytes: &[u8], out: &mut Vec<LinkState>) -> Result<(), ParseError> {
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let len = NetlinkBuffer::new_checked(rest)
            .map_err(|e| ParseError(e.to_string()))?
            .length() as usize;
        // A length shorter than a header was refused above; messages are 4-byte aligned.
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len.min(rest.len())])
            .map_err(|e| ParseError(e.to_string()))?;
        // A bridge's report of its port (family AF_BRIDGE) has the port's index but not its
        // counts: only the interface's own reports (AF_UNSPEC) say what it is.
        if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) = msg.payload {
            if m.header.interface_family == AddressFamily::Unspec {
                out.push(state_of(&m));
            }
        }
        at += len.next_multiple_of(4).max(1);
    }
    Ok(())
}

fn state_of(m: &LinkMessage) -> LinkState {
    let f = m.header.flags;
    let mut s = LinkState {
        index: m.header.index,
        up: f.contains(LinkFlags::Up),
        running: f.contains(LinkFlags::Running),
        carrier: f.contains(LinkFlags::LowerUp),
        promisc_flag: f.contains(LinkFlags::Promisc),
        allmulti_flag: f.contains(LinkFlags::Allmulti),
        ..LinkState::default()
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::Mtu(v) => s.mtu = Some(*v),
            LinkAttribute::Promiscuity(v) => s.promiscuity = Some(*v),
            LinkAttribute::AllMulticast(v) => s.allmulti = Some(*v),
            _ => {}
        }
    }
    s
}

/// The bytes of an `RTM_GETLINK` request for interface `index` (the kernel answers with its
/// `RTM_NEWLINK`).
pub fn get_link_request(index: u32, seq: u32) -> Vec<u8> {
    let mut link = LinkMessage::default();
    link.header.index = index;
    encode(NLM_F_REQUEST, seq, RouteNetlinkMessage::GetLink(link))
}

/// The bytes of one netlink message carrying `msg`.
fn encode(flags: u16, seq: u32, msg: RouteNetlinkMessage) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

/// Whether a read's error says the kernel dropped reports (`ENOBUFS`: the socket overflowed);
/// the state of what is followed must then be asked for again.
pub fn overrun(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOBUFS)
}

/// A non-blocking rtnetlink socket that receives every interface change of its network
/// namespace.
#[derive(Debug)]
pub struct LinkWatch {
    fd: OwnedFd,
    buf: Vec<u8>,
    seq: u32,
}

/// `RTMGRP_LINK`: the group of interface changes.
const RTMGRP_LINK: u32 = 1;
/// Bytes of one datagram at most (the kernel's messages are far smaller).
const DATAGRAM: usize = 64 << 10;

impl LinkWatch {
    /// Opens the socket (needs `AF_NETLINK`, which a unit must allow).
    pub fn open() -> io::Result<LinkWatch> {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned at once.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor this function just opened and owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a zeroed sockaddr_nl is valid; it is filled in below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = RTMGRP_LINK;
        // SAFETY: `addr` is a valid sockaddr_nl of the length given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(addr).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LinkWatch {
            fd,
            buf: vec![0; DATAGRAM],
            seq: 0,
        })
    }

    /// Asks the kernel for interface `index`'s state now; it arrives with the changes.
    pub fn request(&mut self, index: u32) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let req = get_link_request(index, self.seq);
        // SAFETY: a zeroed sockaddr_nl is the kernel's address (pid 0).
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `req` and `to` are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                req.as_ptr().cast(),
                req.len(),
                0,
                std::ptr::addr_of!(to).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads every datagram waiting, appending the interface states they hold to `out`.
    /// `Ok` once none is left. `ENOBUFS` means the kernel dropped messages (the socket
    /// overflowed): ask again for the interfaces followed ([`LinkWatch::request`]).
    pub fn read(&mut self, out: &mut Vec<LinkState>) -> io::Result<()> {
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            if let Err(e) = parse(&self.buf[..n as usize], out) {
                tracing::debug!("{e}");
            }
        }
    }
}

impl AsFd for LinkWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for LinkWatch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::NLM_F_MULTIPART;

    /// The bytes of an RTM_NEWLINK for `index` with `flags` and `attributes`.
    fn new_link(index: u32, flags: LinkFlags, attributes: Vec<LinkAttribute>) -> Vec<u8> {
        let mut link = LinkMessage::default();
        link.header.index = index;
        link.header.flags = flags;
        link.attributes = attributes;
        encode(NLM_F_MULTIPART, 0, RouteNetlinkMessage::NewLink(link))
    }

    #[test]
    fn a_new_link_gives_its_mtu_flags_and_counts() {
        let mut bytes = new_link(
            7,
            LinkFlags::Up | LinkFlags::Running | LinkFlags::LowerUp,
            vec![
                LinkAttribute::IfName("sd0".into()),
                LinkAttribute::Mtu(9000),
                LinkAttribute::Promiscuity(1),
            ],
        );
        // Two messages in one datagram; a request (not a NewLink) between them is skipped,
        // and so is a bridge's report of its port (no counts in it).
        bytes.extend(get_link_request(3, 1));
        let mut port = new_link(7, LinkFlags::Up, vec![LinkAttribute::Mtu(9000)]);
        port[16] = libc::AF_BRIDGE as u8;
        bytes.extend(port);
        bytes.extend(new_link(8, LinkFlags::Allmulti, vec![]));
        let mut out = Vec::new();
        parse(&bytes, &mut out).unwrap();
        assert_eq!(
            out,
            [
                LinkState {
                    index: 7,
                    mtu: Some(9000),
                    up: true,
                    running: true,
                    carrier: true,
                    promiscuity: Some(1),
                    ..LinkState::default()
                },
                LinkState {
                    index: 8,
                    allmulti_flag: true,
                    ..LinkState::default()
                },
            ]
        );
        // A bridge port: promiscuous by count, not by flag; the flag alone counts too.
        assert!(out[0].promiscuous() && !out[0].all_multicast());
        assert!(!out[1].promiscuous() && out[1].all_multicast());
    }

    #[test]
    fn bytes_that_do_not_decode_are_an_error_after_what_did() {
        let mut bytes = new_link(7, LinkFlags::Up, vec![LinkAttribute::Mtu(1500)]);
        bytes.extend([0xff; 7]);
        let mut out = Vec::new();
        assert!(parse(&bytes, &mut out).is_err());
        assert_eq!(out.len(), 1);
        assert!(parse(&[0; 3], &mut Vec::new()).is_err());
    }

    /// The kernel's own answer (an rtnetlink socket needs no privilege).
    #[test]
    fn the_kernel_answers_a_request_for_loopback() {
        let mut w = LinkWatch::open().unwrap();
        w.request(1).unwrap();
        let mut out = Vec::new();
        for _ in 0..100 {
            w.read(&mut out).unwrap();
            if !out.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let lo = out.iter().find(|s| s.index == 1).expect("loopback's state");
        assert!(lo.mtu.is_some());
    }
}
