//! The guest's FUSE session beyond one process: its serialized form ([`format`]),
//! and the options and errors of saving and loading it.
//!
//! A session is saved when the VMM asks for the device state (live migration, a
//! snapshot to a file: SET_DEVICE_STATE_FD) and loaded by the daemon that serves the
//! guest next, maybe on another host and into a copy of the volumes. The file system
//! stack writes and reads it (`fs/snapshot.rs`, `fs/passthrough/state/`); the
//! transport moves the bytes (`device/state_transfer.rs`). This module depends on
//! neither: it is the contract between them, and docs/DEVICE-STATE.md describes it.

pub mod format;

use std::fmt;

/// The largest id counter a loaded session may carry (the next node id, the next
/// handle id): far more than a daemon hands out in its life (2^48 ids at a million a
/// second take nine years), and far below the ids a daemon keeps for itself (virtual
/// directories from 2^63, volume roots moving between ids from 2^62), so the ids
/// handed out after a load never reach one of those, nor wrap to the mount root.
pub const MAX_LOADED_ID: u64 = 1 << 48;

/// The id counters of a loaded session, checked: a next node id above the mount
/// root's id and a next handle id above 0 (the ids before them are the session's),
/// neither past [`MAX_LOADED_ID`].
pub fn check_counters(next_node_id: u64, next_handle_id: u64) -> Result<(), LoadError> {
    // The mount root is node 1: a session's own ids start at 2.
    if !(2..=MAX_LOADED_ID).contains(&next_node_id) {
        return Err(LoadError::Invalid(format!(
            "next node id {next_node_id:#x}: a loaded session's counters lie in 2..={MAX_LOADED_ID:#x}"
        )));
    }
    if !(1..=MAX_LOADED_ID).contains(&next_handle_id) {
        return Err(LoadError::Invalid(format!(
            "next handle id {next_handle_id:#x}: a loaded session's counters lie in 1..={MAX_LOADED_ID:#x}"
        )));
    }
    Ok(())
}

/// `--migration-mode`, with virtiofsd's meaning: how the source names each node.
/// The destination follows what the state holds.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq, clap::ValueEnum)]
pub enum MigrationMode {
    /// Paths below each volume's root (found through `/proc/self/fd`).
    #[default]
    FindPaths,
    /// File handles: source and destination serve the same file system (the same
    /// host, or one network file system mounted on both). Paths are kept too, for
    /// checking where a handle leads.
    FileHandles,
}

/// `--migration-on-error`, with virtiofsd's meaning: what the destination does with a
/// node, handle or lock it cannot get back.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq, clap::ValueEnum)]
pub enum OnError {
    /// The load fails, and with it the migration (the source runs on).
    #[default]
    Abort,
    /// The load succeeds; the guest gets ESTALE for each node it lost and its handles.
    GuestError,
}

/// How the source writes the state.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct SaveOptions {
    pub mode: MigrationMode,
    /// `--migration-verify-handles`: every node carries its file handle, and the
    /// destination checks that the path it opens is that very inode.
    pub verify_handles: bool,
    /// `--migration-confirm-paths`: each path is opened again before it is written,
    /// and a node whose path leads elsewhere is written without one.
    pub confirm_paths: bool,
}

/// How the destination reads it.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct LoadOptions {
    pub on_error: OnError,
    /// The state is the journal of a serving process that was killed
    /// (`fs/journal/rebuild.rs`): a node's path is where it was found, so a node
    /// whose path leads elsewhere now is opened by its file handle.
    pub after_crash: bool,
}

/// Why a state was not loaded. Nothing of it is left in the daemon.
#[derive(Debug)]
pub enum LoadError {
    /// The bytes are no state this daemon reads.
    Decode(format::DecodeError),
    /// The state was written under other options than the daemon runs with.
    Config {
        option: &'static str,
        saved: String,
        here: String,
    },
    /// A volume of the state is missing here, or differs.
    Volume { name: String, why: String },
    /// The state contradicts itself or names what it may not (a hostile writer).
    Invalid(String),
    /// A node could not be found again (`--migration-on-error=abort`).
    Node {
        volume: String,
        path: String,
        why: String,
    },
    /// An open file could not be opened again.
    Handle {
        volume: String,
        path: String,
        why: String,
    },
    /// A lock could not be taken again.
    Lock {
        volume: String,
        path: String,
        why: String,
    },
    /// Reading the state's bytes failed.
    Io(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Decode(e) => write!(f, "{e}"),
            LoadError::Config {
                option,
                saved,
                here,
            } => write!(
                f,
                "{option}: the device state was saved with {saved}, this daemon runs with {here}"
            ),
            LoadError::Volume { name, why } => write!(f, "{}: {why}", VolumeLabel(name)),
            LoadError::Invalid(why) => write!(f, "invalid device state: {why}"),
            LoadError::Node { volume, path, why } => {
                write!(f, "{}: node {path:?}: {why}", VolumeLabel(volume))
            }
            LoadError::Handle { volume, path, why } => {
                write!(f, "{}: open file {path:?}: {why}", VolumeLabel(volume))
            }
            LoadError::Lock { volume, path, why } => {
                write!(f, "{}: lock on {path:?}: {why}", VolumeLabel(volume))
            }
            LoadError::Io(why) => write!(f, "reading the device state: {why}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// How a log line names a volume: the shared directory's root has no name.
pub struct VolumeLabel<'a>(pub &'a str);

impl fmt::Display for VolumeLabel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            write!(f, "the shared directory")
        } else {
            write!(f, "volume {:?}", self.0)
        }
    }
}

impl From<format::DecodeError> for LoadError {
    fn from(e: format::DecodeError) -> Self {
        LoadError::Decode(e)
    }
}

/// What a load gave back, and what it could not.
#[derive(Debug, Default, Eq, PartialEq)]
pub struct LoadReport {
    pub nodes: usize,
    pub handles: usize,
    pub locks: usize,
    /// Nodes and handles that answer ESTALE (`--migration-on-error=guest-error`).
    pub lost_nodes: usize,
    pub lost_handles: usize,
    /// Locks still held by someone else (the source, until it exits) and being
    /// waited for.
    pub pending_locks: usize,
    /// Locks whose open files came from the source on this host (never let go).
    pub handed_over_locks: usize,
}
