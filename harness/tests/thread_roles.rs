//! Every thread of the daemon runs under exactly its role's seccomp filter and
//! capabilities, whichever thread asked for it: the test makes the daemon start every
//! kind of thread it has (the queue workers, the control threads, a lock wait, the
//! state thread and the hand-over's, the wait for a loaded state's locks, the signal,
//! log and launcher threads) and reads each one's filters from the kernel
//! (`PTRACE_SECCOMP_GET_FILTER`) and its capability sets from /proc, and compares them
//! with what the daemon compiles for that role (src/sandbox/threads.rs).
//!
//! Needs root (ptrace of the daemon).

use std::io::Write;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd::exports::sandbox::caps::kept;
use volfsd::exports::sandbox::seccomp::role_programs;
use volfsd::exports::sandbox::threads::LAUNCHER_NAME;
use volfsd::exports::sandbox::{SeccompMode, ThreadRole};
use volfsd::exports::state::format;
use volfsd_harness::fixtures::host::{host_sees_lock, poll};
use volfsd_harness::fixtures::inject::{thread_ids, thread_name};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::seccomp::{filters_of, Insn};
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, TestDir, RDWR, ROOT};
use volfsd_harness::frontend::{FuseClient, FuseOps};

/// The role of a daemon thread, by its name (cut at 15 bytes by the kernel).
fn role_of(name: &str) -> ThreadRole {
    match name {
        // The main thread, and the vhost-user thread it starts (named after the
        // daemon).
        "volfsd" => ThreadRole::Main,
        // vhost-user-backend's queue workers, started inside a Worker thread.
        "vring_worker" | "volfsd-worker-s" | "volfsd-workers" => ThreadRole::Worker,
        "volfsd-control" | "volfsd-ctl-clie" => ThreadRole::Control,
        "volfsd-lockwait" | "volfsd-locktake" => ThreadRole::LockWaiter,
        "volfsd-signals" => ThreadRole::Signals,
        "volfsd-log" => ThreadRole::Logger,
        "volfsd-state" | "volfsd-handoff" => ThreadRole::State,
        n if n == LAUNCHER_NAME => ThreadRole::Launcher,
        other => panic!("a daemon thread of no known role: {other:?}"),
    }
}

fn status(pid: i32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default()
}

fn field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {name} in status:\n{status}"))
}

fn hex(status: &str, name: &str) -> u64 {
    u64::from_str_radix(&field(status, name), 16).unwrap()
}

/// The daemon's pid as it sees itself (its filters name it): the innermost of its
/// namespaces' pids.
fn own_pid(pid: i32) -> u32 {
    field(&status(pid, pid), "NSpid")
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .unwrap()
}

/// The filters a thread of `role` holds, oldest first: its role's on the launcher's
/// (the main thread, which confines itself, has its own only).
fn expected_filters(role: ThreadRole, pid: u32) -> Vec<Vec<Insn>> {
    let mode = SeccompMode::Kill;
    let mut installed = Vec::new();
    if role != ThreadRole::Main {
        installed.extend(role_programs(ThreadRole::Launcher, mode, pid));
    }
    if role != ThreadRole::Launcher {
        installed.extend(role_programs(role, mode, pid));
    }
    installed
}

/// Checks every thread of `d` against its role (filters, capabilities, no way to
/// gain any); returns the roles seen.
fn check_threads(d: &Daemon, privileged_xattrs: bool) -> Vec<(String, ThreadRole)> {
    let pid = d.pid();
    let own = own_pid(pid);
    let mut seen = Vec::new();
    for tid in thread_ids(pid) {
        let name = thread_name(pid, tid);
        let role = role_of(&name);
        let s = status(pid, tid);
        if s.is_empty() {
            continue; // ended meanwhile (a set-up thread being reaped)
        }
        for set in ["CapBnd", "CapInh", "CapAmb"] {
            assert_eq!(hex(&s, set), 0, "{name}: {set}");
        }
        assert_eq!(field(&s, "NoNewPrivs"), "1", "{name}");
        assert_eq!(field(&s, "Seccomp"), "2", "{name}: filter mode");
        let kept_by = |r| kept(r, privileged_xattrs, false).0;
        let (eff, prm) = match role {
            ThreadRole::Launcher => {
                let all = ThreadRole::ALL.iter().fold(0, |m, &r| m | kept_by(r));
                (0, all)
            }
            r => (kept_by(r), kept_by(r)),
        };
        assert_eq!(hex(&s, "CapEff"), eff, "{name} ({role:?}): CapEff");
        assert_eq!(hex(&s, "CapPrm"), prm, "{name} ({role:?}): CapPrm");
        let filters = match filters_of(tid) {
            Ok(f) => f,
            // Ended while it was being read (a set-up thread that was joined may be
            // listed for a moment while the kernel reaps it).
            Err(_) if ended(pid, tid) => continue,
            Err(e) => panic!("{name}: reading its filters: {e}"),
        };
        let want = expected_filters(role, own);
        assert_eq!(
            filters.len(),
            want.len(),
            "{name} ({role:?}): {} filters, {} expected",
            filters.len(),
            want.len()
        );
        for (i, (got, want)) in filters.iter().zip(&want).enumerate() {
            let first_diff = got.iter().zip(want.iter()).position(|(a, b)| a != b);
            assert!(
                got == want,
                "{name} ({role:?}): filter {i} (oldest first) is not its role's: {} \
                 instructions, {} expected, first difference at {first_diff:?}: {:?} / {:?}",
                got.len(),
                want.len(),
                first_diff.map(|d| got[d]),
                first_diff.map(|d| want[d]),
            );
        }
        seen.push((name, role));
    }
    seen
}

/// Whether thread `tid` of `pid` is gone or exiting (a zombie or dead task).
fn ended(pid: i32, tid: i32) -> bool {
    let s = status(pid, tid);
    s.is_empty() || field(&s, "State").starts_with(['Z', 'X'])
}

#[track_caller]
fn assert_has(seen: &[(String, ThreadRole)], name: &str) {
    assert!(
        seen.iter().any(|(n, _)| n == name),
        "thread {name} among {seen:?}"
    );
}

#[test]
fn every_kind_of_thread_runs_under_exactly_its_roles_filter_and_capabilities() {
    if is_virtiofsd() {
        return;
    }
    let dir = TestDir::new("roles-src");
    std::fs::create_dir(dir.shared().join("v")).unwrap();
    let ctl_path = dir.control_socket();
    let ctl = format!("--control-socket={}", ctl_path.display());
    let src = Daemon::start_in(dir, &[&ctl, "--allowed-dir=v"]);
    let mut c = src.client();
    let v = c.lookup(ROOT, "v").unwrap().nodeid;
    let (f, open_a) = c.create(v, "f", RDWR, 0o644).unwrap();
    let fh_b = c.open(f.nodeid, RDWR).unwrap().fh;
    c.call(&lock_request(
        Opcode::Setlk,
        f.nodeid,
        open_a.fh,
        0xa,
        libc::F_WRLCK,
        false,
    ))
    .expect("SETLK for owner a");
    // A lock wait on a thread of its own.
    let q = c.request_queue(0).unwrap();
    q.submit(&lock_request(
        Opcode::Setlkw,
        f.nodeid,
        fh_b,
        0xb,
        libc::F_WRLCK,
        false,
    ))
    .unwrap();
    q.kick().unwrap();
    let pid = src.pid();
    let has = |name: &str| {
        thread_ids(pid)
            .into_iter()
            .any(|t| thread_name(pid, t) == name)
    };
    assert!(poll(Duration::from_secs(5), || has("volfsd-lockwait")));
    // A control client half-way through its request: its thread waits for the rest.
    let mut client = std::os::unix::net::UnixStream::connect(&ctl_path).unwrap();
    client.write_all(b"GET /volumes HTTP/1.1\r\n").unwrap();
    assert!(poll(Duration::from_secs(5), || has("volfsd-ctl-clie")));
    // A save with a lock held: its open file is offered on the hand-over's thread.
    let saved = c.save_state_paused().expect("save");
    assert!(poll(Duration::from_secs(5), || has("volfsd-handoff")));
    let seen = check_threads(&src, false);
    for name in [
        "volfsd",
        "vring_worker",
        "volfsd-control",
        "volfsd-ctl-clie",
        "volfsd-lockwait",
        "volfsd-signals",
        "volfsd-log",
        "volfsd-state",
        "volfsd-handoff",
        LAUNCHER_NAME,
    ] {
        assert_has(&seen, name);
    }

    // A destination that loads the state while the source still holds the lock
    // (no hand-over): it waits for the lock on a thread of its own, started from
    // the state thread.
    let mut state = format::decode(&saved).unwrap();
    state.handoff = None;
    let shared = format!("--shared-dir={}", src.dir.shared().display());
    let dst = Daemon::start_in(
        TestDir::new("roles-dst"),
        &[&shared, "--allowed-dir=v", "--keep-serving"],
    );
    let mut cfg = dst.config();
    cfg.load_state = Some(format::encode(&state));
    let _g = FuseClient::connect(&cfg).expect("the destination loads the state");
    assert!(host_sees_lock(&src.dir.shared().join("v/f")));
    let dst_pid = dst.pid();
    assert!(poll(Duration::from_secs(5), || thread_ids(dst_pid)
        .into_iter()
        .any(|t| thread_name(dst_pid, t) == "volfsd-locktake")));
    let seen = check_threads(&dst, false);
    assert_has(&seen, "volfsd-locktake");
    assert_has(&seen, "volfsd-workers");
    drop(client);
}

#[test]
fn privileged_xattrs_give_the_workers_cap_sys_admin_and_no_one_else() {
    if is_virtiofsd() {
        return;
    }
    let d = Daemon::start("roles-xattr", &["--xattr", "--allow-privileged-xattrs"]);
    // Connected: the daemon's setup, confinement included, is over.
    let _c = d.client();
    let seen = check_threads(&d, true);
    assert_has(&seen, "vring_worker");
    let pid = d.pid();
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    for tid in thread_ids(pid) {
        let name = thread_name(pid, tid);
        let eff = hex(&status(pid, tid), "CapEff");
        if role_of(&name) == ThreadRole::Worker {
            assert_ne!(eff & CAP_SYS_ADMIN, 0, "{name}");
        } else {
            assert_eq!(eff & CAP_SYS_ADMIN, 0, "{name}");
        }
    }
}
