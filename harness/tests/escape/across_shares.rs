//! Across shares: rename and link fail with EXDEV, each share root is a submount,
//! the hidden secret is in no listing, a daemon-wide read-only covers volumes
//! attached later.

use std::fs::{self, File};
use std::io::Write;

use fuse_backend_rs::abi::fuse_abi::ATTR_SUBMOUNT;
use fuse_backend_rs::api::filesystem::FileSystem;

use volfsd::exports::fs::{self as vfs};

use crate::mounted::Mounted;
use crate::{c, cfg, ctx, err_of, lookup, platform_layout, stack, ROOT};

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
