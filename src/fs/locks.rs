//! POSIX and flock locks the guest takes on host files.
//!
//! - **POSIX locks** belong to a process (the FUSE lock owner), not to an open file.
//!   Each (node, owner) gets its own open file description on the host, and the lock
//!   is an OFD lock on it: owners conflict with each other (in this guest, other
//!   guests, or the host), never with themselves. Closing it (on FLUSH, a reset or a
//!   detach) releases the owner's locks. Lock files are opened with the access mode of
//!   the guest's handle, so a read-only volume never gets a writable fd.
//! - **flock** locks belong to the open file: the handle's own fd.
//! - **Waiting** (SETLKW) happens on a thread of its own (see `device/later/lock_waits.rs`). A
//!   wait is registered here, so that a detach or a new session can interrupt it
//!   with [`WAKE_SIGNAL`]: no wait outlives the volume or the session it began in.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use fuse_backend_rs::api::filesystem::FileLock;

use super::handles::HandleData;
use super::inodes::InodeData;
use super::journal::{Journal, Record, Recorded};
use super::limits::{reserve, unreserve, FdBudget, SessionEpoch};
use super::lock_ranges::{HeldRange, LockRanges};
use super::share::Share;
use super::sys::{cvt, errno};

/// FUSE_LK_FLOCK in `lk_flags`: the request is a flock(2), not a POSIX lock.
pub const FUSE_LK_FLOCK: u32 = 1;
/// The kernel's OFFSET_MAX, "to the end of the file" in a FUSE lock.
const LOCK_TO_EOF: u64 = i64::MAX as u64;
/// Interrupts a blocked `F_OFD_SETLKW`/`flock` on a lock-wait thread. Blocked in every
/// other thread (see `daemon/mod.rs`); its handler does nothing, so the wait returns EINTR.
pub const WAKE_SIGNAL: libc::c_int = libc::SIGUSR1;
/// How long a detach or reset keeps waking a lock wait before giving up on it.
const WAKE_DEADLINE: Duration = Duration::from_secs(2);

/// A FUSE lock range as a `struct flock` for OFD locks.
pub fn to_flock(lock: &FileLock) -> io::Result<libc::flock> {
    let len = if lock.end >= LOCK_TO_EOF {
        0
    } else if lock.end < lock.start {
        return Err(errno(libc::EINVAL));
    } else {
        (lock.end - lock.start + 1) as i64
    };
    // SAFETY: flock is plain data; zero is a valid value for every field.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = match lock.lock_type as i32 {
        libc::F_RDLCK => libc::F_RDLCK as i16,
        libc::F_WRLCK => libc::F_WRLCK as i16,
        libc::F_UNLCK => libc::F_UNLCK as i16,
        _ => return Err(errno(libc::EINVAL)),
    };
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = i64::try_from(lock.start).map_err(|_| errno(libc::EINVAL))?;
    fl.l_len = len;
    Ok(fl)
}

/// The FUSE answer to a GETLK that found `fl`.
pub fn from_flock(fl: &libc::flock, asked: &FileLock) -> FileLock {
    if fl.l_type == libc::F_UNLCK as i16 {
        return FileLock {
            lock_type: libc::F_UNLCK as u32,
            ..*asked
        };
    }
    let start = fl.l_start as u64;
    FileLock {
        start,
        end: if fl.l_len == 0 {
            LOCK_TO_EOF
        } else {
            start + fl.l_len as u64 - 1
        },
        lock_type: fl.l_type as u32,
        // The holder is another open file, maybe another sandbox: no guest pid.
        pid: 0,
    }
}

/// The flock(2) operation for a FUSE lock type.
pub fn flock_op(lock_type: u32, wait: bool) -> io::Result<libc::c_int> {
    let op = match lock_type as i32 {
        libc::F_RDLCK => libc::LOCK_SH,
        libc::F_WRLCK => libc::LOCK_EX,
        libc::F_UNLCK => libc::LOCK_UN,
        _ => return Err(errno(libc::EINVAL)),
    };
    Ok(if wait { op } else { op | libc::LOCK_NB })
}

/// The open file holding one owner's POSIX locks on one node, and the ranges it
/// holds (see `lock_ranges.rs`).
struct LockFile {
    inode: Arc<InodeData>,
    file: Arc<File>,
    /// The lock file's access mode (`O_RDONLY`, `O_WRONLY`, `O_RDWR`).
    access: i32,
    ranges: LockRanges,
    /// Its journal record, written anew when its ranges change (None: none recorded,
    /// no range held), freed with the lock file.
    record: Option<Recorded>,
}

impl LockFile {
    /// Records the ranges held now in `journal`, if there is one: the new record is
    /// written before the old one is freed, so that a crash in between leaves one.
    fn record(&mut self, journal: Option<&'static Journal>, owner: u64) {
        let Some(j) = journal else {
            return;
        };
        let new = if self.ranges.is_empty() {
            None
        } else {
            let ranges = self
                .ranges
                .ranges()
                .iter()
                .map(|r| (r.start, r.end, r.kind))
                .collect();
            j.record(&Record::Lock {
                node: self.inode.nodeid,
                owner,
                access: self.access,
                ranges,
            })
        };
        // The old record (if any) is freed as it is replaced.
        self.record = new;
    }
}

/// (node id, FUSE lock owner) -> its lock file.
type LockFiles = HashMap<(u64, u64), LockFile>;

/// One owner's lock file and what it holds, as the device state names them.
pub struct HeldLocks {
    pub inode: Arc<InodeData>,
    pub owner: u64,
    pub file: Arc<File>,
    pub ranges: Vec<HeldRange>,
}

struct Waiter {
    thread: libc::pthread_t,
    share: Arc<Share>,
    epoch: u32,
}

pub struct LockTable {
    files: Mutex<LockFiles>,
    waiters: Mutex<Vec<Waiter>>,
    session: Arc<SessionEpoch>,
    budget: Arc<FdBudget>,
    max_lock_files: usize,
    /// Where each lock file's ranges are recorded for a successor (a keeper's).
    journal: Option<&'static Journal>,
}

impl LockTable {
    pub fn new(
        session: Arc<SessionEpoch>,
        budget: Arc<FdBudget>,
        max_lock_files: usize,
        journal: Option<&'static Journal>,
    ) -> Self {
        install_wake_handler();
        LockTable {
            files: Mutex::new(HashMap::new()),
            waiters: Mutex::new(Vec::new()),
            session,
            budget,
            max_lock_files,
            journal,
        }
    }

    /// The open file carrying `owner`'s POSIX locks on the handle's node, opened by
    /// `open(access_mode)` the first time. ENFILE past the volume's lock-file limit.
    pub fn owner_file(
        &self,
        h: &HandleData,
        owner: u64,
        open: impl FnOnce(libc::c_int) -> io::Result<File>,
    ) -> io::Result<Arc<File>> {
        let key = (h.inode.nodeid, owner);
        if let Some(lf) = self.files.lock().unwrap().get(&key) {
            return Ok(lf.file.clone());
        }
        // The guest's own access mode: a read-only handle (and every handle of a
        // read-only volume is one) gives a read-only lock file.
        // SAFETY: F_GETFL on an fd we own.
        let fl = cvt(unsafe { libc::fcntl(h.file.as_raw_fd(), libc::F_GETFL) })?;
        let file = open(fl & libc::O_ACCMODE)?;
        let mut files = self.files.lock().unwrap();
        if let Some(lf) = files.get(&key) {
            return Ok(lf.file.clone());
        }
        let inode = &h.inode;
        if !self.session.admits(&inode.share, inode.epoch) {
            return Err(errno(libc::ESTALE));
        }
        reserve(
            &inode.share.usage.lock_files,
            self.max_lock_files,
            &self.budget,
        )?;
        let f = Arc::new(file);
        files.insert(
            key,
            LockFile {
                inode: inode.clone(),
                file: f.clone(),
                access: fl & libc::O_ACCMODE,
                ranges: LockRanges::default(),
                record: None,
            },
        );
        Ok(f)
    }

    /// Records a lock or unlock the kernel granted to `owner` on `nodeid`.
    pub fn record(&self, nodeid: u64, owner: u64, lock: &FileLock) {
        let end = lock.end.min(LOCK_TO_EOF);
        if let Some(lf) = self.files.lock().unwrap().get_mut(&(nodeid, owner)) {
            lf.ranges.apply(lock.start, end, lock.lock_type as i32);
            lf.record(self.journal, owner);
        }
    }

    /// Every owner that holds a POSIX lock, with its lock file (for the device state).
    pub fn snapshot(&self) -> Vec<HeldLocks> {
        let files = self.files.lock().unwrap();
        let mut all: Vec<HeldLocks> = files
            .iter()
            .filter(|(_, lf)| !lf.ranges.is_empty())
            .map(|(&(_, owner), lf)| HeldLocks {
                inode: lf.inode.clone(),
                owner,
                file: lf.file.clone(),
                ranges: lf.ranges.ranges().to_vec(),
            })
            .collect();
        all.sort_unstable_by_key(|h| (h.inode.nodeid, h.owner));
        all
    }

    /// Registers `owner`'s lock file on `inode` as a device state restores it: `file`
    /// holds `ranges` already (taken again, or handed over by the source).
    pub fn insert_restored(
        &self,
        inode: Arc<InodeData>,
        owner: u64,
        access: i32,
        file: File,
        ranges: &[HeldRange],
    ) -> io::Result<()> {
        let mut files = self.files.lock().unwrap();
        let key = (inode.nodeid, owner);
        if files.contains_key(&key) {
            return Err(errno(libc::EEXIST));
        }
        if !self.session.admits(&inode.share, inode.epoch) {
            return Err(errno(libc::ESTALE));
        }
        reserve(
            &inode.share.usage.lock_files,
            self.max_lock_files,
            &self.budget,
        )?;
        let mut held = LockRanges::default();
        for r in ranges {
            held.apply(r.start, r.end, r.kind);
        }
        let mut lf = LockFile {
            inode,
            file: Arc::new(file),
            access,
            ranges: held,
            record: None,
        };
        lf.record(self.journal, owner);
        files.insert(key, lf);
        Ok(())
    }

    /// The lock file of `owner` on `nodeid`, if it has one.
    pub fn existing(&self, nodeid: u64, owner: u64) -> Option<Arc<File>> {
        self.files
            .lock()
            .unwrap()
            .get(&(nodeid, owner))
            .map(|lf| lf.file.clone())
    }

    /// Releases `owner`'s POSIX locks on `nodeid` (the guest process closed a file).
    pub fn release_owner(&self, nodeid: u64, owner: u64) {
        if let Some(lf) = self.files.lock().unwrap().remove(&(nodeid, owner)) {
            unreserve(&lf.inode.share.usage.lock_files, 1, &self.budget);
        }
    }

    /// Drops every lock file of `share` and interrupts its lock waits; the caller
    /// revoked the share first. Returns how many lock files went.
    pub fn remove_share(&self, share: &Arc<Share>) -> usize {
        let gone = self.remove_where(|inode| Arc::ptr_eq(&inode.share, share));
        self.interrupt_waits(|w| Arc::ptr_eq(&w.share, share));
        gone
    }

    /// Drops the lock files and interrupts the waits of earlier sessions; the caller
    /// advanced the session first.
    pub fn reset_session(&self) -> usize {
        let current = self.session.current();
        let gone = self.remove_where(|inode| inode.epoch != current);
        self.interrupt_waits(|w| w.epoch != current);
        gone
    }

    fn remove_where(&self, doomed: impl Fn(&InodeData) -> bool) -> usize {
        let mut files = self.files.lock().unwrap();
        let before = files.len();
        files.retain(|_, lf| {
            let d = doomed(&lf.inode);
            if d {
                unreserve(&lf.inode.share.usage.lock_files, 1, &self.budget);
            }
            !d
        });
        before - files.len()
    }

    /// Runs `wait` (a blocking lock call) on this thread as a registered, wakeable
    /// wait for `inode`: EINTR from a wake while the wait is still admitted retries;
    /// a wake after a detach or reset ends it with ESTALE.
    pub fn wait(
        &self,
        inode: &InodeData,
        mut wait: impl FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        {
            let mut waiters = self.waiters.lock().unwrap();
            if !self.session.admits(&inode.share, inode.epoch) {
                return Err(errno(libc::ESTALE));
            }
            waiters.push(Waiter {
                // SAFETY: pthread_self cannot fail.
                thread: unsafe { libc::pthread_self() },
                share: inode.share.clone(),
                epoch: inode.epoch,
            });
        }
        let _unblocked = WakeSignalUnblocked::new();
        let result = loop {
            if !self.session.admits(&inode.share, inode.epoch) {
                break Err(errno(libc::ESTALE));
            }
            match wait() {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                other => break other,
            }
        };
        // Deregistering under the mutex: a waker holds it while it signals, so it
        // never signals a thread that has left (or exited).
        // SAFETY: pthread_self cannot fail.
        let me = unsafe { libc::pthread_self() };
        self.waiters
            .lock()
            .unwrap()
            .retain(|w| unsafe { libc::pthread_equal(w.thread, me) } == 0);
        result
    }

    /// Wakes the waits matching `doomed` until each has left, for at most
    /// [`WAKE_DEADLINE`]. A wake can arrive just before a wait blocks, so it is repeated.
    fn interrupt_waits(&self, doomed: impl Fn(&Waiter) -> bool) {
        let start = Instant::now();
        loop {
            {
                let waiters = self.waiters.lock().unwrap();
                let mut any = false;
                for w in waiters.iter().filter(|w| doomed(w)) {
                    any = true;
                    // SAFETY: the thread is registered, so it is alive: it deregisters
                    // under this mutex before it returns.
                    unsafe { libc::pthread_kill(w.thread, WAKE_SIGNAL) };
                }
                if !any {
                    return;
                }
            }
            if start.elapsed() > WAKE_DEADLINE {
                log::warn!("a lock wait did not end after {WAKE_DEADLINE:?}; it ends when its lock is granted");
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

extern "C" fn wake_handler(_: libc::c_int) {}

/// Installs the no-op handler of [`WAKE_SIGNAL`] without SA_RESTART, so a blocked
/// lock call returns EINTR when woken.
fn install_wake_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a plain sigaction with a handler that touches nothing.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = wake_handler as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(WAKE_SIGNAL, &sa, std::ptr::null_mut());
        }
    });
}

/// Unblocks [`WAKE_SIGNAL`] on this thread while alive; the daemon blocks it in
/// every thread so that it only ever interrupts a lock wait.
struct WakeSignalUnblocked {
    was_blocked: bool,
}

impl WakeSignalUnblocked {
    fn new() -> Self {
        // SAFETY: pthread_sigmask with valid sets.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, WAKE_SIGNAL);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut old);
            WakeSignalUnblocked {
                was_blocked: libc::sigismember(&old, WAKE_SIGNAL) == 1,
            }
        }
    }
}

impl Drop for WakeSignalUnblocked {
    fn drop(&mut self) {
        if self.was_blocked {
            // SAFETY: as in `new`.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, WAKE_SIGNAL);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_ranges_round_trip() {
        let whole = FileLock {
            start: 0,
            end: LOCK_TO_EOF,
            lock_type: libc::F_WRLCK as u32,
            pid: 1,
        };
        let fl = to_flock(&whole).unwrap();
        assert_eq!((fl.l_start, fl.l_len), (0, 0));
        assert_eq!(from_flock(&fl, &whole).end, LOCK_TO_EOF);
        let bad = FileLock {
            start: 10,
            end: 5,
            ..whole
        };
        assert!(to_flock(&bad).is_err());
    }
}
