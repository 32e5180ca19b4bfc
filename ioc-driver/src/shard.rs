//! The IOC's workers: sessions spread over threads, each worker a `WorkerState` of
//! its own (its hosts, its pools, its packet socket in the NIC's fanout group). What the
//! workers share is here: which worker serves each MAC, how many sessions each holds, and
//! a bounded inbox per worker for the frames that cross from one worker to another.
//!
//! A frame from the LAN reaches the worker serving its destination MAC directly (the
//! fanout program, [`crate::nic::Nic::steer`]); group frames and frames for an unknown MAC
//! arrive by flow hash, and the worker that got them copies them to the others. A host's
//! frame for a host of another worker crosses through that worker's inbox. Nothing on the
//! data path takes a lock: each worker keeps a copy of the MAC table, refreshed when its
//! generation changes.

use crate::nic::{Exclusion, Nic};
use splitnet_fabric::auth::Key;
use splitnet_netif::filter::{self, Tagged};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;
use tracing::warn;

/// Most workers an IOC runs.
pub const MAX_WORKERS: usize = 64;
/// Bytes of frames waiting in one worker's inbox; beyond, frames crossing to it are dropped
/// and counted (as a full receive ring would).
pub const INBOX_BYTES: usize = 4 << 20;

/// A frame (virtio-net header first) for the receiving worker's hosts only.
pub type Crossing = Vec<u8>;

/// Which worker serves each MAC, and what each worker holds.
#[derive(Debug, Default)]
struct Directory {
    /// Each host's MAC (its first queue's), to its worker.
    macs: HashMap<[u8; 6], usize>,
    /// Sessions admitted on each worker (connected, or waiting for their data channel).
    load: Vec<usize>,
    /// Workers with a host in promiscuous mode.
    promisc: Vec<bool>,
    /// MACs whose frames their hosts' own queues receive ([`crate::nic::HostRx`]): every
    /// worker's socket excludes them.
    own_queue_macs: Vec<([u8; 6], Tagged)>,
    /// Each started worker's handle on its socket's exclusions.
    exclusions: Vec<Box<dyn Exclusion>>,
    /// The worker a host key's first queues go to, and how many of them are held there
    /// (connections on their way, sessions): all of a key's sessions are one worker's, so
    /// a newer one replaces an older there ([`KeyHold`]).
    keys: HashMap<Key, (usize, usize)>,
}

impl Directory {
    /// Sets every worker's exclusions to `placed`.
    fn exclude(&self) -> io::Result<()> {
        self.exclusions
            .iter()
            .try_for_each(|e| e.exclude(&self.own_queue_macs))
    }
}

/// One worker's inbox, as the others see it.
#[derive(Debug)]
struct Inbox {
    tx: mpsc::UnboundedSender<Crossing>,
    bytes: Arc<AtomicUsize>,
}

/// What the workers share.
#[derive(Debug)]
struct Shared {
    dir: Mutex<Directory>,
    /// Bumped on every change of the MAC table or of the promiscuous workers.
    generation: AtomicU64,
    inboxes: Vec<Inbox>,
    /// The last session id handed out, by any worker.
    last_session: AtomicU64,
}

/// The receiving end of a worker's inbox.
#[derive(Debug)]
pub struct InboxRx {
    rx: mpsc::UnboundedReceiver<Crossing>,
    bytes: Arc<AtomicUsize>,
}

impl InboxRx {
    /// The bytes waiting in the inbox, as the other workers count them when they hand a
    /// frame over (non-zero: frames wait or are on their way).
    pub fn queued(&self) -> Arc<AtomicUsize> {
        self.bytes.clone()
    }

    /// Waits for frames and appends up to `max` of them to `out`; 0 when every other
    /// worker has gone.
    pub async fn recv(&mut self, out: &mut Vec<Crossing>, max: usize) -> usize {
        let before = out.len();
        let n = self.rx.recv_many(out, max).await;
        let taken: usize = out[before..].iter().map(Vec::len).sum();
        self.bytes.fetch_sub(taken, Ordering::Relaxed);
        n
    }
}

impl Drop for InboxRx {
    /// The worker stops (the IOC stops with it): the frames still crossing to it are lost,
    /// and logged, since no counter outlives the process.
    fn drop(&mut self) {
        let left = self.rx.len();
        if left > 0 {
            warn!(
                frames = left,
                "frames crossing to a stopping worker dropped"
            );
        }
    }
}

#[cfg(test)]
impl InboxRx {
    /// Takes what is waiting, without waiting.
    pub fn take(&mut self) -> Vec<Crossing> {
        let mut out = Vec::new();
        while let Ok(f) = self.rx.try_recv() {
            self.bytes.fetch_sub(f.len(), Ordering::Relaxed);
            out.push(f);
        }
        out
    }
}

/// A worker's copy of the directory, for lookups on the data path.
#[derive(Debug, Default)]
struct View {
    generation: u64,
    macs: HashMap<[u8; 6], usize>,
    promisc: Vec<usize>,
}

/// One worker's place among the workers.
#[derive(Debug)]
pub struct Shard {
    /// This worker's index: its socket's place in the fanout group, the low byte of its
    /// sessions' tokens.
    pub index: usize,
    shared: Arc<Shared>,
    view: RefCell<View>,
}

impl Shard {
    /// The shards of `n` workers (1 to [`MAX_WORKERS`]), each with its inbox.
    pub fn set(n: usize) -> Vec<(Shard, InboxRx)> {
        let n = n.clamp(1, MAX_WORKERS);
        let (inboxes, rxs): (Vec<Inbox>, Vec<InboxRx>) = (0..n)
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                let bytes = Arc::new(AtomicUsize::new(0));
                (
                    Inbox {
                        tx,
                        bytes: bytes.clone(),
                    },
                    InboxRx { rx, bytes },
                )
            })
            .unzip();
        let shared = Arc::new(Shared {
            dir: Mutex::new(Directory {
                macs: HashMap::new(),
                load: vec![0; n],
                promisc: vec![false; n],
                ..Directory::default()
            }),
            generation: AtomicU64::new(0),
            inboxes,
            last_session: AtomicU64::new(0),
        });
        rxs.into_iter()
            .enumerate()
            .map(|(index, rx)| {
                let shard = Shard {
                    index,
                    shared: shared.clone(),
                    view: RefCell::default(),
                };
                (shard, rx)
            })
            .collect()
    }

    /// The shard of an IOC with one worker.
    #[cfg(test)]
    pub fn alone() -> Shard {
        Shard::set(1).remove(0).0
    }

    /// How many workers there are.
    pub fn count(&self) -> usize {
        self.shared.inboxes.len()
    }

    /// The directory, even if a worker panicked while holding it (its entries stay valid:
    /// every change is a single insert or remove).
    fn dir(&self) -> MutexGuard<'_, Directory> {
        self.shared.dir.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This worker's copy of the directory, refreshed if it changed.
    fn view(&self) -> std::cell::Ref<'_, View> {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g != self.view.borrow().generation {
            let d = self.dir();
            let mut v = self.view.borrow_mut();
            v.macs.clone_from(&d.macs);
            v.promisc = (0..d.promisc.len())
                .filter(|&w| d.promisc[w] && w != self.index)
                .collect();
            // Read under the lock: no change is between this and the copy.
            v.generation = self.shared.generation.load(Ordering::Acquire);
        }
        self.view.borrow()
    }

    /// The other worker serving `mac`, if one does.
    pub fn owner(&self, mac: &[u8; 6]) -> Option<usize> {
        if self.count() == 1 {
            return None;
        }
        self.view()
            .macs
            .get(mac)
            .copied()
            .filter(|&w| w != self.index)
    }

    /// The other workers.
    pub fn others(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.count()).filter(move |&w| w != self.index)
    }

    /// The other workers with a promiscuous host (they want frames for unknown MACs).
    pub fn promisc_others(&self) -> std::cell::Ref<'_, [usize]> {
        std::cell::Ref::map(self.view(), |v| v.promisc.as_slice())
    }

    /// Hands a copy of `frame` to worker `to`; false (nothing sent) when its inbox is full
    /// or it has stopped.
    pub fn cross(&self, to: usize, frame: &[u8]) -> bool {
        let Some(inbox) = self.shared.inboxes.get(to) else {
            return false;
        };
        if inbox.bytes.fetch_add(frame.len(), Ordering::Relaxed) + frame.len() > INBOX_BYTES {
            inbox.bytes.fetch_sub(frame.len(), Ordering::Relaxed);
            return false;
        }
        if inbox.tx.send(frame.to_vec()).is_err() {
            inbox.bytes.fetch_sub(frame.len(), Ordering::Relaxed);
            return false;
        }
        true
    }

    /// A session id no worker has handed out.
    pub fn next_session(&self) -> u64 {
        self.shared.last_session.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Admits a session on this worker unless the workers together hold `max` already.
    pub fn admit(&self, max: usize) -> bool {
        let mut d = self.dir();
        if d.load.iter().sum::<usize>() >= max {
            return false;
        }
        d.load[self.index] += 1;
        true
    }

    /// Records the sessions this worker holds now.
    pub fn set_load(&self, sessions: usize) {
        self.dir().load[self.index] = sessions;
    }

    /// The main thread's view of the workers.
    pub fn observer(&self) -> Observer {
        Observer(self.shared.clone())
    }

    /// Claims the first MAC of `candidates` that no worker serves, for this worker.
    pub fn claim_mac(
        &self,
        nic: &dyn Nic,
        candidates: impl Iterator<Item = [u8; 6]>,
    ) -> Option<[u8; 6]> {
        let mut d = self.dir();
        let mac = candidates.take(1 << 16).find(|m| !d.macs.contains_key(m))?;
        d.macs.insert(mac, self.index);
        self.changed(&d, nic);
        Some(mac)
    }

    /// Moves this worker's host from `old` to `new` unless another worker serves `new`.
    pub fn move_mac(&self, nic: &dyn Nic, old: [u8; 6], new: [u8; 6]) -> bool {
        let mut d = self.dir();
        if d.macs.get(&new).is_some_and(|&w| w != self.index) {
            return false;
        }
        if d.macs.get(&old) == Some(&self.index) {
            d.macs.remove(&old);
        }
        d.macs.insert(new, self.index);
        self.changed(&d, nic);
        true
    }

    /// Frees `mac` if this worker serves it.
    pub fn release_mac(&self, nic: &dyn Nic, mac: [u8; 6]) {
        let mut d = self.dir();
        if d.macs.get(&mac) == Some(&self.index) {
            d.macs.remove(&mac);
            self.changed(&d, nic);
        }
    }

    /// Adds this worker's socket to those that exclude the placed MACs.
    pub fn add_exclusion(&self, e: Box<dyn Exclusion>) -> io::Result<()> {
        let mut d = self.dir();
        e.exclude(&d.own_queue_macs)?;
        d.exclusions.push(e);
        Ok(())
    }

    /// Takes `mac`'s frames that came as `tagged` says off every worker's socket, for its
    /// host's own queue to receive them alone (open the queue after this). False, nothing
    /// changed, when that cannot be done: a worker's socket cannot exclude, the filters
    /// would not hold it ([`filter::fits`]), or a filter failed.
    pub fn place(&self, mac: [u8; 6], tagged: Tagged) -> bool {
        let mut d = self.dir();
        if d.exclusions.len() < self.count() || d.own_queue_macs.iter().any(|e| e.0 == mac) {
            return false;
        }
        d.own_queue_macs.push((mac, tagged));
        if !filter::fits(&d.own_queue_macs) {
            d.own_queue_macs.pop();
            return false;
        }
        if let Err(e) = d.exclude() {
            warn!("cannot leave a host's frames to its own queue: {e}");
            d.own_queue_macs.pop();
            let _ = d.exclude();
            return false;
        }
        true
    }

    /// Gives `mac`'s frames back to the workers' sockets (before its host's queue is shut:
    /// [`crate::state::WorkerState::close_own_queue`]).
    pub fn unplace(&self, mac: [u8; 6]) {
        let mut d = self.dir();
        let before = d.own_queue_macs.len();
        d.own_queue_macs.retain(|e| e.0 != mac);
        if d.own_queue_macs.len() != before {
            if let Err(e) = d.exclude() {
                warn!("cannot give a host's frames back to the workers' sockets: {e}");
            }
        }
    }

    /// Records whether this worker has a promiscuous host.
    pub fn set_promisc(&self, any: bool) {
        let mut d = self.dir();
        if d.promisc[self.index] != any {
            d.promisc[self.index] = any;
            self.shared.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// After a change of the MAC table (the directory still held, so programs are set in
    /// the order of the changes): the next generation, and the NIC's steering.
    fn changed(&self, d: &Directory, nic: &dyn Nic) {
        self.shared.generation.fetch_add(1, Ordering::Release);
        if self.count() == 1 {
            return;
        }
        let table: Vec<([u8; 6], u32)> = d.macs.iter().map(|(m, w)| (*m, *w as u32)).collect();
        if let Err(e) = nic.steer(&table) {
            warn!(
                "cannot steer LAN frames to the workers (they cross between workers instead): {e}"
            );
        }
    }
}

/// The main thread's view of the workers: where a new host goes.
#[derive(Debug, Clone)]
pub struct Observer(Arc<Shared>);

impl Observer {
    fn dir(&self) -> MutexGuard<'_, Directory> {
        self.0.dir.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The worker holding the fewest sessions: where a new host goes.
    pub fn least_loaded(&self) -> usize {
        let d = self.dir();
        (0..d.load.len()).min_by_key(|&w| d.load[w]).unwrap_or(0)
    }

    /// The worker for a first queue of host `key`: the one that holds the key's other
    /// connections and sessions, else the least loaded. The key stays that worker's while
    /// the hold returned (carried by the connection, then its session) lives.
    pub fn hold_key(&self, key: Key) -> (usize, KeyHold) {
        let mut d = self.dir();
        let worker = match d.keys.get(&key) {
            Some(&(w, _)) => w,
            None => (0..d.load.len()).min_by_key(|&w| d.load[w]).unwrap_or(0),
        };
        d.keys.entry(key).or_insert((worker, 0)).1 += 1;
        let hold = KeyHold {
            shared: self.0.clone(),
            key,
        };
        (worker, hold)
    }
}

/// A first-queue connection or session of a host key, which keeps the key's connections
/// going to one worker ([`Observer::hold_key`]); dropped when it ends.
#[derive(Debug)]
pub struct KeyHold {
    shared: Arc<Shared>,
    key: Key,
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        let mut d = self.shared.dir.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = d.keys.get_mut(&self.key) {
            held.1 -= 1;
            if held.1 == 0 {
                d.keys.remove(&self.key);
            }
        }
    }
}

/// A token naming a session of worker `index`: 56 unguessable bits and the worker.
pub fn token(random: u64, index: usize) -> u64 {
    (random & !0xff) | (index as u64 & 0xff)
}

/// The worker a token names.
pub fn worker_of(token: u64) -> usize {
    (token & 0xff) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::fake::FakeNic;

    #[test]
    fn admission_counts_every_worker_and_loads_are_absolute() {
        let set = Shard::set(2);
        let (a, b) = (&set[0].0, &set[1].0);
        assert!(a.admit(3) && b.admit(3) && a.admit(3));
        assert!(!b.admit(3), "three sessions held over both workers");
        assert_eq!(b.observer().least_loaded(), 1);
        a.set_load(0);
        assert_eq!(a.observer().least_loaded(), 0);
        assert!(b.admit(3));
    }

    #[test]
    fn a_mac_is_served_by_one_worker_and_lookups_follow_changes() {
        let set = Shard::set(2);
        let nic = FakeNic::default();
        let m1 = [2, 0, 0, 0, 0, 1];
        let m2 = [2, 0, 0, 0, 0, 2];
        let got = set[0].0.claim_mac(&nic, [m1, m2].into_iter());
        assert_eq!(got, Some(m1));
        assert_eq!(set[1].0.claim_mac(&nic, [m1, m2].into_iter()), Some(m2));
        assert_eq!(set[1].0.owner(&m1), Some(0));
        assert_eq!(set[0].0.owner(&m1), None, "its own MAC is not another's");
        assert!(!set[0].0.move_mac(&nic, m1, m2), "m2 is worker 1's");
        let m3 = [2, 0, 0, 0, 0, 3];
        assert!(set[0].0.move_mac(&nic, m1, m3));
        assert_eq!(set[1].0.owner(&m1), None);
        assert_eq!(set[1].0.owner(&m3), Some(0));
        set[0].0.release_mac(&nic, m2);
        assert_eq!(set[0].0.owner(&m2), Some(1), "only the owner releases");
        set[1].0.release_mac(&nic, m2);
        assert_eq!(set[0].0.owner(&m2), None);
        set[1].0.set_promisc(true);
        assert_eq!(*set[0].0.promisc_others(), [1]);
        assert!(set[1].0.promisc_others().is_empty());
    }

    #[tokio::test]
    async fn an_inbox_is_bounded_in_bytes_and_drains() {
        let mut set = Shard::set(2);
        let (_, mut rx) = set.remove(1);
        let a = &set[0].0;
        let frame = vec![0u8; 64 << 10];
        let fit = INBOX_BYTES / frame.len();
        assert!((0..fit).all(|_| a.cross(1, &frame)));
        assert!(!a.cross(1, &frame), "beyond the bound");
        let mut out = Vec::new();
        assert_eq!(rx.recv(&mut out, fit).await, fit);
        assert!(a.cross(1, &frame), "room again once read");
        assert!(!a.cross(7, &frame), "no such worker");
    }

    #[test]
    fn a_keys_connections_go_to_one_worker_while_any_is_held() {
        let set = Shard::set(2);
        let obs = set[0].0.observer();
        set[0].0.set_load(5);
        let (w, first) = obs.hold_key([1; 32]);
        assert_eq!(w, 1, "the least loaded");
        set[0].0.set_load(0);
        let (again, second) = obs.hold_key([1; 32]);
        assert_eq!(again, 1, "the key's worker, however loaded");
        assert_eq!(obs.hold_key([2; 32]).0, 0, "another key: the least loaded");
        drop(first);
        assert_eq!(obs.hold_key([1; 32]).0, 1, "one hold left");
        drop(second);
        set[1].0.set_load(3);
        assert_eq!(obs.hold_key([1; 32]).0, 0, "free again once none is held");
    }

    #[test]
    fn placing_stops_where_the_workers_filters_would_pass_the_kernels_bound() {
        let set = Shard::set(1);
        let nic = FakeNic::default();
        set[0]
            .0
            .add_exclusion(nic.exclusion().unwrap().unwrap())
            .unwrap();
        let wide = Tagged::of(true, (1..4095).step_by(2).take(64)).unwrap();
        let mac = |i: u8| [2, 0, 0, 0, 1, i];
        let placed = (0..60)
            .take_while(|&i| set[0].0.place(mac(i), wide.clone()))
            .count();
        assert_eq!(placed, 56, "73 instructions each");
        assert_eq!(
            nic.excluded.lock().unwrap().len(),
            56,
            "the filters hold what was placed"
        );
        assert!(
            !set[0].0.place(mac(0), Tagged::untagged()),
            "a MAC placed already"
        );
        assert!(!set[0].0.place(mac(99), wide.clone()), "still full");
        set[0].0.unplace(mac(3));
        assert!(set[0].0.place(mac(99), wide), "room once a host leaves");
        // 56 x 73 + 7 instructions of tests and the final verdict: 4,096 exactly.
        assert!(set[0].0.place(mac(100), Tagged::untagged()));
        assert!(
            !set[0].0.place(mac(101), Tagged::untagged()),
            "7 more would pass it"
        );
    }

    #[test]
    fn tokens_name_their_worker() {
        for w in 0..MAX_WORKERS {
            let t = token(u64::MAX, w);
            assert_eq!(worker_of(t), w);
            assert_eq!(t >> 8, u64::MAX >> 8);
        }
    }
}
