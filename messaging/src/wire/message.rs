//! Every message of the protocol: parse from untrusted bytes, emit to a buffer.

use super::cfg::CfgCode;
use super::error::{ErrorCode, WireError};
use super::header::{Function, Header, Reader, HEADER_LEN};
use super::{MAX_DATA_CHANNELS, MAX_MESSAGE_LEN, MAX_QUEUES, MAX_SEND_DATA, MIN_VERSION, VERSION};

/// Bytes of one BufferRecvPool entry.
pub const POOL_ENTRY_LEN: usize = 40;
/// Bytes of one BufferRecvPoolUpdate run.
pub const POOL_RUN_LEN: usize = 12;
/// Most pool entries one BufferRecvPool can carry.
pub const MAX_POOL_ENTRIES: usize = (MAX_MESSAGE_LEN - HEADER_LEN - 4) / POOL_ENTRY_LEN;
/// Most runs one BufferRecvPoolUpdate can carry.
pub const MAX_POOL_RUNS: usize = (MAX_MESSAGE_LEN - HEADER_LEN - 4) / POOL_RUN_LEN;
/// Most pool references one BufferPoolFlushRequest can carry.
pub const MAX_FLUSH_REFS: usize = (MAX_MESSAGE_LEN - HEADER_LEN - 4) / 4;

/// Which end of the split driver a peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The host module driver.
    Host = 1,
    /// The I/O unit module driver.
    Ioc = 2,
}

/// Opens a channel (set-up, channel 0 first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Lowest version the sender speaks.
    pub min_version: u16,
    /// Highest version the sender speaks.
    pub max_version: u16,
    /// The sender's role.
    pub role: Role,
    /// 0 for the control channel, 1..=16 for data channels.
    pub channel: u8,
    /// Which queue of a multi-queue host this session serves.
    pub queue: Queue,
    /// 0 to open a session (control channel); the session id for a data channel.
    pub session: u64,
    /// Stable identity of the sender (a host's MAC is derived from it).
    pub node_id: u64,
    /// Largest SEND the sender accepts.
    pub max_message: u32,
}

/// A session's place among the queues of one host: queue `index` of `count`.
///
/// Each queue of a multi-queue host (one TAP queue, one thread on the host) is a session of
/// its own; the IOC ties the sessions of one node id together and spreads frames over them
/// by flow. On the wire: index u8, count u8, where a count of 0 (a peer that predates
/// queues) means a single queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queue {
    /// 0 for the host's first queue, which also carries its configuration.
    pub index: u8,
    /// Queues the host opens (1..=[`MAX_QUEUES`]).
    pub count: u8,
}

impl Queue {
    /// A single-queue host.
    pub const SINGLE: Queue = Queue { index: 0, count: 1 };

    /// The first queue, which carries the host's configuration.
    pub fn is_first(&self) -> bool {
        self.index == 0
    }
}

/// Answers a Hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReply {
    /// Version chosen.
    pub version: u16,
    /// `Ok`, or why the channel is refused.
    pub status: ErrorCode,
    /// What the listening side agreed to of what the AuthHello asked for
    /// ([`HelloReply::SEALED_DATA`]); 0 in an answer to a plain Hello.
    pub flags: u32,
    /// Session id.
    pub session: u64,
    /// Largest SEND the sender accepts.
    pub max_message: u32,
}

impl HelloReply {
    /// Flag of an AuthHello and its HelloReply: the data channel's byte stream is sealed
    /// (docs/protocol.md 5.1), asked for by the host, agreed to by the IOC.
    pub const SEALED_DATA: u32 = 1;
    /// Flag of a data channel's AuthHello and its HelloReply: the session opens as a
    /// standby (docs/protocol.md 6.4): admitted, its pools advertised, but it claims no MAC
    /// and carries no frame until the host sends [`super::CfgCode::Activate`].
    pub const STANDBY: u32 = 1 << 1;
    /// Flag of a data channel's AuthHello and its HelloReply: the IOC sends a Keepalive
    /// whenever it has sent nothing for the interval in [`HelloReply::liveness_ms`]
    /// (docs/protocol.md 8): asked with the host's interval, answered with the one kept.
    pub const LIVENESS: u32 = 1 << 2;
    /// The flags that carry no value (bits 0..16); bits 16..32 carry the liveness interval.
    pub const FLAG_BITS: u32 = 0xffff;

    /// `flags` asking for (or agreeing to) a liveness interval of `ms` milliseconds
    /// (at most 65,535).
    pub fn with_liveness(flags: u32, ms: u16) -> u32 {
        (flags & Self::FLAG_BITS) | Self::LIVENESS | (u32::from(ms) << 16)
    }

    /// The liveness interval `flags` ask for or agree to, in milliseconds; `None` without
    /// [`HelloReply::LIVENESS`] or with an interval of 0.
    pub fn liveness_ms(flags: u32) -> Option<u16> {
        let ms = (flags >> 16) as u16;
        (flags & Self::LIVENESS != 0 && ms > 0).then_some(ms)
    }
}

/// The sender is closing the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Goodbye {
    /// `Ok` or `ShuttingDown` for a clean close, else the error that ended it.
    pub code: ErrorCode,
}

/// One advertised pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolEntry {
    /// Pool reference.
    pub pool_ref: u32,
    /// Number of elements.
    pub element_count: u32,
    /// Bytes per element.
    pub element_size: u32,
    /// Registered address of element 0.
    pub address: u64,
    /// Memory handle.
    pub handle: u64,
    /// Implementation-specific pool context.
    pub context: u64,
}

/// Asks for a new pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGet {
    /// Bytes per element wanted.
    pub element_size: u32,
    /// Number of elements wanted.
    pub element_count: u32,
}

/// Consecutive elements of one pool that are free again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRun {
    /// Pool reference.
    pub pool_ref: u32,
    /// First element.
    pub first: u32,
    /// Number of elements (at least 1).
    pub count: u32,
}

/// Transfer indication of an RDMA write that could not carry it as immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Indicate {
    /// Pool written.
    pub pool_ref: u32,
    /// Element written.
    pub element: u32,
    /// Bytes written.
    pub length: u32,
}

/// A CfgUtilRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CfgRequest<'a> {
    /// What is requested.
    pub code: CfgCode,
    /// Request data.
    pub data: &'a [u8],
}

/// A CfgUtilReply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CfgReply<'a> {
    /// The request answered.
    pub code: CfgCode,
    /// Outcome.
    pub status: ErrorCode,
    /// Reply data.
    pub data: &'a [u8],
}

/// Every message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// Channel set-up.
    Hello(Hello),
    /// Channel set-up answer.
    HelloReply(HelloReply),
    /// Authenticated channel set-up: a Noise handshake message (docs/protocol.md 5.1).
    AuthHello(&'a [u8]),
    /// Authenticated channel set-up answer: a Noise handshake message.
    AuthReply(&'a [u8]),
    /// Liveness probe.
    Keepalive,
    /// Closing.
    Goodbye(Goodbye),
    /// Pools advertised by a target.
    BufferRecvPool(Vec<PoolEntry>),
    /// An initiator asks for a pool.
    BufferRecvPoolGet(PoolGet),
    /// Credits returned by a target.
    BufferRecvPoolUpdate(Vec<PoolRun>),
    /// Pools to stop using and free.
    BufferPoolFlushRequest(Vec<u32>),
    /// Confirms the flush with the same transaction context.
    BufferPoolFlushReply,
    /// A frame inline.
    SendData(&'a [u8]),
    /// Transfer indication.
    BufferRdmaIndicate(Indicate),
    /// Configuration or utility request.
    CfgUtilRequest(CfgRequest<'a>),
    /// Configuration or utility reply.
    CfgUtilReply(CfgReply<'a>),
}

fn role(v: u8) -> Result<Role, WireError> {
    match v {
        1 => Ok(Role::Host),
        2 => Ok(Role::Ioc),
        v => Err(WireError::BadField {
            field: "role",
            value: v.into(),
        }),
    }
}

/// Reads `data_size` and exactly that many bytes.
fn sized<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], WireError> {
    let declared = r.u32()? as usize;
    if declared != r.remaining() {
        return Err(WireError::LengthMismatch {
            declared,
            actual: r.remaining(),
        });
    }
    r.bytes(declared)
}

impl<'a> Message<'a> {
    /// The function code.
    pub fn function(&self) -> Function {
        match self {
            Message::Hello(_) => Function::Hello,
            Message::HelloReply(_) => Function::HelloReply,
            Message::AuthHello(_) => Function::AuthHello,
            Message::AuthReply(_) => Function::AuthReply,
            Message::Keepalive => Function::Keepalive,
            Message::Goodbye(_) => Function::Goodbye,
            Message::BufferRecvPool(_) => Function::BufferRecvPool,
            Message::BufferRecvPoolGet(_) => Function::BufferRecvPoolGet,
            Message::BufferRecvPoolUpdate(_) => Function::BufferRecvPoolUpdate,
            Message::BufferPoolFlushRequest(_) => Function::BufferPoolFlushRequest,
            Message::BufferPoolFlushReply => Function::BufferPoolFlushReply,
            Message::SendData(_) => Function::SendData,
            Message::BufferRdmaIndicate(_) => Function::BufferRdmaIndicate,
            Message::CfgUtilRequest(_) => Function::CfgUtilRequest,
            Message::CfgUtilReply(_) => Function::CfgUtilReply,
        }
    }

    /// Parses one whole message: `buf` holds exactly one header and body.
    ///
    /// Any version is accepted on a Hello or AuthHello (negotiation happens in the Hello);
    /// every other message must carry a version in `MIN_VERSION..=VERSION`.
    pub fn parse(buf: &'a [u8]) -> Result<(Header, Message<'a>), WireError> {
        if buf.len() > MAX_MESSAGE_LEN {
            return Err(WireError::TooLong(buf.len()));
        }
        let header = Header::parse(buf)?;
        let negotiates = matches!(header.function, Function::Hello | Function::AuthHello);
        if !negotiates && !(MIN_VERSION..=VERSION).contains(&header.version) {
            return Err(WireError::UnsupportedVersion(header.version));
        }
        let mut r = Reader::new(buf);
        r.bytes(HEADER_LEN)?;
        let msg = match header.function {
            Function::Hello => {
                let min_version = r.u16()?;
                let max_version = r.u16()?;
                let role = role(r.u8()?)?;
                let channel = r.u8()?;
                if channel > MAX_DATA_CHANNELS {
                    return Err(WireError::BadField {
                        field: "channel",
                        value: channel.into(),
                    });
                }
                let index = r.u8()?;
                let count = r.u8()?.max(1);
                if count > MAX_QUEUES || index >= count {
                    return Err(WireError::BadQueue {
                        index,
                        count,
                        max: MAX_QUEUES,
                    });
                }
                Message::Hello(Hello {
                    min_version,
                    max_version,
                    role,
                    channel,
                    queue: Queue { index, count },
                    session: r.u64()?,
                    node_id: r.u64()?,
                    max_message: r.u32()?,
                })
            }
            Function::HelloReply => {
                let version = r.u16()?;
                let status = ErrorCode::from_u16(r.u16()?);
                Message::HelloReply(HelloReply {
                    version,
                    status,
                    flags: r.u32()?,
                    session: r.u64()?,
                    max_message: r.u32()?,
                })
            }
            Function::AuthHello => Message::AuthHello(r.bytes(r.remaining())?),
            Function::AuthReply => Message::AuthReply(r.bytes(r.remaining())?),
            Function::Keepalive => Message::Keepalive,
            Function::Goodbye => {
                let code = ErrorCode::from_u16(r.u16()?);
                r.reserved(2)?;
                Message::Goodbye(Goodbye { code })
            }
            Function::BufferRecvPool => {
                let n = r.count(POOL_ENTRY_LEN, MAX_POOL_ENTRIES)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let pool_ref = r.u32()?;
                    let element_count = r.u32()?;
                    let element_size = r.u32()?;
                    r.reserved(4)?;
                    v.push(PoolEntry {
                        pool_ref,
                        element_count,
                        element_size,
                        address: r.u64()?,
                        handle: r.u64()?,
                        context: r.u64()?,
                    });
                }
                Message::BufferRecvPool(v)
            }
            Function::BufferRecvPoolGet => Message::BufferRecvPoolGet(PoolGet {
                element_size: r.u32()?,
                element_count: r.u32()?,
            }),
            Function::BufferRecvPoolUpdate => {
                let n = r.count(POOL_RUN_LEN, MAX_POOL_RUNS)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let run = PoolRun {
                        pool_ref: r.u32()?,
                        first: r.u32()?,
                        count: r.u32()?,
                    };
                    if run.count == 0 {
                        return Err(WireError::EmptyList);
                    }
                    if run.first.checked_add(run.count).is_none() {
                        return Err(WireError::BadField {
                            field: "first_element + element_count",
                            value: u64::from(run.first) + u64::from(run.count),
                        });
                    }
                    v.push(run);
                }
                Message::BufferRecvPoolUpdate(v)
            }
            Function::BufferPoolFlushRequest => {
                let n = r.count(4, MAX_FLUSH_REFS)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(r.u32()?);
                }
                Message::BufferPoolFlushRequest(v)
            }
            Function::BufferPoolFlushReply => Message::BufferPoolFlushReply,
            Function::SendData => {
                let data = sized(&mut r)?;
                if data.len() > MAX_SEND_DATA {
                    return Err(WireError::TooLarge {
                        field: "SendData length",
                        value: data.len() as u64,
                        max: MAX_SEND_DATA as u64,
                    });
                }
                Message::SendData(data)
            }
            Function::BufferRdmaIndicate => Message::BufferRdmaIndicate(Indicate {
                pool_ref: r.u32()?,
                element: r.u32()?,
                length: r.u32()?,
            }),
            Function::CfgUtilRequest => {
                let code = CfgCode::from_u16(r.u16()?);
                r.reserved(2)?;
                Message::CfgUtilRequest(CfgRequest {
                    code,
                    data: sized(&mut r)?,
                })
            }
            Function::CfgUtilReply => {
                let code = CfgCode::from_u16(r.u16()?);
                let status = ErrorCode::from_u16(r.u16()?);
                Message::CfgUtilReply(CfgReply {
                    code,
                    status,
                    data: sized(&mut r)?,
                })
            }
        };
        r.finish()?;
        Ok((header, msg))
    }

    /// Bytes [`Message::emit`] appends.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Message::Hello(_) => 28,
                Message::HelloReply(_) => 20,
                Message::AuthHello(b) | Message::AuthReply(b) => b.len(),
                Message::Keepalive | Message::BufferPoolFlushReply => 0,
                Message::Goodbye(_) => 4,
                Message::BufferRecvPool(v) => 4 + POOL_ENTRY_LEN * v.len(),
                Message::BufferRecvPoolGet(_) => 8,
                Message::BufferRecvPoolUpdate(v) => 4 + POOL_RUN_LEN * v.len(),
                Message::BufferPoolFlushRequest(v) => 4 + 4 * v.len(),
                Message::SendData(d) => 4 + d.len(),
                Message::BufferRdmaIndicate(_) => 12,
                Message::CfgUtilRequest(c) => 8 + c.data.len(),
                Message::CfgUtilReply(c) => 8 + c.data.len(),
            }
    }

    /// Appends the header (this function, [`VERSION`], `txn`) and the body to `out`.
    ///
    /// Lists must hold at most the `MAX_*` entries their decoder accepts; the caller
    /// splits longer ones.
    pub fn emit(&self, txn: u64, out: &mut Vec<u8>) {
        let mut h = [0u8; HEADER_LEN];
        Header {
            function: self.function(),
            version: VERSION,
            txn,
        }
        .emit(&mut h);
        out.extend_from_slice(&h);
        let u16b = |out: &mut Vec<u8>, v: u16| out.extend_from_slice(&v.to_be_bytes());
        let u32b = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_be_bytes());
        let u64b = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_be_bytes());
        let count = |out: &mut Vec<u8>, n: usize| {
            out.extend_from_slice(&(n as u16).to_be_bytes());
            out.extend_from_slice(&[0, 0]);
        };
        match self {
            Message::Hello(m) => {
                u16b(out, m.min_version);
                u16b(out, m.max_version);
                out.push(m.role as u8);
                out.push(m.channel);
                out.push(m.queue.index);
                out.push(m.queue.count);
                u64b(out, m.session);
                u64b(out, m.node_id);
                u32b(out, m.max_message);
            }
            Message::HelloReply(m) => {
                u16b(out, m.version);
                u16b(out, m.status.to_u16());
                u32b(out, m.flags);
                u64b(out, m.session);
                u32b(out, m.max_message);
            }
            Message::AuthHello(b) | Message::AuthReply(b) => out.extend_from_slice(b),
            Message::Keepalive | Message::BufferPoolFlushReply => {}
            Message::Goodbye(m) => {
                u16b(out, m.code.to_u16());
                u16b(out, 0);
            }
            Message::BufferRecvPool(v) => {
                count(out, v.len());
                for e in v {
                    u32b(out, e.pool_ref);
                    u32b(out, e.element_count);
                    u32b(out, e.element_size);
                    u32b(out, 0);
                    u64b(out, e.address);
                    u64b(out, e.handle);
                    u64b(out, e.context);
                }
            }
            Message::BufferRecvPoolGet(g) => {
                u32b(out, g.element_size);
                u32b(out, g.element_count);
            }
            Message::BufferRecvPoolUpdate(v) => {
                count(out, v.len());
                for run in v {
                    u32b(out, run.pool_ref);
                    u32b(out, run.first);
                    u32b(out, run.count);
                }
            }
            Message::BufferPoolFlushRequest(v) => {
                count(out, v.len());
                for r in v {
                    u32b(out, *r);
                }
            }
            Message::SendData(d) => {
                u32b(out, d.len() as u32);
                out.extend_from_slice(d);
            }
            Message::BufferRdmaIndicate(i) => {
                u32b(out, i.pool_ref);
                u32b(out, i.element);
                u32b(out, i.length);
            }
            Message::CfgUtilRequest(c) => {
                u16b(out, c.code.to_u16());
                u16b(out, 0);
                u32b(out, c.data.len() as u32);
                out.extend_from_slice(c.data);
            }
            Message::CfgUtilReply(c) => {
                u16b(out, c.code.to_u16());
                u16b(out, c.status.to_u16());
                u32b(out, c.data.len() as u32);
                out.extend_from_slice(c.data);
            }
        }
    }
}
