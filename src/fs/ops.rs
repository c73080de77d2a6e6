//! Every FUSE operation volfsd serves, listed once ([`for_each_op!`]): its signature,
//! the node it acts on, and whether it may change that node. Each layer is generated
//! from this list (`layer.rs`) and says only what it does differently; the read-only
//! guard says nothing at all, so "is every mutation refused?" is reviewed here.
//!
//! The columns after `=`:
//! - `read(node)`: looks at `node` and changes nothing;
//! - `write(node)`: may change `node` (refused on a read-only volume), and
//!   `write(node, other)` changes a second node too (rename's target directory);
//! - `write_if(node, cond)`: a write when `cond` holds (an open for writing);
//! - nothing: not about one node (INIT, DESTROY, the forgets), never refused.
//!
//! `fuse` holds the methods of fuse-backend-rs's `FileSystem` trait; `extra` the
//! requests its server does not serve as volfsd needs, declared here as [`ExtraOps`]
//! and decoded in `extra_ops.rs`. Trait methods not listed keep their default
//! (ENOSYS): IOCTL, BMAP, POLL and the DAX mappings, which volfsd does not serve.

/// Calls `cb! { pre.. fuse { ops.. } extra { ops.. } }` with the list of operations.
macro_rules! for_each_op {
    ($cb:path { $($pre:tt)* }) => {
        $cb! { $($pre)*
            fuse {
                fn init(capable: FsOptions) -> io::Result<FsOptions>;
                fn destroy();
                fn forget(ctx: &Context, inode: u64, count: u64);
                fn batch_forget(ctx: &Context, requests: Vec<(u64, u64)>);
                fn lookup(ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry>
                    = read(parent);
                fn getattr(ctx: &Context, inode: u64, handle: Option<u64>)
                    -> io::Result<(stat64, Duration)> = read(inode);
                fn setattr(ctx: &Context, inode: u64, attr: stat64, handle: Option<u64>,
                    valid: SetattrValid) -> io::Result<(stat64, Duration)> = write(inode);
                fn readlink(ctx: &Context, inode: u64) -> io::Result<Vec<u8>> = read(inode);
                fn symlink(ctx: &Context, linkname: &CStr, parent: u64, name: &CStr)
                    -> io::Result<Entry> = write(parent);
                fn mknod(ctx: &Context, parent: u64, name: &CStr, mode: u32, rdev: u32,
                    umask: u32) -> io::Result<Entry> = write(parent);
                fn mkdir(ctx: &Context, parent: u64, name: &CStr, mode: u32, umask: u32)
                    -> io::Result<Entry> = write(parent);
                fn unlink(ctx: &Context, parent: u64, name: &CStr) -> io::Result<()>
                    = write(parent);
                fn rmdir(ctx: &Context, parent: u64, name: &CStr) -> io::Result<()>
                    = write(parent);
                fn rename(ctx: &Context, olddir: u64, oldname: &CStr, newdir: u64,
                    newname: &CStr, flags: u32) -> io::Result<()> = write(olddir, newdir);
                fn link(ctx: &Context, inode: u64, newparent: u64, newname: &CStr)
                    -> io::Result<Entry> = write(newparent);
                fn open(ctx: &Context, inode: u64, flags: u32, fuse_flags: u32)
                    -> io::Result<(Option<u64>, OpenOptions, Option<u32>)>
                    = write_if(inode, open_flags_mutate(flags));
                fn create(ctx: &Context, parent: u64, name: &CStr, args: CreateIn)
                    -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)>
                    = write(parent);
                fn read(ctx: &Context, inode: u64, handle: u64, w: &mut dyn ZeroCopyWriter,
                    size: u32, offset: u64, lock_owner: Option<u64>, flags: u32)
                    -> io::Result<usize> = read(inode);
                fn write(ctx: &Context, inode: u64, handle: u64, r: &mut dyn ZeroCopyReader,
                    size: u32, offset: u64, lock_owner: Option<u64>, delayed_write: bool,
                    flags: u32, fuse_flags: u32) -> io::Result<usize> = write(inode);
                fn flush(ctx: &Context, inode: u64, handle: u64, lock_owner: u64)
                    -> io::Result<()> = read(inode);
                fn fsync(ctx: &Context, inode: u64, datasync: bool, handle: u64)
                    -> io::Result<()> = read(inode);
                fn fallocate(ctx: &Context, inode: u64, handle: u64, mode: u32, offset: u64,
                    length: u64) -> io::Result<()> = write(inode);
                fn release(ctx: &Context, inode: u64, flags: u32, handle: u64, flush: bool,
                    flock_release: bool, lock_owner: Option<u64>) -> io::Result<()>
                    = read(inode);
                fn statfs(ctx: &Context, inode: u64) -> io::Result<statvfs64> = read(inode);
                fn setxattr(ctx: &Context, inode: u64, name: &CStr, value: &[u8], flags: u32)
                    -> io::Result<()> = write(inode);
                fn getxattr(ctx: &Context, inode: u64, name: &CStr, size: u32)
                    -> io::Result<GetxattrReply> = read(inode);
                fn listxattr(ctx: &Context, inode: u64, size: u32)
                    -> io::Result<ListxattrReply> = read(inode);
                fn removexattr(ctx: &Context, inode: u64, name: &CStr) -> io::Result<()>
                    = write(inode);
                fn opendir(ctx: &Context, inode: u64, flags: u32)
                    -> io::Result<(Option<u64>, OpenOptions)> = read(inode);
                fn readdir(ctx: &Context, inode: u64, handle: u64, size: u32, offset: u64,
                    add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>)
                    -> io::Result<()> = read(inode);
                fn readdirplus(ctx: &Context, inode: u64, handle: u64, size: u32, offset: u64,
                    add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>)
                    -> io::Result<()> = read(inode);
                fn fsyncdir(ctx: &Context, inode: u64, datasync: bool, handle: u64)
                    -> io::Result<()> = read(inode);
                fn releasedir(ctx: &Context, inode: u64, flags: u32, handle: u64)
                    -> io::Result<()> = read(inode);
                fn access(ctx: &Context, inode: u64, mask: u32) -> io::Result<()>
                    = write_if(inode, mask & libc::W_OK as u32 != 0);
                fn lseek(ctx: &Context, inode: u64, handle: u64, offset: u64, whence: u32)
                    -> io::Result<u64> = read(inode);
                fn getlk(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock,
                    flags: u32) -> io::Result<FileLock> = read(inode);
                fn setlk(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock,
                    flags: u32) -> io::Result<()> = read(inode);
                fn setlkw(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock,
                    flags: u32) -> io::Result<()> = read(inode);
            }
            extra {
                /// FUSE_TMPFILE: an unnamed file in `parent`, opened; replied like CREATE.
                fn tmpfile(ctx: &Context, parent: u64, args: CreateIn)
                    -> io::Result<(Entry, u64, OpenOptions)> = write(parent);
                /// FUSE_COPY_FILE_RANGE: returns the bytes copied.
                fn copy_file_range(ctx: &Context, range: CopyRange) -> io::Result<usize>
                    = write(range.nodeid_out);
                /// FUSE_SYNCFS on the file system holding `nodeid`.
                fn syncfs(ctx: &Context, nodeid: u64) -> io::Result<()> = read(nodeid);
            }
        }
    };
}

pub(crate) use for_each_op;

/// The names the list's signatures use, imported where a layer is generated.
pub(crate) mod prelude {
    pub use std::ffi::CStr;
    pub use std::io;
    pub use std::time::Duration;

    pub use fuse_backend_rs::abi::fuse_abi::{
        stat64, statvfs64, CreateIn, FsOptions, OpenOptions, SetattrValid,
    };
    pub use fuse_backend_rs::api::filesystem::{
        Context, DirEntry, Entry, FileLock, FileSystem, GetxattrReply, ListxattrReply,
        ZeroCopyReader, ZeroCopyWriter,
    };

    pub use super::{open_flags_mutate, CopyRange, ExtraOps};
}

/// What FUSE_COPY_FILE_RANGE asks: from the input file at an offset to the output
/// file at another, `len` bytes.
#[derive(Clone, Copy, Debug)]
pub struct CopyRange {
    pub nodeid_in: u64,
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

/// Open flags that would let a handle change the file.
pub fn open_flags_mutate(flags: u32) -> bool {
    let flags = flags as libc::c_int;
    (flags & libc::O_ACCMODE) != libc::O_RDONLY
        || flags & (libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT) != 0
}

/// Declares [`ExtraOps`] from the list's `extra` part.
macro_rules! extra_ops_trait {
    (
        fuse { $($fuse:tt)* }
        extra { $(
            $(#[$doc:meta])*
            fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty
                $(= $kind:ident($($fact:expr),*))?;
        )* }
    ) => {
        /// FUSE requests outside fuse-backend-rs's `FileSystem` trait.
        pub trait ExtraOps {
            $($(#[$doc])* fn $name(&self, $($arg: $ty),*) -> $ret;)*
        }
    };
}

use prelude::*;
for_each_op! { extra_ops_trait {} }
