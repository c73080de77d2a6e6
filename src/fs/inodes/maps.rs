//! The inode table's two indexes, by node id and by host inode, which hold the
//! node itself rather than a copy of its key.

use std::sync::Arc;

use hashbrown::hash_table::{Entry, HashTable};

use super::node::{id_hash, InodeData, InodeKey};

#[derive(Default)]
pub(super) struct Maps {
    /// Every live node, by node id.
    pub(super) by_id: HashTable<Arc<InodeData>>,
    /// The node each host inode currently has (a node whose inode died and whose
    /// number was reused stays in `by_id` only, until the guest forgets it).
    pub(super) by_key: HashTable<Arc<InodeData>>,
}

impl Maps {
    pub(super) fn get(&self, nodeid: u64) -> Option<&Arc<InodeData>> {
        self.by_id.find(id_hash(nodeid), |d| d.nodeid == nodeid)
    }

    pub(super) fn get_key(&self, key: &InodeKey) -> Option<&Arc<InodeData>> {
        self.by_key.find(key.hash(), |d| d.key() == *key)
    }

    pub(super) fn insert(&mut self, data: Arc<InodeData>) {
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

    /// Room for `n` more nodes in both indexes.
    pub(super) fn reserve(&mut self, n: usize) {
        self.by_id.reserve(n, |d| id_hash(d.nodeid));
        self.by_key.reserve(n, |d| d.key().hash());
    }

    /// Removes node `nodeid` from both indexes.
    pub(super) fn remove(&mut self, nodeid: u64) -> Option<Arc<InodeData>> {
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
