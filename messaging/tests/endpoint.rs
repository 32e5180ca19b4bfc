//! State-machine tests of the push-push endpoint, grouped by what they exercise, driven by
//! the in-process two-peer harness.

use splitnet_messaging::adapter::{Channel, Op, Payload};
use splitnet_messaging::endpoint::{LinkError, LinkEvent, PoolGetOutcome, PoolSpec, ProtocolError};
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
        p.drive().unwrap();
        // Delivered and released: credits come back (idle flush), every element granted.
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
        p.drive().unwrap();
        let ini = p.a.link.session_mut().initiator_mut();
        assert_eq!(ini.inflight_bytes(), 0);
        assert_eq!(ini.take_completed(), 10_500);
        assert_eq!(ini.take_completed(), 0);
    });

    over_both!(credit_updates_are_counted, |p| {
        // One frame per round: each idle point returns its credit in an update of its own.
        let before = p.b.link.session().target().credit_updates();
        for i in 0..5 {
            assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma);
            p.drive().unwrap();
        }
        assert_eq!(p.b.link.session().target().credit_updates() - before, 5);
        assert_eq!(p.b.link.stats().tx_credit_updates - before, 5);
    });

    over_both!(a_sparse_flows_credits_come_back_in_batches, |p| {
        // Issue 43: one small frame per wake-up; the receiver returns its credits at the
        // end of a wake-up only where the sender may wait for them. Its pool of 16 never
        // falls to half, so they come back in batches of 4 (credit_batch): an update per
        // four frames, not per frame, and the sender never waits.
        p.b.idle_credits = true;
        let before = p.b.link.session().target().credit_updates();
        for i in 0..12 {
            assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma);
            p.drive().unwrap();
        }
        assert_eq!(p.b.link.session().target().credit_updates() - before, 3);
        assert_eq!(p.b.delivered, 12);
        // A frame of 32 KiB or more comes back at once: a sender's byte limit counts it.
        for i in 0..3 {
            assert_eq!(p.send(Side::A, &frame(40_000, i)), Outcome::Rdma);
            p.drive().unwrap();
            assert_eq!(p.a.link.session().initiator().inflight_bytes(), 0);
        }
        assert_eq!(p.b.link.session().target().credit_updates() - before, 6);
        // A pool at half its credits or fewer comes back at once too.
        p.a.link.session_mut().initiator_mut().take_completed();
        let small = p.a.link.session().initiator().credits();
        for i in 0..8 {
            assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma);
        }
        p.drive().unwrap();
        assert_eq!(p.a.link.session().initiator().credits(), small);
    });

    /// What a receiver ending its wake-ups with `flush_idle` keeps, under any traffic:
    /// whenever both sides are idle the sender holds credit in every pool and counts less
    /// than `KEEP_BYTES` in flight (so a byte limit, at least twice that, admits its next
    /// frame: it never stalls), every frame arrived in order, and a flow of small frames
    /// one per wake-up cost at most an update per `credit_batch` frames.
    mod idle_credits {
        use super::*;
        use proptest::prelude::*;
        use splitnet_messaging::endpoint::KEEP_BYTES;
        use splitnet_messaging::sched::LimitConfig;

        /// A batch larger than half a pool: the pool's credits come back once the sender
        /// holds half of them, so it never runs dry (without that rule it would after 8).
        #[test]
        fn a_pool_at_half_its_credits_comes_back_whatever_the_batch() {
            let mut c = config(64);
            c.target.credit_batch = 64;
            let mut p = Pair::new(config(64), c, 1 << 20);
            p.drive().unwrap();
            p.b.idle_credits = true;
            for i in 0..100 {
                assert_eq!(p.send(Side::A, &frame(1000, i)), Outcome::Rdma, "frame {i}");
                p.drive().unwrap();
            }
            // 16 elements: returned each time the sender is down to 8.
            assert_eq!(p.b.link.session().target().credit_updates(), 100 / 8);
        }

        #[test]
        fn keep_bytes_is_below_half_of_any_byte_limit() {
            for c in [LimitConfig::default(), LimitConfig::stream()] {
                assert!(KEEP_BYTES * 2 <= c.min, "{c:?}");
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn no_sender_stalls_and_sparse_flows_batch(
                rounds in proptest::collection::vec(
                    proptest::collection::vec(prop_oneof![60usize..2000, 2000usize..65_000], 1..6),
                    1..40,
                ),
                shm in any::<bool>(),
            ) {
                fn run<C: splitnet_messaging::adapter::Channel>(
                    mut p: Pair<C>,
                    rounds: &[Vec<usize>],
                ) -> Result<(), TestCaseError> {
                    p.b.idle_credits = true;
                    let mut sent = Vec::new();
                    for (r, lens) in rounds.iter().enumerate() {
                        for (i, &len) in lens.iter().enumerate() {
                            let f = frame(len, (r * 7 + i) as u8);
                            let out = p.send(Side::A, &f);
                            prop_assert!(
                                out == Outcome::Rdma || out == Outcome::Inline,
                                "round {r}: {out:?}"
                            );
                            sent.push(f);
                            // More than a wake-up's worth: the receiver runs between.
                            if i % 3 == 2 {
                                p.drive().unwrap();
                            }
                        }
                        p.drive().unwrap();
                        let ini = p.a.link.session().initiator();
                        prop_assert!(ini.inflight_bytes() < KEEP_BYTES, "{}", ini.inflight_bytes());
                        for u in p.b.link.session().target().pool_usage() {
                            prop_assert!(u.free == 0 || u.granted * 2 > u.spec.element_count, "{u:?}");
                            prop_assert_eq!(u.busy, 0);
                        }
                    }
                    prop_assert!(p.b.received == sent, "every frame, in order");
                    Ok(())
                }
                if shm {
                    run(pair_shm(), &rounds)?;
                } else {
                    run(pair(), &rounds)?;
                }
            }

            #[test]
            fn a_flow_of_small_frames_costs_an_update_per_batch(n in 1u64..100) {
                let mut p = pair();
                p.b.idle_credits = true;
                for i in 0..n {
                    prop_assert_eq!(p.send(Side::A, &frame(1000, i as u8)), Outcome::Rdma);
                    p.drive().unwrap();
                }
                let batch = u64::from(config(128).target.credit_batch);
                prop_assert_eq!(p.b.link.session().target().credit_updates(), n / batch);
            }
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
        p.drive().unwrap();
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
                .read_batch_in_place(65_600, 64, reads_batch(&frames), bulk);
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
        let got = p.a.link.read_batch_in_place(
            65_600,
            2,
            |_, lens: &mut [usize]| {
                lens[0] = 70_000;
                lens[1] = 100;
                Ok::<_, ()>(2)
            },
            bulk,
        );
        let b = got.unwrap().unwrap();
        assert_eq!((b.offered, b.read, b.posted, b.dropped), (2, 2, 1, 1));
        assert_eq!(p.a.link.stats().tx_too_large, 1);
        // A failed read gives every element back.
        let failed =
            p.a.link
                .read_batch_in_place(65_600, 64, |_, _| Err("would block"), bulk);
        assert_eq!(failed, Some(Err("would block")));
        p.drive().unwrap();
        assert_eq!(p.a.link.session().initiator().credits(), before);
        assert_eq!(p.a.link.session().initiator().inflight_bytes(), 0);
        // No element that large: nothing taken, nothing read.
        let big = p.a.link.read_batch_in_place(
            1 << 20,
            8,
            |_, _| -> Result<usize, ()> { panic!("no element to read into") },
            bulk,
        );
        assert_eq!(big, None);
    }

    /// Issue 43: a host's own queue on the IOC reads frames in batches; those its express
    /// rule picks go on the control channel, ahead of the bulk frames read before them.
    #[test]
    fn a_batch_read_sends_what_express_picks_on_the_control_channel() {
        let mut p = pair_shm_pools();
        let before = p.a.link.session().initiator().credits();
        let frames = [
            Some(frame(30_000, 1)),
            Some(frame(98, 2)),
            None,
            Some(frame(20_000, 3)),
            Some(frame(60, 4)),
        ];
        let mut asked = Vec::new();
        let got = p.a.link.read_batch_in_place(
            65_600,
            64,
            reads_batch(&frames),
            |w: &SharedBytes<'_>, n: usize| {
                let mut head = [0u8; 12];
                w.copy_out(0, &mut head).unwrap();
                asked.push(n);
                // The closure sees each frame's bytes; the last small frame stays on the
                // data channel, inline.
                n == 98 && head == frame(98, 2)[..12]
            },
        );
        let b = got.unwrap().unwrap();
        assert_eq!(
            asked,
            vec![30_000, 98, 20_000, 60],
            "asked of each frame in order"
        );
        assert_eq!(
            (b.read, b.posted, b.express, b.inline, b.bytes),
            (5, 4, 1, 1, 50_158)
        );
        let st = p.a.link.stats();
        assert_eq!(
            (st.tx_express, st.tx_inline, st.tx_in_place, st.tx_frames),
            (1, 1, 2, 4)
        );
        assert_eq!(
            p.a.link.session().initiator().credits(),
            before - 2,
            "the express and inline frames' elements went back"
        );
        p.drive().unwrap();
        // Polled control first: the express frame arrives ahead of the frames before it.
        assert_eq!(
            p.b.received,
            vec![
                frame(98, 2),
                frame(30_000, 1),
                frame(20_000, 3),
                frame(60, 4)
            ]
        );
        assert_eq!(p.b.link.stats().rx_express, 1);
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
