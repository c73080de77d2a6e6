//! A share: one host directory the guest sees, with its read-only flag, counters, and
//! what it holds open for the guest.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::SystemTime;

use super::file_handle::InodeRef;
use super::sys::errno;

/// Per-share counters, bumped on the hot path with relaxed atomics and read on demand.
#[derive(Default)]
pub struct ShareStats {
    /// Requests, when metrics are off; with metrics on, `metrics` counts them (one
    /// add less per request). Read through [`ShareStats::requests`].
    pub ops: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
    /// Per operation and errno class, for `GET /metrics` (unless `--no-metrics`).
    pub metrics: crate::metrics::VolumeMetrics,
    /// Its rate limits and what they held back.
    pub qos: crate::qos::VolumeQos,
}

impl ShareStats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Requests served for the volume, with metrics on or off.
    pub fn requests(&self) -> u64 {
        self.ops.load(Ordering::Relaxed) + self.metrics.requests()
    }
}

/// What the guest holds in a share: each of these keeps one host fd open (but a node
/// kept by file handle, which holds none). Changed only under the lock of the table
/// that holds the object, read lock-free.
#[derive(Default)]
pub struct ShareUsage {
    pub nodes: AtomicUsize,
    pub handles: AtomicUsize,
    pub lock_files: AtomicUsize,
}

/// An fd on each mount of a share whose nodes are kept by file handle, by mount id:
/// `open_by_handle_at` opens a handle on the mount of the fd it is given. A share
/// has one mount, plus one per submount the guest has reached.
#[derive(Default)]
pub struct MountFds(RwLock<Vec<(u64, File)>>);

impl MountFds {
    /// Opens the node kept by `handle` on mount `mnt_id`; ESTALE if no fd of that
    /// mount is kept.
    pub fn open(&self, mnt_id: u64, handle: &InodeRef, flags: libc::c_int) -> io::Result<File> {
        let mounts = self.0.read().unwrap();
        match mounts.iter().find(|(id, _)| *id == mnt_id) {
            Some((_, fd)) => handle.open_handle(fd, flags),
            None => Err(errno(libc::ESTALE)),
        }
    }

    pub fn contains(&self, mnt_id: u64) -> bool {
        self.0.read().unwrap().iter().any(|(id, _)| *id == mnt_id)
    }

    /// Keeps `fd` as the fd of mount `mnt_id`, unless one is kept already.
    pub fn insert(&self, mnt_id: u64, fd: File) {
        let mut mounts = self.0.write().unwrap();
        if !mounts.iter().any(|(id, _)| *id == mnt_id) {
            mounts.push((mnt_id, fd));
        }
    }

    pub fn len(&self) -> usize {
        self.0.read().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct Share {
    /// The path the guest sees it at, relative to the mount root (empty for a share
    /// that is the whole mount).
    pub name: String,
    /// The host directory, as configured (for logs and stats).
    pub host_path: PathBuf,
    pub read_only: bool,
    /// The platform's volume id, for logs and stats.
    pub volume_id: Option<String>,
    pub attached_at: SystemTime,
    pub stats: ShareStats,
    pub usage: ShareUsage,
    /// Whether new nodes of this share are kept by file handle (set at attach, from
    /// `--inode-file-handles` and what the share's file system supports).
    use_handles: AtomicBool,
    pub mounts: MountFds,
    /// Set once, when the share is detached: from then on nothing may be registered
    /// under it, so a request in flight during the detach leaves nothing behind.
    revoked: AtomicBool,
    /// Its root's node id (0 before it is registered): the journal names a node's
    /// volume by it.
    root: AtomicU64,
}

impl Share {
    pub fn new(name: String, host_path: PathBuf, read_only: bool) -> Self {
        Share {
            name,
            host_path,
            read_only,
            volume_id: None,
            attached_at: SystemTime::now(),
            stats: ShareStats::default(),
            usage: ShareUsage::default(),
            use_handles: AtomicBool::new(false),
            mounts: MountFds::default(),
            revoked: AtomicBool::new(false),
            root: AtomicU64::new(0),
        }
    }

    /// Its root's node id, once registered.
    pub fn root(&self) -> u64 {
        self.root.load(Ordering::Relaxed)
    }

    pub fn set_root(&self, nodeid: u64) {
        self.root.store(nodeid, Ordering::Relaxed);
    }

    /// Marks the share detached. The tables check this under their locks before
    /// inserting, and the detach takes those locks after setting it.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    pub fn set_use_handles(&self, on: bool) {
        self.use_handles.store(on, Ordering::Release);
    }

    pub fn uses_handles(&self) -> bool {
        self.use_handles.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub fn for_test(name: &str, read_only: bool) -> Self {
        Share::new(name.to_string(), PathBuf::from("/"), read_only)
    }
}
