//! Adapter protection tests: every way a write can be refused, and that nothing is placed.

use super::*;
use proptest::prelude::*;

const PD_A: DomainId = DomainId(1);
const PD_B: DomainId = DomainId(2);

fn pool(reg: &mut Registry, domain: DomainId, access: Access, single_use: bool) -> Handle {
    let h = reg
        .register(RegionSpec {
            domain,
            access,
            element_size: 256,
            element_count: 4,
            single_use,
        })
        .unwrap();
    for e in 0..4 {
        reg.grant(h, e).unwrap();
    }
    h
}

fn base(h: Handle) -> u64 {
    Registry::base_address(h)
}

#[test]
fn good_write_places_bytes_in_the_element() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let p = reg.begin_write(PD_A, h.to_u64(), base(h) + 512, 3).unwrap();
    assert_eq!(p.element, 2);
    reg.placement_mut(&p).copy_from_slice(&[7, 8, 9]);
    assert_eq!(reg.in_flight(h).unwrap(), 1);
    reg.finish_write(&p);
    assert_eq!(reg.in_flight(h).unwrap(), 0);
    assert_eq!(reg.element(h, 2, 3).unwrap(), &[7, 8, 9]);
    assert_eq!(reg.element(h, 1, 3).unwrap(), &[0, 0, 0]);
}

#[test]
fn out_of_bounds_is_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let e = reg
        .begin_write(PD_A, h.to_u64(), base(h) + 1024, 1)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::OutOfBounds { .. }), "{e}");
    let e = reg
        .begin_write(PD_A, h.to_u64(), base(h) - 1, 1)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::OutOfBounds { .. }), "{e}");
    let e = reg
        .begin_write(PD_A, h.to_u64(), base(h) + 768, 257)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::OutOfBounds { .. }), "{e}");
    assert_eq!(reg.stats().protection_errors, 3);
}

#[test]
fn offset_plus_length_overflow_is_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let e = reg
        .begin_write(PD_A, h.to_u64(), u64::MAX - 2, 16)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::Overflow { .. }), "{e}");
}

#[test]
fn write_across_elements_is_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let e = reg
        .begin_write(PD_A, h.to_u64(), base(h) + 10, 10)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::NotOneElement { .. }), "{e}");
    let e = reg.begin_write(PD_A, h.to_u64(), base(h), 300).unwrap_err();
    assert!(matches!(e, ProtectionError::NotOneElement { .. }), "{e}");
}

#[test]
fn stale_generation_and_flushed_pool_are_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    reg.quiesce(h).unwrap();
    reg.revoke_all(h).unwrap();
    reg.deregister(h).unwrap();
    // Flushed pool: the old handle now names a freed slot with a bumped generation.
    let e = reg.begin_write(PD_A, h.to_u64(), base(h), 1).unwrap_err();
    assert!(
        matches!(e, ProtectionError::StaleGeneration { current: 1, .. }),
        "{e}"
    );
    // The slot is reused: the old handle is still stale against the new region.
    let h2 = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    assert_eq!(h2.index(), h.index());
    assert_ne!(h2.generation(), h.generation());
    let e = reg.begin_write(PD_A, h.to_u64(), base(h), 1).unwrap_err();
    assert!(matches!(e, ProtectionError::StaleGeneration { .. }), "{e}");
    assert!(reg.begin_write(PD_A, h2.to_u64(), base(h2), 1).is_ok());
}

#[test]
fn foreign_domain_is_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let e = reg.begin_write(PD_B, h.to_u64(), base(h), 1).unwrap_err();
    assert_eq!(
        e,
        ProtectionError::ForeignDomain {
            handle: h,
            owner: PD_A,
            writer: PD_B
        }
    );
    // The refused write did not consume the owner's credit.
    assert!(reg.is_granted(h, 0));
}

/// Issue 30: a domain is the session's whole 64-bit id: sessions 2^32 apart (a rogue that
/// churns sessions gets there) are different domains, never each other's.
#[test]
fn domains_2_pow_32_apart_are_different_domains() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let later = DomainId(PD_A.0 + (1 << 32));
    assert!(matches!(
        reg.begin_write(later, h.to_u64(), base(h), 1),
        Err(ProtectionError::ForeignDomain { .. })
    ));
}

#[test]
fn missing_rights_are_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::LOCAL, false);
    let e = reg.begin_write(PD_A, h.to_u64(), base(h), 1).unwrap_err();
    assert_eq!(e, ProtectionError::NoAccess(h));
}

#[test]
fn reused_single_use_handle_is_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, true);
    let p = reg.begin_write(PD_A, h.to_u64(), base(h), 8).unwrap();
    reg.finish_write(&p);
    let e = reg
        .begin_write(PD_A, h.to_u64(), base(h) + 256, 8)
        .unwrap_err();
    assert_eq!(e, ProtectionError::SingleUseReused(h));
}

#[test]
fn write_beyond_credits_is_rejected() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let p = reg.begin_write(PD_A, h.to_u64(), base(h), 8).unwrap();
    reg.finish_write(&p);
    // Same element again without a new grant.
    let e = reg.begin_write(PD_A, h.to_u64(), base(h), 8).unwrap_err();
    assert_eq!(
        e,
        ProtectionError::NotGranted {
            handle: h,
            element: 0
        }
    );
    reg.grant(h, 0).unwrap();
    assert!(reg.begin_write(PD_A, h.to_u64(), base(h), 8).is_ok());
}

#[test]
fn unknown_handle_is_rejected() {
    let mut reg = Registry::new(1 << 20);
    let e = reg
        .begin_write(PD_A, Handle::new(99, 0).to_u64(), 0, 1)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::UnknownHandle(_)));
}

#[test]
fn quiesce_refuses_grants_and_deregister_waits_for_in_flight() {
    let mut reg = Registry::new(1 << 20);
    let h = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let p = reg.begin_write(PD_A, h.to_u64(), base(h), 8).unwrap();
    reg.quiesce(h).unwrap();
    assert_eq!(reg.grant(h, 0), Err(RegistryError::Quiescing(h)));
    // A write granted before the quiesce still lands.
    let p2 = reg.begin_write(PD_A, h.to_u64(), base(h) + 256, 8).unwrap();
    reg.revoke_all(h).unwrap();
    let e = reg
        .begin_write(PD_A, h.to_u64(), base(h) + 512, 8)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::NotGranted { .. }));
    assert_eq!(
        reg.deregister(h),
        Err(RegistryError::Busy {
            handle: h,
            in_flight: 2
        })
    );
    reg.finish_write(&p);
    reg.abort_write(&p2);
    reg.deregister(h).unwrap();
    assert_eq!(reg.stats().regions, 0);
    assert_eq!(reg.stats().bytes, 0);
}

#[test]
fn memory_limit_is_enforced() {
    let mut reg = Registry::new(1000);
    let spec = RegionSpec {
        domain: PD_A,
        access: Access::REMOTE_WRITE,
        element_size: 256,
        element_count: 4,
        single_use: false,
    };
    assert!(matches!(
        reg.register(spec),
        Err(RegistryError::OutOfMemory { .. })
    ));
    let zero = RegionSpec {
        element_count: 0,
        ..spec
    };
    assert!(matches!(
        reg.register(zero),
        Err(RegistryError::BadGeometry { .. })
    ));
}

#[test]
fn regions_of_lists_only_the_domain() {
    let mut reg = Registry::new(1 << 20);
    let a = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let _b = pool(&mut reg, PD_B, Access::REMOTE_WRITE, false);
    assert_eq!(reg.regions_of(PD_A), vec![a]);
}

proptest! {
    /// Arbitrary write attempts never panic, and a write that passes is inside one granted
    /// element of a region owned by the writer.
    #[test]
    fn arbitrary_writes_are_checked(
        ops in proptest::collection::vec((0u32..3, any::<u64>(), 0u64..5000, any::<u32>(), any::<bool>()), 1..64)
    ) {
        let mut reg = Registry::new(1 << 20);
        let a = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
        let b = pool(&mut reg, PD_B, Access::REMOTE_WRITE, false);
        for (dom, raw_handle, off, len, use_real) in ops {
            let writer = DomainId(u64::from(dom));
            let (handle, addr) = if use_real {
                (a.to_u64(), base(a).wrapping_add(off))
            } else {
                (raw_handle, off)
            };
            let granted_before = reg.is_granted(a, (off / 256) as u32);
            if let Ok(p) = reg.begin_write(writer, handle, addr, len % 600) {
                prop_assert_eq!(writer, PD_A);
                prop_assert_eq!(p.handle, a);
                prop_assert!(granted_before);
                prop_assert!(p.len <= 256);
                prop_assert_eq!(reg.placement_mut(&p).len(), p.len as usize);
                reg.finish_write(&p);
            }
        }
        // B's region was never touched by any writer.
        for e in 0..4 {
            prop_assert!(reg.is_granted(b, e));
        }
    }
}

#[test]
fn a_domain_with_an_arena_lays_its_regions_out_there_until_it_is_full() {
    use crate::memory::HeapShared;
    let mut reg = Registry::new(1 << 30);
    let spec = |count| RegionSpec {
        domain: PD_A,
        access: Access::REMOTE_WRITE,
        element_size: 1000,
        element_count: count,
        single_use: false,
    };
    let private = reg.register(spec(1)).unwrap();
    assert!(
        matches!(
            reg.attach_arena(PD_A, std::sync::Arc::new(HeapShared::new(8192))),
            Err(RegistryError::DomainInUse(PD_A))
        ),
        "not once the domain has regions"
    );
    reg.deregister(private).unwrap();
    reg.attach_arena(PD_A, std::sync::Arc::new(HeapShared::new(8192)))
        .unwrap();
    // 4000 bytes take 4032 (64-byte aligned): two fit, a third does not.
    let a = reg.register(spec(4)).unwrap();
    let b = reg.register(spec(4)).unwrap();
    assert!(reg.is_shared(a) && reg.is_shared(b));
    assert_eq!(reg.address(b).unwrap() % (1 << 40), 4032);
    let e = reg.register(spec(4)).unwrap_err();
    assert!(
        matches!(
            e,
            RegistryError::OutOfMemory {
                requested: 4000,
                used: 8064,
                limit: 8192
            }
        ),
        "{e}"
    );
    // Another domain's regions stay private.
    let other = pool(&mut reg, PD_B, Access::REMOTE_WRITE, false);
    assert!(!reg.is_shared(other));
    // Freed space is reused, at the same offset and under a new handle.
    reg.deregister(a).unwrap();
    let c = reg.register(spec(4)).unwrap();
    assert_ne!(c, a);
    assert_eq!(reg.address(c).unwrap() % (1 << 40), 0);
    // Once the peer is gone, new regions are private again.
    reg.detach_arena(PD_A);
    let d = reg.register(spec(1)).unwrap();
    assert!(!reg.is_shared(d));
}

/// Immediate data of pool `pool_ref`, element `element`, `len` bytes.
fn idata(pool_ref: u8, element: u8, len: u16) -> u32 {
    crate::wire::Idata {
        pool_ref,
        element,
        length: len,
    }
    .to_u32()
}

#[test]
fn a_write_named_by_its_immediate_data_is_checked_like_any_write() {
    let mut reg = Registry::new(1 << 20);
    let a = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let b = pool(&mut reg, PD_B, Access::REMOTE_WRITE, false);
    reg.name_pool(a, 0).unwrap();
    reg.name_pool(b, 0).unwrap();
    // Domain A's pool 0 is `a`, whatever B calls its own pool 0.
    let p = reg.begin_write_idata(PD_A, idata(0, 3, 100), 100).unwrap();
    assert_eq!((p.handle, p.element, p.len), (a, 3, 100));
    reg.finish_write(&p);
    // Once per grant, as through a handle.
    let e = reg
        .begin_write_idata(PD_A, idata(0, 3, 100), 100)
        .unwrap_err();
    assert!(
        matches!(e, ProtectionError::NotGranted { element: 3, .. }),
        "{e}"
    );
    // A reference never advertised, a length other than the one placed, an element past
    // the pool, more than an element: refused, and counted.
    let e = reg
        .begin_write_idata(PD_A, idata(1, 0, 10), 10)
        .unwrap_err();
    assert_eq!(e, ProtectionError::UnknownPoolRef(1));
    let e = reg
        .begin_write_idata(PD_A, idata(0, 1, 10), 11)
        .unwrap_err();
    assert!(
        matches!(e, ProtectionError::IdataLength { len: 11, .. }),
        "{e}"
    );
    let e = reg
        .begin_write_idata(PD_A, idata(0, 4, 10), 10)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::OutOfBounds { .. }), "{e}");
    let e = reg
        .begin_write_idata(PD_A, idata(0, 1, 257), 257)
        .unwrap_err();
    assert!(matches!(e, ProtectionError::NotOneElement { .. }), "{e}");
    assert_eq!(reg.stats().protection_errors, 5);
    // A deregistered pool's reference names nothing any more.
    reg.deregister(b).unwrap();
    let e = reg.begin_write_idata(PD_B, idata(0, 0, 1), 1).unwrap_err();
    assert_eq!(e, ProtectionError::UnknownPoolRef(0));
}

#[test]
fn a_pool_reference_past_255_is_not_named() {
    let mut reg = Registry::new(1 << 20);
    let a = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    reg.name_pool(a, 256).unwrap();
    let e = reg.begin_write_idata(PD_A, idata(0, 0, 1), 1).unwrap_err();
    assert_eq!(e, ProtectionError::UnknownPoolRef(0));
}

proptest! {
    /// Whatever immediate data and length a peer's adapter reports, the check either refuses
    /// it or names a granted element of the writer's own pool, with the length placed.
    #[test]
    fn any_immediate_data_is_refused_or_names_a_granted_element(imm: u32, len in 0u32..70_000) {
        let mut reg = Registry::new(1 << 20);
        let a = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
        let b = pool(&mut reg, PD_B, Access::REMOTE_WRITE, false);
        reg.name_pool(a, 0).unwrap();
        reg.name_pool(b, 1).unwrap();
        if let Ok(p) = reg.begin_write_idata(PD_A, imm, len) {
            prop_assert_eq!(p.handle, a);
            prop_assert_eq!(p.len, len);
            prop_assert_eq!(p.element, (imm >> 16) & 0xff);
            prop_assert!(!reg.is_granted(a, p.element));
        }
    }
}

#[test]
fn the_layout_count_moves_with_every_region_and_arena_regions_are_listed() {
    let mut reg = Registry::new(1 << 20);
    let arena: SharedRegion = std::sync::Arc::new(HeapShared::new(64 << 10));
    reg.attach_arena(PD_A, arena).unwrap();
    let before = reg.layout();
    let watch = reg.layout_watch();
    let a = pool(&mut reg, PD_A, Access::REMOTE_WRITE, false);
    let b = pool(&mut reg, PD_B, Access::REMOTE_WRITE, false);
    assert_eq!(reg.layout(), before + 2);
    // Domain A's pool lies in its arena; B's is in private memory and is not listed.
    let listed = reg.arena_regions(PD_A);
    assert_eq!(listed.len(), 1);
    let (h, off, len) = listed[0];
    assert_eq!((h, len), (a, 1024));
    assert_eq!(Registry::base_address(a) + off, reg.address(a).unwrap());
    assert!(reg.arena_regions(PD_B).is_empty());
    reg.deregister(a).unwrap();
    reg.deregister(b).unwrap();
    assert_eq!(reg.layout(), before + 4);
    assert_eq!(watch.get(), before + 4, "the watch follows the registry");
    assert!(reg.arena_regions(PD_A).is_empty());
}

/// Grants and revocations are logged for a domain that asked, in order, for that domain
/// only, each bumping the layout count; taking them empties the log.
#[test]
fn grants_are_logged_only_for_domains_that_ask() {
    let mut reg = Registry::new(1 << 20);
    let (d1, d2) = (DomainId(1), DomainId(2));
    let before = pool(&mut reg, d1, Access::REMOTE_WRITE, false);
    reg.log_grants(d1);
    reg.log_grants(d1);
    let layout = reg.layout();
    let h1 = pool(&mut reg, d1, Access::REMOTE_WRITE, false);
    // Registered (1) and its four elements granted (4).
    assert_eq!(reg.layout(), layout + 5);
    let h2 = pool(&mut reg, d2, Access::REMOTE_WRITE, false);
    let mut out = Vec::new();
    reg.take_grants(d1, &mut out);
    assert_eq!(
        out,
        (0..4)
            .map(|e| GrantEvent::Granted(h1, e))
            .collect::<Vec<_>>()
    );
    let layout = reg.layout();
    reg.grant(h2, 0).unwrap();
    assert_eq!(reg.layout(), layout, "an unlogged domain's grant");
    reg.grant(h1, 3).unwrap();
    reg.grant(before, 1).unwrap();
    reg.revoke_all(h1).unwrap();
    assert_eq!(reg.layout(), layout + 3);
    assert!(reg.grant(h1, 99).is_err());
    out.clear();
    reg.take_grants(d2, &mut out);
    assert!(out.is_empty());
    reg.take_grants(d1, &mut out);
    assert_eq!(
        out,
        [
            GrantEvent::Granted(h1, 3),
            GrantEvent::Granted(before, 1),
            GrantEvent::Revoked(h1)
        ]
    );
    out.clear();
    reg.take_grants(d1, &mut out);
    assert!(out.is_empty());
    assert_eq!(reg.geometry(h1), Some((256, 4)));
    reg.deregister(h1).unwrap();
    assert_eq!(reg.geometry(h1), None);
    // A domain whose peer is gone logs nothing more and keeps nothing logged.
    reg.grant(before, 2).unwrap();
    reg.detach_arena(d1);
    reg.grant(before, 3).unwrap();
    reg.take_grants(d1, &mut out);
    assert!(out.is_empty());
}
