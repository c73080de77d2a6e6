//! Log attacks: a guest that makes the daemon write its payloads, or one line per bad
//! request, to the host's log; and floods of the lines a guest, the frontend or a
//! control client can cause, which share one log budget.

use std::io::Write;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::Opcode;
use serde_json::json;
use volfsd::exports::logging::{Budget, BUDGET, BUDGET_REPORT, DEBUG_BUDGET};
use volfsd_harness::frontend::fuse::{FuseClient, FuseOps, InitParams, Request};
use volfsd_harness::frontend::Error;

use volfsd_harness::fixtures::control::{connect, read_resp, request_bytes, Ctl};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{assert_errno, is_virtiofsd, Daemon, ROOT};

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

/// A MKNOD named `name`: fuse-backend-rs's server decodes it (volfsd decodes the
/// frequent requests itself and logs no payload), and logs the name it cannot read.
fn mknod_raw(c: &mut FuseClient, name: Vec<u8>) {
    let args = fuse_backend_rs::abi::fuse_abi::MknodIn {
        mode: libc::S_IFREG | 0o644,
        rdev: 0,
        umask: 0,
        padding: 0,
    };
    let req = Request::new(Opcode::Mknod, ROOT)
        .arg(&args)
        .bytes(name)
        .reply_size(128);
    match c.call(&req) {
        Ok(_) | Err(Error::Errno { .. }) | Err(Error::NoReply { .. }) => {}
        Err(e) if e.is_timeout() => {}
        Err(e) => panic!("MKNOD with a bad name broke the protocol: {e}"),
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
    for name in bad_names()
        .into_iter()
        .flat_map(|n| [(true, n.clone()), (false, n)])
    {
        let before = settle(&d);
        match name {
            (true, name) => lookup_raw(&mut c, name),
            (false, name) => mknod_raw(&mut c, name),
        }
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
    mknod_raw(&mut c, vec![b'a'; MIB]);
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

// ---------------------------------------------------------------------------------
// The log budget: every line a guest (or the frontend, or a control client) can
// cause shares one budget per daemon.
// ---------------------------------------------------------------------------------

/// Lines over the budget that the daemon may write anyway: a line or two at the
/// edges of the measured interval (the clock reads of the test and the daemon differ).
const EDGE_MARGIN: usize = 5;

/// The lines `budget` lets through in `elapsed`: its burst, its rate for that long,
/// one "suppressed" summary per report interval (and one more at each end), and
/// [`EDGE_MARGIN`].
fn budget_bound(budget: Budget, elapsed: Duration) -> usize {
    let rate = (f64::from(budget.per_second) * elapsed.as_secs_f64()).ceil() as usize;
    let summaries = (elapsed.as_secs_f64() / BUDGET_REPORT.as_secs_f64()).ceil() as usize + 2;
    budget.burst as usize + rate + summaries + EDGE_MARGIN
}

/// The N of every "suppressed N log lines" summary of the budget in `lines`.
fn budget_suppressed(lines: &[&str]) -> u64 {
    lines
        .iter()
        .filter_map(|l| l.split_once("suppressed ")?.1.split_once(" log lines over"))
        .map(|(n, _)| n.parse::<u64>().expect("a count"))
        .sum()
}

/// A flood, measured from before it starts until the log is read after it.
struct Flood {
    started: Instant,
    lines_before: usize,
    bytes_before: u64,
}

impl Flood {
    /// Starts measuring `d`'s log once it is quiet.
    fn start(d: &Daemon) -> Flood {
        let bytes_before = settle(d);
        Flood {
            // Before the log is read: the interval holds every line counted.
            started: Instant::now(),
            lines_before: d.log().lines().count(),
            bytes_before,
        }
    }

    /// Waits (up to 10 s) until `caused` lines are accounted for (written lines that
    /// match `written`, plus the budget's suppressed counts), then checks that the
    /// log grew by no more than `budget` allows over the whole interval. Returns the
    /// new lines.
    fn check(self, d: &Daemon, budget: Budget, caused: u64, written: &[&str]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (log, accounted) = loop {
            let log = d.log();
            let new: Vec<&str> = log.lines().skip(self.lines_before).collect();
            let shown = new
                .iter()
                .filter(|l| written.iter().any(|w| l.contains(w)))
                .count() as u64;
            let accounted = shown + budget_suppressed(&new);
            // The last summary comes at most a report interval after the flood.
            if accounted >= caused || Instant::now() > deadline {
                break (log, accounted);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let elapsed = self.started.elapsed();
        let new: Vec<String> = log
            .lines()
            .skip(self.lines_before)
            .map(String::from)
            .collect();
        let grown = log.len() as u64 - self.bytes_before;
        let bound = budget_bound(budget, elapsed);
        eprintln!(
            "{caused} lines caused in {elapsed:?}: {} written ({grown} bytes), bound {bound}",
            new.len()
        );
        assert!(
            new.len() <= bound,
            "{} lines in {elapsed:?}, over the budget's {bound}:\n{}",
            new.len(),
            new[..new.len().min(50)].join("\n")
        );
        // Every line is cut at 512 bytes; its prefix and suffixes are short.
        assert!(
            grown <= bound as u64 * 700,
            "{grown} bytes of log in {} lines",
            new.len()
        );
        assert!(
            new.iter()
                .any(|l| l.contains("suppressed") && l.contains("log lines over the log budget")),
            "no summary of the budget:\n{}",
            new[..new.len().min(50)].join("\n")
        );
        // Nothing escaped the count: each line the flood caused was written or counted.
        assert!(
            accounted >= caused,
            "{accounted} of {caused} lines written or counted as suppressed:\n{}",
            new[..new.len().min(50)].join("\n")
        );
        new
    }
}

#[test]
fn ten_thousand_inits_log_within_the_budget() {
    if is_virtiofsd() {
        eprintln!("skipped: checks volfsd's log budget");
        return;
    }
    let mut d = Daemon::start("log-init-flood", &[]);
    let mut c = d.client();
    let flood = Flood::start(&d);
    // Each INIT after the first starts a new session: two info lines each
    // ("new guest session ...", "FUSE INIT ...") without the budget.
    const INITS: u64 = 10_000;
    for i in 0..INITS {
        c.init_session(&InitParams::default())
            .unwrap_or_else(|e| panic!("INIT {i}: {e}\n{}", d.log()));
    }
    flood.check(&d, BUDGET, 2 * INITS, &["FUSE INIT", "new guest session"]);
    assert!(d.is_running(), "the daemon exited:\n{}", d.log());
    c.getattr(ROOT).expect("the daemon still serves");
    assert_errno(c.lookup(ROOT, "missing"), libc::ENOENT);
}

#[test]
fn ten_thousand_detach_attach_rounds_log_within_the_budget() {
    if is_virtiofsd() {
        eprintln!("skipped: the control socket is volfsd's");
        return;
    }
    let c = Ctl::start("log-attach-flood", &[]);
    c.mkdir("vol");
    c.attach("vol", "vol");
    let mut fc = c.client();
    // One keep-alive connection, as an agent's HTTP client would keep: the rounds
    // are then a few hundred microseconds each, and all 10,000 of the issue take
    // seconds, not minutes.
    let mut s = connect(&c.sock);
    let mut buf = Vec::new();
    let mut call = |method: &str, body: Option<&str>| {
        s.write_all(&request_bytes(method, "/volumes/vol", body, false))
            .expect("sending a request");
        read_resp(&mut s, &mut buf)
    };
    let flood = Flood::start(&c.d);
    // Each round logs "detached vol ..." and "attached vol ..." without the budget.
    const ROUNDS: u64 = 10_000;
    let body = json!({ "path": "vol" }).to_string();
    for round in 0..ROUNDS {
        let r = call("DELETE", None);
        assert_eq!(r.status, 204, "round {round}: {r:?}");
        let r = call("PUT", Some(&body));
        assert_eq!(r.status, 201, "round {round}: {r:?}");
    }
    flood.check(&c.d, BUDGET, 2 * ROUNDS, &["detached vol", "attached vol"]);
    // The control socket and the guest are still served.
    assert_eq!(c.names(), ["vol"]);
    let vol = fc.lookup(ROOT, "vol").expect("lookup of the volume");
    fc.getattr(vol.nodeid).expect("the daemon still serves");
}

#[test]
fn failing_request_flood_at_debug_level_logs_within_the_debug_budget() {
    if is_virtiofsd() {
        eprintln!("skipped: checks volfsd's log budget");
        return;
    }
    let d = Daemon::start("log-debug-flood", &["--log-level=debug"]);
    let mut cfg = d.config();
    cfg.queue_size = 1024;
    let mut c = d.client_with(&cfg);
    c.set_timeout(Duration::from_secs(10));
    let flood = Flood::start(&d);
    // At debug each failed request logs "lookup failed: ..."; the requests are
    // pipelined, hundreds in the ring at once, as fast as the daemon answers.
    const LOOKUPS: u64 = 30_000;
    let q = c.request_queue(0).unwrap();
    let req = Request::new(Opcode::Lookup, ROOT)
        .name("missing")
        .reply_size(256);
    let mut done = 0;
    for _ in 0..LOOKUPS {
        while q.free_descriptors() < 8 {
            done += q.wait_completions(Duration::from_secs(10)).unwrap().len();
        }
        q.submit(&req).unwrap();
        q.kick().unwrap();
    }
    while done < LOOKUPS as usize {
        let got = q.wait_completions(Duration::from_secs(10)).unwrap();
        assert!(!got.is_empty(), "{done} of {LOOKUPS} lookups answered");
        done += got.len();
    }
    let new = flood.check(&d, DEBUG_BUDGET, LOOKUPS, &["lookup failed"]);
    // The debug budget is what limits it: more than the default one lets through.
    assert!(
        new.len() > BUDGET.burst as usize * 2,
        "{} lines: the debug budget is not the larger one",
        new.len()
    );
    assert_errno(c.lookup(ROOT, "missing"), libc::ENOENT);
    c.getattr(ROOT).expect("the daemon still serves");
}
