//! Authenticated handshakes (docs/protocol.md, section 5.1): each side proves its static
//! X25519 key with the Noise IK handshake (`Noise_IK_25519_ChaChaPoly_BLAKE2s`, the pattern
//! WireGuard uses), through the `snow` crate; nothing here is home-made cryptography.
//!
//! The host (initiator) knows the IOC's public key; its first message carries its own
//! static key, encrypted, and the channel's Hello with a timestamp the IOC uses to refuse a
//! replayed message. The IOC (responder) answers with the HelloReply in the second message,
//! so the host knows the answer came from the IOC it meant. A control channel on its socket
//! then carries every message sealed ([`Sealer`]): encrypted and authenticated, in order.

use snow::{Builder, HandshakeState, TransportState};
use splitnet_messaging::wire::{self, Message};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// The Noise protocol name: pattern, Diffie-Hellman function, cipher and hash.
pub const NOISE_PARAMS: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
/// The prologue both sides mix into the handshake: it binds the handshake to this protocol.
pub const PROLOGUE: &[u8] = b"splitnet fabric protocol 1";
/// Bytes of an X25519 key, public or private.
pub const KEY_LEN: usize = 32;
/// Bytes a sealed message adds to its plaintext (the Poly1305 tag).
pub const TAG_LEN: usize = 16;
/// Bytes of the timestamp that follows the Hello in the first handshake message.
const TIMESTAMP_LEN: usize = 8;
/// Bytes of the flags that may follow the timestamp (what the host asks for).
const FLAGS_LEN: usize = 4;
/// Bytes of an encoded Hello message.
const HELLO_LEN: usize = wire::HEADER_LEN + 28;
/// Largest Noise message: the protocol's limit.
const NOISE_MAX: usize = 65_535;

/// A static X25519 key: 32 bytes.
pub type Key = [u8; KEY_LEN];

/// Why an authenticated handshake failed.
#[derive(Debug, Error)]
pub enum AuthError {
    /// The Noise handshake failed: a message that does not decrypt (the sender does not
    /// hold the key it claims, or it used another public key for this side), a replayed or
    /// altered message.
    #[error("authentication failed: {0}")]
    Noise(#[from] snow::Error),
    /// The handshake's payload is not what the protocol puts there.
    #[error("authenticated handshake malformed: {0}")]
    Payload(&'static str),
}

fn params() -> snow::params::NoiseParams {
    // A constant that parses: a failure here is a programming error caught by every test.
    NOISE_PARAMS
        .parse()
        .expect("NOISE_PARAMS names a supported protocol")
}

/// A new private key from the operating system's random source.
pub fn generate() -> Result<Key, AuthError> {
    let kp = Builder::new(params()).generate_keypair()?;
    let mut k = [0; KEY_LEN];
    k.copy_from_slice(&kp.private);
    Ok(k)
}

/// The public key of `private`.
pub fn public_key(private: &Key) -> Key {
    x25519_dalek::x25519(*private, x25519_dalek::X25519_BASEPOINT_BYTES)
}

/// A timestamp for a first handshake message: nanoseconds since the Unix epoch, strictly
/// increasing within this process (the IOC refuses one not above the last it took from the
/// same key, queue and channel).
pub fn timestamp() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let prev = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last.saturating_add(1)))
        })
        .unwrap_or(0);
    now.max(prev.saturating_add(1))
}

/// The prologue of a handshake for `channel`: [`PROLOGUE`] and the channel number, which
/// the AuthHello also carries in the clear (its transaction context) so that a capture can
/// tell the channels apart; a changed number fails the handshake.
fn prologue(channel: u8) -> Vec<u8> {
    let mut p = PROLOGUE.to_vec();
    p.push(channel);
    p
}

/// Offset of the channel number in an encoded Hello message (header, then min_version,
/// max_version, role).
const HELLO_CHANNEL_AT: usize = wire::HEADER_LEN + 5;

/// The connecting side (the host) of one channel's handshake.
pub struct Initiator {
    local: Key,
    ioc: Key,
    /// A fixed ephemeral key (tests and attack tools only).
    ephemeral: Option<Key>,
    /// The handshake, once the first message is written.
    hs: Option<HandshakeState>,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Initiator")
    }
}

impl Initiator {
    /// A handshake of this host's key `local` with the IOC whose public key is `ioc`.
    pub fn new(local: &Key, ioc: &Key) -> Result<Initiator, AuthError> {
        Ok(Initiator {
            local: *local,
            ioc: *ioc,
            ephemeral: None,
            hs: None,
        })
    }

    /// An initiator whose ephemeral key is `ephemeral` instead of a fresh random one, for
    /// tests and attack tools only: two such initiators write identical first messages, so
    /// one can read the answer to the other's message replayed. Never for a real handshake.
    pub fn with_ephemeral(local: &Key, ioc: &Key, ephemeral: &Key) -> Result<Initiator, AuthError> {
        let mut i = Initiator::new(local, ioc)?;
        i.ephemeral = Some(*ephemeral);
        Ok(i)
    }

    /// The AuthHello message carrying `hello` (a whole encoded Hello message, whose channel
    /// it names in the clear) and `timestamp`.
    pub fn hello(&mut self, hello: &[u8], timestamp: u64) -> Result<Vec<u8>, AuthError> {
        self.hello_asking(hello, timestamp, 0)
    }

    /// [`Initiator::hello`] asking for `flags` ([`HelloReply::SEALED_DATA`]); no flags are
    /// sent when there are none, as before flags existed.
    ///
    /// [`HelloReply::SEALED_DATA`]: wire::HelloReply::SEALED_DATA
    pub fn hello_asking(
        &mut self,
        hello: &[u8],
        timestamp: u64,
        flags: u32,
    ) -> Result<Vec<u8>, AuthError> {
        let channel = *hello
            .get(HELLO_CHANNEL_AT)
            .ok_or(AuthError::Payload("not a Hello"))?;
        let prologue = prologue(channel);
        let b = Builder::new(params())
            .local_private_key(&self.local)?
            .remote_public_key(&self.ioc)?
            .prologue(&prologue)?;
        let b = match &self.ephemeral {
            Some(e) => b.fixed_ephemeral_key_for_testing_only(e),
            None => b,
        };
        let hs = self.hs.insert(b.build_initiator()?);
        let mut payload = hello.to_vec();
        payload.extend_from_slice(&timestamp.to_be_bytes());
        if flags != 0 {
            payload.extend_from_slice(&flags.to_be_bytes());
        }
        let mut noise = vec![0; NOISE_MAX];
        let n = hs.write_message(&payload, &mut noise)?;
        let mut out = Vec::with_capacity(wire::HEADER_LEN + n);
        Message::AuthHello(&noise[..n]).emit(u64::from(channel), &mut out);
        Ok(out)
    }

    /// Reads the IOC's AuthReply body `noise`: returns the HelloReply it carries (a whole
    /// encoded message) and the sealer of the channel's later messages.
    pub fn reply(self, noise: &[u8]) -> Result<(Vec<u8>, Sealer), AuthError> {
        let mut hs = self.hs.ok_or(AuthError::Payload("no AuthHello was sent"))?;
        let mut reply = vec![0; noise.len()];
        let n = hs.read_message(noise, &mut reply)?;
        reply.truncate(n);
        Ok((reply, Sealer::new(hs.into_transport_mode()?)))
    }
}

/// The listening side (the IOC) of one channel's handshake, once the host's first message
/// was read: who the host is, and the state that writes the answer.
pub struct Responder {
    hs: HandshakeState,
    /// The host's static public key, proven by the message.
    pub peer: Key,
    /// The message's timestamp.
    pub timestamp: u64,
    /// What the host asks for ([`wire::HelloReply::SEALED_DATA`]); 0 when it sent no flags.
    pub flags: u32,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("timestamp", &self.timestamp)
            .finish_non_exhaustive()
    }
}

impl Responder {
    /// Reads an AuthHello message (`message`: header and body) with this IOC's key `local`:
    /// returns the responder and the Hello it carries (a whole encoded message), whose
    /// channel is the one the AuthHello names in the clear.
    pub fn accept(local: &Key, message: &[u8]) -> Result<(Responder, Vec<u8>), AuthError> {
        let (header, noise) = match Message::parse(message) {
            Ok((h, Message::AuthHello(b))) => (h, b),
            _ => return Err(AuthError::Payload("not an AuthHello")),
        };
        let channel = u8::try_from(header.txn)
            .ok()
            .filter(|&c| c <= wire::MAX_DATA_CHANNELS)
            .ok_or(AuthError::Payload(
                "the channel named in the clear is out of range",
            ))?;
        let mut hs = Builder::new(params())
            .local_private_key(local)?
            .prologue(&prologue(channel))?
            .build_responder()?;
        let mut payload = vec![0; noise.len()];
        let n = hs.read_message(noise, &mut payload)?;
        // The Hello, its timestamp, and flags if the host asks for anything.
        let flags = match n.checked_sub(HELLO_LEN + TIMESTAMP_LEN) {
            Some(0) => 0,
            Some(FLAGS_LEN) => {
                let at = HELLO_LEN + TIMESTAMP_LEN;
                u32::from_be_bytes([
                    payload[at],
                    payload[at + 1],
                    payload[at + 2],
                    payload[at + 3],
                ])
            }
            _ => {
                return Err(AuthError::Payload(
                    "not a Hello, a timestamp and perhaps flags",
                ))
            }
        };
        if payload.get(HELLO_CHANNEL_AT) != Some(&channel) {
            return Err(AuthError::Payload("the Hello names another channel"));
        }
        let mut ts = [0; TIMESTAMP_LEN];
        ts.copy_from_slice(&payload[HELLO_LEN..HELLO_LEN + TIMESTAMP_LEN]);
        payload.truncate(HELLO_LEN);
        let peer = hs
            .get_remote_static()
            .and_then(|k| Key::try_from(k).ok())
            .ok_or(AuthError::Payload("no static key"))?;
        let r = Responder {
            hs,
            peer,
            timestamp: u64::from_be_bytes(ts),
            flags,
        };
        Ok((r, payload))
    }

    /// The AuthReply message carrying `reply` (a whole encoded HelloReply message).
    pub fn reply(&mut self, reply: &[u8]) -> Result<Vec<u8>, AuthError> {
        let mut noise = vec![0; NOISE_MAX];
        let n = self.hs.write_message(reply, &mut noise)?;
        Ok(encode(&Message::AuthReply(&noise[..n])))
    }

    /// The sealer of the channel's later messages, once the reply was written.
    pub fn into_sealer(self) -> Result<Sealer, AuthError> {
        Ok(Sealer::new(self.hs.into_transport_mode()?))
    }
}

/// Seals and opens a channel's messages after its handshake: ChaCha20-Poly1305 with the
/// handshake's keys, one nonce per message in each direction, so a message dropped,
/// replayed, reordered or altered fails to open.
pub struct Sealer {
    ts: TransportState,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer")
    }
}

impl Sealer {
    fn new(ts: TransportState) -> Sealer {
        Sealer { ts }
    }

    /// `plain` sealed: [`sealed_len`] bytes, a Noise message per [`CHUNK`] bytes of it.
    pub fn seal(&mut self, plain: &[u8]) -> Result<Vec<u8>, AuthError> {
        let mut out = vec![0; sealed_len(plain.len())];
        let mut at = 0;
        for chunk in chunks(plain, CHUNK) {
            at += self.ts.write_message(chunk, &mut out[at..])?;
        }
        Ok(out)
    }

    /// Seals `plain` (at most [`CHUNK`] bytes) as one Noise message appended to `out`: one
    /// record of a sealed stream, without an allocation once `out` has room.
    pub fn seal_record(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), AuthError> {
        if plain.len() > CHUNK {
            return Err(AuthError::Payload("a record longer than a Noise message"));
        }
        let at = out.len();
        out.resize(at + plain.len() + TAG_LEN, 0);
        let n = self.ts.write_message(plain, &mut out[at..])?;
        out.truncate(at + n);
        Ok(())
    }

    /// Opens one Noise message `sealed` (a record of a sealed stream) into `out`, which has
    /// room for [`CHUNK`] bytes; returns the plaintext's length.
    pub fn open_record(&mut self, sealed: &[u8], out: &mut [u8]) -> Result<usize, AuthError> {
        Ok(self.ts.read_message(sealed, out)?)
    }

    /// Opens `sealed` into `out` (replacing its contents).
    pub fn open(&mut self, sealed: &[u8], out: &mut Vec<u8>) -> Result<(), AuthError> {
        out.clear();
        let mut buf = vec![0; CHUNK];
        for chunk in chunks(sealed, CHUNK + TAG_LEN) {
            let n = self.ts.read_message(chunk, &mut buf)?;
            out.extend_from_slice(&buf[..n]);
        }
        Ok(())
    }
}

/// Plaintext bytes sealed in one Noise message: its 65,535-byte limit less the tag.
pub const CHUNK: usize = NOISE_MAX - TAG_LEN;

/// Bytes of a sealed message of `plain` bytes: [`TAG_LEN`] more per [`CHUNK`] or part of
/// one (an empty message is one chunk).
pub const fn sealed_len(plain: usize) -> usize {
    let chunks = plain.div_ceil(CHUNK);
    plain + TAG_LEN * if chunks == 0 { 1 } else { chunks }
}

/// `bytes` in pieces of `n`; an empty slice is one empty piece.
fn chunks(bytes: &[u8], n: usize) -> impl Iterator<Item = &[u8]> {
    let empty = bytes.is_empty().then_some(&bytes[..0]);
    bytes.chunks(n).chain(empty)
}

fn encode(msg: &Message<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.encoded_len());
    msg.emit(0, &mut out);
    out
}

/// Whether `bytes` is an AuthHello message.
pub fn is_hello(bytes: &[u8]) -> bool {
    matches!(Message::parse(bytes), Ok((_, Message::AuthHello(_))))
}

/// The body of an AuthReply message, if `bytes` is one.
pub fn reply_body(bytes: &[u8]) -> Option<&[u8]> {
    match Message::parse(bytes) {
        Ok((_, Message::AuthReply(b))) => Some(b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_messaging::endpoint::handshake;
    use splitnet_messaging::wire::{self, ErrorCode, Queue, Role};

    fn pair() -> (Key, Key) {
        (generate().unwrap(), generate().unwrap())
    }

    fn hello() -> Vec<u8> {
        handshake::hello(Role::Host, 0, Queue { index: 0, count: 1 }, 0, 7, 70_000)
    }

    /// The host's AuthHello for `ioc_pub`.
    fn first(host: &Key, ioc_pub: &Key, ts: u64) -> (Initiator, Vec<u8>) {
        let mut i = Initiator::new(host, ioc_pub).unwrap();
        let msg = i.hello(&hello(), ts).unwrap();
        assert!(is_hello(&msg));
        (i, msg)
    }

    #[test]
    fn both_sides_prove_their_keys_and_then_seal() {
        let (host, ioc) = pair();
        let (i, body) = first(&host, &public_key(&ioc), 42);
        let (mut r, got) = Responder::accept(&ioc, &body).unwrap();
        assert_eq!(got, hello());
        assert_eq!(r.peer, public_key(&host));
        assert_eq!(r.timestamp, 42);
        let answer = handshake::reply(1, ErrorCode::Ok, 9, 70_000);
        let msg = r.reply(&answer).unwrap();
        let (got, mut host_seal) = i.reply(reply_body(&msg).unwrap()).unwrap();
        assert_eq!(got, answer);
        let mut ioc_seal = r.into_sealer().unwrap();
        let mut plain = Vec::new();
        assert_eq!(
            sealed_len(wire::MAX_MESSAGE_LEN),
            wire::MAX_MESSAGE_LEN + 2 * TAG_LEN
        );
        for n in [0, 1, 100, CHUNK, CHUNK + 1, wire::MAX_MESSAGE_LEN] {
            let m = vec![n as u8; n];
            let s = host_seal.seal(&m).unwrap();
            assert_eq!(s.len(), sealed_len(n));
            ioc_seal.open(&s, &mut plain).unwrap();
            assert_eq!(plain, m);
            let s = ioc_seal.seal(&m).unwrap();
            host_seal.open(&s, &mut plain).unwrap();
            assert_eq!(plain, m);
        }
    }

    #[test]
    fn flags_ride_after_the_timestamp_only_when_asked_for() {
        let (host, ioc) = pair();
        let (_, plain) = first(&host, &public_key(&ioc), 42);
        let (r, _) = Responder::accept(&ioc, &plain).unwrap();
        assert_eq!(r.flags, 0);
        let mut i = Initiator::new(&host, &public_key(&ioc)).unwrap();
        let asking = i
            .hello_asking(&hello(), 43, wire::HelloReply::SEALED_DATA)
            .unwrap();
        assert_eq!(asking.len(), plain.len() + FLAGS_LEN, "four bytes more");
        let (r, got) = Responder::accept(&ioc, &asking).unwrap();
        assert_eq!((r.flags, r.timestamp), (wire::HelloReply::SEALED_DATA, 43));
        assert_eq!(got, hello());
        // A payload of any other length is not a Hello, a timestamp and flags.
        for extra in [1, 2, 3, 5, 8] {
            let mut i = Initiator::new(&host, &public_key(&ioc)).unwrap();
            let mut odd = hello();
            odd.extend(std::iter::repeat_n(0, extra));
            let msg = i.hello(&odd, 44).unwrap();
            assert!(matches!(
                Responder::accept(&ioc, &msg),
                Err(AuthError::Payload(_))
            ));
        }
    }

    #[test]
    fn records_seal_one_noise_message_each() {
        let (host, ioc) = pair();
        let (i, body) = first(&host, &public_key(&ioc), 1);
        let (mut r, _) = Responder::accept(&ioc, &body).unwrap();
        let msg = r
            .reply(&handshake::reply(1, ErrorCode::Ok, 9, 70_000))
            .unwrap();
        let (_, mut h) = i.reply(reply_body(&msg).unwrap()).unwrap();
        let mut o = r.into_sealer().unwrap();
        let mut wire = vec![0xEE];
        h.seal_record(&[1, 2, 3], &mut wire).unwrap();
        assert_eq!(wire.len(), 1 + 3 + TAG_LEN, "appended");
        let mut out = vec![0; CHUNK];
        assert_eq!(o.open_record(&wire[1..], &mut out).unwrap(), 3);
        assert_eq!(&out[..3], &[1, 2, 3]);
        assert!(h.seal_record(&vec![0; CHUNK + 1], &mut wire).is_err());
    }

    #[test]
    fn the_wrong_ioc_key_is_found_out_by_the_ioc() {
        let (host, ioc) = pair();
        let other = generate().unwrap();
        let (_, body) = first(&host, &public_key(&other), 1);
        assert!(matches!(
            Responder::accept(&ioc, &body),
            Err(AuthError::Noise(_))
        ));
    }

    /// Both sealers of a completed handshake: the host's and the IOC's.
    fn sealers(host: &Key, ioc: &Key, ts: u64) -> (Sealer, Sealer) {
        let (i, body) = first(host, &public_key(ioc), ts);
        let (mut r, _) = Responder::accept(ioc, &body).unwrap();
        let msg = r
            .reply(&handshake::reply(1, ErrorCode::Ok, 9, 70_000))
            .unwrap();
        let (_, h) = i.reply(reply_body(&msg).unwrap()).unwrap();
        (h, r.into_sealer().unwrap())
    }

    #[test]
    fn an_answer_from_another_ioc_is_refused_by_the_host() {
        let (host, ioc) = pair();
        let (i, _) = first(&host, &public_key(&ioc), 1);
        // An impostor cannot read the host's message; its answer comes from a handshake of
        // its own, which the host cannot open.
        let impostor = generate().unwrap();
        let (_, body) = first(&generate().unwrap(), &public_key(&impostor), 1);
        let (mut r, _) = Responder::accept(&impostor, &body).unwrap();
        let msg = r
            .reply(&handshake::reply(1, ErrorCode::Ok, 1, 70_000))
            .unwrap();
        assert!(i.reply(reply_body(&msg).unwrap()).is_err());
    }

    #[test]
    fn altered_replayed_or_reordered_sealed_messages_fail() {
        let (host, ioc) = pair();
        let mut out = Vec::new();
        let (mut h, mut o) = sealers(&host, &ioc, 1);
        let _first = h.seal(b"first").unwrap();
        let second = h.seal(b"second").unwrap();
        assert!(o.open(&second, &mut out).is_err(), "out of order");
        let (mut h, mut o) = sealers(&host, &ioc, 2);
        let first = h.seal(b"first").unwrap();
        o.open(&first, &mut out).unwrap();
        assert_eq!(out, b"first");
        assert!(o.open(&first, &mut out).is_err(), "replayed");
        let (mut h, mut o) = sealers(&host, &ioc, 3);
        let mut altered = h.seal(b"first").unwrap();
        altered[0] ^= 1;
        assert!(o.open(&altered, &mut out).is_err(), "altered");
    }

    #[test]
    fn the_channel_in_the_clear_is_bound_to_the_handshake() {
        let (host, ioc) = pair();
        let (_, mut msg) = first(&host, &public_key(&ioc), 1);
        assert_eq!(
            &msg[4..12],
            &[0, 0, 0, 0, 0, 0, 0, 0],
            "channel 0 in the clear"
        );
        msg[11] = 1;
        assert!(
            Responder::accept(&ioc, &msg).is_err(),
            "another channel named"
        );
        msg[11] = 200;
        assert!(
            Responder::accept(&ioc, &msg).is_err(),
            "a channel out of range"
        );
    }

    #[test]
    fn garbage_never_panics() {
        let ioc = generate().unwrap();
        for n in [0, 1, 31, 32, 95, 96, 200, 1000] {
            assert!(Responder::accept(&ioc, &vec![0xA5; n]).is_err());
        }
    }

    #[test]
    fn timestamps_increase() {
        let a = timestamp();
        let b = timestamp();
        assert!(b > a);
    }

    #[test]
    fn public_keys_match_snow() {
        let kp = Builder::new(params()).generate_keypair().unwrap();
        let mut k = [0; KEY_LEN];
        k.copy_from_slice(&kp.private);
        assert_eq!(public_key(&k).as_slice(), kp.public.as_slice());
    }
}
