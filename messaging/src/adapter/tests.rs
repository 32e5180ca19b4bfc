//! Channel tests over the in-process pipe: placement, framing under partial I/O, errors.

use super::*;
use crate::memory::{
    Access, DomainId, Handle, ProtectionError, RegionSpec, Registry, SendBufCache,
};
use proptest::prelude::*;
use std::io::{self, Read};

pub(super) const PD: DomainId = DomainId(7);

/// A pool of `count` elements of `size` bytes in domain [`PD`], every element granted.
pub(super) fn target_pool(reg: &mut Registry, count: u32, size: u32) -> Handle {
    let h = reg
        .register(RegionSpec {
            domain: PD,
            access: Access::REMOTE_WRITE,
            element_size: size,
            element_count: count,
            single_use: false,
        })
        .unwrap();
    for e in 0..count {
        reg.grant(h, e).unwrap();
    }
    h
}

fn pair(cap: usize) -> (StreamChannel<PipeEnd>, StreamChannel<PipeEnd>) {
    let (a, b) = pipe(cap);
    (
        StreamChannel::new(a, PD, 4096),
        StreamChannel::new(b, PD, 4096),
    )
}

/// Takes every completion `b` has now, each with its bytes (a SEND's payload, a write's
/// element).
pub(super) fn drain<C: Channel>(b: &mut C, reg: &mut Registry) -> Vec<(RxCompletion, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(c) = b.poll_recv(reg).unwrap() {
        let bytes = match c {
            RxCompletion::Recv { .. } => b.received().to_vec(),
            RxCompletion::Write {
                handle,
                element,
                len,
                ..
            } => {
                let mut v = Vec::new();
                reg.frame(handle, element, len).unwrap().copy_to(&mut v);
                v
            }
        };
        out.push((c, bytes));
    }
    out
}

/// Moves bytes both ways until nothing more completes; returns B's completions.
fn pump(
    a: &mut StreamChannel<PipeEnd>,
    b: &mut StreamChannel<PipeEnd>,
    reg: &mut Registry,
) -> Vec<(RxCompletion, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let flushed = a.flush().unwrap();
        let got = drain(b, reg);
        let progressed = !got.is_empty();
        out.extend(got);
        if flushed && !progressed && a.pending() == 0 {
            return out;
        }
    }
}

#[test]
fn send_and_writes_arrive_in_order() {
    let mut reg = Registry::new(1 << 20);
    let h = target_pool(&mut reg, 4, 64);
    let base = Registry::base_address(h);
    let (mut a, mut b) = pair(1 << 16);
    let mut cache = SendBufCache::new(64, 4);
    let mut buf = cache.get().unwrap();
    buf.fill_from(b"frame-one");
    a.post(
        Op::WriteImm {
            handle: h.to_u64(),
            addr: base + 64,
            imm: 0xabcd,
        },
        &[],
        Payload::Buf(buf),
    );
    a.post(Op::Send, b"hdr:", Payload::Bytes(b"hello".to_vec()));
    a.post(
        Op::Write {
            handle: h.to_u64(),
            addr: base,
        },
        b"p",
        Payload::Empty,
    );
    let got = pump(&mut a, &mut b, &mut reg);
    assert_eq!(got.len(), 3);
    assert_eq!(
        got[0].0,
        RxCompletion::Write {
            handle: h,
            element: 1,
            len: 9,
            imm: Some(0xabcd)
        }
    );
    assert_eq!(got[0].1, b"frame-one");
    assert_eq!(got[1].0, RxCompletion::Recv { len: 9 });
    assert_eq!(got[1].1, b"hdr:hello");
    assert_eq!(got[2].1, b"p");
    a.reclaim(&mut cache);
    assert_eq!(cache.in_use(), 0, "sent buffer came back to the cache");
    assert_eq!(reg.in_flight(h).unwrap(), 0);
}

#[test]
fn closing_counts_the_frames_it_drops_unsent() {
    let mut reg = Registry::new(1 << 20);
    let h = target_pool(&mut reg, 4, 64);
    let base = Registry::base_address(h);
    // A pipe of 40 bytes: the first operation is cut after its header, the rest wait.
    let (mut a, _b) = pair(40);
    let mut cache = SendBufCache::new(64, 4);
    let write = Op::WriteImm {
        handle: h.to_u64(),
        addr: base,
        imm: 1,
    };
    let mut frame = || {
        let mut b = cache.get().unwrap();
        b.fill_from(&[0x45; 60]);
        Payload::Buf(b)
    };
    a.post(write, &[], frame());
    a.post(Op::Send, b"credit", Payload::Bytes(vec![0; 16]));
    a.post(Op::Send, b"senddata", frame());
    a.post(
        Op::Write {
            handle: h.to_u64(),
            addr: base,
        },
        &[],
        Payload::Empty,
    );
    assert!(!a.flush().unwrap(), "the pipe holds only the first header");
    assert_eq!(
        a.close(&mut reg),
        3,
        "the cut write, the SendData and the write; not the control message"
    );
    assert_eq!(a.close(&mut reg), 0, "nothing left");
    a.reclaim(&mut cache);
    assert_eq!(cache.in_use(), 0);
}

#[test]
fn protection_error_stops_the_stream_before_placing() {
    let mut reg = Registry::new(1 << 20);
    let h = target_pool(&mut reg, 2, 64);
    let base = Registry::base_address(h);
    let (mut a, mut b) = pair(1 << 16);
    a.post(
        Op::Write {
            handle: h.to_u64(),
            addr: base + 128,
        },
        &[],
        Payload::Bytes(vec![0xee; 8]),
    );
    a.flush().unwrap();
    let e = b.poll_recv(&mut reg).unwrap_err();
    assert!(matches!(
        e,
        ChannelError::Rx(RxError::Protection(ProtectionError::OutOfBounds { .. }))
    ));
    assert_eq!(reg.element(h, 1, 64).unwrap(), &[0u8; 64][..]);
}

#[test]
fn oversized_send_is_refused() {
    let mut reg = Registry::new(1 << 20);
    let (mut a, mut b) = pair(1 << 16);
    a.post(Op::Send, &[], Payload::Bytes(vec![1; 5000]));
    a.flush().unwrap();
    assert!(matches!(
        b.poll_recv(&mut reg),
        Err(ChannelError::Rx(RxError::SendTooLong { len: 5000, .. }))
    ));
}

#[test]
fn peer_close_is_reported_and_aborts_in_flight_write() {
    let mut reg = Registry::new(1 << 20);
    let h = target_pool(&mut reg, 1, 64);
    let (mut a, mut b) = pair(1 << 16);
    // A header announcing 32 bytes, then only 5 of them, then the peer goes away.
    let hdr = OpHeader {
        op: Op::Write {
            handle: h.to_u64(),
            addr: Registry::base_address(h),
        },
        len: 32,
    }
    .emit();
    use std::io::Write;
    a.stream_mut().write_all(&hdr).unwrap();
    a.stream_mut().write_all(&[1, 2, 3, 4, 5]).unwrap();
    assert!(b.poll_recv(&mut reg).unwrap().is_none());
    assert_eq!(reg.in_flight(h).unwrap(), 1);
    drop(a);
    assert!(matches!(b.poll_recv(&mut reg), Err(ChannelError::Closed)));
    b.close(&mut reg);
    assert_eq!(reg.in_flight(h).unwrap(), 0);
    reg.deregister(h).unwrap();
}

proptest! {
    /// Random messages and writes over a pipe too small for any of them arrive intact and in
    /// order: partial reads and writes at every boundary.
    #[test]
    fn framing_survives_partial_io(
        cap in 1usize..97,
        items in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..200)), 1..24)
    ) {
        let mut reg = Registry::new(1 << 22);
        let h = target_pool(&mut reg, 32, 256);
        let base = Registry::base_address(h);
        let (mut a, mut b) = pair(cap);
        let mut expect = Vec::new();
        for (i, (write, bytes)) in items.iter().enumerate() {
            if *write {
                a.post(Op::WriteImm { handle: h.to_u64(), addr: base + 256 * i as u64, imm: i as u32 }, &[], Payload::Bytes(bytes.clone()));
            } else {
                a.post(Op::Send, &[], Payload::Bytes(bytes.clone()));
            }
            expect.push(bytes.clone());
        }
        let got = pump(&mut a, &mut b, &mut reg);
        prop_assert_eq!(got.len(), expect.len());
        for ((c, bytes), want) in got.iter().zip(&expect) {
            prop_assert_eq!(bytes, want);
            if let RxCompletion::Write { element, imm, .. } = c {
                prop_assert_eq!(Some(*element), *imm);
            }
        }
    }
}

proptest! {
    /// Writes large enough that only a header is read ahead after them, among small SENDs
    /// and writes, over pipes of every size: every payload arrives intact and in order.
    #[test]
    fn large_and_small_operations_interleave(
        cap in 1usize..12_000,
        items in proptest::collection::vec((any::<bool>(), 0usize..5000, any::<u8>()), 1..16)
    ) {
        let mut reg = Registry::new(1 << 22);
        let h = target_pool(&mut reg, 16, 8192);
        let base = Registry::base_address(h);
        let (a, b) = pipe(cap);
        let mut a = StreamChannel::new(a, PD, 8192);
        let mut b = StreamChannel::new(b, PD, 8192);
        let mut expect = Vec::new();
        for (i, &(write, len, fill)) in items.iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|k| fill.wrapping_add(k as u8)).collect();
            let op = if write {
                Op::WriteImm { handle: h.to_u64(), addr: base + 8192 * i as u64, imm: i as u32 }
            } else {
                Op::Send
            };
            a.post(op, &[], Payload::Bytes(bytes.clone()));
            expect.push(bytes);
        }
        let got = pump(&mut a, &mut b, &mut reg);
        prop_assert_eq!(got.len(), expect.len());
        for ((_, bytes), want) in got.iter().zip(&expect) {
            prop_assert_eq!(bytes, want);
        }
    }
}

/// A stream of MTU-sized writes, with the socket always holding more: after the first
/// read, each read takes the rest of one payload into its element and the next header, so
/// no payload byte is copied beyond the first read-ahead.
#[test]
fn large_writes_are_placed_with_one_read_each_and_no_copy() {
    let mut reg = Registry::new(1 << 22);
    let frames = 64u32;
    let h = target_pool(&mut reg, frames, 2048);
    let base = Registry::base_address(h);
    let (a, mut wire) = pipe(1 << 20);
    let mut a = StreamChannel::new(a, PD, 4096);
    for i in 0..frames {
        let op = Op::WriteImm {
            handle: h.to_u64(),
            addr: base + 2048 * u64::from(i),
            imm: i,
        };
        a.post(op, &[], Payload::Bytes(vec![i as u8; 1500]));
    }
    assert!(a.flush().unwrap());
    let mut bytes = Vec::new();
    wire.read_to_end(&mut bytes).unwrap_err();
    let mut rx = RxStream::new(PD, 4096);
    let (mut pos, mut reads, mut copied, mut done) = (0, 0, 0, 0);
    while pos < bytes.len() {
        while let Some(c) = rx.poll_staged(&mut reg).unwrap() {
            assert!(matches!(c, RxCompletion::Write { len: 1500, .. }));
            done += 1;
        }
        let (payload, ahead) = rx.buffers(&mut reg);
        let n = (payload.len() + ahead.len()).min(bytes.len() - pos);
        let into_payload = n.min(payload.len());
        payload[..into_payload].copy_from_slice(&bytes[pos..pos + into_payload]);
        ahead[..n - into_payload].copy_from_slice(&bytes[pos + into_payload..pos + n]);
        if reads > 0 {
            copied += n - into_payload;
        }
        pos += n;
        reads += 1;
        if rx.advance(n, &mut reg).unwrap().is_some() {
            done += 1;
        }
    }
    while rx.poll_staged(&mut reg).unwrap().is_some() {
        done += 1;
    }
    assert_eq!(done, frames);
    assert!(
        reads <= frames as usize + 1,
        "{reads} reads for {frames} frames"
    );
    assert!(
        copied <= frames as usize * OP_HEADER_LEN,
        "{copied} bytes went through the read-ahead after the first read"
    );
    for i in 0..frames {
        assert_eq!(reg.element(h, i, 1500).unwrap(), &[i as u8; 1500][..]);
    }
}

/// A pipe end that counts its reads, and those that found it empty.
struct Counting {
    end: PipeEnd,
    reads: usize,
    empty: usize,
}

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(&mut [io::IoSliceMut::new(buf)])
    }

    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        self.reads += 1;
        let r = self.end.read_vectored(bufs);
        self.empty += usize::from(matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock));
        r
    }
}

impl io::Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.end.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A sender and a receiver that counts its reads, `drains` telling it whether short reads
/// prove the stream empty.
fn counting_pair(drains: bool) -> (StreamChannel<PipeEnd>, StreamChannel<Counting>) {
    let (a, b) = pipe(1 << 20);
    let mut b = StreamChannel::new(
        Counting {
            end: b,
            reads: 0,
            empty: 0,
        },
        PD,
        4096,
    );
    b.set_short_read_drains(drains);
    (StreamChannel::new(a, PD, 4096), b)
}

#[test]
fn a_short_read_spares_the_read_that_would_find_the_stream_empty() {
    for drains in [true, false] {
        let mut reg = Registry::new(1 << 20);
        let (mut a, mut b) = counting_pair(drains);
        a.post(Op::Send, b"", Payload::Bytes(b"one".to_vec()));
        assert!(a.flush().unwrap());
        assert_eq!(drain(&mut b, &mut reg).len(), 1);
        let s = b.stream();
        // With drains: one read, which filled less than it asked; without: a second one,
        // which found the pipe empty.
        assert_eq!((s.reads, s.empty), if drains { (1, 0) } else { (2, 1) });
        // Bytes that come later are read (a reactor reports them): nothing is lost.
        a.post(Op::Send, b"", Payload::Bytes(b"two".to_vec()));
        assert!(a.flush().unwrap());
        let got = drain(&mut b, &mut reg);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, b"two");
    }
}

#[test]
fn reads_that_fill_all_they_asked_for_go_on_until_a_short_one() {
    let mut reg = Registry::new(1 << 20);
    let (mut a, mut b) = counting_pair(true);
    // Far more than one read asks for (the read-ahead is 2 KiB).
    for i in 0..100u8 {
        a.post(Op::Send, b"", Payload::Bytes(vec![i; 1000]));
    }
    assert!(a.flush().unwrap());
    let got = drain(&mut b, &mut reg);
    assert_eq!(got.len(), 100);
    for (i, (_, bytes)) in got.iter().enumerate() {
        assert_eq!(bytes, &vec![i as u8; 1000]);
    }
    assert!(b.stream().reads > 1);
    assert_eq!(
        b.stream().empty,
        0,
        "the last read was short: no read found the pipe empty"
    );
}

/// What the receiver does next in [`short_reads_lose_nothing`].
#[derive(Debug, Clone, Copy)]
enum Step {
    /// The sender sends a message of this many bytes (1 more).
    Send(usize),
    /// The receiver polls once, not woken (as after a turn that ran out of budget).
    PollOnce,
    /// The reactor wakes the receiver, if the stream is readable: it polls until empty.
    WakeUp,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0usize..3000).prop_map(Step::Send),
        Just(Step::PollOnce),
        Just(Step::WakeUp),
    ]
}

proptest! {
    /// Whatever the sizes and the interleaving of sends, polls and wake-ups, every message
    /// arrives, in order, with short reads taken as proof of an empty stream, given a
    /// reactor as tokio's: each send makes the stream readable, and a wake-up that ends
    /// with the channel empty clears that (no send can come in between here).
    #[test]
    fn short_reads_lose_nothing(steps in proptest::collection::vec(step(), 1..80)) {
        let mut reg = Registry::new(1 << 20);
        let (mut a, mut b) = counting_pair(true);
        let (mut sent, mut got) = (Vec::new(), Vec::new());
        let mut readable = false;
        let take = |c: RxCompletion, b: &StreamChannel<Counting>| {
            let is_recv = matches!(c, RxCompletion::Recv { .. });
            prop_assert!(is_recv, "a SEND's completion, got {:?}", c);
            Ok(b.received().to_vec())
        };
        for s in steps.into_iter().chain([Step::WakeUp]) {
            match s {
                Step::Send(len) => {
                    let msg = vec![sent.len() as u8; len + 1];
                    a.post(Op::Send, b"", Payload::Bytes(msg.clone()));
                    sent.push(msg);
                    prop_assert!(a.flush().unwrap());
                    readable = true;
                }
                Step::PollOnce => {
                    if let Some(c) = b.poll_recv(&mut reg).unwrap() {
                        got.push(take(c, &b)?);
                    }
                }
                Step::WakeUp if readable => {
                    b.wake();
                    while let Some(c) = b.poll_recv(&mut reg).unwrap() {
                        got.push(take(c, &b)?);
                    }
                    readable = false;
                }
                Step::WakeUp => {}
            }
        }
        prop_assert_eq!(got, sent);
    }
}
