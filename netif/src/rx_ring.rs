//! A packet socket's receive ring mapped into the reader (`PACKET_RX_RING`, TPACKET_V2):
//! the kernel writes each frame into the next free slot and marks it the reader's; the
//! reader takes frames without a system call while any slot is marked, and hands each slot
//! back by marking it the kernel's again.
//!
//! Slots are [`SLOT`] bytes, room for a frame of the usual MTU with its virtio-net header.
//! A longer frame (a GSO frame, a jumbo one) the kernel also queues whole on the socket and
//! marks its slot `TP_STATUS_COPY` (with `PACKET_COPY_THRESH` set), while the socket's
//! buffer has room; the reader then reads it with `recvmmsg(2)` as without a ring, in the
//! ring's order. Without room the slot holds the frame cut: the reader counts it as a frame
//! the full buffer dropped, as the kernel counts its own. So a ring costs a frame no
//! more than one copy and frees small frames from the system calls: TPACKET_V3 packs frames
//! tighter, but wakes its reader only when a block retires (its timeout at least 1 ms), too
//! late for a ping.
//!
//! The slot's header is parsed by [`parse_slot`], which trusts nothing in it (it is checked
//! against the slot's bounds and fuzzed like every decoder of frames).

use std::cell::Cell;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use splitnet_messaging::vnet::VNET_HDR_LEN;

/// Bytes of one slot: its header (52 with the address), the kernel's alignment of the
/// network header, the virtio-net header and a frame of up to 1,972 bytes.
pub const SLOT: usize = 2048;
/// Slots of a ring: 4 MiB of slots, as many bytes as the socket's own buffer
/// ([`super::packet::RCVBUF`]), which still takes the frames too long for a slot.
pub const SLOTS: usize = 2048;
/// Bytes of a ring's mapping.
pub const RING_BYTES: usize = SLOT * SLOTS;
/// Bytes of one block of slots (the kernel allocates the ring by block).
const BLOCK: usize = 64 << 10;

/// The slot is the kernel's.
const TP_STATUS_KERNEL: u32 = 0;
/// The slot holds a frame for the reader.
pub const TP_STATUS_USER: u32 = 1;
/// The frame did not fit its slot; the kernel queued it whole on the socket as well.
pub const TP_STATUS_COPY: u32 = 1 << 1;
/// The outer VLAN tag the kernel took out is in the header.
pub const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// The tag's TPID is in the header (else it is 802.1Q's).
pub const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// Bytes of `struct tpacket2_hdr`.
const HDR_LEN: usize = 32;

/// What a slot's header says of the frame it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The slot's status bits (`TP_STATUS_*`).
    pub status: u32,
    /// The frame's whole length with its virtio-net header, as a `recv` would give it.
    pub whole: usize,
    /// Where the virtio-net header and the bytes the kernel copied of the frame lie in the
    /// slot (fewer than `whole` when the frame was cut).
    pub data: Range<usize>,
    /// The VLAN tag the kernel took out: its TPID where the kernel says, and its TCI.
    pub tag: Option<(Option<u16>, u16)>,
}

impl Slot {
    /// The frame is queued whole on the socket: read it there.
    pub fn queued(&self) -> bool {
        self.status & TP_STATUS_COPY != 0
    }

    /// The slot holds only the start of the frame, which is not queued either (the
    /// socket's buffer was full): the frame is lost.
    pub fn cut(&self) -> bool {
        !self.queued() && self.data.len() < self.whole
    }
}

/// Whether the frame of `slot` is queued whole on the socket, by its status alone (so
/// that even a slot whose header is refused keeps the ring and the queue in step).
pub fn is_queued(slot: &[u8]) -> bool {
    slot.len() >= 4 && u32_at(slot, 0) & TP_STATUS_COPY != 0
}

/// A slot whose header does not describe a frame inside it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSlot {
    /// Shorter than a slot's header.
    #[error("a ring slot of {0} bytes has no room for its header")]
    Short(usize),
    /// The frame's offset and length lie outside the slot, or leave no room for the
    /// virtio-net header before it.
    #[error("a ring slot's frame (at {mac}, {snaplen} bytes) is outside its {len} bytes")]
    OutOfBounds {
        /// The frame's offset in the slot.
        mac: usize,
        /// Bytes of it copied.
        snaplen: usize,
        /// The slot's length.
        len: usize,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

/// Reads the TPACKET_V2 header at the start of `slot` and checks that the frame it
/// describes, with the virtio-net header the kernel writes right before it, lies in the slot.
pub fn parse_slot(slot: &[u8]) -> Result<Slot, BadSlot> {
    if slot.len() < HDR_LEN {
        return Err(BadSlot::Short(slot.len()));
    }
    let status = u32_at(slot, 0);
    let len = u32_at(slot, 4) as usize;
    let snaplen = u32_at(slot, 8) as usize;
    let mac = usize::from(u16_at(slot, 12));
    let tci = u16_at(slot, 24);
    let tpid = u16_at(slot, 26);
    let bad = BadSlot::OutOfBounds {
        mac,
        snaplen,
        len: slot.len(),
    };
    let start = mac.checked_sub(VNET_HDR_LEN).ok_or(bad.clone())?;
    let end = mac
        .checked_add(snaplen)
        .filter(|&e| e <= slot.len() && start >= HDR_LEN)
        .ok_or(bad)?;
    let tag = (status & TP_STATUS_VLAN_VALID != 0).then_some((
        (status & TP_STATUS_VLAN_TPID_VALID != 0).then_some(tpid),
        tci,
    ));
    Ok(Slot {
        status,
        whole: VNET_HDR_LEN + len,
        data: start..end,
        tag,
    })
}

/// `struct tpacket_req` of `<linux/if_packet.h>`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

/// The ring's geometry as the kernel takes it.
pub(crate) fn request() -> Request {
    Request {
        block_size: BLOCK as u32,
        block_nr: (RING_BYTES / BLOCK) as u32,
        frame_size: SLOT as u32,
        frame_nr: SLOTS as u32,
    }
}

/// The mapped ring of one socket, and the slot the reader takes next. One reader only: it
/// is not `Sync`.
#[derive(Debug)]
pub(crate) struct RxRing {
    map: *mut u8,
    head: Cell<usize>,
    /// Frames taken from slots since [`RxRing::take_taken`].
    taken: Cell<u64>,
    /// Frames found cut, not queued, since [`RxRing::take_cut`].
    cut: Cell<u64>,
}

// SAFETY: the mapping belongs to this value alone (unmapped when it drops); moving it to
// another thread moves the only reader with it. It is not `Sync` (`Cell`).
unsafe impl Send for RxRing {}

impl RxRing {
    /// Maps the ring the kernel set up on `fd` with [`request`].
    pub(crate) fn map(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<RxRing> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of the socket's ring, of the size requested; the
        // result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RING_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(RxRing {
            map: p.cast(),
            head: Cell::new(0),
            taken: Cell::new(0),
            cut: Cell::new(0),
        })
    }

    /// The slot `ahead` places after the next one.
    fn index(&self, ahead: usize) -> usize {
        (self.head.get() + ahead) % SLOTS
    }

    fn status(&self, ahead: usize) -> &AtomicU32 {
        // SAFETY: the slot's first word lies in the mapping (index < SLOTS), 4-aligned
        // (slots are 2 KiB apart from a page boundary); the kernel writes it too, so it is
        // only ever accessed atomically.
        unsafe { &*self.map.add(self.index(ahead) * SLOT).cast::<AtomicU32>() }
    }

    /// Calls `f` with the next slot if it holds a frame for the reader (else `None`); the
    /// slot stays the reader's until [`RxRing::release`], which `f` must not call.
    pub(crate) fn with_next<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.with_ahead(0, f)
    }

    /// As [`RxRing::with_next`], for the slot `ahead` places after the next one (the
    /// reader's only if every slot before it is too: ask them in order).
    pub(crate) fn with_ahead<R>(&self, ahead: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if ahead >= SLOTS || self.status(ahead).load(Ordering::Acquire) & TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: the slot lies in the mapping; its status says the kernel finished
        // writing it (acquire) and leaves it alone until the reader hands it back, which
        // `release` does only after `f` returned (the slice cannot escape `f`).
        let slot =
            unsafe { std::slice::from_raw_parts(self.map.add(self.index(ahead) * SLOT), SLOT) };
        Some(f(slot))
    }

    /// Hands the next slot back to the kernel and moves on to the one after.
    pub(crate) fn release(&self) {
        self.status(0).store(TP_STATUS_KERNEL, Ordering::Release);
        self.head.set(self.index(1));
    }
}

impl RxRing {
    /// Counts a frame taken from its slot.
    pub(crate) fn count_taken(&self) {
        self.taken.set(self.taken.get() + 1);
    }

    /// Frames taken from slots since the last call.
    pub(crate) fn take_taken(&self) -> u64 {
        self.taken.replace(0)
    }

    /// Counts a frame found cut and not queued (lost: the socket's buffer was full).
    pub(crate) fn count_cut(&self) {
        self.cut.set(self.cut.get() + 1);
    }

    /// Frames found cut since the last call.
    pub(crate) fn take_cut(&self) -> u64 {
        self.cut.replace(0)
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of that size, unmapped once.
        unsafe { libc::munmap(self.map.cast(), RING_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn slot(status: u32, len: u32, snaplen: u32, mac: u16, tci: u16, tpid: u16) -> Vec<u8> {
        let mut s = vec![0u8; SLOT];
        s[0..4].copy_from_slice(&status.to_ne_bytes());
        s[4..8].copy_from_slice(&len.to_ne_bytes());
        s[8..12].copy_from_slice(&snaplen.to_ne_bytes());
        s[12..14].copy_from_slice(&mac.to_ne_bytes());
        s[24..26].copy_from_slice(&tci.to_ne_bytes());
        s[26..28].copy_from_slice(&tpid.to_ne_bytes());
        s
    }

    #[test]
    fn a_slot_says_where_its_frame_and_header_are() {
        let s = parse_slot(&slot(TP_STATUS_USER, 98, 98, 82, 0, 0)).unwrap();
        assert_eq!(s.whole, 108);
        assert_eq!(s.data, 72..180);
        assert_eq!(s.tag, None);
        assert!(!s.queued());
        let t = TP_STATUS_USER | TP_STATUS_VLAN_VALID;
        assert_eq!(
            parse_slot(&slot(t, 60, 60, 82, 7, 0x88a8)).unwrap().tag,
            Some((None, 7))
        );
        let t = t | TP_STATUS_VLAN_TPID_VALID | TP_STATUS_COPY;
        let s = parse_slot(&slot(t, 9000, 1900, 82, 7, 0x88a8)).unwrap();
        assert_eq!(s.tag, Some((Some(0x88a8), 7)));
        assert!(s.queued());
        assert_eq!((s.whole, s.data.len()), (9010, 1910));
    }

    #[test]
    fn a_slot_whose_frame_lies_outside_it_is_refused() {
        assert_eq!(parse_slot(&[0; 31]), Err(BadSlot::Short(31)));
        // Beyond the slot's end.
        assert!(parse_slot(&slot(1, 2000, 2000, 82, 0, 0)).is_err());
        // No room for the virtio-net header after the slot's header.
        assert!(parse_slot(&slot(1, 60, 60, 40, 0, 0)).is_err());
        assert!(parse_slot(&slot(1, 60, 60, 4, 0, 0)).is_err());
        assert!(parse_slot(&slot(1, 0, u32::MAX, 82, 0, 0)).is_err());
    }

    proptest! {
        #[test]
        fn any_header_parses_inside_its_slot_or_is_refused(
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            if let Ok(s) = parse_slot(&bytes) {
                prop_assert!(s.data.start >= HDR_LEN && s.data.end <= bytes.len());
                prop_assert!(s.whole >= VNET_HDR_LEN);
            }
        }
    }

    #[test]
    fn the_geometry_is_whole_blocks_of_whole_slots() {
        let r = request();
        assert_eq!(r.block_size as usize % SLOT, 0);
        assert_eq!(r.block_size as usize % 4096, 0);
        assert_eq!(
            (r.block_nr * r.block_size) as usize,
            (r.frame_nr * r.frame_size) as usize
        );
    }
}
