//! The shared-memory set-up a host sends the IOC over the local socket (sans-IO: its bytes
//! and checks; `fabric::shm` passes it with the descriptors).

use super::channel::ring_config;
use super::ring::{ConfigError, RingConfig};
use crate::wire;
use thiserror::Error;

/// Why a set-up is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SetupError {
    /// Not [`SETUP_LEN`] bytes (an answer: not [`ACK_LEN`]).
    #[error("set-up of {0} bytes, not {SETUP_LEN} (an answer: {ACK_LEN})")]
    Length(usize),
    /// Not a set-up.
    #[error("not a shared-memory set-up")]
    Magic,
    /// Another layout version, or reserved bytes set.
    #[error("set-up version {0} (this side speaks {VERSION})")]
    Version(u16),
    /// A ring size outside [`RING_DATA_RANGE`] or not a power of two.
    #[error("rings of {0} bytes (a power of two from {lo} to {hi})", lo = RING_DATA_RANGE.0, hi = RING_DATA_RANGE.1)]
    DataSize(u32),
    /// Records of another size than [`MAX_PAYLOAD`].
    #[error("records of {0} bytes (not {MAX_PAYLOAD})")]
    MaxPayload(u32),
    /// A pool arena outside [`POOL_RANGE`] (and not 0, a control channel's).
    #[error("a pool arena of {0} pages of 4 KiB (from {lo} to {hi} bytes, or none)", lo = POOL_RANGE.0, hi = POOL_RANGE.1)]
    PoolSize(u32),
}

/// Bytes of a set-up.
pub const SETUP_LEN: usize = 20;

/// The channel number a Hello names for a data channel over shared memory (local socket
/// only).
pub const SHM_CHANNEL: u8 = 2;
/// The channel number a Hello names for a control channel over shared memory (local socket
/// only): its set-up has no pool arena, and its rings are [`RING_DATA_CONTROL`] bytes.
pub const SHM_CONTROL_CHANNEL: u8 = 3;
/// The set-up message's magic: the bytes `SNSH`.
pub const MAGIC: [u8; 4] = *b"SNSH";
/// The set-up layout version (3: the set-up connection is the doorbell, and no doorbell
/// descriptor travels; 2 passed an `eventfd` each way).
pub const VERSION: u16 = 3;
/// The IOC's answer to an accepted set-up: these 4 bytes, then the size of its own pool
/// arena for this host (u32, big-endian).
pub const ACK: [u8; 4] = *b"SNOK";
/// Bytes of the IOC's answer.
pub const ACK_LEN: usize = 8;
/// Each ring's data area as a host sets it up: 2 MiB (about 30 largest frames, 1,400 of
/// 1,500 bytes).
pub const RING_DATA: u32 = 2 << 20;
/// Each control ring's data area: 256 KiB, room for the largest message twice, and for
/// hundreds of credit updates.
pub const RING_DATA_CONTROL: u32 = 256 << 10;
/// The smallest and largest data areas the IOC accepts: it maps four per host (two for each
/// channel), so a host costs it at most 8 MiB of ring memory.
pub const RING_DATA_RANGE: (u32, u32) = (RING_DATA_CONTROL, 2 << 20);
/// The smallest and largest pool arenas (receive pools in shared memory) either side maps:
/// room for the largest pools a configuration allows (`pools.max_granted_bytes`, at most
/// 4 GiB). Mapping one costs address space; the pages the mapper writes (elements the peer
/// granted it) are charged to it as its own memory would be.
pub const POOL_RANGE: (u64, u64) = (1 << 20, 8 << 30);
/// The page size a pool arena is a multiple of, and the unit its size travels in.
pub const PAGE: u64 = 4096;
/// Room an arena keeps beyond its pools' bytes: each pool starts on a 64-byte boundary.
const POOL_SLACK: u64 = 64 << 10;
/// Largest operation payload a ring carries: a SendData or a frame's RDMA write.
pub const MAX_PAYLOAD: u32 = wire::MAX_MESSAGE_LEN as u32;

/// What the host proposes: the rings' geometry (both rings alike) and the size of its pool
/// arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// Each ring's data area in bytes.
    pub data_size: u32,
    /// Largest record payload (an operation header and its payload).
    pub max_payload: u32,
    /// Bytes of the host's pool arena, where the IOC places its writes: a multiple of
    /// [`PAGE`] within [`POOL_RANGE`] for a data channel, 0 (none) for a control channel.
    pub pool_size: u64,
}

impl Setup {
    /// Its [`SETUP_LEN`] bytes: magic, version (u16), reserved (u16), data size, largest
    /// payload, pool arena size in pages, all big-endian.
    pub fn emit(&self) -> [u8; SETUP_LEN] {
        let mut b = [0u8; SETUP_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[8..12].copy_from_slice(&self.data_size.to_be_bytes());
        b[12..16].copy_from_slice(&self.max_payload.to_be_bytes());
        b[16..20].copy_from_slice(&pages(self.pool_size).to_be_bytes());
        b
    }

    /// The pool arena for pools of `bytes` in all: with room for their alignment, rounded
    /// up to pages, within [`POOL_RANGE`].
    pub fn pool_size_for(bytes: u64) -> u64 {
        let (lo, hi) = POOL_RANGE;
        (bytes.min(hi) + POOL_SLACK)
            .next_multiple_of(PAGE)
            .clamp(lo, hi)
    }

    /// Parses and checks a set-up against the IOC's limits.
    pub fn parse(b: &[u8]) -> Result<Setup, SetupError> {
        let b: &[u8; SETUP_LEN] = b.try_into().map_err(|_| SetupError::Length(b.len()))?;
        if b[..4] != MAGIC {
            return Err(SetupError::Magic);
        }
        let version = u16::from_be_bytes([b[4], b[5]]);
        if version != VERSION || b[6..8] != [0, 0] {
            return Err(SetupError::Version(version));
        }
        let data_size = u32::from_be_bytes([b[8], b[9], b[10], b[11]]);
        let max_payload = u32::from_be_bytes([b[12], b[13], b[14], b[15]]);
        let (lo, hi) = RING_DATA_RANGE;
        if !data_size.is_power_of_two() || !(lo..=hi).contains(&data_size) {
            return Err(SetupError::DataSize(data_size));
        }
        if max_payload != MAX_PAYLOAD {
            return Err(SetupError::MaxPayload(max_payload));
        }
        let pool_size = pool_bytes(u32::from_be_bytes([b[16], b[17], b[18], b[19]]))?;
        Ok(Setup {
            data_size,
            max_payload,
            pool_size,
        })
    }

    /// The IOC's answer, with the size of its pool arena (bytes, a multiple of [`PAGE`]; 0
    /// for a control channel).
    pub fn emit_ack(pool_size: u64) -> [u8; ACK_LEN] {
        let mut b = [0u8; ACK_LEN];
        b[..4].copy_from_slice(&ACK);
        b[4..].copy_from_slice(&pages(pool_size).to_be_bytes());
        b
    }

    /// The size in bytes of the IOC's pool arena from its answer, checked as the host's is.
    pub fn parse_ack(b: &[u8]) -> Result<u64, SetupError> {
        let b: &[u8; ACK_LEN] = b.try_into().map_err(|_| SetupError::Length(b.len()))?;
        if b[..4] != ACK {
            return Err(SetupError::Magic);
        }
        pool_bytes(u32::from_be_bytes([b[4], b[5], b[6], b[7]]))
    }

    /// The rings' configuration.
    pub fn ring(&self) -> Result<RingConfig, ConfigError> {
        ring_config(self.data_size, self.max_payload)
    }
}

/// Pages of an arena of `bytes` (within [`POOL_RANGE`], so the count fits u32).
fn pages(bytes: u64) -> u32 {
    u32::try_from(bytes / PAGE).unwrap_or(u32::MAX)
}

/// The bytes of an arena of `pages` pages, if within [`POOL_RANGE`] or none (0).
fn pool_bytes(pages: u32) -> Result<u64, SetupError> {
    let bytes = u64::from(pages) * PAGE;
    let (lo, hi) = POOL_RANGE;
    match bytes == 0 || (lo..=hi).contains(&bytes) {
        true => Ok(bytes),
        false => Err(SetupError::PoolSize(pages)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_hosts_set_up_is_accepted_and_each_field_checked() {
        let good = Setup {
            data_size: RING_DATA,
            max_payload: MAX_PAYLOAD,
            pool_size: 64 << 20,
        };
        let b = good.emit();
        assert_eq!(Setup::parse(&b), Ok(good));
        assert!(good.ring().is_ok());
        assert_eq!(Setup::parse(&b[..19]), Err(SetupError::Length(19)));
        let with = |at: usize, v: &[u8]| {
            let mut x = b;
            x[at..at + v.len()].copy_from_slice(v);
            Setup::parse(&x)
        };
        assert_eq!(with(0, b"SNSX"), Err(SetupError::Magic));
        assert_eq!(with(4, &1u16.to_be_bytes()), Err(SetupError::Version(1)));
        // Version 2 passed eventfd doorbells: refused.
        assert_eq!(with(4, &2u16.to_be_bytes()), Err(SetupError::Version(2)));
        assert_eq!(with(6, &[0, 1]), Err(SetupError::Version(VERSION)));
        for bad in [0u32, 3 << 20, RING_DATA_RANGE.0 / 2, RING_DATA_RANGE.1 * 2] {
            assert_eq!(with(8, &bad.to_be_bytes()), Err(SetupError::DataSize(bad)));
        }
        assert_eq!(
            with(12, &7u32.to_be_bytes()),
            Err(SetupError::MaxPayload(7))
        );
        // Pages: 255 is below 1 MiB, 2 Mi + 1 beyond 8 GiB.
        for bad in [1u32, 255, (2 << 20) + 1, u32::MAX] {
            assert_eq!(with(16, &bad.to_be_bytes()), Err(SetupError::PoolSize(bad)));
        }
        // None: a control channel's set-up, with its smaller rings.
        let control = Setup {
            data_size: RING_DATA_CONTROL,
            max_payload: MAX_PAYLOAD,
            pool_size: 0,
        };
        assert_eq!(Setup::parse(&control.emit()), Ok(control));
        assert!(control.ring().is_ok());
        assert_eq!(Setup::parse_ack(&Setup::emit_ack(0)), Ok(0));
        assert_eq!(Setup::pool_size_for(0), 1 << 20);
        assert_eq!(Setup::pool_size_for(64 << 20), (64 << 20) + (64 << 10));
        assert_eq!(
            Setup::pool_size_for((64 << 20) + 1),
            (64 << 20) + (68 << 10)
        );
        // The largest pools a configuration allows (4 GiB) fit.
        assert!(Setup::pool_size_for(4 << 30) > 4 << 30);
        assert_eq!(Setup::pool_size_for(u64::MAX), 8 << 30);
        let ack = Setup::emit_ack(8 << 20);
        assert_eq!(Setup::parse_ack(&ack), Ok(8 << 20));
        assert_eq!(Setup::parse_ack(&ack[..4]), Err(SetupError::Length(4)));
        let mut bad = ack;
        bad[0] = b'X';
        assert_eq!(Setup::parse_ack(&bad), Err(SetupError::Magic));
        let tiny = Setup::emit_ack(4096);
        assert_eq!(Setup::parse_ack(&tiny), Err(SetupError::PoolSize(1)));
    }

    proptest! {
        /// Whatever the bytes: an error, or a set-up whose rings can be built.
        #[test]
        fn any_bytes_parse_to_an_error_or_usable_rings(b in proptest::collection::vec(any::<u8>(), 0..28)) {
            if let Ok(s) = Setup::parse(&b) {
                prop_assert!(s.ring().is_ok());
                prop_assert_eq!(&s.emit()[..], &b[..]);
            }
        }
    }
}
