//! The inode table: FUSE node ids handed to the guest, each bound to a host inode
//! inside one share, by an `O_PATH` fd or a file handle (see `file_handle.rs`).
//!
//! Node ids come from a 64-bit counter and are never reused, so a stale or forged id
//! can only miss (ENOENT/ESTALE), never alias a newer inode. A node is registered only
//! while its share is attached and its parent belongs to the current session (see
//! `session.rs`), and only within the per-volume limit and the fd budget.
//!
//! A guest may hold a million nodes, so a node is kept small: 72 bytes behind its
//! `Arc`, and one pointer in each of the two indexes (by node id, by host inode),
//! which hold the node itself rather than a copy of its key.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hashbrown::hash_table::{Entry, HashTable};

use super::file_handle::{raw_handle_of, InodeFd, InodeRef};
use super::journal::{self, Handle, NodeRecord, Record, Slot};
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

impl InodeKey {
    /// Spreads (dev, ino, mount) over the table: inode numbers are often sequential.
    /// The host file system picks them, not the guest, so there is no flood to resist.
    fn hash(&self) -> u64 {
        let x = self.ino ^ self.dev.rotate_left(24) ^ self.mnt_id.rotate_left(48);
        let h = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }
}

/// Node ids are counters the daemon allocates: one multiplication spreads them.
fn id_hash(nodeid: u64) -> u64 {
    nodeid.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

pub struct InodeData {
    pub nodeid: u64,
    /// The host inode: an `O_PATH | O_NOFOLLOW` fd, or a file handle.
    inode: InodeRef,
    dev: u64,
    ino: u64,
    /// The mount id statx gives (`STATX_MNT_ID`: the kernel's int mount id).
    mnt_id: u32,
    /// `S_IFMT` bits of the host inode.
    file_type: u16,
    /// Fixed nodes (share roots) are never dropped by FORGET.
    fixed: bool,
    pub share: Arc<Share>,
    /// The session this node was handed out in.
    pub epoch: u32,
    /// Its journal record ([`Slot::NONE`]: none), freed with the node.
    journal: u32,
    /// Lookups the guest holds on this node id (FUSE's nlookup).
    refcount: AtomicU64,
}

impl Drop for InodeData {
    fn drop(&mut self) {
        if let (Some(slot), Some(j)) = (Slot::from_raw(self.journal), journal::get()) {
            j.free(slot);
        }
    }
}

/// Where a node was found: its parent's id and its name there (for the journal,
/// which names a node by them after a crash, where no file handle finds it).
#[derive(Clone, Copy)]
pub struct FoundAt<'a> {
    pub parent: u64,
    pub name: &'a [u8],
}

impl FoundAt<'_> {
    /// Nowhere known (a temporary file, a node a state names without a path).
    pub const NOWHERE: FoundAt<'static> = FoundAt {
        parent: 0,
        name: b"",
    };
}

/// Records a node about to be registered in the journal, if there is one; returns
/// its slot for [`InodeData::new`]. `handle` is the node's file handle, made by the
/// caller outside the table's lock.
fn record_node(
    nodeid: u64,
    key: InodeKey,
    file_type: u32,
    share: &Share,
    at: FoundAt,
    handle: Option<&(libc::c_int, Vec<u8>)>,
    lookups: u64,
) -> u32 {
    let Some(j) = journal::get() else {
        return Slot::NONE;
    };
    let record = Record::Node(NodeRecord {
        id: nodeid,
        lookups,
        parent: at.parent,
        name: at.name,
        volume: share.root(),
        file_type,
        dev: key.dev,
        ino: key.ino,
        mnt_id: key.mnt_id as u32,
        handle: handle.map(|(t, b)| Handle {
            handle_type: *t,
            bytes: b.as_slice(),
        }),
    });
    j.write(&record).map_or(Slot::NONE, Slot::raw)
}

/// Records a volume root in the journal: its id, its volume's name.
fn record_root(nodeid: u64, share: &Share) -> u32 {
    share.set_root(nodeid);
    let Some(j) = journal::get() else {
        return Slot::NONE;
    };
    j.write(&Record::Root {
        id: nodeid,
        name: share.name.as_bytes(),
    })
    .map_or(Slot::NONE, Slot::raw)
}

/// The file handle the journal keeps for a node: its own, or one made from its fd
/// (one system call, only with a journal, outside the table's lock).
fn journal_handle(inode: &InodeRef) -> Option<(libc::c_int, Vec<u8>)> {
    journal::get()?;
    match inode {
        InodeRef::Fd(f) => raw_handle_of(f).ok(),
        handle => handle.handle_bytes().map(|(t, b)| (t, b.to_vec())),
    }
}

impl InodeData {
    #[allow(clippy::too_many_arguments)]
    fn new(
        nodeid: u64,
        inode: InodeRef,
        key: InodeKey,
        file_type: u32,
        share: Arc<Share>,
        epoch: u32,
        fixed: bool,
        journal: u32,
    ) -> Self {
        InodeData {
            nodeid,
            inode,
            dev: key.dev,
            ino: key.ino,
            // Legacy mount ids are ints; a wider one never comes from STATX_MNT_ID.
            mnt_id: key.mnt_id as u32,
            file_type: (file_type & libc::S_IFMT) as u16,
            fixed,
            share,
            epoch,
            journal,
            refcount: AtomicU64::new(1),
        }
    }

    /// Its journal record, if it has one.
    fn slot(&self) -> Option<Slot> {
        Slot::from_raw(self.journal)
    }

    pub fn key(&self) -> InodeKey {
        InodeKey {
            dev: self.dev,
            ino: self.ino,
            mnt_id: u64::from(self.mnt_id),
        }
    }

    /// `S_IFMT` bits of the host inode.
    pub fn file_type(&self) -> u32 {
        u32::from(self.file_type)
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }

    /// Regular files and directories are the only inodes the daemon ever opens with
    /// real access; everything else (FIFOs, sockets, device nodes) is reached only
    /// through its `O_PATH` fd. The guest kernel serves FIFOs and devices itself.
    pub fn is_openable(&self) -> bool {
        matches!(self.file_type(), libc::S_IFREG | libc::S_IFDIR)
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
            handle => self
                .share
                .mounts
                .open(self.key().mnt_id, handle, libc::O_PATH)
                .map(InodeFd::Owned),
        }
    }

    pub fn inode_ref(&self) -> &InodeRef {
        &self.inode
    }

    /// Lookups the guest holds on this node id.
    pub fn lookups(&self) -> u64 {
        self.refcount.load(Ordering::Acquire)
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
    /// Every live node, by node id.
    by_id: HashTable<Arc<InodeData>>,
    /// The node each host inode currently has (a node whose inode died and whose
    /// number was reused stays in `by_id` only, until the guest forgets it).
    by_key: HashTable<Arc<InodeData>>,
}

impl Maps {
    fn get(&self, nodeid: u64) -> Option<&Arc<InodeData>> {
        self.by_id.find(id_hash(nodeid), |d| d.nodeid == nodeid)
    }

    fn get_key(&self, key: &InodeKey) -> Option<&Arc<InodeData>> {
        self.by_key.find(key.hash(), |d| d.key() == *key)
    }

    fn insert(&mut self, data: Arc<InodeData>) {
        let key = data.key();
        match self
            .by_key
            .entry(key.hash(), |d| d.key() == key, |d| d.key().hash())
        {
            Entry::Occupied(mut e) => *e.get_mut() = data.clone(),
            Entry::Vacant(e) => {
                e.insert(data.clone());
            }
        }
        self.by_id
            .insert_unique(id_hash(data.nodeid), data, |d| id_hash(d.nodeid));
    }

    /// Removes node `nodeid` from both indexes.
    fn remove(&mut self, nodeid: u64) -> Option<Arc<InodeData>> {
        let gone = match self
            .by_id
            .find_entry(id_hash(nodeid), |d| d.nodeid == nodeid)
        {
            Ok(e) => e.remove().0,
            Err(_) => return None,
        };
        let key = gone.key();
        if let Ok(e) = self
            .by_key
            .find_entry(key.hash(), |d| d.key() == key && d.nodeid == nodeid)
        {
            e.remove();
        }
        Some(gone)
    }
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
            .get(nodeid)
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
            .get(nodeid)
            .map(|d| d.share.clone())
    }

    /// The live node for a host inode, if the guest holds one.
    pub fn lookup_key(&self, key: &InodeKey) -> Option<Arc<InodeData>> {
        self.maps.read().unwrap().get_key(key).cloned()
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
        let epoch = self.session.current();
        let slot = record_root(nodeid, &share);
        let data = Arc::new(InodeData::new(
            nodeid,
            InodeRef::Fd(file),
            key,
            file_type,
            share,
            epoch,
            true,
            slot,
        ));
        maps.insert(data.clone());
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
        name: &[u8],
    ) -> io::Result<Arc<InodeData>> {
        let share = &parent.share;
        let existing = |maps: &Maps| -> Option<Arc<InodeData>> {
            let data = maps.get_key(&key)?;
            if Arc::ptr_eq(&data.share, share) && data.inode.same_inode(&inode) {
                data.refcount.fetch_add(1, Ordering::AcqRel);
                if let (Some(slot), Some(j)) = (data.slot(), journal::get()) {
                    j.add_lookups(slot, 1);
                }
                return Some(data.clone());
            }
            None
        };
        // Fast path under the read lock: an existing node only needs its count bumped.
        {
            let maps = self.maps.read().unwrap();
            if !self.session.admits(share, parent.epoch) {
                return Err(errno(libc::ENOENT));
            }
            if let Some(data) = existing(&maps) {
                return Ok(data);
            }
        }
        // Most likely a new node: its file handle for the journal is made before the
        // write lock is taken.
        let handle = journal_handle(&inode);
        let mut maps = self.maps.write().unwrap();
        if !self.session.admits(share, parent.epoch) {
            return Err(errno(libc::ENOENT));
        }
        if let Some(data) = existing(&maps) {
            return Ok(data);
        }
        if inode.holds_fd() {
            reserve(&share.usage.nodes, self.max_nodes, &self.budget)?;
        } else {
            reserve_without_fd(&share.usage.nodes, self.max_nodes)?;
        }
        let nodeid = self.next_id.fetch_add(1, Ordering::Relaxed);
        let at = FoundAt {
            parent: parent.nodeid,
            name,
        };
        let slot = record_node(nodeid, key, file_type, share, at, handle.as_ref(), 1);
        if let Some(j) = journal::get() {
            j.next_ids(Some(nodeid + 1), None);
        }
        let data = Arc::new(InodeData::new(
            nodeid,
            inode,
            key,
            file_type,
            share.clone(),
            parent.epoch,
            false,
            slot,
        ));
        maps.insert(data.clone());
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
        let Some(data) = maps.get(nodeid) else {
            return;
        };
        if data.fixed {
            return;
        }
        // Writers hold the write lock, so no lookup can race this load/store pair.
        let cur = data.refcount.load(Ordering::Acquire);
        let new = cur.saturating_sub(count);
        data.refcount.store(new, Ordering::Release);
        if let (Some(slot), Some(j)) = (data.slot(), journal::get()) {
            j.set_lookups(slot, new);
        }
        if new == 0 {
            if let Some(gone) = maps.remove(nodeid) {
                release(&gone, &self.budget);
            }
        }
    }

    /// A fresh node id, for nodes kept outside this table (the virtual directories).
    pub fn alloc_id(&self) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(j) = journal::get() {
            j.next_ids(Some(id + 1), None);
        }
        id
    }

    /// Drops every node of `share`, share root included, and returns how many went.
    /// The caller revoked the share first, so nothing can be re-registered under it.
    pub fn remove_share(&self, share: &Arc<Share>) -> usize {
        let mut maps = self.maps.write().unwrap();
        let mut gone = 0;
        let budget = &self.budget;
        maps.by_id.retain(|d| {
            let keep = !Arc::ptr_eq(&d.share, share);
            if !keep {
                release(d, budget);
                gone += 1;
            }
            keep
        });
        maps.by_key.retain(|d| !Arc::ptr_eq(&d.share, share));
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
        for data in old.by_id {
            let carried = if data.fixed {
                match data.inode.try_clone() {
                    Ok(inode) => Some(Arc::new(InodeData::new(
                        data.nodeid,
                        inode,
                        data.key(),
                        data.file_type(),
                        data.share.clone(),
                        epoch,
                        true,
                        record_root(data.nodeid, &data.share),
                    ))),
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
                Some(root) => maps.insert(root),
                None => {
                    release(&data, &self.budget);
                    dropped += 1;
                }
            }
        }
        dropped
    }

    /// Every live node, by id (for the device state).
    pub fn snapshot(&self) -> Vec<Arc<InodeData>> {
        let maps = self.maps.read().unwrap();
        let mut all: Vec<_> = maps.by_id.iter().cloned().collect();
        all.sort_unstable_by_key(|d| d.nodeid);
        all
    }

    /// A node a load found on the host, not registered: the load opens what the
    /// state's handles and locks need through it, and registers it with
    /// [`Self::commit_found`] only once everything of the state was found.
    pub fn found(
        &self,
        nodeid: u64,
        inode: InodeRef,
        key: InodeKey,
        file_type: u32,
        share: Arc<Share>,
    ) -> Arc<InodeData> {
        Arc::new(InodeData::new(
            nodeid,
            inode,
            key,
            file_type,
            share,
            0,
            false,
            Slot::NONE,
        ))
    }

    /// Registers a node of [`Self::found`] in the current session under its id, with
    /// `lookups` lookups (the caller holds the only reference). EEXIST if the id is
    /// taken; ENOENT if its share was detached; ENFILE past the limits.
    pub fn commit_found(
        &self,
        found: Arc<InodeData>,
        lookups: u64,
        at: FoundAt,
    ) -> io::Result<Arc<InodeData>> {
        let mut data = Arc::try_unwrap(found).map_err(|_| errno(libc::EBUSY))?;
        let handle = journal_handle(&data.inode);
        let mut maps = self.maps.write().unwrap();
        if data.nodeid == 0 || maps.get(data.nodeid).is_some() {
            return Err(errno(libc::EEXIST));
        }
        let epoch = self.session.current();
        if !self.session.admits(&data.share, epoch) {
            return Err(errno(libc::ENOENT));
        }
        if data.inode.holds_fd() {
            reserve(&data.share.usage.nodes, self.max_nodes, &self.budget)?;
        } else {
            reserve_without_fd(&data.share.usage.nodes, self.max_nodes)?;
        }
        let lookups = lookups.max(1);
        let key = data.key();
        data.epoch = epoch;
        data.journal = record_node(
            data.nodeid,
            key,
            data.file_type(),
            &data.share,
            at,
            handle.as_ref(),
            lookups,
        );
        if let Some(j) = journal::get() {
            j.next_ids(Some(data.nodeid + 1), None);
        }
        data.refcount.store(lookups, Ordering::Release);
        let data = Arc::new(data);
        maps.insert(data.clone());
        Ok(data)
    }

    /// Gives the fixed node `old` (a volume root) the id `new` and `lookups` lookups:
    /// a destination's volume takes the id its source handed the guest.
    pub fn renumber_fixed(&self, old: u64, new: u64, lookups: u64) -> io::Result<()> {
        let mut maps = self.maps.write().unwrap();
        if old == new {
            if let Some(d) = maps.get(old) {
                d.refcount.store(lookups.max(1), Ordering::Release);
            }
            return Ok(());
        }
        if maps.get(new).is_some() {
            return Err(errno(libc::EEXIST));
        }
        let Some(data) = maps.remove(old) else {
            return Err(errno(libc::ENOENT));
        };
        if !data.fixed {
            maps.insert(data);
            return Err(errno(libc::EINVAL));
        }
        let moved = Arc::new(InodeData::new(
            new,
            data.inode.try_clone()?,
            data.key(),
            data.file_type(),
            data.share.clone(),
            data.epoch,
            true,
            record_root(new, &data.share),
        ));
        moved.refcount.store(lookups.max(1), Ordering::Release);
        maps.insert(moved);
        Ok(())
    }

    /// The next node id this table would hand out.
    pub fn next_id(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// Moves the id counter to at least `next` (ids restored from a device state).
    pub fn advance_next_id(&self, next: u64) {
        self.next_id.fetch_max(next, Ordering::Relaxed);
        if let Some(j) = journal::get() {
            j.next_ids(Some(next), None);
        }
    }

    /// Live node ids of `share`.
    pub fn count_share(&self, share: &Share) -> usize {
        share.usage.nodes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
