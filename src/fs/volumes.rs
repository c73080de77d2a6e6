//! The volume layer, in two parts that share the [`Registry`]:
//! - [`VolumeFs`], on the data path: routes each request either to a virtual
//!   directory (the mount root and the directories above nested volumes, answered
//!   from the registry) or to the passthrough layer. Virtual directories are
//!   traversable and listable but not writable: every mutation there fails with
//!   [`VIRTUAL_DIR_ERRNO`] (EACCES).
//! - [`Volumes`], the control API's door: attach (which opens the volume's private
//!   mount), detach (which revokes it), list, and the guest session's reset.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{stat64, statvfs64};
use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, FileSystem};
use log::{info, warn};

use super::layer::fs_layer;
use super::names::check_name;
use super::passthrough::PassthroughFs;
use super::registry::{AttachError, Child, Registry, ShareSpec, ROOT_ID};
use super::share::Share;
use super::share_root::{changed_since_checked, open_share_dir, open_share_root, private_mount};
use super::sys::{self, errno};
use crate::qos::RateLimit;

/// The errno of every mutation in a virtual directory.
pub const VIRTUAL_DIR_ERRNO: libc::c_int = libc::EACCES;

/// How long a detach waits for requests in flight on the volume to finish.
const DETACH_DRAIN: Duration = Duration::from_secs(1);

fn refuse() -> io::Error {
    errno(VIRTUAL_DIR_ERRNO)
}

/// What a caller can read about an attached volume.
pub struct ShareInfo {
    pub share: Arc<Share>,
    pub live_inodes: usize,
    pub open_handles: usize,
}

/// The data path of the volume layer.
pub struct VolumeFs {
    registry: Arc<Registry>,
    inner: Arc<PassthroughFs>,
    /// SharedDir, for the virtual root's statfs.
    shared_dir: Arc<File>,
    /// Attributes of every virtual directory (SharedDir's, made read-only).
    vattr: stat64,
    timeout: Duration,
}

impl VolumeFs {
    pub fn new(
        registry: Arc<Registry>,
        inner: Arc<PassthroughFs>,
        shared_dir: Arc<File>,
        timeout: Duration,
    ) -> io::Result<Self> {
        let mut vattr = sys::stat_fd(&*shared_dir)?;
        vattr.st_mode = libc::S_IFDIR | 0o555;
        vattr.st_nlink = 2;
        vattr.st_uid = 0;
        vattr.st_gid = 0;
        Ok(VolumeFs {
            registry,
            inner,
            shared_dir,
            vattr,
            timeout,
        })
    }

    /// Whether `nodeid` is one of this layer's own (a virtual directory).
    fn owns(&self, nodeid: u64) -> bool {
        self.registry.is_virtual(nodeid)
    }

    /// The volume `nodeid` belongs to; None for virtual directories and unknown ids.
    pub fn share_of(&self, nodeid: u64) -> Option<Arc<Share>> {
        if self.owns(nodeid) {
            return None;
        }
        self.inner.share_of(nodeid)
    }

    /// Whether the virtual directory `nodeid` exists: else `missing`, the errno of
    /// the operation for a node that is not there. Ids with [`VIRTUAL_BIT`] that
    /// name no virtual directory are a guest's forgery or a detached volume's.
    fn own_exists(&self, nodeid: u64, missing: libc::c_int) -> io::Result<()> {
        if self.registry.dir_exists(nodeid) {
            Ok(())
        } else {
            Err(errno(missing))
        }
    }

    fn vdir_entry(&self, nodeid: u64) -> Entry {
        let mut attr = self.vattr;
        attr.st_ino = nodeid;
        Entry {
            inode: nodeid,
            generation: 0,
            attr,
            attr_flags: 0,
            attr_timeout: self.timeout,
            entry_timeout: self.timeout,
        }
    }

    fn lookup_routed(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        if self.owns(parent) {
            return self.lookup_virtual(parent, name);
        }
        // `..` of a volume root is the virtual directory above it, never SharedDir.
        if name.to_bytes() == b".." {
            if let Some(vparent) = self.registry.parent_of_root(parent) {
                return Ok(self.vdir_entry(vparent));
            }
        }
        self.inner.lookup(ctx, parent, name)
    }

    fn lookup_virtual(&self, parent: u64, name: &CStr) -> io::Result<Entry> {
        check_name(name)?;
        match self.registry.child(parent, name.to_bytes()) {
            Some(Child::Dir(id)) => Ok(self.vdir_entry(id)),
            Some(Child::Share(root)) => self.inner.share_root_entry(root),
            None => Err(errno(libc::ENOENT)),
        }
    }

    fn readdir_virtual(
        &self,
        nodeid: u64,
        offset: u64,
        plus: bool,
        add: &mut dyn FnMut(DirEntry, Option<Entry>) -> io::Result<usize>,
    ) -> io::Result<()> {
        let (parent, children) = self
            .registry
            .list_dir(nodeid)
            .ok_or_else(|| errno(libc::ENOENT))?;
        let mut all: Vec<(Vec<u8>, Child)> = vec![
            (b".".to_vec(), Child::Dir(nodeid)),
            (b"..".to_vec(), Child::Dir(parent)),
        ];
        all.extend(children.into_iter().map(|(n, c)| (n.into_bytes(), c)));
        for (i, (name, child)) in all.iter().enumerate().skip(offset as usize) {
            let dirent = DirEntry {
                ino: child.nodeid(),
                offset: i as u64 + 1,
                type_: libc::DT_DIR as u32,
                name,
            };
            let entry = if !plus || i < 2 {
                None
            } else {
                let cname = CString::new(name.clone()).map_err(|_| errno(libc::EIO))?;
                match self.lookup_virtual(nodeid, &cname) {
                    Ok(e) => Some(e),
                    // Detached since we listed it: skip it.
                    Err(_) => continue,
                }
            };
            if add(dirent, entry)? == 0 {
                // Volume roots and virtual dirs take no counted reference: nothing to undo.
                return Ok(());
            }
        }
        Ok(())
    }

    fn statfs_virtual(&self) -> io::Result<statvfs64> {
        let mut out = std::mem::MaybeUninit::<statvfs64>::zeroed();
        // SAFETY: fstatvfs fills `out`; the result is checked.
        sys::cvt(unsafe { libc::fstatvfs64(self.shared_dir.as_raw_fd(), out.as_mut_ptr()) })?;
        // SAFETY: fstatvfs succeeded.
        Ok(unsafe { out.assume_init() })
    }

    /// An operation on two nodes: refused if either is a virtual directory (ENOENT
    /// first if either is one that does not exist).
    fn two_nodes<T>(&self, a: u64, b: u64, run: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        for n in [a, b] {
            if self.owns(n) {
                self.own_exists(n, libc::ENOENT)?;
            }
        }
        if self.owns(a) || self.owns(b) {
            return Err(refuse());
        }
        run()
    }
}

// What differs from the volume below: the virtual directories.
fs_layer! {
    self: VolumeFs => inner;
    others = pass;
    lookup(ctx, parent, name) = own => self.lookup_routed(ctx, parent, name);
    getattr(_, inode, ..) = route => Ok((self.vdir_entry(inode).attr, self.timeout));
    // Every mutation in a virtual directory.
    setattr, symlink, mknod, mkdir, unlink, rmdir, create, setxattr, removexattr, tmpfile
        = route => Err(refuse());
    // An operation on two nodes: refused if either is a virtual directory.
    rename(ctx, olddir, oldname, newdir, newname, flags) = own => {
        self.two_nodes(olddir, newdir, || {
            self.inner.rename(ctx, olddir, oldname, newdir, newname, flags)
        })
    };
    link(ctx, inode, newparent, newname) = own => self.two_nodes(inode, newparent, || {
        self.inner.link(ctx, inode, newparent, newname)
    });
    readlink = route => Err(errno(libc::EINVAL));
    open = route => Err(errno(libc::EISDIR));
    statfs = route => self.statfs_virtual();
    getxattr = route => Err(errno(libc::ENODATA));
    listxattr(_, _, size) = route => Ok(if size == 0 {
        ListxattrReply::Count(0)
    } else {
        ListxattrReply::Names(Vec::new())
    });
    // A virtual listing is computed from the registry on each READDIR: no handle.
    opendir = route => Ok((None, OpenOptions::empty()));
    readdir(_, inode, _, _, offset, add_entry)
        = route => self.readdir_virtual(inode, offset, false, &mut |d, _| add_entry(d));
    readdirplus(_, inode, _, _, offset, add_entry) = route => self.readdir_virtual(
        inode, offset, true, &mut |d, e| add_entry(d, e.unwrap_or_default()),
    );
    // No handle was ever given out for a virtual directory that does not exist:
    // EBADF, as the passthrough layer answers for a handle it never gave out.
    fsyncdir, releasedir = route(libc::EBADF) => Ok(());
    access(_, _, mask) = route => if mask & libc::W_OK as u32 != 0 {
        Err(refuse())
    } else {
        Ok(())
    };
    // A virtual directory holds every volume below it.
    syncfs(ctx, _) = route => self.registry.list().into_iter().try_for_each(|(_, root)| {
        self.inner.syncfs(ctx, root)
    });
}

/// The control side of the volume layer.
pub struct Volumes {
    registry: Arc<Registry>,
    inner: Arc<PassthroughFs>,
    /// SharedDir, opened once: volumes are opened beneath it.
    shared_dir: Arc<File>,
    /// Wakes the requests waiting for a volume's tokens (the transport's timers)
    /// when a limit changes or a volume is detached: they go now, not when their
    /// tokens would have come.
    limits_changed: RwLock<Option<LimitsChanged>>,
}

/// What [`Volumes`] calls when a volume's limit changes or it is detached.
pub type LimitsChanged = Box<dyn Fn() + Send + Sync>;

impl Volumes {
    /// Sets what a limit change or a detach wakes (the transport, once it runs).
    pub fn on_limits_changed(&self, wake: LimitsChanged) {
        *self.limits_changed.write().unwrap() = Some(wake);
    }

    fn wake_waiting(&self) {
        if let Some(wake) = self.limits_changed.read().unwrap().as_ref() {
            wake();
        }
    }

    /// Sets (None: lifts) a volume's rate limit; its waiting requests are looked at
    /// anew at once. None if unknown.
    pub fn set_limit(&self, name: &str, limit: Option<RateLimit>) -> Option<ShareInfo> {
        let info = self.get(name)?;
        info.share.stats.qos.set(limit);
        self.wake_waiting();
        Some(info)
    }

    /// The whole SharedDir at the mount root, as virtiofsd serves it.
    pub fn whole(
        inner: Arc<PassthroughFs>,
        shared_dir: &Path,
        read_only: bool,
    ) -> io::Result<Self> {
        let dir = Arc::new(open_dir(shared_dir)?);
        let root = match open_share_root(&dir, &[], read_only) {
            Ok(r) => r,
            // Without CAP_SYS_ADMIN a rw share is served through a plain fd (the
            // daemon's checks still confine it); a read-only one must not start.
            Err(e) if !read_only && e.raw_os_error() == Some(libc::EPERM) => {
                // Once, at start-up: outside the log budget.
                warn!(
                    target: crate::logging::LIFECYCLE,
                    "serving SharedDir without a private mount: {e}"
                );
                dir.try_clone()?
            }
            Err(e) => return Err(e),
        };
        let share = Arc::new(Share::new(
            String::new(),
            shared_dir.to_path_buf(),
            read_only,
        ));
        inner.attach_root(ROOT_ID, root, share.clone())?;
        Ok(Volumes {
            registry: Arc::new(Registry::whole(share).with_journal(inner.journal())),
            inner,
            shared_dir: dir,
            limits_changed: RwLock::default(),
        })
    }

    /// An empty virtual root; volumes are attached with [`Self::attach`].
    pub fn empty(
        inner: Arc<PassthroughFs>,
        shared_dir: &Path,
        read_only: bool,
    ) -> io::Result<Self> {
        let registry = Registry::volumes().with_journal(inner.journal());
        if read_only {
            registry.force_read_only();
        }
        Ok(Volumes {
            registry: Arc::new(registry),
            inner,
            shared_dir: Arc::new(open_dir(shared_dir)?),
            limits_changed: RwLock::default(),
        })
    }

    /// The data path over the same volumes.
    pub fn data_path(&self, timeout: Duration) -> io::Result<VolumeFs> {
        VolumeFs::new(
            self.registry.clone(),
            self.inner.clone(),
            self.shared_dir.clone(),
            timeout,
        )
    }

    /// Attaches a volume: the guest sees it on its next lookup or readdir.
    pub fn attach(&self, spec: &ShareSpec) -> Result<Arc<Share>, AttachError> {
        let (spec, key) = self.registry.check(spec)?;
        // Opening the volume's root touches the disk (maybe a slow network file
        // system): it happens outside every lock the data path takes.
        let io_err =
            |e: io::Error| AttachError::Io(io::Error::new(e.kind(), format!("{key}: {e}")));
        let dir = open_share_dir(&self.shared_dir, &spec.path.rel).map_err(|e| {
            match changed_since_checked(&e) {
                Some(now) => AttachError::PathChanged(format!(
                    "path {} changed while being attached: {now}",
                    spec.path.host.display()
                )),
                None => io_err(e),
            }
        })?;
        let root = private_mount(&dir, spec.read_only).map_err(io_err)?;
        let mut share = Share::new(key.clone(), spec.path.host.clone(), spec.read_only);
        share.volume_id = spec.volume_id.clone();
        share.stats.qos.set(spec.rate_limit);
        let share = Arc::new(share);
        let root_nodeid = self.inner.alloc_nodeid();
        self.inner
            .attach_root(root_nodeid, root, share.clone())
            .map_err(AttachError::Io)?;
        if let Err(e) = self.registry.insert(&spec, share.clone(), root_nodeid, || {
            self.inner.alloc_nodeid()
        }) {
            // Another attach won the race for the name: undo ours.
            self.inner.detach_share(&share);
            return Err(e);
        }
        info!(
            "attached {key} ({}{}{})",
            if spec.read_only { "ro" } else { "rw" },
            spec.volume_id
                .as_ref()
                .map(|v| format!(", volume {v}"))
                .unwrap_or_default(),
            share
                .stats
                .qos
                .limit()
                .map(|l| format!(", limited to {}", crate::qos::describe(&l)))
                .unwrap_or_default()
        );
        Ok(share)
    }

    /// Detaches a volume: its name is gone at once, nothing more can be registered
    /// under it, and requests in flight on it are waited for (up to [`DETACH_DRAIN`]),
    /// so that no fd into it is left when this returns. None if unknown.
    pub fn detach(&self, name: &str) -> Option<Arc<Share>> {
        let share = self.registry.remove(name)?.share;
        // Its throttled requests are served now (and fail: the volume is gone); the
        // limit no longer counts as one.
        share.stats.qos.set(None);
        self.wake_waiting();
        let (nodes, handles) = self.inner.detach_share(&share);
        let deadline = Instant::now() + DETACH_DRAIN;
        while Arc::strong_count(&share) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let in_flight = Arc::strong_count(&share) - 1;
        if in_flight > 0 {
            warn!(
                "detached {name}: {in_flight} requests still in flight after {DETACH_DRAIN:?}; \
                 their fds close when they finish"
            );
        }
        info!("detached {name}: released {nodes} node ids and {handles} handles");
        Some(share)
    }

    /// Starts a new guest session (a second INIT, DESTROY, a device reset): see
    /// `PassthroughFs::reset_session`. Attached volumes stay attached.
    pub fn reset_session(&self) {
        let (nodes, handles, lock_files) = self.inner.reset_session();
        info!(
            "new guest session: released {nodes} node ids, {handles} handles and \
             {lock_files} lock files of the previous one"
        );
    }

    pub fn list(&self) -> Vec<ShareInfo> {
        self.registry
            .list()
            .into_iter()
            .map(|(share, _)| self.info(share))
            .collect()
    }

    /// The registry of attached volumes (for the device state).
    pub(super) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The passthrough layer under every volume (for the device state).
    pub(super) fn passthrough(&self) -> &PassthroughFs {
        &self.inner
    }

    /// Host fds held for the guest across volumes, and the most it may hold.
    pub fn fd_budget(&self) -> (usize, usize) {
        self.inner.fd_budget()
    }

    pub fn get(&self, name: &str) -> Option<ShareInfo> {
        self.registry.get(name).map(|s| self.info(s))
    }

    fn info(&self, share: Arc<Share>) -> ShareInfo {
        let (live_inodes, open_handles) = self.inner.share_usage(&share);
        ShareInfo {
            share,
            live_inodes,
            open_handles,
        }
    }
}

fn open_dir(path: &Path) -> io::Result<File> {
    File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}
