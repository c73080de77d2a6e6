//! The control API's endpoints: routing, request bodies, and the JSON they return.
//!
//! PUT    /volumes/{name}   attach   (201 created, 200 identical retry, 409 conflict or
//!                                   a path the host changed while it was attached)
//! PATCH  /volumes/{name}   change its rate limits (200, 404 unknown)
//! DELETE /volumes/{name}   detach   (204, 404 unknown)
//! GET    /volumes          list
//! GET    /volumes/{name}   one volume
//! GET    /health           frontend connected, active queues
//! GET    /metrics          Prometheus text format (metrics/exposition.rs)

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::http;
use crate::device::DeviceStats;
use crate::fs::names::{valid_volume_name, VOLUME_NAME_RULE};
use crate::fs::{resolve_share_path_in, AttachError, ShareInfo, ShareSpec, Volumes};
use crate::metrics::exposition::{self, Snapshot, VolumeSnapshot};
use crate::metrics::process::ProcessFiles;
use crate::qos::RateLimit;
use crate::region::Region;

/// `PUT /volumes/{name}` body. Unknown fields are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub volume_id: Option<String>,
    /// The directory the caller expects at `path` (as it stats it on the host, for
    /// example the root of the bind mount it just made): the attach is refused when
    /// the daemon sees another one there, as it does when a mount made after it
    /// started has not propagated into its namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<ExpectedDir>,
    /// Token buckets for its requests and bytes (absent: unlimited).
    #[serde(default)]
    pub rate_limiter: Option<RateLimit>,
}

/// `PATCH /volumes/{name}` body: `rate_limiter` must be given; null lifts the limits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    pub rate_limiter: Option<RateLimit>,
}

/// What a volume's limits held back.
#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct QosStats {
    /// Requests that waited for tokens.
    pub throttled_requests: u64,
    /// Requests waiting now.
    pub waiting_requests: u64,
    /// Seconds they waited, in all.
    pub wait_seconds: f64,
}

/// A directory's identity: `st_dev` and `st_ino`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct ExpectedDir {
    pub dev: u64,
    pub ino: u64,
}

#[derive(Debug, Deserialize, Serialize, PartialEq)]
pub struct VolumeStats {
    pub ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
}

#[derive(Debug, Deserialize, Serialize, PartialEq)]
pub struct VolumeInfo {
    pub name: String,
    pub volume_id: Option<String>,
    pub path: String,
    pub read_only: bool,
    /// Seconds since the Unix epoch.
    pub attached_at: u64,
    pub open_handles: usize,
    pub live_inodes: usize,
    pub stats: VolumeStats,
    /// The limits in force (absent: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimit>,
    #[serde(default)]
    pub qos: QosStats,
}

#[derive(Debug, Deserialize, Serialize, PartialEq)]
pub struct Health {
    pub frontend_connected: bool,
    pub active_queues: usize,
    pub request_queues: usize,
    pub shared_dir: String,
    pub volumes: usize,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct ErrorBody {
    pub error: String,
}

/// What an endpoint answers: a status and a body (JSON, but for `/metrics`).
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    fn json<T: Serialize>(status: u16, v: &T) -> Reply {
        Reply {
            status,
            content_type: http::JSON,
            body: serde_json::to_string(v).unwrap_or_else(|_| "{}".to_string()),
        }
    }

    pub fn error(status: u16, msg: impl Into<String>) -> Reply {
        Reply::json(status, &ErrorBody { error: msg.into() })
    }
}

/// `PUT /upgrade` (`volfsd ctl upgrade`): the keeper starts a new serving process
/// that takes over; this process answers how it went, then exits (src/keeper/).
/// A body `{"binary": PATH}` names the binary to run: only root and the daemon's
/// own user (`uid`, the client's) may, since the keeper runs it as the daemon's
/// user, outside the sandbox.
fn upgrade(uid: u32, own: u32, body: &[u8]) -> Reply {
    use crate::keeper::channel::{ask_upgrade, AskError};
    let binary = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            binary: Option<String>,
        }
        match serde_json::from_slice::<Body>(body) {
            Ok(b) => b.binary,
            Err(e) => return Reply::error(400, format!("PUT /upgrade: {e}")),
        }
    };
    if binary.is_some() && uid != 0 && uid != own {
        return Reply::error(
            403,
            format!(
                "uid {uid} may not choose the binary an upgrade runs (root and the \
                 daemon's own user may)"
            ),
        );
    }
    match ask_upgrade(binary.as_deref()) {
        Ok(pause) => Reply::json(
            200,
            &serde_json::json!({ "pause_ms": pause.as_millis() as u64 }),
        ),
        Err(e @ AskError::NoKeeper) => Reply::error(409, e.to_string()),
        Err(e) => Reply::error(500, e.to_string()),
    }
}

pub struct Api {
    volumes: Arc<Volumes>,
    /// SharedDir as the host names it: attach paths are given in these terms.
    shared_dir: PathBuf,
    /// Where the daemon reaches SharedDir now: "/" inside the sandbox.
    local_root: PathBuf,
    device: Arc<DeviceStats>,
    /// The serving process's /proc files, for its gauges in `/metrics`.
    process: Option<ProcessFiles>,
    /// The session region under a keeper: the keeper's counters in `/metrics`.
    region: Option<&'static Region>,
    /// The daemon's own uid (read at start: the control threads' seccomp filter
    /// has no geteuid).
    own_uid: u32,
}

impl Api {
    pub fn new(
        volumes: Arc<Volumes>,
        shared_dir: PathBuf,
        local_root: PathBuf,
        device: Arc<DeviceStats>,
    ) -> Self {
        Api {
            volumes,
            shared_dir,
            local_root,
            device,
            process: None,
            region: None,
            // SAFETY: geteuid cannot fail.
            own_uid: unsafe { libc::geteuid() },
        }
    }

    /// With the process gauges (RssAnon, CPU, start time) in `/metrics`.
    pub fn with_process_files(mut self, files: ProcessFiles) -> Self {
        self.process = Some(files);
        self
    }

    /// With the keeper's counters in `/metrics`, read from its session region.
    pub fn with_keeper_region(mut self, region: &'static Region) -> Self {
        self.region = Some(region);
        self
    }

    /// Serves one request of a client whose uid is not known to be privileged.
    pub fn handle(&self, method: &str, path: &str, body: &[u8]) -> Reply {
        self.handle_from(u32::MAX, method, path, body)
    }

    /// Serves one request of a client of uid `uid` (SO_PEERCRED, already admitted).
    pub fn handle_from(&self, uid: u32, method: &str, path: &str, body: &[u8]) -> Reply {
        let path = path.split('?').next().unwrap_or(path);
        let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        match (method, segments.as_slice()) {
            ("GET", ["health"]) => self.health(),
            ("GET", ["metrics"]) => self.metrics(),
            ("GET", ["volumes"]) => self.list(),
            ("GET", ["volumes", name]) => self.get(name),
            ("PUT", ["volumes", name]) => self.attach(name, body),
            ("PATCH", ["volumes", name]) => self.patch(name, body),
            ("DELETE", ["volumes", name]) => self.detach(name),
            ("PUT", ["upgrade"]) => upgrade(uid, self.own_uid, body),
            (_, ["health"])
            | (_, ["metrics"])
            | (_, ["volumes"])
            | (_, ["volumes", _])
            | (_, ["upgrade"]) => Reply::error(405, format!("{method} is not allowed on {path}")),
            _ => Reply::error(404, format!("no such endpoint: {path}")),
        }
    }

    /// Whether the directory at `rel` (under SharedDir, as the daemon sees it) is the
    /// one the caller expects.
    fn check_expected(&self, rel: &[String], expected: ExpectedDir) -> Result<(), NotExpected> {
        use std::os::unix::fs::MetadataExt;
        let local = rel.iter().fold(self.local_root.clone(), |p, c| p.join(c));
        let m = std::fs::metadata(&local).map_err(NotExpected::Stat)?;
        if (m.dev(), m.ino()) == (expected.dev, expected.ino) {
            return Ok(());
        }
        Err(NotExpected::Other {
            dev: m.dev(),
            ino: m.ino(),
            expected,
        })
    }

    fn health(&self) -> Reply {
        Reply::json(
            200,
            &Health {
                frontend_connected: self.device.connected.load(Ordering::Relaxed),
                active_queues: self.device.active_queues.load(Ordering::Relaxed),
                request_queues: self.device.queues.len().saturating_sub(1),
                shared_dir: self.shared_dir.display().to_string(),
                volumes: self.volumes.list().len(),
            },
        )
    }

    fn metrics(&self) -> Reply {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let shares = self.volumes.list();
        let snapshot = Snapshot {
            volumes: shares
                .iter()
                .map(|s| VolumeSnapshot {
                    name: &s.share.name,
                    metrics: &s.share.stats.metrics,
                    bytes_read: load(&s.share.stats.bytes_read),
                    bytes_written: load(&s.share.stats.bytes_written),
                    nodes: s.live_inodes,
                    handles: s.open_handles,
                    lock_files: s.share.usage.lock_files.load(Ordering::Relaxed),
                    throttled: load(&s.share.stats.qos.throttled),
                    waiting: load(&s.share.stats.qos.waiting),
                    wait_seconds: load(&s.share.stats.qos.waited_ns) as f64 / 1e9,
                    ops_limit: s
                        .share
                        .stats
                        .qos
                        .limit()
                        .and_then(|l| l.ops)
                        .map(|b| b.rate()),
                    bytes_limit: s
                        .share
                        .stats
                        .qos
                        .limit()
                        .and_then(|l| l.bandwidth)
                        .map(|b| b.rate()),
                })
                .collect(),
            queue_requests: self.device.queues.iter().map(|q| load(&q.served)).collect(),
            queue_in_flight: self
                .device
                .queues
                .iter()
                .map(|q| load(&q.in_flight))
                .collect(),
            frontend_connected: self.device.connected.load(Ordering::Relaxed),
            lock_waits: crate::device::later::lock_waiters(),
            fds: self.volumes.fd_budget(),
            process: self.process.as_ref().map(ProcessFiles::read),
            keeper: self
                .region
                .map(crate::metrics::exposition::KeeperStats::read),
        };
        Reply {
            status: 200,
            content_type: exposition::CONTENT_TYPE,
            body: exposition::render(&snapshot),
        }
    }

    fn list(&self) -> Reply {
        let v: Vec<VolumeInfo> = self.volumes.list().iter().map(info).collect();
        Reply::json(200, &v)
    }

    fn get(&self, name: &str) -> Reply {
        match self.volumes.get(name) {
            Some(s) => Reply::json(200, &info(&s)),
            None => Reply::error(404, format!("no volume named {name}")),
        }
    }

    fn attach(&self, name: &str, body: &[u8]) -> Reply {
        if !valid_volume_name(name) {
            return Reply::error(
                400,
                format!("volume name {name:?} must match {VOLUME_NAME_RULE}"),
            );
        }
        let req: AttachRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return Reply::error(400, format!("bad request body: {e}")),
        };
        let path =
            match resolve_share_path_in(&self.shared_dir, &self.local_root, Path::new(&req.path)) {
                Ok(p) => p,
                Err(why) => return Reply::error(400, format!("path {}: {why}", req.path)),
            };
        if let Some(expected) = req.expect {
            if let Err(why) = self.check_expected(&path.rel, expected) {
                return Reply::error(409, format!("path {}: {why}", req.path));
            }
        }
        if let Err(reply) = check_limit(req.rate_limiter.as_ref()) {
            return reply;
        }
        let spec = ShareSpec {
            guest: vec![name.to_string()],
            path,
            read_only: req.read_only,
            volume_id: req.volume_id,
            rate_limit: req.rate_limiter,
        };
        match self.volumes.attach(&spec) {
            Ok(_) => {
                self.tell_keeper();
                self.reply_volume(201, name)
            }
            Err(AttachError::AlreadyAttached(_)) => self.reply_volume(200, name),
            Err(AttachError::Conflict(msg)) => Reply::error(409, msg),
            Err(AttachError::NotVolumeLayout) => Reply::error(
                409,
                "the daemon serves the whole SharedDir; start it with --allowed-dir or \
                 --control-socket alone to manage volumes",
            ),
            // The host swapped the path after its check: the caller's to sort out, and
            // a retry may well succeed.
            Err(AttachError::PathChanged(msg)) => Reply::error(409, msg),
            Err(AttachError::Io(e)) => Reply::error(500, format!("attaching {name}: {e}")),
        }
    }

    fn reply_volume(&self, status: u16, name: &str) -> Reply {
        match self.volumes.get(name) {
            Some(s) => Reply::json(status, &info(&s)),
            None => Reply::error(500, format!("{name} vanished during attach")),
        }
    }

    /// Changes or lifts a volume's limits; the queues look at its waiting requests
    /// again at once.
    fn patch(&self, name: &str, body: &[u8]) -> Reply {
        // Parsed twice: serde reads a missing Option field as None, and a PATCH that
        // forgot `rate_limiter` must not lift the limits.
        let given = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .is_some_and(|v| v.get("rate_limiter").is_some());
        let req: PatchRequest = match serde_json::from_slice(body) {
            Ok(r) if given => r,
            Ok(_) => {
                return Reply::error(
                    400,
                    "bad request body: rate_limiter must be given (null lifts the limits)",
                )
            }
            Err(e) => return Reply::error(400, format!("bad request body: {e}")),
        };
        if let Err(reply) = check_limit(req.rate_limiter.as_ref()) {
            return reply;
        }
        let Some(s) = self.volumes.set_limit(name, req.rate_limiter) else {
            return Reply::error(404, format!("no volume named {name}"));
        };
        self.tell_keeper();
        log::info!(
            "{name}: rate limit now {}",
            s.share
                .stats
                .qos
                .limit()
                .map(|l| crate::qos::describe(&l))
                .unwrap_or_else(|| "none".into())
        );
        self.reply_volume(200, name)
    }

    /// Tells the keeper (under `--upgradable`) the volumes attached now, so that a
    /// serving process it starts after an upgrade or a crash attaches the same ones
    /// first ([`Self::restore_volumes`]); nothing without a keeper.
    fn tell_keeper(&self) {
        let list: Vec<serde_json::Value> = self
            .volumes
            .list()
            .iter()
            .map(|v| {
                let s = &v.share;
                serde_json::json!({
                    "name": s.name,
                    "volume": {
                        "path": s.host_path,
                        "read_only": s.read_only,
                        "volume_id": s.volume_id,
                        "rate_limiter": s.stats.qos.limit(),
                    },
                })
            })
            .collect();
        crate::keeper::channel::tell_volumes(&serde_json::Value::Array(list).to_string());
    }

    /// Makes the attached volumes those a previous serving process had (`json`, as
    /// [`Self::tell_keeper`] wrote it), in place of the command line's: the guest's
    /// session, loaded next, names them. One that cannot be attached again is
    /// logged; a state naming it then fails its load, and the upgrade is refused.
    pub fn restore_volumes(&self, json: &str) {
        let Ok(serde_json::Value::Array(list)) = serde_json::from_str(json) else {
            log::warn!("the keeper's list of attached volumes is not one: ignored");
            return;
        };
        let wanted: Vec<&str> = list.iter().filter_map(|v| v["name"].as_str()).collect();
        for v in self.volumes.list() {
            if !wanted.contains(&v.share.name.as_str()) {
                self.volumes.detach(&v.share.name);
            }
        }
        for v in &list {
            let (Some(name), Some(body)) = (v["name"].as_str(), v.get("volume")) else {
                continue;
            };
            let reply = self.attach(name, body.to_string().as_bytes());
            if reply.status >= 400 {
                log::warn!(
                    "volume {name}, attached before, could not be attached again: {}",
                    reply.body
                );
            }
        }
    }

    fn detach(&self, name: &str) -> Reply {
        let detached = self.volumes.detach(name);
        if detached.is_some() {
            self.tell_keeper();
        }
        match detached {
            Some(_) => Reply {
                status: 204,
                content_type: http::JSON,
                body: String::new(),
            },
            None => Reply::error(404, format!("no volume named {name}")),
        }
    }
}

/// A 400 for limits no bucket can run with.
fn check_limit(limit: Option<&RateLimit>) -> Result<(), Reply> {
    match limit.map(RateLimit::check) {
        Some(Err(why)) => Err(Reply::error(400, format!("rate_limiter: {why}"))),
        _ => Ok(()),
    }
}

fn info(s: &ShareInfo) -> VolumeInfo {
    let share = &s.share;
    VolumeInfo {
        name: share.name.clone(),
        volume_id: share.volume_id.clone(),
        path: share.host_path.display().to_string(),
        read_only: share.read_only,
        attached_at: share
            .attached_at
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        open_handles: s.open_handles,
        live_inodes: s.live_inodes,
        stats: VolumeStats {
            ops: share.stats.requests(),
            bytes_read: share.stats.bytes_read.load(Ordering::Relaxed),
            bytes_written: share.stats.bytes_written.load(Ordering::Relaxed),
            errors: share.stats.errors.load(Ordering::Relaxed),
        },
        rate_limiter: share.stats.qos.limit(),
        qos: QosStats {
            throttled_requests: share.stats.qos.throttled.load(Ordering::Relaxed),
            waiting_requests: share.stats.qos.waiting.load(Ordering::Relaxed),
            wait_seconds: share.stats.qos.waited_ns.load(Ordering::Relaxed) as f64 / 1e9,
        },
    }
}

/// Why an attach's path is not the directory the caller expected (`expect`): the
/// request's path is named by the reply.
#[derive(Debug)]
enum NotExpected {
    /// The daemon cannot stat the path.
    Stat(std::io::Error),
    /// The daemon sees another directory there.
    Other {
        dev: u64,
        ino: u64,
        expected: ExpectedDir,
    },
}

impl std::fmt::Display for NotExpected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotExpected::Stat(e) => write!(f, "{e}"),
            NotExpected::Other { dev, ino, expected } => write!(
                f,
                "the daemon sees another directory there (dev {dev} ino {ino}) than the \
                 expected one (dev {} ino {}): a mount made under SharedDir after the daemon \
                 started reaches its mount namespace only if SharedDir is a shared mount \
                 (mount --bind DIR DIR; mount --make-shared DIR, before starting the daemon)",
                expected.dev, expected.ino
            ),
        }
    }
}

impl std::error::Error for NotExpected {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_the_daemons_user_may_name_the_binary_of_an_upgrade() {
        let body = br#"{"binary": "/usr/bin/volfsd"}"#;
        let own = 1000;
        let r = upgrade(4242, own, body);
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(r.body.contains("may not choose the binary"), "{}", r.body);
        // Without a keeper, root and the daemon's own user get as far as the keeper.
        assert_eq!(upgrade(own, own, body).status, 409);
        assert_eq!(upgrade(0, own, body).status, 409);
        let anyone = upgrade(4242, own, b"");
        assert_eq!(anyone.status, 409, "no binary named: anyone allowed");
        assert_eq!(upgrade(own, own, br#"{"bin": 1}"#).status, 400);
    }
}
