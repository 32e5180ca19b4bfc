//! A frame a host wrote, as the IOC forwards it.
//!
//! Over TCP a host's frame lies in the IOC's private pool memory. Over shared memory it lies
//! in the pool arena the host maps and may rewrite at any moment (XSA-155): the IOC then
//! parses and checks only a private copy of its first [`HEAD`] bytes (every header any
//! check or flow hash reads) and hands on that copy, followed by the rest straight from the
//! pool: copied once into wherever the frame goes (a send buffer, a slot of the LAN batch),
//! or given to the kernel by address. So a host that rewrites its frame meanwhile changes
//! only its own payload, never what was checked.

use splitnet_messaging::memory::{Frame, SharedBytes};

/// Bytes of a frame's head parsed from a private copy: the virtio-net header, Ethernet with
/// two VLAN tags, an IPv4 header with options or an IPv6 header, and the ports.
pub const HEAD: usize = 128;

/// A host's frame.
#[derive(Clone, Copy)]
pub enum HostFrame<'a> {
    /// Wholly in private memory.
    Private(&'a [u8]),
    /// The private copy of its first bytes, and the rest in the host's shared pool.
    Shared {
        /// The first `min(HEAD, len)` bytes, private.
        head: &'a [u8],
        /// The bytes after them, shared.
        rest: SharedBytes<'a>,
    },
}

impl<'a> HostFrame<'a> {
    /// `frame` as the IOC may use it: a frame in shared memory has its head copied into
    /// `head` first.
    pub fn new(frame: Frame<'a>, head: &'a mut [u8; HEAD]) -> HostFrame<'a> {
        match frame {
            Frame::Private(b) => HostFrame::Private(b),
            Frame::Shared(s) => {
                let n = frame.head(head);
                HostFrame::Shared {
                    head: &head[..n],
                    rest: s.after(n),
                }
            }
        }
    }

    /// The bytes every check reads: the whole frame, or its private head.
    pub fn head(&self) -> &'a [u8] {
        match self {
            HostFrame::Private(b) => b,
            HostFrame::Shared { head, .. } => head,
        }
    }

    /// Length of the whole frame.
    pub fn len(&self) -> usize {
        match self {
            HostFrame::Private(b) => b.len(),
            HostFrame::Shared { head, rest } => head.len() + rest.len(),
        }
    }

    /// Copies the whole frame to the start of `dst`; false (nothing copied) if it does not
    /// fit.
    pub fn copy_to(&self, dst: &mut [u8]) -> bool {
        let Some(dst) = dst.get_mut(..self.len()) else {
            return false;
        };
        match self {
            HostFrame::Private(b) => dst.copy_from_slice(b),
            HostFrame::Shared { head, rest } => {
                let (h, r) = dst.split_at_mut(head.len());
                h.copy_from_slice(head);
                // In bounds: `r` is exactly the rest's length.
                rest.copy_out(0, r).unwrap_or_default();
            }
        }
        true
    }

    /// The whole frame in a new vector.
    pub fn to_vec(self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.copy_to(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_messaging::memory::{HeapShared, SharedMem};

    #[test]
    fn a_shared_frame_is_checked_from_its_private_head_and_copied_whole() {
        let mem = HeapShared::new(4096);
        let frame: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        mem.write(64, &frame).unwrap();
        let shared = Frame::Shared(SharedBytes::new(&mem, 64, 300).unwrap());
        let mut head = [0u8; HEAD];
        let f = HostFrame::new(shared, &mut head);
        assert_eq!(f.len(), 300);
        assert_eq!(f.head(), &frame[..HEAD]);
        // The host rewrites its pool: the head seen by the checks stays as it was.
        mem.write(64, &[0xff; 16]).unwrap();
        assert_eq!(f.head(), &frame[..HEAD]);
        let copy = f.to_vec();
        assert_eq!(
            &copy[..HEAD],
            &frame[..HEAD],
            "the checked head is what goes on"
        );
        assert_eq!(&copy[HEAD..], &frame[HEAD..]);
        assert!(!f.copy_to(&mut [0u8; 299]), "too small");
        // A frame shorter than the head is wholly private.
        let short = Frame::Shared(SharedBytes::new(&mem, 64, 40).unwrap());
        let mut head = [0u8; HEAD];
        let f = HostFrame::new(short, &mut head);
        assert_eq!((f.len(), f.head().len()), (40, 40));
        assert!(matches!(f, HostFrame::Shared { rest, .. } if rest.is_empty()));
        let p = HostFrame::new(Frame::Private(&frame), &mut head);
        assert_eq!(p.head(), &frame[..]);
        assert_eq!(p.to_vec(), frame);
    }
}
