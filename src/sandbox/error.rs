//! What a sandbox step failed at: the step (the system call and its arguments, the
//! flag, the thread role) and the host's error.

use std::fmt;

use nix::errno::Errno;
use nix::sched::CloneFlags;

use super::{SandboxMode, ThreadRole};
use crate::error::HostError;

/// An error of the sandbox: the daemon exits 1 on it, never carrying on unconfined.
#[derive(Debug)]
pub enum SandboxError {
    /// A host call failed; `step` names it (most start with `sandbox: `).
    Host { step: String, source: HostError },
    /// unshare(2) of `flags` failed; `unprivileged`: a user namespace was asked for by
    /// a non-root user (the message hints at the sysctls that disable it).
    Unshare {
        flags: CloneFlags,
        errno: Errno,
        unprivileged: bool,
    },
    /// `--uid-map`/`--gid-map` with a `--sandbox` that makes no user namespace.
    MapsNeedNamespace { mode: SandboxMode },
    /// `--uid-map`/`--gid-map` when running as root, where no user namespace is made.
    MapsAsRoot,
    /// `--sandbox chroot` when not root.
    ChrootNeedsRoot { uid: u32 },
    /// A `--uid-map`/`--gid-map` value that is not `:INSIDE:OUTSIDE:COUNT:` or maps
    /// nothing.
    BadIdRange {
        flag: String,
        value: String,
        zero_count: bool,
    },
    /// Maps beyond the own ids without newuidmap/newgidmap installed.
    NoMapTools,
    /// newuidmap/newgidmap failed (`status`: how the helper ended).
    MapToolsFailed { status: String },
    /// The supervisor died before the child was set up.
    SupervisorGone,
    /// mallopt refused the arena limit.
    Mallopt { arenas: i32 },
    /// A seccomp filter could not be compiled.
    Filter(FilterError),
    /// A compiled filter could not be installed (`step`: which one).
    Seccomp {
        step: &'static str,
        source: seccompiler::Error,
    },
    /// Confining a thread for `role` failed.
    Thread {
        role: ThreadRole,
        source: Box<SandboxError>,
    },
}

/// A seccomp filter that does not compile: which one and why (kept per process, so
/// it can be cloned).
#[derive(Clone, Debug)]
pub struct FilterError {
    /// `Worker filter`, `clone3 filter`, ...
    pub filter: String,
    pub why: String,
}

impl SandboxError {
    /// A host call of `step` failed.
    pub fn host(step: impl Into<String>, source: impl Into<HostError>) -> SandboxError {
        SandboxError::Host {
            step: step.into(),
            source: source.into(),
        }
    }
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::Host { step, source } => write!(f, "{step}: {source}"),
            SandboxError::Unshare {
                flags,
                errno,
                unprivileged,
            } => {
                write!(f, "sandbox: unshare({flags:?}): {errno}")?;
                if *unprivileged {
                    write!(
                        f,
                        " (unprivileged user namespaces may be disabled: \
                         kernel.unprivileged_userns_clone, user.max_user_namespaces)"
                    )?;
                }
                Ok(())
            }
            SandboxError::MapsNeedNamespace { mode } => write!(
                f,
                "--uid-map/--gid-map need --sandbox namespace (they map ids into its user \
                 namespace), not --sandbox {mode:?}"
            ),
            SandboxError::MapsAsRoot => write!(
                f,
                "--uid-map/--gid-map map ids into the user namespace of an unprivileged \
                 daemon; running as root, volfsd makes none"
            ),
            SandboxError::ChrootNeedsRoot { uid } => write!(
                f,
                "--sandbox chroot needs root (running as uid {uid}); use --sandbox namespace, \
                 which works unprivileged in a user namespace"
            ),
            SandboxError::BadIdRange {
                flag,
                value,
                zero_count: true,
            } => write!(f, "{flag} {value}: a count of 0 maps nothing"),
            SandboxError::BadIdRange { flag, value, .. } => {
                write!(f, "{flag} {value}: expected :NAMESPACE_ID:HOST_ID:COUNT:")
            }
            SandboxError::NoMapTools => write!(
                f,
                "sandbox: mapping more than the own ids needs {} and {} (Debian package \
                 uidmap)",
                super::namespaces::NEWUIDMAP,
                super::namespaces::NEWGIDMAP
            ),
            SandboxError::MapToolsFailed { status } => write!(
                f,
                "sandbox: mapping subordinate ids with newuidmap/newgidmap failed ({status}); \
                 see the message above"
            ),
            SandboxError::SupervisorGone => {
                write!(f, "sandbox: the supervisor exited during setup")
            }
            SandboxError::Mallopt { arenas } => write!(f, "mallopt(M_ARENA_MAX, {arenas}) failed"),
            SandboxError::Filter(e) => write!(f, "{e}"),
            SandboxError::Seccomp { step, source } => write!(f, "{step}: {source}"),
            SandboxError::Thread { role, source } => write!(f, "{role:?} thread: {source}"),
        }
    }
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.filter, self.why)
    }
}

impl std::error::Error for SandboxError {}

impl From<FilterError> for SandboxError {
    fn from(e: FilterError) -> Self {
        SandboxError::Filter(e)
    }
}
