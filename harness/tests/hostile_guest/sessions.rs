//! A new session starts clean: a second INIT (a rebooted guest on the same
//! connection) or a DESTROY drops every node id, handle, lock and lock file of the
//! session before, and wakes its lock waits.

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{EntryOut, Opcode};
use volfsd_harness::frontend::fuse::{InitParams, Request};
use volfsd_harness::frontend::{FuseClient, FuseOps};

use volfsd_harness::fixtures::host::*;
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{self, assert_errno, Daemon, RDWR, ROOT};

/// The errnos a request on a node id or handle of an ended session may get.
const STALE: [i32; 3] = [libc::ENOENT, libc::ESTALE, libc::EBADF];

#[track_caller]
fn assert_stale<T: std::fmt::Debug>(what: &str, r: volfsd_harness::frontend::Result<T>) {
    match r {
        Err(e) if e.errno().is_some_and(|n| STALE.contains(&n)) => {}
        other => panic!("{what}: expected ENOENT/ESTALE/EBADF, got {other:?}"),
    }
}

/// Creates `name` and takes a POSIX write lock on it as lock owner 1; the host sees
/// the lock. Returns the file's entry.
fn locked_file(d: &Daemon, c: &mut FuseClient, name: &str) -> EntryOut {
    let (e, open) = c.create(ROOT, name, RDWR, 0o644).expect("create");
    c.call(&lock_request(
        Opcode::Setlk,
        e.nodeid,
        open.fh,
        1,
        libc::F_WRLCK,
        false,
    ))
    .expect("lock");
    assert!(host_sees_lock(&d.host(name)));
    e
}

#[test]
fn posix_lock_and_flock_do_not_survive_a_second_init() {
    let d = Daemon::start("lock-reinit", &[]);
    let mut c = d.client();
    let (e, open) = c.create(ROOT, "locked", RDWR, 0o644).expect("create");
    let flock_fh = c.open(e.nodeid, RDWR).expect("second open").fh;
    c.call(&lock_request(
        Opcode::Setlk,
        e.nodeid,
        open.fh,
        7,
        libc::F_WRLCK,
        false,
    ))
    .expect("POSIX lock");
    c.call(&lock_request(
        Opcode::Setlk,
        e.nodeid,
        flock_fh,
        8,
        libc::F_WRLCK,
        true,
    ))
    .expect("flock");
    let path = d.host("locked");
    assert!(
        host_sees_lock(&path),
        "the host sees the guest's POSIX lock"
    );
    assert!(host_sees_flock(&path), "the host sees the guest's flock");
    let fds_before = fd_count(d.pid());

    // The guest "reboots": a new INIT on the same connection.
    c.init_session(&InitParams::default()).expect("second INIT");
    assert!(
        !host_sees_lock(&path),
        "POSIX lock released by the new session"
    );
    assert!(!host_sees_flock(&path), "flock released by the new session");
    assert!(
        fd_count(d.pid()) + 3 <= fds_before,
        "node, handles and lock file closed: {} fds before, {} after",
        fds_before,
        fd_count(d.pid())
    );
    // Old ids and handles fail cleanly; the new session works.
    assert_stale("GETATTR of an old node id", c.getattr(e.nodeid));
    assert_stale("READ on an old handle", c.read(e.nodeid, open.fh, 0, 10));
    let again = c.lookup(ROOT, "locked").expect("lookup in the new session");
    assert_ne!(again.nodeid, e.nodeid, "node ids are never reused");
    let fh = c
        .open(again.nodeid, RDWR)
        .expect("open in the new session")
        .fh;
    c.call(&lock_request(
        Opcode::Setlk,
        again.nodeid,
        fh,
        9,
        libc::F_WRLCK,
        false,
    ))
    .expect("the lock is free for the new session");
}

#[test]
fn destroy_ends_the_session_and_its_locks() {
    let d = Daemon::start("destroy", &[]);
    let mut c = d.client();
    let e = locked_file(&d, &mut c, "f");
    let r = c.call(&Request::new(Opcode::Destroy, ROOT));
    assert!(r.is_ok(), "DESTROY: {r:?}");
    assert!(!host_sees_lock(&d.host("f")), "DESTROY releases the lock");
    // Until the next INIT, requests get EIO.
    assert_errno(c.getattr(ROOT), libc::EIO);
    c.init_session(&InitParams::default())
        .expect("INIT after DESTROY");
    assert_stale("old node id after DESTROY", c.getattr(e.nodeid));
    c.getattr(ROOT).expect("the new session serves");
}

#[test]
fn lock_wait_of_an_ended_session_is_woken_and_gives_back_its_fds() {
    let d = Daemon::start("lockwait-reinit", &[]);
    let mut c = d.client();
    let (e, open) = c.create(ROOT, "contended", RDWR, 0o644).expect("create");
    // Another sandbox (the host here) holds the lock.
    let host = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.host("contended"))
        .unwrap();
    // SAFETY: plain data; zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    // SAFETY: fcntl with a valid flock on an open fd.
    let r = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&host),
            libc::F_OFD_SETLK,
            &mut fl,
        )
    };
    assert_eq!(r, 0);
    let q = c.request_queue(0).unwrap();
    let wait = q
        .submit(&lock_request(
            Opcode::Setlkw,
            e.nodeid,
            open.fh,
            3,
            libc::F_WRLCK,
            false,
        ))
        .unwrap();
    q.kick().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(q.poll_completions().unwrap().is_empty(), "the wait blocks");
    let waiters = || {
        std::fs::read_dir(format!("/proc/{}/task", d.pid()))
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .unwrap_or_default()
                    .trim()
                    == "volfsd-lockwait"
            })
            .count()
    };
    let ours = !fixtures::is_virtiofsd();
    if ours {
        assert_eq!(waiters(), 1, "one lock-wait thread");
    }
    c.init_session(&InitParams::default()).expect("second INIT");
    let done = c
        .request_queue(0)
        .unwrap()
        .wait_for(wait, Duration::from_secs(5))
        .expect("the old session's wait is answered");
    let r = done.into_reply();
    assert!(r.is_err(), "the old wait does not get the lock: {r:?}");
    if ours {
        assert!(
            poll(Duration::from_secs(2), || waiters() == 0),
            "lock-wait thread gone"
        );
    }
    drop(host);
}

#[test]
fn a_vhost_user_device_reset_ends_the_session() {
    let d = Daemon::start("reset-device", &[]);
    let mut c = d.client();
    locked_file(&d, &mut c, "f");
    c.device().reset_device().expect("RESET_DEVICE");
    assert!(
        poll(Duration::from_secs(2), || !host_sees_lock(&d.host("f"))),
        "the device reset releases the guest's lock"
    );
}

/// A rebooted guest's driver sets a queue up again on new rings from index 0: the
/// daemon ends the old session at the new driver's first kick, before any INIT.
#[test]
fn a_queue_restarted_by_a_new_driver_ends_the_session() {
    if fixtures::is_virtiofsd() {
        eprintln!("skipped: virtiofsd keeps no locks to release");
        return;
    }
    let d = Daemon::start("new-driver", &[]);
    let mut c = d.client();
    let e = locked_file(&d, &mut c, "f");
    c.restart_request_queue(0, 256).expect("restart the queue");
    // The new driver's first request, before its INIT: the old session is over.
    assert_errno(c.getattr(e.nodeid), libc::EIO);
    assert!(
        !host_sees_lock(&d.host("f")),
        "the old session's lock is released"
    );
    c.init_session(&InitParams::default())
        .expect("INIT of the new driver");
    assert_stale("the old node id", c.getattr(e.nodeid));
    c.getattr(ROOT).expect("the new session serves");
}
