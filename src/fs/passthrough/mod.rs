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
use std::sync::RwLock;

use super::handles::HandleStore;
use super::inodes::InodeStore;
use super::journal::Journal;
use super::layer::fs_layer;
use super::limits::{FdBudget, Limits, SessionEpoch};
use super::locks::LockTable;
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
    /// Under a keeper: where what the guest holds is recorded for a successor (the
    /// daemon makes it with the session region, `src/region/`).
    pub journal: Option<&'static Journal>,
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
            journal: None,
        }
    }
}

pub struct PassthroughFs {
    inodes: InodeStore,
    handles: HandleStore,
    /// Shared with the thread that waits for locks a loaded state names.
    locks: Arc<LockTable>,
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
    /// An upgrade's preview (`state/preview.rs`): in the old serving process, the last
    /// one taken (its id, the node ids it named); in the new one, what it preloaded.
    preview: std::sync::Mutex<state::PreviewSide>,
}

/// The host id a guest id no rule lets own anything (`forbid-guest`) acts as: Linux's
/// default overflow id, `nobody`, which owns nothing a guest should reach.
pub const OVERFLOW_ID: u32 = 65534;

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
    pub(super) use super::super::inodes::{FoundAt, InodeData, InodeKey};
    pub(super) use super::super::locks::{self, FUSE_LK_FLOCK};
    pub(super) use super::super::names::{check_entry_name, check_name, is_dot_or_dotdot};
    pub(super) use super::super::ops::CopyRange;
    pub(super) use super::super::options::{AclMode, CacheMode};
    pub(super) use super::super::share::ShareStats;
    pub(super) use super::super::sys::{self, cvt, cvt64, errno, FsCredsGuard, ProcFdName};
    pub(super) use super::super::xattrs;
    pub(super) use super::host_file::HostFile;
    pub(super) use super::PassthroughFs;
    pub(super) use std::sync::atomic::{AtomicBool, Ordering};

    pub(super) use crate::sandbox::caps::{CapSet, EffectiveLowered, CAP_SETFCAP, CAP_SYS_ADMIN};
}

mod dirs;
mod files;
mod host_file;
mod identity;
mod locking;
mod nodes;
mod roots;
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
        let session = Arc::new(SessionEpoch::default());
        let budget = Arc::new(FdBudget::from_rlimit());
        let limits = cfg.limits;
        let translating = !cfg.uids.is_identity() || !cfg.gids.is_identity();
        Ok(PassthroughFs {
            inodes: InodeStore::new(
                ROOT_ID + 1,
                session.clone(),
                budget.clone(),
                limits.max_nodes,
                cfg.journal,
            ),
            handles: HandleStore::new(
                session.clone(),
                budget.clone(),
                limits.max_handles,
                cfg.journal,
            ),
            locks: Arc::new(LockTable::new(
                session.clone(),
                budget.clone(),
                limits.max_lock_files,
                cfg.journal,
            )),
            budget,
            proc_self_fd,
            cfg,
            timeout,
            acl: AtomicBool::new(false),
            translating,
            lost: RwLock::new(HashSet::new()),
            preview: Default::default(),
        })
    }

    /// Where what the guest holds is recorded for a successor (None: no keeper).
    pub fn journal(&self) -> Option<&'static Journal> {
        self.cfg.journal
    }

    /// The fds held for the guest, and the most it may hold (all volumes).
    pub fn fd_budget(&self) -> (usize, usize) {
        (self.budget.used(), self.budget.max())
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

    /// The root node of `share`, if `nodeid` is it.
    pub fn share_root(&self, nodeid: u64, share: &Arc<Share>) -> Option<Arc<InodeData>> {
        self.inodes
            .get(nodeid)
            .ok()
            .filter(|d| d.is_share_root() && Arc::ptr_eq(&d.share, share))
    }

    /// Whether the guest's INIT turned POSIX ACLs on; a refused load puts back what
    /// its replay of the INIT changed.
    pub fn acl_on(&self) -> bool {
        self.acl.load(Ordering::Relaxed)
    }

    pub fn set_acl_on(&self, on: bool) {
        self.acl.store(on, Ordering::Relaxed);
    }

    /// Gives a volume root the id `new` (see `InodeStore::renumber_fixed`).
    pub fn renumber_root(&self, old: u64, new: u64, lookups: u64) -> io::Result<()> {
        self.inodes.renumber_fixed(old, new, lookups)
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

    /// Whether node `nodeid` is the inode (`dev`, `ino`); if it is another now, it is
    /// lost (ESTALE from now on). A node the load did not find again is not.
    pub fn is_inode(&self, nodeid: u64, dev: u64, ino: u64) -> bool {
        let Ok(data) = self.inodes.get(nodeid) else {
            return false;
        };
        let key = data.key();
        if (key.dev, key.ino) == (dev, ino) {
            return true;
        }
        log::warn!(
            "{}: node {nodeid} leads to another file than the guest held (renamed over \
             since it was recorded?): ESTALE",
            crate::state::VolumeLabel(&data.share.name)
        );
        drop(data);
        self.lose_node(nodeid);
        false
    }

    /// Whether the guest's handle `fh` of `nodeid` writes at the end of the file
    /// (its host file is `O_APPEND`): such a WRITE is not run twice after a crash.
    pub fn appends(&self, fh: u64, nodeid: u64) -> bool {
        self.handle(fh, nodeid).is_ok_and(|h| {
            // SAFETY: F_GETFL on an fd the handle owns.
            let fl = unsafe { libc::fcntl(h.file.as_raw_fd(), libc::F_GETFL) };
            fl >= 0 && fl & libc::O_APPEND != 0
        })
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

    /// Registers `file`, found as `name` in `parent` (empty: no name, a temporary
    /// file), as a node.
    fn register(&self, file: File, parent: &Arc<InodeData>, name: &[u8]) -> io::Result<Entry> {
        let (st, mnt_id) = sys::stat_and_mount_id(&file)?;
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id,
        };
        let file_type = st.st_mode & libc::S_IFMT;
        let inode = self.inode_ref_for(&parent.share, file, file_type, key.mnt_id)?;
        let node = self
            .inodes
            .insert_or_ref(inode, key, file_type, parent, name)?;
        Ok(self.entry_from(&node, st, Some(parent)))
    }

    /// Registers the file `opened` (just created or opened in `dir`) as a node, and
    /// its open file as a handle. The node's `O_PATH` fd comes from the open file
    /// itself, so a rename racing the create cannot swap in another inode.
    fn register_open(
        &self,
        dir: &Arc<InodeData>,
        opened: File,
        name: &[u8],
    ) -> io::Result<(Entry, u64)> {
        let proc_name = ProcFdName::new(opened.as_raw_fd());
        let path_fd = sys::openat(&self.proc_self_fd, proc_name.as_cstr(), libc::O_PATH, 0)?;
        let entry = self.register(path_fd, dir, name)?;
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

// Every operation is this layer's own inherent method, in the file of its topic.
fs_layer! {
    self: PassthroughFs;
    others = inherent;
}
