//! Thin, checked wrappers over raw syscalls the passthrough layer uses, and the
//! parsing of what getdents64 returns. Host accesses take a directory fd and a single
//! validated name component, never a path, so the kernel cannot walk outside the fd
//! (other calls, on an fd the layer holds, are made in place).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn cvt64(ret: i64) -> io::Result<i64> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn errno(e: libc::c_int) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// `openat(dir, name, flags, mode)`, always with `O_CLOEXEC`.
pub fn openat(dir: &impl AsRawFd, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
    // SAFETY: `name` is a valid NUL-terminated string; the returned fd is checked and owned.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: `fd` was just returned by openat and nobody else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `fstatat(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`: the stat of the fd itself.
pub fn stat_fd(fd: &impl AsRawFd) -> io::Result<libc::stat64> {
    let mut st = MaybeUninit::<libc::stat64>::zeroed();
    // SAFETY: the empty string is NUL-terminated and `st` is a valid out pointer.
    cvt(unsafe {
        libc::fstatat64(
            fd.as_raw_fd(),
            c"".as_ptr(),
            st.as_mut_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded, so the kernel filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// The stat of an fd and its mount id, in one `statx` where the kernel has it (a
/// node's registration needs both: one system call fewer per LOOKUP and CREATE),
/// else as [`stat_fd`] and [`mount_id`] give them. The stat is the one `fstatat`
/// gives: the same fields, the device number encoded as glibc encodes it.
pub fn stat_and_mount_id(fd: &impl AsRawFd) -> io::Result<(libc::stat64, u64)> {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid NUL-terminated empty path and a valid out pointer.
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    if ret < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Ok((stat_fd(fd)?, mount_id(fd)));
        }
        return Err(e);
    }
    // SAFETY: statx succeeded.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_BASIC_STATS != libc::STATX_BASIC_STATS {
        // A file system that cannot give every basic field: as fstatat gives it.
        return Ok((stat_fd(fd)?, mount_id(fd)));
    }
    let mnt_id = if stx.stx_mask & libc::STATX_MNT_ID != 0 {
        stx.stx_mnt_id
    } else {
        0
    };
    Ok((stat_from_statx(&stx), mnt_id))
}

/// The `stat64` of a full `statx` (every basic field).
fn stat_from_statx(stx: &libc::statx) -> libc::stat64 {
    // SAFETY: stat64 is plain data; every field is set below or meant to be 0.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    st.st_ino = stx.stx_ino;
    st.st_nlink = u64::from(stx.stx_nlink);
    st.st_mode = u32::from(stx.stx_mode);
    st.st_uid = stx.stx_uid;
    st.st_gid = stx.stx_gid;
    st.st_rdev = libc::makedev(stx.stx_rdev_major, stx.stx_rdev_minor);
    st.st_size = stx.stx_size as i64;
    st.st_blksize = i64::from(stx.stx_blksize);
    st.st_blocks = stx.stx_blocks as i64;
    st.st_atime = stx.stx_atime.tv_sec;
    st.st_atime_nsec = i64::from(stx.stx_atime.tv_nsec);
    st.st_mtime = stx.stx_mtime.tv_sec;
    st.st_mtime_nsec = i64::from(stx.stx_mtime.tv_nsec);
    st.st_ctime = stx.stx_ctime.tv_sec;
    st.st_ctime_nsec = i64::from(stx.stx_ctime.tv_nsec);
    st
}

/// The mount id of an fd, from statx; 0 where the kernel cannot tell.
pub fn mount_id(fd: &impl AsRawFd) -> u64 {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid NUL-terminated empty path and a valid out pointer.
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    if ret < 0 {
        return 0;
    }
    // SAFETY: statx succeeded.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_MNT_ID != 0 {
        stx.stx_mnt_id
    } else {
        0
    }
}

/// A `/proc/self/fd/N` name relative to the daemon's `/proc/self/fd` directory fd.
/// Used to reopen an `O_PATH` fd with real access flags; the kernel resolves the magic
/// link to the very inode the fd holds, never by path, so no rename can redirect it.
pub struct ProcFdName {
    buf: [u8; 24],
}

impl ProcFdName {
    pub fn new(fd: RawFd) -> Self {
        let mut buf = [0u8; 24];
        let mut n = fd as u32;
        let mut digits = [0u8; 12];
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for i in 0..len {
            buf[i] = digits[len - 1 - i];
        }
        ProcFdName { buf }
    }

    pub fn as_cstr(&self) -> &CStr {
        // The buffer always holds ASCII digits followed by at least one NUL.
        CStr::from_bytes_until_nul(&self.buf).expect("ProcFdName is NUL-terminated")
    }
}

pub fn renameat2(
    olddir: &impl AsRawFd,
    oldname: &CStr,
    newdir: &impl AsRawFd,
    newname: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: both names are valid NUL-terminated strings; the return value is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    };
    cvt64(ret).map(|_| ())
}

/// Switches this thread's filesystem uid/gid to the guest caller's for the lifetime
/// of the guard, so that files the guest creates are owned by the guest's user, and,
/// with `--translate-uid/gid`, so that the host kernel decides each identity-dependent
/// call as it would for that user. setfsuid/setfsgid are per-thread at the syscall
/// level, which is what we want here. A switch from fsuid 0 to another clears
/// CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID and
/// CAP_MKNOD from the thread's effective set, and the switch back restores them
/// (capabilities(7), "Effect of user ID changes on capabilities").
pub struct FsCredsGuard {
    old_uid: u32,
    old_gid: u32,
}

/// The daemon's own effective ids: it never changes them, so they are read once.
fn own_ids() -> (u32, u32) {
    static OWN_IDS: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    // SAFETY: geteuid/getegid cannot fail.
    *OWN_IDS.get_or_init(|| unsafe { (libc::geteuid(), libc::getegid()) })
}

impl FsCredsGuard {
    /// Switches to `uid`/`gid`; costs nothing when they are the daemon's own
    /// (the common case of a root guest and a root daemon): four syscalls spared on
    /// every create.
    pub fn switch(uid: u32, gid: u32) -> Option<Self> {
        let (euid, egid) = own_ids();
        if uid == euid && gid == egid {
            return None;
        }
        // SAFETY: raw per-thread credential syscalls; they cannot fail in a way that
        // corrupts memory, and the previous values are restored on drop.
        unsafe {
            let old_gid = libc::syscall(libc::SYS_setfsgid, gid) as u32;
            let old_uid = libc::syscall(libc::SYS_setfsuid, uid) as u32;
            Some(FsCredsGuard { old_uid, old_gid })
        }
    }

    /// [`Self::switch`] for a translated caller: the thread also holds no
    /// supplementary groups, since the daemon's own (root's group, say) must not lend
    /// the caller a group's access. A thread's first switch is checked: a daemon that
    /// may not change its fs ids (no CAP_SETUID/CAP_SETGID) would otherwise act as
    /// itself. Threads keep those capabilities for their life, so once is enough.
    pub fn switch_translated(uid: u32, gid: u32) -> io::Result<Option<Self>> {
        thread_local! {
            static READY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        let (euid, egid) = own_ids();
        if uid == euid && gid == egid {
            return Ok(None);
        }
        if READY.with(|r| r.get()) {
            return Ok(FsCredsGuard::switch(uid, gid));
        }
        drop_supplementary_groups()?;
        let guard = FsCredsGuard::switch(uid, gid);
        // setfsuid/setfsgid answer the previous value, never an error: asking again
        // for the same id tells whether the first call took.
        // SAFETY: as in `switch`; setting the id just set changes nothing.
        let (now_uid, now_gid) = unsafe {
            (
                libc::syscall(libc::SYS_setfsuid, uid) as u32,
                libc::syscall(libc::SYS_setfsgid, gid) as u32,
            )
        };
        if now_uid != uid || now_gid != gid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "cannot act as host uid {uid} gid {gid} (setfsuid/setfsgid refused: \
                     the daemon lacks CAP_SETUID/CAP_SETGID)"
                ),
            ));
        }
        READY.with(|r| r.set(true));
        Ok(guard)
    }
}

impl Drop for FsCredsGuard {
    fn drop(&mut self) {
        // SAFETY: see `switch`.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, self.old_uid);
            libc::syscall(libc::SYS_setfsgid, self.old_gid);
        }
    }
}

/// Empties this thread's supplementary groups. The raw system call acts on the
/// calling thread only (glibc's setgroups would change every thread).
fn drop_supplementary_groups() -> io::Result<()> {
    // SAFETY: setgroups with a count of 0 reads no list.
    cvt64(unsafe { libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) })
        .map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("dropping the supplementary groups of a queue thread: {e}"),
        )
    })?;
    Ok(())
}

/// `getdents64` into `buf`; the number of bytes filled (0 at the end).
pub fn getdents64(dir: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid writable buffer of the given length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    cvt64(n).map(|n| n as usize)
}

/// The records of a getdents64 buffer, as FUSE directory entries. A record that does
/// not fit its buffer is EIO.
pub struct Dirents<'a> {
    buf: &'a [u8],
}

impl<'a> Dirents<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Dirents { buf }
    }
}

/// Bytes before the name in a `struct linux_dirent64`: u64 ino, i64 off, u16 reclen,
/// u8 type.
const DIRENT_HEADER: usize = 19;

impl<'a> Iterator for Dirents<'a> {
    type Item = io::Result<fuse_backend_rs::api::filesystem::DirEntry<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        let rec = self.buf;
        let reclen = rec
            .get(16..18)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]) as usize)
            .unwrap_or(0);
        if rec.len() < DIRENT_HEADER || reclen < DIRENT_HEADER || reclen > rec.len() {
            self.buf = &[];
            return Some(Err(errno(libc::EIO)));
        }
        let ino = u64::from_ne_bytes(rec[0..8].try_into().expect("8 bytes"));
        let off = i64::from_ne_bytes(rec[8..16].try_into().expect("8 bytes"));
        let name_field = &rec[DIRENT_HEADER..reclen];
        let name_len = name_field
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(name_field.len());
        self.buf = &rec[reclen..];
        Some(Ok(fuse_backend_rs::api::filesystem::DirEntry {
            ino,
            offset: off as u64,
            type_: u32::from(rec[18]),
            name: &name_field[..name_len],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fd_name_formats_decimal() {
        assert_eq!(ProcFdName::new(0).as_cstr().to_bytes(), b"0");
        assert_eq!(ProcFdName::new(7).as_cstr().to_bytes(), b"7");
        assert_eq!(ProcFdName::new(1234567).as_cstr().to_bytes(), b"1234567");
    }

    #[test]
    fn creds_guard_switches_and_restores() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: getters cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert!(
            FsCredsGuard::switch(euid, egid).is_none(),
            "own ids: no switch"
        );
        if euid != 0 {
            return; // switching to another uid needs CAP_SETUID
        }
        let dir = std::env::temp_dir().join(format!("volfsd-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        {
            let _g = FsCredsGuard::switch(1234, 5678);
            File::create(dir.join("guest")).unwrap();
        }
        File::create(dir.join("daemon")).unwrap();
        let g = std::fs::metadata(dir.join("guest")).unwrap();
        let d = std::fs::metadata(dir.join("daemon")).unwrap();
        assert_eq!((g.uid(), g.gid()), (1234, 5678));
        assert_eq!((d.uid(), d.gid()), (euid, egid));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_translated_switch_drops_the_fs_capabilities_and_the_groups() {
        use crate::sandbox::caps::{current, CAP_DAC_OVERRIDE, CAP_FOWNER};
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // switching needs CAP_SETUID
        }
        let dir = std::env::temp_dir().join(format!("volfsd-translated-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let in_thread = dir.clone();
        std::thread::spawn(move || {
            let dir = in_thread;
            let groups = || {
                // SAFETY: a count of 0 asks the number only.
                unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) }
            };
            let (before, _) = current().unwrap();
            {
                let _g = FsCredsGuard::switch_translated(100_000, 100_000)
                    .unwrap()
                    .expect("another id: a switch");
                let (eff, _) = current().unwrap();
                assert!(!eff.contains(CAP_DAC_OVERRIDE) && !eff.contains(CAP_FOWNER));
                assert_eq!(groups(), 0, "no supplementary groups");
                // A second switch on this thread skips the checks and still works.
                let _h = FsCredsGuard::switch_translated(100_001, 100_001).unwrap();
                let f = dir.join("by-100001");
                File::create(&f).expect("create in a 0777 directory");
                use std::os::unix::fs::MetadataExt;
                assert_eq!(std::fs::metadata(&f).unwrap().uid(), 100_001);
            }
            assert_eq!(
                current().unwrap().0,
                before,
                "capabilities back after the switch"
            );
            assert!(FsCredsGuard::switch_translated(0, 0).unwrap().is_none());
        })
        .join()
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dirents_parse_and_a_short_record_is_eio() {
        let dir = File::open("/").unwrap();
        let mut buf = vec![0u8; 4096];
        let n = getdents64(&dir, &mut buf).unwrap();
        let names: Vec<Vec<u8>> = Dirents::new(&buf[..n])
            .map(|e| e.unwrap().name.to_vec())
            .collect();
        assert!(names.iter().any(|n| n == b"."));
        // A record claiming more bytes than there are.
        let mut bad = buf[..n].to_vec();
        bad[16..18].copy_from_slice(&(n as u16 + 1).to_ne_bytes());
        let first = Dirents::new(&bad).next().unwrap();
        assert_eq!(first.err().unwrap().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn one_statx_gives_what_fstatat_and_the_mount_id_give() {
        for path in ["/", "/proc/self", "/dev/null", "/etc/hostname"] {
            let Ok(f) = File::open(path) else { continue };
            let (st, mnt) = stat_and_mount_id(&f).unwrap();
            let want = stat_fd(&f).unwrap();
            assert_eq!(
                (
                    st.st_dev,
                    st.st_ino,
                    st.st_mode,
                    st.st_nlink,
                    st.st_uid,
                    st.st_gid
                ),
                (
                    want.st_dev,
                    want.st_ino,
                    want.st_mode,
                    want.st_nlink,
                    want.st_uid,
                    want.st_gid
                ),
                "{path}"
            );
            assert_eq!(
                (st.st_rdev, st.st_size, st.st_blksize, st.st_blocks),
                (want.st_rdev, want.st_size, want.st_blksize, want.st_blocks),
                "{path}"
            );
            assert_eq!(
                (st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec),
                (
                    want.st_mtime,
                    want.st_mtime_nsec,
                    want.st_ctime,
                    want.st_ctime_nsec
                ),
                "{path}"
            );
            assert_eq!(mnt, mount_id(&f), "{path}");
        }
    }

    #[test]
    fn stat_fd_reports_directory() {
        let dir = File::open("/").unwrap();
        let st = stat_fd(&dir).unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFDIR);
    }
}
