//! A single-producer single-consumer ring of variable-length records in shared memory.
//!
//! One side writes records ([`Producer`]), the other reads them ([`Consumer`]); a duplex
//! transport uses two rings. Either side may be hostile: everything read from the region is
//! checked before use, a record is copied into private memory once before anything parses
//! it (the shared bytes are never read twice, cf. Xen XSA-155), and any inconsistency is a
//! [`RingError`] after which the side stays broken and the caller cuts the peer off.
//!
//! # Layout
//!
//! The region is `HEADER_LEN` (192) bytes of header followed by a data area of
//! `data_size` bytes, a power of two between [`MIN_DATA_SIZE`] and [`MAX_DATA_SIZE`]. All
//! integers are `u32`, little-endian, at 4-byte aligned offsets. For `head` and `tail` to
//! sit on separate cache lines the region should start 64-byte aligned (a mapping does).
//!
//! | offset | field        | written by | meaning |
//! |--------|--------------|------------|---------|
//! | 0      | `magic`      | creator    | [`MAGIC`], the bytes `SNRG` |
//! | 4      | `version`    | creator    | [`VERSION`] (2) |
//! | 8      | `data_size`  | creator    | size of the data area in bytes |
//! | 12     | `max_record` | creator    | largest record payload in bytes |
//! | 16-63  | reserved     | creator    | zero |
//! | 64     | `head`       | producer   | bytes ever published (own cache line, 64-127) |
//! | 72     | `space`      | producer   | space request: `tail + 1` armed, even = not armed |
//! | 128    | `tail`       | consumer   | bytes ever consumed (own cache line, 128-191) |
//! | 132    | `wake`       | consumer   | doorbell request: `tail + 1` armed, even = not armed |
//! | 192    | data area    | producer   | `data_size` bytes of records |
//!
//! The creator writes the header and zeroes `head`, `space`, `tail` and `wake`
//! ([`RingConfig::init`]).
//! Both sides learn `data_size` and `max_record` out of band (from their configuration or a
//! handshake) and only compare the header against them when attaching: the values actually
//! used are private copies, never re-read.
//!
//! `head` and `tail` are free-running byte counters: they wrap at 2^32, the byte at counter
//! `c` lives at data offset `c & (data_size - 1)`, both are multiples of 8, and
//! `head - tail` (wrapping) is the number of bytes published but not yet consumed, which must
//! never exceed `data_size`.
//!
//! # Records
//!
//! A record is an 8-byte header, `len: u32` then `kind: u32`, followed by `len` payload
//! bytes and padding up to the next multiple of 8 (the padding's content is unspecified).
//! A record occupies `8 + round_up(len, 8)` bytes and never straddles the end of the data
//! area: when it does not fit before the end, the producer first writes a PAD record
//! (`kind` [`KIND_PAD`] = 0, `len` = bytes left before the end minus 8) and puts the record
//! at offset 0. A PAD record is never written at offset 0. Kinds `1..=max_kind` are the
//! user's; `len` is at most `max_record`, and `8 + round_up(max_record, 8)` is at most
//! `data_size / 2`, so a record always fits in an empty ring.
//!
//! # Ordering
//!
//! The producer writes record bytes with plain (relaxed) stores, then publishes them by
//! storing `head` with `Release`. The consumer loads `head` with `Acquire` before reading
//! the bytes below it, and publishes their consumption by storing `tail` with `Release`
//! after it has copied them; the producer loads `tail` with `Acquire` before reusing space.
//!
//! # Doorbell suppression (virtio event-idx style)
//!
//! A consumer that found the ring empty and wants to sleep stores `wake = tail | 1`, issues
//! a sequentially consistent fence, and loads `head` again: if `head != tail`, data arrived
//! meanwhile, it clears `wake` (stores `tail`) and keeps polling instead of sleeping. After
//! publishing a new `head` the producer issues a sequentially consistent fence, loads `wake`,
//! and rings the doorbell (a byte on the connection, outside this module) only if `wake` is armed
//! (bit 0 set) and the event index `e = wake & !1` lies in `[old_head, new_head)`, computed
//! as `new - e - 1 < new - old` in wrapping arithmetic. The two fences make it impossible for
//! both the consumer to miss the new `head` and the producer to miss the armed `wake`, so no
//! wake-up is lost; and only the first publication after the consumer armed rings the bell.
//! A woken consumer clears `wake` ([`Consumer::wake`]).
//!
//! The other way, a producer that found the ring full and wants to sleep until the consumer
//! frees space stores `space = tail | 1` (the tail it last saw), issues a sequentially
//! consistent fence, and loads `tail` again: if it moved, it clears `space` and retries.
//! After consuming, the consumer issues a sequentially consistent fence, loads `space`, and
//! rings the producer's doorbell if `space` is armed and its event index lies in the range
//! of tails it moved across since it last looked ([`Consumer::space_requested`]). Same
//! fences, same argument: no wake-up is lost. A woken producer clears `space`
//! ([`Producer::wake_space`]).
//!
//! # What cuts a peer off
//!
//! The consumer refuses ([`RingError`]) a `head` that is not a multiple of 8 or more than
//! `data_size` ahead of its tail, a record whose kind is unknown, whose `len` exceeds
//! `max_record`, that runs past the end of the data area or past `head`, and a PAD record
//! that does not exactly fill the end of the data area or sits at offset 0. The producer
//! refuses a `tail` that is not a multiple of 8 or outside `[head - data_size, head]`.
//! Each side checks the header against its own configuration when attaching.

use crate::memory::{MemError, SharedMem};
use std::sync::atomic::{fence, Ordering};
use thiserror::Error;

/// Bytes of ring header before the data area.
pub const HEADER_LEN: usize = 192;
/// Bytes of a record header (`len`, `kind`).
pub const RECORD_HEADER_LEN: usize = 8;
/// The kind of a PAD record, which fills the end of the data area.
pub const KIND_PAD: u32 = 0;
/// The header's `magic` value: the bytes `SNRG` read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SNRG");
/// The layout version described in this module.
pub const VERSION: u32 = 2;
/// The smallest data area.
pub const MIN_DATA_SIZE: u32 = 64;
/// The largest data area (so `head - tail` comparisons never overflow).
pub const MAX_DATA_SIZE: u32 = 1 << 30;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_DATA_SIZE: usize = 8;
const OFF_MAX_RECORD: usize = 12;
const OFF_HEAD: usize = 64;
const OFF_SPACE: usize = 72;
const OFF_TAIL: usize = 128;
const OFF_WAKE: usize = 132;
const ARMED: u32 = 1;
const REC: u32 = RECORD_HEADER_LEN as u32;

/// A ring configuration both sides agree on out of band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    data_size: u32,
    max_record: u32,
    max_kind: u32,
}

/// Why a [`RingConfig`] is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The data area is not a power of two in the allowed range.
    #[error(
        "ring data size {0} is not a power of two between {MIN_DATA_SIZE} and {MAX_DATA_SIZE}"
    )]
    DataSize(u32),
    /// A largest record would not fit twice in the data area.
    #[error("records of {max_record} bytes are too large for a {data_size}-byte ring")]
    MaxRecord {
        /// The requested largest payload.
        max_record: u32,
        /// The data area.
        data_size: u32,
    },
    /// No user kind (kinds start at 1).
    #[error("max_kind must be at least 1")]
    MaxKind,
}

impl RingConfig {
    /// A data area of `data_size` bytes, payloads of at most `max_record` bytes and record
    /// kinds `1..=max_kind`.
    pub fn new(data_size: u32, max_record: u32, max_kind: u32) -> Result<RingConfig, ConfigError> {
        if !data_size.is_power_of_two() || !(MIN_DATA_SIZE..=MAX_DATA_SIZE).contains(&data_size) {
            return Err(ConfigError::DataSize(data_size));
        }
        if u64::from(REC) + u64::from(max_record).next_multiple_of(8) > u64::from(data_size / 2) {
            return Err(ConfigError::MaxRecord {
                max_record,
                data_size,
            });
        }
        if max_kind == 0 {
            return Err(ConfigError::MaxKind);
        }
        Ok(RingConfig {
            data_size,
            max_record,
            max_kind,
        })
    }

    /// Size of the data area in bytes.
    pub fn data_size(&self) -> u32 {
        self.data_size
    }

    /// The largest record payload in bytes.
    pub fn max_record(&self) -> u32 {
        self.max_record
    }

    /// The largest user record kind.
    pub fn max_kind(&self) -> u32 {
        self.max_kind
    }

    /// Bytes of shared memory the ring needs (header and data area).
    pub fn region_len(&self) -> usize {
        HEADER_LEN + self.data_size as usize
    }

    /// Writes a fresh header (empty ring, not armed) at the start of `mem`.
    pub fn init<M: SharedMem + ?Sized>(&self, mem: &M) -> Result<(), RingError> {
        self.check_len(mem)?;
        mem.write(0, &[0; HEADER_LEN])?;
        mem.store_u32(OFF_MAGIC, MAGIC)?;
        mem.store_u32(OFF_VERSION, VERSION)?;
        mem.store_u32(OFF_DATA_SIZE, self.data_size)?;
        mem.store_u32(OFF_MAX_RECORD, self.max_record)?;
        Ok(())
    }

    fn check_len<M: SharedMem + ?Sized>(&self, mem: &M) -> Result<(), RingError> {
        if mem.len() < self.region_len() {
            return Err(MemError::OutOfBounds {
                off: 0,
                len: self.region_len(),
                size: mem.len(),
            }
            .into());
        }
        Ok(())
    }

    /// Compares the header in `mem` with this configuration.
    fn check_header<M: SharedMem + ?Sized>(&self, mem: &M) -> Result<(), RingError> {
        self.check_len(mem)?;
        for (field, off, expected) in [
            ("magic", OFF_MAGIC, MAGIC),
            ("version", OFF_VERSION, VERSION),
            ("data_size", OFF_DATA_SIZE, self.data_size),
            ("max_record", OFF_MAX_RECORD, self.max_record),
        ] {
            let found = mem.load_u32(off)?;
            if found != expected {
                return Err(RingError::Header {
                    field,
                    found,
                    expected,
                });
            }
        }
        Ok(())
    }

    fn mask(&self) -> u32 {
        self.data_size - 1
    }
}

/// A violation of the ring protocol by the peer (or a region that is not a ring): the
/// caller cuts the peer off. Once returned, the side keeps returning it (except for a read
/// outside the held record, [`Consumer::read`], which is this side's mistake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RingError {
    /// The region is too small.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// A header field differs from the configuration.
    #[error("ring header field {field} is {found:#x}, expected {expected:#x}")]
    Header {
        /// The field's name.
        field: &'static str,
        /// The value in shared memory.
        found: u32,
        /// The configured value.
        expected: u32,
    },
    /// The peer's index is misaligned or out of range of ours.
    #[error("ring indices out of range: head {head:#x}, tail {tail:#x}")]
    Indices {
        /// Producer index (the private one on the producer's side).
        head: u32,
        /// Consumer index (the private one on the consumer's side).
        tail: u32,
    },
    /// A record longer than the configured maximum.
    #[error("ring record of {len} bytes exceeds the {max}-byte limit")]
    TooLong {
        /// The record's `len`.
        len: u32,
        /// The configured maximum.
        max: u32,
    },
    /// A record of a kind the consumer does not know.
    #[error("unknown ring record kind {0}")]
    UnknownKind(u32),
    /// A record running past the end of the data area.
    #[error("ring record of {total} bytes at offset {off} runs past the end of the data area")]
    Straddles {
        /// Offset of the record in the data area.
        off: u32,
        /// Bytes the record occupies.
        total: u32,
    },
    /// A record running past the published head.
    #[error("ring record of {total} bytes but only {avail} bytes published")]
    Truncated {
        /// Bytes the record occupies.
        total: u32,
        /// Bytes published and not consumed.
        avail: u32,
    },
    /// A PAD record that does not exactly fill the end of the data area.
    #[error("PAD record of {len} bytes at offset {off} does not fill the end of the data area")]
    BadPad {
        /// Offset of the record in the data area.
        off: u32,
        /// The record's `len`.
        len: u32,
    },
}

/// Why [`Producer::push`] refused a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PushError {
    /// Not enough free space now; retry once the consumer has made progress.
    #[error("ring full")]
    Full,
    /// The payload exceeds the configured maximum (never fits).
    #[error("record of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The configured maximum.
        max: u32,
    },
    /// The kind is PAD or above the configured maximum.
    #[error("record kind {0} cannot be pushed")]
    BadKind(u32),
    /// The consumer broke the protocol.
    #[error(transparent)]
    Peer(#[from] RingError),
}

/// The outcome of publishing records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Pushed {
    /// The consumer asked to be woken: ring the doorbell.
    pub notify: bool,
}

/// A record taken by [`Consumer::pop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The record's kind, in `1..=max_kind`.
    pub kind: u32,
    /// The payload's length, at most `max_record`.
    pub len: usize,
}

/// `true` if the event index `event` lies in `[old, new)` (wrapping).
fn need_event(event: u32, new: u32, old: u32) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The writing side of a ring.
#[derive(Debug)]
pub struct Producer<M> {
    mem: M,
    cfg: RingConfig,
    /// Bytes written, published or not.
    head: u32,
    /// Bytes published (the value of `head` in shared memory).
    published: u32,
    /// The consumer's tail as last loaded and checked.
    tail: u32,
    broken: Option<RingError>,
}

impl<M: SharedMem> Producer<M> {
    /// Attaches to the ring in `mem` (initialised by [`RingConfig::init`]), taking `head` and
    /// `tail` from it.
    pub fn attach(mem: M, cfg: RingConfig) -> Result<Producer<M>, RingError> {
        cfg.check_header(&mem)?;
        let head = mem.load_u32(OFF_HEAD)?;
        let tail = mem.load_u32(OFF_TAIL)?;
        if !head.is_multiple_of(REC)
            || !tail.is_multiple_of(REC)
            || head.wrapping_sub(tail) > cfg.data_size
        {
            return Err(RingError::Indices { head, tail });
        }
        Ok(Producer {
            mem,
            cfg,
            head,
            published: head,
            tail,
            broken: None,
        })
    }

    /// Writes a record of `kind` whose payload is the concatenation of `parts`, publishes
    /// it, and says whether to ring the doorbell.
    pub fn push(&mut self, kind: u32, parts: &[&[u8]]) -> Result<Pushed, PushError> {
        self.stage(kind, parts)?;
        Ok(self.publish()?)
    }

    /// Writes a record without publishing it: several staged records are published at once
    /// by [`Producer::publish`] (one `head` store, at most one doorbell).
    pub fn stage(&mut self, kind: u32, parts: &[&[u8]]) -> Result<(), PushError> {
        if let Some(e) = self.broken {
            return Err(e.into());
        }
        if kind == KIND_PAD || kind > self.cfg.max_kind {
            return Err(PushError::BadKind(kind));
        }
        let len = parts
            .iter()
            .try_fold(0usize, |acc, p| acc.checked_add(p.len()))
            .unwrap_or(usize::MAX);
        let max = self.cfg.max_record;
        let len32 = match u32::try_from(len) {
            Ok(l) if l <= max => l,
            _ => return Err(PushError::TooLarge { len, max }),
        };
        let total = REC + len32.next_multiple_of(8);
        let off = self.head & self.cfg.mask();
        let to_end = self.cfg.data_size - off;
        let pad = if total > to_end { to_end } else { 0 };
        if self.free() < pad + total {
            self.reload_tail()?;
            if self.free() < pad + total {
                return Err(PushError::Full);
            }
        }
        if pad != 0 {
            self.write_header(off, pad - REC, KIND_PAD)?;
            self.head = self.head.wrapping_add(pad);
        }
        let off = self.head & self.cfg.mask();
        self.write_header(off, len32, kind)?;
        let mut at = HEADER_LEN + off as usize + RECORD_HEADER_LEN;
        for p in parts {
            self.mem.copy_in(at, p).map_err(RingError::from)?;
            at += p.len();
        }
        self.head = self.head.wrapping_add(total);
        Ok(())
    }

    /// Publishes the staged records and says whether to ring the doorbell.
    pub fn publish(&mut self) -> Result<Pushed, RingError> {
        let Some(old) = self.publish_head()? else {
            return Ok(Pushed { notify: false });
        };
        fence(Ordering::SeqCst);
        Ok(Pushed {
            notify: self.wake_requested(old)?,
        })
    }

    /// Asks the consumer to ring the doorbell once it frees space (after a push found the
    /// ring full). Returns `true` if the caller may now sleep until the doorbell rings,
    /// `false` if space was freed meanwhile (the request is withdrawn: push again).
    pub fn prepare_wait_space(&mut self) -> bool {
        if self.broken.is_some() || self.arm_space().is_err() {
            return false;
        }
        fence(Ordering::SeqCst);
        if self.recheck_space() {
            true
        } else {
            self.wake_space();
            false
        }
    }

    /// Stores the space request at the tail last seen.
    pub(super) fn arm_space(&self) -> Result<(), RingError> {
        Ok(self.mem.store_u32(OFF_SPACE, self.tail | ARMED)?)
    }

    /// `true` if the consumer has not moved since the tail last seen (reloaded and checked).
    pub(super) fn recheck_space(&mut self) -> bool {
        let seen = self.tail;
        matches!(self.reload_tail(), Ok(()) if self.tail == seen)
    }

    /// Withdraws the space request (after the doorbell rang, or when giving up sleeping).
    pub fn wake_space(&mut self) {
        // Cannot fail: the region's length was checked when attaching.
        let _ = self.mem.store_u32(OFF_SPACE, self.tail);
    }

    /// The consumer's tail as last loaded (and checked): it moves when the consumer has
    /// freed room this side looked for.
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Free bytes as far as the producer knows (the consumer may have freed more).
    pub fn free(&self) -> u32 {
        self.cfg.data_size - self.head.wrapping_sub(self.tail)
    }

    /// The shared memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Stores `head` if records are staged; returns the previous published head.
    pub(super) fn publish_head(&mut self) -> Result<Option<u32>, RingError> {
        if let Some(e) = self.broken {
            return Err(e);
        }
        if self.head == self.published {
            return Ok(None);
        }
        self.mem.store_u32(OFF_HEAD, self.head)?;
        let old = self.published;
        self.published = self.head;
        Ok(Some(old))
    }

    /// Whether the consumer armed `wake` with an event index the last publication crossed.
    pub(super) fn wake_requested(&self, old: u32) -> Result<bool, RingError> {
        let wake = self.mem.load_u32(OFF_WAKE)?;
        Ok(wake & ARMED != 0 && need_event(wake & !ARMED, self.published, old))
    }

    fn reload_tail(&mut self) -> Result<(), RingError> {
        let tail = self.mem.load_u32(OFF_TAIL)?;
        // The consumer may only have consumed published bytes, and never more than a ring
        // behind what we wrote.
        let lag = self.head.wrapping_sub(self.published);
        if !tail.is_multiple_of(REC) || self.published.wrapping_sub(tail) > self.cfg.data_size - lag
        {
            let e = RingError::Indices {
                head: self.head,
                tail,
            };
            self.broken = Some(e);
            return Err(e);
        }
        self.tail = tail;
        Ok(())
    }

    fn write_header(&self, off: u32, len: u32, kind: u32) -> Result<(), RingError> {
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[..4].copy_from_slice(&len.to_le_bytes());
        h[4..].copy_from_slice(&kind.to_le_bytes());
        Ok(self.mem.write(HEADER_LEN + off as usize, &h)?)
    }
}

/// The reading side of a ring.
#[derive(Debug)]
pub struct Consumer<M> {
    mem: M,
    cfg: RingConfig,
    /// Bytes consumed (the value of `tail` in shared memory).
    tail: u32,
    /// `tail` when [`Consumer::space_requested`] last looked.
    space_checked: u32,
    /// The producer's head as last loaded and checked.
    head: u32,
    /// The record [`Consumer::peek`] checked and has not consumed yet.
    held: Option<Held>,
    broken: Option<RingError>,
}

/// A checked record still in the ring: its header was read once, privately.
#[derive(Debug, Clone, Copy)]
struct Held {
    record: Record,
    /// Offset of its payload in the region.
    at: usize,
    /// Bytes it occupies in the data area (header, payload, padding).
    total: u32,
}

impl<M: SharedMem> Consumer<M> {
    /// Attaches to the ring in `mem` (initialised by [`RingConfig::init`]), taking `tail`
    /// from it.
    pub fn attach(mem: M, cfg: RingConfig) -> Result<Consumer<M>, RingError> {
        cfg.check_header(&mem)?;
        let tail = mem.load_u32(OFF_TAIL)?;
        if !tail.is_multiple_of(REC) {
            return Err(RingError::Indices { head: tail, tail });
        }
        Ok(Consumer {
            mem,
            cfg,
            tail,
            space_checked: tail,
            head: tail,
            held: None,
            broken: None,
        })
    }

    /// Copies the next record's payload into `buf` (replacing its contents; its capacity
    /// grows to at most `max_record`) and returns the record, or `None` (leaving `buf` as
    /// it is) if the ring is empty.
    pub fn pop(&mut self, buf: &mut Vec<u8>) -> Result<Option<Record>, RingError> {
        let r = self.peek().and_then(|rec| {
            let Some(rec) = rec else { return Ok(None) };
            buf.clear();
            buf.reserve_exact(rec.len);
            buf.resize(rec.len, 0);
            self.copy_out(0, buf)?;
            self.consume()?;
            Ok(Some(rec))
        });
        if r.is_err() {
            buf.clear();
        }
        r
    }

    /// Checks the next record and holds it in the ring until [`Consumer::consume`]: the
    /// caller copies out what it parses with [`Consumer::read`] and the rest with
    /// [`Consumer::copy_out`], straight to where it belongs
    /// (an RDMA write's element), each byte once. `None` if the ring is empty. While a
    /// record is held, this returns it again without re-reading anything.
    pub fn peek(&mut self) -> Result<Option<Record>, RingError> {
        if let Some(e) = self.broken {
            return Err(e);
        }
        if let Some(h) = self.held {
            return Ok(Some(h.record));
        }
        match self.peek_inner() {
            Ok(h) => {
                self.held = h;
                Ok(h.map(|h| h.record))
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Copies `buf.len()` bytes of the held record's payload, from payload offset `at`,
    /// into `buf`, with atomic loads ([`SharedMem::read`]): for bytes the caller parses.
    /// Reading past the payload, or with no record held, is an error that leaves the ring
    /// usable (it is this side's mistake, not the peer's).
    pub fn read(&mut self, at: usize, buf: &mut [u8]) -> Result<(), RingError> {
        let at = self.held_range(at, buf.len())?;
        self.mem.read(at, buf).map_err(|e| self.fail(e.into()))
    }

    /// As [`Consumer::read`], for bytes carried to private memory unparsed (a payload):
    /// the memory may copy them with `memcpy` ([`SharedMem::copy_out`]).
    pub fn copy_out(&mut self, at: usize, buf: &mut [u8]) -> Result<(), RingError> {
        let at = self.held_range(at, buf.len())?;
        self.mem.copy_out(at, buf).map_err(|e| self.fail(e.into()))
    }

    /// The region offset of `len` bytes at payload offset `at` of the held record.
    fn held_range(&self, at: usize, len: usize) -> Result<usize, RingError> {
        let h = self.held.ok_or(RingError::Mem(MemError::OutOfBounds {
            off: at,
            len,
            size: 0,
        }))?;
        MemError::check(at, len, h.record.len)?;
        Ok(h.at + at)
    }

    /// Gives the held record's space back to the producer (a no-op if none is held).
    pub fn consume(&mut self) -> Result<(), RingError> {
        match self.held.take() {
            Some(h) => self.advance(h.total).map_err(|e| self.fail(e)),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: RingError) -> RingError {
        self.broken = Some(e);
        self.held = None;
        e
    }

    /// Whether a record may be waiting, without asking for the doorbell: one load of
    /// `head`, for a caller that polls before it sleeps. `true` too when the ring is broken,
    /// so that the caller pops and sees the error.
    pub fn pending(&self) -> bool {
        self.broken.is_some()
            || self.held.is_some()
            || self.head != self.tail
            || self.mem.load_u32(OFF_HEAD) != Ok(self.tail)
    }

    /// Asks the producer to ring the doorbell on its next publication. Returns `true` if the
    /// caller may now sleep until the doorbell rings, `false` if records are (or may be)
    /// waiting, in which case the request is withdrawn and the caller keeps calling
    /// [`Consumer::pop`] (which reports a broken ring).
    pub fn prepare_sleep(&mut self) -> bool {
        if self.broken.is_some() || self.head != self.tail || self.arm().is_err() {
            return false;
        }
        fence(Ordering::SeqCst);
        match self.recheck() {
            Ok(true) => true,
            _ => {
                self.wake();
                false
            }
        }
    }

    /// Whether the producer asked for a doorbell when space is freed, and the records
    /// consumed since the last call freed it: the caller then rings the producer's doorbell.
    pub fn space_requested(&mut self) -> bool {
        if self.tail == self.space_checked {
            return false;
        }
        fence(Ordering::SeqCst);
        let old = std::mem::replace(&mut self.space_checked, self.tail);
        match self.mem.load_u32(OFF_SPACE) {
            Ok(space) => space & ARMED != 0 && need_event(space & !ARMED, self.tail, old),
            Err(_) => false,
        }
    }

    /// Withdraws the doorbell request (after the doorbell rang, or when giving up sleeping).
    pub fn wake(&mut self) {
        // Cannot fail: the region's length was checked when attaching.
        let _ = self.mem.store_u32(OFF_WAKE, self.tail);
    }

    /// The shared memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    pub(super) fn arm(&self) -> Result<(), RingError> {
        Ok(self.mem.store_u32(OFF_WAKE, self.tail | ARMED)?)
    }

    /// `true` if the ring is still empty.
    pub(super) fn recheck(&self) -> Result<bool, RingError> {
        Ok(self.mem.load_u32(OFF_HEAD)? == self.tail)
    }

    /// Loads and checks the producer's head.
    fn reload_head(&mut self) -> Result<(), RingError> {
        let head = self.mem.load_u32(OFF_HEAD)?;
        if !head.is_multiple_of(REC) || head.wrapping_sub(self.tail) > self.cfg.data_size {
            return Err(RingError::Indices {
                head,
                tail: self.tail,
            });
        }
        self.head = head;
        Ok(())
    }

    fn advance(&mut self, n: u32) -> Result<(), RingError> {
        self.tail = self.tail.wrapping_add(n);
        Ok(self.mem.store_u32(OFF_TAIL, self.tail)?)
    }

    fn peek_inner(&mut self) -> Result<Option<Held>, RingError> {
        // At most one PAD record precedes a record, so this runs at most twice.
        loop {
            if self.tail == self.head {
                self.reload_head()?;
                if self.tail == self.head {
                    return Ok(None);
                }
            }
            let avail = self.head.wrapping_sub(self.tail);
            let off = self.tail & self.cfg.mask();
            let to_end = self.cfg.data_size - off;
            // The one read of the record header: parsed from this private copy only.
            let mut h = [0u8; RECORD_HEADER_LEN];
            self.mem.read(HEADER_LEN + off as usize, &mut h)?;
            let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let kind = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            if kind == KIND_PAD {
                if off == 0 || len != to_end - REC {
                    return Err(RingError::BadPad { off, len });
                }
                if to_end > avail {
                    return Err(RingError::Truncated {
                        total: to_end,
                        avail,
                    });
                }
                self.advance(to_end)?;
                continue;
            }
            if kind > self.cfg.max_kind {
                return Err(RingError::UnknownKind(kind));
            }
            if len > self.cfg.max_record {
                return Err(RingError::TooLong {
                    len,
                    max: self.cfg.max_record,
                });
            }
            let total = REC + len.next_multiple_of(8);
            if total > to_end {
                return Err(RingError::Straddles { off, total });
            }
            if total > avail {
                return Err(RingError::Truncated { total, avail });
            }
            return Ok(Some(Held {
                record: Record {
                    kind,
                    len: len as usize,
                },
                at: HEADER_LEN + off as usize + RECORD_HEADER_LEN,
                total,
            }));
        }
    }
}
