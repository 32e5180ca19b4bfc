//! A sealed data channel's bytes from the fabric (docs/protocol.md 5.1, "Sealed data
//! channel"): any bytes a receiver reads give an error or nothing, never a panic; a real
//! stream of records with the input XORed into it opens only where the input left it
//! unchanged, and whatever opens is what was sealed, in order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use splitnet_fabric::auth::{self, public_key, Initiator, Responder, Sealer};
use splitnet_fabric::SealedStream;
use splitnet_messaging::endpoint::handshake;
use splitnet_messaging::wire::{ErrorCode, Queue, Role};
use std::io::{self, Read, Write};

const IOC: [u8; 32] = [0x11; 32];
const HOST: [u8; 32] = [0x22; 32];
const EPHEMERAL: [u8; 32] = [0x33; 32];

/// The host's and the IOC's sealers of one data channel's handshake (fixed keys).
fn sealers() -> (Sealer, Sealer) {
    let mut i = Initiator::with_ephemeral(&HOST, &public_key(&IOC), &EPHEMERAL).unwrap();
    let hello = handshake::hello(Role::Host, 1, Queue::SINGLE, 5, 7, 70_000);
    let (mut r, _) = Responder::accept(&IOC, &i.hello(&hello, 1).unwrap()).unwrap();
    let reply = r.reply(&handshake::reply(1, ErrorCode::Ok, 5, 70_000)).unwrap();
    let (_, host) = i.reply(auth::reply_body(&reply).unwrap()).unwrap();
    (host, r.into_sealer().unwrap())
}

/// A stream of fixed bytes to read (in pieces of at most `piece`), and a sink.
struct Wire {
    bytes: Vec<u8>,
    at: usize,
    piece: usize,
    written: Vec<u8>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn wire(bytes: Vec<u8>, piece: usize) -> Wire {
    Wire {
        bytes,
        at: 0,
        piece: piece.max(1),
        written: Vec::new(),
    }
}

fuzz_target!(|data: &[u8]| {
    let piece = data.first().map_or(1, |&b| usize::from(b) * 97 + 1);
    // Arbitrary bytes as what the IOC reads.
    let (_, any) = sealers();
    let mut r = SealedStream::new(wire(data.to_vec(), piece), any);
    let mut out = Vec::new();
    let _ = r.read_to_end(&mut out);
    assert!(out.is_empty(), "arbitrary bytes opened");
    // A real stream: records of the plaintext below, with the input XORed into them.
    // (The IOC's ephemeral key is random: the two ends come from one handshake.)
    let (host, ioc) = sealers();
    let plain: Vec<u8> = (0..3 * auth::CHUNK as u32 / 2).map(|i| i as u8).collect();
    let mut w = SealedStream::new(wire(Vec::new(), 1), host);
    for part in plain.chunks(auth::CHUNK / 2 + 7) {
        w.write_all(part).unwrap();
    }
    w.flush().unwrap();
    let mut sent = w.into_inner().written;
    let mut changed = false;
    for (x, b) in sent.iter_mut().zip(data) {
        *x ^= b;
        changed |= *b != 0;
    }
    let mut r = SealedStream::new(wire(sent, piece), ioc);
    let mut out = Vec::new();
    match r.read_to_end(&mut out) {
        Ok(_) => {
            assert!(!changed, "an altered stream opened");
            assert_eq!(out, plain);
        }
        Err(_) => {
            assert!(changed, "the real stream was refused");
            assert_eq!(out[..], plain[..out.len()], "what opened is what was sealed");
        }
    }
});
