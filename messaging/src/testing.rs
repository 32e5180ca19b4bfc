//! A two-peer harness over the in-process transport, for tests, fuzzing and benchmarks.
//!
//! Both peers live in one thread; [`Pair::drive`] moves bytes both ways and feeds every
//! completion to the sessions until nothing moves any more.

use crate::adapter::shm::{self, ShmChannel};
use crate::adapter::{pipe, Channel, PipeEnd, StreamChannel};
use crate::endpoint::{
    InitiatorConfig, Lane, Link, LinkError, LinkEvent, PoolSpec, Posted, Session, SessionConfig,
    TargetConfig,
};
use crate::memory::HeapShared;
use crate::memory::{DomainId, Frame, Registry, SendBufCache};
use crate::wire;

/// Channel type of the in-process harness.
pub type PipeChannel = StreamChannel<PipeEnd>;

/// Channel type of the shared-memory harness (rings in process memory).
pub type ShmPipe = ShmChannel<HeapShared>;

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
    /// Whether a step ends as the daemons' wake-ups do, returning credits only where the
    /// other side may wait for them ([`crate::endpoint::Session::flush_idle`]); else all.
    pub idle_credits: bool,
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

/// Buffer sizes of a [`Pair`]: the defaults suit any frame; fuzzing wants them small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes each pipe buffers per direction.
    pub pipe: usize,
    /// Largest SEND a channel accepts (its receive buffer).
    pub max_send: usize,
    /// Bytes of each send buffer (the largest frame a peer can post).
    pub send_buf: usize,
}

impl Sizes {
    /// Room for every frame and message of the protocol.
    pub const FULL: Sizes = Sizes {
        pipe: 1 << 18,
        max_send: wire::MAX_MESSAGE_LEN,
        send_buf: 70_000,
    };
}

/// A small session configuration for fuzzing: two small pools (256 x 8, 2048 x 4) and
/// tight limits, so that building and tearing down a pair costs little.
pub fn small_config(send_data_max: usize) -> SessionConfig {
    SessionConfig {
        advertise: vec![
            PoolSpec {
                element_size: 256,
                element_count: 8,
            },
            PoolSpec {
                element_size: 2048,
                element_count: 4,
            },
        ],
        target: TargetConfig {
            credit_batch: 2,
            max_granted_bytes: 64 << 10,
            max_pools: 4,
            max_element_size: 4096,
        },
        initiator: InitiatorConfig {
            send_data_max,
            max_pools: 4,
            max_elements: 64,
            pool_get: Some(PoolSpec {
                element_size: 256,
                element_count: 8,
            }),
        },
    }
}

fn peer<S: std::io::Read + std::io::Write>(
    domain: u32,
    config: SessionConfig,
    ctrl: S,
    data: S,
) -> Peer<StreamChannel<S>> {
    peer_sized(domain, config, ctrl, data, Sizes::FULL)
}

fn peer_sized<S: std::io::Read + std::io::Write>(
    domain: u32,
    config: SessionConfig,
    ctrl: S,
    data: S,
    sizes: Sizes,
) -> Peer<StreamChannel<S>> {
    let d = DomainId(u64::from(domain));
    let max = sizes.max_send;
    let (ctrl, data) = (
        StreamChannel::new(ctrl, d, max),
        StreamChannel::new(data, d, max),
    );
    peer_in(Registry::new(1 << 30), d, config, ctrl, data, sizes)
}

/// A peer whose pools are in domain `d`, registered in `reg`, over the channels given.
fn peer_in<C: Channel>(
    mut reg: Registry,
    d: DomainId,
    config: SessionConfig,
    ctrl: C,
    data: C,
    sizes: Sizes,
) -> Peer<C> {
    let mut session = Session::new(d, config);
    session
        .start(&mut reg)
        .expect("test pools fit the test registry");
    Peer {
        reg,
        link: Link::new(session, ctrl, data),
        cache: SendBufCache::new(sizes.send_buf, 256),
        received: Vec::new(),
        delivered: 0,
        keep_frames: true,
        idle_credits: false,
        events: Vec::new(),
    }
}

impl Pair {
    /// Two peers whose pipes buffer `capacity` bytes per direction.
    pub fn new(a: SessionConfig, b: SessionConfig, capacity: usize) -> Pair {
        Pair::sized(
            a,
            b,
            Sizes {
                pipe: capacity,
                ..Sizes::FULL
            },
        )
    }

    /// Two peers with the buffer sizes of `sizes`.
    pub fn sized(a: SessionConfig, b: SessionConfig, sizes: Sizes) -> Pair {
        let (c0, c1) = pipe(sizes.pipe);
        let (d0, d1) = pipe(sizes.pipe);
        Pair {
            a: peer_sized(1, a, c0, d0, sizes),
            b: peer_sized(2, b, c1, d1, sizes),
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

impl Pair<ShmPipe> {
    /// Two peers over shared-memory rings (one pair per channel, 1 MiB each way).
    pub fn shm(a: SessionConfig, b: SessionConfig) -> Pair<ShmPipe> {
        Pair::shm_with(a, b, false)
    }

    /// As [`Pair::shm`], with each peer's pools in a shared arena of 16 MiB that the other
    /// places its writes in (only headers travel in the data rings).
    pub fn shm_pools(a: SessionConfig, b: SessionConfig) -> Pair<ShmPipe> {
        Pair::shm_with(a, b, true)
    }

    fn shm_with(a: SessionConfig, b: SessionConfig, pools: bool) -> Pair<ShmPipe> {
        let sizes = Sizes::FULL;
        let cfg = shm::ring_config(1 << 20, sizes.send_buf.max(sizes.max_send) as u32)
            .expect("a 1 MiB ring holds the largest operation twice");
        let (da, db) = (DomainId(1), DomainId(2));
        let rings = || {
            shm::heap_pair(cfg, (da, db), sizes.max_send).expect("freshly initialised rings attach")
        };
        let (c0, c1) = rings();
        let (mut d0, mut d1) = rings();
        let (mut reg_a, mut reg_b) = (Registry::new(1 << 30), Registry::new(1 << 30));
        if pools {
            let (arena_a, arena_b) = (HeapShared::new(16 << 20), HeapShared::new(16 << 20));
            d0.set_peer_pools(arena_b.clone());
            d1.set_peer_pools(arena_a.clone());
            let fresh = "a new registry has no regions";
            reg_a
                .attach_arena(da, std::sync::Arc::new(arena_a))
                .expect(fresh);
            reg_b
                .attach_arena(db, std::sync::Arc::new(arena_b))
                .expect(fresh);
        }
        Pair {
            a: peer_in(reg_a, da, a, c0, d0, sizes),
            b: peer_in(reg_b, db, b, c1, d1, sizes),
        }
    }
}

impl<C: Channel> Peer<C> {
    /// Posts `frame`. A frame not posted goes back to the cache; with every send buffer in
    /// flight the answer is backpressure, as for a lack of credit.
    pub fn send(&mut self, frame: &[u8]) -> Outcome {
        let Some(mut buf) = self.cache.get() else {
            return Outcome::Backpressure;
        };
        assert!(buf.fill_from(frame), "frame larger than harness buffers");
        match self.link.post_frame(buf) {
            Posted::SendData => Outcome::Inline,
            Posted::Rdma => Outcome::Rdma,
            Posted::Backpressure(b) => {
                self.cache.put(b);
                Outcome::Backpressure
            }
            Posted::TooLarge(b) => {
                self.cache.put(b);
                Outcome::TooLarge
            }
        }
    }

    /// One round: flush, take sent buffers back, handle every completion on both lanes,
    /// return credits, flush again. True if anything moved.
    pub fn step(&mut self) -> Result<bool, LinkError> {
        let before = (self.delivered, self.events.len(), self.link.pending());
        self.link.flush()?;
        self.link.reclaim(&mut self.cache);
        for lane in [Lane::Control, Lane::Data] {
            let Peer {
                reg,
                link,
                received,
                delivered,
                keep_frames,
                events,
                ..
            } = self;
            let mut sink = |f: Frame<'_>| {
                *delivered += 1;
                if *keep_frames {
                    let mut v = Vec::new();
                    f.copy_to(&mut v);
                    received.push(v);
                }
            };
            while link.poll(reg, lane, 64, &mut sink, events)? {}
        }
        if self.idle_credits {
            self.link.session_mut().flush_idle(&mut self.reg);
        } else {
            self.link.session_mut().flush_credits(&mut self.reg);
        }
        self.link.flush()?;
        let after = (self.delivered, self.events.len(), self.link.pending());
        Ok(before != after)
    }
}

impl<C: Channel> Pair<C> {
    /// The peer on `side`.
    pub fn peer(&mut self, side: Side) -> &mut Peer<C> {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Posts `frame` from `side` (see [`Peer::send`]).
    pub fn send(&mut self, side: Side, frame: &[u8]) -> Outcome {
        self.peer(side).send(frame)
    }

    /// Moves everything both ways until no peer makes progress. Returns the first side
    /// whose link failed, with its error.
    pub fn drive(&mut self) -> Result<(), (Side, LinkError)> {
        loop {
            let a = self.a.step().map_err(|e| (Side::A, e))?;
            let b = self.b.step().map_err(|e| (Side::B, e))?;
            if !a && !b && self.a.link.pending() == 0 && self.b.link.pending() == 0 {
                return Ok(());
            }
        }
    }
}

/// The rows of the error tables of docs/protocol.md (section 7): row id, and the code its
/// code column starts with (`None` for "none").
pub fn doc_error_codes(doc: &str) -> Vec<(String, Option<u16>)> {
    doc.lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            let id = *c.get(1)?;
            let numbered = id.len() >= 2 && id[1..].chars().all(|ch| ch.is_ascii_digit());
            if !(numbered && (id.starts_with('E') || id.starts_with('H'))) {
                return None;
            }
            let digits: String = c.get(3)?.chars().take_while(char::is_ascii_digit).collect();
            Some((id.to_string(), digits.parse().ok()))
        })
        .collect()
}
