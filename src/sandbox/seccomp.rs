//! Per-thread seccomp allow-lists (seccompiler). Placeholder: filled in next.

use super::{SeccompMode, ThreadRole};

/// Installs `role`'s filter on the calling thread.
pub fn apply(_role: ThreadRole, mode: SeccompMode) -> Result<(), String> {
    match mode {
        SeccompMode::None => Ok(()),
        _ => Ok(()),
    }
}
