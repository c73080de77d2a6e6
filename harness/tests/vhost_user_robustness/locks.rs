//! POSIX locks between owners: GETLK does not report the caller's own lock, locks
//! conflict between owners, and a waiting SETLKW does not stall its queue.

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd_harness::frontend::fuse::FuseOps;
use volfsd_harness::frontend::FuseClient;

use volfsd_harness::fixtures::guest::create_with;
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{self, assert_errno, Daemon, RDWR, ROOT};

/// GETLK asks "would my lock conflict?": a process's own lock never does. (The lock
/// lives on the owner's own lock file, not on the handle, so the test must be made
/// there.) Another owner's GETLK reports it.
#[test]
fn getlk_does_not_report_the_callers_own_lock() {
    use fuse_backend_rs::abi::fuse_abi::LkOut;
    if fixtures::is_virtiofsd() {
        return; // virtiofsd 1.14 does not serve remote POSIX locks.
    }
    let d = Daemon::start("getlk-own", &[]);
    let mut c = d.client();
    let (node, fh) = create_with(&mut c, ROOT, "f", b"data");
    let (me, other) = (0x11, 0x22);
    c.call(&lock_request(
        Opcode::Setlk,
        node,
        fh,
        me,
        libc::F_WRLCK,
        false,
    ))
    .expect("lock")
    .expect_empty()
    .unwrap();
    let asked = |c: &mut FuseClient, owner| -> u32 {
        let r = c
            .call(&lock_request(
                Opcode::Getlk,
                node,
                fh,
                owner,
                libc::F_WRLCK,
                false,
            ))
            .expect("GETLK");
        r.parse::<LkOut>().expect("LkOut").lk.type_
    };
    assert_eq!(
        asked(&mut c, me),
        libc::F_UNLCK as u32,
        "own lock: no conflict"
    );
    assert_eq!(
        asked(&mut c, other),
        libc::F_WRLCK as u32,
        "another owner sees it"
    );
}

/// POSIX locks between two lock owners, and SETLKW waiting off the queue thread: while
/// owner B waits for owner A's lock, the same queue keeps answering, and A's unlock
/// (sent on that queue, after B's wait) completes B's wait.
#[test]
fn posix_locks_conflict_between_owners_and_setlkw_does_not_stall_the_queue() {
    if fixtures::is_virtiofsd() {
        return; // virtiofsd 1.14 does not serve remote POSIX locks.
    }
    let d = Daemon::start("locks", &[]);
    let mut c = d.client();
    let (node, fh_a) = create_with(&mut c, ROOT, "locked", b"data");
    let fh_b = c.open(node, RDWR).expect("open for owner B").fh;
    let (owner_a, owner_b) = (0xa, 0xb);
    let q = c.request_queue(0).unwrap();
    q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_a,
        owner_a,
        libc::F_WRLCK,
        false,
    ))
    .expect("A locks")
    .expect_empty()
    .expect("A's lock reply");
    // B conflicts, A does not conflict with itself.
    let r = q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_b,
        owner_b,
        libc::F_WRLCK,
        false,
    ));
    assert_errno(r.and_then(|r| r.expect_empty()), libc::EAGAIN);
    q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_a,
        owner_a,
        libc::F_RDLCK,
        false,
    ))
    .expect("A converts its own lock")
    .expect_empty()
    .unwrap();
    // The host sees the guest's lock too (another sandbox would).
    let host = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.host("locked"))
        .unwrap();
    // SAFETY: plain data, zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: fcntl with a valid flock on an open fd.
    let r = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&host),
            libc::F_OFD_SETLK,
            &mut fl,
        )
    };
    assert_eq!(r, -1, "a host writer lock conflicts with the guest's lock");
    // B waits.
    let wait = q
        .submit(&lock_request(
            Opcode::Setlkw,
            node,
            fh_b,
            owner_b,
            libc::F_WRLCK,
            false,
        ))
        .unwrap();
    q.kick().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        q.poll_completions().unwrap().is_empty(),
        "B must still be waiting"
    );
    // The queue still serves other requests meanwhile.
    let attr = q.getattr(node);
    assert!(attr.is_ok(), "GETATTR while a lock waits: {attr:?}");
    // A unlocks; B's wait completes with success.
    q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_a,
        owner_a,
        libc::F_UNLCK,
        false,
    ))
    .expect("A unlocks")
    .expect_empty()
    .unwrap();
    let done = q
        .wait_for(wait, Duration::from_secs(5))
        .expect("B's wait ends");
    done.into_reply()
        .expect("valid reply")
        .expect_empty()
        .expect("B got the lock");
}
