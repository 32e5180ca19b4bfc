//! Frames/s and bytes/s through an initiator/target pair, over the in-process transport, over
//! shared-memory rings (in process memory) and over TCP on loopback, for 64 B, 1500 B and
//! 64 KiB frames. `in_process`, `shm_rings` and `tcp_loopback` run both peers on the
//! benchmark's thread (one core does both ends); `tcp_two_threads`
//! gives each peer its own thread, as two daemons on two cores.
//!
//! `cargo bench -p splitnet-messaging --bench throughput`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use splitnet_messaging::adapter::Channel;
use splitnet_messaging::testing::{config, Outcome, Pair, Side};
use std::time::{Duration, Instant};

const SIZES: [usize; 3] = [64, 1500, 65_536];

/// Sends `n` frames of `len` bytes from A to B and waits until all arrived.
fn transfer<C: Channel>(p: &mut Pair<C>, n: u64, frame: &[u8]) {
    let target = p.b.delivered + n;
    let mut sent = 0;
    while p.b.delivered < target {
        while sent < n {
            match p.send(Side::A, frame) {
                Outcome::Inline | Outcome::Rdma => sent += 1,
                Outcome::Backpressure => break,
                Outcome::TooLarge => panic!("frame too large"),
            }
        }
        p.drive().expect("link failed");
    }
}

fn prepare<C: Channel>(mut p: Pair<C>) -> Pair<C> {
    p.a.keep_frames = false;
    p.b.keep_frames = false;
    p.drive().expect("set-up");
    p
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("push_push");
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    for len in SIZES {
        let frame = vec![0x5a; len];
        let batch: u64 = if len < 2000 { 4096 } else { 256 };
        g.throughput(Throughput::Bytes(batch * len as u64));
        // send_data_max 128: 64-byte frames go inline (SendData), larger ones by RDMA write.
        let mut inproc = prepare(Pair::new(config(128), config(128), 4 << 20));
        g.bench_with_input(BenchmarkId::new("in_process", len), &len, |b, _| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    transfer(&mut inproc, batch, &frame);
                }
                t.elapsed()
            })
        });
        let mut shm = prepare(Pair::shm(config(128), config(128)));
        g.bench_with_input(BenchmarkId::new("shm_rings", len), &len, |b, _| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    transfer(&mut shm, batch, &frame);
                }
                t.elapsed()
            })
        });
        let mut tcp = prepare(Pair::tcp(config(128), config(128)).expect("loopback"));
        g.bench_with_input(BenchmarkId::new("tcp_loopback", len), &len, |b, _| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    transfer(&mut tcp, batch, &frame);
                }
                t.elapsed()
            })
        });
    }
    g.finish();
}

/// Each peer on its own thread over TCP loopback: the receiver spins until it has `total`
/// frames, the sender posts as credits allow.
fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("push_push");
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    for len in SIZES {
        let frame = vec![0x5a; len];
        let batch: u64 = if len < 2000 { 16_384 } else { 1024 };
        g.throughput(Throughput::Bytes(batch * len as u64));
        let pair = prepare(Pair::tcp(config(128), config(128)).expect("loopback"));
        let Pair { a, b } = pair;
        let mut a = Some(a);
        let mut b = Some(b);
        g.bench_with_input(
            BenchmarkId::new("tcp_two_threads", len),
            &len,
            |bench, _| {
                bench.iter_custom(|iters| {
                    let total = iters * batch;
                    let mut rx = b.take().expect("receiver");
                    let mut tx = a.take().expect("sender");
                    let t = Instant::now();
                    let target = rx.delivered + total;
                    let receiver = std::thread::spawn(move || {
                        while rx.delivered < target {
                            rx.step().expect("receiver link");
                        }
                        rx
                    });
                    let mut sent = 0;
                    while sent < total {
                        match tx.send(&frame) {
                            Outcome::Inline | Outcome::Rdma => sent += 1,
                            Outcome::Backpressure => {
                                tx.step().expect("sender link");
                            }
                            Outcome::TooLarge => panic!("frame too large"),
                        }
                    }
                    while tx.link.pending() > 0 {
                        tx.step().expect("sender link");
                    }
                    let rx = receiver.join().expect("receiver thread");
                    let elapsed = t.elapsed();
                    // Let the last credits come back before the next iteration.
                    tx.step().expect("sender link");
                    a = Some(tx);
                    b = Some(rx);
                    elapsed
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench, two_threads);
criterion_main!(benches);
