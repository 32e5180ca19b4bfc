//! Keepalive and peer timeout, on a clock the caller provides.

use std::time::{Duration, Instant};

/// What the liveness timer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Nothing to do before [`Keepalive::deadline`].
    Idle,
    /// Nothing was sent for an interval: send a Keepalive.
    SendKeepalive,
    /// Nothing was received for the timeout: the peer is gone.
    Expired,
}

/// Keepalive timer of one connection.
#[derive(Debug, Clone)]
pub struct Keepalive {
    interval: Duration,
    timeout: Duration,
    last_rx: Instant,
    last_tx: Instant,
}

impl Keepalive {
    /// A timer started at `now`.
    pub fn new(interval: Duration, timeout: Duration, now: Instant) -> Keepalive {
        Keepalive {
            interval,
            timeout,
            last_rx: now,
            last_tx: now,
        }
    }

    /// Something arrived from the peer.
    pub fn on_rx(&mut self, now: Instant) {
        self.last_rx = now;
    }

    /// Something was sent to the peer.
    pub fn on_tx(&mut self, now: Instant) {
        self.last_tx = now;
    }

    /// What to do at `now`.
    pub fn poll(&mut self, now: Instant) -> Liveness {
        if now.saturating_duration_since(self.last_rx) >= self.timeout {
            Liveness::Expired
        } else if now.saturating_duration_since(self.last_tx) >= self.interval {
            self.last_tx = now;
            Liveness::SendKeepalive
        } else {
            Liveness::Idle
        }
    }

    /// When to poll next.
    pub fn deadline(&self) -> Instant {
        (self.last_tx + self.interval).min(self.last_rx + self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_then_expiry() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut k = Keepalive::new(ms(100), ms(350), t0);
        assert_eq!(k.poll(t0 + ms(50)), Liveness::Idle);
        assert_eq!(k.deadline(), t0 + ms(100));
        assert_eq!(k.poll(t0 + ms(100)), Liveness::SendKeepalive);
        assert_eq!(k.poll(t0 + ms(150)), Liveness::Idle);
        k.on_rx(t0 + ms(200));
        assert_eq!(k.poll(t0 + ms(500)), Liveness::SendKeepalive);
        assert_eq!(k.poll(t0 + ms(549)), Liveness::Idle);
        assert_eq!(k.poll(t0 + ms(550)), Liveness::Expired);
    }
}
