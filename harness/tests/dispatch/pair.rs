//! Two sides served the same request: their replies compared once what two
//! directories differ in (inode numbers, times, free counts) is masked.

use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{Attr, Dirent, EntryOut, Kstatfs, Opcode};
use vm_memory::ByteValued;

use crate::side::Side;
use crate::wire::{header, msg};

/// Zeroes what two directories differ in: an attribute's inode number and times,
/// a statfs's free counts.
pub(crate) fn masked(op: Opcode, mut reply: Vec<u8>) -> Vec<u8> {
    if reply.len() < 16 || header(&reply).error != 0 {
        return reply;
    }
    let mask_attr = |bytes: &mut [u8]| {
        let mut a = *Attr::from_slice(&bytes[..size_of::<Attr>()]).unwrap();
        (a.ino, a.atime, a.mtime, a.ctime) = (0, 0, 0, 0);
        (a.atimensec, a.mtimensec, a.ctimensec) = (0, 0, 0);
        bytes[..size_of::<Attr>()].copy_from_slice(a.as_slice());
    };
    let code = op as u32;
    let is = |o: Opcode| code == o as u32;
    let attr_at = if is(Opcode::Lookup) || is(Opcode::Mkdir) || is(Opcode::Create) {
        Some(16 + 40)
    } else if is(Opcode::Getattr) || is(Opcode::Setattr) {
        Some(16 + 16)
    } else {
        None
    };
    if let Some(at) = attr_at {
        if reply.len() >= at + size_of::<Attr>() {
            mask_attr(&mut reply[at..]);
        }
    }
    if is(Opcode::Readdir) || is(Opcode::Readdirplus) {
        // Entries (READDIRPLUS: an EntryOut before each), each a Dirent, its name and
        // padding to 8 bytes: every inode number and attribute masked.
        let (entry, dirent) = (size_of::<EntryOut>(), size_of::<Dirent>());
        let mut at = 16;
        while at < reply.len() {
            if is(Opcode::Readdirplus) {
                mask_attr(&mut reply[at + 40..]);
                at += entry;
            }
            let mut d = *Dirent::from_slice(&reply[at..at + dirent]).unwrap();
            let padded = (dirent + d.namelen as usize + 7) & !7;
            d.ino = 0;
            reply[at..at + dirent].copy_from_slice(d.as_slice());
            at += padded;
        }
    }
    if is(Opcode::Statfs) && reply.len() >= 16 + size_of::<Kstatfs>() {
        let mut st = *Kstatfs::from_slice(&reply[16..16 + size_of::<Kstatfs>()]).unwrap();
        (st.bfree, st.bavail, st.ffree) = (0, 0, 0);
        reply[16..16 + size_of::<Kstatfs>()].copy_from_slice(st.as_slice());
    }
    reply
}

pub(crate) struct Pair {
    pub(crate) a: Side,
    pub(crate) b: Side,
    pub(crate) unique: u64,
}

impl Pair {
    /// Serves one request on both sides; the replies must match. Returns ours.
    pub(crate) fn same(
        &mut self,
        what: &str,
        op: Opcode,
        node: u64,
        body: &[u8],
        len: Option<u32>,
        room: usize,
    ) -> Vec<u8> {
        self.unique += 1;
        let request = msg(op, node, self.unique, body, len);
        let ours = self.a.ours(&request, room);
        let reference = self.b.library(&request, room);
        assert_eq!(
            masked(op, ours.clone()),
            masked(op, reference.clone()),
            "{what}: ours {ours:?}\nreference {reference:?}"
        );
        ours
    }

    pub(crate) fn ok(&mut self, what: &str, op: Opcode, node: u64, body: &[u8]) -> Vec<u8> {
        let r = self.same(what, op, node, body, None, 16 + 4096);
        assert_eq!(header(&r).error, 0, "{what} failed: {:?}", header(&r));
        r
    }
}
