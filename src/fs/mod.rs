//! The filesystem stack served to the guest, assembled from small layers:
//!
//! ```text
//! ReadOnlyGuard    refuses mutations on read-only shares with EROFS      (readonly.rs)
//!   VolumeFs       the virtual root listing only the attached shares   (volumes.rs)
//!     PassthroughFs  fd-relative host syscalls inside each share       (passthrough.rs)
//!       InodeStore / HandleStore  node ids and open handles            (inodes.rs, handles.rs)
//! ```
//! Each share is reached through a private mount of its directory, read-only for a
//! read-only share (share_root.rs).
//! ```text
//! ```
//! Requests that fuse-backend-rs's server does not decode (COPY_FILE_RANGE, SYNCFS,
//! TMPFILE) reach the stack through [`ExtraOps`] (see `extra_ops.rs`).

pub mod extra_ops;
pub mod handles;
pub mod inodes;
pub mod locks;
pub mod names;
pub mod passthrough;
pub mod readonly;
pub mod reply;
pub mod server;
pub mod session;
pub mod share;
pub mod share_root;
pub mod sys;
pub mod volumes;
pub mod xattrs;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, OpenOptions};
use fuse_backend_rs::api::filesystem::{Context, Entry};

pub use passthrough::{PassthroughConfig, PassthroughFs};
pub use readonly::ReadOnlyGuard;
pub use server::{FsServer, RequestError};
pub use session::Limits;
pub use share_root::{resolve_share_path, SharePath};
pub use volumes::{AttachError, ShareInfo, ShareSpec, VolumeFs};

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
    /// Counts a request on `nodeid` that failed (for the per-volume error counter).
    fn note_error(&self, nodeid: u64);
}

impl ShareOf for PassthroughFs {
    fn is_read_only(&self, nodeid: u64) -> bool {
        PassthroughFs::is_read_only(self, nodeid)
    }

    fn note_error(&self, nodeid: u64) {
        PassthroughFs::note_error(self, nodeid)
    }
}

/// The stack volfsd serves.
pub type VolFs = ReadOnlyGuard<VolumeFs>;

/// Builds the stack for `shared_dir`: the whole directory when `shares` is None, else a
/// virtual root with these shares attached (`--readonly` makes every share read-only).
pub fn build(
    shared_dir: &Path,
    shares: Option<&[ShareSpec]>,
    readonly: bool,
    cfg: PassthroughConfig,
) -> io::Result<Arc<VolFs>> {
    let volumes = match shares {
        None => VolumeFs::whole(shared_dir, readonly, cfg)?,
        Some(specs) => {
            let v = VolumeFs::volumes(shared_dir, cfg)?;
            if readonly {
                v.force_read_only();
            }
            for spec in specs {
                v.attach(spec).map_err(|e| match e {
                    AttachError::Io(e) => e,
                    other => io::Error::other(other.to_string()),
                })?;
            }
            v
        }
    };
    Ok(Arc::new(ReadOnlyGuard::new(volumes)))
}
