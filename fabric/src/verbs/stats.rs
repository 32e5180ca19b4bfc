//! What a queue pair did, logged when it closes.

/// What a queue pair did: the verbs calls it made and the operations it carried. Logged
/// when the channel ends; per frame, this is what predicts the cost on an RDMA NIC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerbsStats {
    /// RDMA WRITE WITH IMMEDIATE posted.
    pub write_imm_tx: u64,
    /// Plain RDMA WRITE posted (each with its notice).
    pub write_tx: u64,
    /// SENDs posted (messages).
    pub send_tx: u64,
    /// RDMA WRITE WITH IMMEDIATE received.
    pub write_imm_rx: u64,
    /// Plain RDMA WRITE received (by their notices).
    pub write_rx: u64,
    /// SENDs received.
    pub send_rx: u64,
    /// `ibv_post_send` and `ibv_bind_mw` calls (each rings the adapter's doorbell once).
    pub post_send: u64,
    /// `ibv_post_recv` calls.
    pub post_recv: u64,
    /// `ibv_poll_cq` calls.
    pub poll_cq: u64,
    /// Completions polled.
    pub completions: u64,
    /// `ibv_req_notify_cq` calls (arming before a sleep).
    pub arm: u64,
    /// Completion events read from the channel (wake-ups).
    pub events: u64,
    /// Memory windows bound (or due to be) over elements granted to the peer.
    pub bind: u64,
    /// Memory windows closed (or due to be): the peer's write into the element was read, or
    /// the grant was withdrawn.
    pub close: u64,
    /// RDMA writes (with immediate data or not) posted and never completed when the channel
    /// was closed ([`Channel::close`](splitnet_messaging::adapter::Channel::close)): whether
    /// the peer has them is not known.
    pub write_incomplete: u64,
}

impl std::fmt::Display for VerbsStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "write_imm_tx={} write_tx={} send_tx={} write_imm_rx={} write_rx={} send_rx={} \
             post_send={} post_recv={} poll_cq={} completions={} arm={} events={} bind={} close={} \
             write_incomplete={}",
            self.write_imm_tx,
            self.write_tx,
            self.send_tx,
            self.write_imm_rx,
            self.write_rx,
            self.send_rx,
            self.post_send,
            self.post_recv,
            self.poll_cq,
            self.completions,
            self.arm,
            self.events,
            self.bind,
            self.close,
            self.write_incomplete
        )
    }
}
