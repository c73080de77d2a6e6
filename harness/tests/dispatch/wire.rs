//! The bytes of a request and of a reply: building a FUSE message, reading a reply's
//! header, entry and handle.

use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{EntryOut, InHeader, Opcode, OutHeader};
use vm_memory::ByteValued;

pub(crate) const HDR: usize = size_of::<InHeader>();
/// SETATTR's valid bits (private in fuse-backend-rs).
pub(crate) const FATTR_MODE: u32 = 0x1;
pub(crate) const FATTR_SIZE: u32 = 0x8;

/// A request: header (its length: the bytes, or `len`), then `body`.
pub(crate) fn msg(op: Opcode, node: u64, unique: u64, body: &[u8], len: Option<u32>) -> Vec<u8> {
    let mut m = InHeader {
        len: len.unwrap_or((HDR + body.len()) as u32),
        opcode: op as u32,
        unique,
        nodeid: node,
        uid: 0,
        gid: 0,
        pid: 1,
        padding: 0,
    }
    .as_slice()
    .to_vec();
    m.extend_from_slice(body);
    m
}

pub(crate) fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

pub(crate) fn header(reply: &[u8]) -> OutHeader {
    *OutHeader::from_slice(&reply[..16]).unwrap()
}

pub(crate) fn entry(reply: &[u8]) -> EntryOut {
    *EntryOut::from_slice(&reply[16..16 + size_of::<EntryOut>()]).unwrap()
}

pub(crate) fn fh(reply: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(reply[at..at + 8].try_into().unwrap())
}
