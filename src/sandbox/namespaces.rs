//! New namespaces for the daemon, and the supervisor left outside them.
//!
//! A new pid namespace applies only to children, so the process that unshares it
//! forks: the child is pid 1 of the new namespace and serves; the parent stays in
//! the host's namespaces as a small supervisor (as virtiofsd does). It forwards
//! SIGTERM/SIGINT/SIGHUP, exits with the child's status, and removes the sockets if
//! the child could not. The child dies with it (PR_SET_PDEATHSIG).
//!
//! Started by a non-root user, the parent first unshares a user namespace in which
//! that user is root, which makes the mount work below possible without privilege on
//! the host (virtiofsd's unprivileged mode). When the user has subordinate ids
//! (/etc/subuid, /etc/subgid) and newuidmap/newgidmap are installed, ids 1.. inside
//! map to them, so the guest can own files as other users (chown works); otherwise
//! only the user's own id is mapped, and the guest's chown to another id fails
//! with EINVAL.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

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
/// parent when the child dies without removing them itself; the parent closes its
/// copies of the `listening` fds at once, so that only the child serves them.
pub fn enter(
    ids: Ids,
    seccomp_mode: SeccompMode,
    sockets: Vec<PathBuf>,
    listening: &[RawFd],
) -> Result<(), String> {
    let mut flags = CloneFlags::CLONE_NEWPID;
    if !ids.is_root() {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    let ranges = if ids.is_root() {
        None
    } else {
        SubordinateIds::of(ids)
    };
    // newuidmap must run outside the new user namespace: a helper forked before it.
    let mapper = match &ranges {
        Some(r) => Some(MapHelper::fork(ids, r)?),
        None => None,
    };
    unshare(flags).map_err(|e| {
        let hint = if ids.is_root() {
            ""
        } else {
            " (unprivileged user namespaces may be disabled: kernel.unprivileged_userns_clone, user.max_user_namespaces)"
        };
        format!("sandbox: unshare({flags:?}): {e}{hint}")
    })?;
    match mapper {
        Some(m) => m.map()?,
        None if !ids.is_root() => map_to_root(ids)?,
        None => {}
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
        ForkResult::Parent { child } => {
            for &fd in listening {
                // SAFETY: the parent never uses these fds again: it only supervises.
                unsafe { libc::close(fd) };
            }
            supervise(child, forwarded, seccomp_mode, &sockets)
        }
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

/// The user's subordinate id ranges, usable when newuidmap and newgidmap exist.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct SubordinateIds {
    pub uids: (u32, u32),
    pub gids: (u32, u32),
}

const NEWUIDMAP: &str = "/usr/bin/newuidmap";
const NEWGIDMAP: &str = "/usr/bin/newgidmap";

impl SubordinateIds {
    fn of(ids: Ids) -> Option<SubordinateIds> {
        if !Path::new(NEWUIDMAP).exists() || !Path::new(NEWGIDMAP).exists() {
            return None;
        }
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(ids.uid))
            .ok()
            .flatten()
            .map(|u| u.name);
        let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(ids.gid))
            .ok()
            .flatten()
            .map(|g| g.name);
        let uids = std::fs::read_to_string("/etc/subuid").ok()?;
        let gids = std::fs::read_to_string("/etc/subgid").ok()?;
        Some(SubordinateIds {
            uids: range_for(&uids, user.as_deref(), ids.uid)?,
            gids: range_for(&gids, group.as_deref().or(user.as_deref()), ids.gid)?,
        })
    }
}

/// The first `name:start:count` (or `id:start:count`) line of a subid file for the
/// given owner.
pub fn range_for(file: &str, name: Option<&str>, id: u32) -> Option<(u32, u32)> {
    let id = id.to_string();
    file.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        let (owner, start, count) = (f.next()?, f.next()?, f.next()?);
        if owner != id && Some(owner) != name {
            return None;
        }
        let (start, count) = (start.parse().ok()?, count.parse().ok()?);
        (count > 0).then_some((start, count))
    })
}

/// A child forked before the user namespace exists, which runs newuidmap and
/// newgidmap on the parent once the parent has unshared it.
struct MapHelper {
    pid: Pid,
    go: std::os::fd::OwnedFd,
}

impl MapHelper {
    fn fork(ids: Ids, r: &SubordinateIds) -> Result<MapHelper, String> {
        let (wait, go) = nix::unistd::pipe().map_err(|e| format!("sandbox: pipe: {e}"))?;
        let parent = std::process::id().to_string();
        let uid_args = [
            parent.clone(),
            "0".into(),
            ids.uid.to_string(),
            "1".into(),
            "1".into(),
            r.uids.0.to_string(),
            r.uids.1.to_string(),
        ];
        let gid_args = [
            parent,
            "0".into(),
            ids.gid.to_string(),
            "1".into(),
            "1".into(),
            r.gids.0.to_string(),
            r.gids.1.to_string(),
        ];
        // SAFETY: single-threaded here (the sandbox is entered first thing).
        match unsafe { fork() }.map_err(|e| format!("sandbox: fork: {e}"))? {
            ForkResult::Child => {
                drop(go);
                let mut byte = [0u8; 1];
                let ready = nix::unistd::read(wait.as_raw_fd(), &mut byte).map(|n| n == 1);
                if ready != Ok(true) {
                    std::process::exit(2);
                }
                for (tool, args) in [(NEWUIDMAP, &uid_args), (NEWGIDMAP, &gid_args)] {
                    match std::process::Command::new(tool).args(args.iter()).status() {
                        Ok(s) if s.success() => {}
                        Ok(s) => {
                            eprintln!("volfsd: sandbox: {tool} {}: {s}", args.join(" "));
                            std::process::exit(1);
                        }
                        Err(e) => {
                            eprintln!("volfsd: sandbox: {tool}: {e}");
                            std::process::exit(1);
                        }
                    }
                }
                std::process::exit(0);
            }
            ForkResult::Parent { child } => Ok(MapHelper { pid: child, go }),
        }
    }

    /// Lets the helper map the ids and waits for it.
    fn map(self) -> Result<(), String> {
        nix::unistd::write(&self.go, &[1u8])
            .map_err(|e| format!("sandbox: waking the id-map helper: {e}"))?;
        match waitpid(self.pid, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            other => Err(format!(
                "sandbox: mapping subordinate ids with newuidmap/newgidmap failed ({other:?}); \
                 see the message above"
            )),
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
/// It signals the daemon through a pidfd opened before its filter, which allows no
/// other way to name a process: it can signal nothing else.
fn supervise(child: Pid, signals: SigSet, seccomp_mode: SeccompMode, sockets: &[PathBuf]) -> ! {
    // SAFETY: pidfd_open of our own child; the fd is owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0) };
    let confined = if pidfd < 0 {
        Err(format!("pidfd_open: {}", io::Error::last_os_error()))
    } else {
        caps::lock_down_process()
    }
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
            // SAFETY: pidfd_send_signal on our pidfd with no siginfo.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd as libc::c_int,
                    sig as libc::c_int,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
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

/// Removes a socket left behind (by a dead child, or a set-up that failed after the
/// bind); never any other kind of file.
pub fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subordinate_ranges_by_name_or_id() {
        let f = "alice:100000:65536\n1001:200000:1000\nbob:300000:0\n";
        assert_eq!(range_for(f, Some("alice"), 1000), Some((100000, 65536)));
        assert_eq!(range_for(f, Some("carol"), 1001), Some((200000, 1000)));
        assert_eq!(
            range_for(f, Some("bob"), 1002),
            None,
            "an empty range is none"
        );
        assert_eq!(range_for(f, None, 7), None);
    }
}
