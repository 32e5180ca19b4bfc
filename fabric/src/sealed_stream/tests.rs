use super::*;
use crate::auth::{self, Initiator, Responder};
use proptest::prelude::*;
use splitnet_messaging::adapter::{pipe, PipeEnd};
use splitnet_messaging::endpoint::handshake;
use splitnet_messaging::wire::{ErrorCode, Queue, Role};

/// The two sealers of one channel's handshake: the host's, the IOC's.
fn sealers() -> (Sealer, Sealer) {
    let (host, ioc) = (auth::generate().unwrap(), auth::generate().unwrap());
    let mut i = Initiator::new(&host, &auth::public_key(&ioc)).unwrap();
    let hello = handshake::hello(Role::Host, 1, Queue::SINGLE, 7, 1, 66_560);
    let first = i.hello(&hello, auth::timestamp()).unwrap();
    let (mut r, _) = Responder::accept(&ioc, &first).unwrap();
    let reply = r
        .reply(&handshake::reply(1, ErrorCode::Ok, 7, 66_560))
        .unwrap();
    let (_, host_sealer) = i.reply(auth::reply_body(&reply).unwrap()).unwrap();
    (host_sealer, r.into_sealer().unwrap())
}

/// Two sealed ends over an in-process pipe of `capacity` bytes each way.
fn sealed_pair(capacity: usize) -> (SealedStream<PipeEnd>, SealedStream<PipeEnd>) {
    let (a, b) = pipe(capacity);
    let (sa, sb) = sealers();
    (SealedStream::new(a, sa), SealedStream::new(b, sb))
}

/// A stream that keeps what is written and reads from `input` (then `WouldBlock`).
#[derive(Default)]
struct Tap {
    written: Vec<u8>,
    input: Vec<u8>,
    at: usize,
    /// End of stream once `input` is read.
    eof: bool,
}

impl Read for Tap {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let rest = &self.input[self.at..];
        if rest.is_empty() {
            return if self.eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Tap {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes `data` into `w` (offering the unacknowledged rest each time) while `r` reads,
/// both non-blocking; returns what `r` read.
fn transfer(
    w: &mut SealedStream<PipeEnd>,
    r: &mut SealedStream<PipeEnd>,
    data: &[u8],
    write_sizes: &[usize],
    read_size: usize,
) -> Vec<u8> {
    let mut got = Vec::new();
    let mut sent = 0;
    let mut buf = vec![0; read_size];
    let mut turn = 0;
    let mut idle = 0;
    // A caller offers again at least what it offered when told to wait (as a channel's
    // queue does: it only grows at its end).
    let mut blocked = 0;
    while got.len() < data.len() {
        assert!(
            idle < 10_000,
            "no progress at {sent} sent, {} read",
            got.len()
        );
        idle += 1;
        if sent < data.len() {
            let n = write_sizes[turn % write_sizes.len()]
                .max(blocked)
                .min(data.len() - sent);
            turn += 1;
            // Offered as two buffers, as a channel gathers a header and a payload.
            let (a, b) = data[sent..sent + n].split_at(n / 3);
            match w.write_vectored(&[IoSlice::new(a), IoSlice::new(b)]) {
                Ok(k) => {
                    assert!(k <= n);
                    sent += k;
                    idle = 0;
                    blocked = 0;
                }
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    blocked = n;
                }
            }
        } else if let Err(e) = w.flush() {
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        }
        loop {
            match r.read(&mut buf) {
                Ok(0) => panic!("end of stream"),
                Ok(k) => {
                    got.extend_from_slice(&buf[..k]);
                    idle = 0;
                }
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    break;
                }
            }
        }
    }
    assert!(w.flush().is_ok(), "everything acknowledged is on the pipe");
    got
}

#[test]
fn bytes_cross_in_both_directions_in_order() {
    let (mut a, mut b) = sealed_pair(100_000);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    assert_eq!(
        transfer(&mut a, &mut b, &data, &[70_000, 3, 65_519], 9000),
        data
    );
    assert_eq!(
        transfer(&mut b, &mut a, &data[..5000], &[1], 1),
        &data[..5000]
    );
}

#[test]
fn the_wire_carries_no_plaintext_and_records_of_at_most_a_noise_message() {
    let (hs, is) = sealers();
    let mut w = SealedStream::new(Tap::default(), hs);
    let pattern = b"splitnet plaintext pattern ".repeat(5000);
    let mut sent = 0;
    while sent < pattern.len() {
        sent += w.write(&pattern[sent..]).unwrap();
    }
    let wire = std::mem::take(&mut w.inner.written);
    assert!(!wire.windows(16).any(|x| x == &pattern[..16]));
    // Records: a length, then that many bytes; each at most 65,535.
    let (mut at, mut records) = (0, 0);
    while at < wire.len() {
        let len = usize::from(u16::from_be_bytes([wire[at], wire[at + 1]]));
        assert!((TAG_LEN..=65_535).contains(&len));
        at += 2 + len;
        records += 1;
    }
    assert_eq!(at, wire.len());
    assert_eq!(records, pattern.len().div_ceil(CHUNK));
    assert_eq!(wire.len(), pattern.len() + records * (2 + TAG_LEN));
    // The other end opens them, read in pieces of any size.
    let mut r = SealedStream::new(
        Tap {
            input: wire,
            eof: true,
            ..Tap::default()
        },
        is,
    );
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    assert_eq!(got, pattern);
}

/// The wire bytes of `plain` written by a host's sealed stream, and the IOC's sealer.
fn sealed_wire(plain: &[u8]) -> (Vec<u8>, Sealer) {
    let (hs, is) = sealers();
    let mut w = SealedStream::new(Tap::default(), hs);
    let mut sent = 0;
    while sent < plain.len() {
        sent += w.write(&plain[sent..]).unwrap();
    }
    (std::mem::take(&mut w.inner.written), is)
}

fn read_all(wire: Vec<u8>, sealer: Sealer) -> io::Result<Vec<u8>> {
    let tap = Tap {
        input: wire,
        eof: true,
        ..Tap::default()
    };
    let mut r = SealedStream::new(tap, sealer);
    let mut got = Vec::new();
    r.read_to_end(&mut got).map(|_| got)
}

#[test]
fn an_altered_dropped_replayed_or_cut_record_ends_the_stream() {
    let plain = vec![0x42; 3 * CHUNK];
    let record = 2 + CHUNK + TAG_LEN;
    let kind = |wire: Vec<u8>, sealer| read_all(wire, sealer).unwrap_err().kind();
    let (mut wire, s) = sealed_wire(&plain);
    wire[record + 100] ^= 1;
    assert_eq!(kind(wire, s), io::ErrorKind::InvalidData, "altered");
    let (mut wire, s) = sealed_wire(&plain);
    wire.drain(record..2 * record);
    assert_eq!(kind(wire, s), io::ErrorKind::InvalidData, "dropped");
    let (mut wire, s) = sealed_wire(&plain);
    let first = wire[..record].to_vec();
    wire.splice(record..record, first);
    assert_eq!(kind(wire, s), io::ErrorKind::InvalidData, "replayed");
    let (mut wire, s) = sealed_wire(&plain);
    wire.truncate(wire.len() - 1);
    assert_eq!(kind(wire, s), io::ErrorKind::UnexpectedEof, "cut");
    let (mut wire, s) = sealed_wire(&plain);
    wire[0..2].copy_from_slice(&5u16.to_be_bytes());
    assert_eq!(
        kind(wire, s),
        io::ErrorKind::InvalidData,
        "shorter than a tag"
    );
    // Untouched, all of it opens.
    let (wire, s) = sealed_wire(&plain);
    assert_eq!(read_all(wire, s).unwrap(), plain);
}

#[test]
fn bytes_are_acknowledged_only_once_their_records_are_on_the_socket() {
    let (mut a, mut b) = sealed_pair(1000);
    let data = vec![7u8; 5000];
    // Sealed, but most of the record waits: the caller keeps the bytes.
    let e = a.write(&data).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert!(a.flush().is_err());
    // Offering fewer bytes than were sealed is the caller's error, not a silent loss.
    let e = a.write(&data[..10]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let mut got = Vec::new();
    let mut buf = [0u8; 700];
    loop {
        match a.write(&data) {
            Ok(n) => {
                assert_eq!(n, 5000);
                break;
            }
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
        }
        // The reader cannot open a record before all of it came.
        while let Ok(k) = b.read(&mut buf) {
            got.extend_from_slice(&buf[..k]);
        }
    }
    while let Ok(k) = b.read(&mut buf) {
        got.extend_from_slice(&buf[..k]);
    }
    assert_eq!(got, data);
    assert!(a.flush().is_ok());
}

#[test]
fn end_of_stream_between_records_is_clean() {
    let (a, b) = pipe(1 << 20);
    let (sa, sb) = sealers();
    let mut w = SealedStream::new(a, sa);
    let mut r = SealedStream::new(b, sb);
    assert_eq!(w.write(b"last words").unwrap(), 10);
    drop(w);
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"last words");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the pipe's capacity, the sizes written and read, the bytes arrive whole
    /// and in order.
    #[test]
    fn any_sizes_any_capacity(
        len in 0usize..200_000,
        capacity in 1usize..150_000,
        writes in proptest::collection::vec(1usize..140_000, 1..6),
        read_size in 1usize..100_000,
    ) {
        let (mut a, mut b) = sealed_pair(capacity);
        let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        prop_assert_eq!(transfer(&mut a, &mut b, &data, &writes, read_size), data);
    }

    /// Arbitrary bytes from the wire never panic a reader, and give an error or nothing.
    #[test]
    fn arbitrary_wire_bytes_are_refused(wire in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let (_, s) = sealers();
        let r = read_all(wire.clone(), s);
        prop_assert!(r.is_err() || (wire.is_empty() && r.unwrap().is_empty()));
    }
}
