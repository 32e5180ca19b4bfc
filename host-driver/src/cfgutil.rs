//! The CfgUtil client: what the host asks of the IOC about sd0 (MAC, MTU, link state,
//! offload features, its counters), how it takes the answers and the IOC's own requests
//! (LinkChange), and the settings the two have agreed on.

use splitnet_config::HostConfig;
use splitnet_control::report::Counters;
use splitnet_messaging::endpoint::Session;
use splitnet_messaging::wire::{self, features, CfgCode, ErrorCode};
use splitnet_netif::netdev;
use splitnet_netif::tap::{Offloads, Tap};
use tracing::{debug, info, warn};

/// The features a TAP with `o` makes the kernel use, as told to the IOC.
pub fn feature_bits(o: &Offloads) -> u64 {
    let mut f = features::VNET_HDR;
    if o.csum {
        f |= features::CSUM;
    }
    if o.tso {
        f |= features::TSO4 | features::TSO6 | features::ECN;
    }
    if o.uso {
        f |= features::USO;
    }
    f
}

/// What an answer about the features asks of the caller ([`Settings::on_features`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Features {
    /// Nothing more (a further request, if any, is queued).
    Asked,
    /// The IOC refused the offloads: turn them off on the TAP and ask again.
    OffloadsOff,
}

/// sd0's settings as told to, asked of and agreed with the IOC over CfgUtil.
pub struct Settings {
    /// The interface (sd0).
    pub name: String,
    /// The MAC configured for sd0 (SetMac) instead of the one the IOC assigns.
    mac_override: Option<[u8; 6]>,
    /// sd0 has the MAC agreed with the IOC.
    pub mac_known: bool,
    /// sd0 has the MTU agreed with the IOC.
    pub mtu_known: bool,
    /// MTU agreed with the IOC and set on the TAP.
    pub mtu: u32,
    /// Largest MTU the IOC accepts.
    pub mtu_max: u32,
    /// An MTU set on the TAP by an administrator, asked of the IOC, not yet answered.
    pub mtu_pending: Option<u32>,
    /// Promiscuous mode last reported to the IOC.
    pub promisc: bool,
    /// sd0 takes every multicast frame (IFF_ALLMULTI, not promiscuous): SetPromisc 2.
    pub allmulti: bool,
    /// Multicast groups of the TAP last reported to the IOC.
    pub multicast: Vec<[u8; 6]>,
    /// The link of the IOC's NIC is up.
    pub ioc_nic_up: bool,
    /// Features told to the IOC (SetFeatures): what sd0's offloads let the kernel send.
    pub features: u64,
    /// The TAP was re-attached and this is its first connection: its MTU is kept (asked
    /// of the IOC) rather than replaced by the IOC's.
    pub keep_mtu: bool,
    /// This is the host's first queue, which sets the features for all of them.
    first: bool,
    /// The express lane is configured (`fabric.express`): asked for where the IOC offers it.
    express_wanted: bool,
    /// The express lane is agreed: frames of sparse flows may go as SendData on the
    /// control channel (docs/protocol.md 6.6).
    pub express: bool,
}

impl Settings {
    /// Nothing agreed yet with a new connection's IOC; `features` are sd0's, `first` says
    /// whether this is the host's first queue.
    pub fn new(cfg: &HostConfig, features: u64, first: bool) -> Settings {
        Settings {
            name: cfg.interface.name.clone(),
            mac_override: cfg.interface.mac.map(|m| m.0),
            mac_known: false,
            mtu_known: false,
            mtu: 0,
            mtu_max: 0,
            mtu_pending: None,
            promisc: false,
            allmulti: false,
            multicast: Vec::new(),
            ioc_nic_up: false,
            features,
            keep_mtu: false,
            first,
            express_wanted: cfg.fabric.express,
            express: false,
        }
    }

    /// The first queue's requests on a new session: the MAC (set or asked for), the MTU,
    /// the link state and the features.
    pub fn request_initial(&self, s: &mut Session) {
        match self.mac_override {
            Some(mac) => {
                s.cfg_request(CfgCode::SetMac, &mac);
            }
            None => {
                s.cfg_request(CfgCode::GetMac, &[]);
            }
        }
        s.cfg_request(CfgCode::GetMtu, &[]);
        s.cfg_request(CfgCode::GetLink, &[]);
        self.request_features(s);
    }

    /// The features: with the express lane wanted, what the IOC offers first (an IOC
    /// that does not know the lane refuses a SetFeatures asking for it); then, on the first
    /// queue, SetFeatures.
    pub fn request_features(&self, s: &mut Session) {
        match (self.express_wanted, self.first) {
            (true, _) => s.cfg_request(CfgCode::GetFeatures, &[]),
            (false, true) => s.cfg_request(CfgCode::SetFeatures, &self.features.to_be_bytes()),
            (false, false) => return,
        };
    }

    /// Takes the IOC's answer to a request (further requests, if any, go on `session`).
    /// Returns the IOC's counters for this host when the answer is GetStats's.
    pub fn on_reply(
        &mut self,
        session: &mut Session,
        tap: &Tap,
        code: CfgCode,
        status: ErrorCode,
        data: &[u8],
    ) -> Option<Counters> {
        if matches!(code, CfgCode::GetFeatures | CfgCode::SetFeatures) {
            if self.on_features(session, code, status, data) == Features::OffloadsOff {
                // The IOC's NIC side takes no offloads: the kernel must hand sd0 plain,
                // fully checksummed frames.
                match tap.enable_offloads(false) {
                    Ok(_) => {
                        warn!(
                            "IOC does not take checksum/segmentation offloads; turned them off on {}",
                            self.name
                        );
                        self.features = features::VNET_HDR;
                        session.cfg_request(CfgCode::SetFeatures, &self.features.to_be_bytes());
                    }
                    Err(e) => warn!("cannot turn the offloads of {} off: {e}", self.name),
                }
            }
            return None;
        }
        if status != ErrorCode::Ok {
            warn!(?code, ?status, "IOC refused a configuration request");
            if code == CfgCode::SetMtu {
                if let Some(asked) = self.mtu_pending.take() {
                    warn!(
                        "MTU {asked} on {} refused by the IOC ({status:?}); back to {}",
                        self.name, self.mtu
                    );
                    let _ = netdev::set_mtu(&self.name, self.mtu);
                }
            }
            if code == CfgCode::SetMac {
                // Fall back to the MAC the IOC assigns.
                session.cfg_request(CfgCode::GetMac, &[]);
            }
            return None;
        }
        match code {
            CfgCode::GetMac | CfgCode::SetMac => {
                let mac = if code == CfgCode::SetMac {
                    self.mac_override
                } else {
                    wire::parse_mac(data).ok()
                };
                // The MAC a re-attached interface already has is left alone on its first
                // connection: setting it anew would make the kernel flush the neighbour
                // entries that outlived the daemon. On a reconnect it is set again: the
                // carrier going down already flushed the entries that were good, and the
                // flush clears those that failed while the IOC was away, which the kernel
                // would otherwise keep answering with errors for a second or more.
                let keep = self.keep_mtu;
                if let Some(mac) = mac.filter(|m| keep && netdev::mac(&self.name).ok() == Some(*m))
                {
                    debug!(mac = %wire::fmt_mac(&mac), "MAC address already set");
                    self.mac_known = true;
                } else if let Some(mac) = mac {
                    match netdev::set_mac(&self.name, mac) {
                        Ok(()) => {
                            info!(mac = %wire::fmt_mac(&mac), "MAC address set");
                            self.mac_known = true;
                        }
                        Err(e) => warn!("cannot set the MAC of {}: {e}", self.name),
                    }
                }
            }
            CfgCode::GetMtu => {
                if let Ok(m) = wire::Mtu::parse(data) {
                    self.mtu_max = m.max;
                    // An MTU being asked of the IOC (a kept one) is not overridden.
                    if self.mtu_pending.is_none() {
                        self.take_ioc_mtu(m.current);
                    }
                }
            }
            CfgCode::SetMtu => {
                if let Some(n) = self.mtu_pending.take() {
                    info!(mtu = n, "MTU accepted by the IOC");
                    self.mtu = n;
                }
            }
            CfgCode::SetPromisc => {
                debug!(
                    promisc = self.promisc,
                    allmulti = self.allmulti,
                    "promiscuous and all-multicast modes set on the IOC"
                )
            }
            CfgCode::GetLink => {
                if let Ok(v) = wire::parse_u8(data) {
                    self.ioc_nic_up = v == 1;
                }
            }
            CfgCode::SetMulticast => debug!(
                groups = self.multicast.len(),
                "multicast groups set on the IOC"
            ),
            CfgCode::GetStats => {
                return wire::Stats::parse(data).ok().map(|st| Counters::from(&st))
            }
            other => debug!(?other, "CfgUtil reply"),
        }
        None
    }

    /// Takes the IOC's answer to GetFeatures or SetFeatures: asks for the features (with the
    /// express lane where offered), falls back to the offloads alone when the lane is
    /// refused, and says when the offloads themselves were refused (the caller turns them
    /// off on the TAP and asks again).
    fn on_features(
        &mut self,
        session: &mut Session,
        code: CfgCode,
        status: ErrorCode,
        data: &[u8],
    ) -> Features {
        let set = |s: &mut Session, f: u64| s.cfg_request(CfgCode::SetFeatures, &f.to_be_bytes());
        match (code, status) {
            (CfgCode::GetFeatures, ErrorCode::Ok) => {
                let offered = wire::parse_u64(data).unwrap_or(0);
                let lane = self.express_wanted && offered & features::EXPRESS != 0;
                if self.first {
                    if lane {
                        self.features |= features::EXPRESS;
                    }
                    set(session, self.features);
                } else {
                    // The first queue asks for the lane for every queue of the host.
                    self.express = lane;
                }
            }
            (CfgCode::GetFeatures, _) => {
                // An IOC that answers no GetFeatures (on a further queue) offers no lane.
                debug!(?status, "IOC told no features");
                if self.first {
                    set(session, self.features);
                }
            }
            (_, ErrorCode::Ok) => {
                self.express = self.features & features::EXPRESS != 0;
                info!(features = ?features::names(self.features), "features agreed");
            }
            _ if self.features & features::EXPRESS != 0 => {
                warn!(
                    ?status,
                    "IOC refused the express lane; asking for the offloads alone"
                );
                self.features &= !features::EXPRESS;
                set(session, self.features);
            }
            _ if self.features != features::VNET_HDR => return Features::OffloadsOff,
            _ => warn!(?status, "IOC refused the virtio-net header alone"),
        }
        Features::Asked
    }

    /// Answers a request of the IOC's (on `session`): a LinkChange of its NIC, taken only
    /// on the `first` queue's session.
    pub fn on_request(
        &mut self,
        session: &mut Session,
        first: bool,
        txn: u64,
        code: CfgCode,
        data: &[u8],
    ) {
        let status = match code {
            // The interface follows the first queue's session.
            CfgCode::LinkChange if !first => ErrorCode::Refused,
            CfgCode::LinkChange => match wire::LinkChange::parse(data) {
                Ok(c) => {
                    info!(up = c.up, mtu = c.mtu, "NIC link change");
                    // sd0 at the NIC's MTU follows it, up or down; an MTU a user chose below
                    // it stays while the NIC allows it.
                    let following = self.mtu_known && self.mtu == self.mtu_max;
                    self.ioc_nic_up = c.up;
                    self.mtu_max = c.mtu;
                    if !self.mtu_known || self.mtu > c.mtu || (following && self.mtu != c.mtu) {
                        self.take_ioc_mtu(c.mtu);
                    }
                    ErrorCode::Ok
                }
                Err(_) => ErrorCode::Malformed,
            },
            _ => ErrorCode::Unsupported,
        };
        session.cfg_reply(txn, code, status, &[]);
    }

    /// Takes the IOC's current MTU onto sd0, unless sd0 was re-attached with an MTU of its
    /// own that the IOC allows: that one is kept, and the watch of sd0 (`interface::Watch`)
    /// asks the IOC for it (SetMtu) as for an `ip link set sd0 mtu` change.
    fn take_ioc_mtu(&mut self, current: u32) {
        if self.keep_mtu {
            match netdev::mtu(&self.name) {
                Ok(cur) if cur != current && (68..=self.mtu_max).contains(&cur) => {
                    info!(mtu = cur, "keeping the MTU of {}", self.name);
                    self.mtu = current;
                    self.mtu_known = true;
                    return;
                }
                _ => self.keep_mtu = false,
            }
        }
        self.apply_mtu(current);
    }

    fn apply_mtu(&mut self, mtu: u32) {
        match netdev::set_mtu(&self.name, mtu) {
            Ok(()) => {
                info!(mtu, "MTU set from the IOC");
                self.mtu = mtu;
                self.mtu_known = true;
            }
            Err(e) => warn!("cannot set MTU {mtu} on {}: {e}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitnet_messaging::memory::DomainId;
    use splitnet_messaging::wire::Message;
    use std::path::Path;

    const OFFLOADS: u64 = features::VNET_HDR | features::CSUM | features::TSO4;

    /// A queue's settings (`first` or not) with `fabric.express` as given, and its session.
    fn settings(express: bool, first: bool) -> (Settings, Session) {
        let text = format!(
            "[fabric]\nioc = \"10.0.0.1:7400\"\nexpress = {express}\n[interface]\nname = \"sd0\"\n"
        );
        let cfg = splitnet_config::parse_host(&text, Path::new("host.toml")).unwrap();
        let session = Session::new(DomainId(1), cfg.pools.session_config());
        (Settings::new(&cfg, OFFLOADS, first), session)
    }

    /// The CfgUtil requests queued on `s`, with their data.
    fn requests(s: &mut Session) -> Vec<(CfgCode, Vec<u8>)> {
        std::iter::from_fn(|| s.poll_transmit())
            .filter_map(|(_, m)| match Message::parse(&m).ok()?.1 {
                Message::CfgUtilRequest(r) => Some((r.code, r.data.to_vec())),
                _ => None,
            })
            .collect()
    }

    /// The IOC's answer to GetFeatures: it offers `bits`.
    fn offer(st: &mut Settings, s: &mut Session, bits: u64) {
        st.on_features(s, CfgCode::GetFeatures, ErrorCode::Ok, &bits.to_be_bytes());
    }

    fn set(bits: u64) -> (CfgCode, Vec<u8>) {
        (CfgCode::SetFeatures, bits.to_be_bytes().to_vec())
    }

    #[test]
    fn without_the_lane_the_first_queue_sets_its_offloads_at_once() {
        let (st, mut s) = settings(false, true);
        st.request_features(&mut s);
        assert_eq!(requests(&mut s), vec![set(OFFLOADS)]);
        let (st, mut s) = settings(false, false);
        st.request_features(&mut s);
        assert!(requests(&mut s).is_empty(), "a further queue asks nothing");
    }

    #[test]
    fn the_lane_is_asked_for_only_where_offered_and_agreed_only_on_ok() {
        let (mut st, mut s) = settings(true, true);
        st.request_features(&mut s);
        assert_eq!(requests(&mut s), vec![(CfgCode::GetFeatures, vec![])]);
        // Offered: asked for with the offloads; agreed on the Ok.
        offer(&mut st, &mut s, OFFLOADS | features::EXPRESS);
        assert_eq!(requests(&mut s), vec![set(OFFLOADS | features::EXPRESS)]);
        assert!(!st.express, "not before the IOC agrees");
        st.on_features(&mut s, CfgCode::SetFeatures, ErrorCode::Ok, &[]);
        assert!(st.express);
        // Not offered (an IOC without the lane): the offloads alone.
        let (mut st, mut s) = settings(true, true);
        offer(&mut st, &mut s, OFFLOADS);
        assert_eq!(requests(&mut s), vec![set(OFFLOADS)]);
        st.on_features(&mut s, CfgCode::SetFeatures, ErrorCode::Ok, &[]);
        assert!(!st.express);
    }

    #[test]
    fn a_refused_lane_is_dropped_before_the_offloads_are() {
        let (mut st, mut s) = settings(true, true);
        offer(&mut st, &mut s, OFFLOADS | features::EXPRESS);
        requests(&mut s);
        let refused = ErrorCode::Unsupported;
        let next = st.on_features(&mut s, CfgCode::SetFeatures, refused, &[]);
        assert_eq!(next, Features::Asked);
        assert_eq!(requests(&mut s), vec![set(OFFLOADS)], "the offloads alone");
        // Refused again: now the offloads go (the caller turns them off on the TAP).
        let next = st.on_features(&mut s, CfgCode::SetFeatures, refused, &[]);
        assert_eq!(next, Features::OffloadsOff);
        assert!(!st.express);
    }

    #[test]
    fn a_further_queue_takes_the_offer_from_its_own_get_features() {
        let (mut st, mut s) = settings(true, false);
        st.request_features(&mut s);
        assert_eq!(requests(&mut s), vec![(CfgCode::GetFeatures, vec![])]);
        offer(&mut st, &mut s, OFFLOADS | features::EXPRESS);
        assert!(st.express);
        assert!(
            requests(&mut s).is_empty(),
            "the first queue sets the features"
        );
        // An IOC that refuses a further queue's GetFeatures offers no lane.
        let (mut st, mut s) = settings(true, false);
        st.on_features(&mut s, CfgCode::GetFeatures, ErrorCode::Refused, &[]);
        assert!(!st.express);
        assert!(requests(&mut s).is_empty());
    }

    #[test]
    fn features_follow_the_tap_offloads() {
        let none = Offloads::default();
        assert_eq!(feature_bits(&none), features::VNET_HDR);
        let tso = Offloads {
            csum: true,
            tso: true,
            uso: false,
        };
        assert_eq!(
            features::names(feature_bits(&tso)),
            ["vnet_hdr", "csum", "tso4", "tso6", "ecn"]
        );
        let all = Offloads { uso: true, ..tso };
        assert!(features::names(feature_bits(&all)).contains(&"uso"));
    }
}
