//! The guest's session as a device state: [`FsServer::save_session`] writes what the
//! stack holds for the guest (`state::format`), [`FsServer::load_session`] makes a
//! daemon serve that guest on from it. The tables are the passthrough layer's
//! (`passthrough/state/`); here are the volumes, their node ids and the FUSE
//! session, which the load sets up first.
//!
//! A destination has its volumes attached before the load, by the same names (its
//! node agent attaches runtime volumes through the control socket first); the load
//! gives each volume root and virtual directory the node id the guest holds, and a
//! volume attached here that the state does not name keeps serving under new ids.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::init;
use super::passthrough::state::{HandedFiles, SavedTables};
use super::registry::VIRTUAL_BIT;
use super::server::FsServer;
use super::share::Share;
use crate::qos::{BucketConfig, QosError, RateLimit};
use crate::state::format::{self, GuestView, SessionState};
use crate::state::{LoadError, LoadOptions, LoadReport, SaveOptions};

/// Ids above this are only ever temporary, while volume roots change ids.
const TEMP_ID_BASE: u64 = 1 << 62;

/// What a save gives beside the state: the open files a destination on this host may
/// take over.
pub struct SavedFiles {
    pub lock_files: Vec<((u64, u64), Arc<std::fs::File>)>,
    pub flock_handles: Vec<(u64, Arc<super::handles::HandleData>)>,
}

fn to_format(limit: Option<RateLimit>) -> Option<format::RateLimit> {
    let bucket = |b: Option<BucketConfig>| {
        b.map(|b| format::Bucket {
            size: b.size,
            one_time_burst: b.one_time_burst,
            refill_time_ms: b.refill_time_ms,
        })
    };
    limit.map(|l| format::RateLimit {
        ops: bucket(l.ops),
        bandwidth: bucket(l.bandwidth),
    })
}

fn from_format(limit: &Option<format::RateLimit>) -> Result<Option<RateLimit>, QosError> {
    let bucket = |b: Option<format::Bucket>| {
        b.map(|b| BucketConfig {
            size: b.size,
            one_time_burst: b.one_time_burst,
            refill_time_ms: b.refill_time_ms,
        })
    };
    let Some(l) = limit else {
        return Ok(None);
    };
    let limit = RateLimit {
        ops: bucket(l.ops),
        bandwidth: bucket(l.bandwidth),
    };
    limit.check()?;
    Ok(Some(limit))
}

impl FsServer {
    /// The guest's session as it is now. The guest is stopped (the rings are), so
    /// nothing changes under the walk but what the host does to the volumes.
    pub fn save_session(&self, view: GuestView, opts: &SaveOptions) -> (SessionState, SavedFiles) {
        let registry = self.volumes.registry();
        let mut shares: Vec<Arc<Share>> = Vec::new();
        let mut volumes = Vec::new();
        for (share, root) in registry.list() {
            volumes.push(format::Volume {
                name: share.name.clone(),
                read_only: share.read_only,
                volume_id: share.volume_id.clone(),
                rate_limit: to_format(share.stats.qos.limit()),
                root,
            });
            shares.push(share);
        }
        let virtual_dirs = registry
            .virtual_dirs()
            .into_iter()
            .map(|(path, nodeid)| format::VirtualDir { path, nodeid })
            .collect();
        let SavedTables {
            nodes,
            handles,
            locks,
            next_node_id,
            next_handle_id,
            lock_files,
            flock_handles,
        } = self.volumes.passthrough().save_tables(&shares, opts);
        let fuse = self
            .initialized
            .load(Ordering::Acquire)
            .then(|| *self.session.lock().unwrap())
            .flatten();
        let state = SessionState {
            written_by: format!("volfsd {}", env!("CARGO_PKG_VERSION")),
            config: view,
            fuse,
            volumes,
            virtual_dirs,
            nodes,
            next_node_id,
            handles,
            next_handle_id,
            locks,
            parked: Vec::new(),
            handoff: None,
        };
        (
            state,
            SavedFiles {
                lock_files,
                flock_handles,
            },
        )
    }

    /// Serves the session `state` from now on. `view` is this daemon's; a state saved
    /// under another is refused. On an error nothing of the state is kept: the
    /// session is empty, as after a reset.
    pub fn load_session(
        &self,
        state: &SessionState,
        view: &GuestView,
        opts: &LoadOptions,
        handed: HandedFiles,
    ) -> Result<LoadReport, LoadError> {
        check_view(&state.config, view)?;
        // Whatever the daemon served before (a previous guest) ends here.
        self.start_over();
        let result = self.load_into_empty(state, opts, handed);
        if result.is_err() {
            self.start_over();
        }
        result
    }

    fn load_into_empty(
        &self,
        state: &SessionState,
        opts: &LoadOptions,
        handed: HandedFiles,
    ) -> Result<LoadReport, LoadError> {
        let shares = self.match_volumes(state)?;
        self.take_ids(state, &shares)?;
        if let Some(fuse) = state.fuse {
            let granted = init::negotiate(&*self.fs, fuse.offered).map_err(|errno| {
                LoadError::Invalid(format!(
                    "replaying the guest's FUSE INIT: {}",
                    std::io::Error::from_raw_os_error(errno)
                ))
            })?;
            if granted != fuse.granted {
                return Err(LoadError::Config {
                    option: "FUSE INIT",
                    saved: format!("flags {:#x} granted", fuse.granted),
                    here: format!(
                        "flags {granted:#x} (these differ: {:#x}; --posix-acl, --no-readdirplus, --no-announce-submounts or --cache?)",
                        granted ^ fuse.granted
                    ),
                });
            }
        }
        let report = self
            .volumes
            .passthrough()
            .restore_tables(state, &shares, opts, handed)?;
        if let Some(fuse) = state.fuse {
            self.set_session(Some(fuse));
            self.initialized.store(true, Ordering::Release);
        }
        Ok(report)
    }

    /// Each state volume's share here, by name, with its mode checked and its rate
    /// limit set as the state says.
    fn match_volumes(&self, state: &SessionState) -> Result<Vec<Arc<Share>>, LoadError> {
        let registry = self.volumes.registry();
        let here = registry.list();
        let mut names = HashSet::new();
        let mut shares = Vec::with_capacity(state.volumes.len());
        for v in &state.volumes {
            if !names.insert(v.name.as_str()) {
                return Err(LoadError::Invalid(format!(
                    "volume {:?} named twice",
                    v.name
                )));
            }
            let limit = from_format(&v.rate_limit).map_err(|why| LoadError::Volume {
                name: v.name.clone(),
                why: format!("its rate limit: {why}"),
            })?;
            let Some((share, _)) = here.iter().find(|(s, _)| s.name == v.name) else {
                return Err(LoadError::Volume {
                    name: v.name.clone(),
                    why: "not attached here: the guest holds files in it; attach it (PUT \
                          /volumes/NAME on the control socket, or --allowed-dir) before \
                          the device state is loaded"
                        .into(),
                });
            };
            if share.read_only != v.read_only {
                return Err(LoadError::Volume {
                    name: v.name.clone(),
                    why: format!(
                        "{} at the source, {} here",
                        if v.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        },
                        if share.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        }
                    ),
                });
            }
            if v.volume_id.is_some() && share.volume_id != v.volume_id {
                log::info!(
                    "volume {:?}: volume id {:?} at the source, {:?} here",
                    v.name,
                    v.volume_id,
                    share.volume_id
                );
            }
            share.stats.qos.set(limit);
            shares.push(share.clone());
        }
        Ok(shares)
    }

    /// Gives the volume roots and virtual directories the ids the guest holds; any
    /// other one attached here that would share an id with the state moves above
    /// every id of the state.
    fn take_ids(&self, state: &SessionState, shares: &[Arc<Share>]) -> Result<(), LoadError> {
        let registry = self.volumes.registry();
        let inodes = self.volumes.passthrough();
        let here = registry.list();
        let mut state_ids: HashSet<u64> = state.nodes.iter().map(|n| n.id).collect();
        for v in &state.volumes {
            state_ids.insert(v.root);
        }
        for d in &state.virtual_dirs {
            if d.nodeid & VIRTUAL_BIT == 0 || !state_ids.insert(d.nodeid) {
                return Err(LoadError::Invalid(format!(
                    "virtual directory {:?}: id {:#x}",
                    d.path, d.nodeid
                )));
            }
        }
        let mut next_free = state.next_node_id.max(inodes.next_node_id());
        let mut fresh = || {
            let id = next_free;
            next_free += 1;
            id
        };
        // Volume roots: the state's id for its volumes, a fresh one for a colliding
        // other.
        let mut roots: HashMap<u64, u64> = HashMap::new();
        for (share, root) in &here {
            let target = match shares.iter().position(|s| Arc::ptr_eq(s, share)) {
                Some(i) => state.volumes[i].root,
                None if state_ids.contains(root) => fresh(),
                None => continue,
            };
            if target != *root {
                roots.insert(*root, target);
            }
        }
        if roots
            .values()
            .any(|&id| id == 0 || id & VIRTUAL_BIT != 0 || id >= TEMP_ID_BASE)
        {
            return Err(LoadError::Invalid("a volume root's id out of range".into()));
        }
        // Virtual directories by path; the state's must exist here.
        let mut ids: HashMap<u64, u64> = HashMap::new();
        let vdirs_here: HashMap<String, u64> = registry.virtual_dirs().into_iter().collect();
        for d in &state.virtual_dirs {
            let Some(&here_id) = vdirs_here.get(&d.path) else {
                return Err(LoadError::Invalid(format!(
                    "virtual directory {:?} leads to no attached volume",
                    d.path
                )));
            };
            ids.insert(here_id, d.nodeid);
        }
        for (path, id) in &vdirs_here {
            if !state.virtual_dirs.iter().any(|d| &d.path == path) && state_ids.contains(id) {
                ids.insert(*id, fresh() | VIRTUAL_BIT);
            }
        }
        // Roots move in two steps, through ids nothing else uses, so that two volumes
        // can swap ids.
        let lookups = |id: u64| {
            state
                .nodes
                .iter()
                .find(|n| n.id == id)
                .map_or(1, |n| n.lookups)
        };
        let moves: Vec<(u64, u64)> = roots.iter().map(|(&a, &b)| (a, b)).collect();
        for (i, (from, _)) in moves.iter().enumerate() {
            inodes
                .renumber_root(*from, TEMP_ID_BASE + i as u64, 1)
                .map_err(|e| LoadError::Io(format!("moving volume root {from}: {e}")))?;
        }
        for (i, (_, to)) in moves.iter().enumerate() {
            inodes
                .renumber_root(TEMP_ID_BASE + i as u64, *to, lookups(*to))
                .map_err(|e| LoadError::Io(format!("moving volume root to {to}: {e}")))?;
        }
        for (share, root) in &here {
            if !roots.contains_key(root) && shares.iter().any(|s| Arc::ptr_eq(s, share)) {
                let _ = inodes.renumber_root(*root, *root, lookups(*root));
            }
        }
        ids.extend(roots);
        registry.renumber(&ids);
        inodes.advance_node_ids(next_free);
        Ok(())
    }
}

impl FsServer {
    /// Serves on the guest's session that a serving process killed under it recorded
    /// in journal half `half` (`journal/rebuild.rs`): loaded as a device state is,
    /// with what cannot be found again answering ESTALE. Returns the load's report
    /// and how many records named what is not there.
    pub fn recover_session(
        &self,
        half: crate::recovery::region::HalfView<'_>,
        view: &GuestView,
    ) -> Result<(LoadReport, usize), LoadError> {
        use super::journal::rebuild::{rebuild, HalfFacts, VolumeHere};
        let h = half.header();
        let fuse = (h.init_set.load(Ordering::Acquire) != 0).then(|| format::FuseSession {
            minor: h.init_minor.load(Ordering::Relaxed),
            offered: h.init_offered.load(Ordering::Relaxed),
            granted: h.init_granted.load(Ordering::Relaxed),
        });
        let facts = HalfFacts {
            next_node_id: h.next_node_id.load(Ordering::Relaxed),
            next_handle_id: h.next_handle_id.load(Ordering::Relaxed),
            fuse,
        };
        let here: Vec<VolumeHere> = self
            .volumes
            .registry()
            .list()
            .into_iter()
            .map(|(share, _)| VolumeHere {
                name: share.name.clone(),
                read_only: share.read_only,
                volume_id: share.volume_id.clone(),
                rate_limit: to_format(share.stats.qos.limit()),
            })
            .collect();
        let records = super::journal::read_half(half);
        let rebuilt = rebuild(records, facts, &here, view.clone());
        let opts = LoadOptions {
            on_error: crate::state::OnError::GuestError,
            after_crash: true,
        };
        let mut report = self.load_session(&rebuilt.state, view, &opts, HandedFiles::default())?;
        // Nodes found by path only must still be the inode the guest held.
        let passthrough = self.volumes.passthrough();
        for &(nodeid, dev, ino) in &rebuilt.inodes {
            if !passthrough.is_inode(nodeid, dev, ino) {
                report.lost_nodes += 1;
                report.nodes = report.nodes.saturating_sub(1);
            }
        }
        Ok((report, rebuilt.dropped))
    }
}

/// The options of `saved` and `here` must agree where the guest's view depends on them.
fn check_view(saved: &GuestView, here: &GuestView) -> Result<(), LoadError> {
    let differ = |option: &'static str, a: String, b: String| {
        if a == b {
            Ok(())
        } else {
            Err(LoadError::Config {
                option,
                saved: a,
                here: b,
            })
        }
    };
    differ("--cache", saved.cache.clone(), here.cache.clone())?;
    differ("--xattr", saved.xattr.to_string(), here.xattr.to_string())?;
    differ(
        "--allow-privileged-xattrs",
        saved.privileged_xattrs.to_string(),
        here.privileged_xattrs.to_string(),
    )?;
    differ(
        "--translate-uid",
        format!("{:?}", saved.translate_uid),
        format!("{:?}", here.translate_uid),
    )?;
    differ(
        "--translate-gid",
        format!("{:?}", saved.translate_gid),
        format!("{:?}", here.translate_gid),
    )?;
    let layout = |whole: bool| {
        if whole {
            "the whole SharedDir"
        } else {
            "--allowed-dir volumes"
        }
        .to_string()
    };
    differ(
        "--allowed-dir",
        layout(saved.whole_share),
        layout(here.whole_share),
    )
}
