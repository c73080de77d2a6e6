//! Decoding of the FUSE requests fuse-backend-rs 0.14's `Server` does not serve as
//! volfsd needs: COPY_FILE_RANGE, SYNCFS and TMPFILE (answered ENOSYS there) and
//! SETLKW (served there without waiting).
//!
//! The Linux client sends all four; serving them keeps `cp --reflink=auto`,
//! `syncfs(2)`, `O_TMPFILE` and blocking `fcntl(F_SETLKW)` working in the guest.

use std::io;

use fuse_backend_rs::abi::fuse_abi::{
    CopyFileRangeIn, CreateIn, EntryOut, InHeader, LkIn, Opcode, OpenOut, WriteOut,
};
use fuse_backend_rs::api::filesystem::{Context, FileSystem};
use fuse_backend_rs::transport::{Reader, Writer};
use vm_memory::{bitmap::BitmapSlice, ByteValued};

use super::ops::{CopyRange, ExtraOps};
use super::reply::reply;

/// Opcodes fuse-backend-rs 0.14's `Opcode` enum lacks.
pub const OPCODE_SYNCFS: u32 = 50;
pub const OPCODE_TMPFILE: u32 = 51;
const OPCODE_COPY_FILE_RANGE: u32 = Opcode::CopyFileRange as u32;
/// fuse-backend-rs 0.14 decodes SETLKW but calls the non-blocking `setlk`, so a
/// guest's `fcntl(F_SETLKW)` would get EAGAIN instead of waiting: decoded here.
const OPCODE_SETLKW: u32 = Opcode::Setlkw as u32;

/// Whether `opcode` is served here rather than by fuse-backend-rs's server.
pub fn handles(opcode: u32) -> bool {
    matches!(
        opcode,
        OPCODE_COPY_FILE_RANGE | OPCODE_SYNCFS | OPCODE_TMPFILE | OPCODE_SETLKW
    )
}

/// Serves one request whose header is already read. Returns the reply length.
pub fn dispatch<F: ExtraOps + FileSystem<Inode = u64, Handle = u64>, S: BitmapSlice>(
    fs: &F,
    header: &InHeader,
    r: &mut Reader<'_, S>,
    w: &mut Writer<'_, S>,
) -> io::Result<usize> {
    let ctx = Context::from(header);
    let result: io::Result<Vec<u8>> = match header.opcode {
        OPCODE_COPY_FILE_RANGE => r
            .read_obj::<CopyFileRangeIn>()
            .map_err(|_| einval())
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
        OPCODE_SYNCFS => fs.syncfs(&ctx, header.nodeid).map(|_| Vec::new()),
        OPCODE_SETLKW => setlkw(fs, header, r).map(|_| Vec::new()),
        OPCODE_TMPFILE => r
            .read_obj::<CreateIn>()
            .map_err(|_| einval())
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
        Ok(body) => reply(w, header.unique, 0, &body),
        Err(e) => {
            let code = e.raw_os_error().unwrap_or(libc::EIO);
            reply(w, header.unique, -code, &[])
        }
    }
}

/// Decodes and runs a SETLKW: it blocks until the lock is granted, the wait is
/// interrupted (a detach, a new session) or fails. Its reply has no body.
pub fn setlkw<F: ExtraOps + FileSystem<Inode = u64, Handle = u64>, S: BitmapSlice>(
    fs: &F,
    header: &InHeader,
    r: &mut Reader<'_, S>,
) -> io::Result<()> {
    let a = r.read_obj::<LkIn>().map_err(|_| einval())?;
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
