//! Loading a saved session ([`FsServer::load_session`]): a device state from the VMM,
//! or the journal a killed serving process left ([`FsServer::recover_session`]).
//! Whatever it came from, it is untrusted, and it is loaded in three steps, so that a
//! load that fails changes nothing and the daemon serves on what it served:
//!
//! 1. **checked** whole against this daemon's own configuration, touching nothing
//!    ([`FsServer::plan_load`]): the options the guest's view depends on, the
//!    volumes (each one attached here by name, read-only as here), the id counters
//!    (bounded: `state::check_counters`), the volume roots and virtual directories
//!    (ids distinct, in range, of the layout this daemon serves), the FUSE INIT;
//! 2. **found** on the host (`passthrough/state/load.rs`): every node opened again,
//!    every handle reopened, every lock taken again or found still held, into a
//!    table of its own; nothing is registered;
//! 3. **applied** at once: the session before it ends, the volume roots and virtual
//!    directories take the state's ids, and what step 2 found is registered.
//!
//! Step 3 checks what it can in step 2 (the per-volume limits, the fd budget), so it
//! fails only if a volume is detached while it runs; it then ends with an empty
//! session and the volume roots back at their ids.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::init;
use super::inodes::InodeData;
use super::passthrough::state::HandedFiles;
use super::registry::{ROOT_ID, VIRTUAL_BIT};
use super::server::FsServer;
use super::share::Share;
use super::snapshot::to_format;
use crate::qos::{BucketConfig, QosError, RateLimit};
use crate::state::format::{self, GuestView, SessionState};
use crate::state::{LoadError, LoadOptions, LoadReport};

/// Ids above this are only ever temporary, while volume roots change ids.
const TEMP_ID_BASE: u64 = 1 << 62;

/// What step 1 decided: how the state maps onto this daemon.
struct LoadPlan {
    /// Each state volume's share here, and its root node (under its id here).
    shares: Vec<Arc<Share>>,
    roots: Vec<Arc<InodeData>>,
    /// Rate limits the state carries for volumes that have none here.
    limits: Vec<(Arc<Share>, RateLimit)>,
    /// Volume roots that change ids: (id here, id to take).
    root_moves: Vec<(u64, u64)>,
    /// The lookups each volume root takes, by its new id.
    root_lookups: HashMap<u64, u64>,
    /// Virtual directories that change ids: id here to id to take.
    vdir_ids: HashMap<u64, u64>,
    /// The node id counter after the load.
    next_node_id: u64,
    /// The FUSE session to serve on (None: the guest had not sent INIT).
    fuse: Option<format::FuseSession>,
}

fn invalid(why: impl Into<String>) -> LoadError {
    LoadError::Invalid(why.into())
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

fn mode(read_only: bool) -> &'static str {
    if read_only {
        "read-only"
    } else {
        "read-write"
    }
}

impl FsServer {
    /// Serves the session `state` from now on. `view` is this daemon's; a state saved
    /// under another is refused. A state refused for what it says changes nothing:
    /// the daemon serves on what it served (see the module's doc for the one case
    /// where it ends with an empty session instead).
    pub fn load_session(
        &self,
        state: &SessionState,
        view: &GuestView,
        opts: &LoadOptions,
        handed: HandedFiles,
    ) -> Result<LoadReport, LoadError> {
        let passthrough = self.volumes.passthrough();
        let acl = passthrough.acl_on();
        let found = self.plan_load(state, view).and_then(|plan| {
            let found =
                passthrough.find_tables(state, &plan.shares, &plan.roots, opts, handed, None)?;
            Ok((plan, found))
        });
        let (plan, found) = match found {
            Ok(v) => v,
            Err(e) => {
                // The INIT's replay may have changed what the guest's INIT set.
                passthrough.set_acl_on(acl);
                return Err(e);
            }
        };
        self.apply_load(plan, found)
    }

    /// Serves an upgrade's state after a preview (`passthrough/state/preview.rs`):
    /// its previewed nodes are the ones [`Self::preload_session`] registered (each
    /// one must be), the rest is loaded as [`Self::load_session`] loads a state. A
    /// refusal leaves the preloaded nodes registered, served by no session: a load
    /// of a whole state (the keeper's next step then) replaces them.
    pub fn load_upgrade(
        &self,
        up: &format::UpgradeState,
        view: &GuestView,
        opts: &LoadOptions,
        handed: HandedFiles,
    ) -> Result<LoadReport, LoadError> {
        let passthrough = self.volumes.passthrough();
        let acl = passthrough.acl_on();
        let state = &up.state;
        let found = self.plan_load(state, view).and_then(|plan| {
            if !plan.root_moves.is_empty() || plan.vdir_ids.iter().any(|(a, b)| a != b) {
                return Err(invalid(
                    "the volumes' roots here are not those of the preview preloaded",
                ));
            }
            crate::state::check_counters(state.next_node_id, state.next_handle_id)?;
            let matched =
                passthrough.match_preloaded(up.preview, &up.previewed, state.next_node_id)?;
            let found = passthrough.find_tables(
                state,
                &plan.shares,
                &plan.roots,
                opts,
                handed,
                Some(&matched.named),
            )?;
            Ok((plan, matched, found))
        });
        let (plan, matched, found) = match found {
            Ok(v) => v,
            Err(e) => {
                passthrough.set_acl_on(acl);
                return Err(e);
            }
        };
        // Applied: no new session (the preloaded nodes are in this one).
        if let Err(e) = passthrough.apply_matched(&matched) {
            self.start_over();
            return Err(LoadError::Io(format!(
                "the nodes preloaded here (an empty session now): {e}"
            )));
        }
        let named = matched.named.len();
        drop(matched);
        for (&id, &n) in &plan.root_lookups {
            let _ = passthrough.renumber_root(id, id, n);
        }
        passthrough.advance_node_ids(plan.next_node_id);
        let mut report = match passthrough.commit_tables(found) {
            Ok(report) => report,
            Err(e) => {
                self.start_over();
                return Err(LoadError::Io(format!(
                    "registering the loaded session (an empty session now): {e}"
                )));
            }
        };
        report.nodes += named;
        for (share, limit) in plan.limits {
            share.stats.qos.set(Some(limit));
        }
        if let Some(fuse) = plan.fuse {
            self.set_session(Some(fuse));
            self.initialized.store(true, Ordering::Release);
        }
        Ok(report)
    }

    /// Preloads an upgrade's preview into this process, which serves no session yet:
    /// its volumes checked and its nodes found as a state's are, and registered under
    /// their ids (no FUSE session is served from them: no INIT, no rings) for
    /// [`Self::load_upgrade`]. Returns how many nodes were kept, and how many not.
    pub fn preload_session(
        &self,
        preview: &format::Preview,
        view: &GuestView,
    ) -> Result<(usize, usize), LoadError> {
        let passthrough = self.volumes.passthrough();
        if preview.state.fuse.is_some() {
            return Err(invalid("a preview with a FUSE session"));
        }
        if self.initialized.load(Ordering::Acquire) || !passthrough.serves_nothing() {
            return Err(invalid(
                "a preview is preloaded only by a process that serves no session yet",
            ));
        }
        let plan = self.plan_load(&preview.state, view)?;
        let (found, not) = passthrough.find_preview(preview, &plan.shares, &plan.roots)?;
        let ids = found.node_ids();
        self.apply_load(plan, found)?;
        passthrough.stage(preview.id, &ids);
        Ok((ids.len(), not))
    }

    /// Step 1: the state checked against this daemon, nothing changed. (An upgrade's
    /// previewed nodes are registered here already: the preload moved the roots off
    /// their ids, and the table keeps ids unique.)
    fn plan_load(&self, state: &SessionState, view: &GuestView) -> Result<LoadPlan, LoadError> {
        check_view(&state.config, view)?;
        crate::state::check_counters(state.next_node_id, state.next_handle_id)?;
        let registry = self.volumes.registry();
        let passthrough = self.volumes.passthrough();
        let here = registry.list();
        let whole = !registry.is_volume_layout();

        // Volumes: each one attached here by name, as read-only as here.
        let mut names = HashSet::new();
        let mut shares = Vec::with_capacity(state.volumes.len());
        let mut roots = Vec::with_capacity(state.volumes.len());
        let mut limits = Vec::new();
        for v in &state.volumes {
            if !names.insert(v.name.as_str()) {
                return Err(invalid(format!("volume {:?} named twice", v.name)));
            }
            let limit = from_format(&v.rate_limit).map_err(|why| LoadError::Volume {
                name: v.name.clone(),
                why: format!("its rate limit: {why}"),
            })?;
            let Some((share, root_here)) = here.iter().find(|(s, _)| s.name == v.name) else {
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
                        mode(v.read_only),
                        mode(share.read_only)
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
            // A limit set here stays: the state only brings one where none is.
            match (share.stats.qos.limit(), limit) {
                (None, Some(l)) => limits.push((share.clone(), l)),
                (Some(here), Some(saved)) if here != saved => log::info!(
                    "volume {:?}: keeps its rate limit here ({}), not the state's ({})",
                    v.name,
                    crate::qos::describe(&here),
                    crate::qos::describe(&saved)
                ),
                _ => {}
            }
            let root =
                passthrough
                    .share_root(*root_here, share)
                    .ok_or_else(|| LoadError::Volume {
                        name: v.name.clone(),
                        why: "its root is not served here (being detached?)".into(),
                    })?;
            shares.push(share.clone());
            roots.push(root);
        }

        // Volume roots: distinct ids of nodes, below the counter, the mount root's
        // only in the whole-share layout (where the volume is the mount root).
        let mut root_ids = HashSet::new();
        for v in &state.volumes {
            let in_layout = if whole {
                v.root == ROOT_ID
            } else {
                v.root != ROOT_ID
            };
            if v.root == 0
                || v.root & VIRTUAL_BIT != 0
                || v.root >= state.next_node_id
                || !in_layout
                || !root_ids.insert(v.root)
            {
                return Err(invalid(format!(
                    "volume {:?}: root id {:#x} (another volume's, out of range, or not \
                     of this layout)",
                    v.name, v.root
                )));
            }
        }
        let mut state_ids: HashSet<u64> = state.nodes.iter().map(|n| n.id).collect();
        state_ids.extend(&root_ids);
        for d in &state.virtual_dirs {
            if d.nodeid & VIRTUAL_BIT == 0 || d.nodeid == ROOT_ID || !state_ids.insert(d.nodeid) {
                return Err(invalid(format!(
                    "virtual directory {:?}: id {:#x}",
                    d.path, d.nodeid
                )));
            }
        }
        let mut next_free = state.next_node_id.max(passthrough.next_node_id());
        let mut fresh = || {
            let id = next_free;
            next_free += 1;
            id
        };
        // Each root here takes its state volume's id; another one attached here that
        // would share an id with the state moves to a fresh one.
        let mut root_moves = Vec::new();
        let mut targets = HashSet::new();
        for (share, root) in &here {
            let target = match shares.iter().position(|s| Arc::ptr_eq(s, share)) {
                Some(i) => state.volumes[i].root,
                None if state_ids.contains(root) => fresh(),
                None => *root,
            };
            if !targets.insert(target) {
                return Err(invalid(format!("two volumes would take id {target:#x}")));
            }
            if target != *root {
                root_moves.push((*root, target));
            }
        }
        let lookups: HashMap<u64, u64> = state
            .nodes
            .iter()
            .filter(|n| root_ids.contains(&n.id))
            .map(|n| (n.id, n.lookups))
            .collect();
        let root_lookups = state
            .volumes
            .iter()
            .map(|v| (v.root, lookups.get(&v.root).copied().unwrap_or(1)))
            .collect();
        // Virtual directories by path; the state's must exist here.
        let mut vdir_ids: HashMap<u64, u64> = HashMap::new();
        let vdirs_here: HashMap<String, u64> = registry.virtual_dirs().into_iter().collect();
        for d in &state.virtual_dirs {
            let Some(&here_id) = vdirs_here.get(&d.path) else {
                return Err(invalid(format!(
                    "virtual directory {:?} leads to no attached volume",
                    d.path
                )));
            };
            vdir_ids.insert(here_id, d.nodeid);
        }
        for (path, id) in &vdirs_here {
            if !state.virtual_dirs.iter().any(|d| &d.path == path) && state_ids.contains(id) {
                vdir_ids.insert(*id, fresh() | VIRTUAL_BIT);
            }
        }

        // The guest's INIT, replayed: this daemon must grant what the source granted.
        if let Some(fuse) = state.fuse {
            let granted = init::negotiate(&*self.fs, fuse.offered).map_err(|errno| {
                invalid(format!(
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
        Ok(LoadPlan {
            shares,
            roots,
            limits,
            root_moves,
            root_lookups,
            vdir_ids,
            next_node_id: next_free,
            fuse: state.fuse,
        })
    }

    /// Step 3: the session before ends, and the loaded one is served from now on.
    fn apply_load(
        &self,
        plan: LoadPlan,
        found: crate::fs::passthrough::state::FoundTables,
    ) -> Result<LoadReport, LoadError> {
        let registry = self.volumes.registry();
        let passthrough = self.volumes.passthrough();
        drop(plan.roots);
        self.start_over();
        let lookups = |id: u64| plan.root_lookups.get(&id).copied().unwrap_or(1);
        if let Err(e) = self.move_roots(&plan.root_moves, lookups) {
            self.start_over();
            return Err(LoadError::Io(format!(
                "giving the volume roots their ids: {e}"
            )));
        }
        for (&id, &n) in &plan.root_lookups {
            if !plan.root_moves.iter().any(|&(_, to)| to == id) {
                let _ = passthrough.renumber_root(id, id, n);
            }
        }
        let mut ids = plan.vdir_ids.clone();
        ids.extend(plan.root_moves.iter().copied());
        registry.renumber(&ids);
        passthrough.advance_node_ids(plan.next_node_id);
        let report = match passthrough.commit_tables(found) {
            Ok(report) => report,
            Err(e) => {
                // Only a volume detached meanwhile gets here: the session is given
                // up, and the volume roots go back to their ids.
                self.start_over();
                let back: Vec<(u64, u64)> = plan
                    .root_moves
                    .iter()
                    .map(|&(from, to)| (to, from))
                    .collect();
                if let Err(e) = self.move_roots(&back, |_| 1) {
                    log::error!("putting the volume roots back at their ids: {e}");
                }
                let inverse: HashMap<u64, u64> = ids.iter().map(|(&a, &b)| (b, a)).collect();
                registry.renumber(&inverse);
                return Err(LoadError::Io(format!(
                    "registering the loaded session (an empty session now): {e}"
                )));
            }
        };
        for (share, limit) in plan.limits {
            share.stats.qos.set(Some(limit));
        }
        if let Some(fuse) = plan.fuse {
            self.set_session(Some(fuse));
            self.initialized.store(true, Ordering::Release);
        }
        Ok(report)
    }

    /// Gives each volume root of `moves` (id here, id to take) its new id, in two
    /// steps through ids nothing else uses (two volumes may swap ids). On an error,
    /// what was moved goes back.
    fn move_roots(
        &self,
        moves: &[(u64, u64)],
        lookups: impl Fn(u64) -> u64,
    ) -> std::io::Result<()> {
        let passthrough = self.volumes.passthrough();
        let temp = |i: usize| TEMP_ID_BASE + i as u64;
        for (i, (from, _)) in moves.iter().enumerate() {
            if let Err(e) = passthrough.renumber_root(*from, temp(i), 1) {
                for (j, (from, _)) in moves.iter().enumerate().take(i) {
                    let _ = passthrough.renumber_root(temp(j), *from, 1);
                }
                return Err(e);
            }
        }
        for (i, (_, to)) in moves.iter().enumerate() {
            if let Err(e) = passthrough.renumber_root(temp(i), *to, lookups(*to)) {
                for (j, (from, to)) in moves.iter().enumerate() {
                    let at = if j < i { *to } else { temp(j) };
                    let _ = passthrough.renumber_root(at, *from, 1);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// The session the journal half `half` records, as a device state for this
    /// daemon's volumes (by name) and `view`: the half header's facts (id counters,
    /// the guest's FUSE INIT) and its records, rebuilt by `journal/rebuild.rs`. What
    /// [`Self::recover_session`] loads; a test compares it with [`Self::save_session`]
    /// (`journal/agreement.rs`).
    pub(crate) fn rebuild_journal(
        &self,
        half: crate::region::HalfView<'_>,
        view: &GuestView,
    ) -> super::journal::rebuild::Rebuilt {
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
        rebuild(super::journal::read_half(half), facts, &here, view.clone())
    }

    /// Serves on the guest's session that a serving process killed under it recorded
    /// in journal half `half` (`journal/rebuild.rs`): loaded as a device state is,
    /// with what cannot be found again answering ESTALE. Returns the load's report
    /// and how many records named what is not there.
    ///
    /// The volumes are this daemon's (its command line, its control socket): a
    /// volume the journal names that is not attached here is named in a warning,
    /// and the guest's files in it answer ESTALE.
    pub fn recover_session(
        &self,
        half: crate::region::HalfView<'_>,
        view: &GuestView,
    ) -> Result<(LoadReport, usize), LoadError> {
        let rebuilt = self.rebuild_journal(half, view);
        for name in &rebuilt.missing_volumes {
            log::warn!(
                "{}, which the guest's session held, is not attached to this daemon: the \
                 guest's files in it answer ESTALE (attach it before the frontend \
                 reconnects, or name it on the command line)",
                crate::state::VolumeLabel(name)
            );
        }
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
