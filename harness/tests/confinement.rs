//! Confinement of the running daemon, observed from the host through /proc: its root
//! is SharedDir with no path out, its namespaces are its own (each thread's own filter
//! and capabilities: thread_roles.rs), and a system call outside a
//! worker's allow-list ends the daemon under `--seccomp kill` (logged under `log`,
//! reported under `trap`). Also each sandbox mode, the unprivileged mode, and clear
//! errors when a sandbox cannot be set up.
//!
//! Needs root (ptrace of the daemon, running it as another user, a sysctl).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use std::time::Duration;

use volfsd_harness::fixtures::host::poll;
use volfsd_harness::fixtures::inject::{inject_syscall, thread_ids, thread_name, Injected};
use volfsd_harness::fixtures::{daemon_binary, Daemon, TestDir, RDWR, ROOT};
use volfsd_harness::frontend::FuseOps;

/// `reboot(2)` with no valid magic: on no role's allow-list, and harmless if it ever
/// ran (EPERM: no thread keeps CAP_SYS_BOOT; EINVAL without the magic numbers).
const FORBIDDEN_SYSCALL: i64 = libc::SYS_reboot;

/// Tests that run the daemon as another user or change the user-namespace sysctl
/// run one at a time.
static USERNS: Mutex<()> = Mutex::new(());

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

fn ns(pid: &str, kind: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .unwrap()
        .display()
        .to_string()
}

fn names(dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn with_files(test: &str) -> TestDir {
    let dir = TestDir::new(test);
    std::fs::write(dir.shared().join("a.txt"), b"a").unwrap();
    std::fs::create_dir(dir.shared().join("v")).unwrap();
    dir
}

/// The threads of `pid` by name.
fn threads(pid: i32) -> Vec<(i32, String)> {
    thread_ids(pid)
        .into_iter()
        .map(|t| (t, thread_name(pid, t)))
        .collect()
}

fn worker_tid(pid: i32) -> i32 {
    threads(pid)
        .into_iter()
        .find(|(_, n)| n == "vring_worker")
        .map(|(t, _)| t)
        .expect("a vring_worker thread")
}

#[test]
fn the_root_is_the_shared_dir_and_no_path_leads_out() {
    let d = Daemon::start_in(with_files("root"), &[]);
    // The sockets exist before the root changes: connected, the setup is over.
    let _c = d.client();
    let pid = d.pid();
    assert_ne!(
        pid,
        d.launched_pid(),
        "namespace mode forks a serving child"
    );
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    let want: BTreeSet<String> = ["a.txt", "v"].iter().map(|s| s.to_string()).collect();
    assert_eq!(names(&root), want, "the daemon's / is SharedDir");
    assert_eq!(names(&root.join("..")), want, "/.. is / again");
    for host_only in ["etc", "proc", "dev", "usr", "tmp"] {
        assert!(
            !root.join(host_only).exists(),
            "/{host_only} must not exist"
        );
    }
    let share = std::fs::metadata(d.dir.shared()).unwrap();
    let seen = std::fs::metadata(&root).unwrap();
    assert_eq!((seen.dev(), seen.ino()), (share.dev(), share.ino()));
    let cwd = std::fs::metadata(format!("/proc/{pid}/cwd")).unwrap();
    assert_eq!(cwd.ino(), share.ino(), "its working directory is / too");
    // Only SharedDir and what lies under it is mounted in its namespace: the old root
    // was detached.
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .collect();
    assert_eq!(points, vec!["/"], "one mount, the share: {mountinfo}");
}

#[test]
fn its_namespaces_are_its_own() {
    let dir = with_files("namespaces");
    let ctl = format!("--control-socket={}", dir.control_socket().display());
    let d = Daemon::start_in(dir, &[&ctl]);
    let _c = d.client();
    let (pid, sup) = (d.pid().to_string(), d.launched_pid().to_string());
    for kind in ["mnt", "pid", "net", "ipc", "uts"] {
        assert_ne!(ns(&pid, kind), ns("self", kind), "{kind} namespace");
    }
    assert_eq!(
        ns(&pid, "user"),
        ns("self", "user"),
        "root needs no user namespace"
    );
    let nspid = field(&status(d.pid(), d.pid()), "NSpid");
    assert!(
        nspid.ends_with("\t1"),
        "pid 1 in its pid namespace: {nspid}"
    );
    // The supervisor stays in the host's namespaces (it removes the sockets).
    assert_eq!(ns(&sup, "mnt"), ns("self", "mnt"));
    assert_eq!(ns(&sup, "net"), ns("self", "net"));
    // The sockets are bound before the fork; the supervisor closed its copies, so a
    // frontend can only ever be accepted by the serving child.
    let sockets: Vec<String> = std::fs::read_dir(format!("/proc/{sup}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.display().to_string())
        .filter(|l| l.starts_with("socket:"))
        .collect();
    assert!(sockets.is_empty(), "the supervisor holds {sockets:?}");
}

#[test]
fn the_supervisor_keeps_no_capability_under_its_own_filter() {
    // Each thread of the daemon itself: thread_roles.rs.
    let d = Daemon::start("supervisor-caps", &[]);
    let _c = d.client();
    let sup = status(d.launched_pid(), d.launched_pid());
    assert_eq!(hex(&sup, "CapEff"), 0, "the supervisor keeps nothing");
    assert_eq!(hex(&sup, "CapBnd"), 0);
    assert_eq!(field(&sup, "NoNewPrivs"), "1");
    assert_eq!(field(&sup, "Seccomp"), "2", "the supervisor too");
}

#[test]
fn seccomp_none_installs_no_filter() {
    let d = Daemon::start("seccomp-none", &["--seccomp=none"]);
    let _c = d.client();
    let pid = d.pid();
    for (tid, name) in threads(pid) {
        assert_eq!(field(&status(pid, tid), "Seccomp"), "0", "{name}");
    }
}

#[test]
fn a_forbidden_syscall_in_a_worker_kills_the_daemon() {
    let mut d = Daemon::start("seccomp-kill", &[]);
    let _c = d.client();
    let tid = worker_tid(d.pid());
    match inject_syscall(tid, FORBIDDEN_SYSCALL, [0; 6]).expect("inject") {
        Injected::ProcessDied(how) => assert_eq!(how.signal(), Some(libc::SIGSYS), "{how:?}"),
        other => panic!("the daemon survived a forbidden syscall: {other:?}"),
    }
    let status = d
        .wait_exit(Duration::from_secs(5))
        .expect("the supervisor exits");
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(
        d.log().contains("killed by SIGSYS"),
        "the supervisor says why:\n{}",
        d.log()
    );
    assert!(
        !d.dir.socket().exists(),
        "the supervisor removes the socket"
    );
}

/// glibc opens a /proc file the first time it trims a thread arena's heap; that
/// happened at exit, on the main thread dropping what the workers had allocated for
/// a load generator's 10,000 looked-up files, and `--seccomp kill` ended the daemon
/// with SIGSYS instead of exit 0. The load generator's lookup workload, as run by
/// benches/compare.sh, met it every time.
#[test]
fn a_daemon_exits_cleanly_at_disconnect_after_a_lookup_load() {
    use volfsd_harness::loadgen::{self, Options, Workload};
    let mut d = Daemon::start("exit-after-lookups", &["--inode-file-handles=never"]);
    let opts = Options {
        socket: d.dir.socket(),
        shared_dir: d.dir.shared(),
        queues: 1,
        qd: 32,
        duration: Some(Duration::from_secs(1)),
        ops: None,
        file_size: 1 << 20,
        files: 10_000,
        workloads: vec![Workload::Lookup],
        keep_files: true,
        quiet: true,
        idle_before: Duration::ZERO,
        hold_after: Duration::ZERO,
        daemon_pid: None,
        hold_inodes: 0,
    };
    loadgen::run(&opts).expect("the lookup load runs");
    let status = d
        .wait_exit(Duration::from_secs(10))
        .expect("the daemon exits when its frontend goes");
    assert!(status.success(), "{status:?}\n{}", d.log());
    assert!(!d.log().contains("SIGSYS"), "{}", d.log());
}

#[test]
fn a_forbidden_syscall_is_logged_and_allowed_under_log() {
    let d = Daemon::start("seccomp-log", &["--seccomp=log"]);
    let mut c = d.client();
    let pid = d.pid();
    let tid = worker_tid(pid);
    match inject_syscall(tid, FORBIDDEN_SYSCALL, [0; 6]).expect("inject") {
        Injected::Returned(r) => {
            assert_eq!(r, -(libc::EPERM as i64), "reboot without CAP_SYS_BOOT")
        }
        other => panic!("under log the call runs: {other:?}"),
    }
    let record = format!("pid={pid} ");
    let syscall = format!("syscall={FORBIDDEN_SYSCALL} ");
    let mut kernel_log = String::new();
    assert!(
        poll(Duration::from_secs(3), || {
            let out = Command::new("dmesg").output().expect("dmesg");
            kernel_log = String::from_utf8_lossy(&out.stdout).into_owned();
            kernel_log
                .lines()
                .any(|l| l.contains("type=1326") && l.contains(&record) && l.contains(&syscall))
        }),
        "an audit record of the call: {}",
        kernel_log
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The worker serves on.
    assert!(c.getattr(ROOT).is_ok());
}

#[test]
fn a_forbidden_syscall_is_reported_under_trap() {
    let mut d = Daemon::start("seccomp-trap", &["--seccomp=trap"]);
    let _c = d.client();
    let tid = worker_tid(d.pid());
    let _ = inject_syscall(tid, FORBIDDEN_SYSCALL, [0; 6]).expect("inject");
    let status = d
        .wait_exit(Duration::from_secs(5))
        .expect("the daemon exits");
    assert_eq!(status.code(), Some(1), "{status:?}\n{}", d.log());
    assert!(
        d.log()
            .contains(&format!("system call {FORBIDDEN_SYSCALL}")),
        "the daemon names the call:\n{}",
        d.log()
    );
}

#[test]
fn chroot_mode_changes_only_the_root() {
    let d = Daemon::start_in(with_files("chroot"), &["--sandbox=chroot"]);
    let _c = d.client();
    let pid = d.pid();
    assert_eq!(pid, d.launched_pid(), "chroot mode does not fork");
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    let want: BTreeSet<String> = ["a.txt", "v"].iter().map(|s| s.to_string()).collect();
    assert_eq!(names(&root), want);
    for kind in ["mnt", "pid", "net"] {
        assert_eq!(ns(&pid.to_string(), kind), ns("self", kind), "{kind}");
    }
    let s = status(pid, pid);
    assert_eq!(hex(&s, "CapBnd"), 0);
    assert_eq!(field(&s, "Seccomp"), "2");
}

#[test]
fn none_mode_keeps_the_hosts_root_but_not_the_privileges() {
    let d = Daemon::start("none", &["--sandbox=none"]);
    let _c = d.client();
    let pid = d.pid();
    assert_eq!(pid, d.launched_pid());
    assert!(std::path::Path::new(&format!("/proc/{pid}/root/etc")).exists());
    for (tid, name) in threads(pid) {
        let s = status(pid, tid);
        assert_eq!(hex(&s, "CapBnd"), 0, "{name}");
        assert_eq!(field(&s, "Seccomp"), "2", "{name}");
    }
}

/// A share owned by an unprivileged user (nobody), and the daemon started as that
/// user, through setpriv.
fn as_nobody(test: &str, extra: &[&str]) -> Daemon {
    let dir = TestDir::new(test);
    for p in [&dir.root, &dir.shared()] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    Daemon::start_wrapped(
        dir,
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ],
        extra,
    )
}

#[test]
fn an_unprivileged_user_gets_a_user_namespace_and_serves_its_share() {
    let _one = USERNS.lock().unwrap_or_else(|e| e.into_inner());
    let d = as_nobody("unprivileged", &[]);
    let mut c = d.client();
    let pid = d.pid();
    assert_ne!(ns(&pid.to_string(), "user"), ns("self", "user"));
    let uid_map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    let first: Vec<&str> = uid_map.split_whitespace().take(3).collect();
    assert_eq!(
        first,
        ["0", "65534", "1"],
        "nobody is root inside: {uid_map}"
    );
    let s = status(pid, pid);
    assert_eq!(field(&s, "Uid").split_whitespace().next(), Some("65534"));
    assert_eq!(hex(&s, "CapBnd"), 0);
    // It serves: a file the guest creates is owned by the user on the host.
    let (entry, fh) = c.create(ROOT, "made", RDWR, 0o644).expect("create");
    c.write(entry.nodeid, fh.fh, 0, b"by the guest")
        .expect("write");
    let m = std::fs::metadata(d.dir.shared().join("made")).unwrap();
    assert_eq!((m.uid(), m.gid()), (65534, 65534));
    assert_eq!(
        std::fs::read(d.dir.shared().join("made")).unwrap(),
        b"by the guest"
    );
    assert_eq!(entry.attr.uid, 0, "the guest sees its own root");
}

#[test]
fn chroot_mode_as_an_unprivileged_user_is_a_clear_error() {
    let dir = TestDir::new("chroot-unprivileged");
    std::os::unix::fs::chown(&dir.root, Some(65534), Some(65534)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(daemon_binary())
        .arg(format!("--socket-path={}", dir.socket().display()))
        .arg(format!("--shared-dir={}", dir.shared().display()))
        .arg("--sandbox=chroot")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--sandbox chroot needs root"), "{err}");
    assert!(!dir.socket().exists(), "nothing was served");
}

#[test]
fn a_sandbox_that_cannot_be_set_up_names_the_step_and_exits_1() {
    let _one = USERNS.lock().unwrap_or_else(|e| e.into_inner());
    // The user may create its socket next to SharedDir, but SharedDir itself is
    // root's and private: root inside the user's namespace is not root outside, so
    // the sandbox cannot enter it.
    let dir = TestDir::new("sandbox-fails");
    std::os::unix::fs::chown(&dir.root, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(
        dir.shared(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(daemon_binary())
        .arg(format!("--socket-path={}", dir.socket().display()))
        .arg(format!("--shared-dir={}", dir.shared().display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("volfsd: sandbox: ") && err.contains("Permission denied"),
        "the error names the step that failed: {err}"
    );
    assert!(
        !dir.socket().exists(),
        "it never served, and left no socket"
    );
}

/// The socket exists before the sandbox is set up (as virtiofsd's does), so a launcher
/// may signal while the daemon is still forking into its namespaces. The serving
/// child is pid 1 of its pid namespace, and the kernel drops a signal that pid 1
/// neither handles nor blocks: unless blocked from the start, that SIGTERM was lost
/// and the daemon ran on.
#[test]
fn a_sigterm_sent_the_moment_the_socket_appears_still_ends_the_daemon_cleanly() {
    for round in 0..20 {
        let mut d = Daemon::start(&format!("early-sigterm-{round}"), &[]);
        // SAFETY: kill of the process this test started.
        assert_eq!(unsafe { libc::kill(d.launched_pid(), libc::SIGTERM) }, 0);
        let status = d
            .wait_exit(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("round {round}: still running 5 s after SIGTERM"));
        assert_eq!(status.code(), Some(0), "round {round}: {}", d.log());
        assert!(
            !d.dir.socket().exists(),
            "round {round}: the socket was removed"
        );
    }
}

#[test]
fn the_supervisor_passes_sigterm_on_and_exits_with_the_daemons_status() {
    let mut d = Daemon::start("supervisor-sigterm", &[]);
    let serving = d.pid();
    // SAFETY: kill of the process this test started.
    assert_eq!(unsafe { libc::kill(d.launched_pid(), libc::SIGTERM) }, 0);
    let status = d.wait_exit(Duration::from_secs(5)).expect("exits");
    assert_eq!(status.code(), Some(0), "{}", d.log());
    assert!(d.log().contains("received SIGTERM"), "{}", d.log());
    assert!(!d.dir.socket().exists(), "the daemon removed its socket");
    assert!(!std::path::Path::new(&format!("/proc/{serving}")).exists());
}

fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The supervisor is the tiny program volfsd embeds, executed from a memfd right
/// after the fork (src/sandbox/tiny_supervisor.rs): named as the daemon, one thread,
/// and the daemon's own arguments still shown after its own.
#[test]
fn the_supervisor_is_the_tiny_program() {
    let d = Daemon::start("supervisor-exec", &[]);
    let _c = d.client();
    let (sup, pid) = (d.launched_pid(), d.pid());
    let exe = |p: i32| std::fs::read_link(format!("/proc/{p}/exe")).unwrap();
    assert!(
        exe(sup)
            .display()
            .to_string()
            .starts_with("/memfd:volfsd-supervisor"),
        "{}",
        exe(sup).display()
    );
    let comm = |p: i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap();
    assert_eq!(
        comm(sup),
        comm(pid),
        "named as the daemon, not after the memfd"
    );
    assert_eq!(field(&status(sup, sup), "Threads"), "1");
    let (sup_args, args) = (cmdline(sup), cmdline(pid));
    assert_eq!(
        sup_args[1], "\u{1}volfsd-sandbox-supervisor",
        "{sup_args:?}"
    );
    let own = sup_args.iter().position(|a| a == "--").expect("--") + 1;
    assert_eq!(sup_args[own..], args[1..], "the daemon's arguments");
    assert!(
        !d.log().contains("sandbox supervisor"),
        "no fallback was taken:\n{}",
        d.log()
    );
}

/// The point of the tiny program: a supervisor holds a few pages (a Rust one held
/// ~200 KiB of RssAnon), and is no less confined: no capability in any set, and
/// two filters, volfsd's list for the exec and the program's own narrower one.
#[test]
fn the_supervisor_is_small_and_confined() {
    let d = Daemon::start("supervisor-small", &[]);
    let _c = d.client();
    let sup = status(d.launched_pid(), d.launched_pid());
    let kib = |name: &str| -> u64 {
        field(&sup, name)
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .unwrap()
    };
    assert!(kib("RssAnon") < 64, "RssAnon {} kB", kib("RssAnon"));
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(hex(&sup, set), 0, "{set}");
    }
    assert_eq!(field(&sup, "NoNewPrivs"), "1");
    assert_eq!(field(&sup, "Seccomp"), "2");
    assert_eq!(field(&sup, "Seccomp_filters"), "2");
}

/// The tiny program's own filter is stacked on volfsd's: `prctl(PR_SET_NAME)`, on
/// volfsd's list for the program's first call, is on the program's own list no
/// more. A call outside it kills the supervisor, and the daemon dies with it.
#[test]
fn a_call_outside_the_tiny_supervisors_own_list_kills_it() {
    let mut d = Daemon::start("supervisor-own-filter", &[]);
    let _c = d.client();
    let (sup, pid) = (d.launched_pid(), d.pid());
    match inject_syscall(
        sup,
        libc::SYS_prctl,
        [libc::PR_SET_NAME as u64, 0, 0, 0, 0, 0],
    )
    .expect("inject")
    {
        Injected::ProcessDied(how) => assert_eq!(how.signal(), Some(libc::SIGSYS), "{how:?}"),
        other => panic!("the supervisor survived a call outside its list: {other:?}"),
    }
    d.wait_exit(Duration::from_secs(5))
        .expect("the supervisor is gone");
    let gone = poll(Duration::from_secs(5), || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(gone, "the daemon dies with its supervisor");
}

/// The supervisor's mode run by hand finds no child of its own to supervise, and
/// exits 2 without signalling anything or removing any file.
#[test]
fn the_supervisor_mode_by_hand_does_nothing() {
    let dir = TestDir::new("supervisor-by-hand");
    let sock = dir.socket();
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    for args in [
        vec!["kill", "1", "volfsd", "9", "1", sock.to_str().unwrap()],
        vec!["kill", "not-a-pid", "volfsd", "9", "0"],
        vec!["none"],
    ] {
        let out = Command::new(daemon_binary())
            .arg("\u{1}volfsd-sandbox-supervisor")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("internal to the namespace sandbox"), "{err}");
    }
    assert!(sock.exists(), "the socket was left alone");
    drop(listener);
}
