//! The file system stack served to the guest, assembled from small layers
//! (`stack.rs`):
//!
//! ```text
//! request.rs       the transport's one door: what a request is, and its reply
//! FsServer         one local copy of each request; routing, sizes, sessions (server.rs)
//!   ReadOnlyGuard  EROFS on read-only volumes; counts each request        (readonly.rs)
//!     VolumeFs     virtual directories, else down to the volume          (volumes.rs)
//!       PassthroughFs  fd-relative host syscalls inside each volume      (passthrough/)
//!         InodeStore / HandleStore / LockTable   what the guest holds    (inodes/,
//!                                                 handles.rs, locks.rs, limits.rs)
//! ```
//! Each FUSE operation is listed once (`ops.rs`): its signature, its node, read or
//! write. Each layer is generated from that list (`layer.rs`) and names only the
//! operations it treats differently. Beside the data path, [`Volumes`] is the control
//! API's door to the [`registry::Registry`] of attached volumes. Each volume is reached
//! through a private `nodev,nosuid` mount of its directory, read-only for a read-only
//! volume (`share_root.rs`). Requests that fuse-backend-rs's server does not serve as
//! volfsd needs (COPY_FILE_RANGE, SYNCFS, TMPFILE, SETLKW) are decoded in
//! `extra_ops.rs`; the first three reach the stack through [`ExtraOps`]. This file
//! only declares the modules and re-exports what the rest of the crate uses.

pub mod buffers;
pub mod dispatch;
pub mod extra_ops;
pub mod file_handle;
pub mod handles;
pub mod id_map;
pub mod id_translate;
pub mod init;
pub mod inodes;
pub mod journal;
pub mod layer;
pub mod limits;
pub mod lock_ranges;
pub mod locks;
pub mod names;
pub mod ops;
pub mod options;
pub mod passthrough;
pub mod readonly;
pub mod registry;
pub mod request;
pub mod server;
pub mod session_load;
pub mod share;
pub mod share_root;
pub mod snapshot;
pub mod stack;
pub mod sys;
pub mod volumes;
pub mod xattrs;

pub use limits::Limits;
pub use ops::{CopyRange, ExtraOps};
pub use options::{AclMode, CacheMode};
pub use passthrough::PassthroughConfig;
pub use registry::{AttachError, ShareSpec};
pub use server::FsServer;
pub use share_root::{resolve_share_path, resolve_share_path_in, SharePath};
pub use stack::{build, Stack, VolFs};
pub use volumes::{ShareInfo, Volumes};
