//! The escape suite: SharedDir restricted to allowed dirs, per-share read-only, and
//! confinement. Kept as its own test target so every later change is held to it.
//!
//! Two ways in: real syscalls on the stack mounted through /dev/fuse, and direct calls
//! into the stack for requests a guest kernel never sends (`LOOKUP ..`, forged ids).

mod mounted;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, ATTR_SUBMOUNT};
use fuse_backend_rs::api::filesystem::{Context, Entry, FileSystem};
use mounted::{Mounted, TempDir};
use volfsd::exports::fs::{self as vfs, CacheMode, ExtraOps, PassthroughConfig, VolFs};
use volfsd_harness::fixtures;

const ROOT: u64 = 1;

fn cfg() -> PassthroughConfig {
    PassthroughConfig::new(CacheMode::None, true)
}

/// SharedDir with `a` (rw), `b` (ro), `c` (rw) and `hidden` holding a secret.
fn platform_layout() -> TempDir {
    let sd = TempDir::new("sd");
    for d in ["a", "b", "c", "hidden"] {
        fs::create_dir(sd.path().join(d)).unwrap();
    }
    fs::write(sd.path().join("hidden/secret"), b"SECRET").unwrap();
    fs::write(sd.path().join("b/f"), b"ro-data").unwrap();
    fs::write(sd.path().join("a/f"), b"rw-data").unwrap();
    fs::write(sd.path().join("top-level-file"), b"x").unwrap();
    sd
}

fn stack(sd: &Path, allowed: &[&str]) -> Arc<VolFs> {
    let sd = sd.canonicalize().unwrap();
    let args: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
    let specs = volfsd::exports::config::parse_allowed_dirs(&sd, &args).unwrap();
    vfs::build(&sd, Some(&specs), false, cfg()).unwrap().fs
}

fn ctx() -> Context {
    Context::new()
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn err_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().unwrap()
}

fn lookup(fs: &VolFs, parent: u64, name: &str) -> std::io::Result<Entry> {
    fs.lookup(&ctx(), parent, &c(name))
}

fn listing(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

// ---- configuration --------------------------------------------------------------

#[test]
fn allowed_dir_validation_names_path_and_reason() {
    let sd = platform_layout();
    let root = sd.path().canonicalize().unwrap();
    fs::create_dir(root.join("a/nested")).unwrap();
    std::os::unix::fs::symlink("hidden", root.join("link")).unwrap();
    let err = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        volfsd::exports::config::parse_allowed_dirs(&root, &args)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&["missing"]).contains("--allowed-dir missing: does not exist"));
    assert!(err(&["top-level-file"]).contains("not a directory"));
    assert!(err(&["link"]).contains("symlink"));
    assert!(err(&["a/../hidden"]).contains(".."));
    assert!(err(&["/etc"]).contains("not inside SharedDir"));
    assert!(err(&["a", "a:ro"]).contains("given twice"));
    assert!(err(&["a", "a/nested"]).contains("overlaps"));
    assert!(err(&["a/nested", "a"]).contains("overlaps"));
}

#[test]
fn daemon_exits_1_on_a_bad_allowed_dir() {
    let sd = platform_layout();
    let out = std::process::Command::new(fixtures::volfsd_binary())
        .args(["--socket-path", "/tmp/volfsd-never.sock", "--shared-dir"])
        .arg(sd.path())
        .args(["--allowed-dir", "nope:ro"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--allowed-dir nope:ro: does not exist"),
        "{stderr}"
    );
}

// ---- guest view -----------------------------------------------------------------

#[test]
fn root_lists_only_allowed_dirs_and_hides_the_rest() {
    let sd = platform_layout();
    let m = Mounted::volumes(sd.path(), &["a", "b:ro"]);
    assert_eq!(listing(m.path()), vec!["a", "b"]);
    for hidden in ["hidden", "c", "top-level-file", "hidden/secret"] {
        let e = fs::metadata(m.join(hidden)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{hidden}");
    }
    assert_eq!(fs::read(m.join("a/f")).unwrap(), b"rw-data");
    assert_eq!(fs::read(m.join("b/f")).unwrap(), b"ro-data");
}

#[test]
fn nested_allowed_dir_shows_only_the_path_to_it() {
    let sd = platform_layout();
    let root = sd.path();
    fs::create_dir_all(root.join("rw/vol-a")).unwrap();
    fs::create_dir_all(root.join("rw/vol-secret")).unwrap();
    fs::write(root.join("rw/vol-a/x"), b"x").unwrap();
    let m = Mounted::volumes(root, &["rw/vol-a", "b:ro"]);
    assert_eq!(listing(m.path()), vec!["b", "rw"]);
    assert_eq!(listing(&m.join("rw")), vec!["vol-a"]);
    assert_eq!(fs::read(m.join("rw/vol-a/x")).unwrap(), b"x");
    assert_eq!(
        fs::metadata(m.join("rw/vol-secret"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );
}

#[test]
fn virtual_dirs_are_traversable_but_not_writable() {
    let sd = platform_layout();
    fs::create_dir_all(sd.path().join("rw/vol-a")).unwrap();
    let m = Mounted::volumes(sd.path(), &["a", "rw/vol-a"]);
    for dir in [m.path().to_path_buf(), m.join("rw")] {
        let eacces = |r: std::io::Result<()>| assert_eq!(err_of(r), libc::EACCES);
        eacces(fs::create_dir(dir.join("new")));
        eacces(File::create(dir.join("new")).map(|_| ()));
        eacces(std::os::unix::fs::symlink("x", dir.join("sym")));
        eacces(fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)));
    }
    assert_eq!(err_of(fs::rename(m.join("a"), m.join("z"))), libc::EACCES);
    assert_eq!(err_of(fs::remove_dir(m.join("a"))), libc::EACCES);
    assert_eq!(
        err_of(fs::rename(m.join("rw/vol-a"), m.join("rw/x"))),
        libc::EACCES
    );
    // setxattr on the virtual root.
    let p = CString::new(m.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path, name and value.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            c"user.x".as_ptr(),
            b"v".as_ptr() as *const libc::c_void,
            1,
            0,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    assert!(sd.path().join("a").exists());
    assert!(!sd.path().join("new").exists());
}

#[test]
fn no_request_yields_a_node_for_a_hidden_entry() {
    let sd = platform_layout();
    let fs = stack(sd.path(), &["a", "b:ro"]);
    for name in ["hidden", "c", "top-level-file", "secret"] {
        assert_eq!(err_of(lookup(&fs, ROOT, name)), libc::ENOENT, "{name}");
    }
    // Forged node ids: never handed out.
    let live: Vec<u64> = ["a", "b"]
        .iter()
        .map(|n| lookup(&fs, ROOT, n).unwrap().inode)
        .collect();
    for id in [0, 2, 3, 4, 1000, u64::MAX] {
        if live.contains(&id) {
            continue;
        }
        assert_eq!(
            err_of(fs.getattr(&ctx(), id, None)),
            libc::ENOENT,
            "id {id}"
        );
        assert_eq!(err_of(lookup(&fs, id, "secret")), libc::ENOENT, "id {id}");
    }
    // Stale ids after FORGET.
    let a = lookup(&fs, ROOT, "a").unwrap();
    let f = lookup(&fs, a.inode, "f").unwrap();
    fs.forget(&ctx(), f.inode, 1);
    assert_eq!(err_of(fs.getattr(&ctx(), f.inode, None)), libc::ENOENT);
    let again = lookup(&fs, a.inode, "f").unwrap();
    assert_ne!(again.inode, f.inode, "node ids are never reused");
}

// ---- `..`, names --------------------------------------------------------------------

#[test]
fn dotdot_never_climbs_above_a_share() {
    let sd = platform_layout();
    fs::create_dir_all(sd.path().join("a/d/e")).unwrap();
    fs::create_dir_all(sd.path().join("rw/vol")).unwrap();
    let fs = stack(sd.path(), &["a", "rw/vol"]);
    assert_eq!(lookup(&fs, ROOT, "..").unwrap().inode, ROOT);
    let a = lookup(&fs, ROOT, "a").unwrap();
    assert_eq!(lookup(&fs, a.inode, "..").unwrap().inode, ROOT);
    let rw = lookup(&fs, ROOT, "rw").unwrap();
    let vol = lookup(&fs, rw.inode, "vol").unwrap();
    assert_eq!(lookup(&fs, vol.inode, "..").unwrap().inode, rw.inode);
    assert_eq!(lookup(&fs, rw.inode, "..").unwrap().inode, ROOT);
    // Inside a share, `..` reaches only a directory the guest already holds.
    let d = lookup(&fs, a.inode, "d").unwrap();
    let e = lookup(&fs, d.inode, "e").unwrap();
    assert_eq!(lookup(&fs, e.inode, "..").unwrap().inode, d.inode);
    assert_eq!(lookup(&fs, d.inode, "..").unwrap().inode, a.inode);
}

#[test]
fn bad_names_get_linux_errnos() {
    let sd = platform_layout();
    let fs = stack(sd.path(), &["a"]);
    let a = lookup(&fs, ROOT, "a").unwrap().inode;
    let x = ctx();
    assert_eq!(err_of(lookup(&fs, a, "../hidden")), libc::EINVAL);
    assert_eq!(err_of(lookup(&fs, a, "f/")), libc::EINVAL);
    assert_eq!(err_of(lookup(&fs, ROOT, "a/f")), libc::EINVAL);
    let long = "n".repeat(256);
    assert_eq!(err_of(lookup(&fs, a, &long)), libc::ENAMETOOLONG);
    assert_eq!(err_of(fs.mkdir(&x, a, &c("."), 0o755, 0)), libc::EEXIST);
    assert_eq!(err_of(fs.mkdir(&x, a, &c(".."), 0o755, 0)), libc::EEXIST);
    assert_eq!(err_of(fs.mkdir(&x, a, &c("x/y"), 0o755, 0)), libc::EINVAL);
    assert_eq!(err_of(fs.unlink(&x, a, &c("."))), libc::EISDIR);
    assert_eq!(err_of(fs.rmdir(&x, a, &c("."))), libc::EINVAL);
    assert_eq!(err_of(fs.rmdir(&x, a, &c(".."))), libc::ENOTEMPTY);
    assert_eq!(
        err_of(fs.rename(&x, a, &c(".."), a, &c("z"), 0)),
        libc::EBUSY
    );
    let args = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: 0o644,
        umask: 0,
        fuse_flags: 0,
    };
    assert_eq!(err_of(fs.create(&x, a, &c(".."), args)), libc::EISDIR);
    assert_eq!(err_of(fs.symlink(&x, &c("/etc"), a, &c("."))), libc::EEXIST);
    assert!(!sd.path().join("hidden/z").exists());
}

// ---- symlinks and host-side moves ----------------------------------------------------

#[test]
fn planted_symlinks_reach_the_guest_as_symlinks_and_are_never_followed() {
    let sd = platform_layout();
    let root = sd.path().canonicalize().unwrap();
    for (name, target) in [
        ("to-secret", "../hidden/secret"),
        ("to-etc", "/etc/hostname"),
        ("to-root", "/"),
        (
            "to-hidden-abs",
            root.join("hidden/secret").to_str().unwrap(),
        ),
    ] {
        std::os::unix::fs::symlink(target, root.join("a").join(name)).unwrap();
    }
    let fs = stack(&root, &["a"]);
    let a = lookup(&fs, ROOT, "a").unwrap().inode;
    for name in ["to-secret", "to-etc", "to-root", "to-hidden-abs"] {
        let e = lookup(&fs, a, name).unwrap();
        assert_eq!(e.attr.st_mode & libc::S_IFMT, libc::S_IFLNK, "{name}");
        assert!(!fs.readlink(&ctx(), e.inode).unwrap().is_empty());
        // Opening the symlink's node never opens its target.
        let r = fs.open(&ctx(), e.inode, libc::O_RDONLY as u32, 0);
        assert_eq!(err_of(r), libc::ELOOP, "{name}");
        // Nor does a lookup through it.
        assert!(lookup(&fs, e.inode, "secret").is_err());
        assert!(lookup(&fs, e.inode, "hostname").is_err());
    }
}

#[test]
fn directory_renamed_on_the_host_keeps_being_served() {
    let sd = platform_layout();
    fs::create_dir(sd.path().join("a/d1")).unwrap();
    fs::write(sd.path().join("a/d1/f"), b"inside").unwrap();
    let m = Mounted::volumes(sd.path(), &["a"]);
    let dir = File::open(m.join("a/d1")).unwrap();
    fs::rename(sd.path().join("a/d1"), sd.path().join("a/d2")).unwrap();
    let read_at = |dir: &File, name: &str| -> std::io::Result<Vec<u8>> {
        let n = c(name);
        // SAFETY: openat relative to an open directory fd.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), n.as_ptr(), libc::O_RDONLY) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just opened.
        let mut f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    };
    assert_eq!(read_at(&dir, "f").unwrap(), b"inside");
    assert_eq!(fs::read(m.join("a/d2/f")).unwrap(), b"inside");
    assert!(!m.join("a/d1").exists());
}

#[test]
fn directory_moved_out_of_a_share_reaches_nothing_beyond_itself() {
    let sd = platform_layout();
    fs::create_dir(sd.path().join("a/d")).unwrap();
    fs::write(sd.path().join("a/d/f"), b"inside").unwrap();
    let fs = stack(sd.path(), &["a"]);
    let a = lookup(&fs, ROOT, "a").unwrap().inode;
    let d = lookup(&fs, a, "d").unwrap().inode;
    // The host moves the directory next to the secret, outside every share.
    fs::rename(sd.path().join("a/d"), sd.path().join("hidden/d")).unwrap();
    // Names inside it still resolve inside it (like a host process's cwd)...
    assert!(lookup(&fs, d, "f").is_ok());
    // ...but nothing above it: `..` is not a directory the guest holds.
    assert_eq!(err_of(lookup(&fs, d, "..")), libc::ENOENT);
    assert_eq!(err_of(lookup(&fs, d, "secret")), libc::ENOENT);
    assert_eq!(err_of(lookup(&fs, d, "../secret")), libc::EINVAL);
}

// ---- read-only shares ------------------------------------------------------------------

#[test]
fn read_only_share_refuses_every_mutation_with_erofs() {
    let sd = platform_layout();
    fs::create_dir(sd.path().join("b/sub")).unwrap();
    let m = Mounted::with(
        sd.path(),
        mounted::MountOptions {
            allowed: Some(vec!["a".into(), "b:ro".into()]),
            xattr: true,
            ..Default::default()
        },
    );
    let erofs = |what: &str, r: std::io::Result<()>| {
        assert_eq!(err_of(r), libc::EROFS, "{what}");
    };
    erofs("create", File::create(m.join("b/new")).map(|_| ()));
    erofs("mkdir", fs::create_dir(m.join("b/nd")));
    erofs("symlink", std::os::unix::fs::symlink("f", m.join("b/s")));
    erofs("link into", fs::hard_link(m.join("a/f"), m.join("b/l")));
    erofs("unlink", fs::remove_file(m.join("b/f")));
    erofs("rmdir", fs::remove_dir(m.join("b/sub")));
    erofs("rename within", fs::rename(m.join("b/f"), m.join("b/g")));
    erofs("rename out", fs::rename(m.join("b/f"), m.join("a/g")));
    erofs("rename in", fs::rename(m.join("a/f"), m.join("b/g")));
    erofs(
        "chmod",
        fs::set_permissions(m.join("b/f"), fs::Permissions::from_mode(0o600)),
    );
    erofs(
        "chown",
        std::os::unix::fs::chown(m.join("b/f"), Some(1), Some(1)),
    );
    for (what, opts) in [
        ("O_WRONLY", OpenOptions::new().write(true).clone()),
        ("O_RDWR", OpenOptions::new().read(true).write(true).clone()),
        ("O_APPEND", OpenOptions::new().append(true).clone()),
        (
            "O_TRUNC",
            OpenOptions::new().write(true).truncate(true).clone(),
        ),
        (
            "O_CREAT",
            OpenOptions::new().write(true).create(true).clone(),
        ),
    ] {
        erofs(what, opts.open(m.join("b/f")).map(|_| ()));
    }
    let mknod_path = c(m.join("b/fifo").to_str().unwrap());
    // SAFETY: valid path.
    assert_eq!(
        unsafe { libc::mknod(mknod_path.as_ptr(), libc::S_IFIFO | 0o644, 0) },
        -1
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EROFS)
    );
    let tmp = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags_tmpfile()
        .open(m.join("b"));
    erofs("O_TMPFILE", tmp.map(|_| ()));
    let f = c(m.join("b/f").to_str().unwrap());
    // SAFETY: valid path, name and value.
    let r = unsafe {
        libc::setxattr(
            f.as_ptr(),
            c"user.k".as_ptr(),
            b"v".as_ptr() as *const _,
            1,
            0,
        )
    };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EROFS))
    );
    // SAFETY: valid path and name.
    let r = unsafe { libc::removexattr(f.as_ptr(), c"user.k".as_ptr()) };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EROFS))
    );
    // Reads, stat, readdir, readlink, statfs keep working.
    assert_eq!(fs::read(m.join("b/f")).unwrap(), b"ro-data");
    assert_eq!(listing(&m.join("b")), vec!["f", "sub"]);
    // The host file is unchanged and nothing was created.
    assert_eq!(fs::read(sd.path().join("b/f")).unwrap(), b"ro-data");
    assert_eq!(listing(&sd.path().join("b")), vec!["f", "sub"]);
    assert_eq!(fs::read(sd.path().join("a/f")).unwrap(), b"rw-data");
    // The rw share beside it is fully writable.
    fs::write(m.join("a/new"), b"w").unwrap();
    assert_eq!(fs::read(sd.path().join("a/new")).unwrap(), b"w");
}

trait TmpfileExt {
    fn custom_flags_tmpfile(&mut self) -> &mut Self;
}

impl TmpfileExt for OpenOptions {
    fn custom_flags_tmpfile(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::custom_flags(self, libc::O_TMPFILE)
    }
}

/// Mutations a guest kernel would refuse itself (no writable handle on a ro share),
/// sent straight to the stack: write, fallocate, setattr size and copy_file_range into
/// the share through a read-only handle.
#[test]
fn read_only_share_refuses_writes_through_read_only_handles() {
    let sd = platform_layout();
    let fs = stack(sd.path(), &["a", "b:ro"]);
    let x = ctx();
    let b = lookup(&fs, ROOT, "b").unwrap().inode;
    let f = lookup(&fs, b, "f").unwrap().inode;
    let (fh, _, _) = fs.open(&x, f, libc::O_RDONLY as u32, 0).unwrap();
    let fh = fh.unwrap();
    assert_eq!(err_of(fs.fallocate(&x, f, fh, 0, 0, 4096)), libc::EROFS);
    let a = lookup(&fs, ROOT, "a").unwrap().inode;
    let af = lookup(&fs, a, "f").unwrap().inode;
    let (afh, _, _) = fs.open(&x, af, libc::O_RDONLY as u32, 0).unwrap();
    assert_eq!(
        err_of(fs.copy_file_range(
            &x,
            volfsd::exports::fs::CopyRange {
                nodeid_in: af,
                fh_in: afh.unwrap(),
                off_in: 0,
                nodeid_out: f,
                fh_out: fh,
                off_out: 0,
                len: 7,
                flags: 0,
            },
        )),
        libc::EROFS
    );
    let mut attr = fs.getattr(&x, f, None).unwrap().0;
    attr.st_size = 0;
    assert_eq!(
        err_of(fs.setattr(
            &x,
            f,
            attr,
            Some(fh),
            fuse_backend_rs::abi::fuse_abi::SetattrValid::SIZE
        )),
        libc::EROFS
    );
    assert_eq!(fs::read(sd.path().join("b/f")).unwrap(), b"ro-data");
}

/// The kernel layer on its own: the daemon's guard is bypassed (VolumeFs without
/// ReadOnlyGuard) and the read-only private mount still refuses every write.
#[test]
fn kernel_refuses_writes_to_a_read_only_share_without_the_daemon_check() {
    let sd = platform_layout();
    let root = sd.path().canonicalize().unwrap();
    let specs = volfsd::exports::config::parse_allowed_dirs(&root, &["b:ro".to_string()]).unwrap();
    let stack = vfs::build(&root, Some(&specs), false, cfg()).unwrap();
    let unguarded = stack.fs.inner();
    let x = ctx();
    let b = unguarded.lookup(&x, ROOT, &c("b")).unwrap().inode;
    let f = unguarded.lookup(&x, b, &c("f")).unwrap().inode;
    let erofs = |r: std::io::Result<()>| assert_eq!(err_of(r), libc::EROFS);
    erofs(unguarded.open(&x, f, libc::O_WRONLY as u32, 0).map(|_| ()));
    erofs(
        unguarded
            .open(&x, f, (libc::O_RDONLY | libc::O_TRUNC) as u32, 0)
            .map(|_| ()),
    );
    erofs(unguarded.mkdir(&x, b, &c("d"), 0o755, 0).map(|_| ()));
    erofs(unguarded.unlink(&x, b, &c("f")));
    erofs(unguarded.rename(&x, b, &c("f"), b, &c("g"), 0));
    let args = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: 0o644,
        umask: 0,
        fuse_flags: 0,
    };
    erofs(unguarded.create(&x, b, &c("n"), args).map(|_| ()));
    erofs(unguarded.tmpfile(&x, b, args).map(|_| ()));
    let (fh, _, _) = unguarded.open(&x, f, libc::O_RDONLY as u32, 0).unwrap();
    let mut attr = unguarded.getattr(&x, f, None).unwrap().0;
    attr.st_mode = 0o600;
    erofs(
        unguarded
            .setattr(
                &x,
                f,
                attr,
                None,
                fuse_backend_rs::abi::fuse_abi::SetattrValid::MODE,
            )
            .map(|_| ()),
    );
    let _ = fh;
    assert_eq!(fs::read(root.join("b/f")).unwrap(), b"ro-data");
    assert_eq!(listing(&root.join("b")), vec!["f"]);
}

// ---- across shares ------------------------------------------------------------------

#[test]
fn rename_and_link_between_shares_fail_with_exdev() {
    let sd = platform_layout();
    let m = Mounted::volumes(sd.path(), &["a", "c"]);
    assert_eq!(
        err_of(fs::rename(m.join("a/f"), m.join("c/f"))),
        libc::EXDEV
    );
    assert_eq!(
        err_of(fs::hard_link(m.join("a/f"), m.join("c/l"))),
        libc::EXDEV
    );
    assert!(sd.path().join("a/f").exists());
    assert!(!sd.path().join("c/f").exists());
    // The guest's mv falls back to copy + unlink, which works.
    fs::copy(m.join("a/f"), m.join("c/f")).unwrap();
    fs::remove_file(m.join("a/f")).unwrap();
    assert_eq!(fs::read(sd.path().join("c/f")).unwrap(), b"rw-data");
}

#[test]
fn each_share_root_is_announced_as_a_submount() {
    let sd = platform_layout();
    let fs = stack(sd.path(), &["a", "b:ro"]);
    let a = lookup(&fs, ROOT, "a").unwrap();
    let b = lookup(&fs, ROOT, "b").unwrap();
    assert_ne!(a.attr_flags & ATTR_SUBMOUNT, 0);
    assert_ne!(b.attr_flags & ATTR_SUBMOUNT, 0);
    // Entries inside a share on the same file system are not.
    let f = lookup(&fs, a.inode, "f").unwrap();
    assert_eq!(f.attr_flags & ATTR_SUBMOUNT, 0);
}

#[test]
fn hidden_secret_never_appears_in_any_listing() {
    let sd = platform_layout();
    let m = Mounted::volumes(sd.path(), &["a", "b:ro"]);
    let mut stack = vec![m.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            assert_ne!(e.file_name(), "secret");
            assert_ne!(e.file_name(), "hidden");
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    let mut f = File::create(m.join("a/probe")).unwrap();
    f.write_all(b"p").unwrap();
}

#[test]
fn daemon_wide_readonly_applies_to_volumes_attached_later() {
    let sd = platform_layout();
    let root = sd.path().canonicalize().unwrap();
    let stack = vfs::build(&root, Some(&[]), true, cfg()).unwrap();
    let fs = stack.fs.clone();
    let specs = volfsd::exports::config::parse_allowed_dirs(&root, &["a".to_string()]).unwrap();
    assert!(!specs[0].read_only);
    let share = stack.volumes.attach(&specs[0]).unwrap();
    assert!(share.read_only);
    let a = lookup(&fs, ROOT, "a").unwrap().inode;
    assert_eq!(err_of(fs.mkdir(&ctx(), a, &c("d"), 0o755, 0)), libc::EROFS);
    assert!(!root.join("a/d").exists());
}
