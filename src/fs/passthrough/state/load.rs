//! Loading: the state's nodes, handles and locks found again and registered.

use std::collections::{HashMap, HashSet};

use super::super::super::lock_ranges::HeldRange;
use super::super::super::registry::VIRTUAL_BIT;
use super::super::super::share::Share;
use super::super::prelude::*;
use super::load_parts::PendingLock;
use super::*;
use crate::state::format::{self, Location};
use crate::state::{LoadError, LoadOptions, LoadReport, OnError};

impl PassthroughFs {
    /// Finds the state's nodes, handles and locks again and registers them under
    /// their ids. `volumes` gives each state volume's share here; the volume roots
    /// already carry the state's ids. On an error with `--migration-on-error=abort`
    /// nothing is kept (the caller resets the session).
    pub fn restore_tables(
        &self,
        state: &format::SessionState,
        volumes: &[Arc<Share>],
        opts: &LoadOptions,
        mut handed: HandedFiles,
    ) -> Result<LoadReport, LoadError> {
        let mut report = LoadReport::default();
        let mut restored: HashMap<u64, Restored> = HashMap::new();
        let roots: HashMap<u64, usize> = state
            .volumes
            .iter()
            .enumerate()
            .map(|(i, v)| (v.root, i))
            .collect();
        // Each volume's root here (attached before the load, with the state's id).
        let mut root_of: Vec<Option<Arc<InodeData>>> = Vec::with_capacity(volumes.len());
        for (v, share) in state.volumes.iter().zip(volumes) {
            root_of.push(
                self.inodes
                    .get(v.root)
                    .ok()
                    .filter(|d| d.is_share_root() && Arc::ptr_eq(&d.share, share)),
            );
        }
        let mut seen = HashSet::new();
        // What could not be found again, with `guest-error`: answered ESTALE.
        let lost = |l: Lost, report: &mut LoadReport| -> Result<(), LoadError> {
            match opts.on_error {
                OnError::Abort => Err(l.into_error()),
                OnError::GuestError => {
                    match l.what {
                        LostKind::Node => report.lost_nodes += 1,
                        LostKind::Handle => report.lost_handles += 1,
                        LostKind::Lock => {}
                    }
                    log::warn!("{}: the guest gets ESTALE for it", l.into_error());
                    Ok(())
                }
            }
        };
        let mut lost_ids = Vec::new();
        for node in &state.nodes {
            // What any writer must get right, checked before anything is opened.
            if node.id == 0 || node.id & VIRTUAL_BIT != 0 || node.id >= state.next_node_id {
                return Err(invalid(format!("node id {:#x} out of range", node.id)));
            }
            if !seen.insert(node.id) {
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
            let is_root = roots.get(&node.id) == Some(&(node.volume as usize));
            if (node.location == Location::Root) != is_root {
                return Err(invalid(format!(
                    "node {}: a volume root only at its volume's root id",
                    node.id
                )));
            }
            if is_root {
                // Attached here before the load, and given this id already.
                let data = self.inodes.get(node.id).map_err(|e| {
                    invalid(format!("volume root {} is not attached: {e}", node.id))
                })?;
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
            let root = root_of[node.volume as usize].as_deref();
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
            match result.and_then(|file| self.register_restored(share, file, node)) {
                Ok(data) => {
                    restored.insert(node.id, Restored { data, path });
                    report.nodes += 1;
                }
                Err(why) => {
                    lost(
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
                        &mut report,
                    )?;
                    lost_ids.push(node.id);
                }
            }
        }
        self.inodes.advance_next_id(state.next_node_id);
        self.mark_lost(&lost_ids);

        let mut handle_ids = HashSet::new();
        let mut handed_flocks = HashSet::new();
        let mut handles: HashMap<u64, Arc<HandleData>> = HashMap::new();
        for h in &state.handles {
            if h.id == 0 || h.id >= state.next_handle_id || !handle_ids.insert(h.id) {
                return Err(invalid(format!(
                    "handle id {} repeated or out of range",
                    h.id
                )));
            }
            if !seen.contains(&h.node) {
                return Err(invalid(format!(
                    "handle {} names no node of the state",
                    h.id
                )));
            }
            let Some(node) = restored.get(&h.node) else {
                report.lost_handles += 1;
                continue; // its node is lost: the handle answers ESTALE too
            };
            let handed_file = handed.flock_handles.remove(&h.id);
            let was_handed = handed_file.is_some();
            let file = match handed_file {
                Some(f) => self.adopt_handed(&node.data, f, h.flags),
                None => self.reopen_restored(&node.data, h),
            };
            match file.and_then(|f| {
                self.handles
                    .insert_restored(h.id, node.data.clone(), f)
                    .map_err(at("registering it"))
            }) {
                Ok(data) => {
                    report.handles += 1;
                    if let Some(off) = h.dir_offset {
                        // The stream's position, where the guest's next READDIR names
                        // it again anyway.
                        data.dir_offset.store(off, Ordering::Relaxed);
                    }
                    if was_handed {
                        handed_flocks.insert(h.id);
                    }
                    handles.insert(h.id, data);
                }
                Err(why) => lost(
                    Lost {
                        what: LostKind::Handle,
                        volume: node.data.share.name.clone(),
                        path: display(&node.path),
                        why,
                    },
                    &mut report,
                )?,
            }
        }
        self.handles.advance_next_id(state.next_handle_id);

        // POSIX locks, one lock file per (node, owner); then flocks.
        let mut by_owner: HashMap<(u64, u64), (i32, Vec<HeldRange>)> = HashMap::new();
        for lock in &state.locks {
            match *lock {
                format::Lock::Posix {
                    node,
                    owner,
                    access,
                    start,
                    end,
                    kind,
                } => {
                    if !seen.contains(&node)
                        || !matches!(access, libc::O_RDONLY | libc::O_WRONLY | libc::O_RDWR)
                        || !matches!(kind, libc::F_RDLCK | libc::F_WRLCK)
                        || end < start
                        || end > i64::MAX as u64
                    {
                        return Err(invalid(format!("lock of owner {owner} on node {node}")));
                    }
                    let entry = by_owner
                        .entry((node, owner))
                        .or_insert((access, Vec::new()));
                    entry.1.push(HeldRange { start, end, kind });
                }
                format::Lock::Flock { handle, kind } => {
                    if !handle_ids.contains(&handle)
                        || !matches!(kind, libc::F_RDLCK | libc::F_WRLCK)
                    {
                        return Err(invalid(format!("flock on handle {handle}")));
                    }
                }
            }
        }
        let mut pending = Vec::new();
        let mut owners: Vec<_> = by_owner.into_iter().collect();
        owners.sort_by_key(|(k, _)| *k);
        for ((nodeid, owner), (access, ranges)) in owners {
            let Some(node) = restored.get(&nodeid) else {
                continue; // its node is lost
            };
            let outcome = match handed.lock_files.remove(&(nodeid, owner)) {
                Some(f) => self.adopt_handed(&node.data, f, access).map(|f| (f, true)),
                None => self
                    .take_posix_locks(&node.data, access, &ranges, &mut pending)
                    .map(|f| (f, false)),
            };
            let done = outcome.and_then(|(f, handed_over)| {
                self.locks
                    .insert_restored(node.data.clone(), owner, access, f, &ranges)
                    .map(|_| handed_over)
                    .map_err(at("registering it"))
            });
            match done {
                Ok(handed_over) => {
                    report.locks += ranges.len();
                    if handed_over {
                        report.handed_over_locks += ranges.len();
                    }
                }
                Err(why) => {
                    lost(
                        Lost {
                            what: LostKind::Lock,
                            volume: node.data.share.name.clone(),
                            path: display(&node.path),
                            why,
                        },
                        &mut report,
                    )?;
                    // The guest believes it holds a lock it lost: its file is lost.
                    self.lose_node(nodeid);
                }
            }
        }
        for lock in &state.locks {
            let format::Lock::Flock { handle, kind } = *lock else {
                continue;
            };
            let Some(h) = handles.get(&handle) else {
                continue;
            };
            if handed_flocks.contains(&handle) {
                // Its open file came from the source with the lock on it.
                h.set_flock(kind);
                report.locks += 1;
                report.handed_over_locks += 1;
                continue;
            }
            let op = if kind == libc::F_WRLCK {
                libc::LOCK_EX
            } else {
                libc::LOCK_SH
            };
            // SAFETY: flock on an fd we own.
            match cvt(unsafe { libc::flock(h.file.as_raw_fd(), op | libc::LOCK_NB) }) {
                Ok(_) => {
                    h.set_flock(kind);
                    report.locks += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    // Still the source's, until it exits: waited for below.
                    h.set_flock(kind);
                    pending.push(PendingLock::Flock {
                        handle: h.clone(),
                        op,
                    });
                    report.locks += 1;
                }
                Err(e) => {
                    lost(
                        Lost {
                            what: LostKind::Lock,
                            volume: h.inode.share.name.clone(),
                            path: restored
                                .get(&h.inode.nodeid)
                                .map(|r| display(&r.path))
                                .unwrap_or_default(),
                            why: at("flock")(e),
                        },
                        &mut report,
                    )?;
                    self.lose_node(h.inode.nodeid);
                }
            }
        }
        report.pending_locks = pending.len();
        if !pending.is_empty() {
            self.wait_for_pending(pending);
        }
        Ok(report)
    }
}
