//! An upgrade's pre-copy on one host (`src/keeper/upgrade.rs`, docs/UPGRADE.md):
//! the system calls a state's nodes cost, moved out of the guest's pause.
//!
//! - While the old serving process still serves, it writes a *preview*
//!   ([`PassthroughFs::preview_nodes`]): every node the guest holds, named as a
//!   state names it (deriving each path outside the inode table's lock), with its
//!   inode's `(st_dev, st_ino)`. It keeps the ids it named.
//! - The new process *preloads* it ([`PassthroughFs::preload`]): each node checked
//!   and opened as a load does (the preview is as untrusted as a state), kept only
//!   if it is the inode the preview names, and kept aside, not served.
//! - In the pause, the old process's state names each node of its preview that still
//!   lives only by id and lookups ([`format::Previewed`]: a node id is one inode for
//!   its whole life), the others in full; the new process's load takes the preloaded
//!   ones by id (`load.rs`). A node named as previewed that was not preloaded here,
//!   or another preview's state, fails the whole load: the old process serves on.

use std::collections::HashSet;

use super::super::super::share::Share;
use super::load::{FoundNode, NodesFound};
use super::*;
use crate::state::format;
use crate::state::{LoadError, LoadOptions, LoadReport, OnError, SaveOptions};

/// A node of a preview, found on the host, not registered.
pub(super) struct PreNode {
    pub data: Arc<InodeData>,
    /// Its parent and name in the preview (0 and empty: none), for the journal.
    pub parent: u64,
    pub name: Vec<u8>,
    /// Its path below its volume's root, for messages and its children.
    pub path: Vec<u8>,
}

/// What a new process preloaded from a preview.
struct Preloaded {
    id: u64,
    nodes: IdMap<PreNode>,
}

/// A process's side of an upgrade's preview.
#[derive(Default)]
pub struct PreviewSide {
    /// Previews written so far.
    count: u64,
    /// The old process: the last preview's id and the node ids it named.
    taken: Option<(u64, HashSet<u64>)>,
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
        let saved = self.save_nodes(volumes, &opts, None);
        let mut nodes = saved.nodes;
        for n in &mut nodes {
            // A node forgotten while the walk ran: still the inode it named.
            n.lookups = n.lookups.max(1);
        }
        let ids: HashSet<u64> = nodes
            .iter()
            .filter(|n| n.location != format::Location::Root)
            .map(|n| n.id)
            .collect();
        let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
        side.count += 1;
        // Unique beyond this process too: a new process preloads another's preview.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let id = (nanos << 8) | (side.count & 0xff);
        side.taken = Some((id, ids));
        (id, nodes, saved.keys)
    }

    /// The node ids the last preview named and its id (None: no preview taken).
    pub fn previewed_ids(&self) -> Option<(u64, HashSet<u64>)> {
        let side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
        side.taken.clone()
    }

    /// Opens the nodes of `preview` (its volumes mapped by the caller's plan:
    /// `volumes`, `roots`, as for a load) and keeps those found that are the inode
    /// the preview names, replacing any earlier preload. Returns how many were kept
    /// and how many not. Nothing is registered or served.
    pub fn preload(
        &self,
        preview: &format::Preview,
        volumes: &[Arc<Share>],
        roots: &[Arc<InodeData>],
    ) -> Result<(usize, usize), LoadError> {
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
        let NodesFound {
            nodes, restored, ..
        } = self.find_nodes(state, volumes, roots, &opts, Vec::new(), &mut report, true)?;
        let keys: IdMap<(u64, u64)> = state
            .nodes
            .iter()
            .zip(&preview.keys)
            .map(|(n, k)| (n.id, *k))
            .collect();
        let mut paths: IdMap<Vec<u8>> = restored.into_iter().map(|(id, r)| (id, r.path)).collect();
        let mut kept = IdMap::with_capacity_and_hasher(nodes.len(), Default::default());
        let mut other = 0;
        for n in nodes {
            let (data, parent, name) = FoundNode::parts(n);
            let key = data.key();
            if keys.get(&data.nodeid) != Some(&(key.dev, key.ino)) {
                // Renamed over since the preview was written, where the file system
                // gives no handles: not this one.
                log::debug!(
                    "node {}: found inode {:?}, the preview names {:?}: not preloaded",
                    data.nodeid,
                    (key.dev, key.ino),
                    keys.get(&data.nodeid)
                );
                other += 1;
                continue;
            }
            let path = paths.remove(&data.nodeid).unwrap_or_default();
            kept.insert(
                data.nodeid,
                PreNode {
                    data,
                    parent,
                    name,
                    path,
                },
            );
        }
        let not = report.lost_nodes + other;
        let count = kept.len();
        let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
        side.preloaded = Some(Preloaded {
            id: preview.id,
            nodes: kept,
        });
        Ok((count, not))
    }

    /// Drops what a preview preloaded (a load of a whole state, or a new preview).
    pub fn drop_preloaded(&self) {
        let gone = {
            let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
            side.preloaded.take()
        };
        drop(gone);
    }

    /// The preloaded nodes an upgrade's state names as previewed (by `preview`,
    /// which must be the one preloaded), each in one of `volumes`; the others are
    /// dropped. Refused whole if one was not preloaded.
    pub(super) fn take_preloaded(
        &self,
        preview: u64,
        named: &[format::Previewed],
        volumes: &[Arc<Share>],
    ) -> Result<Vec<(format::Previewed, PreNode)>, LoadError> {
        let preloaded = {
            let mut side = self.preview.lock().unwrap_or_else(|p| p.into_inner());
            side.preloaded.take()
        };
        let Some(Preloaded { id, mut nodes }) = preloaded else {
            return Err(invalid(format!(
                "a state after preview {preview}, and no preview was preloaded here"
            )));
        };
        if id != preview {
            return Err(invalid(format!(
                "a state after preview {preview}; preview {id} was preloaded here"
            )));
        }
        let mut taken = Vec::with_capacity(named.len());
        for p in named {
            let Some(pre) = nodes.remove(&p.id) else {
                return Err(invalid(format!(
                    "node {} named as previewed, which this process did not preload",
                    p.id
                )));
            };
            if !volumes.iter().any(|v| Arc::ptr_eq(v, &pre.data.share)) {
                return Err(LoadError::Volume {
                    name: pre.data.share.name.clone(),
                    why: "attached again since the preview".into(),
                });
            }
            taken.push((*p, pre));
        }
        Ok(taken)
    }
}
