//! The guest's session saved as a device state: [`FsServer::save_session`] writes
//! what the stack holds for the guest (`state::format`): the volumes with their root
//! node ids and limits, the virtual directories, the FUSE session, and the
//! passthrough layer's nodes, handles and locks (`passthrough/state/save.rs`).
//! Loading it is `session_load.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::passthrough::state::SavedTables;
use super::server::FsServer;
use super::share::Share;
use crate::qos::{BucketConfig, RateLimit};
use crate::state::format::{self, GuestView, SessionState};
use crate::state::SaveOptions;

/// What a save gives beside the state: the open files a destination on this host may
/// take over.
pub struct SavedFiles {
    pub lock_files: Vec<((u64, u64), Arc<std::fs::File>)>,
    pub flock_handles: Vec<(u64, Arc<super::handles::HandleData>)>,
}

pub(super) fn to_format(limit: Option<RateLimit>) -> Option<format::RateLimit> {
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

impl FsServer {
    /// The guest's session as it is now. The guest is stopped (the rings are), so
    /// nothing changes under the walk but what the host does to the volumes.
    pub fn save_session(&self, view: GuestView, opts: &SaveOptions) -> (SessionState, SavedFiles) {
        let (state, _, files) = self.save_with(view, opts, None);
        (state, files)
    }

    /// An upgrade's state after the preview this process took last
    /// (`passthrough/state/preview.rs`): the nodes it named that still live as
    /// previewed, the rest as [`Self::save_session`] has it. Without a preview, None.
    pub fn save_after_preview(
        &self,
        view: GuestView,
        opts: &SaveOptions,
    ) -> Option<(format::UpgradeState, SavedFiles)> {
        let (preview, ids) = self.volumes.passthrough().previewed_ids()?;
        let (state, previewed, files) = self.save_with(view, opts, Some(&ids));
        Some((
            format::UpgradeState {
                preview,
                previewed,
                state,
            },
            files,
        ))
    }

    /// A preview of the guest's nodes for an upgrade, taken while the guest is served
    /// (`passthrough/state/preview.rs`): the volumes and nodes as a state has them, no
    /// handles, locks, requests or INIT.
    pub fn preview_session(&self, view: GuestView, opts: &SaveOptions) -> format::Preview {
        let (shares, volumes, virtual_dirs) = self.saved_volumes();
        let passthrough = self.volumes.passthrough();
        let (id, nodes, keys) = passthrough.preview_nodes(&shares, opts);
        format::Preview {
            id,
            state: SessionState {
                written_by: format!("volfsd {}", env!("CARGO_PKG_VERSION")),
                config: view,
                fuse: None,
                volumes,
                virtual_dirs,
                nodes,
                next_node_id: passthrough.next_node_id(),
                handles: Vec::new(),
                next_handle_id: 1,
                locks: Vec::new(),
                parked: Vec::new(),
                handoff: None,
            },
            keys,
        }
    }

    /// The volumes as a state names them (each one's share at its index), and the
    /// virtual directories.
    fn saved_volumes(
        &self,
    ) -> (
        Vec<Arc<Share>>,
        Vec<format::Volume>,
        Vec<format::VirtualDir>,
    ) {
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
        (shares, volumes, virtual_dirs)
    }

    fn save_with(
        &self,
        view: GuestView,
        opts: &SaveOptions,
        previewed: Option<&super::passthrough::state::PreviewIds>,
    ) -> (SessionState, Vec<format::Previewed>, SavedFiles) {
        let (shares, volumes, virtual_dirs) = self.saved_volumes();
        let SavedTables {
            nodes,
            previewed,
            handles,
            locks,
            next_node_id,
            next_handle_id,
            lock_files,
            flock_handles,
        } = self
            .volumes
            .passthrough()
            .save_tables(&shares, opts, previewed);
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
            previewed,
            SavedFiles {
                lock_files,
                flock_handles,
            },
        )
    }
}
