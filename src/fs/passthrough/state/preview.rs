//! An upgrade's pre-copy on one host (`src/keeper/upgrade.rs`, docs/UPGRADE.md):
//! the system calls a state's nodes cost, moved out of the guest's pause.
//!
//! - While the old serving process still serves, it writes a *preview*
//!   ([`PassthroughFs::preview_nodes`]): every node the guest holds, named as a
//!   state names it (deriving each path outside the inode table's lock), with its
//!   inode's `(st_dev, st_ino)`. It keeps the ids it named.
//! - The new process, which serves no session yet, *preloads* it
//!   ([`PassthroughFs::find_preview`], `fs/session_load.rs`): each node checked and
//!   opened as a load does (the preview is as untrusted as a state), kept only if it
//!   is the inode the preview names, and registered (journal included) under its
//!   id; no FUSE session is served from them (no INIT, no rings).
//! - In the pause, the old process's state names each node of its preview that still
//!   lives only by id and lookups ([`format::Previewed`]: a node id is one inode for
//!   its whole life, in id order), the others in full; the new process's load
//!   matches the named ones with those it preloaded in one walk (a node named as
//!   previewed that was not preloaded here, or another preview's state, refuses the
//!   whole state: the keeper then moves the state whole), lets the forgotten ones
//!   go, gives the others their lookups, and loads the rest as a state.

use super::super::super::registry::VIRTUAL_BIT;
use super::super::super::share::Share;
use super::find_nodes::NodesFound;
use super::load::{FoundNode, FoundTables};
use super::*;
use crate::state::format;
use crate::state::{LoadError, LoadOptions, LoadReport, OnError, SaveOptions};

/// The preview's nodes a new process registered at its preload (their ids, sorted),
/// its id, and the session they were registered in.
struct Preloaded {
    id: u64,
    epoch: u32,
    nodes: Staged,
}

/// Registered nodes' ids, sorted: looked up by binary search, matched with a state's
/// sorted list of previewed nodes in one walk (no node touched).
#[derive(Default)]
pub struct Staged {
    ids: Vec<u64>,
}

impl Staged {
    pub(super) fn contains(&self, id: u64) -> bool {
        self.ids.binary_search(&id).is_ok()
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// What a state after a preview names of the preloaded nodes: those it names (with
/// their lookups now), and those forgotten since the preview.
pub struct Matched {
    pub named: Staged,
    pub lookups: Vec<u64>,
    pub forgotten: Vec<u64>,
}

/// The nodes a preview named (no volume root): each carries the preview's mark (its
/// count in this process, wrapping past 255 and never 0). A node a preview did not
/// name is new since (a fresh node has no mark) or was dead at the preview (every
/// live node takes each preview's mark), so an older preview's equal mark never
/// names one wrongly.
pub struct PreviewIds {
    mark: u8,
    count: usize,
}

impl PreviewIds {
    /// Whether `data` is a node the preview named (in memory: no lookup).
    pub fn contains(&self, data: &InodeData) -> bool {
        data.previewed_by() == self.mark
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// A process's side of an upgrade's preview.
#[derive(Default)]
pub struct PreviewSide {
    /// Previews written so far.
    count: u64,
    /// The old process: the last preview's id and the node ids it named.
    taken: Option<(u64, Arc<PreviewIds>)>,
    /// The new process: what it preloaded.
    preloaded: Option<Preloaded>,
}

impl PassthroughFs {
    /// A preview of the nodes the guest holds (`volumes`: each volume's share at its
    /// index): its id, the nodes in full (file handles where the host gives them), and
    /// each node's inode. Remembered: a later [`Self::save_tables`] may name these
    /// nodes as previewed. Runs while the guest is served: the inode table's lock is
    /// held only to copy the list of nodes.
    pub fn preview_nodes(
        &self,
        volumes: &[Arc<Share>],
        opts: &SaveOptions,
    ) -> (u64, Vec<format::Node>, Vec<(u64, u64)>) {
        let opts = SaveOptions {
            mode: crate::state::MigrationMode::FileHandles,
            ..*opts
        };
        // Unique beyond this process too: a new process preloads another's preview.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let count = {
            let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
            side.count += 1;
            side.count
        };
        let id = (nanos << 8) | (count & 0xff);
        let mark = (count % 255 + 1) as u8;
        let saved = self.save_nodes(volumes, &opts, None, Some(mark));
        let mut nodes = saved.nodes;
        for n in &mut nodes {
            // A node forgotten while the walk ran: still the inode it named.
            n.lookups = n.lookups.max(1);
        }
        let count = nodes
            .iter()
            .filter(|n| n.location != format::Location::Root)
            .count();
        let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
        side.taken = Some((id, Arc::new(PreviewIds { mark, count })));
        (id, nodes, saved.keys)
    }

    /// The node ids the last preview named and its id (None: no preview taken).
    pub fn previewed_ids(&self) -> Option<(u64, Arc<PreviewIds>)> {
        let side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
        side.taken.clone()
    }

    /// Opens the nodes of `preview` (its volumes mapped by the caller's plan:
    /// `volumes`, `roots`, as for a load) and keeps those found that are the inode
    /// the preview names, for the caller to register (a process that serves no
    /// session yet: nothing is served from them before a state names them). Returns
    /// them, and how many were not kept.
    pub fn find_preview(
        &self,
        preview: &format::Preview,
        volumes: &[Arc<Share>],
        roots: &[Arc<InodeData>],
    ) -> Result<(FoundTables, usize), LoadError> {
        self.drop_preloaded();
        let state = &preview.state;
        if preview.keys.len() != state.nodes.len() {
            return Err(invalid("a preview with another count of inodes than nodes"));
        }
        if !state.handles.is_empty() || !state.locks.is_empty() || !state.parked.is_empty() {
            return Err(invalid("a preview with handles, locks or requests"));
        }
        // A node not found is only not preloaded: a state naming it as previewed is
        // refused then. The guest ran on since the preview was written: a node whose
        // path leads nowhere now, or to another inode, is opened by its file handle
        // (checked to lie inside its volume), as after a crash.
        let opts = LoadOptions {
            on_error: OnError::GuestError,
            after_crash: true,
        };
        let mut report = LoadReport::default();
        let NodesFound { nodes, .. } =
            self.find_nodes(state, volumes, roots, &opts, None, &mut report, true)?;
        let keys: IdMap<(u64, u64)> = state
            .nodes
            .iter()
            .zip(&preview.keys)
            .map(|(n, k)| (n.id, *k))
            .collect();
        let before = nodes.len();
        let kept: Vec<FoundNode> = nodes
            .into_iter()
            .filter(|n| {
                let key = n.data.key();
                let same = keys.get(&n.data.nodeid) == Some(&(key.dev, key.ino));
                if !same {
                    // Renamed over since the preview was written, where the file
                    // system gives no handles: not this one.
                    log::debug!(
                        "node {}: found inode {:?}, the preview names {:?}: not preloaded",
                        n.data.nodeid,
                        (key.dev, key.ino),
                        keys.get(&n.data.nodeid)
                    );
                }
                same
            })
            .collect();
        let not = report.lost_nodes + before - kept.len();
        report.nodes = kept.len();
        let found = FoundTables::nodes_only(kept, state.next_node_id, report);
        Ok((found, not))
    }

    /// Keeps the ids of the nodes of preview `id` the caller registered, for the
    /// state after it.
    pub fn stage(&self, id: u64, ids: &[u64]) {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        let epoch = self.inodes.epoch();
        let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
        side.preloaded = Some(Preloaded {
            id,
            epoch,
            nodes: Staged { ids },
        });
    }

    /// Forgets what a preview preloaded (a load of a whole state, a new preview).
    pub fn drop_preloaded(&self) {
        let gone = {
            let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
            side.preloaded.take()
        };
        drop(gone);
    }

    /// Whether this process serves no session: no FUSE node but the volume roots.
    pub fn serves_nothing(&self) -> bool {
        self.inodes.snapshot().iter().all(|d| d.is_share_root())
    }

    /// The preloaded nodes an upgrade's state names as previewed (`named`: by
    /// preview `preview`, which must be the one preloaded, in the session it was
    /// preloaded in; ids strictly increasing, below `next_node_id`, lookups at least
    /// 1), matched in one walk: each must have been preloaded, or the whole state is
    /// refused. The preloaded nodes it does not name were forgotten since.
    pub fn match_preloaded(
        &self,
        preview: u64,
        named: &[format::Previewed],
        next_node_id: u64,
    ) -> Result<Matched, LoadError> {
        let preloaded = {
            let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
            side.preloaded.take()
        };
        let Some(Preloaded { id, epoch, nodes }) = preloaded else {
            return Err(invalid(format!(
                "a state after preview {preview}, and no preview was preloaded here"
            )));
        };
        if id != preview {
            return Err(invalid(format!(
                "a state after preview {preview}; preview {id} was preloaded here"
            )));
        }
        if epoch != self.inodes.epoch() {
            return Err(invalid("the session preloaded here was reset since"));
        }
        let mut have = nodes.ids.into_iter().peekable();
        let mut matched = Matched {
            named: Staged {
                ids: Vec::with_capacity(named.len()),
            },
            lookups: Vec::with_capacity(named.len()),
            forgotten: Vec::new(),
        };
        let mut last = 0;
        for p in named {
            if p.id <= last || p.id >= next_node_id || p.id & VIRTUAL_BIT != 0 {
                return Err(invalid(format!(
                    "previewed node id {:#x}: out of range or out of order",
                    p.id
                )));
            }
            last = p.id;
            if p.lookups == 0 {
                return Err(invalid(format!("node {} held with 0 lookups", p.id)));
            }
            while let Some(id) = have.next_if(|&id| id < p.id) {
                matched.forgotten.push(id);
            }
            if have.next_if(|&id| id == p.id).is_none() {
                return Err(invalid(format!(
                    "node {} named as previewed, which this process did not preload",
                    p.id
                )));
            }
            matched.named.ids.push(p.id);
            matched.lookups.push(p.lookups);
        }
        matched.forgotten.extend(have);
        Ok(matched)
    }

    /// Applies what [`Self::match_preloaded`] matched: the forgotten nodes go, the
    /// named ones take their lookups (and the journal with them). ENOENT if a named
    /// one left the table since (its volume detached).
    pub fn apply_matched(&self, matched: &Matched) -> io::Result<()> {
        for &id in &matched.forgotten {
            self.inodes.forget(id, u64::MAX);
        }
        self.inodes.set_lookups(
            matched
                .named
                .ids
                .iter()
                .copied()
                .zip(matched.lookups.iter().copied()),
        )
    }

    /// A staged node, registered.
    pub(super) fn staged_node(&self, staged: &Staged, id: u64) -> Option<Arc<InodeData>> {
        if staged.contains(id) {
            self.inodes.get(id).ok()
        } else {
            None
        }
    }
}
