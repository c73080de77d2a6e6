//! Symlinks planted on the host reach the guest as symlinks, never followed; a
//! directory renamed on the host, or moved out of its share, reaches nothing beyond
//! itself.

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsRawFd;

use fuse_backend_rs::api::filesystem::FileSystem;

use crate::mounted::Mounted;
use crate::{c, ctx, err_of, lookup, platform_layout, stack, ROOT};

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
