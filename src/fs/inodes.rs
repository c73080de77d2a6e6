//! The inode table: FUSE node ids handed to the guest, each bound to a host inode
//! inside one share, by an `O_PATH` fd or a file handle (see `file_handle.rs`).
//!
//! Node ids come from a 64-bit counter and are never reused, so a stale or forged id
//! can only miss (ENOENT/ESTALE), never alias a newer inode. A node is registered only
//! while its share is attached and its parent belongs to the current session (see
//! `session.rs`), and only within the per-volume limit and the fd budget.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::file_handle::{InodeFd, InodeRef};
use super::id_map::IdMap;
use super::session::{reserve, reserve_without_fd, unreserve, FdBudget, Session};
use super::share::Share;
use super::sys::errno;

/// What identifies a host inode: the same (dev, ino, mount) twice is the same node id.
#[derive(Clone, Copy, Debug, Eq, Hash, PartialEq)]
pub struct InodeKey {
    pub dev: u64,
    pub ino: u64,
    pub mnt_id: u64,
}

pub struct InodeData {
    pub nodeid: u64,
    /// The host inode: an `O_PATH | O_NOFOLLOW` fd, or a file handle.
    inode: InodeRef,
    pub key: InodeKey,
    /// `S_IFMT` bits of the host inode.
    pub file_type: u32,
    pub share: Arc<Share>,
    /// The session this node was handed out in.
    pub epoch: u64,
    /// Lookups the guest holds on this node id (FUSE's nlookup).
    refcount: AtomicU64,
    /// Fixed nodes (share roots) are never dropped by FORGET.
    fixed: bool,
}

impl InodeData {
    pub fn is_dir(&self) -> bool {
        self.file_type == libc::S_IFDIR
    }

    /// Regular files and directories are the only inodes the daemon ever opens with
    /// real access; everything else (FIFOs, sockets, device nodes) is reached only
    /// through its `O_PATH` fd. The guest kernel serves FIFOs and devices itself.
    pub fn is_openable(&self) -> bool {
        matches!(self.file_type, libc::S_IFREG | libc::S_IFDIR)
    }

    /// Share roots are the fixed nodes: they live as long as the share is attached.
    pub fn is_share_root(&self) -> bool {
        self.fixed
    }

    /// An `O_PATH` fd of the host inode, for one request: the node's own fd, or one
    /// opened from its file handle (ESTALE once the inode is gone).
    pub fn fd(&self) -> io::Result<InodeFd<'_>> {
        match &self.inode {
            InodeRef::Fd(f) => Ok(InodeFd::Borrowed(f)),
            InodeRef::Handle(h) => self
                .share
                .mounts
                .open(self.key.mnt_id, h, libc::O_PATH)
                .map(InodeFd::Owned),
        }
    }

    pub fn inode_ref(&self) -> &InodeRef {
        &self.inode
    }
}

/// Gives back what a node took when it goes: its place under the volume's bound and,
/// if it held an fd, its fd from the budget.
fn release(data: &InodeData, budget: &FdBudget) {
    if data.inode.holds_fd() {
        unreserve(&data.share.usage.nodes, 1, budget);
    } else {
        data.share.usage.nodes.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Maps {
    by_id: IdMap<Arc<InodeData>>,
    by_key: HashMap<InodeKey, u64>,
}

pub struct InodeStore {
    maps: RwLock<Maps>,
    next_id: AtomicU64,
    session: Arc<Session>,
    budget: Arc<FdBudget>,
    max_nodes: usize,
}

impl InodeStore {
    /// `first_free` is the first node id handed out by `insert_or_ref`; ids below it
    /// are reserved for fixed nodes (the root).
    pub fn new(
        first_free: u64,
        session: Arc<Session>,
        budget: Arc<FdBudget>,
        max_nodes: usize,
    ) -> Self {
        InodeStore {
            maps: RwLock::new(Maps::default()),
            next_id: AtomicU64::new(first_free),
            session,
            budget,
            max_nodes,
        }
    }

    /// The node `nodeid`; ENOENT once its share is revoked, even while the detach is
    /// still clearing the table.
    pub fn get(&self, nodeid: u64) -> io::Result<Arc<InodeData>> {
        self.maps
            .read()
            .unwrap()
            .by_id
            .get(&nodeid)
            .filter(|d| !d.share.is_revoked())
            .cloned()
            .ok_or_else(|| errno(libc::ENOENT))
    }

    /// The share of a node id, without taking a reference on the node itself (the
    /// read-only guard and the counters ask this on every request).
    pub fn share_of(&self, nodeid: u64) -> Option<Arc<Share>> {
        self.maps
            .read()
            .unwrap()
            .by_id
            .get(&nodeid)
            .map(|d| d.share.clone())
    }

    /// The live node for a host inode, if the guest holds one.
    pub fn lookup_key(&self, key: &InodeKey) -> Option<Arc<InodeData>> {
        let maps = self.maps.read().unwrap();
        maps.by_key
            .get(key)
            .and_then(|id| maps.by_id.get(id))
            .cloned()
    }

    /// Inserts a fixed node (a share root) that is never forgotten.
    pub fn insert_fixed(
        &self,
        nodeid: u64,
        file: File,
        key: InodeKey,
        file_type: u32,
        share: Arc<Share>,
    ) -> io::Result<Arc<InodeData>> {
        let mut maps = self.maps.write().unwrap();
        if share.is_revoked() {
            return Err(errno(libc::ENOENT));
        }
        reserve(&share.usage.nodes, usize::MAX, &self.budget)?;
        let data = Arc::new(InodeData {
            nodeid,
            inode: InodeRef::Fd(file),
            key,
            file_type,
            share,
            epoch: self.session.current(),
            refcount: AtomicU64::new(1),
            fixed: true,
        });
        maps.by_key.insert(key, nodeid);
        maps.by_id.insert(nodeid, data.clone());
        Ok(data)
    }

    /// Finds the node for `key` in `parent`'s share and takes one lookup reference on
    /// it, or inserts a new node built from `inode`. Fails with ENOENT when `parent`
    /// belongs to a detached share or an earlier session, and with ENFILE past the
    /// volume's node limit or the fd budget. A node kept by a handle that differs from
    /// `inode`'s is a dead inode whose number was reused: the new inode gets a new node.
    pub fn insert_or_ref(
        &self,
        inode: InodeRef,
        key: InodeKey,
        file_type: u32,
        parent: &InodeData,
    ) -> io::Result<Arc<InodeData>> {
        let share = &parent.share;
        // Fast path under the read lock: an existing node only needs its count bumped.
        {
            let maps = self.maps.read().unwrap();
            if !self.session.admits(share, parent.epoch) {
                return Err(errno(libc::ENOENT));
            }
            if let Some(data) = maps.by_key.get(&key).and_then(|id| maps.by_id.get(id)) {
                if Arc::ptr_eq(&data.share, share) && data.inode.same_inode(&inode) {
                    data.refcount.fetch_add(1, Ordering::AcqRel);
                    return Ok(data.clone());
                }
            }
        }
        let mut maps = self.maps.write().unwrap();
        if !self.session.admits(share, parent.epoch) {
            return Err(errno(libc::ENOENT));
        }
        if let Some(data) = maps.by_key.get(&key).and_then(|id| maps.by_id.get(id)) {
            if Arc::ptr_eq(&data.share, share) && data.inode.same_inode(&inode) {
                data.refcount.fetch_add(1, Ordering::AcqRel);
                return Ok(data.clone());
            }
        }
        if inode.holds_fd() {
            reserve(&share.usage.nodes, self.max_nodes, &self.budget)?;
        } else {
            reserve_without_fd(&share.usage.nodes, self.max_nodes)?;
        }
        let nodeid = self.next_id.fetch_add(1, Ordering::Relaxed);
        let data = Arc::new(InodeData {
            nodeid,
            inode,
            key,
            file_type,
            share: share.clone(),
            epoch: parent.epoch,
            refcount: AtomicU64::new(1),
            fixed: false,
        });
        maps.by_key.insert(key, nodeid);
        maps.by_id.insert(nodeid, data.clone());
        Ok(data)
    }

    /// Drops `count` lookup references; the node (and its fd) goes when none remain.
    pub fn forget(&self, nodeid: u64, count: u64) {
        let mut maps = self.maps.write().unwrap();
        self.forget_locked(&mut maps, nodeid, count);
    }

    pub fn forget_many(&self, requests: &[(u64, u64)]) {
        let mut maps = self.maps.write().unwrap();
        for &(nodeid, count) in requests {
            self.forget_locked(&mut maps, nodeid, count);
        }
    }

    fn forget_locked(&self, maps: &mut Maps, nodeid: u64, count: u64) {
        let Some(data) = maps.by_id.get(&nodeid) else {
            return;
        };
        if data.fixed {
            return;
        }
        // Writers hold the write lock, so no lookup can race this load/store pair.
        let cur = data.refcount.load(Ordering::Acquire);
        let new = cur.saturating_sub(count);
        data.refcount.store(new, Ordering::Release);
        if new == 0 {
            let key = data.key;
            if let Some(gone) = maps.by_id.remove(&nodeid) {
                release(&gone, &self.budget);
            }
            if maps.by_key.get(&key) == Some(&nodeid) {
                maps.by_key.remove(&key);
            }
        }
    }

    /// A fresh node id, for nodes kept outside this table (the virtual directories).
    pub fn alloc_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Drops every node of `share`, share root included, and returns how many went.
    /// The caller revoked the share first, so nothing can be re-registered under it.
    pub fn remove_share(&self, share: &Arc<Share>) -> usize {
        let mut maps = self.maps.write().unwrap();
        let mut gone = 0;
        let budget = &self.budget;
        maps.by_id.retain(|_, d| {
            let keep = !Arc::ptr_eq(&d.share, share);
            if !keep {
                release(d, budget);
                gone += 1;
            }
            keep
        });
        let Maps { by_id, by_key } = &mut *maps;
        by_key.retain(|_, id| by_id.contains_key(id));
        gone
    }

    /// Starts a new session: every node the guest was given is dropped, except the
    /// share roots, which are carried over as nodes of the new session (same node
    /// id, a dup of the same fd). Returns how many nodes went.
    pub fn reset_session(&self) -> usize {
        let mut maps = self.maps.write().unwrap();
        let epoch = self.session.advance();
        let old = std::mem::take(&mut *maps);
        let mut dropped = 0;
        for (nodeid, data) in old.by_id {
            let carried = if data.fixed {
                match data.inode.try_clone() {
                    Ok(inode) => Some(Arc::new(InodeData {
                        nodeid,
                        inode,
                        key: data.key,
                        file_type: data.file_type,
                        share: data.share.clone(),
                        epoch,
                        refcount: AtomicU64::new(1),
                        fixed: true,
                    })),
                    Err(e) => {
                        log::error!(
                            "share {}: keeping its root across a reset: {e}",
                            data.share.name
                        );
                        None
                    }
                }
            } else {
                None
            };
            match carried {
                Some(root) => {
                    maps.by_key.insert(root.key, nodeid);
                    maps.by_id.insert(nodeid, root);
                }
                None => {
                    release(&data, &self.budget);
                    dropped += 1;
                }
            }
        }
        dropped
    }

    /// Live node ids of `share`.
    pub fn count_share(&self, share: &Share) -> usize {
        share.usage.nodes.load(Ordering::Relaxed)
    }

    /// Number of live node ids (fixed ones included).
    pub fn len(&self) -> usize {
        self.maps.read().unwrap().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(max_nodes: usize) -> InodeStore {
        InodeStore::new(
            2,
            Arc::new(Session::default()),
            Arc::new(FdBudget::new(1000)),
            max_nodes,
        )
    }

    fn key(ino: u64) -> InodeKey {
        InodeKey {
            dev: 1,
            ino,
            mnt_id: 1,
        }
    }

    fn root(store: &InodeStore) -> Arc<InodeData> {
        let s = Arc::new(Share::for_test("s", false));
        store
            .insert_fixed(1, File::open("/").unwrap(), key(1), libc::S_IFDIR, s)
            .unwrap()
    }

    fn child(store: &InodeStore, parent: &InodeData, ino: u64) -> io::Result<Arc<InodeData>> {
        store.insert_or_ref(
            InodeRef::Fd(File::open("/").unwrap()),
            key(ino),
            libc::S_IFDIR,
            parent,
        )
    }

    #[test]
    fn same_key_same_nodeid_and_forget_releases() {
        let store = store(100);
        let r = root(&store);
        let a = child(&store, &r, 10).unwrap();
        let b = child(&store, &r, 10).unwrap();
        assert_eq!(a.nodeid, b.nodeid);
        store.forget(a.nodeid, 1);
        assert!(store.get(a.nodeid).is_ok());
        store.forget(a.nodeid, 1);
        assert!(store.get(a.nodeid).is_err());
        assert_eq!(store.count_share(&r.share), 1, "only the root is left");
    }

    #[test]
    fn node_ids_are_never_reused() {
        let store = store(100);
        let r = root(&store);
        let first = child(&store, &r, 10).unwrap().nodeid;
        store.forget(first, 1);
        let again = child(&store, &r, 10).unwrap();
        assert_ne!(first, again.nodeid);
        assert!(store.get(first).is_err());
    }

    #[test]
    fn fixed_nodes_survive_forget() {
        let store = store(100);
        root(&store);
        store.forget(1, u64::MAX / 2);
        assert!(store.get(1).is_ok());
    }

    #[test]
    fn node_limit_gives_enfile_and_forget_makes_room() {
        let store = store(3); // the root and two more
        let r = root(&store);
        let a = child(&store, &r, 10).unwrap();
        child(&store, &r, 11).unwrap();
        let e = child(&store, &r, 12).err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::ENFILE));
        // An existing node needs no new fd: still served at the limit.
        assert!(child(&store, &r, 10).is_ok());
        store.forget(a.nodeid, 2);
        assert!(child(&store, &r, 12).is_ok());
    }

    #[test]
    fn reset_drops_nodes_keeps_roots_and_refuses_old_parents() {
        let store = store(100);
        let r = root(&store);
        let a = child(&store, &r, 10).unwrap();
        assert_eq!(store.reset_session(), 1);
        assert!(store.get(a.nodeid).is_err(), "old node gone");
        let new_root = store.get(1).unwrap();
        assert!(new_root.epoch > r.epoch);
        // A request that began before the reset (holding the old root) cannot insert.
        let e = child(&store, &r, 11).err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert!(child(&store, &new_root, 11).is_ok());
        assert_eq!(store.count_share(&r.share), 2);
    }

    #[test]
    fn revoked_share_admits_nothing() {
        let store = store(100);
        let r = root(&store);
        r.share.revoke();
        assert_eq!(store.remove_share(&r.share), 1);
        assert!(child(&store, &r, 10).is_err());
        assert_eq!(store.count_share(&r.share), 0);
    }
}
