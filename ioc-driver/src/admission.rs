//! A worker's side of admission: the handshake of a connection whose Hello the main thread
//! read and handed to this worker. A control channel takes a session's place (within
//! `fabric.max_hosts`) and waits, within the handshake timeout, for its data channel,
//! which must name its token; the session's pools are registered, shared memory set up
//! where asked, and the host admitted to the worker's state, whose task then serves it.

use crate::gate::Policy;
use crate::session_task;
use crate::shard::KeyHold;
use crate::state::{Waiting, Who, WorkerState};
use splitnet_config::Admission;
use splitnet_fabric::{self as fabric, FabricChannel, RegisteredLink, StreamConn};
use splitnet_messaging::adapter::shm::setup::Setup;
use splitnet_messaging::endpoint::Session;
use splitnet_messaging::memory::DomainId;
use splitnet_messaging::wire::{self, ErrorCode, HelloReply};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// A connection the main thread read the Hello of and let in, for a worker to complete.
#[derive(Debug)]
pub struct Incoming {
    /// The connection and its Hello; in an admitted host's authenticated handshake the
    /// Hello's node id is the one its key gives.
    pub accepted: fabric::Accepted,
    /// The peer's address (`ADDRESS:PORT`, or `unix:PATH (pid N)`).
    pub peer: String,
    /// What admission gives the host.
    pub policy: Policy,
    /// A first queue's hold on its key's worker.
    pub hold: Option<KeyHold>,
    /// The worker's reload count when the connection reached it ([`Who::generation`]).
    pub generation: u64,
}

/// A session place taken on a worker for a session being set up, given back when it is
/// dropped (the session became a host, counted as such, or failed).
struct Place(Rc<RefCell<WorkerState>>);

impl Drop for Place {
    fn drop(&mut self) {
        match self.0.try_borrow_mut() {
            Ok(mut st) => {
                st.admitting -= 1;
                st.publish_load();
            }
            // Never borrowed where a place drops; the count stays one high rather than
            // panic.
            Err(_) => warn!("a session place could not be given back"),
        }
    }
}

/// Completes the handshake of a connection the main thread read the Hello of, and serves
/// the session it completes until it ends.
pub async fn admit(ioc: Rc<RefCell<WorkerState>>, incoming: Incoming) {
    let Incoming {
        accepted,
        peer,
        policy,
        hold,
        generation,
    } = incoming;
    let fabric::Accepted {
        mut ch,
        hello,
        version,
        auth: mut proof,
    } = accepted;
    let timeout = ioc.borrow().cfg.fabric.handshake_timeout();
    let who = Who {
        node_id: hello.node_id,
        key: proof.as_ref().map(|r| r.peer),
        queue: hello.queue,
        first: hello.session,
        policy,
        clear_data: false,
        generation,
        standby: false,
        liveness: None,
    };
    let note = |status: ErrorCode, why: &str| {
        let mut st = ioc.borrow_mut();
        st.stats.handshake_failures += 1;
        if let Some(held) = st.refusals.allow(Instant::now()) {
            warn!(%peer, ?status, "connection refused: {why} ({held} more refused since the last report)");
        }
    };
    // Refuses the connection (counted, logged at a limited rate), with proof of this
    // IOC's key when the Hello was authenticated, and ends the handshake.
    macro_rules! refuse {
        ($ch:expr, $status:expr, $why:expr) => {{
            note($status, $why);
            return fabric::refuse($ch, proof.as_deref_mut(), version, $status, timeout).await;
        }};
    }
    let rdma = ioc.borrow().cfg.fabric.rdma;
    if let Some(why) = transport_refused(hello.channel, ch.stream(), rdma) {
        refuse!(ch, ErrorCode::Refused, why);
    }
    // A handshake that proves a key takes a session's place only once it has proven it:
    // when its data channel names the token the HelloReply gave (a recorded first message
    // played again cannot read it), so that a replay holds no place or MAC. One without a
    // key takes its place at once.
    let keyed = who.key.is_some() && ioc.borrow().cfg.auth.admission == Admission::Keys;
    if fabric::is_control(hello.channel) {
        let shm = hello.channel == fabric::shm::SHM_CONTROL_CHANNEL;
        let verbs = hello.channel == fabric::verbs::VERBS_CONTROL_CHANNEL;
        let admitted = {
            let mut st = ioc.borrow_mut();
            if st.stopping {
                Err((ErrorCode::ShuttingDown, "shutting down"))
            } else if !hello.queue.is_first() && st.first_queue(&who).is_none() {
                // A further queue joins the session of the host's first queue.
                Err((
                    ErrorCode::UnknownSession,
                    "queue of a host whose first queue is not connected",
                ))
            } else if !keyed && !st.shard.admit(st.cfg.fabric.max_hosts as usize) {
                Err((ErrorCode::Busy, "max_hosts reached"))
            } else {
                // Counted from here: the session's place is taken while its reply is sent.
                st.admitting += usize::from(!keyed);
                Ok(st.new_session())
            }
        };
        let (session, token) = match admitted {
            Ok(s) => s,
            Err((status, why)) => refuse!(ch, status, why),
        };
        let opened = match fabric::post_reply(
            &mut ch,
            proof.as_deref_mut(),
            version,
            ErrorCode::Ok,
            token,
        ) {
            Err(e) => Err(e),
            Ok(()) if shm => shm_channel(ch, DomainId(session), None, timeout)
                .await
                .map(|t| FabricChannel::Shm(Box::new(t))),
            Ok(()) if verbs => verbs_control(ch, DomainId(session), proof, timeout).await,
            Ok(()) => match fabric::flush(&mut ch, timeout).await {
                Ok(()) => fabric::control_channel(ch, proof),
                Err(e) => Err(e),
            },
        };
        {
            let mut st = ioc.borrow_mut();
            st.admitting -= usize::from(!keyed);
            let ch = match opened {
                Ok(ch) => ch,
                Err(e) => {
                    st.stats.handshake_failures += 1;
                    st.publish_load();
                    if let Some(held) = st.refusals.allow(Instant::now()) {
                        warn!(%peer, "cannot open the control channel: {e} ({held} more refused since the last report)");
                    }
                    return;
                }
            };
            // A newer control channel of a key for the same queue replaces one still
            // waiting (the host tried again), so a key holds at most one per queue.
            let key = who.key;
            if key.is_some() {
                st.pending
                    .retain(|_, w| w.who.key != key || w.who.queue != who.queue);
            }
            let waiting = Waiting {
                ch,
                session,
                who,
                hold,
                counted: !keyed,
            };
            st.pending.insert(token, waiting);
            st.publish_load();
        }
        debug!(%peer, session, "control channel open, waiting for the data channel");
        // A host that never opens its data channel is dropped after the handshake timeout;
        // the token names this control channel alone, never a later one.
        tokio::time::sleep(timeout).await;
        let mut st = ioc.borrow_mut();
        if st.pending.remove(&token).is_some() {
            st.stats.handshake_failures += 1;
            st.publish_load();
            if let Some(held) = st.refusals.allow(Instant::now()) {
                warn!(%peer, session, "no data channel within {timeout:?}; dropped ({held} more refused since the last report)");
            }
        }
        return;
    }
    let shm = hello.channel == fabric::shm::SHM_CHANNEL;
    let verbs = hello.channel == fabric::verbs::VERBS_CHANNEL;
    // Its bytes sealed when its host asks (only a data channel on its socket can).
    let seal = proof
        .as_ref()
        .is_some_and(|r| r.flags & HelloReply::SEALED_DATA != 0)
        && !shm
        && !verbs;
    if !seal && !shm && ioc.borrow().cfg.auth.encrypt_data {
        refuse!(
            ch,
            ErrorCode::Unauthenticated,
            "a data channel not encrypted (auth.encrypt_data is set)"
        );
    }
    // A data channel joins the control channel whose token it names, from the same node.
    let joined = {
        let mut st = ioc.borrow_mut();
        let w = match st.pending.get(&hello.session) {
            Some(w) if w.who.node_id == who.node_id && w.who.key == who.key => {
                st.pending.remove(&hello.session)
            }
            _ => None,
        };
        st.publish_load();
        w
    };
    let Some(mut w) = joined else {
        refuse!(ch, ErrorCode::UnknownSession, "unknown session");
    };
    // What its AuthHello asked of the session (docs/protocol.md 6.4, 8).
    let asked = proof.as_ref().map_or(0, |r| r.flags);
    w.who.standby = asked & HelloReply::STANDBY != 0;
    if w.who.standby && !w.who.queue.is_first() {
        refuse!(
            ch,
            ErrorCode::Refused,
            "a standby session asked for a further queue (a standby opens its first only)"
        );
    }
    if w.who.standby && w.who.policy.mac.is_none() {
        refuse!(
            ch,
            ErrorCode::Refused,
            "a standby session asked for a host whose [[auth.hosts]] entry has no `mac` (a host with a standby IOC keeps its MAC on every IOC)"
        );
    }
    let keepalive_ms = ioc.borrow().cfg.fabric.keepalive_interval_ms;
    let liveness =
        HelloReply::liveness_ms(asked).map(|ms| crate::state::liveness_interval(ms, keepalive_ms));
    w.who.liveness = liveness.map(|ms| Duration::from_millis(ms.into()));
    // In the clear over TCP or RDMA: what `auth.encrypt_data` refuses.
    w.who.clear_data = !seal && !shm;
    // Proven: a newer first queue of a key replaces its older sessions before it takes
    // their place (one that waited without a place).
    let place = if let (false, Some(key)) = (w.counted, w.who.key) {
        let taken = {
            let mut st = ioc.borrow_mut();
            if w.who.queue.is_first() {
                let (name, peer) = (w.who.policy.name.clone().unwrap_or_default(), peer.clone());
                st.replace_older(&key, &name, &peer);
            }
            let taken = st.shard.admit(st.cfg.fabric.max_hosts as usize);
            st.admitting += usize::from(taken);
            taken
        };
        if !taken {
            refuse!(ch, ErrorCode::Busy, "max_hosts reached");
        }
        Some(Place(ioc.clone()))
    } else {
        None
    };
    let (session, token) = (w.session, hello.session);
    let domain = DomainId(session);
    // Over shared memory the pools for this host lie in an arena the host maps and places
    // its frames in; over verbs, in an arena registered for the host's RDMA writes.
    let arena = match shm || verbs {
        true => {
            let size = Setup::pool_size_for(ioc.borrow().cfg.pools.max_granted_bytes);
            match fabric::shm::PoolArena::new(c"splitnet-ioc-pools", size) {
                Ok(a) => Some(a),
                Err(e) => {
                    warn!(%peer, "cannot make a pool arena for a new host: {e}");
                    refuse!(ch, ErrorCode::ResourceLimit, "out of pool memory");
                }
            }
        }
        false => None,
    };
    if let Some(a) = &arena {
        // A new session's domain has no regions yet, so this cannot be refused.
        let attached = ioc.borrow_mut().reg.attach_arena(domain, a.region());
        if let Err(e) = attached {
            warn!(%peer, "cannot lay out pools for a new host: {e}");
            refuse!(ch, ErrorCode::ResourceLimit, "out of pool memory");
        }
    }
    let mut s = Session::new(domain, ioc.borrow().cfg.pools.session_config());
    let started = s.start(&mut ioc.borrow_mut().reg);
    if let Err(e) = started {
        warn!(%peer, "cannot register pools for a new host: {e}");
        ioc.borrow_mut().free_domain(domain);
        refuse!(ch, ErrorCode::ResourceLimit, "out of pool memory");
    }
    // The reply goes first on the data channel, ahead of anything posted to the host later.
    // The data channel's messages travel in the clear (docs/protocol.md 5.1) unless its
    // host asked for them sealed: its handshake proved the key and named the session.
    let mut flags = if seal { HelloReply::SEALED_DATA } else { 0 };
    if w.who.standby {
        flags |= HelloReply::STANDBY;
    }
    if let Some(ms) = liveness {
        flags = HelloReply::with_liveness(flags, ms);
    }
    let replied = fabric::post_reply_agreeing(
        &mut ch,
        proof.as_deref_mut(),
        version,
        ErrorCode::Ok,
        token,
        flags,
    );
    if let Err(e) = replied {
        warn!(%peer, "cannot answer a data channel: {e}");
        ioc.borrow_mut().free_domain(domain);
        return;
    }
    // Sealed from the byte after the answer, which goes out first in the clear.
    let ch = match (seal, proof) {
        (true, Some(r)) => {
            let sealed = match fabric::flush(&mut ch, timeout).await {
                Ok(()) => r
                    .into_sealer()
                    .map_err(fabric::FabricError::from)
                    .and_then(|s| fabric::sealed_data_channel(ch, s)),
                Err(e) => Err(e),
            };
            match sealed {
                Ok(ch) => ch,
                Err(e) => {
                    warn!(%peer, session, "cannot seal a data channel: {e}");
                    ioc.borrow_mut().free_domain(domain);
                    return;
                }
            }
        }
        _ => ch,
    };
    let data = if let (true, Some(arena)) = (verbs, &arena) {
        match verbs_channel(ch, domain, arena, timeout).await {
            Ok(t) => t,
            Err(e) => {
                let mut st = ioc.borrow_mut();
                st.stats.handshake_failures += 1;
                if let Some(held) = st.refusals.allow(Instant::now()) {
                    warn!(%peer, session, "RDMA set-up failed: {e} ({held} more refused since the last report)");
                }
                st.free_domain(domain);
                return;
            }
        }
    } else if let Some(arena) = arena {
        match shm_channel(ch, domain, Some(arena), timeout).await {
            Ok(t) => FabricChannel::Shm(Box::new(t)),
            Err(e) => {
                let mut st = ioc.borrow_mut();
                st.stats.handshake_failures += 1;
                if let Some(held) = st.refusals.allow(Instant::now()) {
                    warn!(%peer, session, "shared memory refused: {e} ({held} more refused since the last report)");
                }
                st.free_domain(domain);
                return;
            }
        }
    } else {
        FabricChannel::Stream(ch)
    };
    let tl = match RegisteredLink::new(s, w.ch, data) {
        Ok(tl) => tl,
        Err(e) => {
            warn!(%peer, "cannot register the host's sockets: {e}");
            ioc.borrow_mut().free_domain(domain);
            return;
        }
    };
    let RegisteredLink { ready, link } = tl;
    let peer = if shm {
        format!("{peer}, shared memory")
    } else if verbs {
        format!("{peer}, RDMA")
    } else if seal {
        format!("{peer}, data sealed")
    } else {
        peer
    };
    let added = {
        let mut st = ioc.borrow_mut();
        let added = st.add_host(session, token, w.who, link, peer.clone());
        if let Some(h) = st.hosts.get_mut(&session) {
            h.hold = w.hold;
        }
        added
    };
    drop(place);
    match added {
        Some(wake) => session_task::serve(ioc, session, ready, wake).await,
        None => {
            warn!(%peer, session, "the host's first queue left while this queue connected; closed")
        }
    }
}

/// Sends the HelloReply of a shared-memory channel, then takes the host's rings, doorbell
/// and (a data channel's) pool arena over the socket and answers, with `arena` for a data
/// channel ([`fabric::shm::accept`]).
async fn shm_channel(
    mut ch: StreamConn,
    domain: DomainId,
    arena: Option<fabric::shm::PoolArena>,
    timeout: Duration,
) -> Result<fabric::shm::ShmTransport, fabric::FabricError> {
    fabric::flush(&mut ch, timeout).await?;
    let fabric::Stream::Unix(sock) = ch.into_stream() else {
        return Err(fabric::FabricError::Shm("not a Unix socket".into()));
    };
    fabric::shm::accept(sock, domain, wire::MAX_MESSAGE_LEN, arena, timeout).await
}

/// Why a channel cannot travel as its Hello asks, if it cannot: shared memory needs the
/// local socket; RDMA verbs a TCP connection (its set-up's) and an IOC that takes RDMA.
fn transport_refused(channel: u8, stream: &fabric::Stream, rdma: bool) -> Option<&'static str> {
    use fabric::{shm, verbs};
    let shm = channel == shm::SHM_CONTROL_CHANNEL || channel == shm::SHM_CHANNEL;
    let verbs = channel == verbs::VERBS_CONTROL_CHANNEL || channel == verbs::VERBS_CHANNEL;
    let tcp = matches!(stream, fabric::Stream::Tcp(_));
    match () {
        _ if shm && !matches!(stream, fabric::Stream::Unix(_)) => {
            Some("shared memory asked for over TCP")
        }
        _ if verbs && !rdma => Some("RDMA asked for (fabric.rdma is off)"),
        _ if verbs && !tcp => Some("RDMA asked for over a local socket"),
        _ => None,
    }
}

/// Sends the HelloReply of a data channel over verbs, then sets its queue pair up on the
/// connection ([`fabric::verbs::accept`]), with this host's pools in `arena`.
async fn verbs_channel(
    mut ch: StreamConn,
    domain: DomainId,
    arena: &fabric::shm::PoolArena,
    timeout: Duration,
) -> Result<FabricChannel, fabric::FabricError> {
    fabric::flush(&mut ch, timeout).await?;
    let (sock, unread) = ch.into_parts();
    // The host's arena is no larger than the one this IOC made for it.
    let max = arena.size();
    let t = fabric::verbs::accept(sock, unread, domain, Some(arena.region()), max, timeout);
    Ok(FabricChannel::Verbs(Box::new(t.await?)))
}

/// Sends the HelloReply of a control channel over verbs, then sets its queue pair up on the
/// connection (no pool arena: it carries messages only), sealed after an authenticated
/// handshake.
async fn verbs_control(
    mut ch: StreamConn,
    domain: DomainId,
    proof: Option<Box<fabric::auth::Responder>>,
    timeout: Duration,
) -> Result<FabricChannel, fabric::FabricError> {
    fabric::flush(&mut ch, timeout).await?;
    let sealer = proof.map(|r| r.into_sealer()).transpose()?;
    let (sock, unread) = ch.into_parts();
    let t = fabric::verbs::accept(sock, unread, domain, None, 0, timeout).await?;
    let ch = FabricChannel::Verbs(Box::new(t));
    Ok(match sealer {
        Some(s) => FabricChannel::sealed(ch, s),
        None => ch,
    })
}
