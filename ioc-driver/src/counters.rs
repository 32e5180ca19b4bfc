//! What the IOC counts: its own counters, summed over the workers, and every drop of a host's
//! frames by cause, each shown to operators (`splitnetctl stats`, the metrics).

/// Counters of the IOC as a whole.
#[derive(Debug, Clone, Copy, Default)]
pub struct IocStats {
    /// Frames read from the NIC.
    pub lan_rx: u64,
    /// Frames written to the NIC.
    pub lan_tx: u64,
    /// LAN frames for no host.
    pub lan_filtered: u64,
    /// LAN frames the kernel dropped: the IOC's receive ring was full.
    pub lan_rx_dropped: u64,
    /// Frames the NIC refused.
    pub lan_tx_errors: u64,
    /// NIC frames the kernel could not hand over (an offload a virtio-net header cannot
    /// describe): read and lost.
    pub lan_rx_unreadable: u64,
    /// Hosts disconnected for protocol errors.
    pub protocol_errors: u64,
    /// Hosts disconnected for protection errors.
    pub protection_errors: u64,
    /// Connections refused during the handshake.
    pub handshake_failures: u64,
    /// Watchdog ticks (every 250 ms) withheld because a worker's loop had not run for 2 s.
    pub watchdog_withheld: u64,
    /// Frames handed to another worker for its hosts.
    pub crossed_out: u64,
    /// Frames another worker handed to this one.
    pub crossed_in: u64,
    /// Frames for another worker dropped: its inbox was full.
    pub cross_dropped: u64,
    /// LAN frames whose virtio-net header or Ethernet header the checks refused (what the
    /// kernel must never see from a host, it must never hand one either): dropped.
    pub lan_rx_bad_frame: u64,
    /// LAN frames longer than a send buffer (a GRO or BIG TCP frame beyond 64 KiB), cut by
    /// the read: dropped.
    pub lan_rx_truncated: u64,
    /// LAN frames read from a mapped ring's slots, without a system call (`lan.rx_ring`).
    pub lan_rx_ring: u64,
    /// CfgUtil requests answered Busy: the host asked faster than its rate allows.
    pub cfg_rate_limited: u64,
    /// Idle periods the workers' poll before sleep caught work in (`fabric.spin_max_us`).
    pub poll_caught: u64,
    /// Idle periods a polling worker slept in (its poll's budget ran out or was zero).
    pub poll_slept: u64,
}

impl IocStats {
    /// The NIC's and the workers' drops, named as operators see them. A frame for a host
    /// lost at the NIC (its own queue full, unreadable) counts here and in the host's cause.
    pub fn drops_named(&self) -> [(&'static str, u64); 7] {
        [
            ("lan_rx_ring_full", self.lan_rx_dropped),
            ("lan_rx_unreadable", self.lan_rx_unreadable),
            ("lan_rx_bad_frame", self.lan_rx_bad_frame),
            ("lan_rx_truncated", self.lan_rx_truncated),
            ("lan_no_host", self.lan_filtered),
            ("lan_tx_refused", self.lan_tx_errors),
            ("worker_inbox_full", self.cross_dropped),
        ]
    }
}

/// Frames dropped for or from one host session, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drops {
    /// To the host: its receive ring is full (in bytes, or its flow's share of them).
    pub ring_full: u64,
    /// To the host: its share of the IOC's send buffers is queued (it reads too slowly).
    pub quota: u64,
    /// To the host: larger than any of its pools and than a SendData message.
    pub too_large: u64,
    /// To the host: the kernel failed to hand the frame over from the host's own queue
    /// (an offload a virtio-net header cannot describe).
    pub unreadable: u64,
    /// To the host: posted on its link and never delivered, the session having ended
    /// (dropped unsent as its channels closed).
    pub lost_at_close: u64,
    /// From the host: virtio-net metadata the kernel must not see.
    pub bad_offload: u64,
    /// From the host: a source MAC that is not the host's.
    pub spoofed: u64,
    /// From the host: longer than its MTU allows.
    pub over_mtu: u64,
    /// From the host: an offload it did not negotiate.
    pub not_negotiated: u64,
    /// From the host: SendData where the protocol calls for an RDMA write.
    pub oversize_inline: u64,
    /// From the host: refused by the NIC.
    pub nic: u64,
    /// From the host: a broadcast or multicast frame beyond its storm-control rate.
    pub storm: u64,
    /// From the host: a frame its VLAN policy refuses (a tag from an untagged or access
    /// host, a VLAN a trunk host does not list, an untagged frame from a trunk host).
    pub vlan: u64,
    /// From the host: a frame on a standby session (which carries none until activated).
    pub standby: u64,
}

impl Drops {
    /// Every cause with its count, named as operators see them.
    pub fn named(&self) -> [(&'static str, u64); 14] {
        [
            ("rx_ring_full", self.ring_full),
            ("rx_quota", self.quota),
            ("rx_too_large", self.too_large),
            ("rx_unreadable", self.unreadable),
            ("rx_lost_at_close", self.lost_at_close),
            ("tx_bad_offload", self.bad_offload),
            ("tx_spoofed_source", self.spoofed),
            ("tx_over_mtu", self.over_mtu),
            ("tx_not_negotiated", self.not_negotiated),
            ("tx_oversize_inline", self.oversize_inline),
            ("tx_nic", self.nic),
            ("tx_storm_control", self.storm),
            ("tx_vlan", self.vlan),
            ("tx_standby", self.standby),
        ]
    }
}

impl std::ops::AddAssign for Drops {
    fn add_assign(&mut self, o: Drops) {
        self.ring_full += o.ring_full;
        self.quota += o.quota;
        self.too_large += o.too_large;
        self.unreadable += o.unreadable;
        self.lost_at_close += o.lost_at_close;
        self.bad_offload += o.bad_offload;
        self.spoofed += o.spoofed;
        self.over_mtu += o.over_mtu;
        self.not_negotiated += o.not_negotiated;
        self.oversize_inline += o.oversize_inline;
        self.nic += o.nic;
        self.storm += o.storm;
        self.vlan += o.vlan;
        self.standby += o.standby;
    }
}

/// Why a frame from a host is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxDrop {
    /// Invalid virtio-net metadata.
    BadOffload,
    /// Source MAC not the host's.
    Spoofed,
    /// Longer than the MTU.
    OverMtu,
    /// Offload not negotiated.
    NotNegotiated,
    /// SendData where an RDMA write was due.
    OversizeInline,
    /// The NIC refused it.
    Nic,
    /// A group frame beyond the host's storm-control rate.
    Storm,
    /// A frame its VLAN policy refuses.
    Vlan,
    /// A frame on a standby session.
    Standby,
}

/// Why a frame for a host is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxDrop {
    /// Its receive ring is full (in bytes, or its flow's share of them).
    RingFull,
    /// The host's send-buffer quota is in use.
    Quota,
    /// Too large for the host.
    TooLarge,
    /// The kernel failed to hand it over.
    Unreadable,
    /// Posted, and dropped unsent as the session ended.
    LostAtClose,
}
