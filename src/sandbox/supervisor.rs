//! The namespace mode's supervisor: the parent left in the host's namespaces when
//! the daemon's child enters its own (`namespaces.rs`). It forwards
//! SIGTERM/SIGINT/SIGHUP/SIGQUIT, exits with the child's status, and removes the
//! sockets if the child could not. Right after the fork it becomes the tiny
//! program of `tiny_supervisor.rs` (x86_64; a few pages of memory), else executes
//! this binary afresh in a mode of its own ([`reexec_supervisor`]), so that it holds
//! none of the memory the daemon touched before the fork; it is confined to that
//! work before the child serves ([`start`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::socket_path::remove_socket;
use super::{caps, seccomp, SandboxError, SeccompMode, ThreadRole};

/// Signals the supervisor passes on to the daemon.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// What the supervisor executes: this binary, as the kernel keeps it (even if the
/// file was replaced or removed since the daemon started).
pub(super) const SELF_EXE: &str = "/proc/self/exe";

/// The first argument that makes `volfsd` a supervisor (see [`reexec_supervisor`]).
/// Not a flag (no leading `-`; volfsd takes no positional argument), with a control
/// character no one types: no command line of a user can collide with it.
pub const SUPERVISOR_ARG: &str = "\u{1}volfsd-sandbox-supervisor";

/// The forked parent replaces itself with a fresh copy of this binary that only
/// supervises ([`supervisor_main`]). A fork keeps every page the daemon touched
/// before it (the parsed command line, the logger, the heap and the stack they
/// grew: ~150 KiB of RssAnon held for the daemon's life); the fresh image holds
/// only what the loader and the runtime touch. Returns only if the exec failed.
///
/// Kept across the exec: the pid and so the parenthood of the serving child (its
/// PR_SET_PDEATHSIG still follows this process), the blocked signals and any that
/// are pending (a SIGTERM or the child's SIGCHLD that came meanwhile is handled
/// after it), the user namespace, the working directory (socket paths may be
/// relative). The command line is `argv[0] SUPERVISOR_ARG SECCOMP PID COMM FD N
/// SOCKET... -- ARGS...` (FD: where to say it is confined): the daemon's own
/// arguments last, so that `ps` still shows them; the process name (`comm`, which
/// the exec would make `exe`) is set back.
pub(super) fn reexec_supervisor(
    child: Pid,
    seccomp_mode: SeccompMode,
    sockets: &[PathBuf],
    confined: &OwnedFd,
) -> io::Error {
    // The one fd the new image needs: kept open across the exec.
    if let Err(e) = nix::fcntl::fcntl(
        confined.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    ) {
        return e.into();
    }
    let args = match command_line(seccomp_mode, None, child, sockets, confined) {
        Ok(a) => a,
        Err(e) => return e,
    };
    match nix::unistd::execv(c"/proc/self/exe", &args) {
        Err(e) => e.into(),
        Ok(never) => match never {},
    }
}

/// A supervisor's command line: `argv[0] SUPERVISOR_ARG MODE [PIDFD] CHILD COMM
/// CONFINED N SOCKET... -- ARGS...` (PIDFD only for the tiny program, which cannot
/// open one under its filter), the daemon's own arguments last so that `ps` shows
/// them, and its process name, which the exec would change, passed to be set back.
pub(super) fn command_line(
    mode: SeccompMode,
    pidfd: Option<&OwnedFd>,
    child: Pid,
    sockets: &[PathBuf],
    confined: &OwnedFd,
) -> io::Result<Vec<std::ffi::CString>> {
    use std::ffi::OsString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut comm = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, comm.as_mut_ptr(), 0, 0, 0) };
    let comm_len = comm.iter().position(|&b| b == 0).unwrap_or(0);
    let mut own = std::env::args_os();
    let mut args: Vec<OsString> = vec![
        own.next().unwrap_or_else(|| "volfsd".into()),
        SUPERVISOR_ARG.into(),
        seccomp_name(mode).into(),
    ];
    args.extend(pidfd.map(|fd| fd.as_raw_fd().to_string().into()));
    args.extend([
        child.as_raw().to_string().into(),
        OsString::from_vec(comm[..comm_len].to_vec()),
        confined.as_raw_fd().to_string().into(),
        sockets.len().to_string().into(),
    ]);
    args.extend(sockets.iter().map(|p| p.as_os_str().to_owned()));
    args.push("--".into());
    args.extend(own);
    args.into_iter()
        .map(|a| {
            std::ffi::CString::new(a.as_bytes())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
        })
        .collect()
}

pub(super) fn seccomp_name(mode: SeccompMode) -> &'static str {
    match mode {
        SeccompMode::Kill => "kill",
        SeccompMode::Trap => "trap",
        SeccompMode::Log => "log",
        SeccompMode::None => "none",
    }
}

/// `volfsd SUPERVISOR_ARG ...`: the supervisor after [`reexec_supervisor`]. Exits
/// with the serving child's status; never returns. Run by hand, it finds no child of
/// its own and exits 2.
pub fn supervisor_main(mut args: impl Iterator<Item = std::ffi::OsString>) -> ! {
    use std::os::unix::ffi::OsStrExt;
    let usage = || -> ! {
        eprintln!("volfsd: {SUPERVISOR_ARG:?} is internal to the namespace sandbox");
        std::process::exit(2)
    };
    let mut next = || args.next().unwrap_or_else(|| usage());
    let _argv0 = next();
    let _marker = next();
    let mode = match next().to_str() {
        Some("kill") => SeccompMode::Kill,
        Some("trap") => SeccompMode::Trap,
        Some("log") => SeccompMode::Log,
        Some("none") => SeccompMode::None,
        _ => usage(),
    };
    let child = match next().to_str().and_then(|p| p.parse::<i32>().ok()) {
        Some(pid) if pid > 0 => Pid::from_raw(pid),
        _ => usage(),
    };
    let comm = next();
    let confined = match next().to_str().and_then(|p| p.parse::<RawFd>().ok()) {
        Some(fd) if fd > 2 => fd,
        _ => usage(),
    };
    let count = next().to_str().and_then(|n| n.parse::<usize>().ok());
    let sockets: Vec<PathBuf> = match count {
        Some(n) => (0..n).map(|_| PathBuf::from(next())).collect(),
        None => usage(),
    };
    if let Ok(name) = std::ffi::CString::new(comm.as_bytes()) {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string (cut at 15 bytes).
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
    }
    let signals = forwarded_and_sigchld();
    // Blocked already (kept across the exec); blocked again in case of a caller
    // that is not the sandbox.
    if nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None).is_err() {
        usage()
    }
    // Only our own child: a pid that is not one (a hand-made command line) ends here.
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    if let Err(e) = nix::sys::wait::waitid(nix::sys::wait::Id::Pid(child), flags) {
        eprintln!("volfsd: sandbox supervisor: pid {child}: {e}");
        usage()
    }
    // SAFETY: the fd the sandbox kept open across the exec for this (checked to be a
    // child's supervisor above); owned once, here.
    let confined = unsafe { OwnedFd::from_raw_fd(confined) };
    supervise(child, signals, mode, &sockets, confined)
}

/// The child's end of the pipe its supervisor says it is confined on.
pub(super) static SUPERVISOR_CONFINED: std::sync::Mutex<Option<OwnedFd>> =
    std::sync::Mutex::new(None);

/// In the namespace mode's child, waits until the supervisor is confined (it
/// executes the binary afresh first, in parallel with the child's set-up): from the
/// frontend's first message on, no process of the daemon runs unconfined. Elsewhere,
/// returns at once. Call before the main thread's filter (it reads a pipe).
pub fn await_supervisor() -> Result<(), SandboxError> {
    // Taken: closed once read.
    let Some(fd) = SUPERVISOR_CONFINED.lock().ok().and_then(|mut fd| fd.take()) else {
        return Ok(());
    };
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut byte) {
            Ok(1) => return Ok(()),
            // Its end closed without a word: it died (and takes this process along).
            Ok(_) => return Err(SandboxError::SupervisorGone),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(SandboxError::host("sandbox: waiting for the supervisor", e)),
        }
    }
}

/// The signals the supervisor waits for: those it forwards, and its child's end.
pub(super) fn forwarded_and_sigchld() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.add(Signal::SIGCHLD);
    set
}

/// The forked parent becomes the supervisor of `child`, the smallest way that
/// works: the tiny program (x86_64: `tiny_supervisor.rs`), else a fresh image of
/// this binary ([`reexec_supervisor`]), else this process as it is; each fallback
/// says why on stderr. Never returns.
pub(super) fn start(
    child: Pid,
    signals: SigSet,
    seccomp_mode: SeccompMode,
    sockets: &[PathBuf],
    confined: OwnedFd,
) -> ! {
    #[cfg(target_arch = "x86_64")]
    match super::tiny_supervisor::exec(child, seccomp_mode, sockets, &confined) {
        super::tiny_supervisor::NotExecuted::Unconfined(e) => {
            eprintln!("volfsd: sandbox supervisor: {e}; executing {SELF_EXE} instead");
        }
        super::tiny_supervisor::NotExecuted::Confined { error, pidfd } => {
            eprintln!(
                "volfsd: sandbox supervisor: executing the tiny supervisor: {error}; supervising from the forked process"
            );
            serve(child, signals, sockets, confined, pidfd)
        }
    }
    let e = reexec_supervisor(child, seccomp_mode, sockets, &confined);
    // The forked copy supervises instead, confined the same way, only larger.
    eprintln!(
        "volfsd: sandbox supervisor: executing {SELF_EXE}: {e}; supervising from the forked process"
    );
    supervise(child, signals, seccomp_mode, sockets, confined)
}

/// Ends a supervisor that could not confine itself, and its child with it.
pub(super) fn give_up(child: Pid, e: SandboxError) -> ! {
    eprintln!("volfsd: sandbox supervisor: {e}");
    let _ = kill(child, Signal::SIGKILL);
    std::process::exit(1);
}

/// The supervisor: confined to waiting, forwarding signals and removing the sockets.
/// It signals the daemon through a pidfd opened before its filter, which allows no
/// other way to name a process: it can signal nothing else.
pub(super) fn supervise(
    child: Pid,
    signals: SigSet,
    seccomp_mode: SeccompMode,
    sockets: &[PathBuf],
    confined: OwnedFd,
) -> ! {
    // SAFETY: pidfd_open of our own child; the fd is owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0) };
    let confined_now = if pidfd < 0 {
        Err(SandboxError::host("pidfd_open", io::Error::last_os_error()))
    } else {
        caps::lock_down_process()
    }
    .and_then(|()| {
        caps::restrict_thread(caps::CapSet::EMPTY)
            .map_err(|e| SandboxError::host("dropping capabilities", e))
    })
    .and_then(|()| seccomp::apply_alone(ThreadRole::Supervisor, seccomp_mode));
    if let Err(e) = confined_now {
        give_up(child, e)
    }
    // SAFETY: a new fd (checked above), owned here only.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    serve(child, signals, sockets, confined, pidfd)
}

/// The confined supervisor's work: tells the child it may serve, then waits,
/// forwards and reaps (the tiny program's loop, in Rust).
fn serve(child: Pid, signals: SigSet, sockets: &[PathBuf], confined: OwnedFd, pidfd: OwnedFd) -> ! {
    // The child may serve now (a write is on the list; the fd stays open, unused).
    let _ = nix::unistd::write(&confined, b"1");
    loop {
        let sig = match signals.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        if sig != Signal::SIGCHLD {
            // SAFETY: pidfd_send_signal on our pidfd with no siginfo.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    sig as libc::c_int,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
            continue;
        }
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => std::process::exit(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                for s in sockets {
                    remove_socket(s);
                }
                let why = if sig == Signal::SIGSYS {
                    " (a system call outside its seccomp allow-list)"
                } else {
                    ""
                };
                eprintln!("volfsd: the sandboxed daemon was killed by {sig}{why}");
                std::process::exit(1);
            }
            _ => {}
        }
    }
}
