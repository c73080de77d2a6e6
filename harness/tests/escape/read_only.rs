//! Read-only shares: every mutation refused with EROFS, through any handle, and by
//! the kernel alone without the daemon's check.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::PermissionsExt;

use fuse_backend_rs::abi::fuse_abi::CreateIn;
use fuse_backend_rs::api::filesystem::FileSystem;

use volfsd::exports::fs::{self as vfs, ExtraOps};

use crate::mounted::{self, Mounted};
use crate::{c, cfg, ctx, err_of, listing, lookup, platform_layout, stack, ROOT};

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
