//! Node ids and handles the guest makes up name nothing, whatever the operation and
//! whatever its sizes: each gets the errno of a missing node (ENOENT) or of a handle
//! never given out (EBADF), never an answer for something that is not there.

use fuse_backend_rs::abi::fuse_abi::{FsyncIn, Opcode, SetattrIn};
use volfsd_harness::frontend::fuse::Request;
use volfsd_harness::frontend::{Error, FuseOps};

use volfsd_harness::fixtures::control::Ctl;
use volfsd_harness::fixtures::{assert_errno, is_virtiofsd, Daemon, RDONLY, ROOT};

/// The top bit marks the ids of virtual directories (`registry::VIRTUAL_BIT`).
const VIRTUAL_BIT: u64 = 1 << 63;
/// FUSE_SYNCFS, which fuse-backend-rs's `Opcode` lacks.
const OPCODE_SYNCFS: u32 = 50;

fn fsyncdir(c: &mut impl FuseOps, nodeid: u64, fh: u64) -> Result<(), Error> {
    c.call(&Request::new(Opcode::Fsyncdir, nodeid).arg(&FsyncIn {
        fh,
        fsync_flags: 0,
        padding: 0,
    }))
    .map(|_| ())
}

fn syncfs(c: &mut impl FuseOps, nodeid: u64) -> Result<(), Error> {
    c.send(OPCODE_SYNCFS, nodeid, &[0u8; 8], 0).map(|_| ())
}

#[test]
fn top_bit_ids_that_name_no_virtual_directory_get_enoent_or_ebadf() {
    if is_virtiofsd() {
        eprintln!("skipped: virtual directories are volfsd's (control socket)");
        return;
    }
    let ctl = Ctl::start("forged-vdir", &["--xattr"]);
    ctl.mkdir("data");
    ctl.attach("data", "data");
    let mut c = ctl.client();
    // The virtual root answers all of them (the control that the requests are good).
    c.statfs(ROOT).expect("STATFS of the virtual root");
    c.access(ROOT, libc::R_OK as u32).expect("ACCESS");
    c.listxattr(ROOT, 0).expect("LISTXATTR");
    fsyncdir(&mut c, ROOT, 0).expect("FSYNCDIR");
    syncfs(&mut c, ROOT).expect("SYNCFS");
    c.releasedir(ROOT, 0).expect("RELEASEDIR");

    for id in [VIRTUAL_BIT | 2, VIRTUAL_BIT | 0x1234_5678, u64::MAX] {
        let what = format!("id {id:#x}");
        eprintln!("{what}");
        // The operations the review found answered as an existing directory.
        assert_errno(c.statfs(id), libc::ENOENT);
        assert_errno(c.access(id, libc::R_OK as u32), libc::ENOENT);
        assert_errno(c.listxattr(id, 0), libc::ENOENT);
        assert_errno(c.listxattr(id, 4096), libc::ENOENT);
        assert_errno(syncfs(&mut c, id), libc::ENOENT);
        // No handle was ever given out for it.
        assert_errno(c.releasedir(id, 0), libc::EBADF);
        assert_errno(fsyncdir(&mut c, id, 0), libc::EBADF);
        // Every other operation routed to virtual directories: a missing node, not a
        // refused or empty directory.
        assert_errno(c.getattr(id), libc::ENOENT);
        assert_errno(c.lookup(id, "data"), libc::ENOENT);
        assert_errno(c.opendir(id, 0), libc::ENOENT);
        assert_errno(c.readdir(id, 0, 0, 4096), libc::ENOENT);
        assert_errno(c.open(id, RDONLY), libc::ENOENT);
        assert_errno(c.readlink(id), libc::ENOENT);
        assert_errno(c.access(id, libc::W_OK as u32), libc::ENOENT);
        assert_errno(c.getxattr(id, "user.a", 64), libc::ENOENT);
        assert_errno(c.setxattr(id, "user.a", b"v", 0), libc::ENOENT);
        assert_errno(c.removexattr(id, "user.a"), libc::ENOENT);
        assert_errno(c.setattr(id, &SetattrIn::default()), libc::ENOENT);
        assert_errno(c.mkdir(id, "d", 0o755), libc::ENOENT);
        assert_errno(c.mknod(id, "f", libc::S_IFREG | 0o644, 0), libc::ENOENT);
        assert_errno(c.symlink(id, "l", "data"), libc::ENOENT);
        assert_errno(c.unlink(id, "data"), libc::ENOENT);
        assert_errno(c.rmdir(id, "data"), libc::ENOENT);
        assert_errno(c.rename(id, "data", ROOT, "x"), libc::ENOENT);
        assert_errno(c.rename(ROOT, "data", id, "x"), libc::ENOENT);
        assert_errno(c.link(id, ROOT, "x"), libc::ENOENT);
        assert_errno(c.create(id, "f", RDONLY, 0o644), libc::ENOENT);
    }
    // The volume is still there and served.
    let data = c.lookup(ROOT, "data").expect("lookup of the volume").nodeid;
    c.getattr(data).expect("the daemon still serves");
}

#[test]
fn readdir_of_size_zero_with_a_forged_node_or_handle_is_refused_as_for_any_size() {
    let d = Daemon::start("readdir-size-0", &[]);
    let mut c = d.client();
    std::fs::create_dir(d.host("dir")).unwrap();
    let dir = c.lookup(ROOT, "dir").unwrap().nodeid;
    let fh = c.opendir(dir, 0).unwrap().fh;
    for size in [0, 4096] {
        // A handle never given out, on a real node and on a made-up one.
        assert_errno(c.readdir(ROOT, 0xdead_beef, 0, size), libc::EBADF);
        assert_errno(c.readdir(0xdead_beef, 0xdead_beef, 0, size), libc::EBADF);
        // A real handle named with another node.
        assert_errno(c.readdir(ROOT, fh, 0, size), libc::EBADF);
        assert_errno(c.readdirplus(0xdead_beef, fh, 0, size), libc::EBADF);
    }
    // A real node and handle with size 0: an empty answer, as before.
    assert!(c.readdir(dir, fh, 0, 0).unwrap().is_empty());
    assert!(!c.readdir(dir, fh, 0, 4096).unwrap().is_empty());
    c.releasedir(dir, fh).unwrap();
    // Released: gone, at size 0 too.
    let r = c.readdir(dir, fh, 0, 0);
    assert!(
        matches!(&r, Err(e) if e.errno() == Some(libc::ESTALE) || e.errno() == Some(libc::EBADF)),
        "{r:?}"
    );
}
