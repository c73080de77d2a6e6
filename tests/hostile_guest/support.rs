//! What the hostile-guest tests share: looking at the daemon from the host (its fds,
//! CPU, memory), host-side lock probes, a minimal control-socket client, and requests
//! the typed frontend does not build.

#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{FileLock, LkIn, Opcode};
use volfsd::frontend::fuse::Request;

pub const RDWR: u32 = libc::O_RDWR as u32;
pub const RDONLY: u32 = libc::O_RDONLY as u32;

/// Polls `cond` every 5 ms until it holds or `limit` passes.
pub fn poll(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// (dev, ino) of `dir` and of everything under it.
pub fn inodes_under(dir: &Path) -> HashSet<(u64, u64)> {
    let mut out = HashSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        out.insert((m.dev(), m.ino()));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                todo.push(e.path());
            }
        }
    }
    out
}

/// The daemon's fds that point at one of `inodes` (this also catches fds on its
/// private detached mounts, whose paths do not show the host path).
pub fn fds_into(pid: i32, inodes: &HashSet<(u64, u64)>) -> Vec<String> {
    let mut hits = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return hits;
    };
    for e in rd.flatten() {
        let hit = std::fs::metadata(e.path())
            .map(|m| inodes.contains(&(m.dev(), m.ino())))
            .unwrap_or(false);
        if hit {
            let link = std::fs::read_link(e.path()).unwrap_or_default();
            hits.push(format!(
                "fd {} -> {}",
                e.file_name().to_string_lossy(),
                link.display()
            ));
        }
    }
    hits
}

pub fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The access mode (O_RDONLY/O_WRONLY/O_RDWR, or O_PATH) of each daemon fd pointing
/// at one of `inodes`.
pub fn fd_modes_into(pid: i32, inodes: &HashSet<(u64, u64)>) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    for e in rd.flatten() {
        let hit = std::fs::metadata(e.path())
            .map(|m| inodes.contains(&(m.dev(), m.ino())))
            .unwrap_or(false);
        if !hit {
            continue;
        }
        let name = e.file_name().to_string_lossy().to_string();
        let info =
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{name}")).unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|v| i32::from_str_radix(v.trim(), 8).ok())
            .unwrap_or(-1);
        out.push((name, flags));
    }
    out
}

/// utime + stime of the process, in clock ticks.
pub fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// CPU seconds the process used over `window`.
pub fn cpu_seconds_over(pid: i32, window: Duration) -> f64 {
    let before = cpu_ticks(pid);
    std::thread::sleep(window);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (cpu_ticks(pid) - before) as f64 / hz
}

/// A `/proc/PID/status` field in kB (RssAnon, VmPeak, ...).
pub fn status_kb(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Whether some open file description other than ours holds a lock conflicting with a
/// write lock on the whole of `path` (a guest's lock as another sandbox sees it).
pub fn host_sees_lock(path: &Path) -> bool {
    let f = std::fs::File::open(path).expect("open for a lock probe");
    // SAFETY: plain data; zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: fcntl with a valid flock on an open fd.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    assert_eq!(r, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
    fl.l_type != libc::F_UNLCK as i16
}

/// Whether a flock(LOCK_EX|LOCK_NB) on `path` would conflict.
pub fn host_sees_flock(path: &Path) -> bool {
    let f = std::fs::File::open(path).expect("open for a flock probe");
    // SAFETY: flock on an open fd.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    r != 0
}

/// A SETLK/SETLKW/GETLK request on the whole file.
pub fn lock_request(
    opcode: Opcode,
    node: u64,
    fh: u64,
    owner: u64,
    lock_type: i32,
    flock: bool,
) -> Request {
    let lk = LkIn {
        fh,
        owner,
        lk: FileLock {
            start: 0,
            end: i64::MAX as u64,
            type_: lock_type as u32,
            pid: 1,
        },
        lk_flags: u32::from(flock),
        padding: 0,
    };
    let req = Request::new(opcode, node).arg(&lk);
    if opcode as u32 == Opcode::Getlk as u32 {
        req.reply_size(24)
    } else {
        req
    }
}

/// One HTTP request to the control socket; returns (status, body).
pub fn control(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s =
        UnixStream::connect(sock).unwrap_or_else(|e| panic!("connect {}: {e}", sock.display()));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP reply: {out:?}"));
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

/// Creates a host device node (character device `major:minor`) at `path`.
pub fn mknod_char(path: &Path, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mknod at a valid NUL-terminated path.
    let r = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Creates a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo at a valid NUL-terminated path.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o666) };
    assert_eq!(
        r,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}
