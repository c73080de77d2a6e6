//! What the inode table writes into the journal (`fs/journal/`) when it has one: a
//! record per node the guest holds and per volume root, each freed when its node
//! leaves the table (`InodeStore::release`).

use crate::fs::file_handle::{raw_handle_of, InodeRef};
use crate::fs::journal::{Handle, Journal, NodeRecord, Record, Slot};
use crate::fs::share::Share;

use super::node::{FoundAt, InodeKey};

/// A node about to be registered, as the journal names it.
pub(super) struct NewNode<'a> {
    pub id: u64,
    pub key: InodeKey,
    pub file_type: u32,
    pub share: &'a Share,
    pub at: FoundAt<'a>,
    /// The node's file handle, made by the caller outside the table's lock.
    pub handle: Option<&'a (libc::c_int, Vec<u8>)>,
    pub lookups: u64,
}

impl NewNode<'_> {
    /// Records it in `journal`, if there is one, and moves the journal's next node id
    /// past it; returns its slot for [`super::node::InodeData::new`].
    pub fn record(&self, journal: Option<&Journal>) -> u32 {
        let Some(j) = journal else {
            return Slot::NONE;
        };
        let record = Record::Node(NodeRecord {
            id: self.id,
            lookups: self.lookups,
            parent: self.at.parent,
            name: self.at.name,
            volume: self.share.root(),
            file_type: self.file_type,
            dev: self.key.dev,
            ino: self.key.ino,
            mnt_id: self.key.mnt_id as u32,
            handle: self.handle.map(|(t, b)| Handle {
                handle_type: *t,
                bytes: b.as_slice(),
            }),
        });
        let slot = j.write(&record).map_or(Slot::NONE, Slot::raw);
        j.next_ids(Some(self.id + 1), None);
        slot
    }
}

/// Records a volume root in the journal: its id, its volume's name.
pub(super) fn record_root(journal: Option<&Journal>, nodeid: u64, share: &Share) -> u32 {
    share.set_root(nodeid);
    let Some(j) = journal else {
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
pub(super) fn journal_handle(
    journal: Option<&Journal>,
    inode: &InodeRef,
) -> Option<(libc::c_int, Vec<u8>)> {
    journal?;
    match inode {
        InodeRef::Fd(f) => raw_handle_of(f).ok(),
        handle => handle.handle_bytes().map(|(t, b)| (t, b.to_vec())),
    }
}
