//! `..` never climbs above a share, and bad names get Linux's errnos.

use std::fs;

use fuse_backend_rs::abi::fuse_abi::CreateIn;
use fuse_backend_rs::api::filesystem::FileSystem;

use crate::{c, ctx, err_of, lookup, platform_layout, stack, ROOT};

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
