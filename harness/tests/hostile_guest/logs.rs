//! Log attacks: a guest that makes the daemon write its payloads, or one line per bad
//! request, to the host's log.

use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd_harness::frontend::fuse::{FuseClient, FuseOps, Request};
use volfsd_harness::frontend::Error;

use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, ROOT};

const MIB: usize = 1 << 20;

fn log_size(d: &Daemon) -> u64 {
    std::fs::metadata(d.dir.log_path()).unwrap().len()
}

/// Sends LOOKUP with `name` as the raw name bytes; any answer or none is fine, the
/// daemon just must stay up.
fn lookup_raw(c: &mut FuseClient, name: Vec<u8>) {
    let req = Request::new(Opcode::Lookup, ROOT)
        .bytes(name)
        .reply_size(128);
    match c.call(&req) {
        Ok(_) | Err(Error::Errno { .. }) | Err(Error::NoReply { .. }) => {}
        Err(e) if e.is_timeout() => {}
        Err(e) => panic!("LOOKUP with a bad name broke the protocol: {e}"),
    }
}

/// Bad names of 1 MiB: one without a NUL, one with a NUL inside.
fn bad_names() -> [Vec<u8>; 2] {
    let mut embedded = vec![b'a'; MIB];
    embedded[10] = 0;
    [vec![b'a'; MIB], embedded]
}

/// Waits until the log stops growing (the daemon writes it asynchronously to us).
fn settle(d: &Daemon) -> u64 {
    let mut last = log_size(d);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = log_size(d);
        if now == last {
            return now;
        }
        last = now;
    }
}

#[test]
fn bad_name_of_one_mib_costs_under_1kib_of_log() {
    // The default level (info).
    let mut d = Daemon::start("log-bad-name", &[]);
    let mut c = d.client();
    c.set_timeout(Duration::from_secs(10));
    for name in bad_names() {
        let before = settle(&d);
        lookup_raw(&mut c, name);
        let grown = settle(&d) - before;
        assert!(grown < 1024, "{grown} bytes of log for one bad name");
        if is_virtiofsd() && !d.is_running() {
            // virtiofsd 1.14 logs one short line and ends the session on a bad name.
            eprintln!("virtiofsd exited on the bad name:\n{}", d.log());
            return;
        }
    }
    assert!(d.is_running(), "the daemon exited:\n{}", d.log());
    c.getattr(ROOT).expect("daemon still serves");
}

#[test]
fn guest_payloads_are_logged_only_at_debug_level_and_cut() {
    if is_virtiofsd() {
        eprintln!("skipped: checks volfsd's log guard at --log-level debug");
        return;
    }
    let d = Daemon::start("log-debug-name", &["--log-level=debug"]);
    let mut c = d.client();
    c.set_timeout(Duration::from_secs(10));
    let before = settle(&d);
    lookup_raw(&mut c, vec![b'a'; MIB]);
    let grown = settle(&d) - before;
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("bytes to cstr error"))
        .unwrap_or_else(|| panic!("the bad name is not logged at debug level:\n{log}"));
    assert!(line.contains("DEBUG"), "{line}");
    assert!(line.ends_with("[truncated]"), "{line}");
    assert!(grown < 4096, "{grown} bytes of log at debug level");
}

#[test]
fn guest_triggered_warnings_are_rate_limited() {
    let d = Daemon::start("log-flood", &[]);
    let mut cfg = d.config();
    cfg.queue_size = 1024;
    let mut c = d.client_with(&cfg);
    c.set_timeout(Duration::from_secs(5));
    let before = settle(&d);
    let lines_before = d.log().lines().count();
    let rdwr = libc::O_RDWR as u32;
    let (entry, open_a) = c.create(ROOT, "locked", rdwr, 0o644).expect("create");
    let node = entry.nodeid;
    let fh_b = c.open(node, rdwr).expect("open").fh;
    let q = c.request_queue(0).unwrap();
    // Owner A holds a write lock (virtiofsd answers ENOSYS: nothing waits there).
    let _ = q.call(&lock_request(
        Opcode::Setlk,
        node,
        open_a.fh,
        0xa,
        libc::F_WRLCK,
        false,
    ));
    // The guest floods SETLKW for owner B: past the daemon's cap on lock waits each
    // is refused, with a warning each time, without rate limiting.
    let t0 = Instant::now();
    for _ in 0..400 {
        while q.free_descriptors() < 8 {
            q.wait_completions(Duration::from_secs(5)).unwrap();
        }
        q.submit(&lock_request(
            Opcode::Setlkw,
            node,
            fh_b,
            0xb,
            libc::F_WRLCK,
            false,
        ))
        .unwrap();
        q.kick().unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let _ = q.poll_completions();
    let flood = t0.elapsed();
    let grown = settle(&d) - before;
    let log = d.log();
    let new: Vec<&str> = log.lines().skip(lines_before).collect();
    eprintln!(
        "400 lock waits in {flood:?}: {} lines, {grown} bytes of log",
        new.len()
    );
    // A burst and about one a second, not hundreds.
    let allowed = 10 + flood.as_secs() as usize + 2;
    assert!(
        new.len() <= allowed + 1,
        "{} lines:\n{}",
        new.len(),
        new.join("\n")
    );
    assert!(grown < 8 * 1024, "{grown} bytes of log for 400 lock waits");
    if is_virtiofsd() {
        return;
    }
    assert!(
        new.len() >= 10,
        "the flood no longer makes warnings; pick another:\n{log}"
    );
    // What was dropped is counted, at the latest by a summary a few seconds later.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = d.log();
        if let Some(line) = log.lines().find(|l| l.contains("suppressed")) {
            assert!(line.contains("similar messages"), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no 'suppressed' summary:\n{log}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A unlocks: the waits that were admitted end; the daemon still serves.
    let q = c.request_queue(0).unwrap();
    let _ = q.call(&lock_request(
        Opcode::Setlk,
        node,
        open_a.fh,
        0xa,
        libc::F_UNLCK,
        false,
    ));
    c.getattr(ROOT).expect("daemon still serves");
}
