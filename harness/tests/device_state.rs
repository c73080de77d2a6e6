//! The device state through the vhost-user socket, as VMMs move it: one daemon saves
//! the guest's session (SET_DEVICE_STATE_FD SAVE after GET_VRING_BASE), a new daemon
//! loads it before its rings are set up, and the guest carries on with the node
//! ids, handles and locks it held, without a new FUSE_INIT. And a state that is not
//! one, or lies, is refused without touching the host.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd::exports::state::format::{self, Location, SessionState};
use volfsd_harness::fixtures::host::{host_lock, host_sees_flock, host_sees_lock};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{assert_errno, is_virtiofsd, Daemon, TestDir, RDONLY, RDWR, ROOT};
use volfsd_harness::frontend::fuse::{FuseClient, FuseOps};

/// A second daemon on the first one's shared directory (a later `--shared-dir` wins).
fn destination(src: &Daemon, test: &str, extra: &[&str]) -> Daemon {
    let shared = format!("--shared-dir={}", src.dir.shared().display());
    let mut args: Vec<&str> = vec![&shared];
    args.extend_from_slice(extra);
    Daemon::start_in(TestDir::new(test), &args)
}

/// Connects to `d` as a migration's destination VMM: loads `state`, then sets up
/// memory and queues; no FUSE_INIT follows (the guest made it at the source).
fn resume_on(d: &Daemon, state: &[u8]) -> volfsd_harness::frontend::Result<FuseClient> {
    let mut cfg = d.config();
    cfg.load_state = Some(state.to_vec());
    FuseClient::connect(&cfg)
}

fn decode(bytes: &[u8]) -> SessionState {
    format::decode(bytes).expect("the daemon writes a state it can read")
}

struct Held {
    dir: u64,
    file: u64,
    fh: u64,
    flock_fh: u64,
    dir_fh: u64,
}

/// The guest's side before the move: a directory, a file open for writing with a
/// POSIX lock, the same file open again with a flock, the directory open.
fn hold_things(c: &mut FuseClient, host: &Path) -> Held {
    std::fs::create_dir_all(host.join("d")).unwrap();
    std::fs::write(host.join("d/f"), b"before the move\n").unwrap();
    for i in 0..5 {
        std::fs::write(host.join(format!("d/e{i}")), b"x").unwrap();
    }
    let dir = c.lookup(ROOT, "d").unwrap().nodeid;
    let file = c.lookup(dir, "f").unwrap().nodeid;
    let fh = c.open(file, RDWR).unwrap().fh;
    c.call(&lock_request(
        Opcode::Setlk,
        file,
        fh,
        7,
        libc::F_WRLCK,
        false,
    ))
    .expect("POSIX lock");
    let flock_fh = c.open(file, RDONLY).unwrap().fh;
    c.call(&lock_request(
        Opcode::Setlk,
        file,
        flock_fh,
        8,
        libc::F_RDLCK,
        true,
    ))
    .expect("flock");
    let dir_fh = c.opendir(dir, 0).unwrap().fh;
    // Half a listing: the stream has a position.
    let first = c.readdir(dir, dir_fh, 0, 200).unwrap();
    assert!(!first.is_empty());
    Held {
        dir,
        file,
        fh,
        flock_fh,
        dir_fh,
    }
}

/// The guest lets go of the POSIX lock and the flock `hold_things` took, and the
/// host sees both free.
fn let_go(g: &mut FuseClient, held: &Held, host: &Path) {
    g.call(&lock_request(
        Opcode::Setlk,
        held.file,
        held.fh,
        7,
        libc::F_UNLCK,
        false,
    ))
    .unwrap();
    g.call(&lock_request(
        Opcode::Setlk,
        held.file,
        held.flock_fh,
        8,
        libc::F_UNLCK,
        true,
    ))
    .unwrap();
    assert!(!host_sees_lock(&host.join("d/f")));
    assert!(!host_sees_flock(&host.join("d/f")));
}

#[test]
fn a_saved_session_carries_on_in_a_new_daemon_with_its_ids_handles_and_locks() {
    if is_virtiofsd() {
        return; // virtiofsd has no POSIX locks to carry (ENOSYS)
    }
    let src = Daemon::start("state-src", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    let held = hold_things(&mut c, &host);
    c.write(held.file, held.fh, 0, b"written at the source\n")
        .unwrap();
    let bytes = c.stop_and_save_state().expect("save");
    let state = decode(&bytes);
    assert!(state.fuse.is_some(), "the INIT is in the state");
    assert!(state
        .nodes
        .iter()
        .any(|n| n.id == held.file && n.lookups >= 1));
    assert!(state
        .nodes
        .iter()
        .any(|n| n.id == held.file && matches!(&n.location, Location::Child { parent, name } if *parent == held.dir && name == b"f")));
    assert_eq!(state.handles.len(), 3, "{:?}", state.handles);
    assert_eq!(
        state.locks.len(),
        2,
        "a POSIX lock and a flock: {:?}",
        state.locks
    );
    assert!(state
        .handles
        .iter()
        .any(|h| h.id == held.dir_fh && h.dir_offset.is_some_and(|o| o > 0)));

    let dst = destination(&src, "state-dst", &[]);
    let mut g = resume_on(&dst, &bytes).expect("the destination loads the state");
    // The source goes away as after a migration (its daemon exits with its
    // frontend): the locks stay held, by the destination (which took them again, or
    // was handed them).
    drop(c);
    let mut src = src;
    assert!(
        src.wait_exit(Duration::from_secs(10)).is_some(),
        "the source exits"
    );
    assert!(
        host_sees_lock(&host.join("d/f")),
        "POSIX lock held after the move"
    );
    assert!(
        host_sees_flock(&host.join("d/f")),
        "flock held after the move"
    );
    // The same ids and handles, no INIT.
    assert_eq!(
        c_getattr_ino(&mut g, held.file),
        std::fs::metadata(host.join("d/f")).unwrap().ino()
    );
    let data = g
        .read(held.file, held.fh, 0, 100)
        .expect("read through the old handle");
    assert_eq!(data, b"written at the source\n");
    g.write(held.file, held.fh, 0, b"WRITTEN")
        .expect("write through it");
    assert!(std::fs::read(host.join("d/f"))
        .unwrap()
        .starts_with(b"WRITTEN"));
    assert_eq!(
        g.lookup(held.dir, "f").unwrap().nodeid,
        held.file,
        "same node id"
    );
    let rest = g
        .readdir(held.dir, held.dir_fh, 0, 4096)
        .expect("the open directory");
    assert!(rest.len() >= 7, "{} entries", rest.len());
    // New ids continue above the guest's.
    std::fs::write(host.join("d/new"), b"n").unwrap();
    let new = g.lookup(held.dir, "new").unwrap().nodeid;
    assert!(new >= state.next_node_id, "{new} vs {}", state.next_node_id);
    // The guest lets go of its locks as usual.
    let_go(&mut g, &held, &host);
}

fn c_getattr_ino(c: &mut FuseClient, node: u64) -> u64 {
    c.getattr(node).expect("getattr of a carried node").attr.ino
}

#[test]
fn a_save_changes_nothing_at_the_source_which_serves_on_after_a_failed_migration() {
    let src = Daemon::start("state-nondestructive", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    let held = hold_things(&mut c, &host);
    let first = c.save_state_paused().unwrap();
    let again = c.save_state_paused().unwrap();
    // Each save offers the open files under a new token; the rest is the same.
    let without_offer = |b: &[u8]| SessionState {
        handoff: None,
        ..decode(b)
    };
    assert_eq!(
        without_offer(&first),
        without_offer(&again),
        "a save is repeatable"
    );
    // The migration failed and the VMM resumed the source: it serves on.
    assert_eq!(c.read(held.file, held.fh, 0, 6).unwrap(), b"before");
    assert!(host_sees_lock(&host.join("d/f")));
    assert!(host_sees_flock(&host.join("d/f")));
    // What the saves offered a destination on this host is withdrawn: when the
    // guest closes the file (FLUSH with its lock owner, RELEASE of both handles),
    // the host sees its locks go (found by the VM checkpoint suite).
    c.flush(held.file, held.fh, 7).unwrap();
    c.release(held.file, held.fh, libc::O_RDWR as u32).unwrap();
    c.release(held.file, held.flock_fh, libc::O_RDONLY as u32)
        .unwrap();
    assert!(
        !host_sees_lock(&host.join("d/f")) && !host_sees_flock(&host.join("d/f")),
        "the guest's locks are gone on the host:\n{}",
        src.log()
    );
}

#[test]
fn a_file_deleted_before_the_load_is_estale_with_guest_error_and_fails_the_load_with_abort() {
    let src = Daemon::start("state-deleted", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    std::fs::write(host.join("keep"), b"keep").unwrap();
    std::fs::write(host.join("gone"), b"gone").unwrap();
    let keep = c.lookup(ROOT, "keep").unwrap().nodeid;
    let keep_fh = c.open(keep, RDONLY).unwrap().fh;
    let gone = c.lookup(ROOT, "gone").unwrap().nodeid;
    let gone_fh = c.open(gone, RDONLY).unwrap().fh;
    let bytes = c.stop_and_save_state().unwrap();
    // The VM and its daemon are gone (the daemon exits with its frontend).
    drop(c);
    std::fs::remove_file(host.join("gone")).unwrap();
    let abort = destination(&src, "state-deleted-abort", &[]);
    let e = resume_on(&abort, &bytes)
        .err()
        .expect("abort: the load fails");
    assert!(format!("{e}").contains("CHECK_DEVICE_STATE"), "{e}");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        abort.log().contains("\"gone\""),
        "the log names the file:\n{}",
        abort.log()
    );
    let lenient = destination(
        &src,
        "state-deleted-lenient",
        &["--migration-on-error=guest-error"],
    );
    let mut g = resume_on(&lenient, &bytes).expect("guest-error: the load succeeds");
    assert_eq!(g.read(keep, keep_fh, 0, 10).unwrap(), b"keep");
    assert_errno(g.getattr(gone), libc::ESTALE);
    assert_errno(g.read(gone, gone_fh, 0, 10), libc::ESTALE);
}

/// A valid state of one file held, saved by a real daemon, to forge others from.
fn sample_state(test: &str) -> (Daemon, Vec<u8>) {
    let src = Daemon::start(test, &[]);
    let mut c = src.client();
    std::fs::create_dir(src.host("d")).unwrap();
    std::fs::write(src.host("d/f"), b"f").unwrap();
    let d = c.lookup(ROOT, "d").unwrap().nodeid;
    let f = c.lookup(d, "f").unwrap().nodeid;
    c.open(f, RDONLY).unwrap();
    let bytes = c.stop_and_save_state().unwrap();
    drop(c);
    (src, bytes)
}

#[test]
fn forged_states_are_refused_naming_why_and_open_nothing() {
    if is_virtiofsd() {
        return;
    }
    let (src, bytes) = sample_state("state-forged");
    std::fs::write(src.dir.root.join("outside"), b"secret").unwrap();
    let valid = decode(&bytes);
    let file = valid
        .nodes
        .iter()
        .find(|n| n.file_type == libc::S_IFREG)
        .unwrap()
        .id;
    let with = |f: &dyn Fn(&mut SessionState)| {
        let mut s = valid.clone();
        f(&mut s);
        format::encode(&s)
    };
    let set_location = |l: Location| {
        move |s: &mut SessionState| {
            let n = s.nodes.iter_mut().find(|n| n.id == file).unwrap();
            n.location = l.clone();
        }
    };
    let mut cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "not a state",
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            &["not a volfsd device state"],
        ),
        (
            "truncated",
            bytes[..bytes.len() - 5].to_vec(),
            &["truncated"],
        ),
        (
            "another version",
            {
                let mut b = bytes.clone();
                b[8] = 99;
                b
            },
            &["format version 99"],
        ),
        (
            "a path with ..",
            with(&set_location(Location::Path(b"../outside".to_vec()))),
            &["the name \"..\""],
        ),
        (
            "an absolute path",
            with(&set_location(Location::Path(b"/etc/passwd".to_vec()))),
            &["absolute path"],
        ),
        (
            "a name with a slash",
            with(&set_location(Location::Child {
                parent: 1,
                name: b"d/f".to_vec(),
            })),
            &["has a '/'"],
        ),
        (
            "a parent that is no node",
            with(&set_location(Location::Child {
                parent: 999_999,
                name: b"f".to_vec(),
            })),
            &["no node before it"],
        ),
        (
            "an id past the counter",
            with(&|s: &mut SessionState| {
                let n = s.nodes.iter_mut().find(|n| n.id == file).unwrap();
                n.id = s.next_node_id + 5;
            }),
            &["out of range"],
        ),
        (
            "a volume not attached here",
            with(&|s: &mut SessionState| {
                s.volumes[0].name = "elsewhere".into();
            }),
            &["--allowed-dir"],
        ),
        (
            "another cache mode",
            with(&|s: &mut SessionState| s.config.cache = "always".into()),
            &["--cache"],
        ),
        (
            "a handle of no node",
            with(&|s: &mut SessionState| s.handles[0].node = 424_242),
            &["names no node"],
        ),
    ];
    // A file handle leading outside the volume (the test dir's own file).
    let outside = std::fs::File::open(src.dir.root.join("outside")).unwrap();
    if let Ok((t, h)) = raw_handle(&outside) {
        cases.push((
            "a file handle outside the volume",
            with(&|s: &mut SessionState| {
                let n = s.nodes.iter_mut().find(|n| n.id == file).unwrap();
                n.location = Location::Unknown;
                n.file_handle = Some(format::FileHandle {
                    handle_type: t,
                    bytes: h.clone(),
                });
            }),
            &["outside the volume", "open_by_handle_at"],
        ));
    }
    for (what, forged, why) in cases {
        let dst = destination(&src, "state-forged-dst", &[]);
        let outcome = resume_on(&dst, &forged);
        assert!(outcome.is_err(), "{what}: loaded");
        std::thread::sleep(Duration::from_millis(50));
        let log = dst.log();
        assert!(
            why.iter().any(|w| log.contains(w)),
            "{what}: the log does not say {why:?}:\n{log}"
        );
        // Nothing of the host was opened for it: no fd to the outside file.
        let fds = std::fs::read_dir(format!("/proc/{}/fd", dst.pid()))
            .map(|d| {
                d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter(|p| p.ends_with("outside") || p.ends_with("passwd"))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(fds, 0, "{what}: an fd outside the volume");
    }
}

/// name_to_handle_at of an open file.
fn raw_handle(f: &std::fs::File) -> std::io::Result<(i32, Vec<u8>)> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct H {
        bytes: u32,
        kind: i32,
        f: [u8; 128],
    }
    let mut h = H {
        bytes: 128,
        kind: 0,
        f: [0; 128],
    };
    let mut mnt = 0i32;
    // SAFETY: a valid file_handle buffer of 128 bytes; the empty path names the fd.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            f.as_raw_fd(),
            c"".as_ptr(),
            &mut h as *mut H,
            &mut mnt as *mut i32,
            libc::AT_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((h.kind, h.f[..h.bytes as usize].to_vec()))
}

#[test]
fn a_state_without_the_volumes_it_names_is_refused_naming_the_volume() {
    let dir = TestDir::new("state-vols");
    std::fs::create_dir(dir.shared().join("data")).unwrap();
    std::fs::create_dir(dir.shared().join("models")).unwrap();
    let src = Daemon::start_in(dir, &["--allowed-dir=data", "--allowed-dir=models:ro"]);
    let mut c = src.client();
    let data = c.lookup(ROOT, "data").unwrap().nodeid;
    std::fs::write(src.host("data/x"), b"x").unwrap();
    c.lookup(data, "x").unwrap();
    let bytes = c.stop_and_save_state().unwrap();
    let dst = destination(&src, "state-vols-dst", &["--allowed-dir=data"]);
    assert!(resume_on(&dst, &bytes).is_err());
    std::thread::sleep(Duration::from_millis(50));
    assert!(dst.log().contains("\"models\""), "{}", dst.log());
    // Read-only at the source, read-write here: refused too.
    let dst = destination(
        &src,
        "state-vols-dst2",
        &["--allowed-dir=data", "--allowed-dir=models"],
    );
    assert!(resume_on(&dst, &bytes).is_err());
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        dst.log().contains("read-only at the source"),
        "{}",
        dst.log()
    );
    // With both, as they were: the guest carries on with its ids.
    let dst = destination(
        &src,
        "state-vols-dst3",
        &["--allowed-dir=models:ro", "--allowed-dir=data"],
    );
    let mut g = resume_on(&dst, &bytes).expect("loads");
    assert_eq!(
        g.lookup(ROOT, "data").unwrap().nodeid,
        data,
        "the volume root's id"
    );
    assert!(g.lookup(data, "x").is_ok());
}

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
