//! A node of the inode table: the host inode behind a FUSE node id, the share it
//! belongs to, and what the guest holds on it. Kept small (72 bytes behind its
//! `Arc`): a guest may hold a million.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::fs::file_handle::{InodeFd, InodeRef};
use crate::fs::journal::Slot;
use crate::fs::share::Share;

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
    pub(super) fn hash(&self) -> u64 {
        let x = self.ino ^ self.dev.rotate_left(24) ^ self.mnt_id.rotate_left(48);
        let h = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }
}

/// Node ids are counters the daemon allocates: one multiplication spreads them.
pub(super) fn id_hash(nodeid: u64) -> u64 {
    nodeid.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

pub struct InodeData {
    pub nodeid: u64,
    /// The host inode: an `O_PATH | O_NOFOLLOW` fd, or a file handle.
    pub(super) inode: InodeRef,
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// The mount id statx gives (`STATX_MNT_ID`: the kernel's int mount id).
    pub(super) mnt_id: u32,
    /// `S_IFMT` bits of the host inode.
    pub(super) file_type: u16,
    /// Fixed nodes (share roots) are never dropped by FORGET.
    pub(super) fixed: bool,
    pub share: Arc<Share>,
    /// The session this node was handed out in.
    pub epoch: u32,
    /// Its journal record ([`Slot::NONE`]: none), freed when the node leaves the
    /// table (`InodeStore::release`), replaced when a rename moves the node
    /// (`InodeStore::moved`). Changed only under the table's write lock.
    pub(super) journal: AtomicU32,
    /// Lookups the guest holds on this node id (FUSE's nlookup).
    pub(super) refcount: AtomicU64,
    /// The upgrade preview that named it last, by its count in this process (0: none;
    /// `passthrough/state/preview.rs`): one byte, where the fields leave one free.
    previewed: std::sync::atomic::AtomicU8,
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

impl InodeData {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
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
            journal: AtomicU32::new(journal),
            refcount: AtomicU64::new(1),
            previewed: std::sync::atomic::AtomicU8::new(0),
        }
    }

    /// Its journal record, if it has one.
    pub(super) fn slot(&self) -> Option<Slot> {
        Slot::from_raw(self.journal.load(Ordering::Relaxed))
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

    /// Marks it named by the upgrade preview whose mark is `mark` (never 0).
    pub fn mark_previewed(&self, mark: u8) {
        self.previewed.store(mark, Ordering::Relaxed);
    }

    /// The mark of the upgrade preview that named it last (0: none).
    pub fn previewed_by(&self) -> u8 {
        self.previewed.load(Ordering::Relaxed)
    }
}
