//! What bounds the guest's hold on the host: the session epoch that a new FUSE session
//! (a second INIT, DESTROY, a device reset) moves on, and the limits on node ids,
//! handles and lock files, each of which keeps one host fd open.
//!
//! Every node, handle and lock file records the epoch it was made in. The tables
//! admit a new entry only if its share is still attached and its epoch is the current
//! one, checked under the table's write lock; a reset or a detach changes those under
//! the same locks. So a request in flight across a reset or a detach cannot register
//! anything that outlives it.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use super::share::Share;
use super::sys::errno;

/// Per-volume limits on what the guest may hold (`--max-inodes`, `--max-handles`,
/// `--max-lock-files`). Past one, the guest gets ENFILE.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Limits {
    pub max_nodes: usize,
    pub max_handles: usize,
    pub max_lock_files: usize,
}

impl Limits {
    /// Sized for one busy guest: a build tree of a million files, tens of thousands
    /// of open files, a lock owner per process and file.
    pub const DEFAULT: Limits = Limits {
        max_nodes: 1 << 20,
        max_handles: 65_536,
        max_lock_files: 4_096,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Host fds the daemon keeps in reserve for the control socket, logging, the
/// vhost-user connection and short-lived opens: the guest can never take them.
pub const FD_RESERVE: usize = 512;

/// The daemon-wide bound on fds held for the guest (all volumes together): the
/// open-file limit minus [`FD_RESERVE`].
pub struct FdBudget {
    used: AtomicUsize,
    max: usize,
}

impl FdBudget {
    pub fn new(max: usize) -> Self {
        FdBudget {
            used: AtomicUsize::new(0),
            max,
        }
    }

    /// The budget for this process's RLIMIT_NOFILE soft limit.
    pub fn from_rlimit() -> Self {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills `rl`; the result is checked.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
            rl.rlim_cur as usize
        } else {
            1024
        };
        let reserve = FD_RESERVE.min(soft / 2);
        FdBudget::new(soft - reserve)
    }

    /// Takes one fd from the budget, or ENFILE.
    pub fn acquire(&self) -> io::Result<()> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur >= self.max {
                return Err(errno(libc::ENFILE));
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    pub fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// The current guest session's epoch (the guest's FUSE session: INIT to reset).
/// Sessions are counted in 32 bits (a node keeps its own in 4 bytes): one starts at
/// each guest reboot or device reset, so the count never wraps in practice, and a
/// wrap would only compare equal to an epoch four billion sessions old.
pub struct SessionEpoch {
    epoch: AtomicU32,
}

impl Default for SessionEpoch {
    fn default() -> Self {
        SessionEpoch {
            epoch: AtomicU32::new(1),
        }
    }
}

impl SessionEpoch {
    pub fn current(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Starts a new session; callers hold the inode table's write lock.
    pub fn advance(&self) -> u32 {
        self.epoch.fetch_add(1, Ordering::AcqRel).wrapping_add(1)
    }

    /// Whether an entry made in `epoch` under `share` may still be registered.
    /// Callers hold the write lock of the table they insert into.
    pub fn admits(&self, share: &Share, epoch: u32) -> bool {
        epoch == self.current() && !share.is_revoked()
    }
}

/// Takes one unit of a per-volume counter bounded by `max`, and one fd of the
/// budget; ENFILE past either. Callers hold the table's write lock.
pub fn reserve(counter: &AtomicUsize, max: usize, budget: &FdBudget) -> io::Result<()> {
    if counter.load(Ordering::Relaxed) >= max {
        return Err(errno(libc::ENFILE));
    }
    budget.acquire()?;
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Gives back what [`reserve`] took, `n` times.
/// As [`reserve`], for an object that holds no fd (a node kept by file handle): only
/// the per-volume bound applies.
pub fn reserve_without_fd(counter: &AtomicUsize, max: usize) -> io::Result<()> {
    if counter.load(Ordering::Relaxed) >= max {
        return Err(errno(libc::ENFILE));
    }
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

pub fn unreserve(counter: &AtomicUsize, n: usize, budget: &FdBudget) {
    if n > 0 {
        counter.fetch_sub(n, Ordering::Relaxed);
        budget.release(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_refuses_past_max_with_enfile_and_recovers() {
        let b = FdBudget::new(2);
        let c = AtomicUsize::new(0);
        reserve(&c, 10, &b).unwrap();
        reserve(&c, 10, &b).unwrap();
        let e = reserve(&c, 10, &b).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENFILE));
        unreserve(&c, 1, &b);
        reserve(&c, 10, &b).unwrap();
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn per_volume_max_is_checked_before_the_budget() {
        let b = FdBudget::new(100);
        let c = AtomicUsize::new(0);
        reserve(&c, 1, &b).unwrap();
        assert!(reserve(&c, 1, &b).is_err());
        assert_eq!(b.used(), 1, "a refused reserve takes nothing");
    }

    #[test]
    fn session_admits_only_the_current_epoch_of_a_live_share() {
        let s = SessionEpoch::default();
        let share = Share::for_test("v", false);
        let e = s.current();
        assert!(s.admits(&share, e));
        s.advance();
        assert!(!s.admits(&share, e));
        assert!(s.admits(&share, s.current()));
        share.revoke();
        assert!(!s.admits(&share, s.current()));
    }
}
