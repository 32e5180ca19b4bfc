//! The common header of every message and a bounds-checked reader for bodies.

use super::error::WireError;

/// Bytes in the common header.
pub const HEADER_LEN: usize = 12;

/// Message function codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Function {
    /// Connection set-up request.
    Hello = 0x0001,
    /// Connection set-up answer.
    HelloReply = 0x0002,
    /// Liveness probe.
    Keepalive = 0x0003,
    /// The sender is closing the connection.
    Goodbye = 0x0004,
    /// Authenticated connection set-up request: a Noise handshake message carrying a Hello.
    AuthHello = 0x0005,
    /// Authenticated connection set-up answer: a Noise handshake message carrying a
    /// HelloReply.
    AuthReply = 0x0006,
    /// Target advertises pools.
    BufferRecvPool = 0x0101,
    /// Initiator asks for a pool.
    BufferRecvPoolGet = 0x0102,
    /// Target returns credits.
    BufferRecvPoolUpdate = 0x0103,
    /// Either side asks to stop using and free pools.
    BufferPoolFlushRequest = 0x0104,
    /// Confirms a flush.
    BufferPoolFlushReply = 0x0105,
    /// A frame inline.
    SendData = 0x0201,
    /// Transfer indication that does not fit immediate data.
    BufferRdmaIndicate = 0x0202,
    /// Configuration or utility request.
    CfgUtilRequest = 0x0301,
    /// Configuration or utility reply.
    CfgUtilReply = 0x0302,
}

impl TryFrom<u16> for Function {
    type Error = WireError;

    fn try_from(v: u16) -> Result<Function, WireError> {
        Ok(match v {
            0x0001 => Function::Hello,
            0x0002 => Function::HelloReply,
            0x0003 => Function::Keepalive,
            0x0004 => Function::Goodbye,
            0x0005 => Function::AuthHello,
            0x0006 => Function::AuthReply,
            0x0101 => Function::BufferRecvPool,
            0x0102 => Function::BufferRecvPoolGet,
            0x0103 => Function::BufferRecvPoolUpdate,
            0x0104 => Function::BufferPoolFlushRequest,
            0x0105 => Function::BufferPoolFlushReply,
            0x0201 => Function::SendData,
            0x0202 => Function::BufferRdmaIndicate,
            0x0301 => Function::CfgUtilRequest,
            0x0302 => Function::CfgUtilReply,
            other => return Err(WireError::UnknownFunction(other)),
        })
    }
}

/// The common header: function, version and transaction context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub function: Function,
    /// Protocol version of the sender.
    pub version: u16,
    /// Transaction context: echoed by replies.
    pub txn: u64,
}

impl Header {
    /// Parses the first [`HEADER_LEN`] bytes. The version is not checked here.
    pub fn parse(buf: &[u8]) -> Result<Header, WireError> {
        let mut r = Reader::new(buf);
        let function = Function::try_from(r.u16()?)?;
        Ok(Header {
            function,
            version: r.u16()?,
            txn: r.u64()?,
        })
    }

    /// Encodes the header.
    pub fn emit(&self, out: &mut [u8; HEADER_LEN]) {
        out[0..2].copy_from_slice(&(self.function as u16).to_be_bytes());
        out[2..4].copy_from_slice(&self.version.to_be_bytes());
        out[4..12].copy_from_slice(&self.txn.to_be_bytes());
    }
}

/// Cursor over untrusted bytes: every read is bounds-checked and returns a typed error.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(WireError::Truncated {
                needed: self.pos.saturating_add(n),
                have: self.buf.len(),
            }),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A reserved field of `n` bytes that must be zero.
    pub(crate) fn reserved(&mut self, n: usize) -> Result<(), WireError> {
        if self.bytes(n)?.iter().all(|&b| b == 0) {
            Ok(())
        } else {
            Err(WireError::Reserved)
        }
    }

    /// A list count, checked against the list's maximum and against the bytes present
    /// before anything is allocated for it.
    pub(crate) fn count(&mut self, entry_len: usize, max: usize) -> Result<usize, WireError> {
        let count = usize::from(self.u16()?);
        self.reserved(2)?;
        if count == 0 {
            return Err(WireError::EmptyList);
        }
        if count > max {
            return Err(WireError::TooMany { count, max });
        }
        let need = count * entry_len;
        if need != self.remaining() {
            return Err(WireError::LengthMismatch {
                declared: need,
                actual: self.remaining(),
            });
        }
        Ok(count)
    }

    /// Succeeds when every byte was consumed.
    pub(crate) fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::TrailingBytes(n)),
        }
    }
}
