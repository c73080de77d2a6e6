//! The passthrough layer's part of the device state: the node ids, handles and locks
//! the guest holds, written as plain data (`state::format`) and found again from it.
//!
//! Saving names each node by its path below its volume's root, read from the
//! `/proc/self/fd` link of its `O_PATH` fd (each volume is reached through a private
//! clone of its mount, whose root is the volume's directory), and, where asked, by
//! its file handle. Loading treats the state as hostile: every name is one valid
//! component, every walk starts at a volume's root and follows no symlink, every id
//! is new and in range, every handle is checked to lead inside its volume, and a
//! node must still be the kind of file the guest held.

use std::collections::{HashMap, HashSet};

use super::super::file_handle::{open_raw_handle, raw_handle_of};
use super::super::lock_ranges::HeldRange;
use super::super::registry::VIRTUAL_BIT;
use super::super::share::Share;
use super::prelude::*;
use crate::state::format::{self, FileHandle, Location};
use crate::state::{LoadError, LoadOptions, LoadReport, MigrationMode, OnError, SaveOptions};

/// The longest path a state may name (Linux's PATH_MAX).
const MAX_PATH: usize = libc::PATH_MAX as usize;
/// How deep a handle's `..` walk looks for its volume's root.
const MAX_DEPTH: usize = 4096;

/// What the tables gave the device state.
pub struct SavedTables {
    pub nodes: Vec<format::Node>,
    pub handles: Vec<format::Handle>,
    pub locks: Vec<format::Lock>,
    pub next_node_id: u64,
    pub next_handle_id: u64,
    /// The open files a destination on this host may take over, so that the guest's
    /// locks are never let go: (node, owner) lock files, and handles holding a flock.
    pub lock_files: Vec<((u64, u64), Arc<File>)>,
    pub flock_handles: Vec<(u64, Arc<HandleData>)>,
}

/// Open files a source on this host handed over (see [`SavedTables`]).
#[derive(Default)]
pub struct HandedFiles {
    pub lock_files: HashMap<(u64, u64), File>,
    pub flock_handles: HashMap<u64, File>,
}

/// What went wrong with one thing of the state, for `--migration-on-error`.
struct Lost {
    what: LostKind,
    volume: String,
    path: String,
    why: String,
}

enum LostKind {
    Node,
    Handle,
    Lock,
}

impl Lost {
    fn into_error(self) -> LoadError {
        let (volume, path, why) = (self.volume, self.path, self.why);
        match self.what {
            LostKind::Node => LoadError::Node { volume, path, why },
            LostKind::Handle => LoadError::Handle { volume, path, why },
            LostKind::Lock => LoadError::Lock { volume, path, why },
        }
    }
}

fn invalid(why: impl Into<String>) -> LoadError {
    LoadError::Invalid(why.into())
}

fn display(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// A name from the state: one path component, as the guest could have looked it up.
fn check_component(name: &[u8]) -> Result<CString, String> {
    if name.is_empty() || name.len() > libc::NAME_MAX as usize {
        return Err(format!("a name of {} bytes", name.len()));
    }
    if name == b"." || name == b".." {
        return Err(format!("the name {:?}", display(name)));
    }
    if name.contains(&b'/') {
        return Err(format!("the name {:?} has a '/'", display(name)));
    }
    CString::new(name).map_err(|_| format!("the name {:?} has a NUL", display(name)))
}

/// A relative path from the state, as its components.
fn check_path(path: &[u8]) -> Result<Vec<CString>, String> {
    if path.is_empty() || path.len() > MAX_PATH {
        return Err(format!("a path of {} bytes", path.len()));
    }
    if path[0] == b'/' {
        return Err(format!("the absolute path {:?}", display(path)));
    }
    path.split(|&b| b == b'/').map(check_component).collect()
}

/// `S_IFMT` values a node may have.
fn valid_file_type(t: u32) -> bool {
    matches!(
        t,
        libc::S_IFREG
            | libc::S_IFDIR
            | libc::S_IFLNK
            | libc::S_IFIFO
            | libc::S_IFSOCK
            | libc::S_IFCHR
            | libc::S_IFBLK
    )
}

fn type_name(t: u32) -> &'static str {
    match t {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

/// A node as it was found again.
struct Restored {
    data: Arc<InodeData>,
    /// Its path below the volume's root, for messages and for children named by path.
    path: Vec<u8>,
}

impl PassthroughFs {
    /// The `/proc/self/fd` link of `fd`.
    fn fd_link(&self, fd: &impl AsRawFd) -> io::Result<Vec<u8>> {
        let name = ProcFdName::new(fd.as_raw_fd());
        let mut buf = vec![0u8; MAX_PATH + 32];
        // SAFETY: `buf` is valid for its length; the name is NUL-terminated.
        let n = unsafe {
            libc::readlinkat(
                self.proc_self_fd.as_raw_fd(),
                name.as_cstr().as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        let n = cvt64(n as i64)? as usize;
        buf.truncate(n);
        Ok(buf)
    }

    /// Where the inode `fd` refers to lies below the volume root whose link is
    /// `root_link`: its relative path, or None (unlinked, or moved outside the
    /// volume, or not reachable through a path).
    fn path_below(&self, root_link: &[u8], fd: &File) -> Option<Vec<u8>> {
        let link = self.fd_link(fd).ok()?;
        if link.ends_with(b" (deleted)") && sys::stat_fd(fd).map_or(true, |st| st.st_nlink == 0) {
            return None;
        }
        let rest = if root_link == b"/" {
            link.strip_prefix(b"/")?
        } else {
            link.strip_prefix(root_link)?.strip_prefix(b"/")?
        };
        (!rest.is_empty() && check_path(rest).is_ok()).then(|| rest.to_vec())
    }

    /// Opens `path` (already checked) below the directory `dir`, one component at a
    /// time and following no symlink: the walk cannot leave `dir`'s tree.
    fn walk(&self, dir: &File, components: &[CString]) -> io::Result<File> {
        let mut cur: Option<File> = None;
        for c in components {
            let next = sys::openat(
                cur.as_ref().unwrap_or(dir),
                c,
                libc::O_PATH | libc::O_NOFOLLOW,
                0,
            )?;
            cur = Some(next);
        }
        cur.ok_or_else(|| errno(libc::EINVAL))
    }

    /// The nodes, handles and locks the guest holds, for the device state.
    /// `volumes` lists each volume's share at its index in the state.
    pub fn save_tables(&self, volumes: &[Arc<Share>], opts: &SaveOptions) -> SavedTables {
        let index_of = |share: &Arc<Share>| volumes.iter().position(|v| Arc::ptr_eq(v, share));
        let mut root_links: HashMap<usize, Vec<u8>> = HashMap::new();
        let mut root_fds: HashMap<usize, File> = HashMap::new();
        let all = self.inodes.snapshot();
        for data in all.iter().filter(|d| d.is_share_root()) {
            if let Some(v) = index_of(&data.share) {
                if let Ok(fd) = data.fd() {
                    if let Ok(link) = self.fd_link(&*fd) {
                        root_links.insert(v, link);
                    }
                    if let Ok(dup) = fd.try_clone() {
                        root_fds.insert(v, dup);
                    }
                }
            }
        }
        let want_handles = opts.verify_handles || opts.mode == MigrationMode::FileHandles;
        // (node, volume, path) with the path below the volume's root; roots first.
        let mut found: Vec<(format::Node, Option<Vec<u8>>)> = Vec::with_capacity(all.len());
        for data in &all {
            let Some(volume) = index_of(&data.share) else {
                continue; // detached while the guest was stopped: not the guest's any more
            };
            let fd = data.fd().ok();
            let file_handle = match (&fd, want_handles) {
                (Some(fd), true) => raw_handle_of(&**fd)
                    .ok()
                    .map(|(handle_type, bytes)| FileHandle { handle_type, bytes }),
                _ => None,
            };
            let path = if data.is_share_root() {
                None
            } else {
                fd.as_ref().and_then(|fd| {
                    let path = self.path_below(root_links.get(&volume)?, fd)?;
                    if opts.confirm_paths {
                        // The path must lead to this very inode now, or it is no path.
                        let components = check_path(&path).ok()?;
                        let again = self.walk(root_fds.get(&volume)?, &components).ok()?;
                        let st = sys::stat_fd(&again).ok()?;
                        let key = data.key();
                        if (st.st_dev, st.st_ino) != (key.dev, key.ino) {
                            log::warn!(
                                "volume {:?}: {:?} no longer leads to node {}: saved without a path",
                                data.share.name,
                                display(&path),
                                data.nodeid
                            );
                            return None;
                        }
                    }
                    Some(path)
                })
            };
            if !data.is_share_root() && path.is_none() {
                log::warn!(
                    "volume {:?}: node {} ({}) has no path below the volume (unlinked or moved out); \
                     a destination finds it only by its file handle",
                    data.share.name,
                    data.nodeid,
                    type_name(data.file_type())
                );
            }
            found.push((
                format::Node {
                    id: data.nodeid,
                    lookups: data.lookups(),
                    volume: volume as u32,
                    file_type: data.file_type(),
                    location: if data.is_share_root() {
                        Location::Root
                    } else {
                        Location::Unknown
                    },
                    file_handle,
                },
                path,
            ));
        }
        // Parents before children: a directory's path is shorter than its entries'.
        found.sort_by_key(|(n, p)| {
            (
                n.location != Location::Root,
                p.as_ref()
                    .map_or(usize::MAX, |p| p.iter().filter(|&&b| b == b'/').count()),
                n.id,
            )
        });
        let mut dirs: HashMap<(u32, Vec<u8>), u64> = HashMap::new();
        let mut nodes = Vec::with_capacity(found.len());
        for (mut node, path) in found {
            if let Some(path) = path {
                let (parent_path, name) = match path.iter().rposition(|&b| b == b'/') {
                    Some(i) => (&path[..i], &path[i + 1..]),
                    None => (&path[..0], &path[..]),
                };
                let parent = if parent_path.is_empty() {
                    volumes.get(node.volume as usize).and_then(|_| {
                        all.iter()
                            .find(|d| {
                                d.is_share_root()
                                    && index_of(&d.share) == Some(node.volume as usize)
                            })
                            .map(|d| d.nodeid)
                    })
                } else {
                    dirs.get(&(node.volume, parent_path.to_vec())).copied()
                };
                node.location = match parent {
                    Some(parent) => Location::Child {
                        parent,
                        name: name.to_vec(),
                    },
                    None => Location::Path(path.clone()),
                };
                if node.file_type == libc::S_IFDIR {
                    dirs.insert((node.volume, path), node.id);
                }
            }
            nodes.push(node);
        }
        let saved: HashSet<u64> = nodes.iter().map(|n| n.id).collect();
        let mut handles = Vec::new();
        let mut flock_handles = Vec::new();
        let mut locks = Vec::new();
        for (id, h) in self.handles.snapshot() {
            if !saved.contains(&h.inode.nodeid) {
                continue;
            }
            // SAFETY: F_GETFL on an fd we own.
            let fl = unsafe { libc::fcntl(h.file.as_raw_fd(), libc::F_GETFL) };
            let flags = if fl < 0 { libc::O_RDONLY } else { fl }
                & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
            handles.push(format::Handle {
                id,
                node: h.inode.nodeid,
                flags,
                dir_offset: h
                    .inode
                    .is_dir()
                    .then(|| h.dir_offset.load(Ordering::Relaxed)),
            });
            if let Some(kind) = h.flock_kind() {
                locks.push(format::Lock::Flock { handle: id, kind });
                flock_handles.push((id, h.clone()));
            }
        }
        let mut lock_files = Vec::new();
        for held in self.locks.snapshot() {
            if !saved.contains(&held.inode.nodeid) {
                continue;
            }
            // SAFETY: F_GETFL on an fd we own.
            let fl = unsafe { libc::fcntl(held.file.as_raw_fd(), libc::F_GETFL) };
            let access = if fl < 0 {
                libc::O_RDONLY
            } else {
                fl & libc::O_ACCMODE
            };
            for r in &held.ranges {
                locks.push(format::Lock::Posix {
                    node: held.inode.nodeid,
                    owner: held.owner,
                    access,
                    start: r.start,
                    end: r.end,
                    kind: r.kind,
                });
            }
            lock_files.push(((held.inode.nodeid, held.owner), held.file.clone()));
        }
        SavedTables {
            nodes,
            handles,
            locks,
            next_node_id: self.inodes.next_id(),
            next_handle_id: self.handles.next_id(),
            lock_files,
            flock_handles,
        }
    }

    /// Finds the state's nodes, handles and locks again and registers them under
    /// their ids. `volumes` gives each state volume's share here; the volume roots
    /// already carry the state's ids. On an error with `--migration-on-error=abort`
    /// nothing is kept (the caller resets the session).
    pub fn restore_tables(
        &self,
        state: &format::SessionState,
        volumes: &[Arc<Share>],
        opts: &LoadOptions,
        mut handed: HandedFiles,
    ) -> Result<LoadReport, LoadError> {
        let mut report = LoadReport::default();
        let mut restored: HashMap<u64, Restored> = HashMap::new();
        let roots: HashMap<u64, usize> = state
            .volumes
            .iter()
            .enumerate()
            .map(|(i, v)| (v.root, i))
            .collect();
        // Each volume's root here (attached before the load, with the state's id).
        let mut root_of: Vec<Option<Arc<InodeData>>> = Vec::with_capacity(volumes.len());
        for (v, share) in state.volumes.iter().zip(volumes) {
            root_of.push(
                self.inodes
                    .get(v.root)
                    .ok()
                    .filter(|d| d.is_share_root() && Arc::ptr_eq(&d.share, share)),
            );
        }
        let mut seen = HashSet::new();
        // What could not be found again, with `guest-error`: answered ESTALE.
        let lost = |l: Lost, report: &mut LoadReport| -> Result<(), LoadError> {
            match opts.on_error {
                OnError::Abort => Err(l.into_error()),
                OnError::GuestError => {
                    match l.what {
                        LostKind::Node => report.lost_nodes += 1,
                        LostKind::Handle => report.lost_handles += 1,
                        LostKind::Lock => {}
                    }
                    log::warn!("{}: the guest gets ESTALE for it", l.into_error());
                    Ok(())
                }
            }
        };
        let mut lost_ids = Vec::new();
        for node in &state.nodes {
            // What any writer must get right, checked before anything is opened.
            if node.id == 0 || node.id & VIRTUAL_BIT != 0 || node.id >= state.next_node_id {
                return Err(invalid(format!("node id {:#x} out of range", node.id)));
            }
            if !seen.insert(node.id) {
                return Err(invalid(format!("node id {} named twice", node.id)));
            }
            if node.lookups == 0 {
                return Err(invalid(format!("node {} held with 0 lookups", node.id)));
            }
            if !valid_file_type(node.file_type) {
                return Err(invalid(format!(
                    "node {}: file type {:#o}",
                    node.id, node.file_type
                )));
            }
            let Some(share) = volumes.get(node.volume as usize) else {
                return Err(invalid(format!(
                    "node {}: volume index {}",
                    node.id, node.volume
                )));
            };
            let is_root = roots.get(&node.id) == Some(&(node.volume as usize));
            if (node.location == Location::Root) != is_root {
                return Err(invalid(format!(
                    "node {}: a volume root only at its volume's root id",
                    node.id
                )));
            }
            if is_root {
                // Attached here before the load, and given this id already.
                let data = self.inodes.get(node.id).map_err(|e| {
                    invalid(format!("volume root {} is not attached: {e}", node.id))
                })?;
                if data.file_type() != node.file_type {
                    return Err(invalid(format!("volume root {}: not a directory", node.id)));
                }
                restored.insert(
                    node.id,
                    Restored {
                        data,
                        path: Vec::new(),
                    },
                );
                continue;
            }
            // Where to open it from, checked as hostile input.
            let (from, components, path) = match &node.location {
                Location::Child { parent, name } => {
                    let parent = restored.get(parent).ok_or_else(|| {
                        invalid(format!(
                            "node {} names parent {parent}, which is no node before it",
                            node.id
                        ))
                    })?;
                    if !parent.data.is_dir() || !Arc::ptr_eq(&parent.data.share, share) {
                        return Err(invalid(format!(
                            "node {}: its parent is no directory of its volume",
                            node.id
                        )));
                    }
                    let c = check_component(name)
                        .map_err(|w| invalid(format!("node {}: {w}", node.id)))?;
                    let mut path = parent.path.clone();
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(name);
                    (Some(parent.data.clone()), vec![c], path)
                }
                Location::Path(p) => {
                    let c = check_path(p).map_err(|w| invalid(format!("node {}: {w}", node.id)))?;
                    (None, c, p.clone())
                }
                Location::Unknown => (None, Vec::new(), Vec::new()),
                Location::Root => unreachable!("checked above"),
            };
            let root = root_of[node.volume as usize].as_deref();
            let result = self.find_node(root, from.as_deref(), &components, node);
            match result.and_then(|file| self.register_restored(share, file, node)) {
                Ok(data) => {
                    restored.insert(node.id, Restored { data, path });
                    report.nodes += 1;
                }
                Err(why) => {
                    lost(
                        Lost {
                            what: LostKind::Node,
                            volume: share.name.clone(),
                            path: if path.is_empty() {
                                format!("node {}", node.id)
                            } else {
                                display(&path)
                            },
                            why,
                        },
                        &mut report,
                    )?;
                    lost_ids.push(node.id);
                }
            }
        }
        self.inodes.advance_next_id(state.next_node_id);
        self.mark_lost(&lost_ids);

        let mut handle_ids = HashSet::new();
        let mut handed_flocks = HashSet::new();
        let mut handles: HashMap<u64, Arc<HandleData>> = HashMap::new();
        for h in &state.handles {
            if h.id == 0 || h.id >= state.next_handle_id || !handle_ids.insert(h.id) {
                return Err(invalid(format!(
                    "handle id {} repeated or out of range",
                    h.id
                )));
            }
            if !seen.contains(&h.node) {
                return Err(invalid(format!(
                    "handle {} names no node of the state",
                    h.id
                )));
            }
            let Some(node) = restored.get(&h.node) else {
                report.lost_handles += 1;
                continue; // its node is lost: the handle answers ESTALE too
            };
            let handed_file = handed.flock_handles.remove(&h.id);
            let was_handed = handed_file.is_some();
            let file = match handed_file {
                Some(f) => self.adopt_handed(&node.data, f, h.flags),
                None => self.reopen_restored(&node.data, h),
            };
            match file.and_then(|f| {
                self.handles
                    .insert_restored(h.id, node.data.clone(), f)
                    .map_err(|e| format!("registering it: {e}"))
            }) {
                Ok(data) => {
                    report.handles += 1;
                    if let Some(off) = h.dir_offset {
                        // The stream's position, where the guest's next READDIR names
                        // it again anyway.
                        data.dir_offset.store(off, Ordering::Relaxed);
                    }
                    if was_handed {
                        handed_flocks.insert(h.id);
                    }
                    handles.insert(h.id, data);
                }
                Err(why) => lost(
                    Lost {
                        what: LostKind::Handle,
                        volume: node.data.share.name.clone(),
                        path: display(&node.path),
                        why,
                    },
                    &mut report,
                )?,
            }
        }
        self.handles.advance_next_id(state.next_handle_id);

        // POSIX locks, one lock file per (node, owner); then flocks.
        let mut by_owner: HashMap<(u64, u64), (i32, Vec<HeldRange>)> = HashMap::new();
        for lock in &state.locks {
            match *lock {
                format::Lock::Posix {
                    node,
                    owner,
                    access,
                    start,
                    end,
                    kind,
                } => {
                    if !seen.contains(&node)
                        || !matches!(access, libc::O_RDONLY | libc::O_WRONLY | libc::O_RDWR)
                        || !matches!(kind, libc::F_RDLCK | libc::F_WRLCK)
                        || end < start
                        || end > i64::MAX as u64
                    {
                        return Err(invalid(format!("lock of owner {owner} on node {node}")));
                    }
                    let entry = by_owner
                        .entry((node, owner))
                        .or_insert((access, Vec::new()));
                    entry.1.push(HeldRange { start, end, kind });
                }
                format::Lock::Flock { handle, kind } => {
                    if !handle_ids.contains(&handle)
                        || !matches!(kind, libc::F_RDLCK | libc::F_WRLCK)
                    {
                        return Err(invalid(format!("flock on handle {handle}")));
                    }
                }
            }
        }
        let mut pending = Vec::new();
        let mut owners: Vec<_> = by_owner.into_iter().collect();
        owners.sort_by_key(|(k, _)| *k);
        for ((nodeid, owner), (access, ranges)) in owners {
            let Some(node) = restored.get(&nodeid) else {
                continue; // its node is lost
            };
            let outcome = match handed.lock_files.remove(&(nodeid, owner)) {
                Some(f) => self.adopt_handed(&node.data, f, access).map(|f| (f, true)),
                None => self
                    .take_posix_locks(&node.data, access, &ranges, &mut pending)
                    .map(|f| (f, false)),
            };
            let done = outcome.and_then(|(f, handed_over)| {
                self.locks
                    .insert_restored(node.data.clone(), owner, f, &ranges)
                    .map(|_| handed_over)
                    .map_err(|e| format!("registering it: {e}"))
            });
            match done {
                Ok(handed_over) => {
                    report.locks += ranges.len();
                    if handed_over {
                        report.handed_over_locks += ranges.len();
                    }
                }
                Err(why) => {
                    lost(
                        Lost {
                            what: LostKind::Lock,
                            volume: node.data.share.name.clone(),
                            path: display(&node.path),
                            why,
                        },
                        &mut report,
                    )?;
                    // The guest believes it holds a lock it lost: its file is lost.
                    self.lose_node(nodeid);
                }
            }
        }
        for lock in &state.locks {
            let format::Lock::Flock { handle, kind } = *lock else {
                continue;
            };
            let Some(h) = handles.get(&handle) else {
                continue;
            };
            if handed_flocks.contains(&handle) {
                // Its open file came from the source with the lock on it.
                h.set_flock(kind);
                report.locks += 1;
                report.handed_over_locks += 1;
                continue;
            }
            let op = if kind == libc::F_WRLCK {
                libc::LOCK_EX
            } else {
                libc::LOCK_SH
            };
            // SAFETY: flock on an fd we own.
            match cvt(unsafe { libc::flock(h.file.as_raw_fd(), op | libc::LOCK_NB) }) {
                Ok(_) => {
                    h.set_flock(kind);
                    report.locks += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    // Still the source's, until it exits: waited for below.
                    h.set_flock(kind);
                    pending.push(PendingLock::Flock {
                        handle: h.clone(),
                        op,
                    });
                    report.locks += 1;
                }
                Err(e) => {
                    lost(
                        Lost {
                            what: LostKind::Lock,
                            volume: h.inode.share.name.clone(),
                            path: restored
                                .get(&h.inode.nodeid)
                                .map(|r| display(&r.path))
                                .unwrap_or_default(),
                            why: format!("flock: {e}"),
                        },
                        &mut report,
                    )?;
                    self.lose_node(h.inode.nodeid);
                }
            }
        }
        report.pending_locks = pending.len();
        if !pending.is_empty() {
            self.wait_for_pending(pending);
        }
        Ok(report)
    }

    /// Opens the state's node again: by path from its parent or volume root, else by
    /// its file handle (then checked to lie inside the volume). The error says why,
    /// for the message.
    fn find_node(
        &self,
        root: Option<&InodeData>,
        parent: Option<&InodeData>,
        components: &[CString],
        node: &format::Node,
    ) -> Result<File, String> {
        let root = root.ok_or("its volume has no root here")?;
        let file = if !components.is_empty() {
            let from = match parent {
                Some(p) => p.fd().map_err(|e| format!("its directory: {e}"))?,
                None => root.fd().map_err(|e| format!("the volume's root: {e}"))?,
            };
            self.walk(&from, components).map_err(|e| e.to_string())?
        } else if let Some(h) = &node.file_handle {
            self.open_contained_handle(root, h)?
        } else {
            return Err("the source could not say where it is (unlinked while held?)".into());
        };
        let st = sys::stat_fd(&file).map_err(|e| e.to_string())?;
        let found = st.st_mode & libc::S_IFMT;
        if found != node.file_type {
            return Err(format!(
                "it is now a {}; the guest held a {}",
                type_name(found),
                type_name(node.file_type)
            ));
        }
        if let (Some(h), false) = (&node.file_handle, components.is_empty()) {
            // --migration-verify-handles at the source: the very inode, or none.
            match raw_handle_of(&file) {
                Ok((t, bytes)) if t == h.handle_type && bytes == h.bytes => {}
                Ok(_) => {
                    return Err(
                        "another inode than the guest held (its file handle differs)".into(),
                    )
                }
                Err(e) => return Err(format!("its file handle: {e}")),
            }
        }
        Ok(file)
    }

    /// Opens a file handle from the state on the volume's mount, and keeps it only if
    /// the inode lies inside the volume: a directory whose `..` chain reaches the
    /// volume's root, or a file whose path below the root leads back to it.
    fn open_contained_handle(&self, root: &InodeData, h: &FileHandle) -> Result<File, String> {
        let root_fd = root.fd().map_err(|e| e.to_string())?;
        let mount = self
            .mount_fd(&root_fd)
            .map_err(|e| format!("the volume's mount: {e}"))?;
        let file = open_raw_handle(&mount, h.handle_type, &h.bytes, libc::O_PATH)
            .map_err(|e| format!("open_by_handle_at: {e}"))?;
        let root_key = root.key();
        let st = sys::stat_fd(&file).map_err(|e| e.to_string())?;
        let inside = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let mut cur = file.try_clone().map_err(|e| e.to_string())?;
            let mut ok = false;
            for _ in 0..MAX_DEPTH {
                let s = sys::stat_fd(&cur).map_err(|e| e.to_string())?;
                if (s.st_dev, s.st_ino) == (root_key.dev, root_key.ino) {
                    ok = true;
                    break;
                }
                let up = sys::openat(&cur, c"..", libc::O_PATH | libc::O_NOFOLLOW, 0)
                    .map_err(|e| e.to_string())?;
                let u = sys::stat_fd(&up).map_err(|e| e.to_string())?;
                if (u.st_dev, u.st_ino) == (s.st_dev, s.st_ino) {
                    break; // the file system's root: the volume was not on the way
                }
                cur = up;
            }
            ok
        } else {
            let root_link = self.fd_link(&*root_fd).map_err(|e| e.to_string())?;
            self.path_below(&root_link, &file)
                .and_then(|p| check_path(&p).ok())
                .and_then(|c| self.walk(&root_fd, &c).ok())
                .and_then(|again| sys::stat_fd(&again).ok())
                .is_some_and(|s| (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino))
        };
        if !inside {
            return Err("its file handle leads outside the volume".into());
        }
        Ok(file)
    }

    /// Registers a node found again under the state's id.
    fn register_restored(
        &self,
        share: &Arc<Share>,
        file: File,
        node: &format::Node,
    ) -> Result<Arc<InodeData>, String> {
        let st = sys::stat_fd(&file).map_err(|e| e.to_string())?;
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&file),
        };
        let file_type = st.st_mode & libc::S_IFMT;
        let inode = self
            .inode_ref_for(share, file, file_type, key.mnt_id)
            .map_err(|e| e.to_string())?;
        self.inodes
            .insert_restored(node.id, inode, key, file_type, share.clone(), node.lookups)
            .map_err(|e| format!("registering it: {e}"))
    }

    /// Opens a handle of the state again, with its flags as far as this daemon's
    /// options and the volume allow (never O_TRUNC, O_CREAT or O_EXCL again).
    fn reopen_restored(&self, node: &InodeData, h: &format::Handle) -> Result<File, String> {
        let keep = libc::O_ACCMODE
            | libc::O_APPEND
            | libc::O_NONBLOCK
            | libc::O_DIRECT
            | libc::O_NOATIME
            | libc::O_SYNC
            | libc::O_DSYNC;
        let mut flags = self.host_open_flags((h.flags & keep) as u32);
        if node.is_dir() {
            flags = (flags & !libc::O_ACCMODE) | libc::O_RDONLY | libc::O_DIRECTORY;
        } else if node.share.read_only && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err("open for writing on a read-only volume".into());
        }
        let file = self.reopen(node, flags).map_err(|e| e.to_string())?;
        if let Some(off) = h.dir_offset {
            // SAFETY: lseek on an fd we own.
            cvt64(unsafe { libc::lseek64(file.as_raw_fd(), off as i64, libc::SEEK_SET) })
                .map_err(|e| format!("its directory position: {e}"))?;
        }
        Ok(file)
    }

    /// Takes an open file the source handed over, if it is this node's inode and its
    /// access mode is one the volume allows.
    fn adopt_handed(&self, node: &InodeData, file: File, flags: i32) -> Result<File, String> {
        let st = sys::stat_fd(&file).map_err(|e| e.to_string())?;
        let key = node.key();
        if (st.st_dev, st.st_ino) != (key.dev, key.ino) {
            return Err("the file the source handed over is another inode".into());
        }
        // SAFETY: F_GETFL on an fd we own.
        let fl = cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) })
            .map_err(|e| e.to_string())?;
        if node.share.read_only && fl & libc::O_ACCMODE != libc::O_RDONLY {
            return Err("a writable file handed over on a read-only volume".into());
        }
        if fl & libc::O_ACCMODE != flags & libc::O_ACCMODE {
            return Err("the file the source handed over has another access mode".into());
        }
        Ok(file)
    }

    /// Opens `owner`'s lock file on `node` and takes its ranges again. A range still
    /// held by another (the source on this host, until it exits) is waited for after
    /// the load.
    fn take_posix_locks(
        &self,
        node: &Arc<InodeData>,
        access: i32,
        ranges: &[HeldRange],
        pending: &mut Vec<PendingLock>,
    ) -> Result<File, String> {
        if node.file_type() != libc::S_IFREG && node.file_type() != libc::S_IFDIR {
            return Err("locks on a special file".into());
        }
        if node.share.read_only && access != libc::O_RDONLY {
            return Err("a writable lock file on a read-only volume".into());
        }
        let file = self
            .reopen(node, access | libc::O_NONBLOCK)
            .map_err(|e| e.to_string())?;
        let file = Arc::new(file);
        for r in ranges {
            let lock = FileLock {
                start: r.start,
                end: r.end,
                lock_type: r.kind as u32,
                pid: 0,
            };
            let fl = locks::to_flock(&lock).map_err(|e| e.to_string())?;
            let mut try_fl = fl;
            // SAFETY: fcntl with a valid flock struct on an fd we own.
            match cvt(unsafe {
                libc::fcntl(
                    file.as_raw_fd(),
                    libc::F_OFD_SETLK,
                    &mut try_fl as *mut libc::flock,
                )
            }) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                    pending.push(PendingLock::Posix {
                        node: node.clone(),
                        file: file.clone(),
                        fl,
                    })
                }
                Err(e) => return Err(format!("F_OFD_SETLK: {e}")),
            }
        }
        // The table keeps its own handle of the open file description.
        let owned = file.try_clone().map_err(|e| e.to_string())?;
        Ok(owned)
    }

    /// Waits, on a thread of its own, for the locks another still held at the load.
    /// Each wait is a registered lock wait: a new session or a detach ends it.
    fn wait_for_pending(&self, pending: Vec<PendingLock>) {
        log::warn!(
            "{} lock(s) of the guest are still held by another (the migration's source until \
             it exits?): taken as soon as they are let go",
            pending.len()
        );
        let locks = self.locks.clone();
        let spawned = std::thread::Builder::new()
            .name("volfsd-locktake".into())
            .spawn(move || {
                crate::sandbox::confine_thread_or_exit(crate::sandbox::ThreadRole::LockWaiter);
                for p in pending {
                    let (what, result) = match p {
                        PendingLock::Posix { node, file, fl } => {
                            let result = locks.wait(&node, || {
                                let mut fl = fl;
                                // SAFETY: fcntl with a valid flock struct on an fd we own.
                                cvt(unsafe {
                                    libc::fcntl(
                                        file.as_raw_fd(),
                                        libc::F_OFD_SETLKW,
                                        &mut fl as *mut libc::flock,
                                    )
                                })
                                .map(|_| ())
                            });
                            (
                                format!("{:?} node {}", node.share.name, node.nodeid),
                                result,
                            )
                        }
                        PendingLock::Flock { handle, op } => {
                            let result = locks.wait(&handle.inode, || {
                                // SAFETY: flock on an fd we own.
                                cvt(unsafe { libc::flock(handle.file.as_raw_fd(), op) }).map(|_| ())
                            });
                            (
                                format!(
                                    "{:?} node {}",
                                    handle.inode.share.name, handle.inode.nodeid
                                ),
                                result,
                            )
                        }
                    };
                    match result {
                        Ok(()) => log::info!("lock on {what} taken again"),
                        Err(e) => log::warn!("lock on {what} could not be taken again: {e}"),
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("cannot start the thread that takes locks again: {e}");
        }
    }
}

/// A lock another held when the state was loaded.
enum PendingLock {
    Posix {
        node: Arc<InodeData>,
        file: Arc<File>,
        fl: libc::flock,
    },
    Flock {
        handle: Arc<HandleData>,
        op: libc::c_int,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_from_a_state_are_single_components_and_relative() {
        assert!(check_component(b"a").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b", &[b'x'; 256]] {
            assert!(check_component(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_path(b"a/b/c").unwrap().len(), 3);
        for bad in [
            &b""[..],
            b"/etc",
            b"a/../b",
            b"a//b",
            b"a/.",
            b"../x",
            b"a/",
        ] {
            assert!(check_path(bad).is_err(), "{:?}", display(bad));
        }
        assert!(check_path(&vec![b'a'; MAX_PATH + 1]).is_err());
    }
}
