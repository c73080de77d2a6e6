//! The stack volfsd serves, assembled: passthrough, volumes, read-only guard, and
//! beside it the control API's door to the volumes.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::passthrough::{PassthroughConfig, PassthroughFs};
use super::readonly::ReadOnlyGuard;
use super::registry::{AttachError, ShareSpec};
use super::volumes::Volumes;

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
