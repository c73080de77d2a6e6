//! The file system stack served to the guest, assembled from small layers:
//!
//! ```text
//! FsServer         one local copy of each request; routing, sizes, sessions (server.rs)
//!   ReadOnlyGuard  EROFS on read-only volumes; counts each request        (readonly.rs)
//!     VolumeFs     virtual directories, else down to the volume          (volumes.rs)
//!       PassthroughFs  fd-relative host syscalls inside each volume      (passthrough.rs)
//!         InodeStore / HandleStore / LockTable   what the guest holds    (inodes/,
//!                                                 handles.rs, locks.rs, session.rs)
//! ```
//! The policy layers are tables of one line per operation (`layer.rs`). Beside the
//! data path, [`Volumes`] is the control API's door to the [`registry::Registry`] of
//! attached volumes. Each volume is reached through a private `nodev,nosuid` mount of
//! its directory, read-only for a read-only volume (`share_root.rs`). Requests that
//! fuse-backend-rs's server does not serve as volfsd needs (COPY_FILE_RANGE, SYNCFS,
//! TMPFILE, SETLKW) reach the stack through [`ExtraOps`] (`extra_ops.rs`).

pub mod extra_ops;
pub mod file_handle;
pub mod handles;
pub mod id_map;
pub mod id_translate;
pub mod init;
pub mod inodes;
pub mod layer;
pub mod lock_ranges;
pub mod locks;
pub mod names;
pub mod passthrough;
pub mod readonly;
pub mod registry;
pub mod reply;
pub mod request;
pub mod server;
pub mod session;
pub mod share;
pub mod share_root;
pub mod snapshot;
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
pub use registry::{AttachError, ShareSpec};
pub use server::FsServer;
pub use session::Limits;
pub use share_root::{resolve_share_path, resolve_share_path_in, SharePath};
pub use volumes::{ShareInfo, Volumes};

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

/// What FUSE_COPY_FILE_RANGE asks: from the input file at an offset to the output
/// file at another, `len` bytes.
#[derive(Clone, Copy, Debug)]
pub struct CopyRange {
    pub nodeid_in: u64,
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
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
    fn copy_file_range(&self, ctx: &Context, range: CopyRange) -> io::Result<usize>;

    /// FUSE_SYNCFS on the file system holding `nodeid`.
    fn syncfs(&self, ctx: &Context, nodeid: u64) -> io::Result<()>;
}

/// The stack volfsd serves: the data path, outermost layer first.
pub type VolFs = ReadOnlyGuard;

/// The file system stack, and the door to its volumes for the control API.
pub struct Stack {
    /// The data path: read-only guard -> volumes -> passthrough.
    pub fs: Arc<VolFs>,
    /// Attach, detach, list; the guest session's reset.
    pub volumes: Arc<Volumes>,
}

/// Builds the stack for `shared_dir`: the whole directory when `shares` is None, else a
/// virtual root with these shares attached (`--readonly` makes every share read-only).
pub fn build(
    shared_dir: &Path,
    shares: Option<&[ShareSpec]>,
    readonly: bool,
    cfg: PassthroughConfig,
) -> io::Result<Stack> {
    let timeout = cfg.cache.timeout();
    let metrics = cfg.metrics;
    let inner = Arc::new(PassthroughFs::new(cfg)?);
    let volumes = match shares {
        None => Volumes::whole(inner, shared_dir, readonly)?,
        Some(specs) => {
            let v = Volumes::empty(inner, shared_dir, readonly)?;
            for spec in specs {
                v.attach(spec).map_err(|e| match e {
                    AttachError::Io(e) => e,
                    other => io::Error::other(other.to_string()),
                })?;
            }
            v
        }
    };
    let fs = Arc::new(ReadOnlyGuard::new(volumes.data_path(timeout)?, metrics));
    Ok(Stack {
        fs,
        volumes: Arc::new(volumes),
    })
}
