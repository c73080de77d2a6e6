//! A share: one host directory the guest sees, with its read-only flag, counters, and
//! what it holds open for the guest.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::SystemTime;

/// Per-share counters, bumped on the hot path with relaxed atomics and read on demand.
#[derive(Default)]
pub struct ShareStats {
    pub ops: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
}

impl ShareStats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What the guest holds in a share: each of these keeps one host fd open. Changed
/// only under the lock of the table that holds the object, read lock-free.
#[derive(Default)]
pub struct ShareUsage {
    pub nodes: AtomicUsize,
    pub handles: AtomicUsize,
    pub lock_files: AtomicUsize,
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
    /// Set once, when the share is detached: from then on nothing may be registered
    /// under it, so a request in flight during the detach leaves nothing behind.
    revoked: AtomicBool,
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
            revoked: AtomicBool::new(false),
        }
    }

    /// Marks the share detached. The tables check this under their locks before
    /// inserting, and the detach takes those locks after setting it.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub fn for_test(name: &str, read_only: bool) -> Self {
        Share::new(name.to_string(), PathBuf::from("/"), read_only)
    }
}
