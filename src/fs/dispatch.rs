//! The requests volfsd decodes itself (their rows in `fuse_ops.rs` say so), rather
//! than fuse-backend-rs's `Server`: lookups, attributes, opens, reads and writes,
//! directory listings, releases, creates and removals, the forgets, and the four
//! the server does not serve as volfsd needs (`extra_ops.rs`). One `match` over the
//! opcode: each arm is an operation's handler. Each is decoded from the request's local copy as that server decodes it
//! and answered with the same bytes (`harness/tests/dispatch.rs` compares the two
//! on every opcode here), but written straight into the reply's buffers
//! ([`Reply`]): the server's writer over guest memory allocates a queue of slices
//! per request and walks the descriptor chain again, which cost a small request
//! about a third of the daemon's own instructions (docs/PROFILING.md).
//!
//! A request that cannot be decoded (too short for its arguments, a name without its
//! NUL) is [`Undecodable`]: the caller answers EINVAL, as it does for the server's
//! decoding errors.

use std::ffi::CStr;
use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{
    AccessIn, AttrOut, BatchForgetIn, CreateIn, Dirent, EntryOut, FlushIn, ForgetIn, ForgetOne,
    FsyncIn, GetattrIn, InHeader, Kstatfs, MkdirIn, OpenIn, OpenOut, ReadIn, ReleaseIn, Rename2In,
    RenameIn, SetattrIn, SetattrValid, WriteIn, WriteOut, FATTR_FH, GETATTR_FH, READ_LOCKOWNER,
    RELEASE_FLOCK_UNLOCK, RELEASE_FLUSH, WRITE_CACHE, WRITE_LOCKOWNER,
};
use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, FileSystem, ZeroCopyWriter};
use fuse_backend_rs::api::server::MAX_BUFFER_SIZE;
use vm_memory::ByteValued;

use super::buffers::{
    errno_of, error, finish, ok, LocalData, Reply, WriteData, HEADER, MAX_PAYLOAD, WRITE_PREFIX,
};
use super::extra_ops;
use super::stack::VolFs;
use crate::fuse_ops::opcode;

/// The request's header and the largest message after it that fuse-backend-rs
/// accepts (its `BUFFER_HEADER_SIZE` is 4 KiB): a longer one is answered ENOMEM.
const MAX_MESSAGE: u32 = MAX_BUFFER_SIZE + 0x1000;
const IN_HEADER: usize = size_of::<InHeader>();

/// Why a request got no reply from here.
#[derive(Debug)]
pub struct Undecodable(pub String);

/// The fixed-size arguments after the header (too few bytes: undecodable).
fn args<T: ByteValued + Default>(request: &[u8]) -> Result<T, Undecodable> {
    let bytes = request
        .get(IN_HEADER..IN_HEADER + size_of::<T>())
        .ok_or_else(|| {
            Undecodable(format!(
                "shorter than its {} argument bytes",
                size_of::<T>()
            ))
        })?;
    let mut value = T::default();
    value.as_mut_slice().copy_from_slice(bytes);
    Ok(value)
}

/// The variable part after the header and `fixed` bytes of arguments, up to the
/// length the header gives (which must be there).
fn body<'r>(header: &InHeader, request: &'r [u8], fixed: usize) -> Result<&'r [u8], Undecodable> {
    let start = IN_HEADER + fixed;
    let end = header.len as usize;
    if end < start || end > request.len() {
        return Err(Undecodable(format!(
            "header length {end} outside {start}..={}",
            request.len()
        )));
    }
    Ok(&request[start..end])
}

/// A name: the body up to its first NUL (none: undecodable).
fn cstr(bytes: &[u8]) -> Result<&CStr, Undecodable> {
    let nul = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| Undecodable("a name without its NUL".into()))?;
    CStr::from_bytes_with_nul(&bytes[..=nul]).map_err(|e| Undecodable(e.to_string()))
}

fn name<'r>(header: &InHeader, request: &'r [u8], fixed: usize) -> Result<&'r CStr, Undecodable> {
    cstr(body(header, request, fixed)?)
}

/// Two names one after the other (RENAME's old and new).
fn two_names<'r>(
    header: &InHeader,
    request: &'r [u8],
    fixed: usize,
) -> Result<(&'r CStr, &'r CStr), Undecodable> {
    let bytes = body(header, request, fixed)?;
    let first = cstr(bytes)?;
    let rest = &bytes[first.to_bytes_with_nul().len()..];
    if rest.is_empty() {
        return Err(Undecodable("a second name is missing".into()));
    }
    Ok((first, cstr(rest)?))
}

/// Serves one request whose row in the table (`fuse_ops.rs`) says volfsd decodes
/// it; returns its reply's length (0: it owes none). A WRITE's data is `write_data`
/// (None: it follows the WriteIn in `request`).
pub fn serve<R: Reply>(
    fs: &VolFs,
    header: &InHeader,
    request: &mut [u8],
    write_data: Option<&mut dyn WriteData>,
    reply: &mut R,
) -> Result<usize, Undecodable> {
    let unique = header.unique;
    let op = header.opcode;
    if matches!(op, opcode::READ | opcode::READDIR | opcode::READDIRPLUS) {
        let size = request
            .get(IN_HEADER..IN_HEADER + size_of::<ReadIn>())
            .and_then(ReadIn::from_slice)
            .map(|r| r.size);
        if size.is_some_and(|s| s > MAX_PAYLOAD) {
            return written(error(reply, unique, libc::EINVAL));
        }
    }
    if op == opcode::WRITE {
        return written(write(fs, header, request, write_data, reply));
    }
    let forget = op == opcode::FORGET || op == opcode::BATCH_FORGET;
    if header.len > MAX_MESSAGE {
        if forget {
            return Err(Undecodable("a forget longer than a message".into()));
        }
        return written(error(reply, unique, libc::ENOMEM));
    }
    let ctx = Context::from(header);
    let node = header.nodeid;
    // An empty reply, or the operation's errno.
    let empty = |reply: &mut R, r: std::io::Result<()>| match r {
        Ok(()) => written(ok(reply, unique, &[])),
        Err(e) => written(error(reply, unique, errno_of(&e))),
    };
    match op {
        opcode::LOOKUP => {
            let name = name(header, request, 0)?;
            match fs.lookup(&ctx, node, name) {
                Ok(entry) => written(ok(reply, unique, EntryOut::from(entry).as_slice())),
                Err(e) => written(error(reply, unique, errno_of(&e))),
            }
        }
        opcode::FORGET => {
            let ForgetIn { nlookup } = args(request)?;
            fs.forget(&ctx, node, nlookup);
            Ok(0)
        }
        opcode::BATCH_FORGET => {
            let BatchForgetIn { count, .. } = args(request)?;
            let fixed = IN_HEADER + size_of::<BatchForgetIn>();
            let max = (MAX_MESSAGE as usize - fixed) / size_of::<ForgetOne>();
            if count as usize > max {
                return Err(Undecodable(format!("a batch of {count} forgets")));
            }
            let one = size_of::<ForgetOne>();
            let list = request
                .get(fixed..fixed + count as usize * one)
                .ok_or_else(|| Undecodable(format!("shorter than its {count} forgets")))?;
            let forgets = list
                .chunks_exact(one)
                .map(|c| {
                    let mut f = ForgetOne::default();
                    f.as_mut_slice().copy_from_slice(c);
                    (f.nodeid, f.nlookup)
                })
                .collect();
            fs.batch_forget(&ctx, forgets);
            Ok(0)
        }
        opcode::GETATTR => {
            let GetattrIn { flags, fh, .. } = args(request)?;
            let handle = (flags & GETATTR_FH != 0).then_some(fh);
            attr(reply, unique, fs.getattr(&ctx, node, handle))
        }
        opcode::SETATTR => {
            let setattr: SetattrIn = args(request)?;
            let handle = (setattr.valid & FATTR_FH != 0).then_some(setattr.fh);
            let valid = SetattrValid::from_bits_truncate(setattr.valid);
            attr(
                reply,
                unique,
                fs.setattr(&ctx, node, setattr.into(), handle, valid),
            )
        }
        opcode::MKDIR => {
            let MkdirIn { mode, umask } = args(request)?;
            let name = name(header, request, size_of::<MkdirIn>())?;
            match fs.mkdir(&ctx, node, name, mode, umask) {
                Ok(entry) => written(ok(reply, unique, EntryOut::from(entry).as_slice())),
                Err(e) => written(error(reply, unique, errno_of(&e))),
            }
        }
        opcode::UNLINK => {
            let name = name(header, request, 0)?;
            empty(reply, fs.unlink(&ctx, node, name))
        }
        opcode::RMDIR => {
            let name = name(header, request, 0)?;
            empty(reply, fs.rmdir(&ctx, node, name))
        }
        opcode::RENAME => {
            let RenameIn { newdir } = args(request)?;
            let (old, new) = two_names(header, request, size_of::<RenameIn>())?;
            empty(reply, fs.rename(&ctx, node, old, newdir, new, 0))
        }
        opcode::RENAME2 => {
            let Rename2In { newdir, flags, .. } = args(request)?;
            let flags =
                flags & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE | libc::RENAME_WHITEOUT);
            let (old, new) = two_names(header, request, size_of::<Rename2In>())?;
            empty(reply, fs.rename(&ctx, node, old, newdir, new, flags))
        }
        opcode::OPEN => {
            let OpenIn { flags, fuse_flags } = args(request)?;
            match fs.open(&ctx, node, flags, fuse_flags) {
                Ok((handle, opts, passthrough)) => {
                    let out = OpenOut {
                        fh: handle.unwrap_or(0),
                        open_flags: opts.bits(),
                        passthrough: passthrough.unwrap_or_default(),
                    };
                    written(ok(reply, unique, out.as_slice()))
                }
                Err(e) => written(error(reply, unique, errno_of(&e))),
            }
        }
        opcode::READ => {
            let r: ReadIn = args(request)?;
            let owner = (r.read_flags & READ_LOCKOWNER != 0).then_some(r.lock_owner);
            reply.clear_body();
            let data: &mut dyn ZeroCopyWriter = reply;
            match fs.read(&ctx, node, r.fh, data, r.size, r.offset, owner, r.flags) {
                Ok(_) => written(finish(reply, unique, 0)),
                Err(e) => written(error(reply, unique, errno_of(&e))),
            }
        }
        opcode::STATFS => match fs.statfs(&ctx, node) {
            Ok(st) => written(ok(reply, unique, Kstatfs::from(st).as_slice())),
            Err(e) => written(error(reply, unique, errno_of(&e))),
        },
        opcode::RELEASE => {
            let r: ReleaseIn = args(request)?;
            let flush = r.release_flags & RELEASE_FLUSH != 0;
            let flock_release = r.release_flags & RELEASE_FLOCK_UNLOCK != 0;
            let owner = (flush || flock_release).then_some(r.lock_owner);
            empty(
                reply,
                fs.release(&ctx, node, r.flags, r.fh, flush, flock_release, owner),
            )
        }
        opcode::FSYNC => {
            let FsyncIn {
                fh, fsync_flags, ..
            } = args(request)?;
            empty(reply, fs.fsync(&ctx, node, fsync_flags & 1 != 0, fh))
        }
        opcode::FLUSH => {
            let FlushIn { fh, lock_owner, .. } = args(request)?;
            empty(reply, fs.flush(&ctx, node, fh, lock_owner))
        }
        opcode::OPENDIR => {
            let OpenIn { flags, .. } = args(request)?;
            match fs.opendir(&ctx, node, flags) {
                Ok((handle, opts)) => {
                    let out = OpenOut {
                        fh: handle.unwrap_or(0),
                        open_flags: opts.bits(),
                        ..Default::default()
                    };
                    written(ok(reply, unique, out.as_slice()))
                }
                Err(e) => written(error(reply, unique, errno_of(&e))),
            }
        }
        opcode::READDIR | opcode::READDIRPLUS => {
            let r: ReadIn = args(request)?;
            readdir(fs, &ctx, node, &r, op == opcode::READDIRPLUS, reply, unique)
        }
        opcode::RELEASEDIR => {
            let ReleaseIn { fh, flags, .. } = args(request)?;
            empty(reply, fs.releasedir(&ctx, node, flags, fh))
        }
        opcode::FSYNCDIR => {
            let FsyncIn {
                fh, fsync_flags, ..
            } = args(request)?;
            empty(reply, fs.fsyncdir(&ctx, node, fsync_flags & 1 != 0, fh))
        }
        opcode::ACCESS => {
            let AccessIn { mask, .. } = args(request)?;
            empty(reply, fs.access(&ctx, node, mask))
        }
        opcode::CREATE => {
            let create: CreateIn = args(request)?;
            let name = name(header, request, size_of::<CreateIn>())?;
            match fs.create(&ctx, node, name, create) {
                Ok((entry, handle, opts, passthrough)) => {
                    let open = OpenOut {
                        fh: handle.unwrap_or(0),
                        open_flags: opts.bits(),
                        passthrough: passthrough.unwrap_or_default(),
                    };
                    let entry = EntryOut {
                        nodeid: entry.inode,
                        generation: entry.generation,
                        entry_valid: entry.entry_timeout.as_secs(),
                        attr_valid: entry.attr_timeout.as_secs(),
                        entry_valid_nsec: entry.entry_timeout.subsec_nanos(),
                        attr_valid_nsec: entry.attr_timeout.subsec_nanos(),
                        attr: entry.attr.into(),
                    };
                    let mut body = [0u8; size_of::<EntryOut>() + size_of::<OpenOut>()];
                    body[..size_of::<EntryOut>()].copy_from_slice(entry.as_slice());
                    body[size_of::<EntryOut>()..].copy_from_slice(open.as_slice());
                    written(ok(reply, unique, &body))
                }
                Err(e) => written(error(reply, unique, errno_of(&e))),
            }
        }
        opcode::SETLKW | opcode::COPY_FILE_RANGE | opcode::SYNCFS | opcode::TMPFILE => {
            written(extra_ops::serve(fs, header, request, reply))
        }
        _ => Err(Undecodable(format!("opcode {op} has no handler here"))),
    }
}

/// WRITE: its data read in place from the guest's buffers (`write_data`), or from the
/// local copy after its WriteIn.
fn write<R: Reply>(
    fs: &VolFs,
    header: &InHeader,
    request: &mut [u8],
    write_data: Option<&mut dyn WriteData>,
    reply: &mut R,
) -> std::io::Result<usize> {
    let Some(args) = request
        .get(IN_HEADER..WRITE_PREFIX)
        .and_then(WriteIn::from_slice)
        .copied()
    else {
        return error(reply, header.unique, libc::EINVAL);
    };
    let mut local;
    let data: &mut dyn WriteData = match write_data {
        Some(d) => d,
        None => {
            local = LocalData::new(&mut request[WRITE_PREFIX..]);
            &mut local
        }
    };
    if args.size > MAX_PAYLOAD || args.size as usize > data.remaining() {
        return error(reply, header.unique, libc::EINVAL);
    }
    let owner = (args.fuse_flags & WRITE_LOCKOWNER != 0).then_some(args.lock_owner);
    let delayed = args.fuse_flags & WRITE_CACHE != 0;
    let ctx = Context::from(header);
    match fs.write(
        &ctx,
        header.nodeid,
        args.fh,
        data,
        args.size,
        args.offset,
        owner,
        delayed,
        args.flags,
        args.fuse_flags,
    ) {
        Ok(n) => {
            let out = WriteOut {
                size: n as u32,
                padding: 0,
            };
            ok(reply, header.unique, out.as_slice())
        }
        Err(e) => error(reply, header.unique, errno_of(&e)),
    }
}

/// READDIR and READDIRPLUS: as many entries as fit in the size asked for, each
/// padded to 8 bytes (READDIRPLUS: each after its lookup's entry).
fn readdir<R: Reply>(
    fs: &VolFs,
    ctx: &Context,
    node: u64,
    r: &ReadIn,
    plus: bool,
    reply: &mut R,
    unique: u64,
) -> Result<usize, Undecodable> {
    reply.clear_body();
    // The buffers must take the size asked for, header included (fuse-backend-rs
    // answers ENOMEM otherwise).
    if reply.available_bytes() + HEADER < r.size as usize {
        return written(error(reply, unique, libc::ENOMEM));
    }
    let max = r.size as usize;
    // The entries are assembled here and written to the reply's buffers in one
    // copy: written one piece at a time (four per entry) they cost more than the
    // lookups' system calls' wrappers.
    LISTING.with(|listing| {
        let mut body = listing.borrow_mut();
        body.clear();
        let mut add = |d: DirEntry, entry: Option<Entry>| -> std::io::Result<usize> {
            let dirent_len = size_of::<Dirent>() + d.name.len();
            let padded = (dirent_len + 7) & !7;
            let total = padded
                + if entry.is_some() {
                    size_of::<EntryOut>()
                } else {
                    0
                };
            // What does not fit is left for the next READDIR.
            if max.saturating_sub(body.len()) < total {
                return Ok(0);
            }
            if let Some(entry) = entry {
                body.extend_from_slice(EntryOut::from(entry).as_slice());
            }
            let dirent = Dirent {
                ino: d.ino,
                off: d.offset,
                namelen: d.name.len() as u32,
                type_: d.type_,
            };
            body.extend_from_slice(dirent.as_slice());
            body.extend_from_slice(d.name);
            body.extend_from_slice(&[0u8; 8][..padded - dirent_len]);
            Ok(total)
        };
        let result = if plus {
            fs.readdirplus(ctx, node, r.fh, r.size, r.offset, &mut |d, e| {
                add(d, Some(e))
            })
        } else {
            fs.readdir(ctx, node, r.fh, r.size, r.offset, &mut |d| add(d, None))
        };
        let answer = match result {
            Ok(()) => ok(reply, unique, &body),
            Err(e) => error(reply, unique, errno_of(&e)),
        };
        // A large listing does not keep its buffer in every worker for good.
        if body.capacity() > KEPT_LISTING {
            *body = Vec::new();
        }
        written(answer)
    })
}

thread_local! {
    /// A worker's READDIR reply, assembled before it is copied to the guest.
    static LISTING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Listing buffer capacity a worker keeps between READDIRs.
const KEPT_LISTING: usize = 64 * 1024;

/// An attribute reply (GETATTR, SETATTR).
fn attr<R: Reply>(
    reply: &mut R,
    unique: u64,
    result: std::io::Result<(fuse_backend_rs::abi::fuse_abi::stat64, std::time::Duration)>,
) -> Result<usize, Undecodable> {
    match result {
        Ok((st, timeout)) => {
            let out = AttrOut {
                attr_valid: timeout.as_secs(),
                attr_valid_nsec: timeout.subsec_nanos(),
                dummy: 0,
                attr: st.into(),
            };
            written(ok(reply, unique, out.as_slice()))
        }
        Err(e) => written(error(reply, unique, errno_of(&e))),
    }
}

/// A reply that could not be written (its buffers too short) is no reply.
fn written(r: std::io::Result<usize>) -> Result<usize, Undecodable> {
    r.map_err(|e| Undecodable(format!("writing the reply: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_backend_rs::abi::fuse_abi::Opcode;

    fn request(opcode: Opcode, len: u32, rest: &[u8]) -> Vec<u8> {
        let mut r = InHeader {
            len,
            opcode: opcode as u32,
            unique: 1,
            nodeid: 1,
            ..Default::default()
        }
        .as_slice()
        .to_vec();
        r.extend_from_slice(rest);
        r
    }

    #[test]
    fn names_are_cut_at_the_header_length_and_need_their_nul() {
        let r = request(Opcode::Lookup, 44, b"abc\0junk");
        let h = InHeader::from_slice(&r[..IN_HEADER]).unwrap();
        assert_eq!(name(h, &r, 0).unwrap().to_bytes(), b"abc");
        // The header's length cuts the NUL off: undecodable.
        let r = request(Opcode::Lookup, 43, b"abc\0");
        let h = InHeader::from_slice(&r[..IN_HEADER]).unwrap();
        assert!(name(h, &r, 0).is_err());
        // A length past the bytes there: undecodable.
        let r = request(Opcode::Lookup, 60, b"abc\0");
        let h = InHeader::from_slice(&r[..IN_HEADER]).unwrap();
        assert!(name(h, &r, 0).is_err());
    }

    #[test]
    fn a_rename_needs_both_names() {
        let fixed = size_of::<RenameIn>();
        let mut rest = vec![0u8; fixed];
        rest.extend_from_slice(b"old\0new\0");
        let r = request(Opcode::Rename, (IN_HEADER + rest.len()) as u32, &rest);
        let h = *InHeader::from_slice(&r[..IN_HEADER]).unwrap();
        let (a, b) = two_names(&h, &r, fixed).unwrap();
        assert_eq!((a.to_bytes(), b.to_bytes()), (&b"old"[..], &b"new"[..]));
        let r = request(Opcode::Rename, (IN_HEADER + fixed + 4) as u32, &rest);
        let h = *InHeader::from_slice(&r[..IN_HEADER]).unwrap();
        assert!(two_names(&h, &r, fixed).is_err());
    }

    #[test]
    fn arguments_shorter_than_their_struct_are_undecodable() {
        let r = request(Opcode::Getattr, 50, &[0; 10]);
        assert!(args::<GetattrIn>(&r).is_err());
        let r = request(Opcode::Getattr, 56, &[0; 16]);
        assert!(args::<GetattrIn>(&r).is_ok());
    }
}
