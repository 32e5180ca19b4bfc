//! A host's VLANs (`[[auth.hosts]]` `vlan`, `vlans`), as Mellanox's EoIB gateway gave each
//! InfiniBand host a vHub: which frames it may send, which it receives, and how each
//! crosses.
//!
//! Inside the IOC every frame carries its VLAN as on the wire: its outer tag
//! ([`vnet::vlan_of`]; none, or a priority tag, is untagged). A frame from an access host
//! gets its VLAN's tag on the way in; one to an access host loses it on the way out; a trunk
//! host's frames keep theirs. So the LAN, the other workers and every check see one form.

use crate::nic::HostFrames;
use splitnet_messaging::vnet;
use splitnet_netif::filter::Tagged;

/// How a host takes part in VLANs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum VlanMode {
    /// Neither `vlan` nor `vlans`: untagged frames only.
    #[default]
    Untagged,
    /// `vlan = N`: it sends and receives untagged frames, which travel on VLAN N.
    Access(u16),
    /// `vlans = [...]`: its frames tagged with these VLANs, and untagged ones where the list
    /// has 0.
    Trunk(VlanSet),
}

/// A set of VLAN ids, 0 (untagged) to 4095.
#[derive(Clone, PartialEq, Eq)]
pub struct VlanSet(Box<[u64; 64]>);

impl VlanSet {
    /// The set of `vlans`.
    pub fn of(vlans: &[u16]) -> VlanSet {
        let mut bits = Box::new([0u64; 64]);
        for &v in vlans {
            let v = usize::from(v & 0x0fff);
            bits[v / 64] |= 1 << (v % 64);
        }
        VlanSet(bits)
    }

    /// Whether `vlan` (0: untagged) is in it.
    pub fn contains(&self, vlan: u16) -> bool {
        let v = usize::from(vlan & 0x0fff);
        self.0[v / 64] & (1 << (v % 64)) != 0
    }
}

impl std::fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries((0u16..4096).filter(|&v| self.contains(v)))
            .finish()
    }
}

/// What a frame from the host needs before it goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    /// Nothing: it carries its VLAN.
    AsIs,
    /// The tag of this VLAN (an access host's untagged frame).
    Tag(u16),
}

/// What a frame on a VLAN needs to reach a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    /// Nothing: the host takes it as it is.
    AsIs,
    /// Its outer tag taken out (to an access host).
    Strip,
}

impl VlanMode {
    /// The mode an entry's `vlan` and `vlans` give (the configuration allows one or the
    /// other).
    pub fn of(vlan: Option<u16>, vlans: &[u16]) -> VlanMode {
        match (vlan, vlans) {
            (Some(n), _) => VlanMode::Access(n),
            (None, []) => VlanMode::Untagged,
            (None, list) => VlanMode::Trunk(VlanSet::of(list)),
        }
    }

    /// Whether a frame the host sent (`frame`, virtio-net header first) may go on, and what
    /// it needs; the error says why not.
    pub fn ingress(&self, frame: &[u8]) -> Result<Ingress, String> {
        let vlan = vnet::vlan_of(frame);
        match self {
            VlanMode::Untagged => match vlan {
                None => Ok(Ingress::AsIs),
                Some(v) => Err(format!(
                    "a frame tagged for VLAN {v} from a host without VLANs"
                )),
            },
            VlanMode::Access(n) => match vnet::outer_tag(frame) {
                None => Ok(Ingress::Tag(*n)),
                Some(_) => Err(format!("a tagged frame from a host of access VLAN {n}")),
            },
            VlanMode::Trunk(set) => match vlan {
                Some(v) if set.contains(v) => Ok(Ingress::AsIs),
                None if set.contains(0) => Ok(Ingress::AsIs),
                Some(v) => Err(format!(
                    "a frame tagged for VLAN {v}, not one of the host's"
                )),
                None => Err("an untagged frame from a trunk host (its vlans has no 0)".into()),
            },
        }
    }

    /// Whether a frame on `vlan` (`None`: untagged) is for this host, and what it needs.
    pub fn egress(&self, vlan: Option<u16>) -> Option<Egress> {
        match (self, vlan) {
            (VlanMode::Untagged, None) => Some(Egress::AsIs),
            (VlanMode::Access(n), Some(v)) if *n == v => Some(Egress::Strip),
            (VlanMode::Trunk(set), v) if set.contains(v.unwrap_or(0)) => Some(Egress::AsIs),
            _ => None,
        }
    }

    /// Ports mode: whether a frame its port sends out (`vlan`, `None`: untagged) is one the
    /// host may take. The switch strips an access host's VLAN tag as it puts frames out of
    /// the port, so an access or untagged host takes untagged frames only, a trunk host its
    /// VLANs' (untagged ones where its list has 0); anything else means a switch that does
    /// not apply the host's VLANs (a bridge without `vlan_filtering`), and is not delivered.
    pub fn takes_from_port(&self, vlan: Option<u16>) -> bool {
        match self {
            VlanMode::Untagged | VlanMode::Access(_) => vlan.is_none(),
            VlanMode::Trunk(set) => set.contains(vlan.unwrap_or(0)),
        }
    }

    /// Which frames the host's own LAN queue takes, and how: untagged ones for an untagged
    /// host; for an access host those tagged with its VLAN, handed over untagged, as the
    /// host takes them; for a trunk host its VLANs' frames with their tags put back (and
    /// untagged ones where its list has 0). A trunk of more VLAN ranges than one filter holds
    /// ([`splitnet_netif::filter::MAX_VLAN_RANGES`]) keeps its tagged frames on the general
    /// path; `None` when nothing is left for the queue.
    pub fn own_queue(&self) -> Option<HostFrames> {
        let (tagged, keep_tags) = match self {
            VlanMode::Untagged => (Tagged::untagged(), false),
            VlanMode::Access(n) => (Tagged::vlan(*n), false),
            VlanMode::Trunk(set) => {
                let untagged = set.contains(0);
                let vids = (1..4095).filter(|&v| set.contains(v));
                // Too many ranges for a filter: the untagged frames alone, where it takes them.
                let t = Tagged::of(untagged, vids).unwrap_or(match untagged {
                    true => Tagged::untagged(),
                    false => Tagged::default(),
                });
                (t, true)
            }
        };
        (tagged.takes_untagged() || tagged.takes_tagged())
            .then_some(HostFrames { tagged, keep_tags })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use splitnet_messaging::vnet::{insert_vlan, VNET_HDR_LEN};

    /// A frame with a virtio-net header, tagged with `tags` (TPID, TCI) outermost first.
    fn frame(tags: &[(u16, u16)]) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR_LEN];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00]);
        f.extend_from_slice(&[0x45; 40]);
        for &(tpid, tci) in tags.iter().rev() {
            let n = f.len();
            f.resize(n + 4, 0);
            insert_vlan(&mut f, n, tpid, tci).unwrap();
        }
        f
    }

    #[test]
    fn an_untagged_host_sends_and_gets_untagged_frames_only() {
        let m = VlanMode::of(None, &[]);
        assert_eq!(m, VlanMode::Untagged);
        assert_eq!(m.ingress(&frame(&[])), Ok(Ingress::AsIs));
        assert_eq!(
            m.ingress(&frame(&[(0x8100, 0xe000)])),
            Ok(Ingress::AsIs),
            "a priority tag is untagged"
        );
        assert!(m.ingress(&frame(&[(0x8100, 10)])).is_err());
        assert!(m.ingress(&frame(&[(0x88a8, 10), (0x8100, 5)])).is_err());
        assert_eq!(m.egress(None), Some(Egress::AsIs));
        assert_eq!(m.egress(Some(10)), None);
    }

    #[test]
    fn an_access_host_is_tagged_on_the_way_in_and_stripped_on_the_way_out() {
        let m = VlanMode::of(Some(10), &[]);
        assert_eq!(m.ingress(&frame(&[])), Ok(Ingress::Tag(10)));
        assert!(
            m.ingress(&frame(&[(0x8100, 10)])).is_err(),
            "its own VLAN too"
        );
        assert!(
            m.ingress(&frame(&[(0x8100, 0)])).is_err(),
            "a priority tag too"
        );
        assert_eq!(m.egress(Some(10)), Some(Egress::Strip));
        assert_eq!(m.egress(Some(20)), None);
        assert_eq!(m.egress(None), None);
    }

    #[test]
    fn a_trunk_host_keeps_its_listed_tags_and_untagged_frames_where_0_is_listed() {
        let m = VlanMode::of(None, &[10, 4094]);
        assert_eq!(m.ingress(&frame(&[(0x8100, 10)])), Ok(Ingress::AsIs));
        assert_eq!(
            m.ingress(&frame(&[(0x88a8, 4094), (0x8100, 7)])),
            Ok(Ingress::AsIs)
        );
        assert!(m.ingress(&frame(&[(0x8100, 20)])).is_err());
        assert!(m.ingress(&frame(&[])).is_err(), "untagged: no 0 listed");
        assert_eq!(m.egress(Some(10)), Some(Egress::AsIs));
        assert_eq!(m.egress(Some(20)), None);
        assert_eq!(m.egress(None), None);
        assert!(VlanMode::of(None, &[]).takes_from_port(None));
        assert!(!VlanMode::of(None, &[]).takes_from_port(Some(10)));
        assert!(
            VlanMode::of(Some(10), &[]).takes_from_port(None),
            "the switch stripped it"
        );
        assert!(!VlanMode::of(Some(10), &[]).takes_from_port(Some(10)));
        assert!(!VlanMode::of(Some(10), &[]).takes_from_port(Some(20)));
        assert!(VlanMode::of(None, &[10]).takes_from_port(Some(10)));
        assert!(!VlanMode::of(None, &[10]).takes_from_port(Some(20)));
        assert!(!VlanMode::of(None, &[10]).takes_from_port(None));
        assert!(VlanMode::of(None, &[0, 10]).takes_from_port(None));
        let native = VlanMode::of(None, &[0, 10]);
        assert_eq!(native.ingress(&frame(&[])), Ok(Ingress::AsIs));
        assert_eq!(native.egress(None), Some(Egress::AsIs));
        let trunk = |untagged: bool, vids: &[u16]| {
            Some(HostFrames {
                tagged: Tagged::of(untagged, vids.iter().copied()).unwrap(),
                keep_tags: true,
            })
        };
        assert_eq!(native.own_queue(), trunk(true, &[10]), "both, tags kept");
        assert_eq!(m.own_queue(), trunk(false, &[10, 4094]));
        let plain = |tagged| {
            Some(HostFrames {
                tagged,
                keep_tags: false,
            })
        };
        assert_eq!(VlanMode::Untagged.own_queue(), plain(Tagged::untagged()));
        assert_eq!(VlanMode::Access(7).own_queue(), plain(Tagged::vlan(7)));
        // More ranges than a filter holds: the untagged frames alone, or nothing.
        let many: Vec<u16> = (1..4095).step_by(2).collect();
        let mut with_0 = many.clone();
        with_0.push(0);
        assert_eq!(VlanMode::of(None, &with_0).own_queue(), trunk(true, &[]));
        assert_eq!(VlanMode::of(None, &many).own_queue(), None);
    }

    proptest! {
        /// Whatever a host may send on a VLAN, a host of the same mode receives on it: what
        /// goes in comes out (after the IOC's tag for an access host).
        #[test]
        fn what_a_host_may_send_on_a_vlan_a_host_of_its_mode_receives(
            access in proptest::option::of(1u16..4095),
            list in proptest::collection::vec(0u16..4095, 0..8),
            tags in proptest::collection::vec((prop_oneof![Just(0x8100u16), Just(0x88a8u16)], any::<u16>()), 0..3),
        ) {
            let list = if access.is_some() { vec![] } else { list };
            let m = VlanMode::of(access, &list);
            let f = frame(&tags);
            if let Ok(i) = m.ingress(&f) {
                let vlan = match i {
                    Ingress::Tag(n) => Some(n),
                    Ingress::AsIs => vnet::vlan_of(&f),
                };
                let e = m.egress(vlan);
                prop_assert!(e.is_some(), "{m:?} sent on {vlan:?} and would not get it");
                prop_assert_eq!(e == Some(Egress::Strip), matches!(i, Ingress::Tag(_)));
            }
        }
    }
}
