//! On the same host: locks handed over and held throughout the move, and requests
//! unanswered at the move (a lock wait, throttled requests) answered by the
//! destination.

use std::path::Path;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd_harness::fixtures::host::{host_lock, host_sees_lock};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, TestDir, RDWR, ROOT};
use volfsd_harness::frontend::fuse::FuseOps;

use crate::{decode, destination, hold_things, let_go, resume_on};

/// Tries, every millisecond until stopped, to take a write lock and a flock on
/// `path` as another host process would; returns how often it got either.
fn poll_locks(path: &Path, stop: &std::sync::atomic::AtomicBool) -> usize {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let g = std::fs::File::open(path).unwrap();
    let mut got = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        // SAFETY: flock is plain data; zero is valid.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as i16;
        // SAFETY: fcntl with a valid flock struct on our own fd.
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) } == 0 {
            got += 1;
            fl.l_type = libc::F_UNLCK as i16;
            // SAFETY: as above.
            unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        }
        // SAFETY: flock on our own fd.
        if unsafe { libc::flock(g.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            got += 1;
            // SAFETY: as above.
            unsafe { libc::flock(g.as_raw_fd(), libc::LOCK_UN) };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

#[test]
fn on_the_same_host_the_locks_are_handed_over_and_held_throughout() {
    if is_virtiofsd() {
        return;
    }
    let src = Daemon::start("state-held", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    let held = hold_things(&mut c, &host);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let poller = scope.spawn(|| poll_locks(&host.join("d/f"), &stop));
        std::thread::sleep(Duration::from_millis(50));
        let bytes = c.stop_and_save_state().expect("save");
        assert!(
            decode(&bytes).handoff.is_some(),
            "the source offers its open files"
        );
        let dst = destination(&src, "state-held-dst", &[]);
        let mut g = resume_on(&dst, &bytes).expect("load");
        // The source's daemon goes as its VMM quits.
        drop(c);
        let mut src = src;
        assert!(src.wait_exit(Duration::from_secs(10)).is_some());
        eprintln!("source:\n{}", src.log());
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let got = poller.join().unwrap();
        assert_eq!(
            got,
            0,
            "another process got the guest's lock:\n{}",
            dst.log()
        );
        assert!(
            dst.log().contains("handed over"),
            "the destination took the source's open files:\n{}",
            dst.log()
        );
        // Its own unlock still works on the handed-over files.
        let_go(&mut g, &held, &host);
    });
}

#[test]
fn a_lock_wait_unanswered_at_the_move_is_answered_by_the_destination() {
    if is_virtiofsd() {
        return;
    }
    let src = Daemon::start("state-lockwait", &[]);
    let mut c = src.client();
    std::fs::write(src.host("f"), b"f").unwrap();
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    let fh = c.open(node, RDWR).unwrap().fh;
    let holder = host_lock(&src.host("f"));
    // The guest waits for the lock another process holds (SETLKW gets no answer).
    let wait = lock_request(Opcode::Setlkw, node, fh, 5, libc::F_WRLCK, false);
    let q = c.request_queue(0).unwrap();
    let token = q.submit(&wait).unwrap();
    q.kick().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let dst = destination(&src, "state-lockwait-dst", &[]);
    let state = c
        .migrate_to(&dst.config())
        .unwrap_or_else(|e| panic!("migrate: {e}\n{}\n{}", src.log(), dst.log()));
    assert_eq!(
        decode(&state).parked.len(),
        1,
        "the wait travels unanswered"
    );
    // Let go on the host: the destination's wait gets the lock and answers on the
    // guest's ring.
    drop(holder);
    let done = c
        .request_queue(0)
        .unwrap()
        .wait_for(token, Duration::from_secs(10))
        .expect("the lock wait is answered after the move");
    done.into_reply().expect("granted");
    assert!(host_sees_lock(&src.host("f")), "the guest holds it now");
    // And the guest carries on.
    assert_eq!(c.read(node, fh, 0, 1).unwrap(), b"f");
}

#[test]
fn throttled_requests_unanswered_at_the_move_are_answered_by_the_destination() {
    if is_virtiofsd() {
        return;
    }
    let dir = TestDir::new("state-throttled");
    std::fs::create_dir(dir.shared().join("a")).unwrap();
    std::fs::write(dir.shared().join("a/f"), b"data").unwrap();
    // Two requests a second after a bucket of one: the next ones wait in line.
    let limited = "--allowed-dir=a,ops_size=1,ops_refill_time_ms=60000";
    let src = Daemon::start_in(dir, &["--num-request-queues=1", limited]);
    let mut c = src.client();
    let a = c.lookup(ROOT, "a").unwrap().nodeid;
    let q = c.request_queue(0).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let getattr = volfsd_harness::frontend::fuse::Request::new(Opcode::Getattr, a)
            .arg(&fuse_backend_rs::abi::fuse_abi::GetattrIn::default())
            .reply_size(104);
        tokens.push(q.submit(&getattr).unwrap());
    }
    q.kick().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let dst = destination(
        &src,
        "state-throttled-dst",
        &["--num-request-queues=1", limited],
    );
    let state = c
        .migrate_to(&dst.config())
        .unwrap_or_else(|e| panic!("migrate: {e}\n{}\n{}", src.log(), dst.log()));
    let parked = decode(&state).parked.len();
    assert!(parked >= 2, "{parked} throttled requests travel");
    let q = c.request_queue(0).unwrap();
    for t in tokens {
        let done = q
            .wait_for(t, Duration::from_secs(10))
            .expect("answered after the move");
        done.into_reply().expect("a getattr answered");
    }
}
