//! `--upgradable`: a serving process killed under a frontend's session is taken over
//! by a new one, on the same rings, with the guest's session (src/region/,
//! src/fs/journal/, src/device/inflight.rs): the frontend sees no disconnect, the
//! guest's node ids and open handles answer on, and the requests the dead process
//! had taken and not answered are run again when idempotent, else answered EIO.

use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{CreateIn, GetattrIn, Opcode};
use serde_json::{json, Value};
use volfsd_harness::fixtures::control::Ctl;
use volfsd_harness::fixtures::host::host_lock;
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, RDWR, ROOT};
use volfsd_harness::frontend::fuse::{FuseQueue, Request};
use volfsd_harness::frontend::FuseOps;

fn getattr(nodeid: u64) -> Request {
    Request::new(Opcode::Getattr, nodeid)
        .arg(&GetattrIn::default())
        .reply_size(104)
}

fn create(parent: u64, name: &str) -> Request {
    Request::new(Opcode::Create, parent)
        .arg(&CreateIn {
            flags: RDWR,
            mode: 0o644,
            umask: 0,
            fuse_flags: 0,
        })
        .name(name)
        .reply_size(256)
}

/// Kills the serving process below the keeper; returns its pid.
fn kill_serving(d: &Daemon) -> i32 {
    // Just after an upgrade the keeper may be between its old serving process's exit
    // and the new one's appearing in /proc under it: wait for one.
    let mut pid = d.pid();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pid == d.launched_pid() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        pid = d.pid();
    }
    assert_ne!(pid, d.launched_pid(), "no serving process below the keeper");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    pid
}

/// Waits until the log has `line` `n` times.
fn wait_log(d: &Daemon, line: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.log().matches(line).count() < n {
        assert!(
            Instant::now() < deadline,
            "no {line:?} after 30 s:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One sample of `/metrics`.
fn metric(c: &Ctl, name: &str) -> Option<f64> {
    let r = c.req("GET", "/metrics", None);
    assert_eq!(r.status, 200);
    r.body.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

/// The completion of `token`, as Ok(used length) or Err(errno).
fn outcome(q: &mut FuseQueue, token: u64, timeout: Duration) -> Result<u32, i32> {
    let c = q.wait_for(token, timeout).expect("a completion");
    let used = c.used_len;
    match c.into_reply() {
        Ok(_) => Ok(used),
        Err(volfsd_harness::frontend::Error::Errno { errno, .. }) => Err(errno),
        Err(e) => panic!("bad reply: {e}"),
    }
}

#[test]
fn a_serving_process_killed_under_the_guests_session_is_taken_over_on_the_same_rings() {
    if is_virtiofsd() {
        return;
    }
    let c = Ctl::start(
        "crash-session",
        &["--upgradable", "--num-request-queues", "1"],
    );
    c.mkdir("a");
    c.mkdir("b");
    std::fs::write(c.shared().join("b/locked"), b"x").unwrap();
    // a: one request, then one a minute: what it is sent waits in its line.
    c.put(
        "a",
        &json!({ "path": "a", "rate_limiter": { "ops": { "size": 1, "refill_time_ms": 60_000 } } }),
    )
    .expect(201);
    c.attach("b", "b");
    let mut fc = c.client();
    let a = fc.lookup(ROOT, "a").unwrap().nodeid;
    let b = fc.lookup(ROOT, "b").unwrap().nodeid;
    let sub = fc.mkdir(b, "sub", 0o755).unwrap().nodeid;
    let (f, open) = fc.create(sub, "f", RDWR, 0o644).unwrap();
    fc.write(f.nodeid, open.fh, 0, b"before the crash").unwrap();
    let locked = fc.lookup(b, "locked").unwrap().nodeid;
    let lopen = fc.open(locked, RDWR).unwrap();
    // a's one token goes to a lookup; then a GETATTR and a CREATE wait in a's line.
    let _ = fc.lookup(a, "nothing");
    let held = host_lock(&c.shared().join("b/locked"));
    let q = fc.request_queue(0).unwrap();
    let waiting_getattr = q.submit(&getattr(a)).unwrap();
    let waiting_create = q.submit(&create(a, "new")).unwrap();
    // A lock wait blocked by another sandbox's lock: on a thread of its own.
    let wait = q
        .submit(&lock_request(
            Opcode::Setlkw,
            locked,
            lopen.fh,
            7,
            libc::F_WRLCK,
            false,
        ))
        .unwrap();
    q.kick().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.volume("a")["qos"]["waiting_requests"] != 2 {
        assert!(Instant::now() < deadline, "{}", c.volume("a"));
        std::thread::sleep(Duration::from_millis(10));
    }

    let old = kill_serving(&c.d);
    wait_log(&c.d, "took over its rings and the guest's session", 1);
    assert_ne!(c.d.pid(), old);
    // The old node ids and handle answer, in the new process.
    let got = fc
        .read(f.nodeid, open.fh, 0, 64)
        .expect("read after the crash");
    assert_eq!(got, b"before the crash");
    fc.write(f.nodeid, open.fh, 16, b", and after").unwrap();
    assert_eq!(
        std::fs::read(c.shared().join("b/sub/f")).unwrap(),
        b"before the crash, and after"
    );
    fc.getattr(sub).expect("getattr of a directory held");
    assert_eq!(
        fc.lookup(sub, "f").unwrap().nodeid,
        f.nodeid,
        "the same node id"
    );
    let (g, _) = fc.create(sub, "g", RDWR, 0o644).expect("a new file");
    assert!(g.nodeid > f.nodeid, "new ids above the old ones");
    // The requests the dead process had taken: the lock wait waits on, and is
    // granted once the other sandbox lets go.
    drop(held);
    let q = fc.request_queue(0).unwrap();
    assert_eq!(outcome(q, wait, Duration::from_secs(10)), Ok(16));
    // The limit stays with the volume; lifted, a's line is served: the GETATTR ran
    // again, the CREATE (it may have been applied) is answered EIO.
    c.req(
        "PATCH",
        "/volumes/a",
        Some(&json!({ "rate_limiter": Value::Null }).to_string()),
    )
    .expect(200);
    let q = fc.request_queue(0).unwrap();
    assert!(outcome(q, waiting_getattr, Duration::from_secs(10)).is_ok());
    assert_eq!(
        outcome(q, waiting_create, Duration::from_secs(10)),
        Err(libc::EIO)
    );
    assert!(!c.shared().join("a/new").exists(), "never applied");
    // Counted, and the pause is there.
    assert_eq!(metric(&c, "volfsd_keeper_recoveries_total"), Some(1.0));
    assert_eq!(metric(&c, "volfsd_keeper_crashes_total"), Some(1.0));
    assert_eq!(metric(&c, "volfsd_keeper_requests_rerun_total"), Some(2.0));
    assert_eq!(metric(&c, "volfsd_keeper_requests_failed_total"), Some(1.0));
    let pause = metric(&c, "volfsd_keeper_pause_last_seconds{kind=\"recovery\"}").unwrap();
    assert!(pause > 0.0 && pause < 1.0, "the guest waited {pause} s");
    fc.disconnect();
}

/// A daemon with a volume `data` from the command line and a control socket.
fn start(test: &str, extra: &[&str]) -> Ctl {
    let dir = volfsd_harness::fixtures::TestDir::new(test);
    std::fs::create_dir(dir.shared().join("data")).unwrap();
    let mut args = vec!["--upgradable", "--allowed-dir=data"];
    args.extend_from_slice(extra);
    Ctl::start_with(
        dir,
        volfsd_harness::fixtures::mounts::MountGuard::default(),
        &[],
        &args,
    )
}

#[test]
fn crashes_and_upgrades_in_turn_keep_the_same_session() {
    if is_virtiofsd() {
        return;
    }
    let c = start("crash-upgrade", &[]);
    let mut fc = c.client();
    let data = fc.lookup(ROOT, "data").unwrap().nodeid;
    let dir = fc.mkdir(data, "dir", 0o755).unwrap().nodeid;
    let (f, open) = fc.create(dir, "f", RDWR, 0o644).unwrap();
    fc.write(f.nodeid, open.fh, 0, b"0").unwrap();
    // Renamed after it was recorded: found again by its file handle.
    fc.rename(dir, "f", dir, "renamed").unwrap();
    let mut written = b"0".to_vec();
    for round in 1..=4u8 {
        if round % 2 == 1 {
            kill_serving(&c.d);
            wait_log(&c.d, "took over its rings", usize::from(round).div_ceil(2));
        } else {
            let keeper = nix::unistd::Pid::from_raw(c.d.launched_pid());
            nix::sys::signal::kill(keeper, nix::sys::signal::Signal::SIGHUP).unwrap();
            wait_log(&c.d, "keeper: upgraded", usize::from(round / 2));
        }
        let at = written.len() as u64;
        fc.write(f.nodeid, open.fh, at, &[b'0' + round])
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", c.d.log()));
        written.push(b'0' + round);
        assert_eq!(fc.read(f.nodeid, open.fh, 0, 64).unwrap(), written);
        assert_eq!(fc.lookup(dir, "renamed").unwrap().nodeid, f.nodeid);
        fc.getattr(dir).unwrap();
    }
    assert_eq!(
        std::fs::read(c.shared().join("data/dir/renamed")).unwrap(),
        written
    );
    assert_eq!(metric(&c, "volfsd_keeper_recoveries_total"), Some(2.0));
    assert_eq!(metric(&c, "volfsd_keeper_upgrades_total"), Some(2.0));
    let log = c.d.log();
    assert_eq!(
        log.matches("lost 0 nodes and 0 handles (ESTALE)").count(),
        2,
        "nothing lost in either recovery:\n{log}"
    );
    fc.disconnect();
}

#[test]
fn a_crash_loop_under_the_guests_session_ends_the_daemon_and_says_so() {
    if is_virtiofsd() {
        return;
    }
    let mut c = start("crash-loop-session", &[]);
    let mut fc = c.client();
    fc.lookup(ROOT, "data").unwrap();
    for n in 1..=2 {
        kill_serving(&c.d);
        wait_log(&c.d, "took over its rings", n);
    }
    kill_serving(&c.d);
    let status = c.d.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| !s.success()), "{}", c.d.log());
    assert!(
        c.d.log()
            .contains("3 crashes in a row, each within 1 s of its start: a crash loop: ending"),
        "{}",
        c.d.log()
    );
    assert!(!c.d.dir.socket().exists(), "{}", c.d.log());
    drop(fc);
}

#[test]
fn crashes_of_processes_that_served_a_while_are_no_loop() {
    if is_virtiofsd() {
        return;
    }
    let c = start("crash-spread", &[]);
    let mut fc = c.client();
    let data = fc.lookup(ROOT, "data").unwrap().nodeid;
    for n in 1..=5 {
        std::thread::sleep(Duration::from_millis(1200));
        kill_serving(&c.d);
        wait_log(&c.d, "took over its rings", n);
        fc.getattr(data)
            .unwrap_or_else(|e| panic!("after crash {n}: {e}\n{}", c.d.log()));
    }
    wait_log(&c.d, "crash 5, 1 in a row)", 1);
    fc.disconnect();
}

#[test]
fn a_daemon_restarted_whole_takes_the_session_back_from_the_frontends_inflight_region() {
    if is_virtiofsd() {
        return;
    }
    // cloud-hypervisor's route: the frontend keeps the inflight region the keeper
    // gave it (GET_INFLIGHT_FD), and hands it to the backend the launcher starts
    // after the whole daemon died (SET_INFLIGHT_FD on its reconnect).
    let mut c = start("restart-whole", &["--num-request-queues", "1"]);
    c.mkdir("slow");
    c.put(
        "slow",
        &json!({ "path": "slow", "rate_limiter": { "ops": { "size": 1, "refill_time_ms": 60_000 } } }),
    )
    .expect(201);
    let mut cfg = c.d.config();
    cfg.inflight = true;
    let mut fc = c.d.client_with(&cfg);
    let data = fc.lookup(ROOT, "data").unwrap().nodeid;
    let dir = fc.mkdir(data, "dir", 0o755).unwrap().nodeid;
    let (f, open) = fc.create(dir, "f", RDWR, 0o644).unwrap();
    fc.write(f.nodeid, open.fh, 0, b"before the restart")
        .unwrap();
    // slow's one token goes to this lookup; the GETATTR then waits in its line.
    let slow = fc.lookup(ROOT, "slow").unwrap().nodeid;
    let _ = fc.lookup(slow, "nothing");
    let q = fc.request_queue(0).unwrap();
    let waiting = q.submit(&getattr(slow)).unwrap();
    q.kick().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.volume("slow")["qos"]["waiting_requests"] != 1 {
        assert!(Instant::now() < deadline, "{}", c.volume("slow"));
        std::thread::sleep(Duration::from_millis(10));
    }

    assert!(
        c.d.log().contains("asked for an inflight region"),
        "{}",
        c.d.log()
    );
    let keeper = c.d.launched_pid();
    c.d.restart();
    assert_ne!(c.d.launched_pid(), keeper);
    // The restarted daemon serves its command line's volumes; the node agent attaches
    // the runtime one again, as after any restart of the daemon, before the frontend
    // hands the region back (the region's own list attaches nothing: it is untrusted).
    c.put(
        "slow",
        &json!({ "path": "slow", "rate_limiter": { "ops": { "size": 1, "refill_time_ms": 60_000 } } }),
    )
    .expect(201);
    fc.reconnect(&cfg)
        .unwrap_or_else(|e| panic!("reconnect: {e}\n{}", c.d.log()));
    wait_log(&c.d, "took over the guest's session from it", 1);
    // The old node ids and handle answer in the new daemon.
    let got = fc
        .read(f.nodeid, open.fh, 0, 64)
        .unwrap_or_else(|e| panic!("read after the restart: {e}\n{}", c.d.log()));
    assert_eq!(got, b"before the restart");
    fc.write(f.nodeid, open.fh, 18, b", and after").unwrap();
    assert_eq!(
        std::fs::read(c.shared().join("data/dir/f")).unwrap(),
        b"before the restart, and after"
    );
    assert_eq!(
        fc.lookup(dir, "f").unwrap().nodeid,
        f.nodeid,
        "the same node id"
    );
    // The runtime volume is the guest's again with its session; its limit lifted,
    // the GETATTR the dead daemon had taken is run again.
    c.req(
        "PATCH",
        "/volumes/slow",
        Some(&json!({ "rate_limiter": Value::Null }).to_string()),
    )
    .expect(200);
    let q = fc.request_queue(0).unwrap();
    assert!(outcome(q, waiting, Duration::from_secs(10)).is_ok());
    assert_eq!(metric(&c, "volfsd_keeper_recoveries_total"), Some(1.0));
    fc.disconnect();
}

#[test]
fn a_restarted_daemon_given_no_region_starts_a_fresh_session() {
    if is_virtiofsd() {
        return;
    }
    // A frontend that does not keep the region (QEMU): a restarted daemon is a new
    // device that serves a new connection from the root, and says nothing was
    // taken over.
    let mut c = start("restart-fresh", &[]);
    let cfg = c.d.config();
    let mut fc = c.d.client_with(&cfg);
    fc.lookup(ROOT, "data").unwrap();
    c.d.restart();
    let mut fresh = c.d.client_with(&cfg);
    let data = fresh.lookup(ROOT, "data").unwrap().nodeid;
    fresh.getattr(data).unwrap();
    assert!(!c.d.log().contains("took over"), "{}", c.d.log());
    drop(fc);
    fresh.disconnect();
}
