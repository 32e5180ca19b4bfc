//! Registered memory: handles, protection domains, regions and the send-buffer cache.

mod handle;
mod registry;
mod sendbuf;
#[cfg(test)]
mod tests;

pub use handle::{Access, DomainId, Handle};
pub use registry::{
    Placement, ProtectionError, RegionSpec, Registry, RegistryError, RegistryStats,
};
pub use sendbuf::{CacheStats, SendBuf, SendBufCache};
