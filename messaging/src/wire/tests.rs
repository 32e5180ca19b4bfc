//! Wire tests: golden layouts, every truncation, round trips and arbitrary input.

use super::*;
use proptest::prelude::*;

fn enc(m: &Message<'_>, txn: u64) -> Vec<u8> {
    let mut v = Vec::new();
    m.emit(txn, &mut v);
    assert_eq!(v.len(), m.encoded_len());
    v
}

#[test]
fn golden_flush_request() {
    let m = Message::BufferPoolFlushRequest(vec![1, 0x0203_0405]);
    let b = enc(&m, 0x1122_3344_5566_7788);
    assert_eq!(
        b,
        [
            0x01, 0x04, 0x00, 0x01, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // header
            0x00, 0x02, 0x00, 0x00, // count, reserved
            0, 0, 0, 1, 2, 3, 4, 5,
        ]
    );
    let (h, back) = Message::parse(&b).unwrap();
    assert_eq!(h.txn, 0x1122_3344_5566_7788);
    assert_eq!(back, m);
}

#[test]
fn golden_indicate_and_senddata() {
    let m = Message::BufferRdmaIndicate(Indicate {
        pool_ref: 300,
        element: 2,
        length: 70_000,
    });
    assert_eq!(
        enc(&m, 0)[HEADER_LEN..],
        [0, 0, 1, 44, 0, 0, 0, 2, 0, 1, 0x11, 0x70]
    );
    let m = Message::SendData(b"abc");
    assert_eq!(enc(&m, 0)[HEADER_LEN..], [0, 0, 0, 3, b'a', b'b', b'c']);
}

fn samples() -> Vec<Message<'static>> {
    vec![
        Message::Hello(Hello {
            min_version: 1,
            max_version: 1,
            role: Role::Host,
            channel: 1,
            queue: Queue { index: 1, count: 4 },
            session: 9,
            node_id: 77,
            max_message: 66_560,
        }),
        Message::HelloReply(HelloReply {
            version: 1,
            status: ErrorCode::Ok,
            flags: HelloReply::SEALED_DATA,
            session: 9,
            max_message: 66_560,
        }),
        Message::Keepalive,
        Message::Goodbye(Goodbye {
            code: ErrorCode::ShuttingDown,
        }),
        Message::BufferRecvPool(vec![PoolEntry {
            pool_ref: 1,
            element_count: 64,
            element_size: 2048,
            address: 1 << 40,
            handle: 5,
            context: 6,
        }]),
        Message::BufferRecvPoolGet(PoolGet {
            element_size: 2048,
            element_count: 16,
        }),
        Message::BufferRecvPoolUpdate(vec![PoolRun {
            pool_ref: 0,
            first: 3,
            count: 4,
        }]),
        Message::BufferPoolFlushRequest(vec![0, 1]),
        Message::BufferPoolFlushReply,
        Message::SendData(&[1, 2, 3, 4]),
        Message::BufferRdmaIndicate(Indicate {
            pool_ref: 1,
            element: 2,
            length: 3,
        }),
        Message::CfgUtilRequest(CfgRequest {
            code: CfgCode::SetMtu,
            data: &[0, 0, 5, 220],
        }),
        Message::CfgUtilReply(CfgReply {
            code: CfgCode::GetMac,
            status: ErrorCode::Ok,
            data: &[2, 0, 0, 0, 0, 1],
        }),
    ]
}

#[test]
fn every_truncation_is_an_error() {
    for m in samples() {
        let b = enc(&m, 1);
        for cut in 0..b.len() {
            assert!(
                Message::parse(&b[..cut]).is_err(),
                "{m:?} truncated to {cut} parsed"
            );
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(
            Message::parse(&longer).is_err(),
            "{m:?} with a trailing byte parsed"
        );
    }
}

#[test]
fn unknown_function_and_version_are_errors() {
    let mut b = enc(&Message::Keepalive, 0);
    b[1] = 0x77;
    assert_eq!(Message::parse(&b), Err(WireError::UnknownFunction(0x0077)));
    let mut b = enc(&Message::Keepalive, 0);
    b[3] = 2;
    assert_eq!(Message::parse(&b), Err(WireError::UnsupportedVersion(2)));
    // A Hello is accepted whatever its header version: negotiation is in its body.
    let mut b = enc(&samples()[0], 0);
    b[3] = 9;
    assert!(Message::parse(&b).is_ok());
}

#[test]
fn bounds_are_enforced() {
    // A count larger than the bytes present.
    let mut b = enc(&Message::BufferPoolFlushRequest(vec![1]), 0);
    b[13] = 200;
    assert!(matches!(
        Message::parse(&b),
        Err(WireError::LengthMismatch { .. })
    ));
    // Empty list.
    let mut b = enc(&Message::BufferPoolFlushRequest(vec![1]), 0);
    b[13] = 0;
    b.truncate(16);
    assert_eq!(Message::parse(&b), Err(WireError::EmptyList));
    // Oversized message.
    let big = vec![0u8; MAX_MESSAGE_LEN + 1];
    assert_eq!(
        Message::parse(&big),
        Err(WireError::TooLong(MAX_MESSAGE_LEN + 1))
    );
    // Run that overflows u32.
    let b = enc(
        &Message::BufferRecvPoolUpdate(vec![PoolRun {
            pool_ref: 0,
            first: u32::MAX,
            count: 1,
        }]),
        0,
    );
    assert!(matches!(
        Message::parse(&b),
        Err(WireError::BadField { .. })
    ));
    // Reserved bits.
    let mut b = enc(
        &Message::Goodbye(Goodbye {
            code: ErrorCode::Ok,
        }),
        0,
    );
    b[15] = 1;
    assert_eq!(Message::parse(&b), Err(WireError::Reserved));
    // A data channel beyond the maximum.
    let mut b = enc(&samples()[0], 0);
    b[17] = MAX_DATA_CHANNELS + 1;
    assert!(matches!(
        Message::parse(&b),
        Err(WireError::BadField { .. })
    ));
    // Queues: a count of 0 (a peer that predates queues) is one queue; an index beyond the
    // count or a count beyond the maximum is refused.
    let mut b = enc(&samples()[0], 0);
    b[18] = 0;
    b[19] = 0;
    match Message::parse(&b) {
        Ok((_, Message::Hello(h))) => assert_eq!(h.queue, Queue::SINGLE),
        other => panic!("{other:?}"),
    }
    for (index, count) in [(1, 1), (4, 4), (0, MAX_QUEUES + 1), (1, 0)] {
        b[18] = index;
        b[19] = count;
        let err = Message::parse(&b).unwrap_err();
        // The log names the two bytes apart (issue 15: "bad value 257 for queue").
        assert_eq!(
            err,
            WireError::BadQueue {
                index,
                count: count.max(1),
                max: MAX_QUEUES
            },
            "{index}/{count}"
        );
        assert!(err
            .to_string()
            .starts_with(&format!("queue {index} of {}", count.max(1))));
    }
}

#[test]
fn cfg_payloads() {
    let m = Mtu {
        current: 1500,
        max: 9000,
    };
    assert_eq!(Mtu::parse(&m.emit()), Ok(m));
    assert!(Mtu::parse(&m.emit()[..7]).is_err());
    let s = Stats {
        rx_frames: 1,
        tx_bytes: 2,
        protection_errors: 3,
        ..Stats::default()
    };
    assert_eq!(Stats::parse(&s.emit()), Ok(s));
    let l = LinkChange {
        up: true,
        mtu: 9000,
    };
    assert_eq!(LinkChange::parse(&l.emit()), Ok(l));
    assert!(LinkChange::parse(&[2, 0, 0, 0, 0]).is_err());
    assert_eq!(parse_mac(&[1, 2, 3, 4, 5, 6]), Ok([1, 2, 3, 4, 5, 6]));
    assert!(parse_mac(&[1, 2, 3]).is_err());
    assert_eq!(parse_multicast(&[1; 12]).unwrap().len(), 2);
    assert!(parse_multicast(&[1; 13]).is_err());
    assert!(parse_multicast(&vec![1; 6 * 257]).is_err());
    for v in 0..20u16 {
        assert_eq!(CfgCode::from_u16(v).to_u16(), v);
        assert_eq!(ErrorCode::from_u16(v).to_u16(), v);
    }
}

fn arb_code() -> impl Strategy<Value = ErrorCode> {
    any::<u16>().prop_map(ErrorCode::from_u16)
}

fn arb_message(data: &'static [u8]) -> impl Strategy<Value = Message<'static>> {
    let entry = (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(pool_ref, element_count, element_size, address, handle, context)| PoolEntry {
                pool_ref,
                element_count,
                element_size,
                address,
                handle,
                context,
            },
        );
    let run =
        (any::<u32>(), 1u32..1000, any::<u32>()).prop_map(|(pool_ref, count, first)| PoolRun {
            pool_ref,
            first: first.min(u32::MAX - count),
            count,
        });
    prop_oneof![
        (0..300usize).prop_map(move |n| Message::AuthHello(&data[..n])),
        (0..300usize).prop_map(move |n| Message::AuthReply(&data[..n])),
        (
            any::<u16>(),
            any::<u16>(),
            any::<bool>(),
            0u8..=MAX_DATA_CHANNELS,
            (1u8..=MAX_QUEUES).prop_flat_map(|count| (0..count, Just(count))),
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(
                |(a, b, host, channel, (index, count), session, node_id, max_message)| {
                    Message::Hello(Hello {
                        min_version: a,
                        max_version: b,
                        role: if host { Role::Host } else { Role::Ioc },
                        channel,
                        queue: Queue { index, count },
                        session,
                        node_id,
                        max_message,
                    })
                }
            ),
        (
            any::<u16>(),
            arb_code(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(
                |(version, status, flags, session, max_message)| Message::HelloReply(HelloReply {
                    version,
                    status,
                    flags,
                    session,
                    max_message
                })
            ),
        Just(Message::Keepalive),
        arb_code().prop_map(|code| Message::Goodbye(Goodbye { code })),
        proptest::collection::vec(entry, 1..20).prop_map(Message::BufferRecvPool),
        (any::<u32>(), any::<u32>()).prop_map(|(element_size, element_count)| {
            Message::BufferRecvPoolGet(PoolGet {
                element_size,
                element_count,
            })
        }),
        proptest::collection::vec(run, 1..20).prop_map(Message::BufferRecvPoolUpdate),
        proptest::collection::vec(any::<u32>(), 1..20).prop_map(Message::BufferPoolFlushRequest),
        Just(Message::BufferPoolFlushReply),
        (0..data.len()).prop_map(move |n| Message::SendData(&data[..n])),
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(pool_ref, element, length)| {
            Message::BufferRdmaIndicate(Indicate {
                pool_ref,
                element,
                length,
            })
        }),
        (any::<u16>(), 0..200usize).prop_map(move |(c, n)| Message::CfgUtilRequest(CfgRequest {
            code: CfgCode::from_u16(c),
            data: &data[..n]
        })),
        (any::<u16>(), arb_code(), 0..200usize).prop_map(move |(c, status, n)| {
            Message::CfgUtilReply(CfgReply {
                code: CfgCode::from_u16(c),
                status,
                data: &data[..n],
            })
        }),
    ]
}

static DATA: [u8; 4096] = {
    let mut d = [0u8; 4096];
    let mut i = 0;
    while i < d.len() {
        d[i] = (i * 7 + 3) as u8;
        i += 1;
    }
    d
};

proptest! {
    #[test]
    fn every_message_round_trips(m in arb_message(&DATA), txn: u64) {
        let b = enc(&m, txn);
        let (h, back) = Message::parse(&b).unwrap();
        prop_assert_eq!(h.txn, txn);
        prop_assert_eq!(h.function, m.function());
        prop_assert_eq!(back, m);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok((h, m)) = Message::parse(&b) {
            let mut again = enc(&m, h.txn);
            // A Hello or AuthHello is taken whatever version its header carries; the
            // encoder writes this side's.
            again[2..4].copy_from_slice(&h.version.to_be_bytes());
            prop_assert_eq!(again, b);
        }
    }

    #[test]
    fn mutated_messages_never_panic(m in arb_message(&DATA), pos: usize, byte: u8) {
        let mut b = enc(&m, 0);
        let i = pos % b.len();
        b[i] = byte;
        let _ = Message::parse(&b);
    }
}

#[test]
fn feature_bits_are_named_in_order_and_unknown_bits_ignored() {
    use crate::wire::features;
    assert_eq!(
        features::names(features::VNET_HDR | features::TSO6 | 1 << 40),
        ["vnet_hdr", "tso6"]
    );
    assert!(features::names(0).is_empty());
    let all = features::NAMES.iter().fold(0, |a, (b, _)| a | b);
    assert_eq!(features::names(all).len(), 7);
}

#[test]
fn liveness_interval_travels_in_the_upper_flag_bits() {
    let f = HelloReply::with_liveness(HelloReply::SEALED_DATA | HelloReply::STANDBY, 25);
    assert_eq!(f & HelloReply::FLAG_BITS, 0b111);
    assert_eq!(HelloReply::liveness_ms(f), Some(25));
    // Without the flag, or with an interval of 0, none is asked.
    assert_eq!(HelloReply::liveness_ms(25 << 16), None);
    assert_eq!(HelloReply::liveness_ms(HelloReply::LIVENESS), None);
    assert_eq!(CfgCode::from_u16(12), CfgCode::Activate);
}

proptest! {
    #[test]
    fn liveness_flags_keep_the_other_bits(flags in any::<u32>(), ms in 1u16..) {
        let f = HelloReply::with_liveness(flags, ms);
        prop_assert_eq!(HelloReply::liveness_ms(f), Some(ms));
        prop_assert_eq!(f & HelloReply::FLAG_BITS, (flags & HelloReply::FLAG_BITS) | HelloReply::LIVENESS);
    }
}
