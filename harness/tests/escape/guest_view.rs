//! What the guest sees of the SharedDir: only the allowed dirs and the virtual
//! directories on the path to them, traversable but not writable; no node for a
//! hidden entry.

use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;

use fuse_backend_rs::api::filesystem::FileSystem;

use crate::mounted::Mounted;
use crate::{ctx, err_of, listing, lookup, platform_layout, stack, ROOT};

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
