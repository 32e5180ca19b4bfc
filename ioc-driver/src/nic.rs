//! The NIC as the IOC uses it: frames in and out, and its multicast filter.
//!
//! The daemon's NIC is an AF_PACKET socket ([`PacketSocket`]); the unit tests put a queue in
//! its place, so that forwarding, quotas and session ends run without root or an interface.

use splitnet_messaging::memory::SharedBytes;
use splitnet_messaging::sys::{fanout, packet::PacketSocket};
use std::io;

/// A network interface carrying frames with a virtio-net header in front.
pub trait Nic: std::fmt::Debug {
    /// Receives one frame into `buf`; `WouldBlock` when none is waiting.
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Receives up to `bufs.len()` frames, their lengths into `lens`; returns how many
    /// arrived (fewer when the NIC ran out; `WouldBlock` when none was waiting).
    fn recv_batch(&self, bufs: &mut [&mut [u8]], lens: &mut [usize]) -> io::Result<usize> {
        let mut got = 0;
        for (buf, len) in bufs.iter_mut().zip(lens.iter_mut()) {
            match self.recv(buf) {
                Ok(n) => *len = n,
                Err(e) if got == 0 => return Err(e),
                Err(_) => break,
            }
            got += 1;
        }
        Ok(got)
    }
    /// Sends one frame.
    fn send(&self, frame: &[u8]) -> io::Result<usize>;
    /// Sends one frame made of `head` (private) and `rest` (in a host's shared pool).
    fn send_parts(&self, head: &[u8], rest: &SharedBytes<'_>) -> io::Result<usize> {
        let mut frame = head.to_vec();
        frame.resize(head.len() + rest.len(), 0);
        rest.copy_out(0, &mut frame[head.len()..])
            .map_err(io::Error::other)?;
        self.send(&frame)
    }
    /// Sends frames in order until one fails; returns how many were sent (an error when
    /// the first failed).
    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        for (i, f) in frames.iter().enumerate() {
            if let Err(e) = self.send(f) {
                return if i == 0 { Err(e) } else { Ok(i) };
            }
        }
        Ok(frames.len())
    }
    /// Frames dropped on receive since the last call because the IOC's receive ring (the
    /// socket's buffer) was full.
    fn take_drops(&self) -> u64 {
        0
    }
    /// Joins (`join`) or leaves a link-layer multicast group.
    fn set_multicast(&self, group: [u8; 6], join: bool) -> io::Result<()>;
    /// Steers received frames for each MAC of `table` to the worker it names, the
    /// rest by flow hash (a NIC shared by workers); nothing for a NIC of one worker.
    fn steer(&self, table: &[([u8; 6], u32)]) -> io::Result<()> {
        let _ = table;
        Ok(())
    }
}

impl Nic for PacketSocket {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        PacketSocket::recv(self, buf)
    }

    /// One `recvmmsg(2)` for the whole batch.
    fn recv_batch(&self, bufs: &mut [&mut [u8]], lens: &mut [usize]) -> io::Result<usize> {
        PacketSocket::recv_batch(self, bufs, lens)
    }

    fn send(&self, frame: &[u8]) -> io::Result<usize> {
        PacketSocket::send(self, frame)
    }

    /// One `writev(2)`: the kernel copies the shared part itself.
    fn send_parts(&self, head: &[u8], rest: &SharedBytes<'_>) -> io::Result<usize> {
        PacketSocket::send_parts(self, head, rest)
    }

    /// One `sendmmsg(2)` for the whole batch.
    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        PacketSocket::send_batch(self, frames)
    }

    fn set_multicast(&self, group: [u8; 6], join: bool) -> io::Result<()> {
        PacketSocket::set_multicast(self, group, join)
    }

    /// `PACKET_STATISTICS` (a failed read counts nothing).
    fn take_drops(&self) -> u64 {
        PacketSocket::take_drops(self).unwrap_or(0)
    }

    /// The fanout group's program (see [`PacketSocket::join_fanout`]).
    fn steer(&self, table: &[([u8; 6], u32)]) -> io::Result<()> {
        self.set_fanout_program(&fanout::steering_program(table))
    }
}

#[cfg(test)]
pub mod fake {
    //! A NIC made of two queues, for tests.

    use super::Nic;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;
    use std::io;
    use std::rc::Rc;

    /// A MAC and the worker its frames go to.
    pub type Steer = ([u8; 6], u32);

    /// Frames waiting to be received, and frames sent, shared with the test.
    #[derive(Debug, Default, Clone)]
    pub struct FakeNic {
        /// Frames the IOC will receive, in order.
        pub rx: Rc<RefCell<VecDeque<Vec<u8>>>>,
        /// Frames the IOC sent, in order.
        pub tx: Rc<RefCell<Vec<Vec<u8>>>>,
        /// Frames of this length are refused, as by a full device queue.
        pub refuse_len: Rc<Cell<Option<usize>>>,
        /// Calls of `send` and `send_batch`.
        pub sends: Rc<Cell<usize>>,
        /// Receive drops the NIC reports at its next `take_drops`.
        pub drops: Rc<Cell<u64>>,
        /// The last steering table set.
        pub steering: Rc<RefCell<Vec<Steer>>>,
    }

    impl FakeNic {
        fn put(&self, frame: &[u8]) -> io::Result<usize> {
            if self.refuse_len.get() == Some(frame.len()) {
                return Err(io::Error::other("device queue full"));
            }
            self.tx.borrow_mut().push(frame.to_vec());
            Ok(frame.len())
        }
    }

    impl Nic for FakeNic {
        fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
            let frame = self
                .rx
                .borrow_mut()
                .pop_front()
                .ok_or(io::ErrorKind::WouldBlock)?;
            let n = frame.len().min(buf.len());
            buf[..n].copy_from_slice(&frame[..n]);
            Ok(n)
        }

        fn send(&self, frame: &[u8]) -> io::Result<usize> {
            self.sends.set(self.sends.get() + 1);
            self.put(frame)
        }

        fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
            self.sends.set(self.sends.get() + 1);
            for (i, f) in frames.iter().enumerate() {
                if let Err(e) = self.put(f) {
                    return if i == 0 { Err(e) } else { Ok(i) };
                }
            }
            Ok(frames.len())
        }

        fn set_multicast(&self, _: [u8; 6], _: bool) -> io::Result<()> {
            Ok(())
        }

        fn take_drops(&self) -> u64 {
            self.drops.take()
        }

        fn steer(&self, table: &[([u8; 6], u32)]) -> io::Result<()> {
            let mut t = table.to_vec();
            t.sort();
            *self.steering.borrow_mut() = t;
            Ok(())
        }
    }
}
