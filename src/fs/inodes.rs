//! The inode table: FUSE node ids handed to the guest, each bound to an `O_PATH` fd
//! inside one share.
//!
//! Node ids come from a 64-bit counter and are never reused, so a stale or forged id
//! can only miss (ENOENT/ESTALE), never alias a newer inode.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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
    /// `O_PATH | O_NOFOLLOW` fd of the host inode.
    pub file: File,
    pub key: InodeKey,
    /// `S_IFMT` bits of the host inode.
    pub file_type: u32,
    pub share: Arc<Share>,
    /// Lookups the guest holds on this node id (FUSE's nlookup).
    refcount: AtomicU64,
    /// Fixed nodes (the root) are never dropped by FORGET.
    fixed: bool,
}

impl InodeData {
    pub fn is_dir(&self) -> bool {
        self.file_type == libc::S_IFDIR
    }

    /// Share roots are the fixed nodes: they live as long as the share is attached.
    pub fn is_share_root(&self) -> bool {
        self.fixed
    }
}

#[derive(Default)]
struct Maps {
    by_id: HashMap<u64, Arc<InodeData>>,
    by_key: HashMap<InodeKey, u64>,
}

pub struct InodeStore {
    maps: RwLock<Maps>,
    next_id: AtomicU64,
}

impl InodeStore {
    /// `first_free` is the first node id handed out by `insert_or_ref`; ids below it
    /// are reserved for fixed nodes (the root).
    pub fn new(first_free: u64) -> Self {
        InodeStore {
            maps: RwLock::new(Maps::default()),
            next_id: AtomicU64::new(first_free),
        }
    }

    pub fn get(&self, nodeid: u64) -> io::Result<Arc<InodeData>> {
        self.maps
            .read()
            .unwrap()
            .by_id
            .get(&nodeid)
            .cloned()
            .ok_or_else(|| errno(libc::ENOENT))
    }

    /// The live node for a host inode, if the guest holds one.
    pub fn lookup_key(&self, key: &InodeKey) -> Option<Arc<InodeData>> {
        let maps = self.maps.read().unwrap();
        maps.by_key
            .get(key)
            .and_then(|id| maps.by_id.get(id))
            .cloned()
    }

    /// Inserts a fixed node (the root) that is never forgotten.
    pub fn insert_fixed(
        &self,
        nodeid: u64,
        file: File,
        key: InodeKey,
        file_type: u32,
        share: Arc<Share>,
    ) -> Arc<InodeData> {
        let data = Arc::new(InodeData {
            nodeid,
            file,
            key,
            file_type,
            share,
            refcount: AtomicU64::new(1),
            fixed: true,
        });
        let mut maps = self.maps.write().unwrap();
        maps.by_key.insert(key, nodeid);
        maps.by_id.insert(nodeid, data.clone());
        data
    }

    /// Finds the node for `key` and takes one lookup reference on it, or inserts a new
    /// node built from `file`. Returns the node and whether it was newly inserted.
    pub fn insert_or_ref(
        &self,
        file: File,
        key: InodeKey,
        file_type: u32,
        share: &Arc<Share>,
    ) -> Arc<InodeData> {
        // Fast path under the read lock: an existing node only needs its count bumped.
        {
            let maps = self.maps.read().unwrap();
            if let Some(data) = maps.by_key.get(&key).and_then(|id| maps.by_id.get(id)) {
                if Arc::ptr_eq(&data.share, share) {
                    data.refcount.fetch_add(1, Ordering::AcqRel);
                    return data.clone();
                }
            }
        }
        let mut maps = self.maps.write().unwrap();
        if let Some(data) = maps.by_key.get(&key).and_then(|id| maps.by_id.get(id)) {
            if Arc::ptr_eq(&data.share, share) {
                data.refcount.fetch_add(1, Ordering::AcqRel);
                return data.clone();
            }
        }
        let nodeid = self.next_id.fetch_add(1, Ordering::Relaxed);
        let data = Arc::new(InodeData {
            nodeid,
            file,
            key,
            file_type,
            share: share.clone(),
            refcount: AtomicU64::new(1),
            fixed: false,
        });
        maps.by_key.insert(key, nodeid);
        maps.by_id.insert(nodeid, data.clone());
        data
    }

    /// Drops `count` lookup references; the node (and its fd) goes when none remain.
    pub fn forget(&self, nodeid: u64, count: u64) {
        let mut maps = self.maps.write().unwrap();
        Self::forget_locked(&mut maps, nodeid, count);
    }

    pub fn forget_many(&self, requests: &[(u64, u64)]) {
        let mut maps = self.maps.write().unwrap();
        for &(nodeid, count) in requests {
            Self::forget_locked(&mut maps, nodeid, count);
        }
    }

    fn forget_locked(maps: &mut Maps, nodeid: u64, count: u64) {
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
            maps.by_id.remove(&nodeid);
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
    pub fn remove_share(&self, share: &Arc<Share>) -> usize {
        let mut maps = self.maps.write().unwrap();
        let before = maps.by_id.len();
        maps.by_id.retain(|_, d| !Arc::ptr_eq(&d.share, share));
        let Maps { by_id, by_key } = &mut *maps;
        by_key.retain(|_, id| by_id.contains_key(id));
        before - maps.by_id.len()
    }

    /// Live node ids of `share`.
    pub fn count_share(&self, share: &Arc<Share>) -> usize {
        let maps = self.maps.read().unwrap();
        maps.by_id
            .values()
            .filter(|d| Arc::ptr_eq(&d.share, share))
            .count()
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

    fn share() -> Arc<Share> {
        Arc::new(Share::for_test("s", false))
    }

    fn key(ino: u64) -> InodeKey {
        InodeKey {
            dev: 1,
            ino,
            mnt_id: 1,
        }
    }

    #[test]
    fn same_key_same_nodeid_and_forget_releases() {
        let store = InodeStore::new(2);
        let s = share();
        let a = store.insert_or_ref(File::open("/").unwrap(), key(10), libc::S_IFDIR, &s);
        let b = store.insert_or_ref(File::open("/").unwrap(), key(10), libc::S_IFDIR, &s);
        assert_eq!(a.nodeid, b.nodeid);
        store.forget(a.nodeid, 1);
        assert!(store.get(a.nodeid).is_ok());
        store.forget(a.nodeid, 1);
        assert!(store.get(a.nodeid).is_err());
    }

    #[test]
    fn node_ids_are_never_reused() {
        let store = InodeStore::new(2);
        let s = share();
        let a = store.insert_or_ref(File::open("/").unwrap(), key(10), libc::S_IFDIR, &s);
        let first = a.nodeid;
        store.forget(first, 1);
        let b = store.insert_or_ref(File::open("/").unwrap(), key(10), libc::S_IFDIR, &s);
        assert_ne!(first, b.nodeid);
        assert!(store.get(first).is_err());
    }

    #[test]
    fn fixed_nodes_survive_forget() {
        let store = InodeStore::new(2);
        let s = share();
        store.insert_fixed(1, File::open("/").unwrap(), key(1), libc::S_IFDIR, s);
        store.forget(1, u64::MAX / 2);
        assert!(store.get(1).is_ok());
    }
}
