//! Privileges the daemon's root must not lend the guest: privileged xattr namespaces,
//! ACCESS answered as root, setuid bits kept across a non-owner's write.

use fuse_backend_rs::abi::fuse_abi::{
    AccessIn, Opcode, OpenIn, OpenOut, SetattrIn, SetattrValid, WriteIn, WriteOut,
    FOPEN_IN_KILL_SUIDGID, WRITE_KILL_PRIV,
};
use std::os::unix::fs::PermissionsExt;
use volfsd_harness::frontend::fuse::Request;
use volfsd_harness::frontend::FuseOps;

use volfsd_harness::fixtures::{assert_errno, Daemon, RDWR, ROOT};

const NOBODY: u32 = 65534;

fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn privileged_xattr_namespaces_are_refused() {
    let d = Daemon::start("xattr-ns", &["--xattr"]);
    let mut c = d.client();
    let (e, _) = c.create(ROOT, "f", RDWR, 0o644).expect("create");
    c.setxattr(e.nodeid, "user.ok", b"v", 0)
        .expect("user.* is the guest's");
    for name in ["trusted.overlay.opaque", "security.capability", "trusted.x"] {
        assert_errno(c.setxattr(e.nodeid, name, b"y", 0), libc::EPERM);
        assert_errno(c.removexattr(e.nodeid, name), libc::EPERM);
    }
    // Nothing privileged reached the host file.
    let path = std::ffi::CString::new(d.host("f").to_str().unwrap()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid path and buffer.
    let n = unsafe {
        libc::listxattr(
            path.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    let names = String::from_utf8_lossy(&buf[..n.max(0) as usize]).to_string();
    assert!(
        !names.contains("trusted.") && !names.contains("security.capability"),
        "{names:?}"
    );
    // A privileged attribute set on the host is hidden from the guest.
    let tname = std::ffi::CString::new("trusted.host-only").unwrap();
    // SAFETY: valid path, name and value.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            tname.as_ptr(),
            b"s".as_ptr() as *const _,
            1,
            0,
        )
    };
    if r == 0 {
        assert_errno(c.getxattr(e.nodeid, "trusted.host-only", 64), libc::ENODATA);
        let list = c.listxattr(e.nodeid, 4096).expect("listxattr");
        assert!(!format!("{list:?}").contains("trusted"), "{list:?}");
    }
}

#[test]
fn access_is_answered_as_the_caller_not_as_root() {
    let d = Daemon::start("access", &[]);
    let mut c = d.client();
    std::fs::write(d.host("secret"), b"s").unwrap();
    std::fs::set_permissions(d.host("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let node = c.lookup(ROOT, "secret").unwrap().nodeid;
    c.access(node, libc::R_OK as u32).expect("root may read");
    let mut as_nobody = Request::new(Opcode::Access, node).arg(&AccessIn {
        mask: libc::R_OK as u32,
        padding: 0,
    });
    as_nobody.uid = NOBODY;
    as_nobody.gid = NOBODY;
    assert_errno(
        c.call(&as_nobody).and_then(|r| r.expect_empty()),
        libc::EACCES,
    );
    // X_OK on a file nobody may execute: refused even for root, as on Linux.
    assert_errno(c.access(node, libc::X_OK as u32), libc::EACCES);
}

#[test]
fn write_truncate_and_open_trunc_by_a_non_owner_clear_setuid_and_setgid() {
    let d = Daemon::start("killpriv", &[]);
    let mut c = d.client();
    let out = c.init_out().copied().expect("init reply");
    let granted = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    assert_ne!(
        granted & fuse_backend_rs::abi::fuse_abi::FsOptions::HANDLE_KILLPRIV_V2.bits(),
        0,
        "HANDLE_KILLPRIV_V2 negotiated"
    );
    let (e, open) = c.create(ROOT, "suid", RDWR, 0o644).expect("create");
    let path = d.host("suid");
    // write with WRITE_KILL_PRIV, as the kernel sends it for a caller without CAP_FSETID
    for bits in [0o4777, 0o2777, 0o6755] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(bits)).unwrap();
        let req = Request::new(Opcode::Write, e.nodeid)
            .arg(&WriteIn {
                fh: open.fh,
                offset: 0,
                size: 1,
                fuse_flags: WRITE_KILL_PRIV,
                ..Default::default()
            })
            .bytes(b"x".to_vec())
            .reply_of::<WriteOut>();
        c.call(&req).expect("write");
        let want = bits & !0o4000 & !(if bits & 0o010 != 0 { 0o2000 } else { 0 });
        assert_eq!(
            mode_of(&path),
            want,
            "after a non-owner write of a {bits:o} file"
        );
    }
    // A write by a caller with CAP_FSETID (no flag) keeps the bits.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o4755)).unwrap();
    c.write(e.nodeid, open.fh, 0, b"y").expect("write");
    assert_eq!(mode_of(&path), 0o4755, "a privileged writer keeps setuid");
    // truncate with FATTR_KILL_SUIDGID
    let attr = SetattrIn {
        valid: (SetattrValid::SIZE | SetattrValid::KILL_SUIDGID).bits(),
        size: 0,
        ..Default::default()
    };
    c.setattr(e.nodeid, &attr).expect("truncate");
    assert_eq!(mode_of(&path), 0o755, "truncate by a non-owner");
    // open(O_TRUNC) with FOPEN_IN_KILL_SUIDGID
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o2775)).unwrap();
    let req = Request::new(Opcode::Open, e.nodeid)
        .arg(&OpenIn {
            flags: RDWR | libc::O_TRUNC as u32,
            fuse_flags: FOPEN_IN_KILL_SUIDGID,
        })
        .reply_of::<OpenOut>();
    c.call(&req).expect("open O_TRUNC");
    assert_eq!(mode_of(&path), 0o775, "open(O_TRUNC) by a non-owner");
}
