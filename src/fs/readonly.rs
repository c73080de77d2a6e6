//! The read-only guard, the outermost layer of the stack, and the one place where
//! each request is counted against its volume on its way out.
//!
//! Review "is every mutation refused?" from the table below: `write` refuses the
//! operation with EROFS on a read-only volume, `read` lets it through, and every
//! `read`/`write` line counts one operation (and its error, if any) for the volume of
//! the node it names. The kernel enforces the same rule underneath (each read-only
//! volume is a read-only mount), so a mistake here still cannot write.

use std::cell::RefCell;
use std::ffi::CStr;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::SetattrValid;
use fuse_backend_rs::abi::fuse_abi::{stat64, statvfs64, CreateIn, FsOptions, OpenOptions};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileLock, GetxattrReply, ListxattrReply, ZeroCopyReader,
    ZeroCopyWriter,
};

use super::layer::fs_layer;
use super::share::{Share, ShareStats};
use super::sys::errno;
use super::volumes::VolumeFs;
use super::{CopyRange, ExtraOps};
use crate::metrics::{self, Op};

pub struct ReadOnlyGuard {
    inner: VolumeFs,
    /// Record each request's operation, duration and errno (`--no-metrics`: only the
    /// per-volume totals).
    metrics: bool,
}

/// Open flags that would let a handle change the file.
pub fn open_flags_mutate(flags: u32) -> bool {
    let flags = flags as libc::c_int;
    (flags & libc::O_ACCMODE) != libc::O_RDONLY
        || flags & (libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT) != 0
}

impl ReadOnlyGuard {
    pub fn new(inner: VolumeFs, metrics: bool) -> Self {
        crate::logging::set_request_context(current_request);
        ReadOnlyGuard { inner, metrics }
    }

    pub fn inner(&self) -> &VolumeFs {
        &self.inner
    }

    /// Runs `run`, the operation `op` on `node`: refused with EROFS if it `mutates`
    /// a read-only volume, and counted for the volume (one lookup of its share),
    /// with its duration and errno unless metrics are off. Virtual directories belong
    /// to no volume and are not counted.
    fn guard<T>(
        &self,
        op: Op,
        node: u64,
        mutates: bool,
        run: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let Some(share) = self.inner.share_of(node) else {
            return run();
        };
        let started = self.metrics.then(metrics::request_clock);
        if started.is_none() {
            // With metrics on, the metrics count the request.
            ShareStats::add(&share.stats.ops, 1);
        }
        // The share is this thread's current request while it runs: every log line
        // written meanwhile names its volume and operation.
        let refused = mutates && share.read_only;
        let (share, r) = in_request(share, op, || {
            let r = if refused {
                Err(errno(libc::EROFS))
            } else {
                run()
            };
            if let Err(e) = &r {
                log::debug!("{} failed: {e}", op.name());
            }
            r
        });
        if let Err(e) = &r {
            count_error(Some(&share));
            if let Some(t) = started {
                let code = e.raw_os_error().unwrap_or(libc::EIO);
                share
                    .stats
                    .metrics
                    .record(op, metrics::request_done(t), Some(code));
            }
        } else if let Some(t) = started {
            share
                .stats
                .metrics
                .record(op, metrics::request_done(t), None);
        }
        r
    }

    /// The read-only check alone, for the second node of a rename.
    fn refuse_if_read_only(&self, node: u64) -> io::Result<()> {
        match self.inner.share_of(node) {
            Some(s) if s.read_only => {
                count_error(Some(&s));
                Err(errno(libc::EROFS))
            }
            _ => Ok(()),
        }
    }
}

thread_local! {
    /// The volume and operation this thread is serving, for the log's fields.
    static CURRENT: RefCell<Option<(Arc<Share>, Op)>> = const { RefCell::new(None) };
}

/// Runs `f` with `share` and `op` as this thread's current request, and gives the
/// share back (moved in and out: no reference count is touched). The request
/// before it comes back even if `f` unwinds.
fn in_request<T>(share: Arc<Share>, op: Op, f: impl FnOnce() -> T) -> (Arc<Share>, T) {
    struct Restore(Option<(Arc<Share>, Op)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = outer);
        }
    }
    let restore = Restore(CURRENT.with(|c| c.replace(Some((share, op)))));
    let r = f();
    let (share, _) = CURRENT
        .with(|c| c.take())
        .expect("the current request is set while it runs");
    drop(restore);
    (share, r)
}

/// Calls `f` with the volume and operation of the request this thread is serving,
/// if any: the log's [`crate::logging::RequestContext`], registered by
/// [`ReadOnlyGuard::new`].
fn current_request(f: &mut crate::logging::RequestSink<'_>) {
    CURRENT.with(|c| match c.try_borrow() {
        Ok(current) => f(current.as_ref().map(|(s, op)| (s.name.as_str(), op.name()))),
        Err(_) => f(None),
    })
}

fn count_error(share: Option<&Share>) {
    if let Some(s) = share {
        ShareStats::add(&s.stats.errors, 1);
    }
}

fs_layer! {
    self: ReadOnlyGuard => inner;
    fn init(capable: FsOptions) -> io::Result<FsOptions> = pass;
    fn destroy() = pass;
    fn forget(ctx: &Context, inode: u64, count: u64) = pass;
    fn batch_forget(ctx: &Context, requests: Vec<(u64, u64)>) = pass;
    fn lookup(ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> = read(parent);
    fn getattr(ctx: &Context, inode: u64, handle: Option<u64>)
        -> io::Result<(stat64, Duration)> = read(inode);
    fn setattr(ctx: &Context, inode: u64, attr: stat64, handle: Option<u64>, valid: SetattrValid)
        -> io::Result<(stat64, Duration)> = write(inode);
    fn readlink(ctx: &Context, inode: u64) -> io::Result<Vec<u8>> = read(inode);
    fn symlink(ctx: &Context, linkname: &CStr, parent: u64, name: &CStr)
        -> io::Result<Entry> = write(parent);
    fn mknod(ctx: &Context, parent: u64, name: &CStr, mode: u32, rdev: u32, umask: u32)
        -> io::Result<Entry> = write(parent);
    fn mkdir(ctx: &Context, parent: u64, name: &CStr, mode: u32, umask: u32)
        -> io::Result<Entry> = write(parent);
    fn unlink(ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> = write(parent);
    fn rmdir(ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> = write(parent);
    fn rename(ctx: &Context, olddir: u64, oldname: &CStr, newdir: u64, newname: &CStr, flags: u32)
        -> io::Result<()> = own => {
            self.refuse_if_read_only(newdir)?;
            self.guard(Op::rename, olddir, true, || {
                self.inner.rename(ctx, olddir, oldname, newdir, newname, flags)
            })
        };
    fn link(ctx: &Context, inode: u64, newparent: u64, newname: &CStr)
        -> io::Result<Entry> = write(newparent);
    fn open(ctx: &Context, inode: u64, flags: u32, fuse_flags: u32)
        -> io::Result<(Option<u64>, OpenOptions, Option<u32>)>
        = write_if(inode, open_flags_mutate(flags));
    fn create(ctx: &Context, parent: u64, name: &CStr, args: CreateIn)
        -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> = write(parent);
    fn read(ctx: &Context, inode: u64, handle: u64, w: &mut dyn ZeroCopyWriter, size: u32,
        offset: u64, lock_owner: Option<u64>, flags: u32) -> io::Result<usize> = read(inode);
    fn write(ctx: &Context, inode: u64, handle: u64, r: &mut dyn ZeroCopyReader, size: u32,
        offset: u64, lock_owner: Option<u64>, delayed_write: bool, flags: u32, fuse_flags: u32)
        -> io::Result<usize> = write(inode);
    fn flush(ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()>
        = read(inode);
    fn fsync(ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()>
        = read(inode);
    fn fallocate(ctx: &Context, inode: u64, handle: u64, mode: u32, offset: u64, length: u64)
        -> io::Result<()> = write(inode);
    fn release(ctx: &Context, inode: u64, flags: u32, handle: u64, flush: bool,
        flock_release: bool, lock_owner: Option<u64>) -> io::Result<()> = read(inode);
    fn statfs(ctx: &Context, inode: u64) -> io::Result<statvfs64> = read(inode);
    fn setxattr(ctx: &Context, inode: u64, name: &CStr, value: &[u8], flags: u32)
        -> io::Result<()> = write(inode);
    fn getxattr(ctx: &Context, inode: u64, name: &CStr, size: u32)
        -> io::Result<GetxattrReply> = read(inode);
    fn listxattr(ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply>
        = read(inode);
    fn removexattr(ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> = write(inode);
    fn opendir(ctx: &Context, inode: u64, flags: u32) -> io::Result<(Option<u64>, OpenOptions)>
        = read(inode);
    fn readdir(ctx: &Context, inode: u64, handle: u64, size: u32, offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>) -> io::Result<()>
        = read(inode);
    fn readdirplus(ctx: &Context, inode: u64, handle: u64, size: u32, offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>) -> io::Result<()>
        = read(inode);
    fn fsyncdir(ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()>
        = read(inode);
    fn releasedir(ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()>
        = read(inode);
    fn access(ctx: &Context, inode: u64, mask: u32) -> io::Result<()>
        = write_if(inode, mask & libc::W_OK as u32 != 0);
    fn lseek(ctx: &Context, inode: u64, handle: u64, offset: u64, whence: u32)
        -> io::Result<u64> = read(inode);
    fn getlk(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock, flags: u32)
        -> io::Result<FileLock> = read(inode);
    fn setlk(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock, flags: u32)
        -> io::Result<()> = read(inode);
    fn setlkw(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock, flags: u32)
        -> io::Result<()> = read(inode);
}

impl ExtraOps for ReadOnlyGuard {
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        args: CreateIn,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        self.guard(Op::tmpfile, parent, true, || {
            self.inner.tmpfile(ctx, parent, args)
        })
    }

    fn copy_file_range(&self, ctx: &Context, range: CopyRange) -> io::Result<usize> {
        self.guard(Op::copy_file_range, range.nodeid_out, true, || {
            self.inner.copy_file_range(ctx, range)
        })
    }

    fn syncfs(&self, ctx: &Context, nodeid: u64) -> io::Result<()> {
        self.guard(Op::syncfs, nodeid, false, || self.inner.syncfs(ctx, nodeid))
    }
}
