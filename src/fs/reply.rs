//! Writing a FUSE reply for the requests volfsd decodes itself.

use std::io::{self, Write};

use fuse_backend_rs::abi::fuse_abi::OutHeader;
use fuse_backend_rs::transport::Writer;
use vm_memory::{bitmap::BitmapSlice, ByteValued};

/// An error reply with no body.
pub fn reply_error<S: BitmapSlice>(
    w: &mut Writer<'_, S>,
    unique: u64,
    errno: i32,
) -> io::Result<usize> {
    reply(w, unique, -errno, &[])
}

/// A reply: the header and `body`, written in one piece.
pub fn reply<S: BitmapSlice>(
    w: &mut Writer<'_, S>,
    unique: u64,
    error: i32,
    body: &[u8],
) -> io::Result<usize> {
    let len = std::mem::size_of::<OutHeader>() + body.len();
    let header = OutHeader {
        len: len as u32,
        error,
        unique,
    };
    // One write of the whole reply: /dev/fuse takes a reply in a single write.
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(header.as_slice());
    msg.extend_from_slice(body);
    w.write_all(&msg)?;
    w.commit(None)?;
    Ok(len)
}
