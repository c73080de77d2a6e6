//! The stack's options the command line chooses: the guest cache policy and when
//! POSIX ACLs are negotiated.

use std::time::Duration;

/// The guest cache policy (`--cache`).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum CacheMode {
    /// Nothing cached in the guest: timeouts 0, direct I/O on every open.
    None,
    /// virtiofsd's `auto`: 1 s timeouts, page cache invalidated on change.
    Auto,
    /// virtiofsd's `always`: long timeouts, cached pages and directories kept.
    Always,
    /// virtiofsd's `metadata`: long timeouts and cached directories, file data never
    /// cached (direct I/O on every file open).
    Metadata,
}

impl CacheMode {
    pub fn timeout(self) -> Duration {
        match self {
            CacheMode::None => Duration::ZERO,
            CacheMode::Auto => Duration::from_secs(1),
            CacheMode::Always | CacheMode::Metadata => Duration::from_secs(86400),
        }
    }
}

/// When POSIX ACLs are negotiated with the guest (`--posix-acl`).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum AclMode {
    Never,
    /// When the guest kernel offers them.
    Auto,
    /// A guest kernel that does not offer them fails FUSE INIT (EPROTO).
    Always,
}
