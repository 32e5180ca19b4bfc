//! Registered memory: handles, protection domains, regions and the send-buffer cache, and
//! memory shared with a peer that may rewrite it at any moment ([`SharedMem`]).

mod arena;
mod frame;
mod handle;
mod registry;
mod sendbuf;
mod shared;
#[cfg(test)]
mod tests;

pub use arena::{Arena, SharedRegion, ARENA_ALIGN};
pub use frame::{Frame, SharedBytes};
pub use handle::{Access, DomainId, Handle};
pub use registry::{
    arena_offset, GrantEvent, LayoutWatch, Placement, ProtectionError, RegionSpec, Registry,
    RegistryError, RegistryStats,
};
pub use sendbuf::{CacheStats, SendBuf, SendBufCache};
pub use shared::{HeapShared, MemError, SharedMem};
