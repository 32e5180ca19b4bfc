//! The 32-bit immediate data of an RDMA WRITE WITH IMMEDIATE: the transfer indication.
//!
//! Bits 31..24 pool reference, 23..16 element index, 15..0 bytes written. A value that does
//! not fit goes in a BufferRDMAIndicate instead (seed 002).

/// A transfer indication small enough for immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Idata {
    /// Pool reference.
    pub pool_ref: u8,
    /// Element index in the pool.
    pub element: u8,
    /// Bytes written into the element.
    pub length: u16,
}

impl Idata {
    /// The indication, or `None` when a field does not fit (pool or element >= 256,
    /// length >= 65536): the caller then sends a BufferRDMAIndicate.
    pub fn new(pool_ref: u32, element: u32, length: u32) -> Option<Idata> {
        Some(Idata {
            pool_ref: u8::try_from(pool_ref).ok()?,
            element: u8::try_from(element).ok()?,
            length: u16::try_from(length).ok()?,
        })
    }

    /// The 32-bit wire value.
    pub fn to_u32(self) -> u32 {
        (u32::from(self.pool_ref) << 24) | (u32::from(self.element) << 16) | u32::from(self.length)
    }

    /// Decodes a wire value; every value is valid.
    pub fn from_u32(v: u32) -> Idata {
        Idata {
            pool_ref: (v >> 24) as u8,
            element: (v >> 16) as u8,
            length: v as u16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn seed_example() {
        // Fig. 7: pool 7, element 5, 256 bytes.
        let i = Idata::new(7, 5, 256).unwrap();
        assert_eq!(i.to_u32(), 0x0705_0100);
    }

    proptest! {
        #[test]
        fn round_trip(v: u32) {
            prop_assert_eq!(Idata::from_u32(v).to_u32(), v);
        }

        #[test]
        fn fallback_exactly_when_something_does_not_fit(p in 0u32..600, e in 0u32..600, l in 0u32..140_000) {
            let fits = p < 256 && e < 256 && l < 65_536;
            match Idata::new(p, e, l) {
                Some(i) => {
                    prop_assert!(fits);
                    prop_assert_eq!((u32::from(i.pool_ref), u32::from(i.element), u32::from(i.length)), (p, e, l));
                }
                None => prop_assert!(!fits),
            }
        }
    }
}
