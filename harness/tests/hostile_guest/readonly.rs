//! A read-only volume never gets a host fd opened for writing, not even to carry a
//! POSIX lock.

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd_harness::frontend::FuseOps;

use volfsd_harness::fixtures::host::*;
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{self, assert_errno, Daemon, TestDir, RDONLY, RDWR, ROOT};

#[test]
fn read_only_volume_never_opens_a_writable_fd_even_for_locks() {
    let dir = TestDir::new("ro-locks");
    std::fs::create_dir(dir.shared().join("ro")).unwrap();
    std::fs::write(dir.shared().join("ro/f"), b"read-only data").unwrap();
    let args: &[&str] = if fixtures::is_virtiofsd() {
        &["--readonly"]
    } else {
        &["--allowed-dir=ro:ro"]
    };
    let d = Daemon::start_in(dir, args);
    let inodes = inodes_under(&d.host("ro"));
    let mut c = d.client();
    let vol = c.lookup(ROOT, "ro").unwrap().nodeid;
    let node = c.lookup(vol, "f").unwrap().nodeid;
    assert_errno(c.open(node, RDWR), libc::EROFS);
    let fh = c.open(node, RDONLY).expect("open read-only").fh;
    // A read lock is fine on a read-only file; a write lock needs a writable file.
    c.call(&lock_request(
        Opcode::Setlk,
        node,
        fh,
        5,
        libc::F_RDLCK,
        false,
    ))
    .expect("read lock");
    let r = c.call(&lock_request(
        Opcode::Setlk,
        node,
        fh,
        6,
        libc::F_WRLCK,
        false,
    ));
    assert!(r.is_err(), "write lock through a read-only handle: {r:?}");
    c.call(&lock_request(
        Opcode::Setlk,
        node,
        fh,
        7,
        libc::F_WRLCK,
        true,
    ))
    .map(|_| ())
    .unwrap_or(());
    for (fd, flags) in fd_modes_into(d.pid(), &inodes) {
        let writable = flags & libc::O_PATH == 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
        assert!(
            !writable,
            "fd {fd} into the read-only volume has flags {flags:o}"
        );
    }
}
