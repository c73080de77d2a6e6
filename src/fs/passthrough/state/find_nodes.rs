//! Finding a state's nodes on the host ([`PassthroughFs::find_nodes`]), for a load
//! (`load.rs`) and for an upgrade's preload (`preview.rs`): each checked as a guest's
//! name is, found again by path or file handle, nothing registered.

use std::collections::HashMap;

use super::super::super::registry::ROOT_ID;
use super::super::super::share::Share;
use super::super::prelude::*;
use super::load::{lose, node_id_ok, FoundNode};
use super::preview::Staged;
use super::*;
use crate::state::format::{self, Location};
use crate::state::{LoadError, LoadOptions, LoadReport};

/// The nodes of a state found on the host (see [`PassthroughFs::find_nodes`]).
pub(super) struct NodesFound {
    pub nodes: Vec<FoundNode>,
    /// Node id to (its data, its path below its volume's root).
    pub restored: IdMap<Restored>,
    /// Every node id the state names (lost ones too).
    pub seen: IdSet,
    pub lost_ids: Vec<u64>,
}

impl PassthroughFs {
    /// The state's nodes checked and found again on the host (`staged`: nodes an
    /// upgrade's preload registered, which its parents, handles and locks may name).
    /// What is lost goes by `opts.on_error` (logged unless `quiet`). Nothing is
    /// registered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn find_nodes(
        &self,
        state: &format::SessionState,
        volumes: &[Arc<Share>],
        roots: &[Arc<InodeData>],
        opts: &LoadOptions,
        staged: Option<&Staged>,
        report: &mut LoadReport,
        quiet: bool,
    ) -> Result<NodesFound, LoadError> {
        let count = state.nodes.len();
        let mut restored: IdMap<Restored> =
            IdMap::with_capacity_and_hasher(count, Default::default());
        let root_index = root_index(state);
        let mut seen = IdSet::with_capacity_and_hasher(count, Default::default());
        let mut lost_ids = Vec::new();
        let mut nodes = Vec::with_capacity(count);
        if let Some(staged) = staged {
            // The staged nodes the state's own name: parents, handles, locks.
            let parents = state.nodes.iter().filter_map(|n| match n.location {
                Location::Child { parent, .. } => Some(parent),
                _ => None,
            });
            let named = parents.chain(state.handles.iter().map(|h| h.node)).chain(
                state.locks.iter().filter_map(|l| match l {
                    format::Lock::Posix { node, .. } => Some(*node),
                    format::Lock::Flock { .. } => None,
                }),
            );
            for id in named {
                if let Some(d) = self.staged_node(staged, id) {
                    seen.insert(id);
                    restored.insert(
                        id,
                        Restored {
                            data: d,
                            path: format!("node {id}").into_bytes(),
                        },
                    );
                }
            }
        }
        for node in &state.nodes {
            // What any writer must get right, checked before anything is opened.
            if !node_id_ok(node.id, state.next_node_id) {
                return Err(invalid(format!("node id {:#x} out of range", node.id)));
            }
            if !seen.insert(node.id) || staged.is_some_and(|s| s.contains(node.id)) {
                return Err(invalid(format!("node id {} named twice", node.id)));
            }
            if node.lookups == 0 {
                return Err(invalid(format!("node {} held with 0 lookups", node.id)));
            }
            if !valid_file_type(node.file_type) {
                return Err(invalid(format!(
                    "node {}: file type {:#o}",
                    node.id, node.file_type
                )));
            }
            let Some(share) = volumes.get(node.volume as usize) else {
                return Err(invalid(format!(
                    "node {}: volume index {}",
                    node.id, node.volume
                )));
            };
            let is_root = root_index.get(&node.id) == Some(&(node.volume as usize));
            if (node.location == Location::Root) != is_root || (node.id == ROOT_ID && !is_root) {
                return Err(invalid(format!(
                    "node {}: a volume root only at its volume's root id",
                    node.id
                )));
            }
            if is_root {
                let data = roots[node.volume as usize].clone();
                if data.file_type() != node.file_type {
                    return Err(invalid(format!("volume root {}: not a directory", node.id)));
                }
                restored.insert(
                    node.id,
                    Restored {
                        data,
                        path: Vec::new(),
                    },
                );
                continue;
            }
            // Where to open it from, checked as hostile input.
            let (from, components, path) = match &node.location {
                // A parent the load lost: no path leads here (its file handle may).
                Location::Child { parent, .. } if lost_ids.contains(parent) => {
                    (None, Vec::new(), Vec::new())
                }
                Location::Child { parent, name } => {
                    let parent = restored.get(parent).ok_or_else(|| {
                        invalid(format!(
                            "node {} names parent {parent}, which is no node before it",
                            node.id
                        ))
                    })?;
                    if !parent.data.is_dir() || !Arc::ptr_eq(&parent.data.share, share) {
                        return Err(invalid(format!(
                            "node {}: its parent is no directory of its volume",
                            node.id
                        )));
                    }
                    let c = check_component(name)
                        .map_err(|w| invalid(format!("node {}: {w}", node.id)))?;
                    let mut path = parent.path.clone();
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(name);
                    (Some(parent.data.clone()), vec![c], path)
                }
                Location::Path(p) => {
                    let c = check_path(p).map_err(|w| invalid(format!("node {}: {w}", node.id)))?;
                    (None, c, p.clone())
                }
                Location::Unknown => (None, Vec::new(), Vec::new()),
                Location::Root => unreachable!("checked above"),
            };
            let root = Some(&*roots[node.volume as usize]);
            let result = self
                .find_node(root, from.as_deref(), &components, node)
                .or_else(|why| {
                    // After a crash the path is where the node was found, and a
                    // rename may have moved it since: its file handle finds it.
                    let by_handle = opts.after_crash && node.file_handle.is_some();
                    if by_handle && !components.is_empty() {
                        self.find_node(root, None, &[], node)
                    } else {
                        Err(why)
                    }
                });
            match result.and_then(|file| self.found_node(share, file, node)) {
                Ok(data) => {
                    let (parent, name) = match &node.location {
                        Location::Child { parent, name } => (*parent, name.clone()),
                        _ => (0, Vec::new()),
                    };
                    nodes.push(FoundNode {
                        data: data.clone(),
                        lookups: node.lookups,
                        parent,
                        name,
                    });
                    restored.insert(node.id, Restored { data, path });
                    report.nodes += 1;
                }
                Err(why) => {
                    lose(
                        opts,
                        Lost {
                            what: LostKind::Node,
                            volume: share.name.clone(),
                            path: if path.is_empty() {
                                format!("node {}", node.id)
                            } else {
                                display(&path)
                            },
                            why,
                        },
                        report,
                        quiet,
                    )?;
                    lost_ids.push(node.id);
                }
            }
        }

        Ok(NodesFound {
            nodes,
            restored,
            seen,
            lost_ids,
        })
    }
}

/// Each volume's index in `state`, by the node id of its root.
pub(super) fn root_index(state: &format::SessionState) -> HashMap<u64, usize> {
    state
        .volumes
        .iter()
        .enumerate()
        .map(|(i, v)| (v.root, i))
        .collect()
}
