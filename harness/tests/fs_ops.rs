//! The file system stack mounted through /dev/fuse, driven with real syscalls; each test
//! checks the host directory behind the mount too.

mod mounted;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use mounted::{MountOptions, Mounted, TempDir};

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn create_write_read_append_truncate() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    let f = m.join("file.txt");
    fs::write(&f, b"hello").unwrap();
    assert_eq!(fs::read(shared.path().join("file.txt")).unwrap(), b"hello");
    let mut a = OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b" world").unwrap();
    drop(a);
    assert_eq!(fs::read(&f).unwrap(), b"hello world");
    assert_eq!(
        fs::read(shared.path().join("file.txt")).unwrap(),
        b"hello world"
    );
    let t = OpenOptions::new().write(true).open(&f).unwrap();
    t.set_len(5).unwrap();
    assert_eq!(fs::read(shared.path().join("file.txt")).unwrap(), b"hello");
    // O_TRUNC through open.
    fs::write(&f, b"x").unwrap();
    assert_eq!(fs::read(shared.path().join("file.txt")).unwrap(), b"x");
}

#[test]
fn mkdir_rmdir_and_readdir_of_many_files() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    let d = m.join("dir");
    fs::create_dir(&d).unwrap();
    assert!(shared.path().join("dir").is_dir());
    for i in 0..2000 {
        File::create(d.join(format!("f{i:05}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2000);
    assert_eq!(names[0], "f00000");
    assert_eq!(names[1999], "f01999");
    assert_eq!(
        fs::remove_dir(&d).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    for n in &names {
        fs::remove_file(d.join(n)).unwrap();
    }
    fs::remove_dir(&d).unwrap();
    assert!(!shared.path().join("dir").exists());
}

#[test]
fn rename_plain_over_noreplace_exchange() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    fs::write(m.join("a"), b"A").unwrap();
    fs::write(m.join("b"), b"B").unwrap();
    fs::rename(m.join("a"), m.join("c")).unwrap();
    assert!(!shared.path().join("a").exists());
    assert_eq!(fs::read(shared.path().join("c")).unwrap(), b"A");
    // Over an existing file.
    fs::rename(m.join("c"), m.join("b")).unwrap();
    assert_eq!(fs::read(shared.path().join("b")).unwrap(), b"A");
    fs::write(m.join("d"), b"D").unwrap();
    let (b, d) = (cpath(&m.join("b")), cpath(&m.join("d")));
    // SAFETY: valid paths; renameat2 with AT_FDCWD.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::AT_FDCWD,
            d.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!((r, last_errno()), (-1, libc::EEXIST));
    // SAFETY: as above.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::AT_FDCWD,
            d.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(fs::read(shared.path().join("b")).unwrap(), b"D");
    assert_eq!(fs::read(shared.path().join("d")).unwrap(), b"A");
}

#[test]
fn hard_link_symlink_readlink() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    fs::write(m.join("orig"), b"data").unwrap();
    fs::hard_link(m.join("orig"), m.join("hard")).unwrap();
    assert_eq!(fs::metadata(m.join("orig")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(shared.path().join("hard")).unwrap().ino(),
        fs::metadata(shared.path().join("orig")).unwrap().ino()
    );
    std::os::unix::fs::symlink("orig", m.join("sym")).unwrap();
    assert_eq!(fs::read_link(m.join("sym")).unwrap(), Path::new("orig"));
    assert_eq!(
        fs::read_link(shared.path().join("sym")).unwrap(),
        Path::new("orig")
    );
    assert_eq!(fs::read(m.join("sym")).unwrap(), b"data");
}

#[test]
fn chmod_chown_utimes() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    let f = m.join("f");
    fs::write(&f, b"x").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        fs::metadata(shared.path().join("f")).unwrap().mode() & 0o7777,
        0o640
    );
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(shared.path().join("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let times = [
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 2_000_000,
            tv_nsec: 0,
        },
    ];
    let c = cpath(&f);
    // SAFETY: valid path and times array.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(shared.path().join("f")).unwrap();
    assert_eq!((md.atime(), md.mtime()), (1_000_000, 2_000_000));
}

#[test]
fn sparse_fallocate_seek_data_hole() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.join("sparse"))
        .unwrap();
    let mib = 1 << 20;
    f.seek(SeekFrom::Start(4 * mib)).unwrap();
    f.write_all(b"end").unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: lseek on an open fd.
    let data = unsafe { libc::lseek(fd, 0, libc::SEEK_DATA) };
    assert!(data >= 0 && data as u64 <= 4 * mib, "SEEK_DATA {data}");
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, 0, libc::SEEK_HOLE) };
    assert!(hole >= 0, "SEEK_HOLE {hole}");
    // SAFETY: fallocate on an open fd.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, mib as i64) }, 0);
    let host = fs::metadata(shared.path().join("sparse")).unwrap();
    assert!(host.blocks() * 512 >= mib, "allocated {}", host.blocks());
    // Punch a hole; the size stays.
    // SAFETY: as above.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            mib as i64,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(
        fs::metadata(shared.path().join("sparse")).unwrap().len(),
        4 * mib + 3
    );
}

#[test]
fn fsync_copy_file_range_tmpfile_syncfs_statfs() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    let mut src = File::create(m.join("src")).unwrap();
    src.write_all(&vec![7u8; 100_000]).unwrap();
    src.sync_all().unwrap();
    src.sync_data().unwrap();
    let src = File::open(m.join("src")).unwrap();
    let dst = File::create(m.join("dst")).unwrap();
    let (mut off_in, mut off_out) = (0i64, 0i64);
    // SAFETY: two open fds and valid offset pointers.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            dst.as_raw_fd(),
            &mut off_out,
            100_000,
            0,
        )
    };
    assert_eq!(n, 100_000);
    assert_eq!(
        fs::read(shared.path().join("dst")).unwrap(),
        vec![7u8; 100_000]
    );

    let mut tmp = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(m.path())
        .unwrap();
    tmp.write_all(b"tmp").unwrap();
    tmp.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    tmp.read_to_string(&mut s).unwrap();
    assert_eq!(s, "tmp");

    // SAFETY: syncfs on an open fd.
    assert_eq!(unsafe { libc::syncfs(dst.as_raw_fd()) }, 0);
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    let c = cpath(m.path());
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) }, 0);
    // SAFETY: statvfs succeeded.
    let st = unsafe { st.assume_init() };
    assert!(st.f_blocks > 0);
    assert_eq!(st.f_flag & libc::ST_RDONLY, 0);
}

#[test]
fn host_changes_are_seen_at_once_with_cache_none() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    assert!(!m.join("h").exists());
    fs::write(shared.path().join("h"), b"v1").unwrap();
    assert_eq!(fs::read(m.join("h")).unwrap(), b"v1");
    fs::write(shared.path().join("h"), b"version2").unwrap();
    assert_eq!(fs::read(m.join("h")).unwrap(), b"version2");
    assert_eq!(fs::metadata(m.join("h")).unwrap().len(), 8);
    fs::remove_file(shared.path().join("h")).unwrap();
    assert!(!m.join("h").exists());
}

/// cache=none opens every file with FOPEN_DIRECT_IO, and a kernel refuses a shared
/// map of such a file (ENODEV) unless INIT granted FUSE_DIRECT_IO_ALLOW_MMAP (Linux
/// 6.6), which fuse-backend-rs cannot name: volfsd answers INIT itself to grant it.
/// What is written through the map is on the host after msync(MS_SYNC).
#[test]
fn shared_mmap_works_with_cache_none_and_reaches_the_host_at_msync() {
    let shared = TempDir::new("shared");
    fs::write(shared.path().join("m"), b"aaaaaaaaaaaaaaaa").unwrap();
    let m = Mounted::new(shared.path());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("m"))
        .unwrap();
    // SAFETY: a fresh 16-byte shared mapping of a 16-byte file, unmapped below and
    // touched only within its length.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            16,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap(MAP_SHARED): errno {}",
            last_errno()
        );
        std::ptr::copy_nonoverlapping(b"HELLO".as_ptr(), p.cast::<u8>(), 5);
        assert_eq!(
            libc::msync(p, 16, libc::MS_SYNC),
            0,
            "msync: errno {}",
            last_errno()
        );
        assert_eq!(
            fs::read(shared.path().join("m")).unwrap(),
            b"HELLOaaaaaaaaaaa",
            "on the host after msync"
        );
        // A change the host makes later is what the mount reads.
        fs::write(shared.path().join("m"), b"bbbbbbbbbbbbbbbb").unwrap();
        assert_eq!(libc::munmap(p, 16), 0);
    }
    let mut back = Vec::new();
    File::open(m.join("m"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, b"bbbbbbbbbbbbbbbb");
}

#[test]
fn readonly_share_refuses_every_mutation() {
    let shared = TempDir::new("shared");
    fs::write(shared.path().join("f"), b"keep").unwrap();
    fs::create_dir(shared.path().join("d")).unwrap();
    let m = Mounted::with(
        shared.path(),
        MountOptions {
            readonly: true,
            ..Default::default()
        },
    );
    let erofs = |r: std::io::Result<()>| {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    };
    assert_eq!(fs::read(m.join("f")).unwrap(), b"keep");
    erofs(fs::write(m.join("new"), b"x"));
    erofs(fs::write(m.join("f"), b"x"));
    erofs(
        OpenOptions::new()
            .append(true)
            .open(m.join("f"))
            .map(|_| ()),
    );
    erofs(fs::create_dir(m.join("nd")));
    erofs(fs::remove_file(m.join("f")));
    erofs(fs::remove_dir(m.join("d")));
    erofs(fs::rename(m.join("f"), m.join("g")));
    erofs(fs::hard_link(m.join("f"), m.join("l")));
    erofs(std::os::unix::fs::symlink("f", m.join("s")));
    erofs(fs::set_permissions(
        m.join("f"),
        fs::Permissions::from_mode(0o600),
    ));
    assert_eq!(fs::read(shared.path().join("f")).unwrap(), b"keep");
    assert!(!shared.path().join("new").exists());
}

/// The FUSE statfs reply has no flags field, so the guest's ST_RDONLY comes from its
/// mount options; the layer itself still reports it, checked here without a transport.
#[test]
fn readonly_statfs_reports_st_rdonly() {
    use fuse_backend_rs::api::filesystem::{Context, FileSystem};
    use volfsd::exports::fs::{build, CacheMode, PassthroughConfig};
    let shared = TempDir::new("shared");
    let cfg = PassthroughConfig::new(CacheMode::None, false);
    let ro = build(shared.path(), None, true, cfg.clone()).unwrap().fs;
    let st = ro.statfs(&Context::new(), 1).unwrap();
    assert_ne!(st.f_flag & libc::ST_RDONLY, 0);
    let rw = build(shared.path(), None, false, cfg).unwrap().fs;
    let st = rw.statfs(&Context::new(), 1).unwrap();
    assert_eq!(st.f_flag & libc::ST_RDONLY, 0);
}

#[test]
fn symlinks_are_not_followed_on_the_host() {
    let shared = TempDir::new("shared");
    let outside = TempDir::new("outside");
    fs::write(outside.path().join("secret"), b"secret").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), shared.path().join("esc")).unwrap();
    let m = Mounted::new(shared.path());
    // The guest sees a symlink with the host's target text...
    let md = fs::symlink_metadata(m.join("esc")).unwrap();
    assert!(md.file_type().is_symlink());
    assert_eq!(
        fs::read_link(m.join("esc")).unwrap(),
        outside.path().join("secret")
    );
    // ...and writing "through" it from inside the mount must not touch the target via
    // the daemon: the kernel resolves it in the caller's namespace (here, the host's,
    // which is why this test only checks that the daemon reports a symlink).
    let mut listed: Vec<_> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    listed.sort();
    assert_eq!(listed, vec!["esc"]);
}

/// flock(2) through the mount: two open files conflict, and the lock is visible to a
/// host process on the backing file (as it would be to another sandbox).
#[test]
fn flock_conflicts_between_open_files_and_with_the_host() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    fs::write(m.join("f"), b"x").unwrap();
    let a = File::open(m.join("f")).unwrap();
    let b = File::open(m.join("f")).unwrap();
    let host = File::open(shared.path().join("f")).unwrap();
    // SAFETY: flock on open fds.
    unsafe {
        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
        assert_eq!(
            libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            -1
        );
        assert_eq!(last_errno(), libc::EWOULDBLOCK);
        assert_eq!(
            libc::flock(host.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB),
            -1
        );
        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_UN), 0);
        assert_eq!(libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
    }
}

/// POSIX locks through the mount: a lock taken by this process is seen by the host's
/// F_OFD_GETLK on the backing file, and released when the file is closed.
#[test]
fn posix_lock_is_visible_on_the_host_and_released_on_close() {
    let shared = TempDir::new("shared");
    let m = Mounted::new(shared.path());
    fs::write(m.join("f"), b"0123456789").unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("f"))
        .unwrap();
    let host = OpenOptions::new()
        .read(true)
        .write(true)
        .open(shared.path().join("f"))
        .unwrap();
    let probe = |host: &File| -> i16 {
        // SAFETY: plain data, zero is valid.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        // SAFETY: fcntl with a valid flock on an open fd.
        assert_eq!(
            unsafe { libc::fcntl(host.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) },
            0
        );
        fl.l_type
    };
    // SAFETY: plain data, zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_len = 4;
    // SAFETY: fcntl with a valid flock on an open fd.
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &mut fl) },
        0
    );
    assert_eq!(probe(&host), libc::F_WRLCK as i16, "the host sees the lock");
    drop(f);
    assert_eq!(probe(&host), libc::F_UNLCK as i16, "close released it");
}
