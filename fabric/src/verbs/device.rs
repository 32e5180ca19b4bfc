//! The RDMA device that carries an IP address: found by its GID table, opened once per
//! address and process (see the parent module's `sys` for how libibverbs is reached).

use super::sys::last_error;
use rdma_mummy_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv6Addr};
use std::ptr::NonNull;
use std::sync::Arc;

/// An open RDMA device.
#[derive(Debug)]
pub struct Context {
    pub(super) ctx: NonNull<ffi::ibv_context>,
    name: String,
}

// SAFETY: an ibv_context may be used from any thread (libibverbs locks what it shares); the
// daemons use each from one thread at a time.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from ibv_open_device and everything made from it holds an Arc
        // to this context, so nothing uses it any more.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

impl Context {
    /// The device's name (`rxe0`, `mlx5_0`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The port and GID of a device that carry a given IP address (RoCE: the GID table holds
/// the addresses of the device's network interface).
#[derive(Debug, Clone)]
pub struct Port {
    /// The device.
    pub ctx: Arc<Context>,
    /// Port number (from 1).
    pub port: u8,
    /// Index of the address's GID in the port's table.
    pub gid_index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// The port's active MTU (`enum ibv_mtu`: 1 for 256 bytes ... 5 for 4096).
    pub mtu: u32,
}

/// The GID an IP address has in a RoCE GID table: an IPv6 address as it is, an IPv4 address
/// mapped (`::ffff:a.b.c.d`).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Finds the RDMA device, port and GID that carry `ip` (a RoCE v2 GID preferred over a v1
/// one with the same address) and opens the device. The error names what is missing:
/// libibverbs itself, any RDMA device, or one whose GID table holds `ip`.
pub fn port_for(ip: IpAddr) -> io::Result<Port> {
    // Opening a device and reading its GID tables is slow (milliseconds; a second under
    // emulation): each address's port is found once per process.
    static PORTS: std::sync::Mutex<Vec<(IpAddr, Port)>> = std::sync::Mutex::new(Vec::new());
    let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    // Still there? An address removed and added again may have another index, a device
    // removed and added again is another device.
    if let Some(i) = ports.iter().position(|(a, _)| *a == ip) {
        let p = &ports[i].1;
        let mut gid = MaybeUninit::<ffi::ibv_gid>::zeroed();
        // SAFETY: `gid` is writable; the context is open.
        let rc = unsafe {
            ffi::ibv_query_gid(
                p.ctx.ctx.as_ptr(),
                p.port,
                i32::from(p.gid_index),
                gid.as_mut_ptr(),
            )
        };
        // SAFETY: written by the successful call; any bit pattern is a GID.
        if rc == 0 && unsafe { gid.assume_init().raw } == p.gid {
            return Ok(p.clone());
        }
        ports.swap_remove(i);
    }
    let p = find_port(ip)?;
    ports.push((ip, p.clone()));
    Ok(p)
}

fn find_port(ip: IpAddr) -> io::Result<Port> {
    let want = gid_of(ip);
    let mut n = 0;
    // SAFETY: plain call; the list is freed below, after the devices we keep were opened.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = last_error();
        return Err(io::Error::new(
            e.kind(),
            format!("no RDMA stack: cannot list RDMA devices ({e}); install rdma-core (libibverbs1, ibverbs-providers) and load the device's driver"),
        ));
    }
    let mut found: Option<(Port, bool)> = None;
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: `list` holds `n` device pointers.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a device of the list, which is still alive.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        names.push(name.clone());
        // SAFETY: as above.
        let Some(ctx) = NonNull::new(unsafe { ffi::ibv_open_device(dev) }) else {
            continue;
        };
        let ctx = Arc::new(Context { ctx, name });
        if let Some(p) = find_gid(&ctx, &want) {
            if found.as_ref().is_none_or(|f| p.1 && !f.1) {
                found = Some(p);
            }
        }
    }
    // SAFETY: `list` came from ibv_get_device_list; opened contexts outlive it.
    unsafe { ffi::ibv_free_device_list(list) };
    found.map(|f| f.0).ok_or_else(|| {
        let what = if names.is_empty() {
            "no RDMA device (load a driver, or add Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)".to_string()
        } else {
            format!("no RDMA device has {ip} in its GID table (devices: {})", names.join(", "))
        };
        io::Error::new(io::ErrorKind::NotFound, what)
    })
}

/// The type of GID `index` of `port`, if the table has that entry.
fn gid_type(ctx: &Context, port: u8, index: u8) -> Option<u32> {
    let mut entry = MaybeUninit::<ffi::ibv_gid_entry>::zeroed();
    // SAFETY: `entry` is a writable ibv_gid_entry; the context is open.
    let rc = unsafe {
        ffi::ibv_query_gid_ex(
            ctx.ctx.as_ptr(),
            u32::from(port),
            u32::from(index),
            entry.as_mut_ptr(),
            0,
        )
    };
    // SAFETY: on success the entry was written.
    (rc == 0).then(|| unsafe { entry.assume_init() }.gid_type)
}

/// The port and GID index of `ctx` whose GID is `want`, and whether it is RoCE v2.
fn find_gid(ctx: &Arc<Context>, want: &[u8; 16]) -> Option<(Port, bool)> {
    let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
    // SAFETY: `attr` is writable; the context is open.
    if unsafe { ffi::ibv_query_device(ctx.ctx.as_ptr(), attr.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: written by the successful call.
    let ports = unsafe { attr.assume_init() }.phys_port_cnt;
    let mut best: Option<(Port, bool)> = None;
    for port in 1..=ports {
        let mut pa = MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        // SAFETY: as above.
        if unsafe { ffi::ibv_query_port(ctx.ctx.as_ptr(), port, pa.as_mut_ptr()) } != 0 {
            continue;
        }
        // SAFETY: written by the successful call.
        let pa = unsafe { pa.assume_init() };
        let len = u8::try_from(pa.gid_tbl_len.clamp(0, 255)).unwrap_or(0);
        for index in 0..len {
            let mut gid = MaybeUninit::<ffi::ibv_gid>::zeroed();
            // SAFETY: as above.
            let rc = unsafe {
                ffi::ibv_query_gid(ctx.ctx.as_ptr(), port, i32::from(index), gid.as_mut_ptr())
            };
            if rc != 0 {
                continue;
            }
            // SAFETY: written by the successful call; every bit pattern is a valid GID.
            let raw = unsafe { gid.assume_init().raw };
            if &raw != want {
                continue;
            }
            let v2 = gid_type(ctx, port, index) == Some(ffi::IBV_GID_TYPE_ROCE_V2);
            if best.as_ref().is_none_or(|b| v2 && !b.1) {
                best = Some((
                    Port {
                        ctx: ctx.clone(),
                        port,
                        gid_index: index,
                        gid: raw,
                        mtu: pa.active_mtu,
                    },
                    v2,
                ));
            }
        }
    }
    best
}

/// The IPv6 form of a GID, for messages.
pub fn gid_display(gid: &[u8; 16]) -> Ipv6Addr {
    Ipv6Addr::from(*gid)
}
