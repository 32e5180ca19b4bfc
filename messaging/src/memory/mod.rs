//! Registered memory: handles, protection domains, regions and the send-buffer cache.

mod arena;
mod frame;
mod handle;
mod registry;
mod sendbuf;
#[cfg(test)]
mod tests;

pub use arena::{Arena, SharedRegion, ARENA_ALIGN};
pub use frame::{Frame, SharedBytes};
pub use handle::{Access, DomainId, Handle};
pub use registry::{
    arena_offset, Placement, ProtectionError, RegionSpec, Registry, RegistryError, RegistryStats,
};
pub use sendbuf::{CacheStats, SendBuf, SendBufCache};
