//! `--upgradable`: the connection keeper sits between the frontend and the serving
//! process (src/keeper/). Here: everything the guest does goes through it unchanged,
//! in each sandbox mode the fixture runs, the daemon ends as without it, a serving
//! process that dies while the keeper waits for a frontend is replaced (up to a crash
//! loop). One that dies under a frontend's session is taken over: crash_recovery.rs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd_harness::fixtures::control::request;
use volfsd_harness::fixtures::host::host_sees_lock;
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{daemon_binary, is_virtiofsd, Daemon, TestDir, RDWR, ROOT};
use volfsd_harness::frontend::fuse::FuseOps;

#[test]
fn the_guest_is_served_through_the_keeper_and_the_daemon_exits_with_its_frontend() {
    if is_virtiofsd() {
        return;
    }
    let mut d = Daemon::start("upgradable", &["--upgradable"]);
    // The keeper is the launched process: the serving process is below it.
    serving_pid(&d);
    let mut c = d.client();
    let (e, open) = c.create(ROOT, "f", RDWR, 0o644).expect("create");
    c.write(e.nodeid, open.fh, 0, b"through the keeper")
        .expect("write");
    let got = c.read(e.nodeid, open.fh, 0, 64).expect("read");
    assert_eq!(got, b"through the keeper");
    c.call(&lock_request(
        Opcode::Setlk,
        e.nodeid,
        open.fh,
        1,
        libc::F_WRLCK,
        false,
    ))
    .expect("lock");
    assert!(
        host_sees_lock(&d.host("f")),
        "the guest's lock is held on the host"
    );
    let looked = c.lookup(ROOT, "f").expect("lookup");
    assert_eq!(looked.nodeid, e.nodeid);
    c.disconnect();
    exits_cleanly(&mut d);
    let log = d.log();
    assert!(log.contains("keeper: the frontend disconnected"), "{log}");
    assert!(!d.dir.socket().exists(), "the socket is removed:\n{log}");
}

#[test]
fn keep_serving_through_the_keeper_serves_the_next_frontend() {
    if is_virtiofsd() {
        return;
    }
    let mut d = Daemon::start("upgradable-keep", &["--upgradable", "--keep-serving"]);
    for round in 0..3 {
        let mut c = d.client();
        let name = format!("f{round}");
        let (e, open) = c.create(ROOT, &name, RDWR, 0o644).expect("create");
        c.write(e.nodeid, open.fh, 0, b"x").expect("write");
        if round == 1 {
            // An upgrade between two frontends: the old process, which would wait
            // for the next frontend, is told to go; the new one serves the next.
            sighup(&d);
            wait_log(&d, "keeper: upgraded", 1);
            c.write(e.nodeid, open.fh, 0, b"y")
                .expect("write after the upgrade");
        }
        c.disconnect();
        assert!(d.is_running(), "round {round}:\n{}", d.log());
    }
    wait_log(&d, "keeper: former serving process", 1);
    // SIGTERM to the keeper reaches the serving process, which exits 0; so does the
    // keeper.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.launched_pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    exits_cleanly(&mut d);
}

/// The serving process below the keeper, once the keeper has forked it (the
/// socket exists before).
fn serving_pid(d: &Daemon) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pid = d.pid();
        if pid != d.launched_pid() {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no serving process below the keeper:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills the serving process and waits until the keeper says it started the
/// `n`th in place of a dead one; returns how long that took.
fn kill_serving(d: &Daemon, n: usize) -> Duration {
    let old = serving_pid(d);
    let start = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_log(d, "took its place", n);
    start.elapsed()
}

#[test]
fn a_serving_process_killed_between_frontends_is_replaced() {
    if is_virtiofsd() {
        return;
    }
    let dir = TestDir::new("upgradable-crash");
    std::fs::create_dir(dir.shared().join("data")).unwrap();
    let ctl = format!("--control-socket={}", dir.control_socket().display());
    let args = ["--upgradable", "--keep-serving", &ctl, "--allowed-dir=data"];
    let mut d = Daemon::start_in(dir, &args);
    let crashes = |d: &Daemon| {
        let r = request(&d.dir.control_socket(), "GET", "/metrics", None);
        r.body.lines().find_map(|l| {
            l.strip_prefix("volfsd_keeper_crashes_total ")
                .map(str::to_owned)
        })
    };
    assert_eq!(crashes(&d).as_deref(), Some("0"));
    let mut c = d.client();
    let data = c.lookup(ROOT, "data").expect("lookup data").nodeid;
    let (e, open) = c.create(data, "kept", RDWR, 0o644).expect("create");
    c.write(e.nodeid, open.fh, 0, b"before").expect("write");
    c.disconnect();
    // Killed while the keeper waits for the next frontend: a new process takes its
    // place, and the next frontend is served, within 1 s of the kill.
    let start = Instant::now();
    let replaced = kill_serving(&d, 1);
    let mut c = d.client();
    let data = c.lookup(ROOT, "data").expect("lookup data").nodeid;
    let found = c.lookup(data, "kept").expect("lookup after the crash");
    let served = start.elapsed();
    assert_eq!(found.attr.size, 6);
    assert!(
        served < Duration::from_secs(1),
        "served again after {served:?} (a new process after {replaced:?})"
    );
    wait_log(&d, "took its place (crash 1, 1 in a row)", 1);
    // Counted in the new process's /metrics.
    assert_eq!(crashes(&d).as_deref(), Some("1"));
    c.disconnect();
    assert!(d.is_running(), "{}", d.log());
}

#[test]
fn a_crash_loop_ends_the_daemon_and_says_so() {
    if is_virtiofsd() {
        return;
    }
    // Before any frontend: the keeper waits for one, so crashes are recovered,
    // until the third in a row, each within 1 s of its start.
    let mut d = Daemon::start("upgradable-crash-loop", &["--upgradable"]);
    kill_serving(&d, 1);
    kill_serving(&d, 2);
    let last = serving_pid(&d);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(last),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = d.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| !s.success()), "{}", d.log());
    assert!(
        d.log()
            .contains("3 crashes in a row, each within 1 s of its start: a crash loop: ending"),
        "{}",
        d.log()
    );
    assert!(!d.dir.socket().exists(), "{}", d.log());
}

/// The daemon started from a copy of its binary, which a test may replace (by a
/// rename, as a package upgrade does) before it asks for an upgrade.
fn start_from_copy(test: &str) -> (Daemon, std::path::PathBuf) {
    let dir = TestDir::new(test);
    let copy = dir.root.join("volfsd-copy");
    std::fs::copy(daemon_binary(), &copy).expect("copy the daemon");
    let exec = format!("shift; exec {} \"$@\"", copy.display());
    let wrapper = ["sh", "-c", exec.as_str(), "sh"];
    // With a control socket and a volume from the command line.
    std::fs::create_dir(dir.shared().join("data")).unwrap();
    let ctl = format!("--control-socket={}", dir.control_socket().display());
    let args = ["--upgradable", ctl.as_str(), "--allowed-dir=data"];
    (Daemon::start_wrapped(dir, &wrapper, &args), copy)
}

/// The daemon exits 0 within 10 s (its frontend went, or it was told to).
fn exits_cleanly(d: &mut Daemon) {
    let status = d.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        d.log()
    );
}

/// Replaces `binary` by `with` (renamed over it: the running one stays intact).
fn replace_binary(binary: &std::path::Path, with: &[u8]) {
    let tmp = binary.with_extension("new");
    std::fs::write(&tmp, with).unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, binary).unwrap();
}

/// `volfsd ctl upgrade`: its exit status and its output.
fn ctl_upgrade(d: &Daemon) -> (bool, String) {
    ctl_upgrade_with(d, &[])
}

/// `volfsd ctl upgrade EXTRA...`.
fn ctl_upgrade_with(d: &Daemon, extra: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(daemon_binary())
        .args(["ctl", "upgrade"])
        .args(extra)
        .arg("--control-socket")
        .arg(d.dir.control_socket())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running volfsd ctl upgrade");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn sighup(d: &Daemon) {
    let keeper = nix::unistd::Pid::from_raw(d.launched_pid());
    nix::sys::signal::kill(keeper, nix::sys::signal::Signal::SIGHUP).unwrap();
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
    if line == "keeper: upgraded" {
        // The old serving process exits after that line, and until it has, it may
        // take a control client on the socket both share and end before answering.
        while volfsd_harness::fixtures::host::serving_pid(d.launched_pid()) == d.launched_pid() {
            assert!(
                Instant::now() < deadline,
                "the old serving process stays:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn an_upgrade_keeps_the_guests_session_locks_and_connection() {
    if is_virtiofsd() {
        return;
    }
    let (mut d, binary) = start_from_copy("upgrade");
    let mut c = d.client();
    let data = c.lookup(ROOT, "data").expect("lookup data").nodeid;
    let (e, open) = c.create(data, "f", RDWR, 0o644).expect("create");
    c.write(e.nodeid, open.fh, 0, b"before").expect("write");
    c.call(&lock_request(
        Opcode::Setlk,
        e.nodeid,
        open.fh,
        1,
        libc::F_WRLCK,
        false,
    ))
    .expect("lock");
    assert!(host_sees_lock(&d.host("data/f")));
    // A host process tries the lock all along: it must never get it.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (stop, path) = (stop.clone(), d.host("data/f"));
        std::thread::spawn(move || {
            let mut free = 0;
            while !stop.load(Ordering::Relaxed) {
                if !host_sees_lock(&path) {
                    free += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            free
        })
    };
    for round in 1..=3 {
        let before = d.pid();
        // The same binary, then a rebuilt one (here: the same bytes, a new file).
        if round == 2 {
            replace_binary(&binary, &std::fs::read(daemon_binary()).unwrap());
        }
        // By SIGHUP (systemd's ExecReload), and by `volfsd ctl upgrade`.
        if round == 3 {
            let (ok, out) = ctl_upgrade(&d);
            assert!(
                ok && out.contains("upgraded: the guest waited"),
                "{out}\n{}",
                d.log()
            );
        } else {
            sighup(&d);
        }
        wait_log(&d, "keeper: upgraded", round);
        let deadline = Instant::now() + Duration::from_secs(10);
        // One serving process again, not the old one (while both live, the keeper
        // has two children).
        while d.pid() == before || d.pid() == d.launched_pid() {
            assert!(
                Instant::now() < deadline,
                "the old process is still the only one:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The same node ids and handles, on the same connection.
        let text = format!("after {round}");
        c.write(e.nodeid, open.fh, 0, text.as_bytes())
            .expect("write after the upgrade");
        let got = c
            .read(e.nodeid, open.fh, 0, 64)
            .expect("read after the upgrade");
        assert_eq!(&got[..text.len()], text.as_bytes());
        assert_eq!(c.lookup(data, "f").expect("lookup").nodeid, e.nodeid);
        c.getattr(e.nodeid).expect("getattr");
        let (g, _) = c
            .create(data, &format!("new{round}"), RDWR, 0o644)
            .expect("create");
        assert!(g.nodeid > e.nodeid, "new ids continue above the old ones");
        // The control socket is served by the new process.
        let sock = d.dir.control_socket();
        assert!(
            sock.exists(),
            "round {round}: no control socket:\n{}",
            d.log()
        );
        request(&sock, "GET", "/health", None).expect(200);
    }
    for line in d.log().lines().filter(|l| l.contains("keeper: upgraded")) {
        eprintln!("{line}");
    }
    // Each new process took the lock file from the very process it replaced (the
    // peer the keeper named), holding the lock on the host: none was waited for.
    let handed = d
        .log()
        .lines()
        .filter(|l| {
            l.contains("device state loaded") && l.contains("(0 waited for, 1 handed over)")
        })
        .count();
    assert_eq!(handed, 3, "{}", d.log());
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        prober.join().unwrap(),
        0,
        "a host process got the guest's lock:\n{}",
        d.log()
    );
    assert!(host_sees_lock(&d.host("data/f")));
    c.disconnect();
    exits_cleanly(&mut d);
    assert!(!d.dir.socket().exists(), "{}", d.log());
    assert!(!d.dir.control_socket().exists(), "{}", d.log());
}

#[test]
fn a_new_binary_that_fails_leaves_the_old_process_serving() {
    if is_virtiofsd() {
        return;
    }
    let (mut d, binary) = start_from_copy("upgrade-fails");
    let mut c = d.client();
    let data = c.lookup(ROOT, "data").expect("lookup data").nodeid;
    let (e, open) = c.create(data, "f", RDWR, 0o644).expect("create");
    c.call(&lock_request(
        Opcode::Setlk,
        e.nodeid,
        open.fh,
        1,
        libc::F_WRLCK,
        false,
    ))
    .expect("lock");
    let before = d.pid();
    // A binary that exits at once.
    replace_binary(&binary, b"#!/bin/sh\nexit 3\n");
    let (ok, out) = ctl_upgrade(&d);
    assert!(!ok, "{out}");
    assert!(out.contains("exited with status 3"), "ctl says why: {out}");
    wait_log(&d, "keeper: upgrade failed", 1);
    assert_eq!(d.pid(), before, "{}", d.log());
    let log = d.log();
    assert!(log.contains("serves on"), "{log}");
    assert!(log.contains("exited with status 3"), "says why:\n{log}");
    c.write(e.nodeid, open.fh, 0, b"still served")
        .expect("write after a failed upgrade");
    assert!(host_sees_lock(&d.host("data/f")));
    // And then a good one.
    replace_binary(&binary, &std::fs::read(daemon_binary()).unwrap());
    sighup(&d);
    wait_log(&d, "keeper: upgraded", 1);
    c.write(e.nodeid, open.fh, 0, b"served by the new one")
        .expect("write");
    assert!(host_sees_lock(&d.host("data/f")));
    c.disconnect();
    exits_cleanly(&mut d);
}

#[test]
fn ctl_upgrade_binary_runs_a_binary_of_the_operators_choice_only_a_safe_one() {
    if is_virtiofsd() {
        return;
    }
    let (d, _binary) = start_from_copy("upgrade-binary");
    let mut c = d.client();
    let data = c.lookup(ROOT, "data").expect("lookup data").nodeid;
    let (e, open) = c.create(data, "f", RDWR, 0o644).expect("create");
    let before = d.pid();
    let other_dir = d.dir.root.join("v2");
    std::fs::create_dir(&other_dir).unwrap();
    let other = other_dir.join("volfsd");
    std::fs::copy(daemon_binary(), &other).unwrap();
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    // Refused: a relative path, one writable by others, one in a directory others
    // may write to. The old process serves on.
    let (ok, out) = ctl_upgrade_with(&d, &["--binary", "v2/volfsd"]);
    assert!(!ok && out.contains("not an absolute path"), "{out}");
    mode(&other, 0o777);
    let path = other.to_str().unwrap();
    let (ok, out) = ctl_upgrade_with(&d, &["--binary", path]);
    assert!(
        !ok && out.contains("writable by its group or others"),
        "{out}"
    );
    mode(&other, 0o755);
    mode(&other_dir, 0o777);
    let (ok, out) = ctl_upgrade_with(&d, &["--binary", path]);
    assert!(!ok && out.contains("its directory"), "{out}");
    mode(&other_dir, 0o755);
    assert_eq!(d.pid(), before);
    c.write(e.nodeid, open.fh, 0, b"still served")
        .expect("write");
    // A safe one: the new serving process runs it, and so does the next upgrade.
    let (ok, out) = ctl_upgrade_with(&d, &["--binary", path]);
    assert!(ok, "{out}\n{}", d.log());
    wait_log(&d, "keeper: upgraded", 1);
    // The serving process's binary, once the old one is gone (until then the
    // keeper has two children).
    let serving_exe = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pid = d.pid();
            if pid != d.launched_pid() || Instant::now() > deadline {
                return std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    assert_eq!(serving_exe(), other.canonicalize().unwrap());
    c.write(e.nodeid, open.fh, 0, b"served by v2")
        .expect("write");
    sighup(&d);
    wait_log(&d, "keeper: upgraded", 2);
    assert_eq!(serving_exe(), other.canonicalize().unwrap(), "{}", d.log());
    c.disconnect();
}

#[test]
fn ctl_upgrade_without_the_flag_says_so() {
    if is_virtiofsd() {
        return;
    }
    let dir = TestDir::new("upgrade-no-flag");
    let ctl = format!("--control-socket={}", dir.control_socket().display());
    let d = Daemon::start_in(dir, &[ctl.as_str()]);
    let (ok, out) = ctl_upgrade(&d);
    assert!(!ok, "{out}");
    assert!(out.contains("not started with --upgradable"), "{out}");
}

#[test]
fn volumes_attached_at_runtime_survive_an_upgrade_and_a_detached_one_stays_gone() {
    if is_virtiofsd() {
        return;
    }
    let (d, _binary) = start_from_copy("upgrade-volumes");
    let sock = d.dir.control_socket();
    std::fs::create_dir(d.dir.shared().join("late")).unwrap();
    std::fs::write(d.dir.shared().join("late/held"), b"held").unwrap();
    let body = format!(
        r#"{{"path":"{}","read_only":true,"volume_id":"vol-late"}}"#,
        d.dir.shared().join("late").display()
    );
    let put = request(&sock, "PUT", "/volumes/late", Some(&body));
    assert_eq!(put.status, 201, "{}", put.body);
    // The command line's volume is detached: it must not come back.
    assert_eq!(request(&sock, "DELETE", "/volumes/data", None).status, 204);
    let mut c = d.client();
    let late = c.lookup(ROOT, "late").expect("lookup late").nodeid;
    let held = c.lookup(late, "held").expect("lookup held").nodeid;
    sighup(&d);
    wait_log(&d, "keeper: upgraded", 1);
    // The guest's ids in the runtime volume work on, read-only as attached.
    c.getattr(held)
        .expect("getattr of a node in the runtime volume");
    assert_eq!(c.lookup(late, "held").expect("lookup").nodeid, held);
    let refused = c
        .create(late, "new", RDWR, 0o644)
        .expect_err("read-only volume");
    assert_eq!(refused.errno(), Some(libc::EROFS), "{refused:?}");
    let list = request(&sock, "GET", "/volumes", None);
    assert!(
        list.body.contains("\"late\"") && list.body.contains("vol-late"),
        "{}",
        list.body
    );
    assert!(!list.body.contains("\"data\""), "{}", list.body);
    let metrics = request(&sock, "GET", "/metrics", None).body;
    assert!(
        metrics.contains("volfsd_keeper_upgrades_total 1\n"),
        "{metrics}"
    );
    assert!(
        c.lookup(ROOT, "data").is_err(),
        "the detached volume came back"
    );
}
