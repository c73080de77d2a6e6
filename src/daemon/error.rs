//! What the daemon's start-up (or its one frontend) failed at: the step, the socket,
//! flag or path it concerned, and the error of the module that failed. `main` prints
//! it as `volfsd: {error}` and exits 1.

use std::fmt;
use std::path::PathBuf;

use crate::control::ControlError;
use crate::error::HostError;
use crate::logging::LogError;
use crate::sandbox::SandboxError;

/// An error that ends the daemon.
#[derive(Debug)]
pub enum DaemonError {
    Sandbox(SandboxError),
    Logging(LogError),
    Control(ControlError),
    /// `--upgradable`: the keeper could not be started.
    Keeper(crate::keeper::Error),
    /// The session region the keeper passed (`src/region/`).
    Region(crate::region::RegionError),
    /// The guest's session a killed serving process recorded could not be loaded.
    Recover(crate::device::state_transfer::TransferError),
    /// A host call on the vhost-user socket failed. `socket`: `--socket-path P`,
    /// `--fd N`, or the path of a socket file; `step`: None for the call that names
    /// it (stat, fstat).
    Socket {
        socket: String,
        step: Option<String>,
        source: HostError,
    },
    /// The vhost-user socket is not what it must be (`why`: "exists and is not a
    /// socket", "not a socket", "no file name", "NUL in name").
    BadSocket {
        socket: String,
        why: &'static str,
    },
    /// Binding the vhost-user socket at `path` failed.
    Listen {
        path: PathBuf,
        source: vhost::vhost_user::Error,
    },
    /// The file system stack could not be built on SharedDir.
    SharedDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A step of start-up failed (`step`: "blocking SIGUSR1", "starting the state
    /// thread", ...).
    Host {
        step: String,
        source: HostError,
    },
    /// The vhost-user daemon failed at `step` (creating it, accepting the frontend).
    Vhost {
        step: &'static str,
        source: vhost_user_backend::Error,
    },
    /// The thread that starts queue workers is gone.
    WorkerStarterGone,
}

impl DaemonError {
    pub(super) fn host(step: impl Into<String>, source: impl Into<HostError>) -> DaemonError {
        DaemonError::Host {
            step: step.into(),
            source: source.into(),
        }
    }
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonError::Sandbox(e) => write!(f, "{e}"),
            DaemonError::Logging(e) => write!(f, "{e}"),
            DaemonError::Control(e) => write!(f, "{e}"),
            DaemonError::Keeper(e) => write!(f, "--upgradable: starting the keeper: {e}"),
            DaemonError::Region(e) => write!(f, "--upgradable: {e}"),
            DaemonError::Recover(e) => write!(
                f,
                "--upgradable: taking over the session of the killed serving process: {e}"
            ),
            DaemonError::Socket {
                socket,
                step: Some(step),
                source,
            } => write!(f, "{socket}: {step}: {source}"),
            DaemonError::Socket {
                socket,
                step: None,
                source,
            } => write!(f, "{socket}: {source}"),
            DaemonError::BadSocket { socket, why } => write!(f, "{socket}: {why}"),
            DaemonError::Listen { path, source } => {
                write!(f, "--socket-path {}: {source}", path.display())
            }
            DaemonError::SharedDir { path, source } => {
                write!(f, "--shared-dir {}: {source}", path.display())
            }
            DaemonError::Host { step, source } => write!(f, "{step}: {source}"),
            DaemonError::Vhost { step, source } => write!(f, "{step}: {source}"),
            DaemonError::WorkerStarterGone => {
                write!(f, "the thread that starts queue workers is gone")
            }
        }
    }
}

impl std::error::Error for DaemonError {}

impl From<SandboxError> for DaemonError {
    fn from(e: SandboxError) -> Self {
        DaemonError::Sandbox(e)
    }
}

impl From<LogError> for DaemonError {
    fn from(e: LogError) -> Self {
        DaemonError::Logging(e)
    }
}

impl From<ControlError> for DaemonError {
    fn from(e: ControlError) -> Self {
        DaemonError::Control(e)
    }
}
