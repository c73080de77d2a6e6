//! Log attacks: a guest that makes the daemon write its payloads, or one line per bad
//! request, to the host's log.

use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd::frontend::fuse::{ChainPart, FuseClient, FuseOps, RawChain, Request};
use volfsd::frontend::Error;

use crate::common::{is_virtiofsd, Daemon, ROOT};

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
    }
    assert!(d.is_running());
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
    let mut c = d.client();
    c.set_timeout(Duration::from_secs(2));
    let before = settle(&d);
    let lines_before = d.log().lines().count();
    // Requests shorter than a FUSE header: a warning each, without rate limiting.
    let garbage = RawChain {
        readable: vec![ChainPart::Data(vec![0xff; 7])],
        writable: vec![ChainPart::Space(64)],
    };
    let t0 = Instant::now();
    for _ in 0..500 {
        let queue = c.request_queue(0).unwrap();
        match queue.call_chain(&garbage) {
            Ok(_) => {}
            Err(e) if e.is_timeout() => {}
            Err(e) => panic!("garbage chain: {e}"),
        }
    }
    let flood = t0.elapsed();
    let grown = settle(&d) - before;
    let log = d.log();
    let new: Vec<&str> = log.lines().skip(lines_before).collect();
    eprintln!(
        "500 bad requests in {flood:?}: {} lines, {grown} bytes of log",
        new.len()
    );
    // A burst and about one a second, not 500.
    let allowed = 10 + flood.as_secs() as usize + 2;
    assert!(
        new.len() <= allowed + 1,
        "{} lines:\n{}",
        new.len(),
        new.join("\n")
    );
    assert!(
        grown < 8 * 1024,
        "{grown} bytes of log for 500 bad requests"
    );
    if is_virtiofsd() || new.len() < 10 {
        // virtiofsd has no summary; a daemon that does not warn about these
        // requests at the default level has nothing to suppress.
        return;
    }
    // What was dropped is counted, at the latest by a summary a few seconds later.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = d.log();
        if log.contains("suppressed") {
            let line = log.lines().find(|l| l.contains("suppressed")).unwrap();
            assert!(line.contains("similar messages"), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no 'suppressed' summary:\n{log}");
        std::thread::sleep(Duration::from_millis(200));
    }
    c.getattr(ROOT).expect("daemon still serves");
}
