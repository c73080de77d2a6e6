//! The volume registry: which volumes are attached, where the guest sees them, and
//! the rules for attaching and detaching. Pure bookkeeping: it opens nothing and
//! touches no file; the caller hands it the share and the node ids it needs.
//!
//! Two layouts:
//! - **whole share** (no allowed dirs): the mount root is SharedDir itself, as in
//!   virtiofsd; nothing can be attached;
//! - **volumes**: the mount root is a virtual directory that lists only the attached
//!   volumes, plus the intermediate directories leading to nested ones (`rw/vol-a`).
//!
//! Node ids of virtual directories other than the root carry [`VIRTUAL_BIT`], so the
//! data path tells them from a volume's nodes without a lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::journal::{Journal, Record, Recorded};
use super::names::{valid_volume_name, VOLUME_NAME_RULE};
use super::share::Share;
use super::share_root::SharePath;

/// The mount root's node id.
pub const ROOT_ID: u64 = fuse_backend_rs::api::filesystem::ROOT_ID;
/// Marks the node ids of virtual directories (the shared 64-bit counter never
/// reaches it).
pub const VIRTUAL_BIT: u64 = 1 << 63;

/// A volume to attach.
#[derive(Clone, Debug)]
pub struct ShareSpec {
    /// Where the guest sees it, as path components under the mount root.
    pub guest: Vec<String>,
    /// The host directory, validated inside SharedDir.
    pub path: SharePath,
    pub read_only: bool,
    pub volume_id: Option<String>,
    /// Its rate limits (None: unlimited); changed later with PATCH.
    pub rate_limit: Option<crate::qos::RateLimit>,
}

pub enum AttachError {
    /// The same name is attached with other parameters, or overlaps another volume.
    Conflict(String),
    /// An identical volume is already attached (an idempotent retry).
    AlreadyAttached(Arc<Share>),
    /// The layout has no room for volumes (whole-share mode).
    NotVolumeLayout,
    /// The host changed the path (a symlink now, removed, another file) between its
    /// check and its open: nothing was attached. The message names the path and what
    /// it became.
    PathChanged(String),
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
            AttachError::PathChanged(s) => write!(f, "{s}"),
            AttachError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A name under a virtual directory.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Child {
    /// A volume, by its root's node id.
    Share(u64),
    /// A virtual directory, by its node id.
    Dir(u64),
}

impl Child {
    pub fn nodeid(self) -> u64 {
        match self {
            Child::Share(id) | Child::Dir(id) => id,
        }
    }
}

struct VirtualDir {
    path: Vec<String>,
    parent: u64,
}

/// An attached volume.
pub struct Attached {
    pub share: Arc<Share>,
    /// Guest path components.
    rel: Vec<String>,
    /// Host path components under SharedDir.
    host_rel: Vec<String>,
    pub root_nodeid: u64,
}

#[derive(Default)]
struct Table {
    vdirs: HashMap<u64, VirtualDir>,
    vdir_by_path: HashMap<Vec<String>, u64>,
    /// Keyed by the guest path joined with '/'.
    shares: BTreeMap<String, Attached>,
    share_by_root: HashMap<u64, String>,
}

pub struct Registry {
    volume_layout: bool,
    /// `--readonly`: every volume attached is read-only, whatever the request says.
    all_read_only: AtomicBool,
    table: RwLock<Table>,
    /// Where the virtual directories are recorded for a successor (a keeper's).
    journal: Option<&'static Journal>,
    /// Their records, written anew at each change.
    recorded: Mutex<Vec<Recorded>>,
}

impl Registry {
    /// The whole-share layout: `share` is the mount root.
    pub fn whole(share: Arc<Share>) -> Self {
        let mut t = Table::default();
        t.shares.insert(
            String::new(),
            Attached {
                share,
                rel: Vec::new(),
                host_rel: Vec::new(),
                root_nodeid: ROOT_ID,
            },
        );
        Registry {
            volume_layout: false,
            all_read_only: AtomicBool::new(false),
            table: RwLock::new(t),
            journal: None,
            recorded: Mutex::default(),
        }
    }

    /// The volume layout: an empty virtual root.
    pub fn volumes() -> Self {
        let mut t = Table::default();
        t.vdirs.insert(
            ROOT_ID,
            VirtualDir {
                path: Vec::new(),
                parent: ROOT_ID,
            },
        );
        t.vdir_by_path.insert(Vec::new(), ROOT_ID);
        Registry {
            volume_layout: true,
            all_read_only: AtomicBool::new(false),
            table: RwLock::new(t),
            journal: None,
            recorded: Mutex::default(),
        }
    }

    /// Records the virtual directories in `journal` from now on (a keeper's).
    pub fn with_journal(mut self, journal: Option<&'static Journal>) -> Self {
        self.journal = journal;
        self
    }

    /// Makes every later attach read-only (`--readonly`).
    pub fn force_read_only(&self) {
        self.all_read_only.store(true, Ordering::Relaxed);
    }

    /// The spec as it will be attached (read-only if `--readonly`), and its key.
    /// Checks the name rule and every conflict with what is attached now.
    pub fn check(&self, spec: &ShareSpec) -> Result<(ShareSpec, String), AttachError> {
        if !self.volume_layout {
            return Err(AttachError::NotVolumeLayout);
        }
        let mut spec = spec.clone();
        if self.all_read_only.load(Ordering::Relaxed) {
            spec.read_only = true;
        }
        let key = spec.guest.join("/");
        if spec.guest.is_empty() || !spec.guest.iter().all(|c| valid_volume_name(c)) {
            return Err(AttachError::Conflict(format!(
                "{key}: a volume name must match {VOLUME_NAME_RULE}"
            )));
        }
        check_conflicts(&self.table.read().unwrap(), &spec, &key)?;
        Ok((spec, key))
    }

    /// Records `share` (checked by [`Self::check`]) with its root at `root_nodeid`,
    /// making the virtual directories that lead to it with ids from `new_dir_id`.
    /// The conflicts are checked again: another attach may have won the race.
    pub fn insert(
        &self,
        spec: &ShareSpec,
        share: Arc<Share>,
        root_nodeid: u64,
        mut new_dir_id: impl FnMut() -> u64,
    ) -> Result<(), AttachError> {
        let key = spec.guest.join("/");
        let mut t = self.table.write().unwrap();
        check_conflicts(&t, spec, &key)?;
        for depth in 1..spec.guest.len() {
            let p = spec.guest[..depth].to_vec();
            if !t.vdir_by_path.contains_key(&p) {
                let parent = t.vdir_by_path[&p[..depth - 1]];
                let id = new_dir_id() | VIRTUAL_BIT;
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
            key,
            Attached {
                share,
                rel: spec.guest.clone(),
                host_rel: spec.path.rel.clone(),
                root_nodeid,
            },
        );
        self.record_vdirs(&t);
        Ok(())
    }

    /// Records the virtual directories in the journal, if there is one: all of them
    /// anew, with the table's lock held (a few per volume, changed only by the
    /// control plane).
    fn record_vdirs(&self, t: &Table) {
        let Some(j) = self.journal else {
            return;
        };
        let mut recorded = self.recorded.lock().unwrap();
        // The old records go (freed as they drop).
        recorded.clear();
        for (&id, d) in t.vdirs.iter().filter(|(id, _)| **id != ROOT_ID) {
            let path = d.path.join("/");
            let record = Record::VirtualDir {
                id,
                path: path.as_bytes(),
            };
            recorded.extend(j.record(&record));
        }
    }

    /// Forgets the volume `name` and the virtual directories that led only to it, and
    /// revokes its share.
    pub fn remove(&self, name: &str) -> Option<Attached> {
        if !self.volume_layout {
            return None;
        }
        let mut t = self.table.write().unwrap();
        let a = t.shares.remove(name)?;
        // Revoked while the name goes, under the same lock: once a lookup of the name
        // fails, no old node id or handle into it answers either.
        a.share.revoke();
        t.share_by_root.remove(&a.root_nodeid);
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
        self.record_vdirs(&t);
        Some(a)
    }

    /// Whether `nodeid` names a virtual directory (existing or since removed).
    pub fn is_virtual(&self, nodeid: u64) -> bool {
        self.volume_layout && (nodeid == ROOT_ID || nodeid & VIRTUAL_BIT != 0)
    }

    pub fn dir_exists(&self, nodeid: u64) -> bool {
        self.table.read().unwrap().vdirs.contains_key(&nodeid)
    }

    /// What `name` is under the virtual directory `dir` (`.` and `..` included).
    pub fn child(&self, dir: u64, name: &[u8]) -> Option<Child> {
        let t = self.table.read().unwrap();
        let d = t.vdirs.get(&dir)?;
        match name {
            b"." => Some(Child::Dir(dir)),
            b".." => Some(Child::Dir(d.parent)),
            n => {
                let mut p = d.path.clone();
                p.push(std::str::from_utf8(n).ok()?.to_string());
                t.child_at(&p)
            }
        }
    }

    /// The listing of the virtual directory `dir`: its parent, then its children.
    pub fn list_dir(&self, dir: u64) -> Option<(u64, Vec<(String, Child)>)> {
        let t = self.table.read().unwrap();
        let d = t.vdirs.get(&dir)?;
        Some((d.parent, t.children(&d.path)))
    }

    /// `..` of a volume root: the virtual directory above it, never SharedDir.
    pub fn parent_of_root(&self, nodeid: u64) -> Option<u64> {
        if !self.volume_layout {
            return None;
        }
        let t = self.table.read().unwrap();
        let rel = &t.shares.get(t.share_by_root.get(&nodeid)?)?.rel;
        t.vdir_by_path.get(&rel[..rel.len() - 1]).copied()
    }

    /// Every attached volume, with its root's node id.
    pub fn list(&self) -> Vec<(Arc<Share>, u64)> {
        let t = self.table.read().unwrap();
        t.shares
            .values()
            .map(|a| (a.share.clone(), a.root_nodeid))
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Share>> {
        let t = self.table.read().unwrap();
        t.shares.get(name).map(|a| a.share.clone())
    }

    /// Whether the mount root is a virtual directory listing volumes.
    pub fn is_volume_layout(&self) -> bool {
        self.volume_layout
    }

    /// The virtual directories other than the root: (guest path, node id).
    pub fn virtual_dirs(&self) -> Vec<(String, u64)> {
        let t = self.table.read().unwrap();
        let mut all: Vec<_> = t
            .vdirs
            .iter()
            .filter(|(id, _)| **id != ROOT_ID)
            .map(|(id, d)| (d.path.join("/"), *id))
            .collect();
        all.sort();
        all
    }

    /// Gives volume roots and virtual directories the node ids `ids` maps their
    /// current ones to (ids not in it keep theirs): the ids a migration's source
    /// handed the guest. The caller makes sure no two end up with one id.
    pub fn renumber(&self, ids: &HashMap<u64, u64>) {
        let mut t = self.table.write().unwrap();
        let map = |id: u64| ids.get(&id).copied().unwrap_or(id);
        let vdirs = std::mem::take(&mut t.vdirs);
        t.vdirs = vdirs
            .into_iter()
            .map(|(id, d)| {
                (
                    map(id),
                    VirtualDir {
                        parent: map(d.parent),
                        path: d.path,
                    },
                )
            })
            .collect();
        for id in t.vdir_by_path.values_mut() {
            *id = map(*id);
        }
        for a in t.shares.values_mut() {
            a.root_nodeid = map(a.root_nodeid);
        }
        let by_root = std::mem::take(&mut t.share_by_root);
        t.share_by_root = by_root.into_iter().map(|(id, k)| (map(id), k)).collect();
        self.record_vdirs(&t);
    }
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

/// The same name attached with the same parameters is an idempotent retry; anything
/// else that shares a guest path prefix or a host directory is a conflict.
fn check_conflicts(t: &Table, spec: &ShareSpec, key: &str) -> Result<(), AttachError> {
    if let Some(a) = t.shares.get(key) {
        let same = a.share.read_only == spec.read_only
            && a.share.host_path == spec.path.host
            && a.share.volume_id == spec.volume_id
            && a.share.stats.qos.limit() == spec.rate_limit.filter(|l| !l.is_empty());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn spec(guest: &str, host: &str, ro: bool) -> ShareSpec {
        ShareSpec {
            guest: guest.split('/').map(String::from).collect(),
            path: SharePath {
                rel: host.split('/').map(String::from).collect(),
                host: PathBuf::from("/sd").join(host),
            },
            read_only: ro,
            volume_id: None,
            rate_limit: None,
        }
    }

    fn attach(r: &Registry, s: &ShareSpec, root: u64, next: &mut u64) -> Result<(), AttachError> {
        let (s, key) = r.check(s)?;
        let share = Arc::new(Share::new(key, s.path.host.clone(), s.read_only));
        r.insert(&s, share, root, || {
            *next += 1;
            *next
        })
    }

    #[test]
    fn nested_volumes_get_virtual_dirs_that_go_with_them() {
        let r = Registry::volumes();
        let mut next = 100;
        attach(&r, &spec("rw/a", "a", false), 10, &mut next).unwrap();
        attach(&r, &spec("rw/b", "b", true), 11, &mut next).unwrap();
        let Some(Child::Dir(rw)) = r.child(ROOT_ID, b"rw") else {
            panic!("rw is a virtual dir")
        };
        assert!(r.is_virtual(rw));
        assert_eq!(r.child(rw, b"a"), Some(Child::Share(10)));
        assert_eq!(r.child(rw, b".."), Some(Child::Dir(ROOT_ID)));
        assert_eq!(r.parent_of_root(11), Some(rw));
        let (_, kids) = r.list_dir(rw).unwrap();
        assert_eq!(kids.len(), 2);
        let a = r.remove("rw/a").unwrap();
        assert!(a.share.is_revoked(), "revoked as its name goes");
        assert!(r.dir_exists(rw), "still leads to b");
        r.remove("rw/b").unwrap();
        assert!(!r.dir_exists(rw), "gone with the last volume under it");
        assert_eq!(r.child(ROOT_ID, b"rw"), None);
    }

    #[test]
    fn conflicts_names_and_retries() {
        let r = Registry::volumes();
        let mut next = 100;
        attach(&r, &spec("a", "a", false), 10, &mut next).unwrap();
        assert!(matches!(
            attach(&r, &spec("a", "a", false), 12, &mut next),
            Err(AttachError::AlreadyAttached(_))
        ));
        for bad in [
            spec("a", "a", true),
            spec("a/x", "x", false),
            spec("b", "a/sub", false),
        ] {
            assert!(matches!(
                attach(&r, &bad, 13, &mut next),
                Err(AttachError::Conflict(_))
            ));
        }
        assert!(matches!(
            attach(&r, &spec("bad name", "c", false), 14, &mut next),
            Err(AttachError::Conflict(m)) if m.contains(VOLUME_NAME_RULE)
        ));
        r.force_read_only();
        let (s, _) = r.check(&spec("c", "c", false)).unwrap();
        assert!(s.read_only, "--readonly wins");
    }

    #[test]
    fn the_whole_share_takes_no_volumes() {
        let r = Registry::whole(Arc::new(Share::for_test("", false)));
        assert!(!r.is_virtual(ROOT_ID));
        assert!(matches!(
            r.check(&spec("a", "a", false)),
            Err(AttachError::NotVolumeLayout)
        ));
        assert!(r.remove("").is_none());
        assert_eq!(r.list().len(), 1);
    }
}
