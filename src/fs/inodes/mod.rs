//! The inode table: FUSE node ids handed to the guest, each bound to a host inode
//! inside one share, by an `O_PATH` fd or a file handle (see `file_handle.rs`).
//!
//! Node ids come from a 64-bit counter and are never reused, so a stale or forged id
//! can only miss (ENOENT/ESTALE), never alias a newer inode. A node is registered only
//! while its share is attached and its parent belongs to the current session (see
//! `limits.rs`), and only within the per-volume limit and the fd budget.
//!
//! A guest may hold a million nodes, so a node is kept small: 72 bytes behind its
//! `Arc` (`node.rs`), and one pointer in each of the two indexes (`maps.rs`). With a
//! journal, each node the guest holds is recorded there too (`journaled.rs`).

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::file_handle::InodeRef;
use super::journal::{Journal, Slot};
use super::limits::{reserve, reserve_without_fd, unreserve, FdBudget, SessionEpoch};
use super::share::Share;
use super::sys::errno;

mod journaled;
mod maps;
mod node;
use journaled::{journal_handle, record_root, NewNode};
use maps::Maps;
pub use node::{FoundAt, InodeData, InodeKey};

pub struct InodeStore {
    maps: RwLock<Maps>,
    next_id: AtomicU64,
    session: Arc<SessionEpoch>,
    budget: Arc<FdBudget>,
    max_nodes: usize,
    /// Where what the guest holds is recorded for a successor (a keeper's).
    journal: Option<&'static Journal>,
}

impl InodeStore {
    /// `first_free` is the first node id handed out by `insert_or_ref`; ids below it
    /// are reserved for fixed nodes (the root).
    pub fn new(
        first_free: u64,
        session: Arc<SessionEpoch>,
        budget: Arc<FdBudget>,
        max_nodes: usize,
        journal: Option<&'static Journal>,
    ) -> Self {
        InodeStore {
            maps: RwLock::new(Maps::default()),
            next_id: AtomicU64::new(first_free),
            session,
            budget,
            max_nodes,
            journal,
        }
    }

    /// A node left the table: its room in the limits, and its journal record.
    fn release(&self, data: &InodeData) {
        if data.inode.holds_fd() {
            unreserve(&data.share.usage.nodes, 1, &self.budget);
        } else {
            data.share.usage.nodes.fetch_sub(1, Ordering::Relaxed);
        }
        self.free_record(data);
    }

    /// Frees `data`'s journal record (the node left the table, or a new record of it
    /// takes its place).
    fn free_record(&self, data: &InodeData) {
        if let (Some(slot), Some(j)) = (data.slot(), self.journal) {
            j.free(slot);
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
        let slot = record_root(self.journal, nodeid, &share);
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
                if let (Some(slot), Some(j)) = (data.slot(), self.journal) {
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
        let handle = journal_handle(self.journal, &inode);
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
        let slot = NewNode {
            id: nodeid,
            key,
            file_type,
            share,
            at,
            handle: handle.as_ref(),
            lookups: 1,
        }
        .record(self.journal);
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

    /// A rename moved the node `data` from `from` to `to`: if its journal record
    /// names it at `from` (the name it was found by, or moved to before), the record
    /// is written anew at `to` before the old one is freed, so that a successor
    /// after a crash finds it by its name where no file handle finds it (a file
    /// system without them: overlayfs, most FUSE ones), and a node below a directory
    /// the guest forgot since is not left without a path. A node recorded under
    /// another name (a hard link's) keeps it: that name still leads to it. The old
    /// record stays if the new one cannot be written. Nothing without a journal.
    pub fn moved(&self, data: &Arc<InodeData>, from: FoundAt, to: FoundAt) {
        let Some(j) = self.journal else {
            return;
        };
        if data.fixed {
            return;
        }
        let handle = journal_handle(self.journal, &data.inode);
        // The write lock, though only read under: no lookup adds to the old record's
        // count while it is replaced.
        #[allow(clippy::readonly_write_lock)]
        let maps = self.maps.write().unwrap();
        if !maps.get(data.nodeid).is_some_and(|d| Arc::ptr_eq(d, data)) {
            return; // forgotten, detached or a new session meanwhile: no record
        }
        if !data
            .slot()
            .is_some_and(|s| j.names(s, from.parent, from.name))
        {
            return;
        }
        let slot = NewNode {
            id: data.nodeid,
            key: data.key(),
            file_type: data.file_type(),
            share: &data.share,
            at: to,
            handle: handle.as_ref(),
            lookups: data.refcount.load(Ordering::Acquire),
        }
        .record(Some(j));
        if slot == Slot::NONE {
            return;
        }
        if let Some(old) = Slot::from_raw(data.journal.swap(slot, Ordering::Relaxed)) {
            j.free(old);
        }
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
        if let (Some(slot), Some(j)) = (data.slot(), self.journal) {
            j.set_lookups(slot, new);
        }
        if new == 0 {
            if let Some(gone) = maps.remove(nodeid) {
                self.release(&gone);
            }
        }
    }

    /// A fresh node id, for nodes kept outside this table (the virtual directories).
    pub fn alloc_id(&self) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(j) = self.journal {
            j.next_ids(Some(id + 1), None);
        }
        id
    }

    /// Drops every node of `share`, share root included, and returns how many went.
    /// The caller revoked the share first, so nothing can be re-registered under it.
    pub fn remove_share(&self, share: &Arc<Share>) -> usize {
        let mut maps = self.maps.write().unwrap();
        let mut gone = 0;
        maps.by_id.retain(|d| {
            let keep = !Arc::ptr_eq(&d.share, share);
            if !keep {
                self.release(d);
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
                        {
                            // The new session's record of the root takes the old one's place.
                            self.free_record(&data);
                            record_root(self.journal, data.nodeid, &data.share)
                        },
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
                    self.release(&data);
                    dropped += 1;
                }
            }
        }
        dropped
    }

    /// Every live node, by id (for the device state).
    /// The lock is held only to copy the list (an upgrade's preview takes it while
    /// the guest is served), not to sort it.
    pub fn snapshot(&self) -> Vec<Arc<InodeData>> {
        let mut all: Vec<_> = {
            let maps = self.maps.read().unwrap();
            maps.by_id.iter().cloned().collect()
        };
        all.sort_unstable_by_key(|d| d.nodeid);
        all
    }

    /// Calls `f` with every live node, in no order, under the table's read lock (no
    /// copy of the list: a save in the guest's pause).
    pub fn visit(&self, mut f: impl FnMut(&Arc<InodeData>)) {
        let maps = self.maps.read().unwrap();
        maps.by_id.iter().for_each(&mut f);
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

    /// The session the table serves now (it changes when a session ends).
    pub fn epoch(&self) -> u32 {
        self.session.current()
    }

    /// Gives each node (by id) its lookups (an upgrade's nodes registered before its
    /// state said how many the guest holds now), under one hold of the table's lock.
    /// ENOENT if one is not in the table (those before it have theirs).
    // The write lock, as a FORGET's: the table's writers change lookups under it.
    #[allow(clippy::readonly_write_lock)]
    pub fn set_lookups(&self, nodes: impl Iterator<Item = (u64, u64)>) -> io::Result<()> {
        let maps = self.maps.write().unwrap();
        for (id, n) in nodes {
            let data = maps.get(id).ok_or_else(|| errno(libc::ENOENT))?;
            let n = n.max(1);
            if data.refcount.swap(n, Ordering::AcqRel) != n {
                if let (Some(slot), Some(j)) = (data.slot(), self.journal) {
                    j.set_lookups(slot, n);
                }
            }
        }
        Ok(())
    }

    /// Makes room for `n` more nodes at once (a load registers many: the tables do
    /// not grow step by step under it).
    pub fn reserve_room(&self, n: usize) {
        let mut maps = self.maps.write().unwrap();
        maps.reserve(n);
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
        let handle = journal_handle(self.journal, &data.inode);
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
        *data.journal.get_mut() = NewNode {
            id: data.nodeid,
            key,
            file_type: data.file_type(),
            share: &data.share,
            at,
            handle: handle.as_ref(),
            lookups,
        }
        .record(self.journal);
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
        let Some(data) = maps.get(old).cloned() else {
            return Err(errno(libc::ENOENT));
        };
        if !data.fixed {
            return Err(errno(libc::EINVAL));
        }
        let inode = data.inode.try_clone()?;
        maps.remove(old);
        self.free_record(&data);
        let moved = Arc::new(InodeData::new(
            new,
            inode,
            data.key(),
            data.file_type(),
            data.share.clone(),
            data.epoch,
            true,
            record_root(self.journal, new, &data.share),
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
        if let Some(j) = self.journal {
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
