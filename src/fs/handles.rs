//! Open file and directory handles the guest holds (FUSE `fh`).
//!
//! A handle is registered only while its node's share is attached and its node
//! belongs to the current session, within the per-volume handle limit and the fd
//! budget (see `limits.rs`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::id_map::IdMap;
use super::inodes::InodeData;
use super::journal::{Journal, Record, Recorded};
use super::limits::{reserve, unreserve, FdBudget, SessionEpoch};
use super::share::Share;
use super::sys::errno;

pub struct HandleData {
    pub inode: Arc<InodeData>,
    pub file: File,
    /// Serialises seek+getdents on directory handles.
    pub dir_lock: Mutex<()>,
    /// A directory stream's position: the offset after the last entry given out
    /// (kept for the device state; every READDIR names its own offset).
    pub dir_offset: AtomicU64,
    /// The flock the guest holds through this handle: 0 none, else `F_RDLCK` + 1 or
    /// `F_WRLCK` + 1 (kept for the device state: the kernel tells no one).
    pub flock: AtomicU8,
    /// Its journal record, freed with the handle.
    record: Option<Recorded>,
}

impl HandleData {
    /// The flock held through this handle, as `F_RDLCK`/`F_WRLCK`.
    pub fn flock_kind(&self) -> Option<i32> {
        match self.flock.load(Ordering::Relaxed) {
            0 => None,
            k => Some(i32::from(k) - 1),
        }
    }

    /// Records the flock now held (`F_UNLCK`: none).
    pub fn set_flock(&self, kind: i32) {
        let v = if kind == libc::F_UNLCK { 0 } else { kind + 1 };
        self.flock.store(v as u8, Ordering::Relaxed);
        if let Some(r) = &self.record {
            r.journal().set_flock(r.slot(), kind);
        }
    }
}

impl HandleData {
    /// A handle `id` of `inode` over `file`, recorded in `journal` if there is one.
    fn new(id: u64, inode: Arc<InodeData>, file: File, journal: Option<&'static Journal>) -> Self {
        let record = journal.and_then(|j| {
            // SAFETY: F_GETFL on an fd we own. Only with a journal: a system call
            // the open path does not make otherwise.
            let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
            j.next_ids(None, Some(id + 1));
            j.record(&Record::Handle {
                id,
                node: inode.nodeid,
                flags: flags.max(0),
                flock: None,
            })
        });
        HandleData {
            inode,
            file,
            dir_lock: Mutex::new(()),
            dir_offset: AtomicU64::new(0),
            flock: AtomicU8::new(0),
            record,
        }
    }
}

pub struct HandleStore {
    map: RwLock<IdMap<Arc<HandleData>>>,
    next_id: AtomicU64,
    session: Arc<SessionEpoch>,
    budget: Arc<FdBudget>,
    max_handles: usize,
    journal: Option<&'static Journal>,
}

impl HandleStore {
    pub fn new(
        session: Arc<SessionEpoch>,
        budget: Arc<FdBudget>,
        max_handles: usize,
        journal: Option<&'static Journal>,
    ) -> Self {
        HandleStore {
            map: RwLock::new(IdMap::default()),
            next_id: AtomicU64::new(1),
            session,
            budget,
            max_handles,
            journal,
        }
    }

    /// Registers an open file of `inode`. ESTALE when the node's share was detached or
    /// its session ended meanwhile; ENFILE past the volume's handle limit.
    pub fn insert(&self, inode: Arc<InodeData>, file: File) -> io::Result<u64> {
        let mut map = self.map.write().unwrap();
        if !self.session.admits(&inode.share, inode.epoch) {
            return Err(errno(libc::ESTALE));
        }
        reserve(&inode.share.usage.handles, self.max_handles, &self.budget)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        map.insert(id, Arc::new(HandleData::new(id, inode, file, self.journal)));
        Ok(id)
    }

    /// Registers a handle the device state names, under its own id: the destination
    /// of a migration serves the guest's handles by the ids it holds. EEXIST if the id
    /// is taken; the caller moves the id counter past every restored id.
    pub fn insert_restored(
        &self,
        id: u64,
        inode: Arc<InodeData>,
        file: File,
    ) -> io::Result<Arc<HandleData>> {
        let mut map = self.map.write().unwrap();
        if id == 0 || map.contains_key(&id) {
            return Err(errno(libc::EEXIST));
        }
        if !self.session.admits(&inode.share, inode.epoch) {
            return Err(errno(libc::ESTALE));
        }
        reserve(&inode.share.usage.handles, self.max_handles, &self.budget)?;
        let data = Arc::new(HandleData::new(id, inode, file, self.journal));
        map.insert(id, data.clone());
        Ok(data)
    }

    /// Every handle, by id (for the device state).
    pub fn snapshot(&self) -> Vec<(u64, Arc<HandleData>)> {
        let map = self.map.read().unwrap();
        let mut all: Vec<_> = map.iter().map(|(id, h)| (*id, h.clone())).collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all
    }

    /// The next handle id this table would hand out.
    pub fn next_id(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// Moves the id counter to at least `next` (ids restored from a device state).
    pub fn advance_next_id(&self, next: u64) {
        self.next_id.fetch_max(next, Ordering::Relaxed);
        if let Some(j) = self.journal {
            j.next_ids(None, Some(next));
        }
    }

    /// The handle `fh`, which must belong to node `nodeid`: a guest cannot use a handle
    /// of one inode to reach another. A handle that existed once and is gone (released,
    /// or its volume detached, even while the detach is still clearing the table) is
    /// ESTALE; one never handed out is EBADF.
    pub fn get(&self, fh: u64, nodeid: u64) -> io::Result<Arc<HandleData>> {
        let map = self.map.read().unwrap();
        match map.get(&fh) {
            Some(h) if h.inode.share.is_revoked() => Err(errno(libc::ESTALE)),
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
                let h = map.remove(&fh).expect("present");
                unreserve(&h.inode.share.usage.handles, 1, &self.budget);
                Ok(())
            }
            _ => Err(errno(libc::EBADF)),
        }
    }

    /// Drops every handle of node `nodeid` (a node a device state could not keep).
    pub fn remove_node(&self, nodeid: u64) -> usize {
        let mut map = self.map.write().unwrap();
        let mut gone = 0;
        map.retain(|_, h| {
            let keep = h.inode.nodeid != nodeid;
            if !keep {
                unreserve(&h.inode.share.usage.handles, 1, &self.budget);
                gone += 1;
            }
            keep
        });
        gone
    }

    /// Drops every handle into `share` (closing its fds once in-flight requests end).
    pub fn remove_share(&self, share: &Arc<Share>) -> usize {
        let mut map = self.map.write().unwrap();
        let before = map.len();
        map.retain(|_, h| !Arc::ptr_eq(&h.inode.share, share));
        let gone = before - map.len();
        unreserve(&share.usage.handles, gone, &self.budget);
        gone
    }

    /// Drops every handle of an earlier session. Returns how many went.
    pub fn reset_session(&self) -> usize {
        let mut map = self.map.write().unwrap();
        let current = self.session.current();
        let before = map.len();
        map.retain(|_, h| {
            let keep = h.inode.epoch == current;
            if !keep {
                unreserve(&h.inode.share.usage.handles, 1, &self.budget);
            }
            keep
        });
        before - map.len()
    }

    pub fn count_share(&self, share: &Share) -> usize {
        share.usage.handles.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::inodes::{InodeKey, InodeStore};

    fn setup(max_handles: usize) -> (InodeStore, HandleStore, Arc<InodeData>) {
        let session = Arc::new(SessionEpoch::default());
        let budget = Arc::new(FdBudget::new(1000));
        let store = InodeStore::new(2, session.clone(), budget.clone(), 100, None);
        let share = Arc::new(Share::for_test("s", false));
        let key = InodeKey {
            dev: 1,
            ino: 1,
            mnt_id: 1,
        };
        let inode = store
            .insert_fixed(1, File::open("/").unwrap(), key, libc::S_IFDIR, share)
            .unwrap();
        (
            store,
            HandleStore::new(session, budget, max_handles, None),
            inode,
        )
    }

    #[test]
    fn released_handles_are_stale_and_unknown_ones_bad() {
        let (_store, handles, inode) = setup(10);
        let fh = handles
            .insert(inode.clone(), File::open("/").unwrap())
            .unwrap();
        assert!(handles.get(fh, inode.nodeid).is_ok());
        // Another node's id with this handle: refused.
        let err = handles.get(fh, inode.nodeid + 1).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        assert_eq!(handles.remove_share(&inode.share), 1);
        let err = handles.get(fh, inode.nodeid).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::ESTALE));
        let err = handles.get(fh + 100, inode.nodeid).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn a_revoked_share_answers_no_handle_before_its_table_is_cleared() {
        let (store, handles, inode) = setup(10);
        let fh = handles
            .insert(inode.clone(), File::open("/").unwrap())
            .unwrap();
        inode.share.revoke();
        let err = handles.get(fh, inode.nodeid).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::ESTALE));
        let err = store.get(inode.nodeid).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn handle_limit_gives_enfile_and_release_makes_room() {
        let (_store, handles, inode) = setup(2);
        let a = handles
            .insert(inode.clone(), File::open("/").unwrap())
            .unwrap();
        handles
            .insert(inode.clone(), File::open("/").unwrap())
            .unwrap();
        let e = handles
            .insert(inode.clone(), File::open("/").unwrap())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENFILE));
        handles.remove(a, inode.nodeid).unwrap();
        assert!(handles
            .insert(inode.clone(), File::open("/").unwrap())
            .is_ok());
        assert_eq!(handles.count_share(&inode.share), 2);
    }

    #[test]
    fn a_reset_drops_old_handles_and_refuses_old_nodes() {
        let (store, handles, root) = setup(10);
        let fh = handles
            .insert(root.clone(), File::open("/").unwrap())
            .unwrap();
        store.reset_session();
        assert_eq!(handles.reset_session(), 1);
        assert!(handles.get(fh, root.nodeid).is_err());
        // An open that began before the reset, on the old node: refused.
        let e = handles
            .insert(root.clone(), File::open("/").unwrap())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
        let new_root = store.get(1).unwrap();
        assert!(handles.insert(new_root, File::open("/").unwrap()).is_ok());
    }
}
