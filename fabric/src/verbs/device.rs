//! The RDMA device a connection goes through: the one the connection manager resolved its
//! address to (see the parent module's `sys` for how libibverbs is reached).

use super::cm::CmId;
use rdma_mummy_sys as ffi;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// An open RDMA device, as a connection manager identifier found it. librdmacm opened it
/// and keeps it open; the identifier is held so the device stays bound to it while
/// anything made on it lives.
#[derive(Debug)]
pub struct Context {
    pub(super) ctx: NonNull<ffi::ibv_context>,
    name: String,
    _id: Arc<CmId>,
}

// SAFETY: an ibv_context may be used from any thread (libibverbs locks what it shares); the
// daemons use each from one thread at a time.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// The device `id` is bound to.
    pub fn of(id: &Arc<CmId>) -> io::Result<Arc<Context>> {
        Ok(Arc::new(Context {
            ctx: id.device()?,
            name: id.device_name().unwrap_or_default(),
            _id: id.clone(),
        }))
    }

    /// Whether the device has memory windows (type 1, bound with `ibv_bind_mw`): then each
    /// granted element gets a window of its own. A query that fails counts as no.
    pub fn has_windows(&self) -> bool {
        // SAFETY: zero is a valid ibv_device_attr; the context is open.
        let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `attr` is written by the call.
        let rc = unsafe { ffi::ibv_query_device(self.ctx.as_ptr(), &mut attr) };
        let flag = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW.0;
        rc == 0 && attr.device_cap_flags & flag != 0
    }

    /// The device's name (`rxe0`, `mlx5_0`).
    pub fn name(&self) -> &str {
        &self.name
    }
}
