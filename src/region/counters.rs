//! What the keeper and its serving processes count over the daemon's life, kept in
//! the region's header: every serving process shows them in `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the keeper and its serving processes count over the daemon's life: shown
/// in each serving process's `/metrics`.
#[repr(C)]
pub struct Counters {
    pub upgrades: AtomicU64,
    pub upgrades_failed: AtomicU64,
    pub crashes: AtomicU64,
    /// Crashes under a guest's session that a new process took over.
    pub recoveries: AtomicU64,
    /// Requests the dead process had taken and not answered: run again, or
    /// answered EIO (not idempotent).
    pub requests_rerun: AtomicU64,
    pub requests_failed: AtomicU64,
    /// The guest's pause in each upgrade ([`PauseKind::Upgrade`]) and recovery.
    pub pauses: [Pauses; 2],
}

/// Which pause.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum PauseKind {
    Upgrade,
    Recovery,
}

impl PauseKind {
    pub fn label(self) -> &'static str {
        match self {
            PauseKind::Upgrade => "upgrade",
            PauseKind::Recovery => "recovery",
        }
    }
}

/// How long the guest's requests waited, over every upgrade (or recovery).
#[repr(C)]
pub struct Pauses {
    pub count: AtomicU64,
    pub total_us: AtomicU64,
    pub max_us: AtomicU64,
    pub last_us: AtomicU64,
}

impl Counters {
    pub fn pauses(&self, kind: PauseKind) -> &Pauses {
        &self.pauses[kind as usize]
    }

    /// Records one pause.
    pub fn add_pause(&self, kind: PauseKind, pause: std::time::Duration) {
        let us = pause.as_micros().min(u128::from(u64::MAX)) as u64;
        let p = self.pauses(kind);
        p.count.fetch_add(1, Ordering::Relaxed);
        p.total_us.fetch_add(us, Ordering::Relaxed);
        p.max_us.fetch_max(us, Ordering::Relaxed);
        p.last_us.store(us, Ordering::Relaxed);
    }
}
