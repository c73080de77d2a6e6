//! The passthrough layer's part of the device state: the node ids, handles and locks
//! the guest holds, written as plain data (`state::format`) and found again from it.
//!
//! Saving names each node by its path below its volume's root, read from the
//! `/proc/self/fd` link of its `O_PATH` fd (each volume is reached through a private
//! clone of its mount, whose root is the volume's directory), and, where asked, by
//! its file handle. Loading treats the state as hostile: every name is one valid
//! component, every walk starts at a volume's root and follows no symlink, every id
//! is new and in range, every handle is checked to lead inside its volume, and a
//! node must still be the kind of file the guest held. What is refused says why: a
//! [`NameError`] for a name or path of the state, a [`RestoreError`] for one node,
//! handle or lock not found again (the `why` of the load's error or log line).

use std::collections::HashMap;

use super::prelude::*;

mod find_nodes;
mod load;
mod load_parts;
pub use load::FoundTables;
mod preview;
pub use preview::{PreviewIds, PreviewSide};
mod save;
#[cfg(test)]
mod tests;
use crate::state::format::{self};
use crate::state::LoadError;

/// Maps and sets keyed by the node ids of a loaded state or preview: ids from
/// outside (a VMM's state, a handed-over session), so std's randomly keyed SipHash
/// and not `fs::id_map`'s one multiplication, whose collisions a writer of ids can
/// choose (ids that are multiples of the table's size all fall in one bucket). It
/// costs ~2 ms per 100,000 nodes, against a system call or more per node found.
pub(super) type IdMap<V> = HashMap<u64, V>;
pub(super) type IdSet = std::collections::HashSet<u64>;

/// The longest path a state may name (Linux's PATH_MAX).
const MAX_PATH: usize = libc::PATH_MAX as usize;
/// How deep a handle's `..` walk looks for its volume's root.
const MAX_DEPTH: usize = 4096;

/// What the tables gave the device state.
pub struct SavedTables {
    pub nodes: Vec<format::Node>,
    /// The nodes an upgrade's preview named, still held (empty in a migration's).
    pub previewed: Vec<format::Previewed>,
    pub handles: Vec<format::Handle>,
    pub locks: Vec<format::Lock>,
    pub next_node_id: u64,
    pub next_handle_id: u64,
    /// The open files a destination on this host may take over, so that the guest's
    /// locks are never let go: (node, owner) lock files, and handles holding a flock.
    pub lock_files: Vec<((u64, u64), Arc<File>)>,
    pub flock_handles: Vec<(u64, Arc<HandleData>)>,
}

/// Open files a source on this host handed over (see [`SavedTables`]).
#[derive(Default)]
pub struct HandedFiles {
    pub lock_files: HashMap<(u64, u64), File>,
    pub flock_handles: HashMap<u64, File>,
}

/// A name or path of the state that the guest could not have looked up.
#[derive(Debug)]
pub(super) enum NameError {
    /// A name (`path`: false) or path of `len` bytes: empty or too long.
    Length {
        path: bool,
        len: usize,
    },
    /// `.` or `..` as a name.
    Dot(String),
    Slash(String),
    Nul(String),
    Absolute(String),
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::Length { path, len } => {
                write!(
                    f,
                    "a {} of {len} bytes",
                    if *path { "path" } else { "name" }
                )
            }
            NameError::Dot(name) => write!(f, "the name {name:?}"),
            NameError::Slash(name) => write!(f, "the name {name:?} has a '/'"),
            NameError::Nul(name) => write!(f, "the name {name:?} has a NUL"),
            NameError::Absolute(path) => write!(f, "the absolute path {path:?}"),
        }
    }
}

impl std::error::Error for NameError {}

/// Why one node, handle or lock of the state was not found again.
#[derive(Debug)]
pub(super) enum RestoreError {
    /// A host call failed; `step` names what it reached ("its directory",
    /// "open_by_handle_at", "F_OFD_SETLK", ...), None: the node or file itself.
    Host {
        step: Option<&'static str>,
        source: io::Error,
    },
    /// The node is now another kind of file than the guest held (`S_IFMT` values).
    TypeChanged { now: u32, held: u32 },
    /// What the state asks for is not what this daemon finds or allows.
    Refused(&'static str),
}

/// A host error at `step`, for `map_err`.
fn at(step: &'static str) -> impl Fn(io::Error) -> RestoreError {
    move |source| RestoreError::Host {
        step: Some(step),
        source,
    }
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Host {
                step: Some(step),
                source,
            } => write!(f, "{step}: {source}"),
            RestoreError::Host { step: None, source } => write!(f, "{source}"),
            RestoreError::TypeChanged { now, held } => write!(
                f,
                "it is now a {}; the guest held a {}",
                type_name(*now),
                type_name(*held)
            ),
            RestoreError::Refused(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for RestoreError {}

impl From<io::Error> for RestoreError {
    fn from(source: io::Error) -> Self {
        RestoreError::Host { step: None, source }
    }
}

/// What went wrong with one thing of the state, for `--migration-on-error`.
struct Lost {
    what: LostKind,
    volume: String,
    path: String,
    why: RestoreError,
}

enum LostKind {
    Node,
    Handle,
    Lock,
}

impl Lost {
    fn into_error(self) -> LoadError {
        let (volume, path, why) = (self.volume, self.path, self.why.to_string());
        match self.what {
            LostKind::Node => LoadError::Node { volume, path, why },
            LostKind::Handle => LoadError::Handle { volume, path, why },
            LostKind::Lock => LoadError::Lock { volume, path, why },
        }
    }
}

fn invalid(why: impl Into<String>) -> LoadError {
    LoadError::Invalid(why.into())
}

fn display(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// A name from the state: one path component, as the guest could have looked it up.
fn check_component(name: &[u8]) -> Result<CString, NameError> {
    if name.is_empty() || name.len() > libc::NAME_MAX as usize {
        let len = name.len();
        return Err(NameError::Length { path: false, len });
    }
    if name == b"." || name == b".." {
        return Err(NameError::Dot(display(name)));
    }
    if name.contains(&b'/') {
        return Err(NameError::Slash(display(name)));
    }
    CString::new(name).map_err(|_| NameError::Nul(display(name)))
}

/// A relative path from the state, as its components.
fn check_path(path: &[u8]) -> Result<Vec<CString>, NameError> {
    if path.is_empty() || path.len() > MAX_PATH {
        let len = path.len();
        return Err(NameError::Length { path: true, len });
    }
    if path[0] == b'/' {
        return Err(NameError::Absolute(display(path)));
    }
    path.split(|&b| b == b'/').map(check_component).collect()
}

/// `S_IFMT` values a node may have.
fn valid_file_type(t: u32) -> bool {
    matches!(
        t,
        libc::S_IFREG
            | libc::S_IFDIR
            | libc::S_IFLNK
            | libc::S_IFIFO
            | libc::S_IFSOCK
            | libc::S_IFCHR
            | libc::S_IFBLK
    )
}

fn type_name(t: u32) -> &'static str {
    match t {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

/// A node as it was found again.
struct Restored {
    data: Arc<InodeData>,
    /// Its path below the volume's root, for messages and for children named by path.
    path: Vec<u8>,
}

impl PassthroughFs {
    /// The `/proc/self/fd` link of `fd`.
    fn fd_link(&self, fd: &impl AsRawFd) -> io::Result<Vec<u8>> {
        let name = ProcFdName::new(fd.as_raw_fd());
        let mut buf = vec![0u8; MAX_PATH + 32];
        // SAFETY: `buf` is valid for its length; the name is NUL-terminated.
        let n = unsafe {
            libc::readlinkat(
                self.proc_self_fd.as_raw_fd(),
                name.as_cstr().as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        let n = cvt64(n as i64)? as usize;
        buf.truncate(n);
        Ok(buf)
    }

    /// Where the inode `fd` refers to lies below the volume root whose link is
    /// `root_link`: its relative path, or None (unlinked, or moved outside the
    /// volume, or not reachable through a path).
    fn path_below(&self, root_link: &[u8], fd: &File) -> Option<Vec<u8>> {
        let link = self.fd_link(fd).ok()?;
        if link.ends_with(b" (deleted)") && sys::stat_fd(fd).map_or(true, |st| st.st_nlink == 0) {
            return None;
        }
        let rest = if root_link == b"/" {
            link.strip_prefix(b"/")?
        } else {
            link.strip_prefix(root_link)?.strip_prefix(b"/")?
        };
        (!rest.is_empty() && check_path(rest).is_ok()).then(|| rest.to_vec())
    }

    /// Opens `path` (already checked) below the directory `dir`, one component at a
    /// time and following no symlink: the walk cannot leave `dir`'s tree.
    fn walk(&self, dir: &File, components: &[CString]) -> io::Result<File> {
        let mut cur: Option<File> = None;
        for c in components {
            let next = sys::openat(
                cur.as_ref().unwrap_or(dir),
                c,
                libc::O_PATH | libc::O_NOFOLLOW,
                0,
            )?;
            cur = Some(next);
        }
        cur.ok_or_else(|| errno(libc::EINVAL))
    }
}
