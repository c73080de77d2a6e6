//! The filesystem stack served to the guest, assembled from small layers:
//!
//! ```text
//! ReadOnlyGuard  refuses mutations on read-only shares with EROFS   (readonly.rs)
//!   PassthroughFs  fd-relative host syscalls inside the shares       (passthrough.rs)
//!     InodeStore / HandleStore  node ids and open handles            (inodes.rs, handles.rs)
//! ```
//! Requests that fuse-backend-rs's server does not decode (COPY_FILE_RANGE, SYNCFS,
//! TMPFILE) reach the stack through [`ExtraOps`] (see `extra_ops.rs`).

pub mod extra_ops;
pub mod handles;
pub mod inodes;
pub mod passthrough;
pub mod readonly;
pub mod server;
pub mod share;
pub mod sys;

use std::io;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, OpenOptions};
use fuse_backend_rs::api::filesystem::{Context, Entry};

pub use passthrough::{PassthroughConfig, PassthroughFs};
pub use readonly::ReadOnlyGuard;
pub use server::{FsServer, RequestError};

/// The guest cache policy (`--cache`).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum CacheMode {
    /// Nothing cached in the guest: timeouts 0, direct I/O on every open.
    None,
    /// virtiofsd's `auto`: 1 s timeouts, page cache invalidated on change.
    Auto,
    /// virtiofsd's `always`: long timeouts, cached pages and directories kept.
    Always,
}

impl CacheMode {
    pub fn timeout(self) -> Duration {
        match self {
            CacheMode::None => Duration::ZERO,
            CacheMode::Auto => Duration::from_secs(1),
            CacheMode::Always => Duration::from_secs(86400),
        }
    }
}

/// FUSE requests outside fuse-backend-rs's `FileSystem` trait.
pub trait ExtraOps {
    /// FUSE_TMPFILE: an unnamed file in `parent`, opened; replied like CREATE.
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        args: CreateIn,
    ) -> io::Result<(Entry, u64, OpenOptions)>;

    /// FUSE_COPY_FILE_RANGE: returns the bytes copied.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        ctx: &Context,
        nodeid_in: u64,
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize>;

    /// FUSE_SYNCFS on the file system holding `nodeid`.
    fn syncfs(&self, ctx: &Context, nodeid: u64) -> io::Result<()>;
}

/// Tells a policy layer which share a node id belongs to.
pub trait ShareOf {
    fn is_read_only(&self, nodeid: u64) -> bool;
}

impl ShareOf for PassthroughFs {
    fn is_read_only(&self, nodeid: u64) -> bool {
        PassthroughFs::is_read_only(self, nodeid)
    }
}

/// The stack volfsd serves.
pub type VolFs = ReadOnlyGuard<PassthroughFs>;
