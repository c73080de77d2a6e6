//! Decoding of the FUSE requests fuse-backend-rs 0.14's `Server` does not serve as
//! volfsd needs: COPY_FILE_RANGE, SYNCFS and TMPFILE (answered ENOSYS there) and
//! SETLKW (served there without waiting).
//!
//! The Linux client sends all four; serving them keeps `cp --reflink=auto`,
//! `syncfs(2)`, `O_TMPFILE` and blocking `fcntl(F_SETLKW)` working in the guest.

use std::io;

use fuse_backend_rs::abi::fuse_abi::{
    CopyFileRangeIn, CreateIn, EntryOut, InHeader, LkIn, OpenOut, WriteOut,
};
use fuse_backend_rs::api::filesystem::{Context, FileSystem};
use vm_memory::ByteValued;

use super::buffers::{self, Reply};
use super::ops::{CopyRange, ExtraOps};
use crate::fuse_ops::opcode;

/// The fixed-size arguments after the header of `request`, its local copy.
fn args<T: ByteValued + Default>(request: &[u8]) -> io::Result<T> {
    let start = std::mem::size_of::<InHeader>();
    let bytes = request
        .get(start..start + std::mem::size_of::<T>())
        .ok_or_else(einval)?;
    let mut value = T::default();
    value.as_mut_slice().copy_from_slice(bytes);
    Ok(value)
}

/// Serves one of the four (`request`: its local copy, header included), for
/// `dispatch.rs`. Returns the reply length. (fuse-backend-rs 0.14 answers SYNCFS,
/// TMPFILE and COPY_FILE_RANGE ENOSYS, and serves SETLKW with the non-blocking
/// `setlk`: the guest's `fcntl(F_SETLKW)` would get EAGAIN instead of waiting.)
pub fn serve<F: ExtraOps + FileSystem<Inode = u64, Handle = u64>, R: Reply>(
    fs: &F,
    header: &InHeader,
    request: &[u8],
    w: &mut R,
) -> io::Result<usize> {
    let ctx = Context::from(header);
    let result: io::Result<Vec<u8>> = match header.opcode {
        opcode::COPY_FILE_RANGE => args::<CopyFileRangeIn>(request)
            .and_then(|a| {
                fs.copy_file_range(
                    &ctx,
                    CopyRange {
                        nodeid_in: header.nodeid,
                        fh_in: a.fh_in,
                        off_in: a.offset_in,
                        nodeid_out: a.nodeid_out,
                        fh_out: a.fh_out,
                        off_out: a.offset_out,
                        len: a.len,
                        flags: a.flags,
                    },
                )
            })
            .map(|n| {
                WriteOut {
                    size: n.min(u32::MAX as usize) as u32,
                    padding: 0,
                }
                .as_slice()
                .to_vec()
            }),
        opcode::SYNCFS => fs.syncfs(&ctx, header.nodeid).map(|_| Vec::new()),
        opcode::SETLKW => setlkw(fs, header, request).map(|_| Vec::new()),
        opcode::TMPFILE => args::<CreateIn>(request)
            .and_then(|args| fs.tmpfile(&ctx, header.nodeid, args))
            .map(|(entry, fh, opts)| {
                let mut out = EntryOut::from(entry).as_slice().to_vec();
                out.extend_from_slice(
                    OpenOut {
                        fh,
                        open_flags: opts.bits(),
                        passthrough: 0,
                    }
                    .as_slice(),
                );
                out
            }),
        _ => Err(io::Error::from_raw_os_error(libc::ENOSYS)),
    };
    match result {
        Ok(body) => buffers::ok(w, header.unique, &body),
        Err(e) => buffers::error(w, header.unique, e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// Decodes and runs a SETLKW: it blocks until the lock is granted, the wait is
/// interrupted (a detach, a new session) or fails. Its reply has no body.
pub fn setlkw<F: ExtraOps + FileSystem<Inode = u64, Handle = u64>>(
    fs: &F,
    header: &InHeader,
    request: &[u8],
) -> io::Result<()> {
    let a = args::<LkIn>(request)?;
    fs.setlkw(
        &Context::from(header),
        header.nodeid,
        a.fh,
        a.owner,
        a.lk.into(),
        a.lk_flags,
    )
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}
