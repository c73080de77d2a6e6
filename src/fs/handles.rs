//! Open file and directory handles the guest holds (FUSE `fh`).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::inodes::InodeData;
use super::sys::errno;

pub struct HandleData {
    pub inode: Arc<InodeData>,
    pub file: File,
    /// Serialises seek+getdents on directory handles.
    pub dir_lock: Mutex<()>,
}

pub struct HandleStore {
    map: RwLock<HashMap<u64, Arc<HandleData>>>,
    next_id: AtomicU64,
}

impl Default for HandleStore {
    fn default() -> Self {
        HandleStore {
            map: RwLock::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }
}

impl HandleStore {
    pub fn insert(&self, inode: Arc<InodeData>, file: File) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let data = Arc::new(HandleData {
            inode,
            file,
            dir_lock: Mutex::new(()),
        });
        self.map.write().unwrap().insert(id, data);
        id
    }

    /// The handle `fh`, which must belong to node `nodeid`: a guest cannot use a handle
    /// of one inode to reach another. A handle that existed once and is gone (released,
    /// or its volume detached) is ESTALE; one never handed out is EBADF.
    pub fn get(&self, fh: u64, nodeid: u64) -> io::Result<Arc<HandleData>> {
        let map = self.map.read().unwrap();
        match map.get(&fh) {
            Some(h) if h.inode.nodeid == nodeid => Ok(h.clone()),
            Some(_) => Err(errno(libc::EBADF)),
            None if fh > 0 && fh < self.next_id.load(Ordering::Relaxed) => Err(errno(libc::ESTALE)),
            None => Err(errno(libc::EBADF)),
        }
    }

    pub fn remove(&self, fh: u64, nodeid: u64) -> io::Result<()> {
        let mut map = self.map.write().unwrap();
        match map.get(&fh) {
            Some(h) if h.inode.nodeid == nodeid => {
                map.remove(&fh);
                Ok(())
            }
            _ => Err(errno(libc::EBADF)),
        }
    }

    /// Drops every handle into `share` (closing its fds once in-flight requests end).
    pub fn remove_share(&self, share: &std::sync::Arc<super::share::Share>) -> usize {
        let mut map = self.map.write().unwrap();
        let before = map.len();
        map.retain(|_, h| !Arc::ptr_eq(&h.inode.share, share));
        before - map.len()
    }

    pub fn count_share(&self, share: &std::sync::Arc<super::share::Share>) -> usize {
        let map = self.map.read().unwrap();
        map.values()
            .filter(|h| Arc::ptr_eq(&h.inode.share, share))
            .count()
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::inodes::{InodeKey, InodeStore};
    use crate::fs::share::Share;

    #[test]
    fn released_handles_are_stale_and_unknown_ones_bad() {
        let store = InodeStore::new(2);
        let share = Arc::new(Share::for_test("s", false));
        let key = InodeKey {
            dev: 1,
            ino: 1,
            mnt_id: 1,
        };
        let inode = store.insert_or_ref(File::open("/").unwrap(), key, libc::S_IFDIR, &share);
        let handles = HandleStore::default();
        let fh = handles.insert(inode.clone(), File::open("/").unwrap());
        assert!(handles.get(fh, inode.nodeid).is_ok());
        // Another node's id with this handle: refused.
        let err = handles.get(fh, inode.nodeid + 1).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        assert_eq!(handles.remove_share(&share), 1);
        let err = handles.get(fh, inode.nodeid).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::ESTALE));
        let err = handles.get(fh + 100, inode.nodeid).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }
}
