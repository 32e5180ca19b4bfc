//! Framing of channel-adapter operations on a byte-stream transport.
//!
//! Every operation is a 32-byte header followed by `length` payload bytes:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | opcode: 1 SEND, 2 RDMA WRITE, 3 RDMA WRITE WITH IMMEDIATE |
//! | 1 | 3 | reserved, zero |
//! | 4 | 4 | length of the payload |
//! | 8 | 8 | memory handle (writes; zero for SEND) |
//! | 16 | 8 | remote address (writes; zero for SEND) |
//! | 24 | 4 | immediate data (WRITE WITH IMMEDIATE; zero otherwise) |
//! | 28 | 4 | reserved, zero |

use thiserror::Error;

/// Bytes in an operation header.
pub const OP_HEADER_LEN: usize = 32;

mod field {
    use std::ops::Range;
    pub const OPCODE: usize = 0;
    pub const RESERVED0: Range<usize> = 1..4;
    pub const LENGTH: Range<usize> = 4..8;
    pub const HANDLE: Range<usize> = 8..16;
    pub const ADDR: Range<usize> = 16..24;
    pub const IMM: Range<usize> = 24..28;
    pub const RESERVED1: Range<usize> = 28..32;
}

/// The operation carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A message for the peer's receive queue.
    Send,
    /// An RDMA write with no completion at the target's consumer.
    Write {
        /// Target region handle (wire form).
        handle: u64,
        /// Target address.
        addr: u64,
    },
    /// An RDMA write whose completion carries 32 bits of immediate data.
    WriteImm {
        /// Target region handle (wire form).
        handle: u64,
        /// Target address.
        addr: u64,
        /// Immediate data.
        imm: u32,
    },
}

/// A parsed operation header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpHeader {
    /// What the operation does.
    pub op: Op,
    /// Payload bytes following the header.
    pub len: u32,
}

/// A malformed operation header.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OpError {
    /// The opcode is not 1, 2 or 3.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    /// A reserved or unused field is not zero.
    #[error("reserved field of a {0} operation is not zero")]
    Reserved(&'static str),
}

fn be32(b: &[u8; OP_HEADER_LEN], r: std::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8; OP_HEADER_LEN], r: std::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

impl OpHeader {
    /// Parses a header. Payload length limits are the receiver's business.
    pub fn parse(b: &[u8; OP_HEADER_LEN]) -> Result<OpHeader, OpError> {
        let len = be32(b, field::LENGTH);
        let handle = be64(b, field::HANDLE);
        let addr = be64(b, field::ADDR);
        let imm = be32(b, field::IMM);
        let reserved =
            b[field::RESERVED0].iter().any(|&x| x != 0) || be32(b, field::RESERVED1) != 0;
        let op = match b[field::OPCODE] {
            1 => {
                if reserved || handle != 0 || addr != 0 || imm != 0 {
                    return Err(OpError::Reserved("SEND"));
                }
                Op::Send
            }
            2 => {
                if reserved || imm != 0 {
                    return Err(OpError::Reserved("RDMA WRITE"));
                }
                Op::Write { handle, addr }
            }
            3 => {
                if reserved {
                    return Err(OpError::Reserved("RDMA WRITE WITH IMMEDIATE"));
                }
                Op::WriteImm { handle, addr, imm }
            }
            other => return Err(OpError::UnknownOpcode(other)),
        };
        Ok(OpHeader { op, len })
    }

    /// Encodes the header.
    pub fn emit(&self) -> [u8; OP_HEADER_LEN] {
        let mut b = [0u8; OP_HEADER_LEN];
        let (code, handle, addr, imm) = match self.op {
            Op::Send => (1, 0, 0, 0),
            Op::Write { handle, addr } => (2, handle, addr, 0),
            Op::WriteImm { handle, addr, imm } => (3, handle, addr, imm),
        };
        b[field::OPCODE] = code;
        b[field::LENGTH].copy_from_slice(&self.len.to_be_bytes());
        b[field::HANDLE].copy_from_slice(&handle.to_be_bytes());
        b[field::ADDR].copy_from_slice(&addr.to_be_bytes());
        b[field::IMM].copy_from_slice(&imm.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Send),
            (any::<u64>(), any::<u64>()).prop_map(|(handle, addr)| Op::Write { handle, addr }),
            (any::<u64>(), any::<u64>(), any::<u32>())
                .prop_map(|(handle, addr, imm)| Op::WriteImm { handle, addr, imm }),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(op in arb_op(), len: u32) {
            let h = OpHeader { op, len };
            prop_assert_eq!(OpHeader::parse(&h.emit()), Ok(h));
        }

        #[test]
        fn arbitrary_headers_never_panic(b in proptest::array::uniform32(any::<u8>())) {
            if let Ok(h) = OpHeader::parse(&b) {
                prop_assert_eq!(h.emit(), b);
            }
        }
    }

    #[test]
    fn golden_write_imm() {
        let h = OpHeader {
            op: Op::WriteImm {
                handle: 0x0000_0001_0000_0002,
                addr: 0x200_0000_0000,
                imm: 0x0705_0100,
            },
            len: 256,
        };
        let b = h.emit();
        assert_eq!(
            b,
            [
                3, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 2, 0, 0, 0, 0, 0, 7, 5, 1, 0,
                0, 0, 0, 0
            ]
        );
    }

    #[test]
    fn rejects_bad_headers() {
        let mut b = [0u8; OP_HEADER_LEN];
        b[0] = 9;
        assert_eq!(OpHeader::parse(&b), Err(OpError::UnknownOpcode(9)));
        b[0] = 1;
        b[10] = 1; // handle on a SEND
        assert!(matches!(OpHeader::parse(&b), Err(OpError::Reserved(_))));
        b[10] = 0;
        b[0] = 2;
        b[25] = 1; // immediate on a plain WRITE
        assert!(matches!(OpHeader::parse(&b), Err(OpError::Reserved(_))));
        b[25] = 0;
        b[30] = 1;
        b[0] = 3;
        assert!(matches!(OpHeader::parse(&b), Err(OpError::Reserved(_))));
    }
}
