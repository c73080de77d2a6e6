//! The volume layer: which shares the guest sees, and the virtual directories above
//! them.
//!
//! Two layouts:
//! - **whole share** (no allowed dirs): the mount root is SharedDir itself, as in
//!   virtiofsd;
//! - **volumes**: the mount root is a virtual directory that lists only the attached
//!   shares, plus the intermediate directories leading to nested ones (`rw/vol-a`).
//!   Nothing else of SharedDir has a node id, so nothing else can be reached.
//!
//! Virtual directories are traversable and listable but not writable: every mutation
//! there fails with [`VIRTUAL_DIR_ERRNO`] (EACCES). Each share root is announced to the
//! guest as a submount, so every share has its own st_dev.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::SetattrValid;
use fuse_backend_rs::abi::fuse_abi::{stat64, statvfs64, CreateIn, FsOptions, OpenOptions};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileLock, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyReader,
    ZeroCopyWriter,
};
use log::{info, warn};

use super::names::{check_name, valid_volume_name, VOLUME_NAME_RULE};
use super::passthrough::{PassthroughConfig, PassthroughFs, ROOT_ID};
use super::share::Share;
use super::share_root::{open_share_root, SharePath};
use super::sys::{self, errno};
use super::{ExtraOps, ShareOf};

/// The errno of every mutation in a virtual directory (the mount root and the
/// intermediate directories above nested shares).
pub const VIRTUAL_DIR_ERRNO: libc::c_int = libc::EACCES;

/// Node ids of virtual directories (other than the root) carry this bit, so telling
/// a virtual node from a share's node needs no lock on the hot path. The shared
/// 64-bit counter never reaches it.
const VIRTUAL_BIT: u64 = 1 << 63;

/// How long a detach waits for requests in flight on the volume to finish.
const DETACH_DRAIN: Duration = Duration::from_secs(1);

/// A share to attach.
#[derive(Clone, Debug)]
pub struct ShareSpec {
    /// Where the guest sees it, as path components under the mount root.
    pub guest: Vec<String>,
    /// The host directory, validated inside SharedDir.
    pub path: SharePath,
    pub read_only: bool,
    pub volume_id: Option<String>,
}

/// What a caller can read about an attached share.
pub struct ShareInfo {
    pub share: Arc<Share>,
    pub live_inodes: usize,
    pub open_handles: usize,
}

pub enum AttachError {
    /// The same name is attached with other parameters, or overlaps another share.
    Conflict(String),
    /// An identical share is already attached (an idempotent retry).
    AlreadyAttached(Arc<Share>),
    /// The layout has no room for volumes (whole-share mode).
    NotVolumeLayout,
    Io(io::Error),
}

impl std::fmt::Debug for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachError::Conflict(s) => write!(f, "{s}"),
            AttachError::AlreadyAttached(s) => write!(f, "{} is already attached", s.name),
            AttachError::NotVolumeLayout => {
                write!(
                    f,
                    "the whole SharedDir is served; volumes cannot be attached"
                )
            }
            AttachError::Io(e) => write!(f, "{e}"),
        }
    }
}

struct VirtualDir {
    path: Vec<String>,
    parent: u64,
}

struct Attached {
    share: Arc<Share>,
    /// Guest path components.
    rel: Vec<String>,
    /// Host path components under SharedDir.
    host_rel: Vec<String>,
    root_nodeid: u64,
}

#[derive(Default)]
struct Table {
    vdirs: HashMap<u64, VirtualDir>,
    vdir_by_path: HashMap<Vec<String>, u64>,
    /// Keyed by the guest path joined with '/'.
    shares: BTreeMap<String, Attached>,
    share_by_root: HashMap<u64, String>,
}

enum Child {
    Share(u64),
    Dir(u64),
}

impl Table {
    /// The names directly under the virtual dir at `path`, in order.
    fn children(&self, path: &[String]) -> Vec<(String, Child)> {
        let mut names = BTreeSet::new();
        for a in self.shares.values() {
            if a.rel.len() > path.len() && a.rel[..path.len()] == *path {
                names.insert(a.rel[path.len()].clone());
            }
        }
        names
            .into_iter()
            .filter_map(|n| {
                let mut p = path.to_vec();
                p.push(n.clone());
                self.child_at(&p).map(|c| (n, c))
            })
            .collect()
    }

    fn child_at(&self, p: &[String]) -> Option<Child> {
        if let Some(a) = self.shares.get(&p.join("/")) {
            if a.rel == p {
                return Some(Child::Share(a.root_nodeid));
            }
        }
        self.vdir_by_path.get(p).map(|id| Child::Dir(*id))
    }
}

pub struct VolumeFs {
    inner: PassthroughFs,
    /// SharedDir, opened once: shares are opened beneath it.
    shared_dir: File,
    volume_layout: bool,
    /// `--readonly`: every share attached is read-only, whatever the request says.
    all_read_only: AtomicBool,
    table: RwLock<Table>,
    vattr: stat64,
    timeout: Duration,
}

impl VolumeFs {
    /// The whole SharedDir at the mount root, as virtiofsd serves it.
    pub fn whole(shared_dir: &Path, read_only: bool, cfg: PassthroughConfig) -> io::Result<Self> {
        let fs = Self::base(shared_dir, false, cfg)?;
        let root = match open_share_root(&fs.shared_dir, &[], read_only) {
            Ok(r) => r,
            // Without CAP_SYS_ADMIN a rw share is served through a plain fd (the
            // daemon's checks still confine it); a read-only one must not start.
            Err(e) if !read_only && e.raw_os_error() == Some(libc::EPERM) => {
                warn!("serving SharedDir without a private mount: {e}");
                fs.shared_dir.try_clone()?
            }
            Err(e) => return Err(e),
        };
        let share = Arc::new(Share::new(
            String::new(),
            shared_dir.to_path_buf(),
            read_only,
        ));
        fs.inner.attach_root(ROOT_ID, root, share.clone())?;
        fs.table.write().unwrap().shares.insert(
            String::new(),
            Attached {
                share,
                rel: Vec::new(),
                host_rel: Vec::new(),
                root_nodeid: ROOT_ID,
            },
        );
        Ok(fs)
    }

    /// A virtual root that lists only the shares attached to it.
    pub fn volumes(shared_dir: &Path, cfg: PassthroughConfig) -> io::Result<Self> {
        let fs = Self::base(shared_dir, true, cfg)?;
        {
            let mut t = fs.table.write().unwrap();
            t.vdirs.insert(
                ROOT_ID,
                VirtualDir {
                    path: Vec::new(),
                    parent: ROOT_ID,
                },
            );
            t.vdir_by_path.insert(Vec::new(), ROOT_ID);
        }
        Ok(fs)
    }

    fn base(shared_dir: &Path, volume_layout: bool, cfg: PassthroughConfig) -> io::Result<Self> {
        let dir = File::open(shared_dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", shared_dir.display())))?;
        let mut vattr = sys::stat_fd(&dir)?;
        vattr.st_mode = libc::S_IFDIR | 0o555;
        vattr.st_nlink = 2;
        vattr.st_uid = 0;
        vattr.st_gid = 0;
        let timeout = cfg.cache.timeout();
        Ok(VolumeFs {
            inner: PassthroughFs::new(cfg)?,
            shared_dir: dir,
            volume_layout,
            all_read_only: AtomicBool::new(false),
            table: RwLock::new(Table::default()),
            vattr,
            timeout,
        })
    }

    /// Makes every later attach read-only (`--readonly`).
    pub fn force_read_only(&self) {
        self.all_read_only.store(true, Ordering::Relaxed);
    }

    pub fn inner(&self) -> &PassthroughFs {
        &self.inner
    }

    /// Attaches a share: the guest sees it on its next lookup or readdir.
    pub fn attach(&self, spec: &ShareSpec) -> Result<Arc<Share>, AttachError> {
        if !self.volume_layout {
            return Err(AttachError::NotVolumeLayout);
        }
        let forced;
        let spec = if self.all_read_only.load(Ordering::Relaxed) && !spec.read_only {
            forced = ShareSpec {
                read_only: true,
                ..spec.clone()
            };
            &forced
        } else {
            spec
        };
        let key = spec.guest.join("/");
        if spec.guest.is_empty() || !spec.guest.iter().all(|c| valid_volume_name(c)) {
            return Err(AttachError::Conflict(format!(
                "{key}: a volume name must match {VOLUME_NAME_RULE}"
            )));
        }
        // Check under the read lock first: opening the share root touches the disk
        // (and maybe a slow network file system), which must not block guest requests.
        check_attach(&self.table.read().unwrap(), spec, &key)?;
        let root = open_share_root(&self.shared_dir, &spec.path.rel, spec.read_only)
            .map_err(|e| AttachError::Io(io::Error::new(e.kind(), format!("{key}: {e}"))))?;
        let mut share = Share::new(key.clone(), spec.path.host.clone(), spec.read_only);
        share.volume_id = spec.volume_id.clone();
        let share = Arc::new(share);
        let mut t = self.table.write().unwrap();
        // Re-check: another attach may have won the race while we opened the root.
        check_attach(&t, spec, &key)?;
        let root_nodeid = self.inner.alloc_nodeid();
        self.inner
            .attach_root(root_nodeid, root, share.clone())
            .map_err(AttachError::Io)?;
        for depth in 1..spec.guest.len() {
            let p = spec.guest[..depth].to_vec();
            if !t.vdir_by_path.contains_key(&p) {
                let parent = t.vdir_by_path[&p[..depth - 1]];
                let id = self.inner.alloc_nodeid() | VIRTUAL_BIT;
                t.vdirs.insert(
                    id,
                    VirtualDir {
                        path: p.clone(),
                        parent,
                    },
                );
                t.vdir_by_path.insert(p, id);
            }
        }
        t.share_by_root.insert(root_nodeid, key.clone());
        t.shares.insert(
            key.clone(),
            Attached {
                share: share.clone(),
                rel: spec.guest.clone(),
                host_rel: spec.path.rel.clone(),
                root_nodeid,
            },
        );
        info!(
            "attached {key} ({}{})",
            if spec.read_only { "ro" } else { "rw" },
            spec.volume_id
                .as_ref()
                .map(|v| format!(", volume {v}"))
                .unwrap_or_default()
        );
        Ok(share)
    }

    /// Detaches a share: its name is gone at once and every fd into it is closed as
    /// soon as requests in flight on it end. Returns the share, or None if unknown.
    pub fn detach(&self, name: &str) -> Option<Arc<Share>> {
        if !self.volume_layout {
            return None;
        }
        let attached = {
            let mut t = self.table.write().unwrap();
            let a = t.shares.remove(name)?;
            t.share_by_root.remove(&a.root_nodeid);
            // Drop virtual dirs that lead to no share any more.
            for depth in (1..a.rel.len()).rev() {
                let p = &a.rel[..depth];
                let used = t
                    .shares
                    .values()
                    .any(|o| o.rel.len() > depth && o.rel[..depth] == *p);
                if !used {
                    if let Some(id) = t.vdir_by_path.remove(p) {
                        t.vdirs.remove(&id);
                    }
                }
            }
            a
        };
        let share = attached.share;
        let (nodes, handles) = self.inner.detach_share(&share);
        // Requests in flight on the share hold it (through their node or handle)
        // until they finish; none can register anything more. Wait for them, so
        // that when the caller hears "detached", no fd into the volume is left.
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

    pub fn shares(&self) -> Vec<ShareInfo> {
        let t = self.table.read().unwrap();
        t.shares
            .values()
            .map(|a| {
                let (live_inodes, open_handles) = self.inner.share_usage(&a.share);
                ShareInfo {
                    share: a.share.clone(),
                    live_inodes,
                    open_handles,
                }
            })
            .collect()
    }

    pub fn share(&self, name: &str) -> Option<ShareInfo> {
        let t = self.table.read().unwrap();
        t.shares.get(name).map(|a| {
            let (live_inodes, open_handles) = self.inner.share_usage(&a.share);
            ShareInfo {
                share: a.share.clone(),
                live_inodes,
                open_handles,
            }
        })
    }

    /// Whether `nodeid` names a virtual directory (existing or since removed; the
    /// handlers look it up in the table).
    fn is_virtual(&self, nodeid: u64) -> bool {
        self.volume_layout && (nodeid == ROOT_ID || nodeid & VIRTUAL_BIT != 0)
    }

    fn vdir_exists(&self, nodeid: u64) -> io::Result<()> {
        if self.table.read().unwrap().vdirs.contains_key(&nodeid) {
            Ok(())
        } else {
            Err(errno(libc::ENOENT))
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

    fn lookup_virtual(&self, parent: u64, name: &CStr) -> io::Result<Entry> {
        check_name(name)?;
        let child = {
            let t = self.table.read().unwrap();
            let dir = t.vdirs.get(&parent).ok_or_else(|| errno(libc::ENOENT))?;
            match name.to_bytes() {
                b"." => Child::Dir(parent),
                b".." => Child::Dir(dir.parent),
                n => {
                    let n = std::str::from_utf8(n).map_err(|_| errno(libc::ENOENT))?;
                    let mut p = dir.path.clone();
                    p.push(n.to_string());
                    t.child_at(&p).ok_or_else(|| errno(libc::ENOENT))?
                }
            }
        };
        match child {
            Child::Dir(id) => Ok(self.vdir_entry(id)),
            Child::Share(root) => self.inner.share_root_entry(root),
        }
    }

    /// `..` of a share root is the virtual directory above it, never SharedDir.
    fn parent_of_share_root(&self, nodeid: u64) -> Option<u64> {
        if !self.volume_layout {
            return None;
        }
        let t = self.table.read().unwrap();
        let key = t.share_by_root.get(&nodeid)?;
        let rel = &t.shares.get(key)?.rel;
        t.vdir_by_path.get(&rel[..rel.len() - 1]).copied()
    }

    fn readdir_virtual(
        &self,
        nodeid: u64,
        offset: u64,
        plus: bool,
        add: &mut dyn FnMut(DirEntry, Option<Entry>) -> io::Result<usize>,
    ) -> io::Result<()> {
        let (parent, children) = {
            let t = self.table.read().unwrap();
            let dir = t.vdirs.get(&nodeid).ok_or_else(|| errno(libc::ENOENT))?;
            (dir.parent, t.children(&dir.path))
        };
        let mut all: Vec<(Vec<u8>, Child)> = vec![
            (b".".to_vec(), Child::Dir(nodeid)),
            (b"..".to_vec(), Child::Dir(parent)),
        ];
        all.extend(children.into_iter().map(|(n, c)| (n.into_bytes(), c)));
        for (i, (name, child)) in all.iter().enumerate().skip(offset as usize) {
            let ino = match child {
                Child::Dir(id) | Child::Share(id) => *id,
            };
            let dirent = DirEntry {
                ino,
                offset: i as u64 + 1,
                type_: libc::DT_DIR as u32,
                name,
            };
            let entry = if !plus || i < 2 {
                None
            } else {
                let cname = std::ffi::CString::new(name.clone()).map_err(|_| errno(libc::EIO))?;
                match self.lookup_virtual(nodeid, &cname) {
                    Ok(e) => Some(e),
                    // Detached since we listed it: skip it.
                    Err(_) => continue,
                }
            };
            if add(dirent, entry)? == 0 {
                // Share roots and virtual dirs take no counted reference: nothing to undo.
                return Ok(());
            }
        }
        Ok(())
    }
}

fn check_attach(t: &Table, spec: &ShareSpec, key: &str) -> Result<(), AttachError> {
    if let Some(a) = t.shares.get(key) {
        let same = a.share.read_only == spec.read_only
            && a.share.host_path == spec.path.host
            && a.share.volume_id == spec.volume_id;
        return Err(if same {
            AttachError::AlreadyAttached(a.share.clone())
        } else {
            AttachError::Conflict(format!("{key} is attached with other parameters"))
        });
    }
    for a in t.shares.values() {
        let n = a.rel.len().min(spec.guest.len());
        if a.rel[..n] == spec.guest[..n] {
            return Err(AttachError::Conflict(format!(
                "{key} overlaps the attached volume {}",
                a.share.name
            )));
        }
        let other = SharePath {
            rel: a.host_rel.clone(),
            host: a.share.host_path.clone(),
        };
        if spec.path.overlaps(&other) {
            return Err(AttachError::Conflict(format!(
                "{key}: {} overlaps the directory of volume {}",
                spec.path.host.display(),
                a.share.name
            )));
        }
    }
    Ok(())
}

impl VolumeFs {
    /// Counts a failed request against the share of `nodeid`.
    fn acct<T>(&self, nodeid: u64, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            self.inner.note_error(nodeid);
        }
        r
    }
}

fn refuse() -> io::Error {
    errno(VIRTUAL_DIR_ERRNO)
}

impl ShareOf for VolumeFs {
    fn is_read_only(&self, nodeid: u64) -> bool {
        self.inner.is_read_only(nodeid)
    }

    fn note_error(&self, nodeid: u64) {
        self.inner.note_error(nodeid)
    }
}

impl ExtraOps for VolumeFs {
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        args: CreateIn,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        if self.is_virtual(parent) {
            return Err(refuse());
        }
        self.inner.tmpfile(ctx, parent, args)
    }

    fn copy_file_range(
        &self,
        ctx: &Context,
        nodeid_in: u64,
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        self.inner.copy_file_range(
            ctx, nodeid_in, fh_in, off_in, nodeid_out, fh_out, off_out, len, flags,
        )
    }

    fn syncfs(&self, ctx: &Context, nodeid: u64) -> io::Result<()> {
        if self.is_virtual(nodeid) {
            let roots: Vec<u64> = {
                let t = self.table.read().unwrap();
                t.shares.values().map(|a| a.root_nodeid).collect()
            };
            for r in roots {
                self.inner.syncfs(ctx, r)?;
            }
            return Ok(());
        }
        self.inner.syncfs(ctx, nodeid)
    }
}

impl FileSystem for VolumeFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        self.inner.init(capable)
    }

    fn destroy(&self) {
        self.inner.destroy()
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        if self.is_virtual(parent) {
            return self.lookup_virtual(parent, name);
        }
        if name.to_bytes() == b".." {
            if let Some(vparent) = self.parent_of_share_root(parent) {
                return Ok(self.vdir_entry(vparent));
            }
        }
        self.acct(parent, self.inner.lookup(ctx, parent, name))
    }

    fn forget(&self, ctx: &Context, inode: u64, count: u64) {
        self.inner.forget(ctx, inode, count)
    }

    fn batch_forget(&self, ctx: &Context, requests: Vec<(u64, u64)>) {
        self.inner.batch_forget(ctx, requests)
    }

    fn getattr(
        &self,
        ctx: &Context,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        if self.is_virtual(inode) {
            self.vdir_exists(inode)?;
            return Ok((self.vdir_entry(inode).attr, self.timeout));
        }
        self.acct(inode, self.inner.getattr(ctx, inode, handle))
    }

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        if self.is_virtual(inode) {
            return Err(refuse());
        }
        self.acct(inode, self.inner.setattr(ctx, inode, attr, handle, valid))
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        if self.is_virtual(inode) {
            return Err(errno(libc::EINVAL));
        }
        self.inner.readlink(ctx, inode)
    }

    fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        if self.is_virtual(parent) {
            return Err(refuse());
        }
        self.acct(parent, self.inner.symlink(ctx, linkname, parent, name))
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
        if self.is_virtual(parent) {
            return Err(refuse());
        }
        self.acct(
            parent,
            self.inner.mknod(ctx, parent, name, mode, rdev, umask),
        )
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        if self.is_virtual(parent) {
            return Err(refuse());
        }
        self.acct(parent, self.inner.mkdir(ctx, parent, name, mode, umask))
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        if self.is_virtual(parent) {
            return Err(refuse());
        }
        self.acct(parent, self.inner.unlink(ctx, parent, name))
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        if self.is_virtual(parent) {
            return Err(refuse());
        }
        self.acct(parent, self.inner.rmdir(ctx, parent, name))
    }

    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        if self.is_virtual(olddir) || self.is_virtual(newdir) {
            return Err(refuse());
        }
        self.acct(
            olddir,
            self.inner
                .rename(ctx, olddir, oldname, newdir, newname, flags),
        )
    }

    fn link(&self, ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        if self.is_virtual(inode) || self.is_virtual(newparent) {
            return Err(refuse());
        }
        self.acct(inode, self.inner.link(ctx, inode, newparent, newname))
    }

    fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        if self.is_virtual(inode) {
            return Err(errno(libc::EISDIR));
        }
        self.acct(inode, self.inner.open(ctx, inode, flags, fuse_flags))
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        if self.is_virtual(parent) {
            return Err(refuse());
        }
        self.acct(parent, self.inner.create(ctx, parent, name, args))
    }

    fn read(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        flags: u32,
    ) -> io::Result<usize> {
        self.acct(
            inode,
            self.inner
                .read(ctx, inode, handle, w, size, offset, lock_owner, flags),
        )
    }

    fn write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        delayed_write: bool,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        self.inner.write(
            ctx,
            inode,
            handle,
            r,
            size,
            offset,
            lock_owner,
            delayed_write,
            flags,
            fuse_flags,
        )
    }

    fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        self.acct(inode, self.inner.flush(ctx, inode, handle, lock_owner))
    }

    fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.acct(inode, self.inner.fsync(ctx, inode, datasync, handle))
    }

    fn fallocate(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.acct(
            inode,
            self.inner
                .fallocate(ctx, inode, handle, mode, offset, length),
        )
    }

    fn release(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        handle: u64,
        flush: bool,
        flock_release: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.acct(
            inode,
            self.inner
                .release(ctx, inode, flags, handle, flush, flock_release, lock_owner),
        )
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        if self.is_virtual(inode) {
            let mut out = std::mem::MaybeUninit::<statvfs64>::zeroed();
            // SAFETY: fstatvfs fills `out`; the result is checked.
            sys::cvt(unsafe {
                libc::fstatvfs64(
                    std::os::fd::AsRawFd::as_raw_fd(&self.shared_dir),
                    out.as_mut_ptr(),
                )
            })?;
            // SAFETY: fstatvfs succeeded.
            return Ok(unsafe { out.assume_init() });
        }
        self.inner.statfs(ctx, inode)
    }

    fn setxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        if self.is_virtual(inode) {
            return Err(refuse());
        }
        self.acct(inode, self.inner.setxattr(ctx, inode, name, value, flags))
    }

    fn getxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        if self.is_virtual(inode) {
            return Err(errno(libc::ENODATA));
        }
        self.acct(inode, self.inner.getxattr(ctx, inode, name, size))
    }

    fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        if self.is_virtual(inode) {
            return Ok(if size == 0 {
                ListxattrReply::Count(0)
            } else {
                ListxattrReply::Names(Vec::new())
            });
        }
        self.acct(inode, self.inner.listxattr(ctx, inode, size))
    }

    fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        if self.is_virtual(inode) {
            return Err(refuse());
        }
        self.acct(inode, self.inner.removexattr(ctx, inode, name))
    }

    fn opendir(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        if self.is_virtual(inode) {
            self.vdir_exists(inode)?;
            // Listing is computed from the table on each READDIR: no handle state.
            return Ok((None, OpenOptions::empty()));
        }
        self.acct(inode, self.inner.opendir(ctx, inode, flags))
    }

    fn readdir(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        if self.is_virtual(inode) {
            return self.readdir_virtual(inode, offset, false, &mut |d, _| add_entry(d));
        }
        self.acct(
            inode,
            self.inner
                .readdir(ctx, inode, handle, size, offset, add_entry),
        )
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        if self.is_virtual(inode) {
            return self.readdir_virtual(inode, offset, true, &mut |d, e| {
                add_entry(d, e.unwrap_or_default())
            });
        }
        self.acct(
            inode,
            self.inner
                .readdirplus(ctx, inode, handle, size, offset, add_entry),
        )
    }

    fn fsyncdir(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        if self.is_virtual(inode) {
            return Ok(());
        }
        self.acct(inode, self.inner.fsyncdir(ctx, inode, datasync, handle))
    }

    fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        if self.is_virtual(inode) {
            return Ok(());
        }
        self.acct(inode, self.inner.releasedir(ctx, inode, flags, handle))
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        if self.is_virtual(inode) {
            return if mask & libc::W_OK as u32 != 0 {
                Err(refuse())
            } else {
                Ok(())
            };
        }
        self.acct(inode, self.inner.access(ctx, inode, mask))
    }

    fn lseek(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.acct(inode, self.inner.lseek(ctx, inode, handle, offset, whence))
    }

    fn getlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<FileLock> {
        self.acct(
            inode,
            self.inner.getlk(ctx, inode, handle, owner, lock, flags),
        )
    }

    fn setlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<()> {
        self.acct(
            inode,
            self.inner.setlk(ctx, inode, handle, owner, lock, flags),
        )
    }

    fn setlkw(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        flags: u32,
    ) -> io::Result<()> {
        self.acct(
            inode,
            self.inner.setlkw(ctx, inode, handle, owner, lock, flags),
        )
    }
}
