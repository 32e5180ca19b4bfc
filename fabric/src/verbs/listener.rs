//! The IOC's listener for RDMA connections: one connection manager identifier bound to the
//! fabric address, served by a thread of its own, handing each connection request to the
//! set-up that expects its token (sent to the host on its data channel's TCP connection).
//! One per process, as the address it listens on is.

use super::cm::CmId;
use super::endpoint::{Request, Token};
use super::setup::{random_token, verbs_err};
use crate::FabricError;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, OnceLock};
use tokio::sync::oneshot;

/// Connection requests queued in the kernel before the listener's thread takes them.
const BACKLOG: i32 = 128;

/// A set-up waiting for its host's connection request.
struct Waiting {
    peer: IpAddr,
    tx: oneshot::Sender<CmId>,
}

/// The address listened on, and the set-ups waiting, by token (`None` once the listener
/// stopped).
struct Listener {
    addr: SocketAddr,
    waiting: Mutex<Option<HashMap<Token, Waiting>>>,
}

static LISTENER: OnceLock<Listener> = OnceLock::new();

/// Takes RDMA connection requests on `addr` (the IOC's `fabric.listen`) from now on, for
/// the life of the process. Returns what it listens on; fails, saying what is missing, if
/// it cannot (or already listens elsewhere).
pub fn listen(addr: SocketAddr) -> Result<String, FabricError> {
    // One caller at a time binds (a second one finds the listener).
    static STARTING: Mutex<()> = Mutex::new(());
    let _one = STARTING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = LISTENER.get() {
        return match l.addr == addr {
            true => Ok(format!("{addr}")),
            false => Err(FabricError::Verbs(format!(
                "already taking RDMA connections on {}",
                l.addr
            ))),
        };
    }
    let id = CmId::new().map_err(verbs_err)?;
    id.listen(addr, BACKLOG).map_err(verbs_err)?;
    let what = match id.device_name() {
        Some(dev) => format!("{addr} on {dev}"),
        None => format!("{addr} on every RDMA device"),
    };
    let l = LISTENER.get_or_init(|| Listener {
        addr,
        waiting: Mutex::new(Some(HashMap::new())),
    });
    std::thread::Builder::new()
        .name("rdma-listen".into())
        .spawn(move || serve(l, id))
        .map_err(|e| FabricError::Verbs(format!("cannot start the RDMA listener: {e}")))?;
    Ok(what)
}

/// The listener's thread: hands each connection request over, refuses the rest.
fn serve(l: &'static Listener, id: CmId) {
    let mut refusals = Refusals::default();
    loop {
        let e = match id.next_event() {
            Ok(e) => e,
            Err(e) => return stop(l, &e.to_string()),
        };
        let Some(req) = e.request else {
            // A request's identifier is adopted at once: nothing else comes here but the
            // listener's own events: its device removed ends it.
            let what = super::cm::event_name(e.kind);
            if e.kind == rdma_mummy_sys::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL {
                return stop(l, &what);
            }
            tracing::warn!("RDMA listener: {what}");
            continue;
        };
        let peer = req.peer_ip();
        let waiting = {
            let mut w = l.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let Some(w) = w.as_mut() else { return };
            match Request::parse(&e.private).map(|r| (r.token, w.get(&r.token))) {
                // Only from the address the token went to: one who saw it elsewhere
                // cannot take the host's place, nor end its set-up.
                Some((t, Some(x))) if Some(x.peer) == peer => w.remove(&t),
                _ => None,
            }
        };
        // Dropped unless adopted: refused.
        let Some(w) = waiting else {
            refusals.note(peer);
            continue;
        };
        let id = match req.adopt() {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!("RDMA connection request: {e}");
                continue;
            }
        };
        // A set-up that gave up meanwhile drops it: destroyed, the host's request fails.
        let _ = w.tx.send(id);
    }
}

/// Ends the listener for `why`: the set-ups waiting fail at once, later ones at their start.
fn stop(l: &Listener, why: &str) {
    tracing::error!("RDMA listener: {why}; no more RDMA connections");
    l.waiting.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// Refused connection requests, reported at most once a second (anyone who reaches the
/// address can send them).
#[derive(Default)]
struct Refusals {
    last: Option<std::time::Instant>,
    since: u64,
}

impl Refusals {
    fn note(&mut self, peer: Option<IpAddr>) {
        self.since += 1;
        if self
            .last
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1))
        {
            return;
        }
        tracing::warn!(
            ?peer,
            "RDMA connection request with no set-up waiting for its token from its address: refused ({} refused since the last report)",
            self.since - 1
        );
        self.last = Some(std::time::Instant::now());
        self.since = 0;
    }
}

/// A set-up waiting for its host's connection request; no longer when dropped.
pub struct Expected {
    token: Token,
    rx: Option<oneshot::Receiver<CmId>>,
}

impl Drop for Expected {
    fn drop(&mut self) {
        if let Some(l) = LISTENER.get() {
            let mut w = l.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(w) = w.as_mut() {
                w.remove(&self.token);
            }
        }
    }
}

impl Expected {
    /// Waits for `peer`'s connection request with a new token (to send it).
    pub fn new(peer: IpAddr) -> Result<Expected, FabricError> {
        let Some(l) = LISTENER.get() else {
            return Err(FabricError::Verbs(
                "this side takes no RDMA connections".into(),
            ));
        };
        let (tx, rx) = oneshot::channel();
        let mut w = l.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let Some(w) = w.as_mut() else {
            return Err(FabricError::Verbs(
                "the RDMA listener stopped (see the log)".into(),
            ));
        };
        let token = loop {
            let t = random_token();
            if !w.contains_key(&t) {
                break t;
            }
        };
        w.insert(token, Waiting { peer, tx });
        Ok(Expected {
            token,
            rx: Some(rx),
        })
    }

    /// The token the host's request must carry.
    pub fn token(&self) -> Token {
        self.token
    }

    /// The request's identifier, once it came.
    pub async fn request(&mut self) -> Result<CmId, FabricError> {
        let rx = self
            .rx
            .take()
            .ok_or(FabricError::Verbs("waited twice".into()))?;
        rx.await
            .map_err(|_| FabricError::Verbs("the RDMA listener stopped".into()))
    }
}
