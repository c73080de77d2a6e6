//! The syscall-injection fixture (`fixtures::inject`) against processes whose
//! behaviour is known: a plain `sleep`, and a helper process (this very test
//! executable, re-run on its ignored `seccomp_helper_process` test) with one thread
//! under a seccomp filter and one without.
//!
//! Needs ptrace rights over child processes (root, or Yama `ptrace_scope` <= 1).

#![cfg(target_arch = "x86_64")]

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use volfsd_harness::fixtures::inject::{
    inject_syscall, thread_ids, thread_name, ExitKind, Injected,
};

const NR_GETPID: i64 = 39;
const NR_GETUID: i64 = 102;
const NR_GETPPID: i64 = 110;
const NR_GETPGRP: i64 = 111;
const NR_RESTART_SYSCALL: i64 = 219;
const NR_CLOCK_NANOSLEEP: i64 = 230;

/// Set in the environment of the helper process.
const HELPER_ENV: &str = "VOLFSD_INJECT_FIXTURE_HELPER";
/// Name of the helper's thread under the seccomp filter, set once it is installed.
const ARMED: &str = "armed";
/// Name of the helper's thread without a filter.
const PLAIN: &str = "plain";
/// Name of the helper's thread that spins in user space (in no system call).
const SPIN: &str = "spin";

/// Kills the child (only it, by its pid) if the test did not reap it.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The system call thread `tid` of `pid` is in (first field of
/// `/proc/PID/task/TID/syscall`), if it is blocked in one.
fn current_syscall(pid: i32, tid: i32) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `sleep SECS`, once it blocks in clock_nanosleep, and its pid.
fn sleeping(secs: &str) -> (Reaped, i32) {
    let child = Reaped(
        Command::new("sleep")
            .arg(secs)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep"),
    );
    let pid = child.0.id() as i32;
    wait_until(
        "sleep to block in clock_nanosleep",
        Duration::from_secs(5),
        || current_syscall(pid, pid) == Some(NR_CLOCK_NANOSLEEP),
    );
    (child, pid)
}

#[test]
fn getpid_into_sleeping_process_returns_its_pid_and_it_sleeps_on() {
    let started = Instant::now();
    let (mut child, pid) = sleeping("3");
    assert_eq!(thread_ids(pid), vec![pid]);
    assert_eq!(thread_name(pid, pid), "sleep");

    for _ in 0..3 {
        let got = inject_syscall(pid, NR_GETPID, [0; 6]).expect("inject getpid");
        assert_eq!(got, Injected::Returned(pid as i64));
        // Detached and asleep again: the interrupted clock_nanosleep restarted
        // through restart_syscall, as after a signal without a handler.
        assert!(child.0.try_wait().unwrap().is_none(), "sleep died");
        wait_until("sleep to block again", Duration::from_secs(2), || {
            matches!(
                current_syscall(pid, pid),
                Some(NR_RESTART_SYSCALL | NR_CLOCK_NANOSLEEP)
            )
        });
    }
    // Untraced again (a second tracer can attach) and undisturbed: it sleeps its full
    // time and exits 0.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.lines().any(|l| l == "TracerPid:\t0"),
        "still traced:\n{status}"
    );
    let status = child.0.wait().expect("wait sleep");
    assert!(status.success(), "sleep ended with {status:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "sleep returned early, after {:?}",
        started.elapsed()
    );
}

#[test]
fn blocking_call_times_out_and_the_thread_gets_its_own_back() {
    const NR_PAUSE: i64 = 34;
    let started = Instant::now();
    let (mut child, pid) = sleeping("7");
    let err = inject_syscall(pid, NR_PAUSE, [0; 6]).expect_err("pause returned");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    // Interrupted, given its registers back and detached: it sleeps on, its full time.
    assert!(child.0.try_wait().unwrap().is_none(), "sleep died");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.lines().any(|l| l == "TracerPid:\t0"),
        "still traced:\n{status}"
    );
    wait_until("sleep to block again", Duration::from_secs(2), || {
        matches!(
            current_syscall(pid, pid),
            Some(NR_RESTART_SYSCALL | NR_CLOCK_NANOSLEEP)
        )
    });
    let status = child.0.wait().expect("wait sleep");
    assert!(status.success(), "sleep ended with {status:?}");
    assert!(started.elapsed() >= Duration::from_secs(7));
}

#[test]
fn seccomp_filter_of_one_thread_decides_the_injected_call() {
    let mut child = Reaped(
        Command::new(std::env::current_exe().unwrap())
            .args(["seccomp_helper_process", "--exact", "--ignored"])
            .arg("--nocapture")
            .env(HELPER_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn helper"),
    );
    let pid = child.0.id() as i32;
    let find = |name: &str| {
        thread_ids(pid)
            .into_iter()
            .find(|&tid| thread_name(pid, tid) == name)
    };
    let mut armed = None;
    let mut plain = None;
    let mut spin = None;
    wait_until("the helper's threads", Duration::from_secs(10), || {
        armed = find(ARMED);
        plain = find(PLAIN);
        spin = find(SPIN);
        armed.is_some_and(|t| current_syscall(pid, t) == Some(NR_CLOCK_NANOSLEEP))
            && plain.is_some_and(|t| current_syscall(pid, t) == Some(NR_CLOCK_NANOSLEEP))
            && spin.is_some()
    });
    let (armed, plain, spin) = (armed.unwrap(), plain.unwrap(), spin.unwrap());
    let me = std::process::id() as i64;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() } as i64;

    // The thread without a filter runs both calls.
    assert_eq!(
        inject_syscall(plain, NR_GETPPID, [0; 6]).unwrap(),
        Injected::Returned(me)
    );
    assert_eq!(
        inject_syscall(plain, NR_GETUID, [0; 6]).unwrap(),
        Injected::Returned(uid)
    );
    // The filtered thread: getuid gets SECCOMP_RET_ERRNO(EACCES), and survives.
    assert_eq!(
        inject_syscall(armed, NR_GETUID, [0; 6]).unwrap(),
        Injected::Returned(-(libc::EACCES as i64))
    );
    // getpgrp gets SECCOMP_RET_LOG: it runs, and the kernel logs an audit record.
    let pgrp = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let pgrp: i64 = pgrp
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        inject_syscall(armed, NR_GETPGRP, [0; 6]).unwrap(),
        Injected::Returned(pgrp)
    );
    // (kauditd prints it asynchronously.)
    if kernel_log().is_some() {
        let ours = format!("pid={pid} ");
        let call = format!("syscall={NR_GETPGRP} ");
        wait_until(
            "the audit record of getpgrp",
            Duration::from_secs(5),
            || {
                kernel_log().unwrap_or_default().lines().any(|l| {
                    l.contains("type=1326")
                        && l.contains(&ours)
                        && l.contains(&call)
                        && l.contains("code=0x7ffc0000")
                })
            },
        );
    }
    // A thread in user space, in no system call: the call runs at a `syscall`
    // instruction found elsewhere, and the thread spins on.
    let cpu_time = |tid: i32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    assert_eq!(current_syscall(pid, spin), None, "spin thread in a syscall");
    assert_eq!(
        inject_syscall(spin, NR_GETPID, [0; 6]).unwrap(),
        Injected::Returned(pid as i64)
    );
    let before = cpu_time(spin);
    wait_until("the spin thread to spin on", Duration::from_secs(5), || {
        cpu_time(spin) > before + 5
    });
    assert!(child.0.try_wait().unwrap().is_none(), "helper died");
    // getppid gets SECCOMP_RET_KILL_PROCESS: the whole process dies of SIGSYS.
    let got = inject_syscall(armed, NR_GETPPID, [0; 6]).unwrap();
    match got {
        Injected::ProcessDied(ExitKind::Signaled { signal, .. }) => {
            assert_eq!(signal, libc::SIGSYS, "{got:?}")
        }
        other => panic!("expected the helper to die of SIGSYS, got {other:?}"),
    }
    let status = child.0.wait().expect("wait helper");
    assert_eq!(
        status.signal(),
        Some(libc::SIGSYS),
        "helper ended with {status:?}"
    );
}

#[test]
fn own_thread_and_missing_thread_are_errors() {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    assert!(inject_syscall(me, NR_GETPID, [0; 6]).is_err());
    assert!(inject_syscall(i32::MAX, NR_GETPID, [0; 6]).is_err());
}

/// The helper process of `seccomp_filter_of_one_thread_decides_the_injected_call`:
/// does nothing unless `HELPER_ENV` is set.
#[test]
#[ignore = "helper process, run by seccomp_filter_of_one_thread_decides_the_injected_call"]
fn seccomp_helper_process() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    // No core file of the SIGSYS death in the working directory.
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) }, 0);

    std::thread::Builder::new()
        .name(PLAIN.into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_secs(60));
        })
        .unwrap();
    std::thread::Builder::new()
        .name(SPIN.into())
        .spawn(|| {
            let mut n = 0u64;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        })
        .unwrap();
    std::thread::spawn(|| {
        install_filter();
        set_thread_name(ARMED);
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    });
    // The test kills us long before.
    std::thread::sleep(Duration::from_secs(60));
}

fn set_thread_name(name: &str) {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated name of at most 16 bytes.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) }, 0);
}

/// The kernel log (`dmesg`), if readable here.
fn kernel_log() -> Option<String> {
    let out = Command::new("dmesg").stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// In the calling thread only: getppid -> SECCOMP_RET_KILL_PROCESS, getuid ->
/// SECCOMP_RET_ERRNO(EACCES), getpgrp -> SECCOMP_RET_LOG, anything else allowed.
fn install_filter() {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let filter = [
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ins(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        ins(JEQ_K, 0, 1, NR_GETPPID as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        ins(JEQ_K, 0, 1, NR_GETUID as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EACCES as u32),
        ins(JEQ_K, 0, 1, NR_GETPGRP as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_LOG),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut _,
    };
    // SAFETY: plain prctls; prog points to a live filter for the duration of the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ),
            0,
            "PR_SET_SECCOMP: {}",
            std::io::Error::last_os_error()
        );
    }
}
