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

    /// The device's name (`rxe0`, `mlx5_0`).
    pub fn name(&self) -> &str {
        &self.name
    }
}
