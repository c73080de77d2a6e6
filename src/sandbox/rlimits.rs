//! Resource limits: no core dumps (guest data and keys never land on disk), and an
//! open-file limit sized for the hostile-guest limits (fs/limits.rs).
//!
//! "No new processes" is not an rlimit here: RLIMIT_NPROC counts threads too and
//! does not apply to root at all. The seccomp filters enforce it instead: `clone`
//! only with CLONE_THREAD, no fork, vfork or execve (seccomp/); in namespace mode
//! the daemon is also pid 1 of its own pid namespace.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

use super::SandboxError;

/// RLIMIT_CORE 0, soft and hard.
pub fn no_core_dumps() -> Result<(), SandboxError> {
    setrlimit(Resource::RLIMIT_CORE, 0, 0)
        .map_err(|e| SandboxError::host("setrlimit(RLIMIT_CORE, 0)", e))
}

/// `--rlimit-nofile`: 0 leaves the limit alone, N sets it, and by default it is
/// raised to fs.nr_open where the daemon may (as virtiofsd does): each guest node id
/// holds one fd. The guest's share is bounded by the per-volume limits and the fd
/// budget (fs/limits.rs), which reads the limit this sets.
pub fn set_nofile(requested: Option<u64>) -> Result<(), SandboxError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| SandboxError::host("getrlimit(RLIMIT_NOFILE)", e))?;
    let (new_soft, new_hard) = match requested {
        Some(0) => return Ok(()),
        Some(n) => (n, n.max(hard)),
        None => {
            let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(hard);
            let want = nr_open.max(hard);
            if want > hard && setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok() {
                return Ok(());
            }
            // Without CAP_SYS_RESOURCE the hard limit stays.
            (hard, hard)
        }
    };
    if new_soft == soft && new_hard == hard {
        return Ok(());
    }
    setrlimit(Resource::RLIMIT_NOFILE, new_soft, new_hard)
        .map_err(|e| SandboxError::host(format!("--rlimit-nofile {new_soft}"), e))
}
