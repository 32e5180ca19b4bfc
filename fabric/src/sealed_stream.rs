//! A data channel's byte stream sealed record by record (docs/protocol.md 5.1, "Sealed data
//! channel"): what a TCP data channel carries when the host asked for encryption
//! (`auth.encrypt_data`). Everything the channel sends (RDMA writes with their frames,
//! immediates, SENDs) is cut into records of at most [`CHUNK`] bytes, each sealed with the
//! channel's own Noise transport keys (ChaCha20-Poly1305) and framed by its length (u16,
//! big-endian). A record that does not open ends the channel: nothing on the path can read,
//! forge, alter, replay, reorder or drop the data path's bytes unnoticed.
//!
//! It sits under [`StreamChannel`](splitnet_messaging::adapter::StreamChannel) as a
//! non-blocking [`Read`] + [`Write`], so the channel's framing, bounds checks and placement
//! into pools are those of a plain socket. Written by hand because the record layer is this
//! protocol's own (TLS and its crates would bring a second handshake and a second key
//! system); the cryptography is the `snow` crate's.

use crate::auth::{Sealer, CHUNK, TAG_LEN};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};

/// Bytes of a record's length field.
const LEN_FIELD: usize = 2;
/// Records sealed per write at most (a quarter MiB of plaintext): one call's work stays
/// bounded, and bytes are acknowledged only once their records are on the socket.
const RECORDS_PER_WRITE: usize = 4;
/// Bytes of the receive buffer: what one read asks of the socket at most. It holds a whole
/// record of the largest size after the start of another.
const RX_BUF: usize = 256 << 10;
/// Bytes of the largest record, its length field included.
const MAX_RECORD: usize = LEN_FIELD + u16::MAX as usize;

/// A non-blocking stream whose bytes travel sealed (see the module's documentation).
pub struct SealedStream<S> {
    inner: S,
    sealer: Sealer,
    /// Bytes read from `inner`, `rx[rx_at..rx_end]`: records not yet opened.
    rx: Box<[u8]>,
    rx_at: usize,
    rx_end: usize,
    /// The last record opened, read by the caller up to `plain_at`.
    plain: Vec<u8>,
    plain_len: usize,
    plain_at: usize,
    /// Sealed records not yet on the socket, from `tx_at` on.
    tx: Vec<u8>,
    tx_at: usize,
    /// Plaintext sealed into `tx` and not yet acknowledged to the caller: it is
    /// acknowledged once `tx` is on the socket, so a caller whose write was not
    /// acknowledged still holds those bytes (and waits for writability).
    owed: usize,
    /// Scratch for one record's plaintext gathered from several buffers.
    gather: Vec<u8>,
}

impl<S> std::fmt::Debug for SealedStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedStream")
            .field("unopened", &(self.rx_end - self.rx_at))
            .field("unread", &(self.plain_len - self.plain_at))
            .field("unsent", &(self.tx.len() - self.tx_at))
            .finish_non_exhaustive()
    }
}

impl<S: Read + Write> SealedStream<S> {
    /// Seals `inner`'s bytes from now on with `sealer` (the channel's handshake's).
    pub fn new(inner: S, sealer: Sealer) -> SealedStream<S> {
        SealedStream {
            inner,
            sealer,
            rx: vec![0; RX_BUF].into_boxed_slice(),
            rx_at: 0,
            rx_end: 0,
            plain: vec![0; CHUNK],
            plain_len: 0,
            plain_at: 0,
            tx: Vec::new(),
            tx_at: 0,
            owed: 0,
            gather: Vec::with_capacity(CHUNK),
        }
    }

    /// The same, with `unread`: bytes already read from `inner` (what a channel read ahead
    /// of its handshake's last message), opened first.
    pub fn with_unread(inner: S, sealer: Sealer, unread: &[u8]) -> io::Result<SealedStream<S>> {
        let mut s = SealedStream::new(inner, sealer);
        let room = s.rx.get_mut(..unread.len()).ok_or_else(|| {
            invalid("more bytes read ahead of a sealed stream than its buffer holds")
        })?;
        room.copy_from_slice(unread);
        s.rx_end = unread.len();
        Ok(s)
    }

    /// The stream underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The stream underneath, given back (what is sealed and unsent is dropped).
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Opens the next whole record in `rx`, if there is one.
    fn open_next(&mut self) -> io::Result<bool> {
        let unopened = &self.rx[self.rx_at..self.rx_end];
        let Some(len) = unopened.get(..LEN_FIELD) else {
            return Ok(false);
        };
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        if len < TAG_LEN {
            return Err(invalid("a sealed record shorter than its tag"));
        }
        let Some(record) = unopened.get(LEN_FIELD..LEN_FIELD + len) else {
            return Ok(false);
        };
        self.plain_len = self
            .sealer
            .open_record(record, &mut self.plain)
            .map_err(|e| invalid(&format!("a sealed record does not open: {e}")))?;
        self.plain_at = 0;
        self.rx_at += LEN_FIELD + len;
        Ok(true)
    }

    /// Reads more of `inner` into `rx`; `Ok(false)` at its end.
    fn fill(&mut self) -> io::Result<bool> {
        if self.rx_at == self.rx_end {
            (self.rx_at, self.rx_end) = (0, 0);
        } else if RX_BUF - self.rx_end < MAX_RECORD {
            // What is left is less than a record: it moves to the front, and a whole record
            // of any size then fits after it.
            self.rx.copy_within(self.rx_at..self.rx_end, 0);
            (self.rx_at, self.rx_end) = (0, self.rx_end - self.rx_at);
        }
        match self.inner.read(&mut self.rx[self.rx_end..])? {
            0 if self.rx_at < self.rx_end => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream ended inside a sealed record",
            )),
            0 => Ok(false),
            n => {
                self.rx_end += n;
                Ok(true)
            }
        }
    }

    /// Writes what is sealed and unsent; `Ok(true)` once all of it is on the socket.
    fn drain(&mut self) -> io::Result<bool> {
        while self.tx_at < self.tx.len() {
            match self.inner.write(&self.tx[self.tx_at..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.tx_at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.tx.clear();
        self.tx_at = 0;
        Ok(true)
    }

    /// Seals up to [`RECORDS_PER_WRITE`] records of the bytes in `bufs` into `tx`; returns
    /// how many bytes of `bufs` they hold.
    fn seal(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut bytes = bufs.iter().flat_map(|b| b.chunks(CHUNK)).peekable();
        let mut taken = 0;
        for _ in 0..RECORDS_PER_WRITE {
            self.gather.clear();
            while let Some(piece) = bytes.peek_mut() {
                let room = CHUNK - self.gather.len();
                let n = room.min(piece.len());
                self.gather.extend_from_slice(&piece[..n]);
                *piece = &piece[n..];
                if piece.is_empty() {
                    bytes.next();
                }
                if self.gather.len() == CHUNK {
                    break;
                }
            }
            if self.gather.is_empty() {
                break;
            }
            let len = u16::try_from(self.gather.len() + TAG_LEN)
                .map_err(|_| invalid("a record longer than a Noise message"))?;
            self.tx.extend_from_slice(&len.to_be_bytes());
            self.sealer
                .seal_record(&self.gather, &mut self.tx)
                .map_err(|e| io::Error::other(e.to_string()))?;
            taken += self.gather.len();
        }
        Ok(taken)
    }
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

impl<S: Read + Write> Read for SealedStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(&mut [IoSliceMut::new(buf)])
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        loop {
            if self.plain_at < self.plain_len {
                let mut n = 0;
                for b in bufs.iter_mut() {
                    let unread = &self.plain[self.plain_at..self.plain_len];
                    let k = unread.len().min(b.len());
                    b[..k].copy_from_slice(&unread[..k]);
                    self.plain_at += k;
                    n += k;
                    if self.plain_at == self.plain_len {
                        break;
                    }
                }
                return Ok(n);
            }
            if !self.open_next()? && !self.fill()? {
                return Ok(0);
            }
        }
    }
}

impl<S: Read + Write> Write for SealedStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Bytes are acknowledged only once their records are on the socket; until then the
    /// call says `WouldBlock` and the caller offers the same bytes again (with more after
    /// them, perhaps), as a caller of a non-blocking socket does.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.owed == 0 {
            self.owed = self.seal(bufs)?;
            if self.owed == 0 {
                return Ok(0);
            }
        } else if bufs.iter().map(|b| b.len()).sum::<usize>() < self.owed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fewer bytes offered than were sealed: the caller dropped unacknowledged bytes",
            ));
        }
        if !self.drain()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(std::mem::take(&mut self.owed))
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.drain()? {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }
}

#[cfg(test)]
mod tests;
