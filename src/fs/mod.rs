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
pub mod options;
pub mod passthrough;
pub mod readonly;
pub mod registry;
pub mod reply;
pub mod server;
pub mod session;
pub mod share;
pub mod share_root;
pub mod snapshot;
pub mod stack;
pub mod sys;
pub mod volumes;
pub mod xattrs;

use std::io;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, OpenOptions};
use fuse_backend_rs::api::filesystem::{Context, Entry};

pub use options::{AclMode, CacheMode};
pub use passthrough::{PassthroughConfig, PassthroughFs};
pub use readonly::ReadOnlyGuard;
pub use registry::{AttachError, ShareSpec};
pub use server::{FsServer, RequestError};
pub use session::Limits;
pub use share_root::{resolve_share_path, resolve_share_path_in, SharePath};
pub use stack::{build, Stack, VolFs};
pub use volumes::{ShareInfo, VolumeFs, Volumes};

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
