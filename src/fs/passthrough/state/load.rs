//! Loading, in two steps: [`PassthroughFs::find_tables`] checks the state's nodes,
//! handles and locks and finds each on the host without touching the tables (a
//! refusal there leaves the daemon serving what it served), then
//! [`PassthroughFs::commit_tables`] registers everything found in the session the
//! caller started.

use std::collections::{HashMap, HashSet};

use super::super::super::inodes::FoundAt;
use super::super::super::lock_ranges::HeldRange;
use super::super::super::registry::VIRTUAL_BIT;
use super::super::super::share::Share;
use super::super::prelude::*;
use super::find_nodes::{root_index, NodesFound};
use super::load_parts::PendingLock;
use super::preview::Staged;
use super::*;
use crate::state::format;
use crate::state::{LoadError, LoadOptions, LoadReport, OnError};

/// A node found on the host, not registered yet.
pub(super) struct FoundNode {
    pub(super) data: Arc<InodeData>,
    pub(super) lookups: u64,
    /// Its parent and name, for the journal (0 and empty: none).
    pub(super) parent: u64,
    pub(super) name: Vec<u8>,
}

/// A handle reopened (or handed over), not registered yet.
struct FoundHandle {
    id: u64,
    node: u64,
    file: File,
    dir_offset: Option<u64>,
    /// Its open file came from the source (the same-host hand-over).
    handed: bool,
    /// The flock it holds, and whether it is held yet (false: waited for once the
    /// session runs).
    flock: Option<(i32, bool)>,
}

/// A lock file with its ranges taken (or handed over), not registered yet.
struct FoundLockFile {
    node: u64,
    owner: u64,
    access: i32,
    file: Arc<File>,
    ranges: Vec<HeldRange>,
    /// Ranges still held by another, waited for once the session runs.
    pending: Vec<libc::flock>,
}

/// Everything of a state found on the host: what [`PassthroughFs::commit_tables`]
/// registers.
pub struct FoundTables {
    nodes: Vec<FoundNode>,
    handles: Vec<FoundHandle>,
    lock_files: Vec<FoundLockFile>,
    lost: Vec<u64>,
    next_node_id: u64,
    next_handle_id: u64,
    report: LoadReport,
}

impl FoundTables {
    /// Nodes found, nothing else (an upgrade's preview).
    pub(super) fn nodes_only(nodes: Vec<FoundNode>, next_node_id: u64, report: LoadReport) -> Self {
        FoundTables {
            nodes,
            handles: Vec::new(),
            lock_files: Vec::new(),
            lost: Vec::new(),
            next_node_id,
            next_handle_id: 1,
            report,
        }
    }

    /// The ids of the nodes found.
    pub fn node_ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.data.nodeid).collect()
    }
}

/// The ids a load may not give a node or a handle, and what it checks them against.
pub(super) fn node_id_ok(id: u64, next: u64) -> bool {
    id != 0 && id & VIRTUAL_BIT == 0 && id < next
}

/// What could not be found again: with `guest-error`, answered ESTALE (counted, and
/// logged unless `quiet`); with `abort`, the load's error.
pub(super) fn lose(
    opts: &LoadOptions,
    l: Lost,
    report: &mut LoadReport,
    quiet: bool,
) -> Result<(), LoadError> {
    match opts.on_error {
        OnError::Abort => Err(l.into_error()),
        OnError::GuestError => {
            match l.what {
                LostKind::Node => report.lost_nodes += 1,
                LostKind::Handle => report.lost_handles += 1,
                LostKind::Lock => {}
            }
            if quiet {
                log::debug!("{}: not preloaded", l.into_error());
            } else {
                log::warn!("{}: the guest gets ESTALE for it", l.into_error());
            }
            Ok(())
        }
    }
}

impl PassthroughFs {
    /// Checks the state's nodes, handles and locks and finds each again on the host.
    /// `volumes` gives each state volume's share here, `roots` its root node here
    /// (under the id it has now: the caller gives it the state's id at commit). The
    /// tables are not touched: an error leaves the daemon as it was. `staged`: an
    /// upgrade's state after a preview (`preview.rs`): the previewed nodes it names,
    /// registered already; the state's nodes, handles and locks may name them.
    pub fn find_tables(
        &self,
        state: &format::SessionState,
        volumes: &[Arc<Share>],
        roots: &[Arc<InodeData>],
        opts: &LoadOptions,
        mut handed: HandedFiles,
        staged: Option<&Staged>,
    ) -> Result<FoundTables, LoadError> {
        let mut report = LoadReport::default();
        if staged.is_none() {
            self.drop_preloaded();
        }
        let root_index = root_index(state);
        let NodesFound {
            mut nodes,
            restored,
            seen,
            mut lost_ids,
        } = self.find_nodes(state, volumes, roots, opts, staged, &mut report, false)?;
        let lost = |l: Lost, report: &mut LoadReport| lose(opts, l, report, false);

        let mut handle_ids = HashSet::new();
        let mut handles: Vec<FoundHandle> = Vec::new();
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
            match file {
                Ok(file) => {
                    report.handles += 1;
                    handles.push(FoundHandle {
                        id: h.id,
                        node: h.node,
                        file,
                        dir_offset: h.dir_offset,
                        handed: was_handed,
                        flock: None,
                    });
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

        // POSIX locks, one lock file per (node, owner); then flocks.
        let mut by_owner: HashMap<(u64, u64), (i32, Vec<HeldRange>)> = HashMap::new();
        let mut flocks = Vec::new();
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
                    flocks.push((handle, kind));
                }
            }
        }
        // Nodes whose lock the load lost: the guest believes it holds a lock it
        // does not, so the file is lost to it.
        let mut lock_lost: HashSet<u64> = HashSet::new();
        let mut lock_files = Vec::new();
        let mut owners: Vec<_> = by_owner.into_iter().collect();
        owners.sort_by_key(|(k, _)| *k);
        for ((nodeid, owner), (access, ranges)) in owners {
            let Some(node) = restored.get(&nodeid) else {
                continue; // its node is lost
            };
            let taken = match handed.lock_files.remove(&(nodeid, owner)) {
                Some(f) => self
                    .adopt_handed(&node.data, f, access)
                    .and_then(|f| self.verify_handed_posix(f, &ranges)),
                None => self.take_posix_locks(&node.data, access, &ranges),
            };
            match taken {
                Ok((file, pending, handed_over)) => {
                    report.locks += ranges.len();
                    if handed_over {
                        report.handed_over_locks += ranges.len();
                    }
                    report.pending_locks += pending.len();
                    lock_files.push(FoundLockFile {
                        node: nodeid,
                        owner,
                        access,
                        file,
                        ranges,
                        pending,
                    });
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
                    lock_lost.insert(nodeid);
                }
            }
        }
        for (handle, kind) in flocks {
            let Some(h) = handles.iter_mut().find(|h| h.id == handle) else {
                continue; // its node or the handle is lost
            };
            let op = if kind == libc::F_WRLCK {
                libc::LOCK_EX
            } else {
                libc::LOCK_SH
            };
            // An open file the source handed over holds the lock already, and the call
            // changes nothing; one that does not is not taken on trust: the lock is
            // taken on it now, or waited for.
            // SAFETY: flock on an fd we own.
            match cvt(unsafe { libc::flock(h.file.as_raw_fd(), op | libc::LOCK_NB) }) {
                Ok(_) => {
                    h.flock = Some((kind, true));
                    report.locks += 1;
                    if h.handed {
                        report.handed_over_locks += 1;
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    // Still the source's, until it exits: waited for once the session
                    // runs.
                    h.flock = Some((kind, false));
                    report.locks += 1;
                    report.pending_locks += 1;
                }
                Err(e) => {
                    let node = &restored[&h.node];
                    lost(
                        Lost {
                            what: LostKind::Lock,
                            volume: node.data.share.name.clone(),
                            path: display(&node.path),
                            why: at("flock")(e),
                        },
                        &mut report,
                    )?;
                    lock_lost.insert(h.node);
                }
            }
        }
        if !lock_lost.is_empty() {
            let before = nodes.len();
            nodes.retain(|n| !lock_lost.contains(&n.data.nodeid));
            report.nodes -= before - nodes.len();
            handles.retain(|h| !lock_lost.contains(&h.node));
            lock_files.retain(|l| !lock_lost.contains(&l.node));
            // A volume root stays (the guest's view of the volume does not go).
            lost_ids.extend(
                lock_lost
                    .into_iter()
                    .filter(|id| !root_index.contains_key(id)),
            );
        }
        drop(restored);
        self.check_room(volumes, &nodes, &handles, &lock_files, staged)?;
        Ok(FoundTables {
            nodes,
            handles,
            lock_files,
            lost: lost_ids,
            next_node_id: state.next_node_id,
            next_handle_id: state.next_handle_id,
            report,
        })
    }

    /// Whether what the state holds fits the per-volume limits and the fd budget once
    /// the session before it is gone: the commit then cannot run out of room halfway.
    fn check_room(
        &self,
        volumes: &[Arc<Share>],
        nodes: &[FoundNode],
        handles: &[FoundHandle],
        lock_files: &[FoundLockFile],
        staged: Option<&Staged>,
    ) -> Result<(), LoadError> {
        let index = |share: &Arc<Share>| volumes.iter().position(|v| Arc::ptr_eq(v, share));
        let volume_of: IdMap<usize> = nodes
            .iter()
            .filter_map(|n| Some((n.data.nodeid, index(&n.data.share)?)))
            .collect();
        let volume = |node: u64| {
            volume_of.get(&node).copied().or_else(|| {
                staged
                    .and_then(|s| self.staged_node(s, node))
                    .and_then(|d| index(&d.share))
            })
        };
        // Per volume: nodes (its root included), handles, lock files; the staged
        // nodes are registered already (counted by their volume).
        let mut counts: Vec<[usize; 3]> = volumes
            .iter()
            .map(|v| {
                let registered = if staged.is_some() {
                    self.inodes.count_share(v)
                } else {
                    0
                };
                [1 + registered, 0, 0]
            })
            .collect();
        for v in volume_of.values() {
            counts[*v][0] += 1;
        }
        for node in handles.iter().map(|h| h.node) {
            if let Some(v) = volume(node) {
                counts[v][1] += 1;
            }
        }
        for node in lock_files.iter().map(|l| l.node) {
            if let Some(v) = volume(node) {
                counts[v][2] += 1;
            }
        }
        let limits = &self.cfg.limits;
        for (share, [n, h, l]) in volumes.iter().zip(&counts) {
            for (count, max, what) in [
                (n, limits.max_nodes, "--max-inodes"),
                (h, limits.max_handles, "--max-handles"),
                (l, limits.max_lock_files, "--max-lock-files"),
            ] {
                if *count > max {
                    return Err(LoadError::Volume {
                        name: share.name.clone(),
                        why: format!("the guest holds {count}, more than {what} {max}"),
                    });
                }
            }
        }
        let fds = volumes.len()
            + handles.len()
            + lock_files.len()
            + nodes
                .iter()
                .filter(|n| n.data.inode_ref().holds_fd())
                .count();
        let (used, max) = self.fd_budget();
        let fds = fds + if staged.is_some() { used } else { 0 };
        if fds > max {
            return Err(LoadError::Invalid(format!(
                "the guest holds {fds} open files, more than this daemon's budget of {max}"
            )));
        }
        Ok(())
    }

    /// Registers what [`Self::find_tables`] found in the session the caller started
    /// (the volume roots carry the state's ids already), and starts waiting for the
    /// locks another still held. An error leaves a partly registered session: the
    /// caller ends it.
    pub fn commit_tables(&self, found: FoundTables) -> io::Result<LoadReport> {
        let FoundTables {
            nodes,
            handles,
            lock_files,
            lost,
            next_node_id,
            next_handle_id,
            report,
        } = found;
        self.inodes.reserve_room(nodes.len());
        let mut live: IdMap<Arc<InodeData>> =
            IdMap::with_capacity_and_hasher(nodes.len(), Default::default());
        for n in nodes {
            let at = if n.name.is_empty() {
                FoundAt::NOWHERE
            } else {
                FoundAt {
                    parent: n.parent,
                    name: &n.name,
                }
            };
            let data = self.inodes.commit_found(n.data, n.lookups, at)?;
            live.insert(data.nodeid, data);
        }
        self.inodes.advance_next_id(next_node_id);
        // A registered node the load lost (its lock): it goes too.
        for &id in &lost {
            self.inodes.forget(id, u64::MAX);
        }
        self.mark_lost(&lost);
        let mut pending = Vec::new();
        // A node registered before (an upgrade's preloaded one) is in the table.
        let node_of = |id: u64| live.get(&id).cloned().or_else(|| self.inodes.get(id).ok());
        for h in handles {
            let Some(node) = node_of(h.node) else {
                continue;
            };
            let data = self.handles.insert_restored(h.id, node, h.file)?;
            if let Some(off) = h.dir_offset {
                // The stream's position, where the guest's next READDIR names it again
                // anyway.
                data.dir_offset.store(off, Ordering::Relaxed);
            }
            if let Some((kind, held)) = h.flock {
                data.set_flock(kind);
                if !held {
                    let op = if kind == libc::F_WRLCK {
                        libc::LOCK_EX
                    } else {
                        libc::LOCK_SH
                    };
                    pending.push(PendingLock::Flock { handle: data, op });
                }
            }
        }
        self.handles.advance_next_id(next_handle_id);
        for l in lock_files {
            let Some(node) = node_of(l.node) else {
                continue;
            };
            let own = l.file.try_clone()?;
            self.locks
                .insert_restored(node.clone(), l.owner, l.access, own, &l.ranges)?;
            for fl in l.pending {
                pending.push(PendingLock::Posix {
                    node: node.clone(),
                    file: l.file.clone(),
                    fl,
                });
            }
        }
        if !pending.is_empty() {
            self.wait_for_pending(pending);
        }
        Ok(report)
    }
}
