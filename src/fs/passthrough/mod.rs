//! The passthrough layer: executes FUSE requests on the host, fd-relative, inside a share.
//!
//! Confinement rules, enforced here for every request:
//! - a name from the guest is one path component: no `/`, no NUL, not empty, at most
//!   NAME_MAX bytes; `.` and `..` never create or reach a new inode;
//! - every open is `openat(dir_fd, name, O_NOFOLLOW | ..)`, so a symlink on the host is
//!   never followed: it reaches the guest as a symlink;
//! - an `O_PATH` fd is reopened with real access flags through `/proc/self/fd`, which
//!   resolves to the inode itself, not to a path that a rename could redirect.

use std::collections::HashSet;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::sync::RwLock;

use super::handles::HandleStore;
use super::inodes::InodeStore;
use super::layer::fs_layer;
use super::locks::LockTable;
use super::session::{FdBudget, Limits, Session};
use super::share::Share;
use prelude::*;

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
    /// `/proc/self/fd`, when it was opened before the sandbox changed the root
    /// (inside it there is no /proc); None opens it here.
    pub proc_self_fd: Option<Arc<File>>,
    /// `--inode-file-handles`: how nodes refer to their host inodes.
    pub file_handles: FileHandleMode,
    /// `--allow-direct-io`: host files are opened with the guest's O_DIRECT.
    pub allow_direct_io: bool,
    /// READDIRPLUS offered to the guest (not with `--no-readdirplus`).
    pub readdirplus: bool,
    /// Directories on another mount are announced as submounts (FUSE_SUBMOUNTS), as
    /// virtiofsd does by default; `--no-announce-submounts` turns it off.
    pub announce_submounts: bool,
    /// `--preserve-noatime`: keep the guest's O_NOATIME (else dropped, as virtiofsd
    /// drops it: it needs the file's owner or CAP_FOWNER, which an unprivileged
    /// daemon lacks for most files).
    pub preserve_noatime: bool,
    /// `--posix-acl`: whether to negotiate POSIX ACLs.
    pub posix_acl: AclMode,
    /// `--translate-uid` / `--translate-gid`.
    pub uids: IdTranslation,
    pub gids: IdTranslation,
    /// Per-operation metrics kept by the read-only guard built over this layer (not
    /// with `--no-metrics`); the stack's one switch, so it travels with its config.
    pub metrics: bool,
}

impl PassthroughConfig {
    /// The defaults the daemon runs with, for a cache mode.
    pub fn new(cache: CacheMode, xattr: bool) -> Self {
        PassthroughConfig {
            cache,
            xattr,
            privileged_xattrs: false,
            limits: Limits::DEFAULT,
            proc_self_fd: None,
            file_handles: FileHandleMode::Never,
            allow_direct_io: false,
            readdirplus: true,
            preserve_noatime: false,
            announce_submounts: true,
            posix_acl: AclMode::Never,
            uids: IdTranslation::default(),
            gids: IdTranslation::default(),
            metrics: true,
        }
    }
}

pub struct PassthroughFs {
    inodes: InodeStore,
    handles: HandleStore,
    /// Shared with the thread that waits for locks a loaded state names.
    locks: Arc<LockTable>,
    session: Arc<Session>,
    budget: Arc<FdBudget>,
    /// `/proc/self/fd`, opened once, for reopening `O_PATH` fds.
    proc_self_fd: File,
    cfg: PassthroughConfig,
    timeout: Duration,
    /// POSIX ACLs negotiated in this session's INIT: the guest kernel enforces them
    /// and sends creation modes without its umask (FUSE_DONT_MASK).
    acl: AtomicBool,
    /// `--translate-uid/gid` is in force: identity-dependent host calls run as the
    /// caller's host ids (see [`PassthroughFs::as_caller`]).
    translating: bool,
    /// Node ids a device state named that could not be found again
    /// (`--migration-on-error=guest-error`): answered ESTALE, not ENOENT, for the rest
    /// of the session. Looked at only when a node id misses.
    lost: RwLock<HashSet<u64>>,
}

/// The host id a guest id no rule lets own anything (`forbid-guest`) acts as: Linux's
/// default overflow id, `nobody`, which owns nothing a guest should reach.
pub const OVERFLOW_ID: u32 = 65534;

/// Borrows a raw fd as a `File` without taking ownership.
fn borrow_file(f: &impl AsRawFd) -> ManuallyDrop<File> {
    // SAFETY: the ManuallyDrop wrapper never closes the fd, and the caller keeps the
    // owner alive for as long as the borrowed File is used.
    ManuallyDrop::new(unsafe { File::from_raw_fd(f.as_raw_fd()) })
}

/// ELOOP for a symlink (as O_NOFOLLOW gives), EBADF for a FIFO, socket or device
/// node: only regular files and directories are ever opened (see `reopen`).
fn check_openable(inode: &InodeData) -> io::Result<()> {
    if inode.is_openable() {
        return Ok(());
    }
    Err(errno(if inode.file_type() == libc::S_IFLNK {
        libc::ELOOP
    } else {
        libc::EBADF
    }))
}

/// A translated caller's identity for an xattr change: the capabilities are raised
/// again before the fs ids switch back (fields drop in order), though either order
/// restores the same sets.
pub(super) struct XattrCaller {
    _lowered: Option<EffectiveLowered>,
    _creds: Option<FsCredsGuard>,
}

/// What the files of this layer share.
mod prelude {
    pub(super) use std::ffi::{CStr, CString};
    pub(super) use std::fs::File;
    pub(super) use std::io;
    pub(super) use std::mem::MaybeUninit;
    pub(super) use std::os::fd::AsRawFd;
    pub(super) use std::sync::Arc;
    pub(super) use std::time::Duration;

    pub(super) use fuse_backend_rs::abi::fuse_abi::{
        stat64, statvfs64, CreateIn, FsOptions, OpenOptions, SetattrValid, ATTR_SUBMOUNT,
        FOPEN_IN_KILL_SUIDGID, WRITE_KILL_PRIV,
    };
    pub(super) use fuse_backend_rs::api::filesystem::{
        Context, DirEntry, Entry, FileLock, GetxattrReply, ListxattrReply, ZeroCopyReader,
        ZeroCopyWriter,
    };

    pub(super) use super::super::file_handle::{FileHandleMode, InodeRef};
    pub(super) use super::super::handles::HandleData;
    pub(super) use super::super::id_translate::IdTranslation;
    pub(super) use super::super::inodes::{InodeData, InodeKey};
    pub(super) use super::super::locks::{self, FUSE_LK_FLOCK};
    pub(super) use super::super::names::{check_entry_name, check_name, is_dot_or_dotdot};
    pub(super) use super::super::share::ShareStats;
    pub(super) use super::super::sys::{self, cvt, cvt64, errno, FsCredsGuard, ProcFdName};
    pub(super) use super::super::xattrs;
    pub(super) use super::super::{AclMode, CacheMode};
    pub(super) use super::{borrow_file, PassthroughFs};
    pub(super) use std::sync::atomic::{AtomicBool, Ordering};

    pub(super) use crate::sandbox::caps::{CapSet, EffectiveLowered, CAP_SETFCAP, CAP_SYS_ADMIN};
}

mod dirs;
mod files;
mod locking;
mod nodes;
pub mod state;
mod xattr_ops;

impl PassthroughFs {
    /// An empty passthrough layer; shares are added with [`Self::attach_root`].
    pub fn new(cfg: PassthroughConfig) -> io::Result<Self> {
        let proc_self_fd = match &cfg.proc_self_fd {
            Some(f) => f.try_clone(),
            None => File::open("/proc/self/fd"),
        }
        .map_err(|e| io::Error::new(e.kind(), format!("open /proc/self/fd: {e}")))?;
        let timeout = cfg.cache.timeout();
        let session = Arc::new(Session::default());
        let budget = Arc::new(FdBudget::from_rlimit());
        let limits = cfg.limits;
        let translating = !cfg.uids.is_identity() || !cfg.gids.is_identity();
        Ok(PassthroughFs {
            inodes: InodeStore::new(
                ROOT_ID + 1,
                session.clone(),
                budget.clone(),
                limits.max_nodes,
            ),
            handles: HandleStore::new(session.clone(), budget.clone(), limits.max_handles),
            locks: Arc::new(LockTable::new(
                session.clone(),
                budget.clone(),
                limits.max_lock_files,
            )),
            session,
            budget,
            proc_self_fd,
            cfg,
            timeout,
            acl: AtomicBool::new(false),
            translating,
            lost: RwLock::new(HashSet::new()),
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

    /// The next node id this layer would hand out.
    pub fn next_node_id(&self) -> u64 {
        self.inodes.next_id()
    }

    /// Moves the node id counter to at least `next`.
    pub fn advance_node_ids(&self, next: u64) {
        self.inodes.advance_next_id(next);
    }

    /// Gives a volume root the id `new` (see `InodeStore::renumber_fixed`).
    pub fn renumber_root(&self, old: u64, new: u64, lookups: u64) -> io::Result<()> {
        self.inodes.renumber_fixed(old, new, lookups)
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
        if self.cfg.file_handles != FileHandleMode::Never {
            self.enable_handles(&share, &root, key.mnt_id)?;
        }
        self.inodes
            .insert_fixed(nodeid, root, key, libc::S_IFDIR, share)?;
        Ok(())
    }

    /// Decides whether `share`'s nodes are kept by file handle: its file system must
    /// make handles, and the daemon must be able to open them (CAP_DAC_READ_SEARCH).
    /// `prefer` falls back to fds with a warning; `mandatory` refuses the share.
    fn enable_handles(&self, share: &Share, root: &File, mnt_id: u64) -> io::Result<()> {
        let ctx = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let works = InodeRef::handle_of(root)
            .map_err(|e| ctx("name_to_handle_at", e))
            .and_then(|h| {
                let mount = self.mount_fd(root)?;
                h.open_handle(&mount, libc::O_PATH)
                    .map(|_| mount)
                    .map_err(|e| ctx("open_by_handle_at", e))
            });
        match works {
            Ok(mount) => {
                share.mounts.insert(mnt_id, mount);
                share.set_use_handles(true);
                Ok(())
            }
            Err(e) if self.cfg.file_handles == FileHandleMode::Mandatory => Err(io::Error::new(
                e.kind(),
                format!(
                    "share {:?} ({}): --inode-file-handles=mandatory, but file handles do \
                     not work there: {e}",
                    share.name,
                    share.host_path.display()
                ),
            )),
            Err(e) => {
                log::warn!(
                    "share {:?} ({}): file handles do not work there ({e}); its nodes keep \
                     an O_PATH fd each",
                    share.name,
                    share.host_path.display()
                );
                Ok(())
            }
        }
    }

    /// The fd `open_by_handle_at` is given for the mount `dir` (an `O_PATH` fd of a
    /// directory) is on: the kernel takes no `O_PATH` fd there, so it is reopened.
    fn mount_fd(&self, dir: &File) -> io::Result<File> {
        self.reopen_fd(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK)
    }

    /// What a new node of `share` keeps of the inode `file` (an `O_PATH` fd of type
    /// `file_type` on mount `mnt_id`): its file handle where the share uses handles,
    /// else the fd. A submount is entered through its root directory, which gives the
    /// mount its fd for reopening handles; until then its nodes keep fds.
    fn inode_ref_for(
        &self,
        share: &Share,
        file: File,
        file_type: u32,
        mnt_id: u64,
    ) -> io::Result<InodeRef> {
        if !share.uses_handles() {
            return Ok(InodeRef::Fd(file));
        }
        match InodeRef::handle_of(&file) {
            Ok(h) => {
                if !share.mounts.contains(mnt_id) {
                    if file_type != libc::S_IFDIR {
                        // A file bind-mounted on its own: no directory to anchor it.
                        return match self.cfg.file_handles {
                            FileHandleMode::Mandatory => Err(errno(libc::EOPNOTSUPP)),
                            _ => Ok(InodeRef::Fd(file)),
                        };
                    }
                    share.mounts.insert(mnt_id, self.mount_fd(&file)?);
                }
                Ok(h)
            }
            Err(e) if self.cfg.file_handles == FileHandleMode::Mandatory => Err(e),
            // A submount whose file system makes no handles: fds there.
            Err(_) => Ok(InodeRef::Fd(file)),
        }
    }

    /// Whether the live node `data` is the inode `file` refers to (see
    /// [`InodeRef::same_inode`]).
    fn is_same_inode(data: &InodeData, file: &File) -> bool {
        match data.inode_ref() {
            InodeRef::Fd(_) => true,
            handle => InodeRef::handle_of(file).is_ok_and(|f| f.same_inode(handle)),
        }
    }

    /// The entry of a share root as seen from the virtual directory above it: announced
    /// as a submount, so each share has its own st_dev in the guest.
    pub fn share_root_entry(&self, nodeid: u64) -> io::Result<Entry> {
        let data = self.inode(nodeid)?;
        let st = sys::stat_fd(&data.fd()?)?;
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
        self.lost.write().unwrap().clear();
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

    /// The share `nodeid` belongs to (None for unknown ids: the request fails on
    /// its own lookup anyway).
    pub fn share_of(&self, nodeid: u64) -> Option<Arc<Share>> {
        self.inodes.share_of(nodeid)
    }

    fn inode(&self, nodeid: u64) -> io::Result<Arc<InodeData>> {
        self.inodes.get(nodeid).map_err(|e| {
            if self.lost.read().unwrap().contains(&nodeid) {
                errno(libc::ESTALE)
            } else {
                e
            }
        })
    }

    /// Node ids of a device state the guest holds and this daemon lost: ESTALE.
    fn mark_lost(&self, ids: &[u64]) {
        if !ids.is_empty() {
            self.lost.write().unwrap().extend(ids.iter().copied());
        }
    }

    /// Drops a restored node (and its handles) that turned out lost: ESTALE from now.
    fn lose_node(&self, nodeid: u64) {
        if let Ok(data) = self.inodes.get(nodeid) {
            self.handles.remove_node(nodeid);
            self.inodes.forget(nodeid, data.lookups());
        }
        self.mark_lost(&[nodeid]);
    }

    fn handle(&self, fh: u64, nodeid: u64) -> io::Result<Arc<HandleData>> {
        self.handles.get(fh, nodeid)
    }

    /// Reopens the inode's `O_PATH` fd with real open flags. Only regular files and
    /// directories are ever opened: a FIFO would block the queue thread, and a device
    /// node would reach the host's device. A symlink is ELOOP (as O_NOFOLLOW gives),
    /// anything else EBADF, as in virtiofsd.
    fn reopen(&self, inode: &InodeData, flags: libc::c_int) -> io::Result<File> {
        check_openable(inode)?;
        match inode.inode_ref() {
            InodeRef::Fd(f) => self.reopen_fd(f, flags),
            // The handle opens the inode itself with the real flags: no O_PATH step.
            handle => inode.share.mounts.open(
                inode.key().mnt_id,
                handle,
                flags & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL),
            ),
        }
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
            if data.is_dir()
                && (p.key().dev != data.key().dev || p.key().mnt_id != data.key().mnt_id)
            {
                attr_flags |= ATTR_SUBMOUNT;
            }
        }
        Entry {
            inode: data.nodeid,
            generation: 0,
            attr: self.guest_ids(st),
            attr_flags,
            attr_timeout: self.timeout,
            entry_timeout: self.timeout,
        }
    }

    fn register(&self, file: File, parent: &Arc<InodeData>) -> io::Result<Entry> {
        let st = sys::stat_fd(&file)?;
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&file),
        };
        let file_type = st.st_mode & libc::S_IFMT;
        let inode = self.inode_ref_for(&parent.share, file, file_type, key.mnt_id)?;
        let node = self.inodes.insert_or_ref(inode, key, file_type, parent)?;
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

    /// The mode a new entry in `dir` is created with. Without POSIX ACLs the guest
    /// kernel has applied its umask already (applying it again changes nothing). With
    /// them it sends the mode unmasked (FUSE_DONT_MASK) and the umask applies only
    /// where the directory has no default ACL, as the guest's own kernel would do; the
    /// host file system, at umask 0, then inherits the default ACL itself.
    pub(super) fn creation_mode(&self, dir: &InodeData, mode: u32, umask: u32) -> u32 {
        if self.acl.load(Ordering::Relaxed) && self.has_default_acl(dir) {
            mode
        } else {
            mode & !umask
        }
    }

    fn has_default_acl(&self, dir: &InodeData) -> bool {
        let Ok(f) = self.reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK) else {
            return false;
        };
        // SAFETY: a NUL-terminated name; a zero-size query writes nothing.
        let n = unsafe {
            libc::fgetxattr(
                f.as_raw_fd(),
                c"system.posix_acl_default".as_ptr(),
                std::ptr::null_mut(),
                0,
            )
        };
        n > 0
    }

    /// `st` with its owner and group as the guest sees them (`--translate-uid/gid`).
    pub(super) fn guest_ids(&self, mut st: stat64) -> stat64 {
        st.st_uid = self.cfg.uids.to_guest(st.st_uid);
        st.st_gid = self.cfg.gids.to_guest(st.st_gid);
        st
    }

    /// Takes on the guest caller's ids, translated to the host's, for a call that
    /// creates or changes what the caller owns; EPERM for a forbidden guest id.
    pub(super) fn caller_creds(&self, ctx: &Context) -> io::Result<Option<FsCredsGuard>> {
        let uid = self.cfg.uids.to_host(ctx.uid)?;
        let gid = self.cfg.gids.to_host(ctx.gid)?;
        if self.translating {
            FsCredsGuard::switch_translated(uid, gid)
        } else {
            Ok(FsCredsGuard::switch(uid, gid))
        }
    }

    /// The identity a host call whose outcome depends on who asks runs with (SETATTR,
    /// OPEN, WRITE and what else clears setuid bits, links, renames, removals, xattrs,
    /// lookups and directory opens).
    ///
    /// With `--translate-uid/gid` the guest kernel's permission checks are its own (its
    /// root may do anything), so only the daemon can stand for the host's rules: the
    /// call runs as the caller's translated host ids, without supplementary groups,
    /// and the host kernel decides as it would for that user, in the call itself (no
    /// check that a change could race). A non-root fsuid has no CAP_CHOWN,
    /// CAP_DAC_OVERRIDE, CAP_FOWNER or CAP_FSETID, so it cannot chmod or chown what it
    /// does not own, write what it may not write, or keep setuid bits across a write.
    /// A guest id that may not own anything (`forbid-guest`) acts as [`OVERFLOW_ID`].
    ///
    /// Without translation: None, the daemon's own identity, as in virtiofsd (the
    /// guest's root is the host's root; see docs/SECURITY.md).
    pub(super) fn as_caller(&self, ctx: &Context) -> io::Result<Option<FsCredsGuard>> {
        if !self.translating {
            return Ok(None);
        }
        let uid = self.cfg.uids.to_host(ctx.uid).unwrap_or(OVERFLOW_ID);
        let gid = self.cfg.gids.to_host(ctx.gid).unwrap_or(OVERFLOW_ID);
        FsCredsGuard::switch_translated(uid, gid)
    }

    /// [`Self::as_caller`] for an xattr change: `trusted.*` and `security.*` are
    /// decided by CAP_SYS_ADMIN and CAP_SETFCAP, which an fsuid switch leaves in place,
    /// so a translated caller who is not host root has them lowered too.
    /// A forbidden guest id gets EPERM, as for a create.
    pub(super) fn as_caller_for_xattrs(&self, ctx: &Context) -> io::Result<XattrCaller> {
        let creds = self.caller_creds(ctx)?;
        let lowered = if self.translating && self.cfg.uids.to_host(ctx.uid).ok() != Some(0) {
            EffectiveLowered::lower(CapSet::of(&[CAP_SYS_ADMIN, CAP_SETFCAP]))?
        } else {
            None
        };
        Ok(XattrCaller {
            _lowered: lowered,
            _creds: creds,
        })
    }

    /// Reopens `inode` with real open flags as the caller ([`Self::as_caller`]): the
    /// `O_PATH` fd is had first with the daemon's own rights (opening a file handle
    /// needs CAP_DAC_READ_SEARCH), then the magic link is opened as the caller, so
    /// the host checks the caller's access to the file.
    pub(super) fn reopen_as_caller(
        &self,
        ctx: &Context,
        inode: &InodeData,
        flags: libc::c_int,
    ) -> io::Result<File> {
        if !self.translating {
            return self.reopen(inode, flags);
        }
        check_openable(inode)?;
        let path_fd = inode.fd()?;
        let _caller = self.as_caller(ctx)?;
        self.reopen_fd(&*path_fd, flags)
    }

    fn open_options(&self, is_dir: bool) -> OpenOptions {
        match self.cfg.cache {
            CacheMode::None | CacheMode::Metadata if !is_dir => OpenOptions::DIRECT_IO,
            CacheMode::None | CacheMode::Auto => OpenOptions::empty(),
            // Listings stay cached as the attributes do; data never is.
            CacheMode::Metadata => OpenOptions::CACHE_DIR | OpenOptions::KEEP_CACHE,
            CacheMode::Always if is_dir => OpenOptions::CACHE_DIR,
            CacheMode::Always => OpenOptions::KEEP_CACHE,
        }
    }

    /// Flags the host open gets: the guest's, minus what would change confinement or
    /// semantics (`O_NOFOLLOW` is ours to set; `O_DIRECT` is dropped as virtiofsd does,
    /// since guest buffers need not meet the host file system's alignment, unless
    /// `--allow-direct-io` asks for it; `O_NOATIME` unless `--preserve-noatime`).
    fn host_open_flags(&self, flags: u32) -> libc::c_int {
        let flags = flags as libc::c_int;
        let mut dropped = libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY;
        if !self.cfg.allow_direct_io {
            dropped |= libc::O_DIRECT;
        }
        if !self.cfg.preserve_noatime {
            dropped |= libc::O_NOATIME;
        }
        (flags & !dropped) | libc::O_CLOEXEC
    }

    /// The attributes of `inode` as the guest sees them, through its open file when
    /// it names one.
    fn stat_with_handle(&self, inode: &InodeData, fh: Option<u64>) -> io::Result<stat64> {
        if let Some(fh) = fh {
            if let Ok(h) = self.handle(fh, inode.nodeid) {
                return sys::stat_fd(&h.file).map(|st| self.guest_ids(st));
            }
        }
        sys::stat_fd(&inode.fd()?).map(|st| self.guest_ids(st))
    }
}

fs_layer! {
    self: PassthroughFs => inodes;
    fn init(capable: FsOptions) -> io::Result<FsOptions> = inherent;
    fn forget(ctx: &Context, inode: u64, count: u64) = inherent;
    fn batch_forget(ctx: &Context, requests: Vec<(u64, u64)>) = inherent;
    fn lookup(ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> = inherent;
    fn getattr(ctx: &Context, inode: u64, handle: Option<u64>)
        -> io::Result<(stat64, Duration)> = inherent;
    fn setattr(ctx: &Context, inode: u64, attr: stat64, handle: Option<u64>, valid: SetattrValid)
        -> io::Result<(stat64, Duration)> = inherent;
    fn readlink(ctx: &Context, inode: u64) -> io::Result<Vec<u8>> = inherent;
    fn symlink(ctx: &Context, linkname: &CStr, parent: u64, name: &CStr)
        -> io::Result<Entry> = inherent;
    fn mknod(ctx: &Context, parent: u64, name: &CStr, mode: u32, rdev: u32, umask: u32)
        -> io::Result<Entry> = inherent;
    fn mkdir(ctx: &Context, parent: u64, name: &CStr, mode: u32, umask: u32)
        -> io::Result<Entry> = inherent;
    fn unlink(ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> = inherent;
    fn rmdir(ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> = inherent;
    fn rename(ctx: &Context, olddir: u64, oldname: &CStr, newdir: u64, newname: &CStr, flags: u32)
        -> io::Result<()> = inherent;
    fn link(ctx: &Context, inode: u64, newparent: u64, newname: &CStr)
        -> io::Result<Entry> = inherent;
    fn open(ctx: &Context, inode: u64, flags: u32, fuse_flags: u32)
        -> io::Result<(Option<u64>, OpenOptions, Option<u32>)>
        = inherent;
    fn create(ctx: &Context, parent: u64, name: &CStr, args: CreateIn)
        -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> = inherent;
    fn read(ctx: &Context, inode: u64, handle: u64, w: &mut dyn ZeroCopyWriter, size: u32,
        offset: u64, lock_owner: Option<u64>, flags: u32) -> io::Result<usize> = inherent;
    fn write(ctx: &Context, inode: u64, handle: u64, r: &mut dyn ZeroCopyReader, size: u32,
        offset: u64, lock_owner: Option<u64>, delayed_write: bool, flags: u32, fuse_flags: u32)
        -> io::Result<usize> = inherent;
    fn flush(ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()>
        = inherent;
    fn fsync(ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()>
        = inherent;
    fn fallocate(ctx: &Context, inode: u64, handle: u64, mode: u32, offset: u64, length: u64)
        -> io::Result<()> = inherent;
    fn release(ctx: &Context, inode: u64, flags: u32, handle: u64, flush: bool,
        flock_release: bool, lock_owner: Option<u64>) -> io::Result<()> = inherent;
    fn statfs(ctx: &Context, inode: u64) -> io::Result<statvfs64> = inherent;
    fn setxattr(ctx: &Context, inode: u64, name: &CStr, value: &[u8], flags: u32)
        -> io::Result<()> = inherent;
    fn getxattr(ctx: &Context, inode: u64, name: &CStr, size: u32)
        -> io::Result<GetxattrReply> = inherent;
    fn listxattr(ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply>
        = inherent;
    fn removexattr(ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> = inherent;
    fn opendir(ctx: &Context, inode: u64, flags: u32) -> io::Result<(Option<u64>, OpenOptions)>
        = inherent;
    fn readdir(ctx: &Context, inode: u64, handle: u64, size: u32, offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>) -> io::Result<()>
        = inherent;
    fn readdirplus(ctx: &Context, inode: u64, handle: u64, size: u32, offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>) -> io::Result<()>
        = inherent;
    fn fsyncdir(ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()>
        = inherent;
    fn releasedir(ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()>
        = inherent;
    fn access(ctx: &Context, inode: u64, mask: u32) -> io::Result<()>
        = inherent;
    fn lseek(ctx: &Context, inode: u64, handle: u64, offset: u64, whence: u32)
        -> io::Result<u64> = inherent;
    fn getlk(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock, flags: u32)
        -> io::Result<FileLock> = inherent;
    fn setlk(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock, flags: u32)
        -> io::Result<()> = inherent;
    fn setlkw(ctx: &Context, inode: u64, handle: u64, owner: u64, lock: FileLock, flags: u32)
        -> io::Result<()> = inherent;
}
