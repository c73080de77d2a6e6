//! New namespaces for the daemon; the supervisor left outside them is
//! `supervisor.rs`.
//!
//! A new pid namespace applies only to children, so the process that unshares it
//! forks: the child is pid 1 of the new namespace and serves; the parent stays in
//! the host's namespaces as a small supervisor (as virtiofsd does). It forwards
//! SIGTERM/SIGINT/SIGHUP, exits with the child's status, and removes the sockets if
//! the child could not. The child dies with it (PR_SET_PDEATHSIG). Right after the
//! fork the parent executes a tiny program of its own (or this binary afresh: see
//! `supervisor::start`), so that it holds none of the memory the daemon touched
//! before the fork.
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
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::supervisor::{forwarded_and_sigchld, SUPERVISOR_CONFINED};
use super::{SandboxError, SeccompMode};

/// One line of a user namespace's uid_map or gid_map: `count` ids from `inside`
/// are the host's ids from `outside`.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

impl IdRange {
    /// virtiofsd's `--uid-map`/`--gid-map` form: `:INSIDE:OUTSIDE:COUNT:`.
    pub fn parse(flag: &str, s: &str) -> Result<IdRange, SandboxError> {
        let fields: Vec<&str> = s.split(':').collect();
        let bad = |zero_count| SandboxError::BadIdRange {
            flag: flag.to_string(),
            value: s.to_string(),
            zero_count,
        };
        match fields[..] {
            ["", inside, outside, count, ""] => {
                let n = |v: &str| v.parse::<u32>().map_err(|_| bad(false));
                let r = IdRange {
                    inside: n(inside)?,
                    outside: n(outside)?,
                    count: n(count)?,
                };
                if r.count == 0 {
                    return Err(bad(true));
                }
                Ok(r)
            }
            _ => Err(bad(false)),
        }
    }

    fn args(ranges: &[IdRange]) -> Vec<String> {
        ranges
            .iter()
            .flat_map(|r| [r.inside, r.outside, r.count])
            .map(|v| v.to_string())
            .collect()
    }
}

/// The id maps of the user namespace an unprivileged daemon makes: given by
/// `--uid-map`/`--gid-map` (libvirt's session mode), else the user's own ids as
/// root plus their subordinate ids, else the own ids alone.
#[derive(Clone, Debug, Default, Eq, PartialEq)]
pub struct IdMaps {
    pub uids: Vec<IdRange>,
    pub gids: Vec<IdRange>,
}

impl IdMaps {
    pub fn is_empty(&self) -> bool {
        self.uids.is_empty() && self.gids.is_empty()
    }

    /// Only the caller's own ids, which the kernel lets it map without a helper.
    fn own_ids_only(&self, ids: Ids) -> bool {
        let own = |r: &[IdRange], id| matches!(r, [one] if one.outside == id && one.count == 1);
        own(&self.uids, ids.uid) && own(&self.gids, ids.gid)
    }

    fn with_subordinates(ids: Ids, subordinate: &SubordinateIds) -> IdMaps {
        let own = |id| IdRange {
            inside: 0,
            outside: id,
            count: 1,
        };
        let sub = |(start, count)| IdRange {
            inside: 1,
            outside: start,
            count,
        };
        IdMaps {
            uids: vec![own(ids.uid), sub(subordinate.uids)],
            gids: vec![own(ids.gid), sub(subordinate.gids)],
        }
    }
}

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
    maps: &IdMaps,
    seccomp_mode: SeccompMode,
    sockets: Vec<PathBuf>,
    listening: &[RawFd],
) -> Result<(), SandboxError> {
    let mut flags = CloneFlags::CLONE_NEWPID;
    if !ids.is_root() {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    if ids.is_root() && !maps.is_empty() {
        return Err(SandboxError::MapsAsRoot);
    }
    let plan = if ids.is_root() {
        None
    } else if !maps.is_empty() {
        Some(maps.clone())
    } else {
        SubordinateIds::of(ids).map(|sub| IdMaps::with_subordinates(ids, &sub))
    };
    // newuidmap must run outside the new user namespace: a helper forked before it.
    // Maps of the caller's own ids alone are written directly.
    let mapper = match &plan {
        Some(m) if !m.own_ids_only(ids) => Some(MapHelper::fork(m)?),
        _ => None,
    };
    unshare(flags).map_err(|errno| SandboxError::Unshare {
        flags,
        errno,
        unprivileged: !ids.is_root(),
    })?;
    match (mapper, &plan) {
        (Some(m), _) => m.map()?,
        (None, Some(p)) => write_own_maps(p)?,
        (None, None) if !ids.is_root() => write_own_maps(&IdMaps {
            uids: vec![IdRange {
                inside: 0,
                outside: ids.uid,
                count: 1,
            }],
            gids: vec![IdRange {
                inside: 0,
                outside: ids.gid,
                count: 1,
            }],
        })?,
        (None, None) => {}
    }
    // Forwarded signals are blocked before the fork so none is lost in between; the
    // child restores its mask.
    let forwarded = forwarded_and_sigchld();
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&forwarded), Some(&mut old))
        .map_err(|e| SandboxError::host("sandbox: blocking signals", e))?;
    // The supervisor writes a byte once it is confined; the child reads it before it
    // serves (see `await_supervisor`).
    let (confined_rx, confined_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| SandboxError::host("sandbox: pipe", e))?;
    // SAFETY: no other thread exists yet (the sandbox is entered first thing), so the
    // child may run any code.
    match unsafe { fork() }.map_err(|e| SandboxError::host("sandbox: fork", e))? {
        ForkResult::Parent { child } => {
            for &fd in listening {
                // SAFETY: the parent never uses these fds again: it only supervises.
                unsafe { libc::close(fd) };
            }
            drop(confined_rx);
            super::supervisor::start(child, forwarded, seccomp_mode, &sockets, confined_tx)
        }
        ForkResult::Child => {
            drop(confined_tx);
            if let Ok(mut fd) = SUPERVISOR_CONFINED.lock() {
                *fd = Some(confined_rx);
            }
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } < 0 {
                return Err(SandboxError::host(
                    "sandbox: prctl(PR_SET_PDEATHSIG)",
                    io::Error::last_os_error(),
                ));
            }
            // The parent is outside the pid namespace: 0 while it lives.
            if nix::unistd::getppid().as_raw() != 0 {
                return Err(SandboxError::SupervisorGone);
            }
            nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None)
                .map_err(|e| SandboxError::host("sandbox: restoring the signal mask", e))?;
            let flags = CloneFlags::CLONE_NEWNS
                | CloneFlags::CLONE_NEWNET
                | CloneFlags::CLONE_NEWIPC
                | CloneFlags::CLONE_NEWUTS;
            unshare(flags).map_err(|errno| SandboxError::Unshare {
                flags,
                errno,
                unprivileged: false,
            })?;
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

pub(super) const NEWUIDMAP: &str = "/usr/bin/newuidmap";
pub(super) const NEWGIDMAP: &str = "/usr/bin/newgidmap";

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
    fn fork(maps: &IdMaps) -> Result<MapHelper, SandboxError> {
        if !Path::new(NEWUIDMAP).exists() || !Path::new(NEWGIDMAP).exists() {
            return Err(SandboxError::NoMapTools);
        }
        let (wait, go) = nix::unistd::pipe().map_err(|e| SandboxError::host("sandbox: pipe", e))?;
        let parent = std::process::id().to_string();
        let mut uid_args = vec![parent.clone()];
        uid_args.extend(IdRange::args(&maps.uids));
        let mut gid_args = vec![parent];
        gid_args.extend(IdRange::args(&maps.gids));
        // SAFETY: single-threaded here (the sandbox is entered first thing).
        match unsafe { fork() }.map_err(|e| SandboxError::host("sandbox: fork", e))? {
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
    fn map(self) -> Result<(), SandboxError> {
        nix::unistd::write(&self.go, &[1u8])
            .map_err(|e| SandboxError::host("sandbox: waking the id-map helper", e))?;
        match waitpid(self.pid, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            other => Err(SandboxError::MapToolsFailed {
                status: format!("{other:?}"),
            }),
        }
    }
}

/// Maps the kernel lets a process write for itself: its own uid and gid (each a
/// single range of one id), with setgroups denied as it requires.
fn write_own_maps(maps: &IdMaps) -> Result<(), SandboxError> {
    let write = |file: &str, what: String| {
        std::fs::write(format!("/proc/self/{file}"), &what).map_err(|e| {
            let step = format!("sandbox: writing '{}' to /proc/self/{file}", what.trim());
            SandboxError::host(step, e)
        })
    };
    let lines = |r: &[IdRange]| {
        r.iter()
            .map(|r| format!("{} {} {}\n", r.inside, r.outside, r.count))
            .collect::<String>()
    };
    // An unprivileged process may write a gid map only with setgroups denied.
    write("setgroups", "deny\n".to_string())?;
    write("uid_map", lines(&maps.uids))?;
    write("gid_map", lines(&maps.gids))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_map_flags_as_virtiofsd_spells_them() {
        let r = IdRange::parse("--uid-map", ":1:100000:65536:").unwrap();
        assert_eq!(
            r,
            IdRange {
                inside: 1,
                outside: 100000,
                count: 65536
            }
        );
        for bad in ["1:2:3", ":1:2:", ":a:2:3:", ":1:2:0:", ":1:2:3:4:"] {
            let e = IdRange::parse("--uid-map", bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--uid-map {bad}")), "{e}");
        }
        let ids = Ids {
            uid: 1000,
            gid: 100,
        };
        let own = IdMaps {
            uids: vec![IdRange::parse("--uid-map", ":0:1000:1:").unwrap()],
            gids: vec![IdRange::parse("--gid-map", ":0:100:1:").unwrap()],
        };
        assert!(own.own_ids_only(ids));
        let sub = IdMaps::with_subordinates(
            ids,
            &SubordinateIds {
                uids: (100000, 65536),
                gids: (100000, 65536),
            },
        );
        assert!(!sub.own_ids_only(ids));
        assert_eq!(
            IdRange::args(&sub.uids),
            ["0", "1000", "1", "1", "100000", "65536"]
        );
    }

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
