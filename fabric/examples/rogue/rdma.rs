//! `rogue rdma`: a host whose data channel is an RDMA queue pair (docs/protocol.md section
//! 10) and which writes where it may not: into an element its immediate data does not name a
//! pool of (no credit it holds can cover it), past the end
//! of the pool its key registers, with a key that is no pool's, with the key of its previous
//! session's pool, into the next element with an element's window key, with a window key it
//! used once already (seed 004), and with the key of a pool it flushed (seed 001). The first is refused by
//! the IOC's checks (the session ends); the others by the IOC's adapter (this queue pair breaks
//! with a remote access error) and end the session too. Each attack is a session of its own, as an admitted host (its key).

use crate::admission::Keys;
use crate::verdict;
use splitnet_fabric::verbs::VerbsTransport;
use splitnet_fabric::{self as fabric, DataPath, FabricChannel, HostKeys};
use splitnet_messaging::adapter::{Channel, Op, Payload, RxCompletion};
use splitnet_messaging::memory::{arena_offset, Registry};
use splitnet_messaging::wire::{Idata, Message, PoolEntry, Queue};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(15);

/// A session: its control channel, its data channel's queue pair, the IOC's pools.
struct Session {
    ctrl: FabricChannel,
    data: Box<VerbsTransport>,
    reg: Registry,
    pools: Vec<PoolEntry>,
}

async fn connect(addr: SocketAddr, keys: &Keys, node_id: u64) -> Result<Session, String> {
    let host = HostKeys {
        private: keys.host,
        ioc: keys.ioc,
        seal_data: false,
        flags: 0,
    };
    let path = DataPath::Verbs {
        pool_bytes: 8 << 20,
    };
    let dial = || fabric::dial_tcp(addr);
    let (mut ctrl, data, _) =
        fabric::connect(dial, path, node_id, Queue::SINGLE, 0, TIMEOUT, Some(&host))
            .await
            .map_err(|e| e.to_string())?;
    let FabricChannel::Verbs(data) = data else {
        return Err("the data channel is not on a queue pair".into());
    };
    let mut reg = Registry::new(0);
    let mut pools = Vec::new();
    // The IOC advertises its pools on the control channel, one message each: read them for
    // 300 ms after the first, keeping the session alive meanwhile.
    let start = Instant::now();
    let mut last_keepalive = None;
    let mut first = None;
    while start.elapsed() < Duration::from_secs(5)
        && first.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(300))
    {
        if last_keepalive.is_none_or(|t: Instant| t.elapsed() > Duration::from_millis(100)) {
            send_keepalive(&mut ctrl);
            last_keepalive = Some(Instant::now());
        }
        match ctrl.poll_recv(&mut reg) {
            Ok(Some(RxCompletion::Recv { .. })) => {
                if let Ok((_, Message::BufferRecvPool(p))) = Message::parse(ctrl.received()) {
                    pools.extend(p);
                    first.get_or_insert_with(Instant::now);
                }
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            Err(e) => return Err(format!("control channel: {e}")),
        }
    }
    if pools.is_empty() {
        return Err("no BufferRecvPool from the IOC".into());
    }
    // The first pool's key comes on the queue pair.
    let first = arena_offset(pools[0].address);
    let mut data = data;
    while data.peer_key(first).1.is_none() {
        if start.elapsed() > Duration::from_secs(8) {
            return Err("no key notice for the IOC's first pool".into());
        }
        send_keepalive(&mut ctrl);
        data.poll_recv(&mut reg)
            .map_err(|e| format!("queue pair: {e}"))?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(Session {
        ctrl,
        data,
        reg,
        pools,
    })
}

/// A Keepalive on the control channel.
fn send_keepalive(ctrl: &mut FabricChannel) {
    let mut m = Vec::new();
    Message::Keepalive.emit(0, &mut m);
    ctrl.post(Op::Send, &[], Payload::Bytes(m));
    let _ = ctrl.flush();
}

impl Session {
    /// Whether the IOC ends the session within `within`: its control channel closes, or the
    /// queue pair breaks. Returns what was seen.
    async fn ended(&mut self, within: Duration) -> Option<String> {
        let end = Instant::now() + within;
        let mut last_keepalive = Instant::now();
        // Once the data queue pair broke, the control channel stays open until the IOC ends
        // the session, so that it ends it for its own queue pair's error, not for this side
        // closing first.
        let mut broken = None;
        while Instant::now() < end {
            // Alive as far as keepalives go: only the attack may end the session.
            if last_keepalive.elapsed() > Duration::from_millis(100) {
                send_keepalive(&mut self.ctrl);
                last_keepalive = Instant::now();
            }
            if broken.is_none() {
                if let Err(e) = self.data.poll_recv(&mut self.reg) {
                    broken = Some(format!("queue pair: {e}"));
                }
            }
            match self.ctrl.poll_recv(&mut self.reg) {
                Ok(Some(RxCompletion::Recv { .. })) => {
                    if let Ok((_, Message::Goodbye(g))) = Message::parse(self.ctrl.received()) {
                        return broken.or(Some(format!("Goodbye {:?}", g.code)));
                    }
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(e) => return broken.or(Some(format!("control channel: {e}"))),
            }
        }
        broken
    }

    /// Byte offset of `element` of the IOC's first pool in its arena, and idata for a write
    /// of `len` bytes there.
    fn target(&self, element: u32, len: u32) -> (u64, u32) {
        let p = &self.pools[0];
        let off = arena_offset(p.address) + u64::from(element) * u64::from(p.element_size);
        let imm = Idata::new(p.pool_ref, element, len).map_or(0, Idata::to_u32);
        (off, imm)
    }

    /// Writes 64 bytes at `off` with `rkey` and immediate data `imm`, past every check of
    /// this side's; what ending of the session followed within 10 s, if any.
    async fn write_and_watch(&mut self, off: u64, rkey: u32, imm: u32) -> Option<String> {
        match self.data.post_unchecked_write(off, 64, rkey, imm) {
            Ok(()) => self.ended(Duration::from_secs(10)).await,
            Err(e) => Some(format!("cannot post: {e}")),
        }
    }

    /// The key the IOC told for `element` of its first pool: with element windows each
    /// element has its own, else the pool's.
    fn element_key(&self, element: u32) -> Option<u32> {
        self.data.peer_key(self.target(element, 64).0).1
    }

    /// The first pool's key, and the offset just past its end.
    fn first_pool(&self) -> (u32, u64) {
        let p = &self.pools[0];
        let off = arena_offset(p.address);
        let key = self.data.peer_key(off).1.unwrap_or(0);
        (
            key,
            off + u64::from(p.element_size) * u64::from(p.element_count),
        )
    }
}

/// Runs every attack against the IOC at `addr` as the host of `keys`, claiming `node_id`.
pub fn attack(addr: &str, keys: &Keys, node_id: u64) -> Vec<&'static str> {
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        return vec!["an IOC address ip:port"];
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return vec!["a runtime"],
    };
    rt.block_on(attacks(addr, keys, node_id))
}

async fn attacks(addr: SocketAddr, keys: &Keys, node_id: u64) -> Vec<&'static str> {
    let mut missed = Vec::new();
    // Beyond any credit: a write into the first pool whose immediate data names a pool
    // reference the IOC never advertised. (Writing one element twice is no test: the IOC
    // grants an element again as soon as its frame is consumed, which may be before the
    // second write arrives.)
    let name = "rdma write naming no pool of its session";
    let mut old_key = None;
    let seen = in_a_session(addr, keys, node_id, async |s| {
        let (key, _) = s.first_pool();
        old_key = Some(key);
        let (off, _) = s.target(0, 64);
        let imm = Idata::new(200, 0, 64).map_or(0, Idata::to_u32);
        s.write_and_watch(off, key, imm).await
    })
    .await;
    println!("{name}: {}", seen.as_deref().unwrap_or("nothing"));
    let ended = seen.is_some_and(|m| !m.starts_with("cannot"));
    verdict(&mut missed, name, ended, "session ended");
    // Past the end of the pool its key registers, with a key that is no pool's, and with the
    // previous session's key: the adapter refuses each. Where to write and with which key,
    // from the first pool's key, the offset past its end and the previous session's key.
    type Aim = fn(u32, u64, Option<u32>) -> (u64, u32);
    let cases: [(&'static str, Aim); 3] = [
        ("rdma write past its pool's end", |key, end, _| (end, key)),
        ("rdma write with a wrong key", |key, _, _| {
            (0, key ^ 0x5a5a_0000)
        }),
        ("rdma write with the previous session's key", |_, _, old| {
            (0, old.unwrap_or(0))
        }),
    ];
    for (name, aim) in cases {
        let seen = in_a_session(addr, keys, node_id, async |s| {
            let (key, end) = s.first_pool();
            let (aimed, rkey) = aim(key, end, old_key);
            // At the first pool's offset unless aimed past its end.
            let (first, imm) = s.target(0, 64);
            let off = if aimed == 0 { first } else { aimed };
            if name.contains("previous") && rkey == key {
                println!("{name}: the IOC reused the key {key:#x}: cannot tell");
            }
            old_key = Some(key);
            s.write_and_watch(off, rkey, imm).await
        })
        .await;
        refused_by_adapter(&mut missed, name, seen);
    }
    // With element windows (seed 004), a key opens one element, for one write: a write into
    // the next element with the first's key, and a second write with a key already used, are
    // refused by the adapter.
    let name = "rdma write into the next element with an element's window key";
    let seen = in_a_session(addr, keys, node_id, async |s| {
        match (s.element_key(0), s.element_key(1)) {
            (Some(k0), Some(k1)) if k0 != k1 => {
                let (off, imm) = s.target(1, 64);
                s.write_and_watch(off, k0, imm).await
            }
            _ => Some("no element windows: one key for the pool".into()),
        }
    })
    .await;
    refused_by_adapter(&mut missed, name, seen);
    let name = "rdma write with an element's window key used once already";
    let seen = in_a_session(addr, keys, node_id, async |s| {
        let (off, imm) = s.target(0, 64);
        let key = s.element_key(0)?;
        // The first write is the grant's: the session goes on. Once the IOC has read it
        // (and closed the window), the same again.
        if let Err(e) = s.data.post_unchecked_write(off, 64, key, imm) {
            return Some(format!("cannot post: {e}"));
        }
        if let Some(e) = s.ended(Duration::from_secs(1)).await {
            return Some(format!("the first write ended the session: {e}"));
        }
        s.write_and_watch(off, key, imm).await
    })
    .await;
    refused_by_adapter(&mut missed, name, seen);
    // A pool it flushed: the IOC frees it, and its registration with it.
    let name = "rdma write into a pool it flushed, with its old key";
    let seen = in_a_session(addr, keys, node_id, async |s| {
        match flush_first_pool(s).await {
            Ok(key) => {
                let (off, imm) = s.target(0, 64);
                s.write_and_watch(off, key, imm).await
            }
            Err(e) => Some(format!("cannot flush: {e}")),
        }
    })
    .await;
    refused_by_adapter(&mut missed, name, seen);
    missed
}

/// Runs `attack` in a session of its own; what it saw, or why there was no session.
async fn in_a_session(
    addr: SocketAddr,
    keys: &Keys,
    node_id: u64,
    attack: impl AsyncFnOnce(&mut Session) -> Option<String>,
) -> Option<String> {
    match connect(addr, keys, node_id).await {
        Ok(mut s) => attack(&mut s).await,
        Err(e) => Some(format!("cannot connect: {e}")),
    }
}

/// Reports attack `name`, refused if what it saw is the queue pair broken by a remote
/// access error (the IOC's adapter refused the write).
fn refused_by_adapter(missed: &mut Vec<&'static str>, name: &'static str, seen: Option<String>) {
    println!("{name}: {}", seen.as_deref().unwrap_or("nothing"));
    let refused = seen
        .as_deref()
        .is_some_and(|m| m.starts_with("queue pair") && m.contains("remote access"));
    verdict(missed, name, refused, "refused by the adapter");
}

/// Flushes the IOC's first pool as its initiator (a BufferPoolFlushRequest on the data
/// channel) and waits for the IOC's reply, then a little for its adapter to drop the pool's
/// registration; returns the pool's key.
async fn flush_first_pool(s: &mut Session) -> Result<u32, String> {
    let (key, _) = s.first_pool();
    let mut m = Vec::new();
    Message::BufferPoolFlushRequest(vec![s.pools[0].pool_ref]).emit(7, &mut m);
    s.data.post(Op::Send, &[], Payload::Bytes(m));
    s.data.flush().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut replied = None;
    while replied.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(500)) {
        if start.elapsed() > Duration::from_secs(8) {
            return Err("no BufferPoolFlushReply".into());
        }
        send_keepalive(&mut s.ctrl);
        if let Ok(Some(RxCompletion::Recv { .. })) = s.ctrl.poll_recv(&mut s.reg) {
            if let Ok((_, Message::BufferPoolFlushReply)) = Message::parse(s.ctrl.received()) {
                replied.get_or_insert_with(Instant::now);
            }
        }
        s.data.poll_recv(&mut s.reg).map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(key)
}
