//! Frames for the LAN, sent in batches: one `sendmmsg(2)` carries up to
//! [`SEND_BATCH`] frames where one `write(2)` per frame cost a system call each.
//!
//! A frame a host wrote lives in its pool element only until the frame callback returns
//! (the element is credited back to the host then), so a small frame is copied into a slot
//! of the batch; a copy of an MTU-sized frame costs far less than the system call it saves.
//! A frame larger than a slot (a TSO frame) is sent at once from the element, after the
//! frames queued before it, so the LAN sees every host's frames in the order they came.
//! A frame in a host's shared pool goes out as its checked private head and the rest (see
//! [`HostFrame`]): copied so into a slot, or given so to the kernel.

use crate::counters::{IocStats, TxDrop};
use crate::host_frame::HostFrame;
use crate::host_queue::HostQueue;
use crate::nic::Nic;
use splitnet_netif::packet::SEND_BATCH;
use std::collections::BTreeMap;
use tracing::debug;

/// Bytes of one slot: an MTU-1500 frame with two VLAN tags and its virtio-net header.
pub const SLOT: usize = 2048;

/// Frames queued for the NIC, with the session each came from.
#[derive(Debug)]
pub struct LanTx {
    arena: Box<[u8]>,
    /// Session and length of each queued frame, in slot order.
    queued: Vec<(u64, usize)>,
}

impl Default for LanTx {
    fn default() -> LanTx {
        LanTx {
            arena: vec![0; SLOT * SEND_BATCH].into_boxed_slice(),
            queued: Vec::with_capacity(SEND_BATCH),
        }
    }
}

impl LanTx {
    /// Sends `frame`, which host session `from` wrote: queued in a slot when it fits (the
    /// batch goes out when full), else sent at once after the queued frames.
    pub fn send(
        &mut self,
        from: u64,
        frame: HostFrame<'_>,
        nic: &dyn Nic,
        hosts: &mut BTreeMap<u64, HostQueue>,
        stats: &mut IocStats,
    ) {
        if frame.len() > SLOT {
            self.flush(nic, hosts, stats);
            let sent = match frame {
                HostFrame::Private(b) => nic.send(b),
                HostFrame::Shared { head, rest } => nic.send_parts(head, &rest),
            };
            let ok = sent.map_err(|e| debug!("NIC refused a frame: {e}"));
            account(from, frame.len(), ok.is_ok(), hosts, stats);
            return;
        }
        let i = self.queued.len();
        // It fits: the slot is SLOT bytes and the frame at most that.
        frame.copy_to(&mut self.arena[i * SLOT..(i + 1) * SLOT]);
        self.queued.push((from, frame.len()));
        if self.queued.len() == SEND_BATCH {
            self.flush(nic, hosts, stats);
        }
    }

    /// Sends every queued frame; a frame the NIC refuses is counted against its host and
    /// the ones after it are still sent.
    pub fn flush(
        &mut self,
        nic: &dyn Nic,
        hosts: &mut BTreeMap<u64, HostQueue>,
        stats: &mut IocStats,
    ) {
        let mut frames: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
        for (i, &(_, len)) in self.queued.iter().enumerate() {
            frames[i] = &self.arena[i * SLOT..i * SLOT + len];
        }
        let n = self.queued.len();
        let mut done = 0;
        while done < n {
            let (sent, failed) = match nic.send_batch(&frames[done..n]) {
                // The kernel took none and said nothing: count the first as refused rather
                // than try it forever.
                Ok(0) => (0, 1),
                Ok(k) => (k, 0),
                Err(e) => {
                    debug!("NIC refused a frame: {e}");
                    (0, 1)
                }
            };
            for &(from, len) in &self.queued[done..done + sent] {
                account(from, len, true, hosts, stats);
            }
            for &(from, len) in &self.queued[done + sent..done + sent + failed] {
                account(from, len, false, hosts, stats);
            }
            done += sent + failed;
        }
        self.queued.clear();
    }
}

/// Counts a frame of `len` bytes from session `from` as sent to the LAN, or refused by it.
fn account(
    from: u64,
    len: usize,
    sent: bool,
    hosts: &mut BTreeMap<u64, HostQueue>,
    stats: &mut IocStats,
) {
    let h = hosts.get_mut(&from);
    if sent {
        stats.lan_tx += 1;
        if let Some(h) = h {
            h.stats.tx_frames += 1;
            h.stats.tx_bytes += len as u64;
        }
    } else {
        stats.lan_tx_errors += 1;
        if let Some(h) = h {
            h.drop_tx(TxDrop::Nic);
        }
    }
}
