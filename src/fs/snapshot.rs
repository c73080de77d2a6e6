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
}
