//! New namespaces for the daemon, and the supervisor left outside them.
//!
//! A new pid namespace applies only to children, so the process that unshares it
//! forks: the child is pid 1 of the new namespace and serves; the parent stays in
//! the host's namespaces as a small supervisor (as virtiofsd does). It forwards
//! SIGTERM/SIGINT/SIGHUP, exits with the child's status, and removes the sockets if
//! the child could not. The child dies with it (PR_SET_PDEATHSIG).
//!
//! Started by a non-root user, the parent first unshares a user namespace that maps
//! that user to root inside (one id, no helper binaries), which makes the mount work
//! below possible without privilege on the host.

use std::io;
use std::path::PathBuf;

use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::{caps, seccomp, SeccompMode, ThreadRole};

/// Signals the supervisor passes on to the daemon.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Who is asking for the sandbox.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

impl Ids {
    pub fn current() -> Ids {
        Ids {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        }
    }

    pub fn is_root(self) -> bool {
        self.uid == 0
    }
}

/// Unshares the user namespace (unprivileged only) and the pid namespace, forks, and
/// returns in the child only, after it unshared the mount, net, ipc and uts
/// namespaces. The parent supervises and never returns. `sockets` are removed by the
/// parent when the child dies without removing them itself.
pub fn enter(ids: Ids, seccomp_mode: SeccompMode, sockets: Vec<PathBuf>) -> Result<(), String> {
    let mut flags = CloneFlags::CLONE_NEWPID;
    if !ids.is_root() {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    unshare(flags).map_err(|e| {
        let hint = if ids.is_root() {
            ""
        } else {
            " (unprivileged user namespaces may be disabled: kernel.unprivileged_userns_clone, user.max_user_namespaces)"
        };
        format!("sandbox: unshare({flags:?}): {e}{hint}")
    })?;
    if !ids.is_root() {
        map_to_root(ids)?;
    }
    // Forwarded signals are blocked before the fork so none is lost in between; the
    // child restores its mask.
    let mut forwarded = SigSet::empty();
    for s in FORWARDED {
        forwarded.add(s);
    }
    forwarded.add(Signal::SIGCHLD);
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&forwarded), Some(&mut old))
        .map_err(|e| format!("sandbox: blocking signals: {e}"))?;
    // SAFETY: no other thread exists yet (the sandbox is entered first thing), so the
    // child may run any code.
    match unsafe { fork() }.map_err(|e| format!("sandbox: fork: {e}"))? {
        ForkResult::Parent { child } => supervise(child, forwarded, seccomp_mode, &sockets),
        ForkResult::Child => {
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } < 0 {
                return Err(format!(
                    "sandbox: prctl(PR_SET_PDEATHSIG): {}",
                    io::Error::last_os_error()
                ));
            }
            // The parent is outside the pid namespace: 0 while it lives.
            if nix::unistd::getppid().as_raw() != 0 {
                return Err("sandbox: the supervisor exited during setup".to_string());
            }
            nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None)
                .map_err(|e| format!("sandbox: restoring the signal mask: {e}"))?;
            let flags = CloneFlags::CLONE_NEWNS
                | CloneFlags::CLONE_NEWNET
                | CloneFlags::CLONE_NEWIPC
                | CloneFlags::CLONE_NEWUTS;
            unshare(flags).map_err(|e| format!("sandbox: unshare({flags:?}): {e}"))?;
            Ok(())
        }
    }
}

/// One-id maps: the calling user and group become root inside the namespace.
fn map_to_root(ids: Ids) -> Result<(), String> {
    let write = |file: &str, what: String| {
        std::fs::write(format!("/proc/self/{file}"), &what).map_err(|e| {
            format!(
                "sandbox: writing '{}' to /proc/self/{file}: {e}",
                what.trim()
            )
        })
    };
    // An unprivileged process may write a gid map only with setgroups denied.
    write("setgroups", "deny\n".to_string())?;
    write("uid_map", format!("0 {} 1\n", ids.uid))?;
    write("gid_map", format!("0 {} 1\n", ids.gid))?;
    Ok(())
}

/// The supervisor: confined to waiting, forwarding signals and removing the sockets.
fn supervise(child: Pid, signals: SigSet, seccomp_mode: SeccompMode, sockets: &[PathBuf]) -> ! {
    let confined = caps::lock_down_process()
        .and_then(|()| {
            caps::restrict_thread(caps::CapSet::EMPTY)
                .map_err(|e| format!("dropping capabilities: {e}"))
        })
        .and_then(|()| seccomp::apply(ThreadRole::Supervisor, seccomp_mode));
    if let Err(e) = confined {
        eprintln!("volfsd: sandbox supervisor: {e}");
        let _ = kill(child, Signal::SIGKILL);
        std::process::exit(1);
    }
    loop {
        let sig = match signals.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        if sig != Signal::SIGCHLD {
            let _ = kill(child, sig);
            continue;
        }
        match waitpid(child, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
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

/// Removes a socket the dead child left; never any other kind of file.
fn remove_socket(path: &PathBuf) {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
}
