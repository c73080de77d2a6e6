//! The passthrough layer: executes FUSE requests on the host, fd-relative, inside a share.
//!
//! Confinement rules, enforced here for every request:
//! - a name from the guest is one path component: no `/`, no NUL, not empty, at most
//!   NAME_MAX bytes; `.` and `..` never create or reach a new inode;
//! - every open is `openat(dir_fd, name, O_NOFOLLOW | ..)`, so a symlink on the host is
//!   never followed: it reaches the guest as a symlink;
//! - an `O_PATH` fd is reopened with real access flags through `/proc/self/fd`, which
//!   resolves to the inode itself, not to a path that a rename could redirect.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{stat64, statvfs64, CreateIn, FsOptions, OpenOptions};
use fuse_backend_rs::abi::fuse_abi::{
    SetattrValid, ATTR_SUBMOUNT, FOPEN_IN_KILL_SUIDGID, WRITE_KILL_PRIV,
};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileLock, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyReader,
    ZeroCopyWriter,
};

use super::handles::{HandleData, HandleStore};
use super::inodes::{InodeData, InodeKey, InodeStore};
use super::locks::{self, LockTable, FUSE_LK_FLOCK};
use super::names::{check_entry_name, check_name, is_dot_or_dotdot};
use super::session::{FdBudget, Limits, Session};
use super::share::{Share, ShareStats};
use super::sys::{self, cvt, cvt64, errno, FsCredsGuard, ProcFdName};
use super::xattrs;
use super::{CacheMode, ExtraOps};

pub const ROOT_ID: u64 = fuse_backend_rs::api::filesystem::ROOT_ID;

/// Options of the passthrough layer, derived from the command line.
#[derive(Clone, Debug)]
pub struct PassthroughConfig {
    pub cache: CacheMode,
    pub xattr: bool,
    /// `--allow-privileged-xattrs`: the guest may set `trusted.*` and `security.*`.
    pub privileged_xattrs: bool,
    /// Per-volume bounds on node ids, handles and lock files.
    pub limits: Limits,
}

impl PassthroughConfig {
    /// The defaults the daemon runs with, for a cache mode.
    pub fn new(cache: CacheMode, xattr: bool) -> Self {
        PassthroughConfig {
            cache,
            xattr,
            privileged_xattrs: false,
            limits: Limits::DEFAULT,
        }
    }
}

pub struct PassthroughFs {
    inodes: InodeStore,
    handles: HandleStore,
    locks: LockTable,
    session: Arc<Session>,
    budget: Arc<FdBudget>,
    /// `/proc/self/fd`, opened once, for reopening `O_PATH` fds.
    proc_self_fd: File,
    cfg: PassthroughConfig,
    timeout: Duration,
}

/// Borrows a raw fd as a `File` without taking ownership.
fn borrow_file(f: &impl AsRawFd) -> ManuallyDrop<File> {
    // SAFETY: the ManuallyDrop wrapper never closes the fd, and the caller keeps the
    // owner alive for as long as the borrowed File is used.
    ManuallyDrop::new(unsafe { File::from_raw_fd(f.as_raw_fd()) })
}

impl PassthroughFs {
    /// An empty passthrough layer; shares are added with [`Self::attach_root`].
    pub fn new(cfg: PassthroughConfig) -> io::Result<Self> {
        let proc_self_fd = File::open("/proc/self/fd")
            .map_err(|e| io::Error::new(e.kind(), format!("open /proc/self/fd: {e}")))?;
        let timeout = cfg.cache.timeout();
        let session = Arc::new(Session::default());
        let budget = Arc::new(FdBudget::from_rlimit());
        let limits = cfg.limits;
        Ok(PassthroughFs {
            inodes: InodeStore::new(
                ROOT_ID + 1,
                session.clone(),
                budget.clone(),
                limits.max_nodes,
            ),
            handles: HandleStore::new(session.clone(), budget.clone(), limits.max_handles),
            locks: LockTable::new(session.clone(), budget.clone(), limits.max_lock_files),
            session,
            budget,
            proc_self_fd,
            cfg,
            timeout,
        })
    }

    /// The fds held for the guest, and the most it may hold (all volumes).
    pub fn fd_budget(&self) -> (usize, usize) {
        (self.budget.used(), self.budget.max())
    }

    /// The current session's epoch (it moves on at each reset).
    pub fn session_epoch(&self) -> u64 {
        self.session.current()
    }

    /// A node id never handed out before.
    pub fn alloc_nodeid(&self) -> u64 {
        self.inodes.alloc_id()
    }

    /// Registers `root` (a directory fd) as the root of `share`, at node id `nodeid`.
    pub fn attach_root(&self, nodeid: u64, root: File, share: Arc<Share>) -> io::Result<()> {
        let st = sys::stat_fd(&root)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(errno(libc::ENOTDIR));
        }
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&root),
        };
        self.inodes
            .insert_fixed(nodeid, root, key, libc::S_IFDIR, share)?;
        Ok(())
    }

    /// The entry of a share root as seen from the virtual directory above it: announced
    /// as a submount, so each share has its own st_dev in the guest.
    pub fn share_root_entry(&self, nodeid: u64) -> io::Result<Entry> {
        let data = self.inode(nodeid)?;
        let st = sys::stat_fd(&data.file)?;
        let mut entry = self.entry_from(&data, st, None);
        entry.attr_flags |= ATTR_SUBMOUNT;
        Ok(entry)
    }

    /// Revokes `share` and releases every node, handle and lock file of it, waking
    /// lock waits on it. Requests in flight on it can register nothing more; their
    /// fds close as soon as they finish. Returns (nodes, handles) released.
    pub fn detach_share(&self, share: &Arc<Share>) -> (usize, usize) {
        share.revoke();
        let handles = self.handles.remove_share(share);
        self.locks.remove_share(share);
        let nodes = self.inodes.remove_share(share);
        (nodes, handles)
    }

    /// Starts a new guest session: every node id (but the share roots), handle and
    /// lock file of the previous one is dropped, and its lock waits end. Returns
    /// (nodes, handles, lock files) released.
    pub fn reset_session(&self) -> (usize, usize, usize) {
        let nodes = self.inodes.reset_session();
        let handles = self.handles.reset_session();
        let lock_files = self.locks.reset_session();
        (nodes, handles, lock_files)
    }

    /// (live node ids, open handles) of `share`.
    pub fn share_usage(&self, share: &Share) -> (usize, usize) {
        (
            self.inodes.count_share(share),
            self.handles.count_share(share),
        )
    }

    /// Whether the node belongs to a read-only share (false for unknown ids: the
    /// request fails later on the lookup anyway).
    pub fn is_read_only(&self, nodeid: u64) -> bool {
        self.inodes
            .get(nodeid)
            .map(|i| i.share.read_only)
            .unwrap_or(false)
    }

    pub fn note_error(&self, nodeid: u64) {
        if let Ok(i) = self.inodes.get(nodeid) {
            ShareStats::add(&i.share.stats.errors, 1);
        }
    }

    fn inode(&self, nodeid: u64) -> io::Result<Arc<InodeData>> {
        self.inodes.get(nodeid)
    }

    fn handle(&self, fh: u64, nodeid: u64) -> io::Result<Arc<HandleData>> {
        self.handles.get(fh, nodeid)
    }

    /// Reopens the inode's `O_PATH` fd with real open flags. Only regular files and
    /// directories are ever opened: a FIFO would block the queue thread, and a device
    /// node would reach the host's device. A symlink is ELOOP (as O_NOFOLLOW gives),
    /// anything else EBADF, as in virtiofsd.
    fn reopen(&self, inode: &InodeData, flags: libc::c_int) -> io::Result<File> {
        if !inode.is_openable() {
            return Err(errno(if inode.file_type == libc::S_IFLNK {
                libc::ELOOP
            } else {
                libc::EBADF
            }));
        }
        self.reopen_fd(&inode.file, flags)
    }

    /// Reopens an `O_PATH` fd whose type the caller checked.
    fn reopen_fd(&self, fd: &impl AsRawFd, flags: libc::c_int) -> io::Result<File> {
        let name = ProcFdName::new(fd.as_raw_fd());
        // O_NOFOLLOW must not be set: the magic link is what we follow, and it only
        // ever resolves to the inode itself.
        sys::openat(
            &self.proc_self_fd,
            name.as_cstr(),
            flags & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL),
            0,
        )
    }

    fn entry_from(&self, data: &InodeData, st: stat64, parent: Option<&InodeData>) -> Entry {
        let mut attr_flags = 0;
        // A directory on another mount than its parent is announced as a submount, so
        // the guest gives it its own st_dev and inode numbers never collide.
        if let Some(p) = parent {
            if data.is_dir() && (p.key.dev != data.key.dev || p.key.mnt_id != data.key.mnt_id) {
                attr_flags |= ATTR_SUBMOUNT;
            }
        }
        Entry {
            inode: data.nodeid,
            generation: 0,
            attr: st,
            attr_flags,
            attr_timeout: self.timeout,
            entry_timeout: self.timeout,
        }
    }

    /// Opens `name` under `parent` without following symlinks and registers it.
    fn do_lookup(&self, parent: &Arc<InodeData>, name: &CStr) -> io::Result<Entry> {
        check_name(name)?;
        if name.to_bytes() == b"." {
            return self.ref_existing(parent);
        }
        if name.to_bytes() == b".." {
            return self.lookup_dotdot(parent);
        }
        let file = sys::openat(&parent.file, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        self.register(file, parent)
    }

    /// A guest kernel never sends `LOOKUP ..`; a malicious one may. It may only reach a
    /// directory the guest already holds, and never climbs above the share root.
    fn lookup_dotdot(&self, parent: &Arc<InodeData>) -> io::Result<Entry> {
        if parent.is_share_root() {
            // The virtual layer answers `..` of a share root; here it stays put.
            return self.ref_existing(parent);
        }
        let file = sys::openat(&parent.file, c"..", libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let st = sys::stat_fd(&file)?;
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&file),
        };
        match self.inodes.lookup_key(&key) {
            Some(existing) if Arc::ptr_eq(&existing.share, &parent.share) => {
                self.ref_existing(&existing)
            }
            _ => Err(errno(libc::ENOENT)),
        }
    }

    fn ref_existing(&self, data: &Arc<InodeData>) -> io::Result<Entry> {
        let st = sys::stat_fd(&data.file)?;
        let dup = data.file.try_clone()?;
        let node = self
            .inodes
            .insert_or_ref(dup, data.key, data.file_type, data)?;
        Ok(self.entry_from(&node, st, None))
    }

    fn register(&self, file: File, parent: &Arc<InodeData>) -> io::Result<Entry> {
        let st = sys::stat_fd(&file)?;
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&file),
        };
        let node = self
            .inodes
            .insert_or_ref(file, key, st.st_mode & libc::S_IFMT, parent)?;
        Ok(self.entry_from(&node, st, Some(parent)))
    }

    /// Registers the file `opened` (just created or opened in `dir`) as a node, and
    /// its open file as a handle. The node's `O_PATH` fd comes from the open file
    /// itself, so a rename racing the create cannot swap in another inode.
    fn register_open(&self, dir: &Arc<InodeData>, opened: File) -> io::Result<(Entry, u64)> {
        let name = ProcFdName::new(opened.as_raw_fd());
        let path_fd = sys::openat(&self.proc_self_fd, name.as_cstr(), libc::O_PATH, 0)?;
        let entry = self.register(path_fd, dir)?;
        let node = self.inode(entry.inode)?;
        match self.handles.insert(node, opened) {
            Ok(fh) => Ok((entry, fh)),
            Err(e) => {
                // No reply carries the entry: give back the lookup it took.
                self.inodes.forget(entry.inode, 1);
                Err(e)
            }
        }
    }

    fn open_options(&self, is_dir: bool) -> OpenOptions {
        match self.cfg.cache {
            CacheMode::None if !is_dir => OpenOptions::DIRECT_IO,
            CacheMode::None | CacheMode::Auto => OpenOptions::empty(),
            CacheMode::Always if is_dir => OpenOptions::CACHE_DIR,
            CacheMode::Always => OpenOptions::KEEP_CACHE,
        }
    }

    /// Flags the host open gets: the guest's, minus what would change confinement or
    /// semantics (`O_NOFOLLOW` is ours to set; `O_DIRECT` is dropped as virtiofsd does,
    /// since guest buffers need not meet the host file system's alignment).
    fn host_open_flags(flags: u32) -> libc::c_int {
        let flags = flags as libc::c_int;
        (flags & !(libc::O_DIRECT | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY))
            | libc::O_CLOEXEC
    }

    /// CREATE: a new file (O_CREAT|O_EXCL, as the caller), or, where the name exists
    /// and the guest did not ask for O_EXCL, the existing file, if it is a regular
    /// file: an existing FIFO or device node is never opened. The guest's O_TRUNC
    /// applies to an existing file, with the setuid bits cleared when it asks.
    fn create_or_open(
        &self,
        ctx: &Context,
        dir: &InodeData,
        name: &CStr,
        args: &CreateIn,
    ) -> io::Result<File> {
        let flags = Self::host_open_flags(args.flags);
        let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
        let exclusive = flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        // A name that disappears between EEXIST and the lookup is created anew; a few
        // rounds settle any race with another writer of the directory.
        for _ in 0..4 {
            match sys::openat(&dir.file, name, exclusive, args.mode & !args.umask) {
                Err(e)
                    if e.raw_os_error() == Some(libc::EEXIST)
                        && args.flags as libc::c_int & libc::O_EXCL == 0 => {}
                other => return other,
            }
            let path_fd = match sys::openat(&dir.file, name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                other => other?,
            };
            let st = sys::stat_fd(&path_fd)?;
            return match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => {
                    let file = self.reopen_fd(&path_fd, flags)?;
                    if flags & libc::O_TRUNC != 0 && args.fuse_flags & FOPEN_IN_KILL_SUIDGID != 0 {
                        kill_suidgid_fd(file.as_raw_fd(), &st)?;
                    }
                    Ok(file)
                }
                libc::S_IFDIR => Err(errno(libc::EISDIR)),
                // open(O_CREAT) on a symlink we never follow, as O_NOFOLLOW would.
                libc::S_IFLNK => Err(errno(libc::ELOOP)),
                _ => Err(errno(libc::EBADF)),
            };
        }
        Err(errno(libc::EAGAIN))
    }

    /// Clears setuid, and setgid where group-execute is set, as Linux does when a
    /// process without CAP_FSETID writes, truncates or chowns a regular file (the
    /// daemon has it, so it must do this itself). `fd` is an open fd of the file,
    /// else the node's `O_PATH` fd is used through `/proc/self/fd`.
    fn kill_suidgid(&self, inode: &InodeData, fd: Option<libc::c_int>) -> io::Result<()> {
        if inode.file_type != libc::S_IFREG {
            return Ok(());
        }
        let st = sys::stat_fd(&inode.file)?;
        match fd {
            Some(fd) => kill_suidgid_fd(fd, &st),
            None => match suidgid_cleared(st.st_mode) {
                Some(mode) => {
                    let name = ProcFdName::new(inode.file.as_raw_fd());
                    // SAFETY: fchmodat through the magic link of our own fd.
                    cvt(unsafe {
                        libc::fchmodat(
                            self.proc_self_fd.as_raw_fd(),
                            name.as_cstr().as_ptr(),
                            mode,
                            0,
                        )
                    })
                    .map(|_| ())
                }
                None => Ok(()),
            },
        }
    }

    fn count(&self, share: &Share) {
        ShareStats::add(&share.stats.ops, 1);
    }

    fn do_readdir(
        &self,
        nodeid: u64,
        fh: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, &HandleData) -> io::Result<usize>,
    ) -> io::Result<()> {
        if size == 0 {
            return Ok(());
        }
        let h = self.handle(fh, nodeid)?;
        let _guard = h.dir_lock.lock().unwrap();
        // SAFETY: lseek on an fd we own; the result is checked.
        cvt64(unsafe { libc::lseek64(h.file.as_raw_fd(), offset as i64, libc::SEEK_SET) })?;
        let mut buf = vec![0u8; (size as usize).clamp(1024, 64 * 1024)];
        loop {
            // SAFETY: `buf` is a valid writable buffer of the given length.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    h.file.as_raw_fd(),
                    buf.as_mut_ptr(),
                    buf.len(),
                )
            };
            let n = cvt64(n)? as usize;
            if n == 0 {
                return Ok(());
            }
            let mut pos = 0;
            while pos < n {
                // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name...
                let rec = &buf[pos..n];
                if rec.len() < 19 {
                    return Err(errno(libc::EIO));
                }
                let ino = u64::from_ne_bytes(rec[0..8].try_into().unwrap());
                let off = i64::from_ne_bytes(rec[8..16].try_into().unwrap());
                let reclen = u16::from_ne_bytes(rec[16..18].try_into().unwrap()) as usize;
                let dtype = rec[18];
                if reclen < 19 || reclen > rec.len() {
                    return Err(errno(libc::EIO));
                }
                let name_field = &rec[19..reclen];
                let name_len = name_field
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(name_field.len());
                let name = &name_field[..name_len];
                pos += reclen;
                let entry = DirEntry {
                    ino,
                    offset: off as u64,
                    type_: dtype as u32,
                    name,
                };
                if add_entry(entry, &h)? == 0 {
                    // The reply buffer is full; the guest continues from `offset` later.
                    return Ok(());
                }
            }
        }
    }

    fn stat_with_handle(&self, inode: &InodeData, fh: Option<u64>) -> io::Result<stat64> {
        if let Some(fh) = fh {
            if let Ok(h) = self.handle(fh, inode.nodeid) {
                return sys::stat_fd(&h.file);
            }
        }
        sys::stat_fd(&inode.file)
    }

    fn xattr_file(&self, inode: &InodeData) -> io::Result<File> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        match inode.file_type {
            libc::S_IFREG | libc::S_IFDIR => self.reopen(inode, libc::O_RDONLY | libc::O_NONBLOCK),
            // xattrs of special files and symlinks would need a path-based call.
            _ => Err(errno(libc::ENOTSUP)),
        }
    }
}

impl PassthroughFs {
    /// Releases `owner`'s POSIX locks on `inode` (the guest process closed a file).
    fn release_owner_locks(&self, inode: u64, owner: u64) {
        self.locks.release_owner(inode, owner);
    }

    fn lock(
        &self,
        inode: u64,
        fh: u64,
        owner: u64,
        lock: &FileLock,
        lk_flags: u32,
        wait: bool,
    ) -> io::Result<()> {
        let h = self.handle(fh, inode)?;
        self.count(&h.inode.share);
        if lk_flags & FUSE_LK_FLOCK != 0 {
            let op = locks::flock_op(lock.lock_type, wait)?;
            // SAFETY: flock on an fd we own.
            let flock = || cvt(unsafe { libc::flock(h.file.as_raw_fd(), op) }).map(|_| ());
            return if wait {
                self.locks.wait(&h.inode, flock)
            } else {
                flock()
            };
        }
        let fl = locks::to_flock(lock)?;
        let owner_file = self
            .locks
            .owner_file(&h, owner, |mode| self.reopen(&h.inode, mode))?;
        let cmd = if wait {
            libc::F_OFD_SETLKW
        } else {
            libc::F_OFD_SETLK
        };
        let set = || {
            let mut fl = fl;
            // SAFETY: fcntl with a valid flock struct on an fd we own.
            cvt(unsafe { libc::fcntl(owner_file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) })
                .map(|_| ())
        };
        if wait {
            self.locks.wait(&h.inode, set)
        } else {
            set()
        }
    }
}

/// The mode with setuid (and setgid, if group-executable) cleared, or None when
/// nothing needs clearing.
fn suidgid_cleared(mode: u32) -> Option<u32> {
    let mut new = mode & 0o7777;
    if mode & libc::S_ISUID != 0 {
        new &= !libc::S_ISUID;
    }
    if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        new &= !libc::S_ISGID;
    }
    (new != mode & 0o7777).then_some(new)
}

fn kill_suidgid_fd(fd: libc::c_int, st: &stat64) -> io::Result<()> {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    match suidgid_cleared(st.st_mode) {
        // SAFETY: fchmod on an fd we own.
        Some(mode) => cvt(unsafe { libc::fchmod(fd, mode) }).map(|_| ()),
        None => Ok(()),
    }
}

impl ExtraOps for PassthroughFs {
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        args: CreateIn,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        let flags = Self::host_open_flags(args.flags) | libc::O_TMPFILE;
        let file = {
            let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
            sys::openat(
                &dir.file,
                c".",
                flags & !libc::O_NOFOLLOW,
                args.mode & !args.umask,
            )?
        };
        let (entry, fh) = self.register_open(&dir, file)?;
        Ok((entry, fh, self.open_options(false)))
    }

    fn copy_file_range(
        &self,
        _ctx: &Context,
        nodeid_in: u64,
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        let hin = self.handle(fh_in, nodeid_in)?;
        let hout = self.handle(fh_out, nodeid_out)?;
        self.count(&hout.inode.share);
        if flags != 0 {
            return Err(errno(libc::EINVAL));
        }
        let mut oi = off_in as i64;
        let mut oo = off_out as i64;
        let len = len.min(isize::MAX as u64) as usize;
        // SAFETY: both fds are owned by live handles; offsets are valid pointers.
        let n = unsafe {
            libc::copy_file_range(
                hin.file.as_raw_fd(),
                &mut oi,
                hout.file.as_raw_fd(),
                &mut oo,
                len,
                0,
            )
        };
        let n = cvt64(n as i64)? as usize;
        ShareStats::add(&hout.inode.share.stats.bytes_written, n as u64);
        Ok(n)
    }

    fn syncfs(&self, _ctx: &Context, nodeid: u64) -> io::Result<()> {
        let inode = self.inode(nodeid)?;
        // EBADF on a FIFO, socket or device node: those are never opened.
        let f = self.reopen(&inode, libc::O_RDONLY | libc::O_NONBLOCK)?;
        // SAFETY: syncfs on an fd we own.
        cvt(unsafe { libc::syncfs(f.as_raw_fd()) }).map(|_| ())
    }
}

impl FileSystem for PassthroughFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        let mut want = FsOptions::ASYNC_READ
            | FsOptions::PARALLEL_DIROPS
            | FsOptions::BIG_WRITES
            | FsOptions::ATOMIC_O_TRUNC
            | FsOptions::DO_READDIRPLUS
            | FsOptions::READDIRPLUS_AUTO
            | FsOptions::MAX_PAGES
            | FsOptions::SUBMOUNTS
            | FsOptions::POSIX_LOCKS
            | FsOptions::FLOCK_LOCKS
            // Without it the guest completes async direct I/O one request at a time:
            // with cache=none every guest I/O is direct, so iodepth would be lost.
            | FsOptions::ASYNC_DIO
            // The guest tells us when a write, truncate or chown by a non-owner must
            // clear the setuid/setgid bits; the daemon's own root would keep them.
            | FsOptions::HANDLE_KILLPRIV_V2
            | FsOptions::INIT_EXT;
        if self.cfg.cache != CacheMode::None {
            want |= FsOptions::AUTO_INVAL_DATA;
        }
        Ok(want & capable)
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        self.do_lookup(&dir, name)
    }

    fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        self.inodes.forget(inode, count);
    }

    fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        self.inodes.forget_many(&requests);
    }

    fn getattr(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        Ok((self.stat_with_handle(&data, handle)?, self.timeout))
    }

    fn setattr(
        &self,
        _ctx: &Context,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        let h = handle.and_then(|fh| self.handle(fh, inode).ok());
        let proc_name = ProcFdName::new(data.file.as_raw_fd());

        if valid.contains(SetattrValid::MODE) {
            // SAFETY: fchmodat on the /proc/self/fd magic link of our own fd.
            cvt(unsafe {
                match &h {
                    Some(h) => libc::fchmod(h.file.as_raw_fd(), attr.st_mode),
                    None => libc::fchmodat(
                        self.proc_self_fd.as_raw_fd(),
                        proc_name.as_cstr().as_ptr(),
                        attr.st_mode,
                        0,
                    ),
                }
            })?;
        }
        if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            let uid = if valid.contains(SetattrValid::UID) {
                attr.st_uid
            } else {
                u32::MAX
            };
            let gid = if valid.contains(SetattrValid::GID) {
                attr.st_gid
            } else {
                u32::MAX
            };
            // SAFETY: fchownat with an empty path acts on the fd itself.
            cvt(unsafe {
                libc::fchownat(
                    data.file.as_raw_fd(),
                    c"".as_ptr(),
                    uid,
                    gid,
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
            if valid.contains(SetattrValid::KILL_SUIDGID) {
                self.kill_suidgid(&data, None)?;
            }
        }
        if valid.contains(SetattrValid::SIZE) {
            match data.file_type {
                libc::S_IFREG => {}
                libc::S_IFDIR => return Err(errno(libc::EISDIR)),
                // truncate(2) of a FIFO, socket or device: never opened here.
                _ => return Err(errno(libc::EINVAL)),
            }
            let owned;
            let fd = match &h {
                Some(h) => h.file.as_raw_fd(),
                None => {
                    owned = self.reopen(&data, libc::O_WRONLY)?;
                    owned.as_raw_fd()
                }
            };
            if valid.contains(SetattrValid::KILL_SUIDGID) {
                self.kill_suidgid(&data, Some(fd))?;
            }
            // SAFETY: ftruncate on an fd we own.
            cvt(unsafe { libc::ftruncate64(fd, attr.st_size) })?;
        }
        if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME) {
            let omit = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            };
            let mut times = [omit, omit];
            if valid.contains(SetattrValid::ATIME) {
                times[0] = if valid.contains(SetattrValid::ATIME_NOW) {
                    now
                } else {
                    libc::timespec {
                        tv_sec: attr.st_atime,
                        tv_nsec: attr.st_atime_nsec,
                    }
                };
            }
            if valid.contains(SetattrValid::MTIME) {
                times[1] = if valid.contains(SetattrValid::MTIME_NOW) {
                    now
                } else {
                    libc::timespec {
                        tv_sec: attr.st_mtime,
                        tv_nsec: attr.st_mtime_nsec,
                    }
                };
            }
            // SAFETY: `times` is a valid two-element array; the path names our own fd.
            cvt(unsafe {
                match &h {
                    Some(h) => libc::futimens(h.file.as_raw_fd(), times.as_ptr()),
                    None if data.file_type == libc::S_IFLNK => libc::utimensat(
                        data.file.as_raw_fd(),
                        c"".as_ptr(),
                        times.as_ptr(),
                        libc::AT_EMPTY_PATH,
                    ),
                    None => libc::utimensat(
                        self.proc_self_fd.as_raw_fd(),
                        proc_name.as_cstr().as_ptr(),
                        times.as_ptr(),
                        0,
                    ),
                }
            })?;
        }
        Ok((sys::stat_fd(&data.file)?, self.timeout))
    }

    fn readlink(&self, _ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: readlinkat with an empty path reads the symlink the fd refers to.
        let n = unsafe {
            libc::readlinkat(
                data.file.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        let n = cvt64(n as i64)? as usize;
        buf.truncate(n);
        Ok(buf)
    }

    fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        check_entry_name(name, libc::EEXIST)?;
        {
            let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
            // SAFETY: both strings are NUL-terminated.
            cvt(unsafe {
                libc::symlinkat(linkname.as_ptr(), dir.file.as_raw_fd(), name.as_ptr())
            })?;
        }
        self.do_lookup(&dir, name)
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        check_entry_name(name, libc::EEXIST)?;
        {
            let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
            // SAFETY: NUL-terminated name, dir fd owned by the inode.
            cvt(unsafe {
                libc::mknodat(
                    dir.file.as_raw_fd(),
                    name.as_ptr(),
                    mode & !umask,
                    rdev as libc::dev_t,
                )
            })?;
        }
        self.do_lookup(&dir, name)
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        check_entry_name(name, libc::EEXIST)?;
        {
            let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
            // SAFETY: NUL-terminated name, dir fd owned by the inode.
            cvt(unsafe { libc::mkdirat(dir.file.as_raw_fd(), name.as_ptr(), mode & !umask) })?;
        }
        self.do_lookup(&dir, name)
    }

    fn unlink(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        check_name(name)?;
        if is_dot_or_dotdot(name) {
            return Err(errno(libc::EISDIR));
        }
        // SAFETY: NUL-terminated name, dir fd owned by the inode.
        cvt(unsafe { libc::unlinkat(dir.file.as_raw_fd(), name.as_ptr(), 0) }).map(|_| ())
    }

    fn rmdir(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        check_name(name)?;
        match name.to_bytes() {
            b"." => return Err(errno(libc::EINVAL)),
            b".." => return Err(errno(libc::ENOTEMPTY)),
            _ => {}
        }
        // SAFETY: NUL-terminated name, dir fd owned by the inode.
        cvt(unsafe { libc::unlinkat(dir.file.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })
            .map(|_| ())
    }

    fn rename(
        &self,
        _ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        let od = self.inode(olddir)?;
        let nd = self.inode(newdir)?;
        self.count(&od.share);
        check_entry_name(oldname, libc::EBUSY)?;
        check_entry_name(newname, libc::EBUSY)?;
        if !Arc::ptr_eq(&od.share, &nd.share) {
            return Err(errno(libc::EXDEV));
        }
        sys::renameat2(&od.file, oldname, &nd.file, newname, flags)
    }

    fn link(
        &self,
        _ctx: &Context,
        inode: u64,
        newparent: u64,
        newname: &CStr,
    ) -> io::Result<Entry> {
        let data = self.inode(inode)?;
        let dir = self.inode(newparent)?;
        self.count(&dir.share);
        check_entry_name(newname, libc::EEXIST)?;
        if !Arc::ptr_eq(&data.share, &dir.share) {
            return Err(errno(libc::EXDEV));
        }
        let proc_name = ProcFdName::new(data.file.as_raw_fd());
        // SAFETY: linkat through the /proc/self/fd magic link of our own fd.
        cvt(unsafe {
            libc::linkat(
                self.proc_self_fd.as_raw_fd(),
                proc_name.as_cstr().as_ptr(),
                dir.file.as_raw_fd(),
                newname.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })?;
        self.do_lookup(&dir, newname)
    }

    fn open(
        &self,
        _ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        if data.is_dir() && (flags as libc::c_int & libc::O_ACCMODE) != libc::O_RDONLY {
            return Err(errno(libc::EISDIR));
        }
        // EBADF for FIFOs, sockets and device nodes (see `reopen`).
        let file = self.reopen(&data, Self::host_open_flags(flags))?;
        if flags as libc::c_int & libc::O_TRUNC != 0 && fuse_flags & FOPEN_IN_KILL_SUIDGID != 0 {
            self.kill_suidgid(&data, Some(file.as_raw_fd()))?;
        }
        let is_dir = data.is_dir();
        let fh = self.handles.insert(data, file)?;
        Ok((Some(fh), self.open_options(is_dir), None))
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        let dir = self.inode(parent)?;
        self.count(&dir.share);
        check_entry_name(name, libc::EISDIR)?;
        let file = self.create_or_open(ctx, &dir, name, &args)?;
        let (entry, fh) = self.register_open(&dir, file)?;
        Ok((entry, Some(fh), self.open_options(false), None))
    }

    fn read(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        let h = self.handle(handle, inode)?;
        let share = &h.inode.share;
        self.count(share);
        let mut f = borrow_file(&h.file);
        // Reads go straight from the file into the guest's buffers (preadv).
        let n = w.write_from(&mut *f, size as usize, offset)?;
        ShareStats::add(&share.stats.bytes_read, n as u64);
        Ok(n)
    }

    fn write(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        _flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        let h = self.handle(handle, inode)?;
        let share = &h.inode.share;
        self.count(share);
        if fuse_flags & WRITE_KILL_PRIV != 0 {
            self.kill_suidgid(&h.inode, Some(h.file.as_raw_fd()))?;
        }
        let mut f = borrow_file(&h.file);
        // Writes go straight from the guest's buffers into the file (pwritev).
        let n = r.read_to(&mut *f, size as usize, offset)?;
        ShareStats::add(&share.stats.bytes_written, n as u64);
        Ok(n)
    }

    fn flush(&self, _ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        let h = self.handle(handle, inode)?;
        // A process's close() drops all its POSIX locks on the file.
        self.release_owner_locks(inode, lock_owner);
        // close(dup(fd)) gives the host file system the close-time semantics (NFS
        // flushes, POSIX lock release) that the guest's close() expects.
        // SAFETY: dup of an fd we own; the new fd is closed at once.
        let fd = cvt(unsafe { libc::dup(h.file.as_raw_fd()) })?;
        // SAFETY: `fd` was just created and is owned here.
        cvt(unsafe { libc::close(fd) }).map(|_| ())
    }

    fn fsync(&self, _ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        let h = self.handle(handle, inode)?;
        self.count(&h.inode.share);
        let fd = h.file.as_raw_fd();
        // SAFETY: fsync/fdatasync on an fd we own.
        cvt(unsafe {
            if datasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }
        })
        .map(|_| ())
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        let h = self.handle(handle, inode)?;
        self.count(&h.inode.share);
        // SAFETY: fallocate on an fd we own; the kernel validates mode and range.
        cvt(unsafe {
            libc::fallocate64(
                h.file.as_raw_fd(),
                mode as libc::c_int,
                offset as i64,
                length as i64,
            )
        })
        .map(|_| ())
    }

    fn release(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
        handle: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.handles.remove(handle, inode)
    }

    fn statfs(&self, _ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        let mut out = MaybeUninit::<statvfs64>::zeroed();
        // SAFETY: fstatvfs fills `out`; the result is checked.
        cvt(unsafe { libc::fstatvfs64(data.file.as_raw_fd(), out.as_mut_ptr()) })?;
        // SAFETY: fstatvfs succeeded.
        let mut st = unsafe { out.assume_init() };
        if data.share.read_only {
            st.f_flag |= libc::ST_RDONLY;
        }
        Ok(st)
    }

    fn setxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        xattrs::check_write(name, self.cfg.privileged_xattrs)?;
        let f = self.xattr_file(&data)?;
        // As the caller: only the owner may change a POSIX ACL, and only a writer a
        // user.* attribute (the switch drops the daemon's CAP_FOWNER for the call).
        let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
        // SAFETY: valid name and value buffer.
        cvt(unsafe {
            libc::fsetxattr(
                f.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr() as *const libc::c_void,
                value.len(),
                flags as libc::c_int,
            )
        })
        .map(|_| ())
    }

    fn getxattr(
        &self,
        _ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        if xattrs::is_hidden(name.to_bytes(), self.cfg.privileged_xattrs) {
            return Err(errno(libc::ENODATA));
        }
        let f = self.xattr_file(&data)?;
        // The size comes from the guest: no value is larger than XATTR_SIZE_MAX, so a
        // larger buffer is never needed (Linux clamps the same way).
        let mut buf = vec![0u8; xattrs::clamp_size(size)];
        // SAFETY: `buf` is valid for its length (an empty one asks the size).
        let n = unsafe {
            libc::fgetxattr(
                f.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        };
        let n = cvt64(n as i64)? as usize;
        if size == 0 {
            Ok(GetxattrReply::Count(n as u32))
        } else {
            buf.truncate(n);
            Ok(GetxattrReply::Value(buf))
        }
    }

    fn listxattr(&self, _ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        let f = self.xattr_file(&data)?;
        // The host list is read whole (bounded by XATTR_LIST_MAX), hidden names are
        // taken out, and the guest's size is checked against what is left.
        let mut buf = vec![0u8; xattrs::LIST_MAX];
        // SAFETY: `buf` is valid for its length.
        let n = unsafe {
            libc::flistxattr(
                f.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        let n = cvt64(n as i64)? as usize;
        buf.truncate(n);
        let names = xattrs::visible_names(&buf, self.cfg.privileged_xattrs);
        if size == 0 {
            Ok(ListxattrReply::Count(names.len() as u32))
        } else if names.len() > size as usize {
            Err(errno(libc::ERANGE))
        } else {
            Ok(ListxattrReply::Names(names))
        }
    }

    fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        xattrs::check_write(name, self.cfg.privileged_xattrs)?;
        let f = self.xattr_file(&data)?;
        let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
        // SAFETY: valid NUL-terminated name.
        cvt(unsafe { libc::fremovexattr(f.as_raw_fd(), name.as_ptr()) }).map(|_| ())
    }

    fn opendir(
        &self,
        _ctx: &Context,
        inode: u64,
        flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        if !data.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let file = self.reopen(
            &data,
            (Self::host_open_flags(flags) & !libc::O_ACCMODE) | libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        let fh = self.handles.insert(data, file)?;
        Ok((Some(fh), self.open_options(true)))
    }

    fn readdir(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.do_readdir(inode, handle, size, offset, &mut |e, _| add_entry(e))
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.do_readdir(inode, handle, size, offset, &mut |e, h| {
            let name = e.name;
            if name == b"." || name == b".." {
                // The kernel links no dentry for these; a zero node id takes no reference.
                return add_entry(e, Entry::default());
            }
            let cname = CString::new(name).map_err(|_| errno(libc::EIO))?;
            let entry = match self.do_lookup(&h.inode, &cname) {
                Ok(entry) => entry,
                // Gone since getdents: skip it, as if it had not been listed.
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(1),
                Err(err) => return Err(err),
            };
            let nodeid = entry.inode;
            let n = add_entry(e, entry)?;
            if n == 0 {
                // Not sent: give back the reference the lookup took.
                self.inodes.forget(nodeid, 1);
            }
            Ok(n)
        })
    }

    fn fsyncdir(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.fsync(ctx, inode, datasync, handle)
    }

    fn releasedir(&self, _ctx: &Context, inode: u64, _flags: u32, handle: u64) -> io::Result<()> {
        self.handles.remove(handle, inode)
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        let data = self.inode(inode)?;
        self.count(&data.share);
        let proc_name = ProcFdName::new(data.file.as_raw_fd());
        let _creds = FsCredsGuard::switch(ctx.uid, ctx.gid);
        // faccessat2 with AT_EACCESS checks as the fs ids just switched to; plain
        // faccessat would check the daemon's real ids (root) and allow everything.
        // SAFETY: faccessat2 through the magic link of our own fd.
        cvt64(unsafe {
            libc::syscall(
                libc::SYS_faccessat2,
                self.proc_self_fd.as_raw_fd(),
                proc_name.as_cstr().as_ptr(),
                mask as libc::c_int,
                libc::AT_EACCESS,
            )
        })
        .map(|_| ())
    }

    fn lseek(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        let h = self.handle(handle, inode)?;
        self.count(&h.inode.share);
        // SAFETY: lseek on an fd we own. The guest passes its own position: the host
        // fd's position is only used here and by pread/pwrite, which ignore it.
        let r = cvt64(unsafe {
            libc::lseek64(h.file.as_raw_fd(), offset as i64, whence as libc::c_int)
        })?;
        Ok(r as u64)
    }

    fn getlk(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        lk_flags: u32,
    ) -> io::Result<FileLock> {
        let h = self.handle(handle, inode)?;
        self.count(&h.inode.share);
        if lk_flags & FUSE_LK_FLOCK != 0 {
            // flock has no "test": the kernel never asks.
            return Err(errno(libc::EINVAL));
        }
        let mut fl = locks::to_flock(&lock)?;
        // Test on the owner's own lock file when it has one, so that its own locks
        // never show as conflicts (they are OFD locks of that file, not the handle's).
        let owner_file = self.locks.existing(inode, owner);
        let fd = owner_file
            .as_ref()
            .map(|f| f.as_raw_fd())
            .unwrap_or(h.file.as_raw_fd());
        // SAFETY: fcntl with a valid flock struct on an fd we own.
        cvt(unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl as *mut libc::flock) })?;
        Ok(locks::from_flock(&fl, &lock))
    }

    fn setlk(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        lk_flags: u32,
    ) -> io::Result<()> {
        self.lock(inode, handle, owner, &lock, lk_flags, false)
    }

    fn setlkw(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        lk_flags: u32,
    ) -> io::Result<()> {
        self.lock(inode, handle, owner, &lock, lk_flags, true)
    }
}
