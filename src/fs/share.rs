//! A share: one host directory the guest sees, with its read-only flag and counters.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
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
        }
    }

    #[cfg(test)]
    pub fn for_test(name: &str, read_only: bool) -> Self {
        Share::new(name.to_string(), PathBuf::from("/"), read_only)
    }
}
