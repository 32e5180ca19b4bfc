//! Two-thread transfers over a ring and their payloads, for this crate's tests and the
//! measurements of other crates' ring memory (`test-utils`). Test support, built only for
//! tests: every `unwrap` here is an assertion, and a failure is the test's.

use super::ring::{Consumer, Producer, PushError, RingConfig};
use crate::memory::SharedMem;
use std::time::{Duration, Instant};

/// Deterministic payload bytes of record `seq`.
pub fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|j| (seq as u8).wrapping_mul(31) ^ (j as u8).wrapping_mul(7) ^ (seq >> 8) as u8)
        .collect();
    let n = len.min(8);
    v[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    v
}

/// What a two-thread transfer measured.
#[derive(Debug)]
pub struct Transfer {
    /// Records moved.
    pub records: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Time from start to both threads' end.
    pub elapsed: Duration,
    /// Times the producer was told to ring.
    pub doorbells: u64,
    /// Sleeps that timed out while records waited.
    pub lost_wakeups: u64,
}

impl Transfer {
    /// Prints the figures, labelled `what`.
    pub fn report(&self, what: &str) {
        let s = self.elapsed.as_secs_f64();
        println!(
            "{what}: {} records, {} bytes in {:.3} s: {:.2} Mrecords/s, {:.2} GB/s ({:.2} Gbit/s), {} doorbells",
            self.records,
            self.bytes,
            s,
            self.records as f64 / s / 1e6,
            self.bytes as f64 / s / 1e9,
            self.bytes as f64 * 8.0 / s / 1e9,
            self.doorbells,
        );
    }
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Moves `count` records of `len_of(seq)` bytes from a producer thread to a consumer thread.
/// With `verify`, every payload is compared with [`payload`] and both sides' checksums of
/// all bytes must match; otherwise only the sequence number is checked (throughput runs).
/// With `doorbell`, the consumer sleeps (parks) when the ring is empty and is woken only
/// when the producer is told to notify; a sleep that times out while records wait is a lost
/// wake-up. Without, both sides spin.
pub fn transfer<M: SharedMem + Send + 'static>(
    prod_mem: M,
    cons_mem: M,
    cfg: RingConfig,
    count: u64,
    len_of: fn(u64) -> usize,
    verify: bool,
    doorbell: bool,
) -> Transfer {
    let mut p = Producer::attach(prod_mem, cfg).unwrap();
    let mut c = Consumer::attach(cons_mem, cfg).unwrap();
    let start = Instant::now();
    let consumer = std::thread::spawn(move || {
        let (mut got, mut bytes, mut sum, mut lost) = (0u64, 0u64, 0xcbf2_9ce4_8422_2325u64, 0);
        let mut buf = Vec::new();
        while got < count {
            match c.pop(&mut buf).unwrap() {
                Some(r) => {
                    let len = len_of(got);
                    assert_eq!(r.len, len, "record {got}");
                    if verify {
                        assert_eq!(buf, payload(got, len), "record {got}");
                        sum = fnv(sum, &buf);
                    } else if len >= 8 {
                        assert_eq!(buf[..8], got.to_le_bytes(), "record {got}");
                    }
                    bytes += len as u64;
                    got += 1;
                }
                None if doorbell => {
                    if c.prepare_sleep() {
                        let t = Instant::now();
                        std::thread::park_timeout(Duration::from_secs(2));
                        c.wake();
                        if t.elapsed() >= Duration::from_secs(2)
                            && c.pop(&mut buf).unwrap().is_some()
                        {
                            lost += 1;
                            got += 1; // counted, not verified
                        }
                    }
                }
                None => std::hint::spin_loop(),
            }
        }
        (bytes, sum, lost)
    });
    let wakee = consumer.thread().clone();
    let producer = std::thread::spawn(move || {
        let (mut sum, mut rung) = (0xcbf2_9ce4_8422_2325u64, 0u64);
        let mut fixed = payload(0, cfg.max_record() as usize);
        for seq in 0..count {
            let len = len_of(seq);
            let owned;
            let bytes: &[u8] = if verify {
                owned = payload(seq, len);
                sum = fnv(sum, &owned);
                &owned
            } else {
                let n = len.min(8);
                fixed[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
                &fixed[..len]
            };
            loop {
                match p.push(1, &[bytes]) {
                    Ok(pushed) => {
                        if pushed.notify {
                            rung += 1;
                            wakee.unpark();
                        }
                        break;
                    }
                    Err(PushError::Full) => std::hint::spin_loop(),
                    Err(e) => panic!("push: {e}"),
                }
            }
        }
        (sum, rung)
    });
    let (psum, doorbells) = producer.join().unwrap();
    let (bytes, csum, lost_wakeups) = consumer.join().unwrap();
    let elapsed = start.elapsed();
    if verify {
        assert_eq!(psum, csum, "checksums");
    }
    Transfer {
        records: count,
        bytes,
        elapsed,
        doorbells,
        lost_wakeups,
    }
}
