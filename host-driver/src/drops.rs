//! Every frame the host driver drops, by cause: counted where it happens, summed over the
//! queues and the connections, shown by `splitnetctl stats` and the metrics.

/// Frames dropped by one queue's connection (or several, added up), by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drops {
    /// From the IOC: a virtio-net header the check refused.
    pub rx_bad_header: u64,
    /// From the IOC: the TAP refused the write.
    pub rx_tap_write: u64,
    /// From the IOC: SendData that belonged in one of our pools (refused, protocol rule).
    pub rx_refused_inline: u64,
    /// To the IOC: the flow queue dropped it (a flow over its share: its oldest; the queue
    /// full: the longest flow's oldest).
    pub tx_flow_queue: u64,
    /// To the IOC: a read from the TAP failed (the kernel drops the frame it was handing
    /// over).
    pub tx_tap_read: u64,
    /// To the IOC: read from the TAP and never delivered, the connection having ended
    /// (waiting in the flow queue, held back for credit, or posted and not yet written).
    pub tx_lost_at_close: u64,
    /// From a standby IOC, which must send none (docs/protocol.md 6.5).
    pub rx_standby: u64,
}

impl Drops {
    /// Every cause with its count, named as operators see them.
    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("rx_bad_header", self.rx_bad_header),
            ("rx_tap_write", self.rx_tap_write),
            ("rx_refused_inline", self.rx_refused_inline),
            ("tx_flow_queue", self.tx_flow_queue),
            ("tx_tap_read", self.tx_tap_read),
            ("tx_lost_at_close", self.tx_lost_at_close),
            ("rx_standby", self.rx_standby),
        ]
    }

    /// Frames from the IOC dropped.
    pub fn rx(&self) -> u64 {
        self.rx_bad_header + self.rx_tap_write + self.rx_refused_inline + self.rx_standby
    }

    /// Frames to the IOC dropped.
    pub fn tx(&self) -> u64 {
        self.tx_flow_queue + self.tx_tap_read + self.tx_lost_at_close
    }
}

impl std::ops::AddAssign for Drops {
    fn add_assign(&mut self, o: Drops) {
        self.rx_bad_header += o.rx_bad_header;
        self.rx_tap_write += o.rx_tap_write;
        self.rx_refused_inline += o.rx_refused_inline;
        self.tx_flow_queue += o.tx_flow_queue;
        self.tx_tap_read += o.tx_tap_read;
        self.tx_lost_at_close += o.tx_lost_at_close;
        self.rx_standby += o.rx_standby;
    }
}

impl std::ops::Add for Drops {
    type Output = Drops;

    fn add(mut self, o: Drops) -> Drops {
        self += o;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_is_named_added_and_in_its_direction() {
        let one = Drops {
            rx_bad_header: 1,
            rx_tap_write: 2,
            rx_refused_inline: 4,
            tx_flow_queue: 8,
            tx_tap_read: 16,
            tx_lost_at_close: 32,
            rx_standby: 64,
        };
        let sum = one + one;
        let named = sum.named();
        assert_eq!(named.iter().map(|(_, n)| n).sum::<u64>(), 254);
        assert!(named.iter().all(|(_, n)| n.is_power_of_two()), "{named:?}");
        assert_eq!((sum.rx(), sum.tx()), (142, 112));
    }
}
