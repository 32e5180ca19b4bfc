//! A control channel after an authenticated handshake, on its socket or on an RDMA queue
//! pair: every SEND carries its message sealed ([`Sealer`]), so nothing on the path can
//! forge, alter, replay, reorder or drop a control message (CfgUtil among them) unnoticed. A
//! SEND that does not open ends the channel. Control travels in SENDs only (a control
//! channel carries no RDMA writes).

use crate::auth::Sealer;
use crate::StreamConn;
use splitnet_messaging::adapter::{Channel, ChannelError, Op, Payload, RxCompletion};
use splitnet_messaging::memory::{Registry, SendBuf, SendBufCache, SharedBytes};
use std::io;

/// A channel whose SENDs are sealed.
#[derive(Debug)]
pub struct SealedConn<C = StreamConn> {
    conn: C,
    sealer: Sealer,
    /// The last SEND received, opened.
    plain: Vec<u8>,
    /// Send buffers whose bytes went out sealed in a copy: returned on reclaim.
    copied: Vec<SendBuf>,
    /// Their capacity.
    copied_bytes: usize,
}

impl<C: Channel> SealedConn<C> {
    /// Seals `conn`'s SENDs from now on with `sealer`. `conn` must take SENDs of
    /// [`auth::sealed_len`](crate::auth::sealed_len) of the largest message.
    pub fn new(conn: C, sealer: Sealer) -> SealedConn<C> {
        SealedConn {
            conn,
            sealer,
            plain: Vec::new(),
            copied: Vec::new(),
            copied_bytes: 0,
        }
    }

    /// The channel underneath, for its readiness.
    pub fn conn(&self) -> &C {
        &self.conn
    }

    /// The channel underneath.
    pub fn conn_mut(&mut self) -> &mut C {
        &mut self.conn
    }
}

impl<C: Channel> Channel for SealedConn<C> {
    fn post(&mut self, op: Op, prefix: &[u8], payload: Payload) {
        if !matches!(op, Op::Send) {
            // Not a message: nothing to seal (the peer refuses writes on a control channel).
            return self.conn.post(op, prefix, payload);
        }
        let mut plain = prefix.to_vec();
        match payload {
            Payload::Empty => {}
            Payload::Bytes(b) => plain.extend_from_slice(&b),
            Payload::Buf(b) => {
                plain.extend_from_slice(b.as_slice());
                self.copied_bytes += b.capacity();
                self.copied.push(b);
            }
        }
        match self.sealer.seal(&plain) {
            Ok(sealed) => self.conn.post(Op::Send, &[], Payload::Bytes(sealed)),
            // Only a nonce run out after 2^64 messages: the channel cannot go on.
            Err(e) => tracing::error!("cannot seal a control message: {e}"),
        }
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        self.conn.flush()
    }

    fn poll_recv(&mut self, reg: &mut Registry) -> Result<Option<RxCompletion>, ChannelError> {
        match self.conn.poll_recv(reg)? {
            Some(RxCompletion::Recv { .. }) => {
                self.sealer
                    .open(self.conn.received(), &mut self.plain)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                Ok(Some(RxCompletion::Recv {
                    len: self.plain.len(),
                }))
            }
            other => Ok(other),
        }
    }

    fn received(&self) -> &[u8] {
        &self.plain
    }

    fn reclaim(&mut self, cache: &mut SendBufCache) {
        for b in self.copied.drain(..) {
            self.copied_bytes -= b.capacity();
            cache.put(b);
        }
        self.conn.reclaim(cache)
    }

    fn pending(&self) -> usize {
        self.conn.pending()
    }

    fn held_bytes(&self) -> usize {
        self.conn.held_bytes() + self.copied_bytes
    }

    fn set_writes_allowed(&mut self, allowed: bool) {
        self.conn.set_writes_allowed(allowed)
    }

    fn close(&mut self, reg: &mut Registry) -> usize {
        self.conn.close(reg)
    }

    fn places_writes(&self) -> bool {
        self.conn.places_writes()
    }

    fn peer_window(&self, addr: u64, len: usize) -> Option<SharedBytes<'_>> {
        self.conn.peer_window(addr, len)
    }

    fn post_placed(&mut self, op: Op, len: u32) {
        self.conn.post_placed(op, len)
    }

    fn prepare_sleep(&mut self) -> bool {
        self.conn.prepare_sleep()
    }

    fn wake(&mut self) {
        self.conn.wake()
    }

    fn withdraw(&mut self) {
        self.conn.withdraw()
    }

    fn input_pending(&mut self) -> bool {
        self.conn.input_pending()
    }

    fn take_rang_peer(&mut self) -> bool {
        self.conn.take_rang_peer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{self, generate, public_key, Initiator, Responder};
    use splitnet_messaging::adapter::{pipe, PipeEnd, StreamChannel};
    use splitnet_messaging::endpoint::handshake;
    use splitnet_messaging::memory::DomainId;
    use splitnet_messaging::wire::{self, ErrorCode, Queue, Role};

    /// A stream channel over `end` that takes sealed SENDs of the largest message.
    fn stream(end: PipeEnd, domain: u64) -> StreamChannel<PipeEnd> {
        let mut c = StreamChannel::new(end, DomainId(domain), 0);
        c.set_max_send(auth::sealed_len(wire::MAX_MESSAGE_LEN));
        c
    }

    fn sealers() -> (Sealer, Sealer) {
        let (host, ioc) = (generate().unwrap(), generate().unwrap());
        let mut i = Initiator::new(&host, &public_key(&ioc)).unwrap();
        let hello = handshake::hello(Role::Host, 0, Queue { index: 0, count: 1 }, 0, 1, 70_000);
        let m1 = i.hello(&hello, 1).unwrap();
        let (mut r, _) = Responder::accept(&ioc, &m1).unwrap();
        let m2 = r
            .reply(&handshake::reply(1, ErrorCode::Ok, 5, 70_000))
            .unwrap();
        let (_, h) = i.reply(auth::reply_body(&m2).unwrap()).unwrap();
        (h, r.into_sealer().unwrap())
    }

    /// The next message on `ch`, which the pipe already holds.
    fn recv(ch: &mut impl Channel, reg: &mut Registry) -> Result<Vec<u8>, ChannelError> {
        match ch.poll_recv(reg)? {
            Some(RxCompletion::Recv { len }) => {
                assert_eq!(len, ch.received().len());
                Ok(ch.received().to_vec())
            }
            other => panic!("expected a message, got {other:?}"),
        }
    }

    #[test]
    fn messages_cross_sealed_and_open_in_order() {
        let (a, b) = pipe(1 << 20);
        let (sa, sb) = sealers();
        let mut x = SealedConn::new(stream(a, 1), sa);
        let mut y = SealedConn::new(stream(b, 2), sb);
        let mut reg = Registry::new(0);
        for n in [0usize, 12, 4000, wire::MAX_MESSAGE_LEN] {
            let m = vec![n as u8; n];
            x.post(
                Op::Send,
                &m[..n.min(3)],
                Payload::Bytes(m[n.min(3)..].to_vec()),
            );
            assert!(x.flush().unwrap());
            assert_eq!(recv(&mut y, &mut reg).unwrap(), m);
        }
    }

    #[test]
    fn a_forged_message_ends_the_channel() {
        let (a, b) = pipe(1 << 20);
        let (_, sb) = sealers();
        // The peer sends a plain (unsealed) message, as an attacker without the keys would.
        let mut x: StreamChannel<PipeEnd> = StreamChannel::new(a, DomainId(1), 0);
        let mut y = SealedConn::new(stream(b, 2), sb);
        let mut reg = Registry::new(0);
        let mut goodbye = Vec::new();
        wire::Message::Keepalive.emit(0, &mut goodbye);
        goodbye.extend_from_slice(&[0; auth::TAG_LEN]);
        x.post(Op::Send, &[], Payload::Bytes(goodbye));
        assert!(x.flush().unwrap());
        assert!(recv(&mut y, &mut reg).is_err());
    }
}
