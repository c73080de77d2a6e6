//! What the targets share: their temporary SharedDir, the fd oracle, and the
//! read-only volume's checksum.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A directory of its own under /dev/shm (or the temp dir), removed on drop. Directories
/// left by fuzz processes that died (AFL kills them) are removed when the next one
/// of the same target starts.
pub struct Scratch {
    path: PathBuf,
    /// A tmpfs was mounted on it (in this process's own mount namespace).
    tmpfs: bool,
}

const PREFIX: &str = "volfsd-fuzz-";

impl Scratch {
    /// `tmpfs_mib`: when Some, tries to mount a tmpfs of that size on the directory in
    /// a private mount namespace (so what a target writes is bounded and vanishes with
    /// the process). Falls back to a plain directory where that is refused (not root,
    /// or a multi-threaded process such as the test harness).
    pub fn new(target: &str, tmpfs_mib: Option<u64>) -> Scratch {
        remove_stale(target);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = base_dir().join(format!("{PREFIX}{target}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating the scratch dir");
        let tmpfs = match tmpfs_mib {
            Some(mib) => mount_private_tmpfs(&path, mib),
            None => false,
        };
        let path = path.canonicalize().expect("canonical scratch dir");
        Scratch { path, tmpfs }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn on_tmpfs(&self) -> bool {
        self.tmpfs
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.tmpfs {
            // SAFETY: a plain umount2 of our own mount point.
            let p = std::ffi::CString::new(self.path.as_os_str().as_bytes()).unwrap();
            unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Where scratch dirs go: /dev/shm (a tmpfs: no disk I/O, so `syncfs` and `fsync` in
/// a request cost nothing even where no private tmpfs can be mounted, as in the
/// multi-threaded test harness), else the system temp dir.
fn base_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn remove_stale(target: &str) {
    let Ok(rd) = std::fs::read_dir(base_dir()) else {
        return;
    };
    let me = std::process::id();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|n| n.strip_prefix(target))
            .and_then(|n| n.strip_prefix('-'))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != me && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn mount_private_tmpfs(path: &Path, mib: u64) -> bool {
    use std::ffi::CString;
    // A mount namespace unshared by one thread is that thread's alone: in a process
    // of several (the replay tests), another thread using the tree would see the
    // directory under the tmpfs, empty. Only a process of one thread mounts it.
    let threads = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse::<u32>().ok())
        });
    if threads != Some(1) {
        return false;
    }
    // SAFETY: unshare/mount with valid C strings; failures are reported by the return
    // value and leave the process as it was.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return false;
        }
        let root = CString::new("/").unwrap();
        let none = CString::new("none").unwrap();
        if libc::mount(
            none.as_ptr(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return false;
        }
        let target = CString::new(path.as_os_str().as_bytes()).unwrap();
        let fstype = CString::new("tmpfs").unwrap();
        let opts = CString::new(format!("size={mib}m,mode=0755")).unwrap();
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            opts.as_ptr() as *const libc::c_void,
        ) == 0
    }
}

/// Bounds what one file may grow to (writes beyond get EFBIG, not SIGXFSZ), for the
/// case where no tmpfs could be mounted.
pub fn limit_file_size(bytes: u64) {
    // SAFETY: setrlimit/signal with valid arguments.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        // The soft limit only: a target that needs a large file of its own (the
        // region target's sparse memfd) raises it for that one call.
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim);
        lim.rlim_cur = bytes.min(lim.rlim_max);
        libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
    }
}

/// The fds open in this process: fd -> link text.
pub fn open_fds() -> BTreeMap<i32, String> {
    let mut m = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc/self/fd") {
        for e in rd.flatten() {
            if let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                let link = std::fs::read_link(e.path())
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                m.insert(fd, link);
            }
        }
    }
    m
}

/// (dev, ino) of everything under `root`, `root` included (symlinks not followed).
pub fn tree_inodes(root: &Path) -> HashSet<(u64, u64)> {
    let mut set = HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        set.insert((m.dev(), m.ino()));
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    set
}

/// The fd oracle: every fd opened since `baseline` that refers to a file system
/// object (not a pipe, socket or anonymous inode) lies inside `root`. Fds of the
/// shares' detached mounts show paths relative to the share, so the check is by
/// (dev, ino) against the tree, not by the link text. A file unlinked while open
/// ("(deleted)") must still be on the scratch file system.
pub fn check_fds(baseline: &BTreeMap<i32, String>, root: &Path) {
    let now = open_fds();
    let new: Vec<(i32, String)> = now
        .into_iter()
        .filter(|(fd, link)| baseline.get(fd) != Some(link))
        .filter(|(_, link)| link.starts_with('/'))
        .collect();
    if new.is_empty() {
        return;
    }
    let root_dev = std::fs::metadata(root).map(|m| m.dev()).unwrap_or(0);
    let inside = tree_inodes(root);
    for (fd, link) in new {
        let Ok(m) = std::fs::metadata(format!("/proc/self/fd/{fd}")) else {
            continue; // closed meanwhile
        };
        let key = (m.dev(), m.ino());
        if inside.contains(&key) {
            continue;
        }
        if m.dev() == root_dev && link.ends_with(" (deleted)") {
            continue;
        }
        panic!(
            "fd {fd} -> {link} (dev {:#x} ino {}) is outside the scratch dir {}",
            m.dev(),
            m.ino(),
            root.display()
        );
    }
}

/// FNV-1a over names, kinds, sizes, modes and contents of a tree (sorted walk).
pub fn tree_checksum(root: &Path) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    let mut feed = |b: &[u8]| {
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    };
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            feed(b"?missing");
            continue;
        };
        feed(p.strip_prefix(root).unwrap_or(&p).as_os_str().as_bytes());
        feed(&m.permissions().mode().to_le_bytes());
        feed(&m.len().to_le_bytes());
        feed(&m.uid().to_le_bytes());
        feed(&m.gid().to_le_bytes());
        if m.is_file() {
            if let Ok(data) = std::fs::read(&p) {
                feed(&data);
            }
        } else if m.file_type().is_symlink() {
            if let Ok(t) = std::fs::read_link(&p) {
                feed(t.as_os_str().as_bytes());
            }
        } else if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                let mut v: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
                v.sort();
                v.reverse();
                feed(&(v.len() as u64).to_le_bytes());
                stack.extend(v);
            }
        }
        // xattrs of the ro volume's files
        let mut buf = [0u8; 1024];
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid path and buffer.
        let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr() as *mut _, buf.len()) };
        if n > 0 {
            feed(&buf[..n as usize]);
        }
    }
    h
}

/// Reads a little-endian integer from `data` at `*pos`, advancing; zero past the end.
pub struct Cursor<'a> {
    pub data: &'a [u8],
    pub pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    pub fn u8(&mut self) -> u8 {
        let v = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        v
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let r = self.data.get(self.pos..).unwrap_or(&[]);
        self.pos = self.data.len();
        r
    }

    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = end;
        &self.data[start..end]
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
}

/// A watchdog for the "returns within a bounded time" oracles: [`Watchdog::arm`]
/// starts a deadline; if it passes before [`Watchdog::disarm`], the process aborts
/// with a message, which AFL records as a crash (not as a hang it would drop).
pub struct Watchdog;

static WATCH: std::sync::Mutex<Option<(std::time::Instant, &'static str)>> =
    std::sync::Mutex::new(None);
static WATCH_THREAD: std::sync::Once = std::sync::Once::new();

impl Watchdog {
    pub fn arm(limit: std::time::Duration, what: &'static str) {
        WATCH_THREAD.call_once(|| {
            std::thread::Builder::new()
                .name("fuzz-watchdog".into())
                .spawn(|| loop {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    let w = *WATCH.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some((deadline, what)) = w {
                        if std::time::Instant::now() > deadline {
                            eprintln!("watchdog: {what} did not return in time");
                            std::process::abort();
                        }
                    }
                })
                .expect("watchdog thread");
        });
        *WATCH.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((std::time::Instant::now() + limit, what));
    }

    pub fn disarm() {
        *WATCH.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}
