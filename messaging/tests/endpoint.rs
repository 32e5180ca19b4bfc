//! State-machine tests of the push-push endpoint, grouped by what they exercise, driven by
//! the in-process two-peer harness.

use splitnet_messaging::adapter::{Channel, Op, Payload};
use splitnet_messaging::endpoint::{
    LinkError, LinkEvent, PoolGetOutcome, PoolSpec, ProtocolError, KEPT_BYTES,
};
use splitnet_messaging::memory::{Handle, Registry};
use splitnet_messaging::testing::{config, Outcome, Pair, Side};
use splitnet_messaging::wire::{Idata, Message, PoolRun};

fn pair() -> Pair {
    let mut p = Pair::new(config(64), config(64), 1 << 20);
    p.drive().unwrap();
    p
}

/// The same peers over shared-memory rings.
fn pair_shm() -> Pair<splitnet_messaging::testing::ShmPipe> {
    let mut p = Pair::shm(config(64), config(64));
    p.drive().unwrap();
    p
}

/// The same peers over shared-memory rings, each placing its writes in the other's pools.
fn pair_shm_pools() -> Pair<splitnet_messaging::testing::ShmPipe> {
    let mut p = Pair::shm_pools(config(64), config(64));
    p.drive().unwrap();
    p
}

/// A test run three times, over the in-process byte pipe (the TCP framing), over
/// shared-memory rings, and over rings with the pools in shared memory: `$name::pipe`,
/// `$name::shm` and `$name::shm_pools`.
macro_rules! over_both {
    ($name:ident, |$p:ident| $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            #[allow(unused_mut)]
            fn pipe() {
                let mut $p = super::pair();
                $body
            }

            #[test]
            #[allow(unused_mut)]
            fn shm() {
                let mut $p = super::pair_shm();
                $body
            }

            #[test]
            #[allow(unused_mut)]
            fn shm_pools() {
                let mut $p = super::pair_shm_pools();
                $body
            }
        }
    };
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

mod credits {
    use super::*;

    over_both!(pools_are_advertised_at_start, |p| {
        let ini = p.a.link.session().initiator();
        assert_eq!(ini.credits(), 16 + 8);
        assert_eq!(p.b.link.session().target().credits_outstanding(), 24);
        let usage: Vec<_> = p.b.link.session().target().pool_usage().collect();
        assert_eq!(usage.len(), 2);
        assert!(usage
            .iter()
            .all(|u| u.state == "active" && u.busy == 0 && u.free == 0));
        assert_eq!(
            usage.iter().map(|u| u.granted).sum::<u32>(),
            24,
            "{usage:?}"
        );
        let held: Vec<u32> = ini.pool_credits().map(|(_, c)| c).collect();
        assert_eq!(held.iter().sum::<u32>(), 24);
    });

    over_both!(usage_follows_elements_from_granted_to_busy_to_free, |p| {
        for i in 0..3 {
            assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma);
        }
        let ini = p.a.link.session().initiator();
        assert_eq!(ini.pool_credits().map(|(_, c)| c).sum::<u32>(), 21);
        p.settle().unwrap();
        // Delivered, released and returned: every element granted.
        let t = p.b.link.session().target();
        assert_eq!(t.pool_usage().map(|u| u.granted).sum::<u32>(), 24);
        assert_eq!(t.pool_usage().map(|u| u.busy + u.free).sum::<u32>(), 0);
        // A flush marks the pools quiescing until the peer replies.
        let Pair { b, .. } = &mut p;
        b.link.session_mut().start_flush(&mut b.reg);
        let states: Vec<_> = b
            .link
            .session()
            .target()
            .pool_usage()
            .map(|u| u.state)
            .collect();
        assert_eq!(states, ["quiescing", "quiescing"]);
    });

    over_both!(bytes_in_flight_follow_credits, |p| {
        p.send(Side::A, &frame(60, 1));
        p.send(Side::A, &frame(1500, 2));
        p.send(Side::A, &frame(9000, 3));
        let ini = p.a.link.session().initiator();
        assert_eq!(ini.inflight_bytes(), 10_500, "inline frames take no credit");
        p.settle().unwrap();
        let ini = p.a.link.session_mut().initiator_mut();
        assert_eq!(ini.inflight_bytes(), 0);
        assert_eq!(ini.take_completed(), 10_500);
        assert_eq!(ini.take_completed(), 0);
    });

    /// Each pool as the sender sees it and the receiver holds it: (element count, credits
    /// the sender holds, elements freed and not yet returned, elements busy).
    pub(super) fn pools<C: Channel>(p: &Pair<C>) -> Vec<(u32, u32, u32, u32)> {
        let usage: Vec<_> = p.b.link.session().target().pool_usage().collect();
        p.a.link
            .session()
            .initiator()
            .pool_credits()
            .map(|(e, credits)| {
                let u = usage.iter().find(|u| u.pool_ref == e.pool_ref).unwrap();
                (e.element_count, credits, u.free, u.busy)
            })
            .collect()
    }

    over_both!(a_sparse_flow_returns_credits_per_batch_not_per_frame, |p| {
        // One frame per wake-up (the daemons' idle point after each): the 16-element pool
        // never runs low, so credits go back in batches of `credit_batch` (4), not one
        // update per frame, which would wake the sender for each.
        let before = p.b.link.session().target().credit_updates();
        for i in 0..40 {
            assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma);
            p.drive().unwrap();
            for (count, credits, free, busy) in pools(&p) {
                assert!(credits * 2 > count, "{credits} of {count}");
                assert_eq!((credits + free, busy), (count, 0));
            }
        }
        assert_eq!(p.b.received.len(), 40);
        assert_eq!(p.b.link.session().target().credit_updates() - before, 10);
        assert_eq!(p.a.link.stats().tx_backpressure, 0);
        assert_eq!(p.b.link.stats().tx_credit_updates - before, 10);
    });

    #[test]
    fn freed_credits_go_back_at_the_idle_point_once_the_sender_runs_low_on_credits_or_bytes() {
        // A batch as large as the pools: only the idle rules return credits.
        let mut b = config(64);
        b.target.credit_batch = 16;
        let mut p = Pair::new(config(64), b, 1 << 20);
        p.drive().unwrap();
        let pool = |p: &Pair, n| pools(p).into_iter().find(|&(c, ..)| c == n).unwrap();
        let send = |p: &mut Pair, n: u8, len: usize| {
            for i in 0..n {
                assert_eq!(p.send(Side::A, &frame(len, i)), Outcome::Rdma);
            }
            p.drive().unwrap();
        };
        // Nine of the 16 small elements used: the sender holds 7, under half: all back.
        send(&mut p, 9, 1000);
        assert_eq!(pool(&p, 16), (16, 16, 0, 0));
        // Seven used: it still holds 9, and 7,000 bytes are in flight: they wait for more.
        send(&mut p, 7, 1000);
        assert_eq!(pool(&p, 16), (16, 9, 7, 0));
        assert_eq!(p.a.link.session().initiator().inflight_bytes(), 7000);
        // Two more: it holds 7 again, and all nine freed go back.
        send(&mut p, 2, 1000);
        assert_eq!(pool(&p, 16), (16, 16, 0, 0));
        // One large frame: the pool is far from low, but 40,000 bytes of a sender's byte
        // limit wait on it: back at once.
        send(&mut p, 1, 40_000);
        assert_eq!(pool(&p, 8), (8, 8, 0, 0));
        assert_eq!(p.a.link.session().initiator().inflight_bytes(), 0);
        assert_eq!(p.b.received.len(), 19);
        assert_eq!(p.a.link.stats().tx_backpressure, 0);
    }

    #[test]
    fn a_pool_of_two_elements_is_whole_at_rest() {
        // With 2 elements, holding one is holding half: the freed one goes back, so a sender
        // that keeps a quarter of a pool back (the IOC's own queue) still finds one to take.
        let mut b = config(64);
        b.advertise = vec![PoolSpec {
            element_size: 2048,
            element_count: 2,
        }];
        let mut p = Pair::new(config(64), b, 1 << 20);
        p.drive().unwrap();
        for i in 0..3 {
            assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma);
            p.drive().unwrap();
            assert_eq!(pools(&p), [(2, 2, 0, 0)]);
        }
    }

    over_both!(small_frames_go_inline_and_large_by_rdma, |p| {
        assert_eq!(p.send(Side::A, &frame(60, 1)), Outcome::Inline);
        assert_eq!(p.send(Side::A, &frame(1500, 2)), Outcome::Rdma);
        assert_eq!(p.send(Side::A, &frame(9000, 3)), Outcome::Rdma);
        p.drive().unwrap();
        assert_eq!(
            p.b.received,
            vec![frame(60, 1), frame(1500, 2), frame(9000, 3)]
        );
    });

    over_both!(
        exhaustion_backpressures_and_updates_restore_every_credit,
        |p| {
            for i in 0..16 {
                assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma);
            }
            // Small pool exhausted, but a 1000-byte frame still fits the large pool.
            for i in 0..8 {
                assert_eq!(p.send(Side::A, &frame(1000, 100 + i)), Outcome::Rdma);
            }
            assert_eq!(p.send(Side::A, &frame(1000, 200)), Outcome::Backpressure);
            assert_eq!(p.a.link.session().initiator().credits(), 0);
            p.drive().unwrap();
            assert_eq!(p.b.received.len(), 24);
            // Every credit came back (batched updates plus the idle flush), plus the pool the
            // starved initiator asked for with BufferRecvPoolGet.
            assert_eq!(p.a.link.session().initiator().credits(), 24 + 16);
            assert_eq!(p.a.link.session().initiator().in_use(), 0);
            assert!(p.a.events.contains(&LinkEvent::Credits));
            assert_eq!(p.send(Side::A, &frame(1000, 201)), Outcome::Rdma);
        }
    );

    over_both!(starvation_asks_for_a_pool_once, |p| {
        for i in 0..24 {
            p.send(Side::A, &frame(1000, i));
        }
        assert_eq!(p.send(Side::A, &frame(1000, 99)), Outcome::Backpressure);
        assert_eq!(p.send(Side::A, &frame(1000, 98)), Outcome::Backpressure);
        p.drive().unwrap();
        let grants: Vec<_> =
            p.b.events
                .iter()
                .filter(|e| matches!(e, LinkEvent::PoolGet(_)))
                .collect();
        assert_eq!(grants.len(), 1, "one PoolGet per starvation episode");
        assert!(matches!(
            grants[0],
            LinkEvent::PoolGet(PoolGetOutcome::Granted(2))
        ));
        assert_eq!(p.a.link.session().initiator().credits(), 24 + 16);
    });

    over_both!(pool_get_beyond_bounds_is_declined, |p| {
        let mut out = splitnet_messaging::endpoint::Outbox::new();
        let b = &mut p.b;
        let target = &mut b.link.session_mut();
        // 8 MiB limit; 2 pools (~557 KiB) granted already.
        let get = splitnet_messaging::wire::PoolGet {
            element_size: 1 << 20,
            element_count: 16,
        };
        let _ = (target, &mut out);
        let msg = Message::BufferRecvPoolGet(get);
        let mut bytes = Vec::new();
        msg.emit(1, &mut bytes);
        let r = b
            .link
            .session_mut()
            .on_message(
                &mut b.reg,
                splitnet_messaging::endpoint::Lane::Control,
                &bytes,
            )
            .unwrap();
        assert_eq!(
            r,
            splitnet_messaging::endpoint::Incoming::PoolGet(PoolGetOutcome::Declined(
                "granted memory limit reached"
            ))
        );
        let get = splitnet_messaging::wire::PoolGet {
            element_size: 2 << 20,
            element_count: 1,
        };
        let mut bytes = Vec::new();
        Message::BufferRecvPoolGet(get).emit(2, &mut bytes);
        let r = b
            .link
            .session_mut()
            .on_message(
                &mut b.reg,
                splitnet_messaging::endpoint::Lane::Control,
                &bytes,
            )
            .unwrap();
        assert!(matches!(
            r,
            splitnet_messaging::endpoint::Incoming::PoolGet(PoolGetOutcome::Declined(_))
        ));
        assert_eq!(b.link.session().target().live_pools(), 2);
    });

    /// Asks `b` for a pool of `element_size` x `element_count`.
    fn pool_get<C: Channel>(
        b: &mut splitnet_messaging::testing::Peer<C>,
        element_size: u32,
        element_count: u32,
    ) -> PoolGetOutcome {
        let mut bytes = Vec::new();
        Message::BufferRecvPoolGet(splitnet_messaging::wire::PoolGet {
            element_size,
            element_count,
        })
        .emit(3, &mut bytes);
        match b
            .link
            .session_mut()
            .on_message(
                &mut b.reg,
                splitnet_messaging::endpoint::Lane::Control,
                &bytes,
            )
            .unwrap()
        {
            splitnet_messaging::endpoint::Incoming::PoolGet(o) => o,
            other => panic!("{other:?}"),
        }
    }

    over_both!(pool_get_geometry_is_bounded_with_its_bookkeeping, |p| {
        let b = &mut p.b;
        // Element size 1: the bookkeeping would outweigh the memory many times over.
        assert_eq!(
            pool_get(b, 1, 4096),
            PoolGetOutcome::Declined("element size below the minimum")
        );
        assert_eq!(
            pool_get(b, 256, 65_536),
            PoolGetOutcome::Declined("element count above the limit")
        );
        // 8 MiB budget, about 0.6 MiB granted: 7 pools of 1 MiB of elements fit, the
        // bookkeeping of the 7th (64 KiB per pool of 4096) does not.
        let mut granted = 0;
        while let PoolGetOutcome::Granted(_) = pool_get(b, 256, 4096) {
            granted += 1;
        }
        assert!(granted > 0 && granted < 8, "{granted}");
        let t = b.link.session().target();
        let meta = t.live_pools() as u64 * 4096 * splitnet_messaging::endpoint::ELEMENT_OVERHEAD;
        assert!(t.granted_bytes() + meta <= 8 << 20);
    });
}

mod retired {
    use super::*;

    over_both!(
        flush_requests_for_pools_never_held_are_not_remembered,
        |p| {
            let mut out = splitnet_messaging::endpoint::Outbox::new();
            let a = &mut p.a;
            let before = a.link.session().initiator().retired();
            let mut bytes = Vec::new();
            for r in 0..1000u32 {
                bytes.clear();
                Message::BufferPoolFlushRequest(vec![1000 + r, 2000 + r])
                    .emit(u64::from(r), &mut bytes);
                a.link
                    .session_mut()
                    .on_message(
                        &mut a.reg,
                        splitnet_messaging::endpoint::Lane::Control,
                        &bytes,
                    )
                    .unwrap();
            }
            let _ = &mut out;
            assert_eq!(a.link.session().initiator().retired(), before);
            // Pools it held are remembered, at most max_pools of them.
            let refs: Vec<u32> = a
                .link
                .session()
                .initiator()
                .pools()
                .map(|e| e.pool_ref)
                .collect();
            assert!(!refs.is_empty());
            bytes.clear();
            Message::BufferPoolFlushRequest(refs.clone()).emit(5000, &mut bytes);
            a.link
                .session_mut()
                .on_message(
                    &mut a.reg,
                    splitnet_messaging::endpoint::Lane::Control,
                    &bytes,
                )
                .unwrap();
            assert_eq!(a.link.session().initiator().retired(), before + refs.len());
            assert!(a.link.session().initiator().retired() <= 16);
        }
    );
}

mod indication {
    use super::*;

    over_both!(frames_over_64k_use_buffer_rdma_indicate, |p| {
        let big = frame(65_560, 7);
        assert!(Idata::new(1, 0, big.len() as u32).is_none());
        assert_eq!(p.send(Side::A, &big), Outcome::Rdma);
        assert_eq!(p.send(Side::A, &frame(65_535, 8)), Outcome::Rdma);
        p.drive().unwrap();
        assert_eq!(p.b.received, vec![big, frame(65_535, 8)]);
    });

    over_both!(
        frames_larger_than_every_pool_and_senddata_are_refused,
        |p| {
            assert_eq!(
                p.send(
                    Side::A,
                    &frame(splitnet_messaging::wire::MAX_SEND_DATA + 1, 1)
                ),
                Outcome::TooLarge
            );
            assert_eq!(p.a.link.stats().tx_too_large, 1);
        }
    );

    over_both!(lying_idata_is_a_protocol_error, |p| {
        let entry = *p.a.link.session().initiator().pools().next().unwrap();
        // A correct write into element 15 claiming element 3 in its immediate data.
        let addr = entry.address + 15 * u64::from(entry.element_size);
        let imm = Idata::new(entry.pool_ref, 3, 100).unwrap().to_u32();
        raw_data(&mut p).post(
            Op::WriteImm {
                handle: entry.handle,
                addr,
                imm,
            },
            &[],
            Payload::Bytes(vec![0; 100]),
        );
        let err = p.drive().unwrap_err();
        assert_eq!(err.0, Side::B);
        assert!(matches!(
            err.1,
            LinkError::Protocol(ProtocolError::IdataMismatch { element: 15, .. })
        ));
    });

    over_both!(indication_without_write_is_a_protocol_error, |p| {
        let mut msg = Vec::new();
        Message::BufferRdmaIndicate(splitnet_messaging::wire::Indicate {
            pool_ref: 0,
            element: 0,
            length: 10,
        })
        .emit(0, &mut msg);
        raw_data(&mut p).post(Op::Send, &[], Payload::Bytes(msg));
        let err = p.drive().unwrap_err();
        assert!(matches!(
            err.1,
            LinkError::Protocol(ProtocolError::NoSuchWrite { .. })
        ));
    });
}

/// The data channel of peer A, for injecting raw operations.
fn raw_data<C: Channel>(p: &mut Pair<C>) -> &mut C {
    p.a.link.data_channel_mut()
}

mod rogue {
    use super::*;

    over_both!(credit_returned_twice_is_a_violation, |p| {
        let mut msg = Vec::new();
        Message::BufferRecvPoolUpdate(vec![PoolRun {
            pool_ref: 0,
            first: 0,
            count: 1,
        }])
        .emit(9, &mut msg);
        // B returns a credit A never used.
        p.b.link
            .data_channel_mut()
            .post(Op::Send, &[], Payload::Bytes(msg));
        let err = p.drive().unwrap_err();
        assert_eq!(err.0, Side::A);
        assert!(matches!(
            err.1,
            LinkError::Protocol(ProtocolError::CreditViolation {
                pool_ref: 0,
                element: 0
            })
        ));
    });

    over_both!(write_beyond_credits_is_a_protection_error, |p| {
        let entry = *p.a.link.session().initiator().pools().next().unwrap();
        for _ in 0..2 {
            raw_data(&mut p).post(
                Op::Write {
                    handle: entry.handle,
                    addr: entry.address,
                },
                &[],
                Payload::Bytes(vec![1; 10]),
            );
        }
        let err = p.drive().unwrap_err();
        assert_eq!(err.0, Side::B);
        assert!(err.1.to_string().contains("not granted"), "{}", err.1);
        assert_eq!(p.b.reg.stats().protection_errors, 1);
    });
}

mod flush {
    use super::*;

    over_both!(graceful_flush_frees_every_pool_on_both_sides, |p| {
        for i in 0..10 {
            p.send(Side::A, &frame(1500, i));
            p.send(Side::B, &frame(1500, i));
        }
        p.a.link.session_mut().start_flush(&mut p.a.reg);
        p.drive().unwrap();
        assert_eq!(p.b.received.len(), 10);
        assert_eq!(p.a.received.len(), 10);
        assert!(p.a.link.session().is_flushed());
        assert_eq!(p.a.reg.stats().regions, 0, "A freed its pools");
        assert_eq!(p.a.reg.stats().bytes, 0);
        // A stopped using B's pools; B freed them on A's request.
        assert_eq!(p.b.reg.stats().regions, 0);
        assert_eq!(p.b.link.session().initiator().credits(), 0);
        assert!(p.a.events.contains(&LinkEvent::Flushed { complete: true }));
    });

    over_both!(
        writes_racing_a_flush_complete_and_late_writes_are_rejected,
        |p| {
            let entry = *p.a.link.session().initiator().pools().next().unwrap();
            // A posts two writes; before they arrive B starts flushing its pools.
            p.send(Side::A, &frame(1000, 1));
            p.send(Side::A, &frame(1000, 2));
            let handle = Handle::from_u64(entry.handle);
            p.b.link.session_mut().start_flush(&mut p.b.reg);
            // While quiescing, no credit is granted again.
            assert!(p.b.reg.grant(handle, 0).is_err());
            assert_eq!(p.a.link.session().initiator().inflight_bytes(), 2000);
            p.a.events.clear();
            p.drive().unwrap();
            // The flush request told A (a sender waiting on its byte limit may go).
            assert!(
                p.a.events.iter().any(|e| matches!(e, LinkEvent::Credits)),
                "{:?}",
                p.a.events
            );
            // The racing writes were delivered, not lost.
            assert_eq!(p.b.received, vec![frame(1000, 1), frame(1000, 2)]);
            // The pools A wrote into are gone: nothing counts as in flight any more.
            assert_eq!(p.a.link.session().initiator().inflight_bytes(), 0);
            // B's pools are gone and the generation moved on.
            assert_eq!(p.b.reg.stats().regions, 0);
            let err =
                p.b.reg
                    .begin_write(
                        splitnet_messaging::memory::DomainId(2),
                        entry.handle,
                        entry.address,
                        1,
                    )
                    .unwrap_err();
            assert!(matches!(
                err,
                splitnet_messaging::memory::ProtectionError::StaleGeneration { .. }
            ));
            // A write through the stale handle from a rogue A is a protection error at B.
            raw_data(&mut p).post(
                Op::Write {
                    handle: entry.handle,
                    addr: entry.address,
                },
                &[],
                Payload::Bytes(vec![0; 8]),
            );
            let err = p.drive().unwrap_err();
            assert_eq!(err.0, Side::B);
            assert!(err.1.to_string().contains("stale"), "{}", err.1);
        }
    );

    over_both!(both_sides_flushing_at_once_completes_cleanly, |p| {
        for i in 0..6 {
            p.send(Side::A, &frame(1500, i));
            p.send(Side::B, &frame(1500, i));
        }
        p.a.link.session_mut().start_flush(&mut p.a.reg);
        p.b.link.session_mut().start_flush(&mut p.b.reg);
        p.drive().unwrap();
        assert_eq!(p.a.received.len(), 6);
        assert_eq!(p.b.received.len(), 6);
        for peer in [&p.a, &p.b] {
            assert!(peer.link.session().is_flushed());
            assert_eq!(peer.reg.stats().regions, 0);
        }
    });

    over_both!(flush_reply_for_unknown_transaction_is_rejected, |p| {
        let mut msg = Vec::new();
        Message::BufferPoolFlushReply.emit(12345, &mut msg);
        raw_data(&mut p).post(Op::Send, &[], Payload::Bytes(msg));
        assert!(p.drive().is_err());
    });

    over_both!(teardown_frees_everything, |p| {
        p.send(Side::A, &frame(3000, 1));
        p.a.link.close(&mut p.a.reg, &mut p.a.cache);
        assert_eq!(p.a.reg.stats().regions, 0);
        let _ = Registry::base_address;
    });
}

mod pools {
    use super::*;

    over_both!(unbounded_advertisement_is_refused, |p| {
        let mut msg = Vec::new();
        Message::BufferRecvPool(vec![splitnet_messaging::wire::PoolEntry {
            pool_ref: 9,
            element_count: u32::MAX,
            element_size: 2048,
            address: 0,
            handle: 0,
            context: 0,
        }])
        .emit(1, &mut msg);
        p.b.link
            .data_channel_mut()
            .post(Op::Send, &[], Payload::Bytes(msg));
        let err = p.drive().unwrap_err();
        assert!(matches!(
            err.1,
            LinkError::Protocol(ProtocolError::PoolLimit { .. })
        ));
        assert_eq!(err.1.row(), Some("E13"));
        assert_eq!(
            err.1.code(),
            Some(splitnet_messaging::wire::ErrorCode::ResourceLimit)
        );
    });

    #[test]
    fn spec_bytes() {
        let s = PoolSpec {
            element_size: 2048,
            element_count: 16,
        };
        assert_eq!(s.bytes(), 32768);
    }
}

/// Every error's code is the code of its row in docs/protocol.md, section 7 (the document
/// is read at test time: the two cannot drift apart).
#[test]
fn error_codes_follow_the_document() {
    use splitnet_messaging::adapter::{ChannelError, OpError, RxError};
    use splitnet_messaging::memory::ProtectionError;
    use splitnet_messaging::wire::{Function, WireError};
    let doc = splitnet_messaging::testing::doc_error_codes(include_str!("../../docs/protocol.md"));
    let code_of = |row: &str| {
        doc.iter()
            .find(|(id, _)| id == row)
            .unwrap_or_else(|| panic!("no row {row} in the document"))
            .1
    };
    let protocol = [
        ProtocolError::Wire(WireError::UnknownFunction(9)),
        ProtocolError::Wire(WireError::UnsupportedVersion(2)),
        ProtocolError::Wire(WireError::Reserved),
        ProtocolError::Unexpected {
            function: Function::Hello,
            why: "",
        },
        ProtocolError::Unexpected {
            function: Function::BufferPoolFlushReply,
            why: "",
        },
        ProtocolError::UnknownPool(1),
        ProtocolError::BadPool {
            pool_ref: 1,
            why: "",
        },
        ProtocolError::PoolLimit {
            pool_ref: 1,
            why: "",
        },
        ProtocolError::IdataMismatch {
            imm: 0,
            pool_ref: 0,
            element: 0,
            len: 1,
        },
        ProtocolError::NoSuchWrite {
            pool_ref: 0,
            element: 0,
            len: 0,
        },
        ProtocolError::CreditViolation {
            pool_ref: 0,
            element: 0,
        },
        ProtocolError::UnknownCreditPool(3),
    ];
    let mut rows: Vec<&str> = Vec::new();
    for e in protocol {
        let le = LinkError::Protocol(e.clone());
        assert_eq!(Some(le.code().unwrap().to_u16()), code_of(e.row()), "{e}");
        rows.push(e.row());
    }
    let channel = [
        RxError::Op(OpError::UnknownOpcode(9)),
        RxError::SendTooLong { len: 1, max: 0 },
        RxError::Protection(ProtectionError::UnknownHandle(Handle::from_u64(7))),
        RxError::WriteNotAllowed,
    ];
    for e in channel {
        let le = LinkError::Channel(ChannelError::Rx(e));
        let row = le.row().unwrap();
        assert_eq!(Some(le.code().unwrap().to_u16()), code_of(row), "{le}");
        rows.push(row);
    }
    assert_eq!(LinkError::Channel(ChannelError::Closed).code(), None);
    // Every row E1..E15 that a session's own checks detect is covered.
    for r in 1..=15 {
        assert!(
            rows.contains(&format!("E{r}").as_str()),
            "row E{r} has no error"
        );
    }
}

mod in_place {
    use super::*;
    use splitnet_messaging::endpoint::InPlace;
    use splitnet_messaging::memory::SharedBytes;

    /// A read that fills the window with `f`.
    fn reads(f: &[u8]) -> impl FnOnce(&SharedBytes<'_>) -> Result<usize, ()> + '_ {
        move |w| {
            w.copy_in(0, f).unwrap();
            Ok(f.len())
        }
    }

    /// No frame takes the express lane.
    fn bulk(_: &SharedBytes<'_>, _: usize) -> bool {
        false
    }

    #[test]
    fn a_frame_read_in_place_for_the_express_lane_goes_on_the_control_channel() {
        let mut p = pair_shm_pools();
        let before = p.a.link.session().initiator().credits();
        let bulk_frame = frame(30_000, 1);
        let ping = frame(98, 2);
        assert_eq!(
            p.a.link.read_in_place(65_600, reads(&bulk_frame), bulk),
            Some(InPlace::Posted(30_000))
        );
        // The express closure sees the frame's bytes and length.
        let got = p.a.link.read_in_place(65_600, reads(&ping), |w, n| {
            let mut head = [0u8; 12];
            w.copy_out(0, &mut head).unwrap();
            n == 98 && head == ping[..12]
        });
        assert_eq!(got, Some(InPlace::Express(98)));
        let st = p.a.link.stats();
        assert_eq!((st.tx_express, st.tx_frames, st.tx_in_place), (1, 2, 1));
        assert_eq!(
            p.a.link.session().initiator().credits(),
            before - 1,
            "the express frame's element went back"
        );
        p.drive().unwrap();
        // Polled control first: the ping arrives ahead of the bulk frame written before it.
        assert_eq!(p.b.received, vec![ping.clone(), bulk_frame.clone()]);
        assert_eq!(p.b.link.stats().rx_express, 1);
    }

    #[test]
    fn frames_read_straight_into_the_peers_elements_arrive_whatever_their_size() {
        let mut p = pair_shm_pools();
        let before = p.a.link.session().initiator().credits();
        // A small frame, a large one, and one too long for idata's 16-bit length (the
        // write then goes with a BufferRDMAIndicate).
        // The small one, few enough bytes for SendData, is copied into one and its element
        // goes back.
        let frames = [frame(60, 1), frame(30_000, 2), frame(65_563, 3)];
        for (i, f) in frames.iter().enumerate() {
            let got = p.a.link.read_in_place(65_600, reads(f), bulk);
            let want = match i {
                0 => InPlace::Inline(60),
                _ => InPlace::Posted(f.len()),
            };
            assert_eq!(got, Some(want));
            assert_eq!(p.a.link.stats().tx_in_place, i as u64);
        }
        assert_eq!(p.a.link.stats().tx_inline, 1);
        let ini = p.a.link.session().initiator();
        assert_eq!(ini.credits(), before - 2);
        assert_eq!(ini.inflight_bytes(), 30_000 + 65_563);
        assert_eq!(p.a.link.stats().tx_frames, 3);
        p.settle().unwrap();
        assert_eq!(p.b.received, frames.to_vec());
        assert_eq!(
            p.a.link.session().initiator().credits(),
            before,
            "credits back"
        );
    }

    #[test]
    fn an_element_nothing_was_posted_into_goes_back() {
        let mut p = pair_shm_pools();
        let before = p.a.link.session().initiator().credits();
        let failed = p.a.link.read_in_place(65_600, |_| Err("would block"), bulk);
        assert_eq!(failed, Some(InPlace::Failed("would block")));
        let empty = p.a.link.read_in_place(65_600, |_| Ok::<_, ()>(0), bulk);
        assert_eq!(empty, Some(InPlace::Empty));
        // The read says the frame was longer than the element: cut short, so dropped.
        let cut =
            p.a.link
                .read_in_place(65_600, |_| Ok::<_, ()>(70_000), bulk);
        assert_eq!(cut, Some(InPlace::Dropped(70_000)));
        assert_eq!(p.a.link.stats().tx_too_large, 1);
        let ini = p.a.link.session().initiator();
        assert_eq!((ini.credits(), ini.inflight_bytes()), (before, 0));
        assert_eq!(p.a.link.stats().tx_frames, 0);
        // No element that large: nothing taken, nothing read.
        let big = p.a.link.read_in_place(
            1 << 20,
            |_| -> Result<usize, ()> { panic!("no element to read into") },
            bulk,
        );
        assert_eq!(big, None);
        p.drive().unwrap();
        assert!(p.b.received.is_empty());
    }

    #[test]
    fn a_quarter_of_the_large_elements_stays_for_frames_read_the_other_way() {
        let mut p = pair_shm_pools();
        // The large pool has 8 elements: 6 may be read into, 2 stay.
        for i in 0..6 {
            let f = frame(300, i);
            assert_eq!(
                p.a.link.read_in_place(65_600, reads(&f), bulk),
                Some(InPlace::Posted(300))
            );
        }
        assert_eq!(
            p.a.link.read_in_place(65_600, reads(&frame(300, 9)), bulk),
            None
        );
        assert_eq!(
            p.send(Side::A, &frame(60_000, 7)),
            Outcome::Rdma,
            "a TSO frame still goes"
        );
        p.drive().unwrap();
        assert_eq!(p.b.received.len(), 7);
        let f = frame(300, 8);
        assert_eq!(
            p.a.link.read_in_place(65_600, reads(&f), bulk),
            Some(InPlace::Posted(300)),
            "once credits came back"
        );
    }

    /// A batched read that fills the windows with `frames` in order, the ones marked `None`
    /// consumed but not to be posted.
    fn reads_batch(
        frames: &[Option<Vec<u8>>],
    ) -> impl FnOnce(&[SharedBytes<'_>], &mut [usize]) -> Result<usize, ()> + '_ {
        move |w, lens| {
            let n = frames.len().min(w.len());
            for i in 0..n {
                lens[i] = match &frames[i] {
                    Some(f) => {
                        w[i].copy_in(0, f).unwrap();
                        f.len()
                    }
                    None => 0,
                };
            }
            Ok(n)
        }
    }

    #[test]
    fn a_batch_read_posts_its_frames_in_order_and_gives_back_what_it_did_not_fill() {
        let mut p = pair_shm_pools();
        let before = p.a.link.session().initiator().credits();
        // The large pool lends 6 of its 8 elements; the read has 3 frames, one of which
        // it consumed but must not post (a header check refused it).
        let frames = [Some(frame(60, 1)), None, Some(frame(40_000, 2))];
        let got =
            p.a.link
                .read_batch_in_place(65_600, 64, reads_batch(&frames));
        let b = got.unwrap().unwrap();
        assert_eq!(
            (b.offered, b.read, b.posted, b.inline, b.bytes, b.dropped),
            (6, 3, 2, 1, 40_060, 0)
        );
        // The small frame went inline, its element back.
        assert_eq!(p.a.link.session().initiator().credits(), before - 1);
        assert_eq!(p.a.link.stats().tx_in_place, 1);
        assert_eq!(p.a.link.stats().tx_inline, 1);
        p.drive().unwrap();
        assert_eq!(p.b.received, vec![frame(60, 1), frame(40_000, 2)]);
        // `max` caps the elements offered; a frame cut short is dropped, its element back.
        let got =
            p.a.link
                .read_batch_in_place(65_600, 2, |_, lens: &mut [usize]| {
                    lens[0] = 70_000;
                    lens[1] = 100;
                    Ok::<_, ()>(2)
                });
        let b = got.unwrap().unwrap();
        assert_eq!((b.offered, b.read, b.posted, b.dropped), (2, 2, 1, 1));
        assert_eq!(p.a.link.stats().tx_too_large, 1);
        // A failed read gives every element back.
        let failed =
            p.a.link
                .read_batch_in_place(65_600, 64, |_, _| Err("would block"));
        assert_eq!(failed, Some(Err("would block")));
        p.settle().unwrap();
        assert_eq!(p.a.link.session().initiator().credits(), before);
        assert_eq!(p.a.link.session().initiator().inflight_bytes(), 0);
        // No element that large: nothing taken, nothing read.
        let big =
            p.a.link
                .read_batch_in_place(1 << 20, 8, |_, _| -> Result<usize, ()> {
                    panic!("no element to read into")
                });
        assert_eq!(big, None);
    }

    #[test]
    fn without_shared_pools_there_is_no_window() {
        let no_read =
            |_: &SharedBytes<'_>| -> Result<usize, ()> { panic!("no window to read into") };
        // Over the TCP framing, and over rings whose peer keeps its pools private.
        let mut p = pair();
        assert!(!p.a.link.places_writes());
        let before = p.a.link.session().initiator().credits();
        assert_eq!(p.a.link.read_in_place(2048, no_read, bulk), None);
        assert_eq!(p.a.link.session().initiator().credits(), before);
        let mut p = pair_shm();
        assert!(!p.a.link.places_writes());
        assert_eq!(p.a.link.read_in_place(2048, no_read, bulk), None);
        assert!(pair_shm_pools().a.link.places_writes());
    }
}

mod credit_returns {
    use super::*;
    use proptest::prelude::*;

    /// What the test does next: a burst of frames of one size from A, then a drive of both
    /// peers to rest or a single step of one of them.
    #[derive(Debug, Clone)]
    struct Burst {
        frames: usize,
        len: usize,
        drive: u8,
    }

    fn burst() -> impl Strategy<Value = Burst> {
        (
            1..24usize,
            prop::sample::select(vec![100usize, 1000, 2000, 9000, 40_000, 65_000]),
            0..4u8,
        )
            .prop_map(|(frames, len, drive)| Burst { frames, len, drive })
    }

    /// Both peers at rest: every credit is with the sender or freed at the receiver, the
    /// sender holds more than half of every pool, and what the receiver keeps back holds
    /// less than [`KEPT_BYTES`] of the sender's frames (its bytes still in flight: a byte
    /// limit above that never waits for them).
    fn at_rest(p: &Pair) -> Result<(), TestCaseError> {
        for (count, credits, free, busy) in credits::pools(p) {
            prop_assert_eq!((credits + free, busy), (count, 0));
            prop_assert!(credits * 2 > count, "{} of {}", credits, count);
        }
        let inflight = p.a.link.session().initiator().inflight_bytes();
        prop_assert!(
            inflight < KEPT_BYTES,
            "{} bytes in flight at rest",
            inflight
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whatever the traffic, once both peers rest no credit the receiver keeps back can
        /// stall the sender, by credits or by bytes in flight, and every frame posted
        /// arrived.
        #[test]
        fn credits_kept_back_never_stall_the_sender(
            batch in 1..24u32,
            bursts in prop::collection::vec(burst(), 1..40),
        ) {
            // Batches smaller and larger than the pools (16 and 8 elements).
            let mut b = config(64);
            b.target.credit_batch = batch;
            let mut p = Pair::new(config(64), b, 1 << 20);
            p.drive().unwrap();
            let mut posted = 0;
            for b in bursts {
                for i in 0..b.frames {
                    match p.send(Side::A, &frame(b.len, i as u8)) {
                        Outcome::Rdma | Outcome::Inline => posted += 1,
                        Outcome::Backpressure => {}
                        Outcome::TooLarge => prop_assert!(false, "{} bytes too large", b.len),
                    }
                }
                match b.drive {
                    0 => { p.a.step().unwrap(); }
                    1 => { p.b.step().unwrap(); }
                    _ => {
                        p.drive().unwrap();
                        at_rest(&p)?;
                    }
                }
            }
            p.drive().unwrap();
            prop_assert_eq!(p.b.received.len(), posted);
            at_rest(&p)?;
        }
    }
}
