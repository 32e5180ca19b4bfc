//! A two-peer harness over the in-process transport, for tests, fuzzing and benchmarks.
//!
//! Both peers live in one thread; [`Pair::drive`] moves bytes both ways and feeds every
//! completion to the sessions until nothing moves any more.

use crate::adapter::{pipe, PipeEnd, StreamChannel};
use crate::endpoint::{
    InitiatorConfig, Lane, Link, LinkError, LinkEvent, PoolSpec, Posted, Session, SessionConfig,
    TargetConfig,
};
use crate::memory::{DomainId, Registry, SendBufCache};
use crate::wire;

/// Channel type of the in-process harness.
pub type PipeChannel = StreamChannel<PipeEnd>;

/// Channel type of the TCP loopback harness.
pub type TcpChannel = StreamChannel<std::net::TcpStream>;

/// One side of a [`Pair`].
#[derive(Debug)]
pub struct Peer<C = PipeChannel> {
    /// Its adapter's memory.
    pub reg: Registry,
    /// Its connection to the other side.
    pub link: Link<C>,
    /// Its send buffers.
    pub cache: SendBufCache,
    /// Frames delivered to it, in order (kept only while `keep_frames`).
    pub received: Vec<Vec<u8>>,
    /// Frames delivered to it, counted.
    pub delivered: u64,
    /// Whether delivered frames are copied into `received` (benchmarks turn this off).
    pub keep_frames: bool,
    /// Events it saw, in order.
    pub events: Vec<LinkEvent>,
}

/// Which peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The first peer.
    A,
    /// The second peer.
    B,
}

/// A session configuration for tests: two pools (small and large elements).
pub fn config(send_data_max: usize) -> SessionConfig {
    SessionConfig {
        advertise: vec![
            PoolSpec {
                element_size: 2048,
                element_count: 16,
            },
            PoolSpec {
                element_size: 65_600,
                element_count: 8,
            },
        ],
        target: TargetConfig {
            credit_batch: 4,
            max_granted_bytes: 8 << 20,
            max_pools: 8,
            max_element_size: 1 << 20,
        },
        initiator: InitiatorConfig {
            send_data_max,
            max_pools: 16,
            max_elements: 65_536,
            pool_get: Some(PoolSpec {
                element_size: 2048,
                element_count: 16,
            }),
        },
    }
}

/// What became of a frame given to [`Pair::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Posted inline (SendData).
    Inline,
    /// Posted as an RDMA write.
    Rdma,
    /// Not posted: no credit.
    Backpressure,
    /// Not posted: too large.
    TooLarge,
}

/// Two connected peers.
#[derive(Debug)]
pub struct Pair<C = PipeChannel> {
    /// First peer.
    pub a: Peer<C>,
    /// Second peer.
    pub b: Peer<C>,
}

fn peer<S: std::io::Read + std::io::Write>(
    domain: u32,
    config: SessionConfig,
    ctrl: S,
    data: S,
) -> Peer<StreamChannel<S>> {
    let d = DomainId(domain);
    let max = wire::MAX_MESSAGE_LEN;
    let mut reg = Registry::new(1 << 30);
    let mut session = Session::new(d, config);
    session
        .start(&mut reg)
        .expect("test pools fit the test registry");
    Peer {
        reg,
        link: Link::new(
            session,
            StreamChannel::new(ctrl, d, max),
            StreamChannel::new(data, d, max),
        ),
        cache: SendBufCache::new(70_000, 256),
        received: Vec::new(),
        delivered: 0,
        keep_frames: true,
        events: Vec::new(),
    }
}

impl Pair {
    /// Two peers whose pipes buffer `capacity` bytes per direction.
    pub fn new(a: SessionConfig, b: SessionConfig, capacity: usize) -> Pair {
        let (c0, c1) = pipe(capacity);
        let (d0, d1) = pipe(capacity);
        Pair {
            a: peer(1, a, c0, d0),
            b: peer(2, b, c1, d1),
        }
    }
}

impl Pair<TcpChannel> {
    /// Two peers over real TCP connections on loopback (non-blocking, `TCP_NODELAY`),
    /// both driven from the calling thread.
    pub fn tcp(a: SessionConfig, b: SessionConfig) -> std::io::Result<Pair<TcpChannel>> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let conn = || -> std::io::Result<(std::net::TcpStream, std::net::TcpStream)> {
            let x = std::net::TcpStream::connect(addr)?;
            let (y, _) = l.accept()?;
            for s in [&x, &y] {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
            }
            Ok((x, y))
        };
        let (c0, c1) = conn()?;
        let (d0, d1) = conn()?;
        Ok(Pair {
            a: peer(1, a, c0, d0),
            b: peer(2, b, c1, d1),
        })
    }
}

impl<S: std::io::Read + std::io::Write> Pair<StreamChannel<S>> {
    /// The peer on `side`.
    pub fn peer(&mut self, side: Side) -> &mut Peer<StreamChannel<S>> {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Posts `frame` from `side`. A frame not posted goes back to the cache; with every
    /// send buffer in flight the answer is backpressure, as for a lack of credit.
    pub fn send(&mut self, side: Side, frame: &[u8]) -> Outcome {
        let p = self.peer(side);
        let Some(mut buf) = p.cache.get() else {
            return Outcome::Backpressure;
        };
        assert!(buf.fill_from(frame), "frame larger than harness buffers");
        match p.link.post_frame(buf) {
            Posted::SendData => Outcome::Inline,
            Posted::Rdma => Outcome::Rdma,
            Posted::Backpressure(b) => {
                p.cache.put(b);
                Outcome::Backpressure
            }
            Posted::TooLarge(b) => {
                p.cache.put(b);
                Outcome::TooLarge
            }
        }
    }

    /// Moves everything both ways until no peer makes progress. Returns the first side
    /// whose link failed, with its error.
    pub fn drive(&mut self) -> Result<(), (Side, LinkError)> {
        loop {
            let mut progress = false;
            for side in [Side::A, Side::B] {
                let p = self.peer(side);
                let before = (p.delivered, p.events.len(), p.link.pending());
                p.link.flush().map_err(|e| (side, e))?;
                p.link.reclaim(&mut p.cache);
                for lane in [Lane::Control, Lane::Data] {
                    let Peer {
                        reg,
                        link,
                        received,
                        delivered,
                        keep_frames,
                        events,
                        ..
                    } = p;
                    let mut sink = |f: &[u8]| {
                        *delivered += 1;
                        if *keep_frames {
                            received.push(f.to_vec());
                        }
                    };
                    while link
                        .poll(reg, lane, 64, &mut sink, events)
                        .map_err(|e| (side, e))?
                    {}
                }
                p.link.session_mut().flush_credits(&mut p.reg);
                p.link.flush().map_err(|e| (side, e))?;
                let after = (p.delivered, p.events.len(), p.link.pending());
                progress |= before != after;
            }
            if !progress && self.a.link.pending() == 0 && self.b.link.pending() == 0 {
                return Ok(());
            }
        }
    }
}
