//! The RDMA connection manager (librdmacm, loaded at run time like libibverbs): it resolves
//! an IP address to a device, port and path on any rdma-core fabric (InfiniBand, RoCE,
//! iWARP) and connects a queue pair to the peer's, moving it through its states with the
//! path's attributes. With `sys`, all of the transport's `unsafe` for it.
//!
//! Each identifier gets an event channel of its own ([`Events`]), so a set-up waits for its
//! own events with a deadline, on a thread of the blocking pool, and the listener's thread
//! only ever sees connection requests.

use super::sys::last_error;
use rdma_mummy_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};
use std::time::Instant;

/// `RDMA_OPTION_ID` and `RDMA_OPTION_ID_ACK_TIMEOUT` of `<rdma/rdma_cma.h>` (an anonymous
/// enum there, so not in the bindings).
const OPTION_ID: i32 = 0;
const OPTION_ID_ACK_TIMEOUT: i32 = 3;
/// Most private data a connection request carries on every fabric (InfiniBand's REQ holds
/// 92 bytes, of which the connection manager's header takes 36).
pub const MAX_PRIVATE: usize = 56;

/// An event channel: where the connection manager reports what happened to identifiers.
#[derive(Debug)]
pub struct Events {
    ch: NonNull<ffi::rdma_event_channel>,
}

// SAFETY: an event channel is a descriptor and librdmacm locks what identifiers share.
unsafe impl Send for Events {}
unsafe impl Sync for Events {}

impl Drop for Events {
    fn drop(&mut self) {
        // SAFETY: every identifier on the channel was destroyed first (CmId owns its channel
        // and destroys itself before it).
        unsafe { ffi::rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// An event, copied out of the channel and acknowledged.
#[derive(Debug)]
pub struct Event {
    /// `enum rdma_cm_event_type`.
    pub kind: u32,
    /// Its status (an errno, or a reject reason for `REJECTED`).
    pub status: i32,
    /// A connection request's new identifier.
    pub request: Option<Incoming>,
    /// The private data that came with it.
    pub private: Vec<u8>,
}

/// The name of an event kind, for messages.
pub fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    let s = unsafe { ffi::rdma_event_str(kind) };
    if s.is_null() {
        return format!("event {kind}");
    }
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// What the connection manager needs on this machine, as far as it shows, for the error
/// of an event channel that cannot be had: librdmacm fails alike (no connection manager)
/// whether librdmacm itself, the devices' user-space drivers, the kernel's connection
/// manager or any device is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Found {
    /// librdmacm.so.1 loaded (librdmacm1).
    rdmacm: bool,
    /// A libibverbs provider, `lib*-rdmav*.so` (ibverbs-providers; without one libibverbs
    /// finds no device).
    provider: bool,
    /// The kernel's connection manager: /dev/infiniband/rdma_cm (rdma_ucm).
    ucm: bool,
    /// An RDMA device in /sys/class/infiniband.
    device: bool,
}

impl Found {
    fn here() -> Found {
        Found {
            rdmacm: rdmacm_loaded(),
            provider: has_provider(),
            ucm: std::path::Path::new("/dev/infiniband/rdma_cm").exists(),
            device: std::fs::read_dir("/sys/class/infiniband")
                .is_ok_and(|mut d| d.next().is_some()),
        }
    }

    /// What to do: each piece missing with the package or module that gives it.
    fn advice(self) -> String {
        let mut todo = Vec::new();
        if !self.rdmacm {
            todo.push("install librdmacm1 (librdmacm.so.1 is not loaded)");
        }
        if !self.provider {
            todo.push(
                "install ibverbs-providers (no libibverbs provider, /usr/lib/*/libibverbs/lib*-rdmav*.so: the devices' user-space drivers)",
            );
        }
        if !self.ucm {
            todo.push("load rdma_ucm (no /dev/infiniband/rdma_cm)");
        }
        if !self.device {
            todo.push("add an RDMA device (none in /sys/class/infiniband: load the NIC's RDMA driver, or Soft-RoCE: modprobe rdma_rxe, then rdma link add rxe0 type rxe netdev IFACE)");
        }
        if todo.is_empty() {
            return "librdmacm1, ibverbs-providers, rdma_ucm and a device are there: see rdma link show".into();
        }
        todo.join("; ")
    }
}

/// Whether librdmacm is loaded (the sys crate loads it when the process starts, if it can).
fn rdmacm_loaded() -> bool {
    // SAFETY: with RTLD_NOLOAD, dlopen only looks among the libraries loaded; a handle it
    // returns is closed at once (the library stays: the sys crate holds it).
    unsafe {
        let h = libc::dlopen(
            c"librdmacm.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        );
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

/// Whether a libibverbs provider (`lib<driver>-rdmav<ABI>.so`) is installed where libibverbs
/// looks for one: `/usr/lib/TRIPLET/libibverbs` on Debian, `/usr/lib64/libibverbs` elsewhere.
fn has_provider() -> bool {
    let mut dirs = vec![
        std::path::PathBuf::from("/usr/lib64/libibverbs"),
        std::path::PathBuf::from("/usr/lib/libibverbs"),
    ];
    if let Ok(lib) = std::fs::read_dir("/usr/lib") {
        dirs.extend(lib.flatten().map(|e| e.path().join("libibverbs")));
    }
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|d| d.flatten())
        .any(|f| {
            let name = f.file_name();
            let name = name.to_string_lossy();
            name.starts_with("lib") && name.contains("-rdmav") && name.ends_with(".so")
        })
}

impl Events {
    /// A new channel. The error names what is missing: librdmacm, the devices' user-space
    /// drivers (ibverbs-providers), the kernel's connection manager (`rdma_ucm`), a device.
    pub fn new() -> io::Result<Events> {
        // SAFETY: plain call.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        NonNull::new(ch).map(|ch| Events { ch }).ok_or_else(|| {
            let e = last_error();
            io::Error::new(
                e.kind(),
                format!(
                    "no RDMA connection manager ({e}): {}",
                    Found::here().advice()
                ),
            )
        })
    }

    /// The channel's descriptor: readable while an event waits.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel and its descriptor live as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.ch.as_ref().fd) }
    }

    /// The event waiting, if one is (without waiting).
    pub fn try_next(&self) -> io::Result<Option<Event>> {
        match self.next(Some(Instant::now())) {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The next event, waiting until `deadline` at most (`None`: as long as it takes; a
    /// deadline already past: only one already there).
    pub fn next(&self, deadline: Option<Instant>) -> io::Result<Event> {
        // SAFETY: the channel is live.
        let fd = unsafe { self.ch.as_ref().fd };
        let mut first = true;
        loop {
            let ms = match deadline {
                None => -1,
                Some(_) if std::mem::take(&mut first) => 0,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the RDMA connection manager did not answer in time",
                        ));
                    }
                    i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX)
                }
            };
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n < 0 {
                let e = last_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 1 {
                break;
            }
        }
        let mut ev = ptr::null_mut();
        // SAFETY: the channel is live and readable, so this does not block.
        if unsafe { ffi::rdma_get_cm_event(self.ch.as_ptr(), &mut ev) } != 0 {
            return Err(last_error());
        }
        // SAFETY: a successful call gives an event we own until it is acknowledged.
        let e = unsafe { &*ev };
        let request = (e.event == ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST)
            .then(|| NonNull::new(e.id).map(|id| Incoming { id }))
            .flatten();
        use ffi::rdma_cm_event_type as t;
        let connecting = matches!(
            e.event,
            t::RDMA_CM_EVENT_CONNECT_REQUEST
                | t::RDMA_CM_EVENT_ESTABLISHED
                | t::RDMA_CM_EVENT_REJECTED
        );
        // SAFETY: the connection parameters are the union's member for connection events;
        // the private data, when there is some, is that many readable bytes.
        let private = unsafe {
            let c = &e.param.conn;
            if !connecting || c.private_data.is_null() {
                Vec::new()
            } else {
                let n = usize::from(c.private_data_len).min(MAX_PRIVATE);
                std::slice::from_raw_parts(c.private_data.cast::<u8>(), n).to_vec()
            }
        };
        let out = Event {
            kind: e.event,
            status: e.status,
            request,
            private,
        };
        // SAFETY: acknowledged once, after everything was copied out of it.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        Ok(out)
    }
}

/// A connection manager identifier (a "socket" of the RDMA fabric) with its own channel.
#[derive(Debug)]
pub struct CmId {
    id: NonNull<ffi::rdma_cm_id>,
    events: Events,
}

// SAFETY: as for Events; the daemons use an identifier from one thread at a time.
unsafe impl Send for CmId {}
unsafe impl Sync for CmId {}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the queue pair made on it was destroyed first (it holds an Arc to this
        // identifier), and every event read was acknowledged; a connected identifier tells
        // the peer it disconnects.
        unsafe { ffi::rdma_destroy_id(self.id.as_ptr()) };
    }
}

/// A connection request's identifier, on the listener's channel: refused when dropped
/// unless adopted.
#[derive(Debug)]
pub struct Incoming {
    id: NonNull<ffi::rdma_cm_id>,
}

// SAFETY: as for CmId.
unsafe impl Send for Incoming {}

impl Drop for Incoming {
    fn drop(&mut self) {
        // SAFETY: the request's identifier is ours alone (its event was acknowledged).
        unsafe {
            ffi::rdma_reject(self.id.as_ptr(), ptr::null(), 0);
            ffi::rdma_destroy_id(self.id.as_ptr());
        }
    }
}

impl Incoming {
    /// The address the request came from.
    pub fn peer_ip(&self) -> Option<IpAddr> {
        peer_ip(self.id)
    }

    /// Takes the identifier onto a channel of its own, to accept it.
    pub fn adopt(self) -> io::Result<CmId> {
        let events = Events::new()?;
        // SAFETY: the identifier is live and ours; the channel is live. On failure `self`
        // still owns it and refuses it when dropped.
        if unsafe { ffi::rdma_migrate_id(self.id.as_ptr(), events.ch.as_ptr()) } != 0 {
            return Err(last_error());
        }
        let id = std::mem::ManuallyDrop::new(self).id;
        Ok(CmId { id, events })
    }
}

/// The peer's address of a live identifier.
fn peer_ip(id: NonNull<ffi::rdma_cm_id>) -> Option<IpAddr> {
    // SAFETY: the identifier is live; the storage holds the family it says.
    unsafe {
        let s = &id.as_ref().route.addr.dst_addr_union.dst_storage;
        match i32::from(s.ss_family) {
            libc::AF_INET => {
                let sin = &*(s as *const _ as *const libc::sockaddr_in);
                Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into())
            }
            libc::AF_INET6 => {
                let sin6 = &*(s as *const _ as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4))
            }
            _ => None,
        }
    }
}

/// A socket address as the connection manager takes it.
fn sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: zero is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            let sin = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
        }
    }
    s
}

impl CmId {
    /// A new identifier for reliable connections (`RDMA_PS_TCP`), on a channel of its own.
    pub fn new() -> io::Result<CmId> {
        let events = Events::new()?;
        let mut id = ptr::null_mut();
        // SAFETY: the channel is live; `id` receives the identifier.
        let rc = unsafe {
            ffi::rdma_create_id(
                events.ch.as_ptr(),
                &mut id,
                ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        let id = NonNull::new(id)
            .filter(|_| rc == 0)
            .ok_or_else(last_error)?;
        Ok(CmId { id, events })
    }

    pub(super) fn raw(&self) -> *mut ffi::rdma_cm_id {
        self.id.as_ptr()
    }

    /// The device the identifier is bound to (after its address is resolved, or for a
    /// connection request), opened by librdmacm for the life of the process.
    pub fn device(&self) -> io::Result<NonNull<ffi::ibv_context>> {
        // SAFETY: the identifier is live.
        NonNull::new(unsafe { self.id.as_ref().verbs }).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "the RDMA connection manager bound no device",
            )
        })
    }

    /// The name of the device it is bound to, if any (a listener on a wildcard address has
    /// none).
    pub fn device_name(&self) -> Option<String> {
        let ctx = self.device().ok()?;
        // SAFETY: the context is open and its device alive while it is.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(ctx.as_ref().device)) };
        Some(name.to_string_lossy().into_owned())
    }

    /// Waits for the next event, which must be `want` with status 0; anything else is an
    /// error naming it (`what`: the step, for the message).
    pub fn expect(&self, want: u32, what: &str, deadline: Instant) -> io::Result<()> {
        let e = self
            .events
            .next(Some(deadline))
            .map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
        if e.kind == want && e.status == 0 {
            return Ok(());
        }
        let why = match (e.kind, e.status) {
            (ffi::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED, _) => {
                " (refused by the peer: no such set-up, or it is not listening for RDMA)".into()
            }
            (_, s) if s < 0 => format!(" ({})", io::Error::from_raw_os_error(-s)),
            (_, s) => format!(" (status {s})"),
        };
        Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("{what}: {}{why}", event_name(e.kind)),
        ))
    }

    /// Resolves `dst` to a device and a path, from `src` (the interface the TCP connection
    /// uses), both steps before `deadline`.
    pub fn resolve(&self, src: IpAddr, dst: SocketAddr, deadline: Instant) -> io::Result<()> {
        let ms = |d: Instant| {
            let left = d.saturating_duration_since(Instant::now()).as_millis();
            i32::try_from(left.clamp(1, 5_000)).unwrap_or(5_000)
        };
        let mut s = sockaddr(SocketAddr::new(src, 0));
        let mut d = sockaddr(dst);
        // SAFETY: the identifier is live; both addresses are initialised storage.
        let rc = unsafe {
            ffi::rdma_resolve_addr(
                self.raw(),
                (&mut s as *mut libc::sockaddr_storage).cast(),
                (&mut d as *mut libc::sockaddr_storage).cast(),
                ms(deadline),
            )
        };
        if rc != 0 {
            let e = last_error();
            return Err(io::Error::new(
                e.kind(),
                format!("resolving {dst} from {src}: {e}"),
            ));
        }
        let what = format!("resolving {dst} from {src}");
        self.expect(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            &what,
            deadline,
        )?;
        // SAFETY: as above.
        if unsafe { ffi::rdma_resolve_route(self.raw(), ms(deadline)) } != 0 {
            return Err(last_error());
        }
        self.expect(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            &format!("a route to {dst}"),
            deadline,
        )
    }

    /// Binds to `addr` and listens for connection requests. The error says when no RDMA
    /// device holds the address.
    pub fn listen(&self, addr: SocketAddr, backlog: i32) -> io::Result<()> {
        let mut a = sockaddr(addr);
        // SAFETY: the identifier is live; `a` is initialised storage.
        if unsafe {
            ffi::rdma_bind_addr(self.raw(), (&mut a as *mut libc::sockaddr_storage).cast())
        } != 0
        {
            let e = last_error();
            let hint = if e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
                || e.raw_os_error() == Some(libc::ENODEV)
            {
                " (no RDMA device holds this address: load the NIC's RDMA driver, or add Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)"
            } else {
                ""
            };
            return Err(io::Error::new(
                e.kind(),
                format!("cannot take RDMA connections on {addr}: {e}{hint}"),
            ));
        }
        // SAFETY: as above.
        if unsafe { ffi::rdma_listen(self.raw(), backlog) } != 0 {
            return Err(last_error());
        }
        Ok(())
    }

    /// Its channel's descriptor: readable while an event waits.
    pub fn events_fd(&self) -> BorrowedFd<'_> {
        self.events.fd()
    }

    /// Whether the connection ended, by an event waiting on its channel (the peer
    /// disconnected, or the device went away): what ended it.
    pub fn ended(&self) -> io::Result<Option<String>> {
        use ffi::rdma_cm_event_type as t;
        while let Some(e) = self.events.try_next()? {
            if matches!(
                e.kind,
                t::RDMA_CM_EVENT_DISCONNECTED
                    | t::RDMA_CM_EVENT_DEVICE_REMOVAL
                    | t::RDMA_CM_EVENT_TIMEWAIT_EXIT
            ) {
                return Ok(Some(event_name(e.kind)));
            }
        }
        Ok(None)
    }

    /// The next event on a listener's channel (blocking).
    pub fn next_event(&self) -> io::Result<Event> {
        self.events.next(None)
    }

    /// The local ACK timeout of the queue pair it connects (4.096 us x 2^`exp`).
    pub fn set_ack_timeout(&self, exp: u8) -> io::Result<()> {
        let mut v = exp;
        // SAFETY: the option takes one byte.
        let rc = unsafe {
            ffi::rdma_set_option(
                self.raw(),
                OPTION_ID,
                OPTION_ID_ACK_TIMEOUT,
                (&mut v as *mut u8).cast(),
                1,
            )
        };
        if rc != 0 {
            return Err(last_error());
        }
        Ok(())
    }

    fn param(private: &[u8]) -> ffi::rdma_conn_param {
        // SAFETY: zero is a valid rdma_conn_param (no private data, no resources).
        let mut p: ffi::rdma_conn_param = unsafe { std::mem::zeroed() };
        p.private_data = private.as_ptr().cast();
        p.private_data_len = u8::try_from(private.len().min(MAX_PRIVATE)).unwrap_or(0);
        // No RDMA READ or atomics either way.
        p.responder_resources = 0;
        p.initiator_depth = 0;
        // 7 retries of a lost packet; 7 for "receiver not ready": retry without limit
        // (back-pressure, nothing lost).
        p.retry_count = 7;
        p.rnr_retry_count = 7;
        p
    }

    /// Sends the connection request (the queue pair made on this identifier connects when
    /// the peer accepts) with `private` data.
    pub fn connect(&self, private: &[u8]) -> io::Result<()> {
        let mut p = Self::param(private);
        // SAFETY: the identifier is live; `p` points at `private`, alive during the call.
        if unsafe { ffi::rdma_connect(self.raw(), &mut p) } != 0 {
            return Err(last_error());
        }
        Ok(())
    }

    /// Accepts a connection request (its queue pair goes to RTS before the answer leaves).
    pub fn accept(&self, private: &[u8]) -> io::Result<()> {
        let mut p = Self::param(private);
        // SAFETY: as in connect.
        if unsafe { ffi::rdma_accept(self.raw(), &mut p) } != 0 {
            return Err(last_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Found = Found {
        rdmacm: true,
        provider: true,
        ucm: true,
        device: true,
    };

    /// Each missing piece is named with the package or module that gives it, and only
    /// what is missing: librdmacm1 installed, ibverbs-providers not, is not taken for a
    /// missing librdmacm1.
    #[test]
    fn the_advice_names_what_is_missing() {
        let no_provider = Found {
            provider: false,
            ..ALL
        }
        .advice();
        assert!(
            no_provider.starts_with("install ibverbs-providers ("),
            "{no_provider}"
        );
        assert!(!no_provider.contains("librdmacm1"), "{no_provider}");
        assert!(!no_provider.contains("rdma_ucm"), "{no_provider}");
        let no_rdmacm = Found {
            rdmacm: false,
            ..ALL
        }
        .advice();
        assert!(no_rdmacm.starts_with("install librdmacm1 ("), "{no_rdmacm}");
        assert!(!no_rdmacm.contains("ibverbs-providers"), "{no_rdmacm}");
        let no_ucm = Found { ucm: false, ..ALL }.advice();
        assert!(no_ucm.starts_with("load rdma_ucm ("), "{no_ucm}");
        let none = Found {
            rdmacm: false,
            provider: false,
            ucm: false,
            device: false,
        }
        .advice();
        assert_eq!(none.matches("; ").count(), 3, "{none}");
        assert!(!none.contains('\n'));
        assert!(ALL.advice().contains("are there"));
    }

    /// The look at this machine does not fail, whatever it has.
    #[test]
    fn this_machine_is_looked_at() {
        let here = Found::here();
        eprintln!("{here:?}: {}", here.advice());
        assert!(!here.advice().is_empty(), "{here:?}");
    }
}
