//! Who becomes a host: the admission policy of `[auth]` applied to each Hello the main
//! thread reads, before any worker, slot, MAC or pool is spent on it.
//!
//! With `admission = "keys"` (the default) a Hello must come in an authenticated handshake
//! (docs/protocol.md 5.1) proving a key of `[[auth.hosts]]`, and its timestamp must be above
//! the last one taken from that key for that queue and channel, so a recorded handshake
//! cannot be played again. The host's identity (and so its derived MAC) is then its key, not
//! the node id it claims. With `admission = "open"` (a lab) anyone gets in.

use crate::vlan::VlanMode;
use splitnet_config::{Admission, IocAuth, MAX_HOST_QUEUES};
use splitnet_fabric::auth::{Key, Responder};
use splitnet_messaging::wire::{ErrorCode, Hello};
use std::collections::{HashMap, HashSet};

/// The admission policy and what it remembers.
#[derive(Debug)]
pub struct Gate {
    cfg: IocAuth,
    /// This IOC's private key, if it has one (always, with `admission = "keys"`).
    key: Option<Key>,
    /// The last timestamp taken per host key, queue index and channel kind (control or
    /// data): at most 1,024 keys x 16 queues x 2 entries.
    last: HashMap<(Key, u8, bool), u64>,
}

/// Why a Hello is refused: its status and the log line's reason.
pub type Refusal = (ErrorCode, String);

/// What admission gives a host: its `[[auth.hosts]]` entry's policy, or open admission's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Its name in `[[auth.hosts]]`.
    pub name: Option<String>,
    /// The MAC its policy gives it.
    pub mac: Option<[u8; 6]>,
    /// MACs of machines bridged behind it: it may send from them, and frames to them reach
    /// it (entered in the forwarding table).
    pub extra_macs: Vec<[u8; 6]>,
    /// Whether it may turn promiscuous.
    pub promiscuous: bool,
    /// Queues it may open.
    pub queues: u16,
    /// Its VLANs.
    pub vlan: VlanMode,
    /// Its port (`lan.mode = "ports"`): its entry's ([`splitnet_config::AdmittedHost::port_name`]); none
    /// without an entry.
    pub port: Option<String>,
}

impl Policy {
    /// Open admission's policy (and a host without a key's): no name or fixed MAC, no
    /// bridged machines, promiscuous mode allowed, as many queues as a host may have.
    pub fn open() -> Policy {
        Policy {
            name: None,
            mac: None,
            extra_macs: Vec::new(),
            promiscuous: true,
            queues: MAX_HOST_QUEUES,
            vlan: VlanMode::Untagged,
            port: None,
        }
    }

    /// The policy `auth` gives a session proving `key` (`None`: none proven): its entry's,
    /// open admission's, or none (the session may not stay).
    pub fn of(auth: &IocAuth, key: Option<&Key>) -> Option<Policy> {
        if auth.admission == Admission::Open {
            let port = key.and_then(|k| auth.host(k)).map(|h| h.port_name());
            return Some(Policy {
                port,
                ..Policy::open()
            });
        }
        let host = auth.host(key?)?;
        Some(Policy {
            name: Some(host.name.clone()),
            mac: host.mac.map(|m| m.0),
            extra_macs: host.extra_macs.iter().map(|m| m.0).collect(),
            promiscuous: host.promiscuous,
            queues: host.queues,
            vlan: VlanMode::of(host.vlan, &host.vlans),
            port: Some(host.port_name()),
        })
    }
}

/// A handshake timestamp (nanoseconds since the Unix epoch) as a log shows it: seconds
/// since the epoch with their fraction.
fn shown(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

impl Gate {
    /// The policy of `cfg`, with this IOC's private `key`.
    pub fn new(cfg: IocAuth, key: Option<Key>) -> Gate {
        Gate {
            cfg,
            key,
            last: HashMap::new(),
        }
    }

    /// This IOC's private key.
    pub fn key(&self) -> Option<&Key> {
        self.key.as_ref()
    }

    /// Takes a new `[auth]` (a reload; this IOC's key stays). What the old policy remembers
    /// of the timestamps of keys still admitted stays, so a handshake recorded before the
    /// reload stays refused; a key taken out of `[[auth.hosts]]` is forgotten.
    pub fn reload(&mut self, cfg: IocAuth) {
        self.cfg = cfg;
        let admitted: HashSet<Key> = self.cfg.hosts.iter().map(|h| h.public_key.0).collect();
        self.last.retain(|(k, _, _), _| admitted.contains(k));
    }

    /// Lets a Hello in, authenticated by `proof` if it came in an AuthHello, or refuses it.
    /// An authenticated Hello gets the node id of its key.
    pub fn admit(
        &mut self,
        hello: &mut Hello,
        control: bool,
        proof: Option<&Responder>,
    ) -> Result<Policy, Refusal> {
        let Some(r) = proof else {
            return match self.cfg.admission {
                Admission::Open => Ok(Policy::open()),
                Admission::Keys => Err((
                    ErrorCode::Unauthenticated,
                    "a Hello without a key (auth.admission = \"keys\" admits only the hosts of [[auth.hosts]])".into(),
                )),
            };
        };
        hello.node_id = identity(&r.peer);
        if self.cfg.admission == Admission::Open {
            return Ok(Policy::open());
        }
        let Some(host) = self.cfg.host(&r.peer) else {
            return Err((
                ErrorCode::Unauthenticated,
                format!(
                    "host key {} is not admitted (add it to [[auth.hosts]])",
                    splitnet_config::key::Key(r.peer)
                ),
            ));
        };
        let q = hello.queue;
        if u16::from(q.count) > host.queues || u16::from(q.index) >= host.queues {
            return Err((
                ErrorCode::Busy,
                format!(
                    "host {:?}: queue {} of {} beyond the {} its entry allows (queues in [[auth.hosts]])",
                    host.name, q.index, q.count, host.queues
                ),
            ));
        }
        let last = self.last.entry((r.peer, q.index, control)).or_default();
        if r.timestamp <= *last {
            return Err((
                ErrorCode::Unauthenticated,
                format!(
                    "host {:?}: handshake timestamp {} s is not after the last taken from its key, {} s: \
                     a replayed handshake, or the host's clock went back (README, \"Admitting a host\")",
                    host.name,
                    shown(r.timestamp),
                    shown(*last)
                ),
            ));
        }
        *last = r.timestamp;
        Ok(Policy::of(&self.cfg, Some(&r.peer)).unwrap_or_else(Policy::open))
    }
}

/// The node id of a host key: its first eight bytes (X25519 public keys are uniform, and the
/// admitted keys are distinct).
pub fn identity(key: &Key) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&key[..8]);
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_config::key::Key as TextKey;
    use splitnet_config::{AdmittedHost, MacAddr};
    use splitnet_fabric::auth::{generate, public_key, Initiator};
    use splitnet_messaging::endpoint::handshake;
    use splitnet_messaging::wire::{Message, Queue, Role};

    /// The Hello and proof the IOC with key `ioc` reads from a host with key `host`.
    fn hello_from(host: &Key, ioc: &Key, channel: u8, ts: u64) -> (Hello, Responder) {
        let bytes = handshake::hello(
            Role::Host,
            channel,
            Queue { index: 0, count: 1 },
            0,
            99,
            70_000,
        );
        let mut i = Initiator::new(host, &public_key(ioc)).unwrap();
        let m = i.hello(&bytes, ts).unwrap();
        let (r, inner) = Responder::accept(ioc, &m).unwrap();
        let Ok((_, Message::Hello(h))) = Message::parse(&inner) else {
            panic!("not a Hello");
        };
        (h, r)
    }

    fn gate(admission: Admission, hosts: &[(&str, Key, Option<[u8; 6]>)], ioc: Key) -> Gate {
        let cfg = IocAuth {
            admission,
            encrypt_data: false,
            private_key_file: None,
            hosts: hosts
                .iter()
                .map(|(name, k, mac)| AdmittedHost {
                    name: name.to_string(),
                    public_key: TextKey(public_key(k)),
                    mac: mac.map(MacAddr),
                    extra_macs: vec![MacAddr([2, 0xaa, 0, 0, 0, 1])],
                    promiscuous: false,
                    queues: 2,
                    vlan: None,
                    vlans: Vec::new(),
                    port: None,
                })
                .collect(),
        };
        Gate::new(cfg, Some(ioc))
    }

    #[test]
    fn only_admitted_keys_get_in_with_their_identity_and_mac() {
        let (ioc, a, b, stranger) = (
            generate().unwrap(),
            generate().unwrap(),
            generate().unwrap(),
            generate().unwrap(),
        );
        let mac = [2, 0x5d, 0, 0, 0, 0x42];
        let mut g = gate(Admission::Keys, &[("a", a, Some(mac)), ("b", b, None)], ioc);
        let (mut h, r) = hello_from(&a, &ioc, 0, 10);
        let got = g.admit(&mut h, true, Some(&r)).unwrap();
        assert_eq!((got.mac, got.name.as_deref()), (Some(mac), Some("a")));
        assert_eq!(got.extra_macs, vec![[2, 0xaa, 0, 0, 0, 1]]);
        assert!(!got.promiscuous);
        assert_eq!(
            h.node_id,
            identity(&public_key(&a)),
            "the key decides, not the claim (99)"
        );
        let (mut h, r) = hello_from(&b, &ioc, 0, 10);
        assert_eq!(g.admit(&mut h, true, Some(&r)).unwrap().mac, None);
        let (mut h, r) = hello_from(&stranger, &ioc, 0, 10);
        let (code, why) = g.admit(&mut h, true, Some(&r)).unwrap_err();
        assert_eq!(code, ErrorCode::Unauthenticated);
        assert!(
            why.contains(&TextKey(public_key(&stranger)).to_string()),
            "{why}"
        );
        let (mut h, _) = hello_from(&a, &ioc, 0, 11);
        assert_eq!(
            g.admit(&mut h, true, None).unwrap_err().0,
            ErrorCode::Unauthenticated
        );
    }

    #[test]
    fn a_replayed_or_older_handshake_is_refused_per_queue_and_channel() {
        let (ioc, a) = (generate().unwrap(), generate().unwrap());
        let mut g = gate(Admission::Keys, &[("a", a, None)], ioc);
        let (mut h, r) = hello_from(&a, &ioc, 0, 100);
        assert!(g.admit(&mut h.clone(), true, Some(&r)).is_ok());
        // The same message again (a replay), and an older one.
        let why = g.admit(&mut h, true, Some(&r)).unwrap_err().1;
        assert!(why.contains("replayed"), "{why}");
        assert!(
            why.contains("\"a\"")
                && why.contains("0.000000100 s is not after")
                && why.contains("0.000000100 s:"),
            "the entry's name and both times: {why}"
        );
        let (mut h, r) = hello_from(&a, &ioc, 0, 99);
        assert!(g.admit(&mut h, true, Some(&r)).is_err());
        // The data channel counts on its own, and a later control handshake gets in.
        let (mut h, r) = hello_from(&a, &ioc, 1, 50);
        assert!(g.admit(&mut h, false, Some(&r)).is_ok());
        let (mut h, r) = hello_from(&a, &ioc, 0, 101);
        assert!(g.admit(&mut h, true, Some(&r)).is_ok());
    }

    #[test]
    fn a_reload_admits_new_keys_and_drops_removed_ones() {
        let (ioc, a, b) = (
            generate().unwrap(),
            generate().unwrap(),
            generate().unwrap(),
        );
        let mut g = gate(Admission::Keys, &[("a", a, None)], ioc);
        let (mut h, r) = hello_from(&b, &ioc, 0, 5);
        assert!(g.admit(&mut h.clone(), true, Some(&r)).is_err());
        let next = gate(Admission::Keys, &[("b", b, None)], ioc).cfg;
        g.reload(next);
        assert!(g.admit(&mut h, true, Some(&r)).is_ok());
        let (mut h, r) = hello_from(&a, &ioc, 0, 6);
        assert!(g.admit(&mut h, true, Some(&r)).is_err());
        g.reload(gate(Admission::Open, &[], ioc).cfg);
        assert!(g.admit(&mut h, true, Some(&r)).is_ok());
    }

    #[test]
    fn a_key_opens_no_more_queues_than_its_entry_allows() {
        let (ioc, a) = (generate().unwrap(), generate().unwrap());
        let mut g = gate(Admission::Keys, &[("a", a, None)], ioc);
        let mut ts = 0;
        let mut try_queue = |index: u8, count: u8| {
            ts += 1;
            let bytes = handshake::hello(Role::Host, 0, Queue { index, count }, 0, 99, 70_000);
            let mut i = Initiator::new(&a, &public_key(&ioc)).unwrap();
            let (r, inner) = Responder::accept(&ioc, &i.hello(&bytes, ts).unwrap()).unwrap();
            let Ok((_, Message::Hello(mut h))) = Message::parse(&inner) else {
                panic!("not a Hello");
            };
            g.admit(&mut h, true, Some(&r)).map(|p| p.queues)
        };
        assert_eq!(try_queue(0, 2), Ok(2));
        assert_eq!(try_queue(1, 2), Ok(2));
        for (index, count) in [(0, 3), (2, 3)] {
            let (code, why) = try_queue(index, count).unwrap_err();
            assert_eq!(code, ErrorCode::Busy);
            assert!(why.contains("beyond the 2 its entry allows"), "{why}");
        }
    }

    #[test]
    fn the_policy_of_a_key_follows_the_configuration() {
        let (ioc, a, b) = (
            generate().unwrap(),
            generate().unwrap(),
            generate().unwrap(),
        );
        let mac = [2, 0x5d, 0, 0, 0, 7];
        let g = gate(Admission::Keys, &[("a", a, Some(mac))], ioc);
        let p = Policy::of(&g.cfg, Some(&public_key(&a))).unwrap();
        assert_eq!(
            (p.name.as_deref(), p.mac, p.queues),
            (Some("a"), Some(mac), 2)
        );
        assert_eq!(Policy::of(&g.cfg, Some(&public_key(&b))), None);
        assert_eq!(Policy::of(&g.cfg, None), None, "no key under key admission");
        let open = gate(Admission::Open, &[], ioc);
        assert_eq!(Policy::of(&open.cfg, None), Some(Policy::open()));
    }

    #[test]
    fn open_admission_takes_anyone() {
        let (ioc, a) = (generate().unwrap(), generate().unwrap());
        let mut g = gate(Admission::Open, &[], ioc);
        let (mut h, r) = hello_from(&a, &ioc, 0, 1);
        assert_eq!(h.node_id, 99);
        assert_eq!(g.admit(&mut h.clone(), true, None), Ok(Policy::open()));
        assert_eq!(g.admit(&mut h, true, Some(&r)), Ok(Policy::open()));
        assert_eq!(h.node_id, identity(&public_key(&a)));
    }
}
