//! What the host answered to a call that failed, for the modules' error enums to carry
//! next to the step: an errno from a `nix` call or an `io::Error` from std, each shown
//! as it shows itself.

use std::fmt;
use std::io;

use nix::errno::Errno;

/// The host's error of one failed call.
#[derive(Debug)]
pub enum HostError {
    /// From a `nix` call ("EPERM: Operation not permitted").
    Errno(Errno),
    /// From std or a raw libc call ("Operation not permitted (os error 1)").
    Io(io::Error),
}

impl HostError {
    /// The last OS error, after a raw libc call failed.
    pub fn last() -> HostError {
        HostError::Io(io::Error::last_os_error())
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Errno(e) => write!(f, "{e}"),
            HostError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for HostError {}

impl From<Errno> for HostError {
    fn from(e: Errno) -> Self {
        HostError::Errno(e)
    }
}

impl From<io::Error> for HostError {
    fn from(e: io::Error) -> Self {
        HostError::Io(e)
    }
}
