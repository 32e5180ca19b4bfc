//! Memory handles, protection domains and access rights.

use std::fmt;

/// A registered region's handle, like an InfiniBand STag: a slot index and a generation.
///
/// The generation is bumped every time the slot is deregistered, so a handle kept across a
/// flush or a reconnect no longer matches and every write through it is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    index: u32,
    generation: u32,
}

impl Handle {
    /// Builds a handle from its parts.
    pub const fn new(index: u32, generation: u32) -> Handle {
        Handle { index, generation }
    }

    /// The registry slot.
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The slot's generation when the handle was issued.
    pub const fn generation(self) -> u32 {
        self.generation
    }

    /// The 64-bit form carried on the wire: index in the high half, generation in the low half.
    pub const fn to_u64(self) -> u64 {
        ((self.index as u64) << 32) | self.generation as u64
    }

    /// Inverse of [`Handle::to_u64`]; every value is a syntactically valid handle.
    pub const fn from_u64(v: u64) -> Handle {
        Handle {
            index: (v >> 32) as u32,
            generation: v as u32,
        }
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.index, self.generation)
    }
}

/// A protection domain: one per peer connection. A region is only writable by the domain
/// that owns it, so host A can never write into the pools registered for host B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainId(pub u64);

impl fmt::Display for DomainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pd{}", self.0)
    }
}

/// Access rights of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access(u8);

impl Access {
    /// Local access only: the region cannot be the target of a remote operation.
    pub const LOCAL: Access = Access(0);
    /// The peer may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(1);

    /// True when every right in `other` is granted by `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn handle_u64_round_trip(index: u32, generation: u32) {
            let h = Handle::new(index, generation);
            prop_assert_eq!(Handle::from_u64(h.to_u64()), h);
        }
    }

    #[test]
    fn access_rights() {
        assert!(Access::REMOTE_WRITE.contains(Access::REMOTE_WRITE));
        assert!(Access::REMOTE_WRITE.contains(Access::LOCAL));
        assert!(!Access::LOCAL.contains(Access::REMOTE_WRITE));
    }
}
