//! Confinement, on by default: the daemon runs in its own namespaces with SharedDir
//! as its root (`--sandbox`), each thread under a seccomp allow-list for its role
//! (`--seccomp`) and with only the capabilities its role needs, with no core dumps
//! and no way to start a process.
//!
//! Order, in [`enter`] and then the daemon:
//! 0. before any of it, the daemon binds its sockets and connects the log (a launcher
//!    waits for the socket, not for the sandbox; virtiofsd binds first too);
//! 1. namespaces (namespace mode; forks, the parent supervises and closes its copies
//!    of the listening sockets: `namespaces.rs`);
//! 2. what else is needed from outside SharedDir is opened (`/proc/self/fd`);
//! 3. the root changes to SharedDir (`mounts.rs`);
//! 4. rlimits, and process-wide capability lock-down (`caps.rs`) before any thread;
//! 5. every thread is started by the launcher and confines itself for its role
//!    when it starts (`threads.rs`, [`confine_thread`]): capabilities, then seccomp
//!    (`seccomp/`).
//!
//! A step that fails is an error naming it ([`SandboxError`], `error.rs`); the daemon
//! never carries on unconfined.

pub mod caps;
mod error;
pub mod malloc;
pub mod mounts;
pub mod namespaces;
pub mod rlimits;
pub mod seccomp;
pub mod socket_path;
pub mod supervisor;
pub mod threads;
#[cfg(target_arch = "x86_64")]
mod tiny_supervisor;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use error::{FilterError, SandboxError};
pub use namespaces::{IdMaps, IdRange, Ids};

/// `--sandbox`, as in virtiofsd.
#[derive(Clone, Copy, Debug, Eq, PartialEq, clap::ValueEnum)]
pub enum SandboxMode {
    /// New mount, pid, net, ipc and uts namespaces (and a user namespace when not
    /// root), pivot_root into SharedDir (the default).
    Namespace,
    /// chroot into SharedDir, for a launcher that provides the namespaces (root only).
    Chroot,
    /// No namespaces and no root change.
    None,
}

/// `--seccomp`, as in virtiofsd: what a system call outside a thread's allow-list
/// does.
#[derive(Clone, Copy, Debug, Eq, PartialEq, clap::ValueEnum)]
pub enum SeccompMode {
    /// The whole daemon is killed (SIGSYS) (the default).
    Kill,
    /// SIGSYS is delivered; the daemon logs the call and exits 1.
    Trap,
    /// The call is allowed and the kernel logs it (audit, type=1326).
    Log,
    /// No filter.
    None,
}

/// What a thread does, which decides its capabilities and its system calls.
#[derive(Clone, Copy, Debug, Eq, PartialEq, Hash)]
pub enum ThreadRole {
    /// The main thread after setup, and the vhost-user thread it starts (which serves
    /// the frontend's messages: memory tables, vring setup, resets).
    Main,
    /// The queue workers, which run the guest's requests.
    Worker,
    /// The control socket's accept thread and its client threads.
    Control,
    /// A thread blocked in one guest lock wait (SETLKW).
    LockWaiter,
    /// The thread waiting for SIGTERM/SIGINT.
    Signals,
    /// The thread summarising rate-limited log messages.
    Logger,
    /// The namespace mode's supervisor process (outside the namespaces).
    Supervisor,
    /// The thread that saves and loads the guest's session as a device state
    /// (SET_DEVICE_STATE_FD): it reads and writes the VMM's state stream and reopens
    /// the session's files.
    State,
    /// The thread that starts every other thread of the daemon (`threads.rs`): it
    /// may make any call another role makes, so that each thread it starts narrows
    /// that to its own role's list.
    Launcher,
}

impl ThreadRole {
    pub const ALL: [ThreadRole; 9] = [
        ThreadRole::Main,
        ThreadRole::Worker,
        ThreadRole::Control,
        ThreadRole::LockWaiter,
        ThreadRole::Signals,
        ThreadRole::Logger,
        ThreadRole::Supervisor,
        ThreadRole::State,
        ThreadRole::Launcher,
    ];
}

/// How every thread of this process confines itself; set once by the daemon.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub seccomp: SeccompMode,
    /// Whether capabilities are dropped per role (false only in tests that run the
    /// file system stack in-process without a daemon).
    pub drop_caps: bool,
    /// `--allow-privileged-xattrs`: the workers keep CAP_SYS_ADMIN for `trusted.*`.
    pub privileged_xattrs: bool,
    /// `--inode-file-handles` other than `never`: the workers keep
    /// CAP_DAC_READ_SEARCH for `open_by_handle_at`.
    pub file_handles: bool,
}

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Sets the policy; the first call wins.
pub fn set_policy(p: Policy) {
    let _ = POLICY.set(p);
}

thread_local! {
    /// The role the calling thread confined itself for (None: it did not, or it
    /// inherited its creator's).
    static ROLE: std::cell::Cell<Option<ThreadRole>> = const { std::cell::Cell::new(None) };
}

/// The role the calling thread confined itself for.
pub fn current_role() -> Option<ThreadRole> {
    ROLE.with(|r| r.get())
}

/// Tests that install a role's filter without a policy: the role it stands for.
#[cfg(test)]
pub fn set_role_for_test(role: ThreadRole) {
    ROLE.with(|r| r.set(Some(role)));
}

impl ThreadRole {
    /// Whether the daemon cannot run on without this thread (nothing would end it
    /// on SIGTERM, log its summaries, or start its threads): a panic there ends the
    /// process rather than the thread (whose list has no `exit` either).
    pub fn is_essential(self) -> bool {
        matches!(
            self,
            ThreadRole::Signals | ThreadRole::Logger | ThreadRole::Launcher
        )
    }
}

/// Confines the calling thread for `role`. Without a policy set (the file system
/// stack used in-process by tests), it does nothing.
pub fn confine_thread(role: ThreadRole) -> Result<(), SandboxError> {
    ROLE.with(|r| r.set(Some(role)));
    let Some(p) = POLICY.get() else {
        return Ok(());
    };
    let in_thread = |e| SandboxError::Thread {
        role,
        source: Box::new(e),
    };
    if p.drop_caps {
        let kept = |r| caps::kept(r, p.privileged_xattrs, p.file_handles);
        let restricted = match role {
            // The launcher only passes capabilities on: every role's permitted, none
            // effective.
            ThreadRole::Launcher => {
                let all = ThreadRole::ALL
                    .iter()
                    .fold(caps::CapSet::EMPTY, |set, &r| set.union(kept(r)));
                caps::restrict_thread_to(caps::CapSet::EMPTY, all)
            }
            _ => caps::restrict_thread(kept(role)),
        };
        restricted.map_err(|e| in_thread(SandboxError::host("dropping capabilities", e)))?;
    }
    seccomp::apply(role, p.seccomp).map_err(in_thread)
}

/// For threads started late (per client, per lock wait): a thread that cannot be
/// confined must not run, and the daemon must not run on without it.
pub fn confine_thread_or_exit(role: ThreadRole) {
    if let Err(e) = confine_thread(role) {
        // Fatal, once (the process exits): outside the log budget.
        log::error!(target: crate::logging::LIFECYCLE, "{e}");
        eprintln!("volfsd: {e}");
        log::logger().flush();
        std::process::exit(1);
    }
}

/// Step 1 of the module doc. In namespace mode only the forked child returns;
/// `sockets` are the files the supervisor removes if the child dies without doing so.
pub fn enter(
    mode: SandboxMode,
    maps: &IdMaps,
    seccomp_mode: SeccompMode,
    sockets: Vec<PathBuf>,
    listening: &[std::os::fd::RawFd],
) -> Result<(), SandboxError> {
    let ids = Ids::current();
    if mode != SandboxMode::Namespace && !maps.is_empty() {
        return Err(SandboxError::MapsNeedNamespace { mode });
    }
    match mode {
        SandboxMode::Namespace => namespaces::enter(ids, maps, seccomp_mode, sockets, listening),
        SandboxMode::Chroot if !ids.is_root() => {
            Err(SandboxError::ChrootNeedsRoot { uid: ids.uid })
        }
        SandboxMode::Chroot | SandboxMode::None => Ok(()),
    }
}

/// Step 3, once the daemon has bound its sockets: SharedDir becomes the root.
pub fn change_root(mode: SandboxMode, shared_dir: &Path) -> Result<PathBuf, SandboxError> {
    match mode {
        SandboxMode::Namespace => mounts::pivot_into(shared_dir).map(|()| PathBuf::from("/")),
        SandboxMode::Chroot => mounts::chroot_into(shared_dir).map(|()| PathBuf::from("/")),
        SandboxMode::None => Ok(shared_dir.to_path_buf()),
    }
}
