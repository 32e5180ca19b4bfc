//! The in-process transport: a pair of bounded byte pipes.
//!
//! Both ends live in one thread (tests, benchmarks, fuzzing). A write to a full pipe and a
//! read from an empty one return `WouldBlock`, exactly like a non-blocking socket, so the
//! same channel code runs over it; a dropped end reads as end of stream at the other.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::rc::Rc;

#[derive(Debug)]
struct Buffer {
    bytes: VecDeque<u8>,
    capacity: usize,
    closed: bool,
}

/// One end of an in-process pipe pair.
#[derive(Debug)]
pub struct PipeEnd {
    rx: Rc<RefCell<Buffer>>,
    tx: Rc<RefCell<Buffer>>,
}

/// Two connected ends, each direction buffering at most `capacity` bytes.
pub fn pipe(capacity: usize) -> (PipeEnd, PipeEnd) {
    let mk = || {
        Rc::new(RefCell::new(Buffer {
            bytes: VecDeque::with_capacity(capacity),
            capacity,
            closed: false,
        }))
    };
    let (a, b) = (mk(), mk());
    (
        PipeEnd {
            rx: a.clone(),
            tx: b.clone(),
        },
        PipeEnd { rx: b, tx: a },
    )
}

impl PipeEnd {
    /// Bytes waiting to be read at this end.
    pub fn pending(&self) -> usize {
        self.rx.borrow().bytes.len()
    }
}

impl Drop for PipeEnd {
    fn drop(&mut self) {
        self.tx.borrow_mut().closed = true;
        self.rx.borrow_mut().closed = true;
    }
}

impl Read for PipeEnd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rx = self.rx.borrow_mut();
        if rx.bytes.is_empty() {
            return if rx.closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        rx.bytes.read(buf)
    }

    /// Fills the buffers in order, as `readv(2)` on a socket does.
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        let mut rx = self.rx.borrow_mut();
        if rx.bytes.is_empty() && bufs.iter().any(|b| !b.is_empty()) {
            return if rx.closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let mut n = 0;
        for b in bufs.iter_mut() {
            let k = rx.bytes.read(b)?;
            n += k;
            if k < b.len() {
                break;
            }
        }
        Ok(n)
    }
}

impl Write for PipeEnd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut tx = self.tx.borrow_mut();
        if tx.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = tx.capacity - tx.bytes.len();
        if room == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(room - n);
            tx.bytes.extend(&b[..take]);
            n += take;
            if n == room {
                break;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
