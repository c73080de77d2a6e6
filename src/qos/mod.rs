//! Per-volume QoS: two token buckets per volume, one counting requests and one
//! counting the bytes they read or write.
//!
//! The buckets decide only *when* a request runs; where it waits is the queue's
//! business (`device/later/lines.rs`): a throttled request leaves the virtqueue and
//! waits in its volume's own line, so the requests of other volumes on the same
//! queue keep flowing.
//!
//! Never throttled: the hiprio queue, FORGET, BATCH_FORGET and INTERRUPT (they free
//! the daemon's resources or cancel a wait), INIT and DESTROY, and requests that name
//! no volume (the virtual directories above them).

pub mod bucket;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use bucket::{BucketConfig, BucketError, TokenBucket};

/// A rate limit that cannot be set: which option or bucket, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QosError {
    /// An option that is not `KEY=VALUE`.
    NotKeyValue(String),
    /// A value that is not a whole number.
    NotANumber { key: String, value: String },
    /// No such option.
    UnknownOption(String),
    /// A bucket's parameters it cannot run with.
    Bucket {
        bucket: &'static str,
        why: BucketError,
    },
}

impl std::fmt::Display for QosError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QosError::NotKeyValue(option) => write!(f, "'{option}' is not KEY=VALUE"),
            QosError::NotANumber { key, value } => {
                write!(f, "{key}: '{value}' is not a whole number")
            }
            QosError::UnknownOption(key) => {
                write!(f, "unknown option '{key}' (have {})", OPTIONS.join(", "))
            }
            QosError::Bucket { bucket, why } => write!(f, "{bucket}: {why}"),
        }
    }
}

impl std::error::Error for QosError {}

// The flag parsers and the control API report errors as text.
impl From<QosError> for String {
    fn from(e: QosError) -> String {
        e.to_string()
    }
}

/// A volume's limits: either bucket may be absent (no limit on that measure).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// One token per request.
    #[serde(default)]
    pub ops: Option<BucketConfig>,
    /// One token per byte a READ or WRITE asks for.
    #[serde(default)]
    pub bandwidth: Option<BucketConfig>,
}

impl RateLimit {
    pub fn check(&self) -> Result<(), QosError> {
        if let Some(b) = &self.ops {
            b.check()
                .map_err(|why| QosError::Bucket { bucket: "ops", why })?;
        }
        if let Some(b) = &self.bandwidth {
            b.check().map_err(|why| QosError::Bucket {
                bucket: "bandwidth",
                why,
            })?;
        }
        Ok(())
    }

    /// Whether it limits anything.
    pub fn is_empty(&self) -> bool {
        self.ops.is_none() && self.bandwidth.is_none()
    }

    /// Parses one `--allowed-dir` option (`ops_size=N`, `bw_refill_time_ms=MS`, ...)
    /// into `self`; the names are cloud-hypervisor's disk rate-limit options, with
    /// the refill time's unit in its name.
    pub fn set_option(&mut self, option: &str) -> Result<(), QosError> {
        let (key, value) = option
            .split_once('=')
            .ok_or_else(|| QosError::NotKeyValue(option.to_string()))?;
        let value: u64 = value.parse().map_err(|_| QosError::NotANumber {
            key: key.to_string(),
            value: value.to_string(),
        })?;
        let (bucket, field) = match key.split_once('_') {
            Some(("ops", field)) => (&mut self.ops, field),
            Some(("bw", field)) => (&mut self.bandwidth, field),
            _ => return Err(QosError::UnknownOption(key.to_string())),
        };
        let b = bucket.get_or_insert(BucketConfig {
            size: 0,
            one_time_burst: 0,
            refill_time_ms: DEFAULT_REFILL_TIME_MS,
        });
        match field {
            "size" => b.size = value,
            "one_time_burst" => b.one_time_burst = value,
            "refill_time_ms" => b.refill_time_ms = value,
            _ => return Err(QosError::UnknownOption(key.to_string())),
        }
        Ok(())
    }
}

/// A limit in words, for logs: `1000 requests per 1000 ms, 10485760 bytes per 1000 ms`.
pub fn describe(limit: &RateLimit) -> String {
    let one = |b: &BucketConfig, unit: &str| {
        let burst = if b.one_time_burst > 0 {
            format!(" (+{} once)", b.one_time_burst)
        } else {
            String::new()
        };
        format!("{} {unit} per {} ms{burst}", b.size, b.refill_time_ms)
    };
    let parts: Vec<String> = [
        limit.ops.as_ref().map(|b| one(b, "requests")),
        limit.bandwidth.as_ref().map(|b| one(b, "bytes")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

/// The `--allowed-dir` options.
pub const OPTIONS: [&str; 6] = [
    "ops_size",
    "ops_one_time_burst",
    "ops_refill_time_ms",
    "bw_size",
    "bw_one_time_burst",
    "bw_refill_time_ms",
];

/// The refill time of a bucket given on the command line without one: a second, so
/// that `ops_size=N` alone reads as N requests per second.
pub const DEFAULT_REFILL_TIME_MS: u64 = 1000;

/// What a request costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    pub ops: u64,
    pub bytes: u64,
}

/// Volumes with a limit now, across the process: with none, the queues do not look
/// up the volume of each request at all.
static LIMITED_VOLUMES: AtomicUsize = AtomicUsize::new(0);

pub fn any_limited() -> bool {
    LIMITED_VOLUMES.load(Ordering::Relaxed) > 0
}

struct Buckets {
    ops: Option<TokenBucket>,
    bandwidth: Option<TokenBucket>,
}

impl Buckets {
    fn take(&mut self, cost: Cost) {
        if let Some(t) = self.ops.as_mut() {
            t.take(cost.ops);
        }
        if let Some(t) = self.bandwidth.as_mut() {
            t.take(cost.bytes);
        }
    }
}

/// One volume's buckets and QoS counters.
#[derive(Default)]
pub struct VolumeQos {
    /// None: not limited.
    buckets: Mutex<Option<Buckets>>,
    /// Whether `buckets` is Some, read without the lock on every request.
    limited: AtomicBool,
    /// Requests that had to wait.
    pub throttled: AtomicU64,
    /// Nanoseconds they waited, in all.
    pub waited_ns: AtomicU64,
    /// Requests waiting now.
    pub waiting: AtomicU64,
}

impl VolumeQos {
    /// Sets, changes or (with None or an empty limit) lifts the volume's limits.
    /// Changed buckets start full, as new ones do; a bucket left as it was keeps its
    /// tokens.
    pub fn set(&self, limit: Option<RateLimit>) {
        let limit = limit.filter(|l| !l.is_empty());
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap();
        let was = buckets.is_some();
        *buckets = limit.map(|l| {
            let keep = |old: Option<TokenBucket>, new: Option<BucketConfig>| match (old, new) {
                (Some(b), Some(c)) if b.config() == c => Some(b),
                (_, c) => c.map(|c| TokenBucket::new(c, now)),
            };
            let (ops, bandwidth) = match buckets.take() {
                Some(b) => (b.ops, b.bandwidth),
                None => (None, None),
            };
            Buckets {
                ops: keep(ops, l.ops),
                bandwidth: keep(bandwidth, l.bandwidth),
            }
        });
        self.limited.store(buckets.is_some(), Ordering::Relaxed);
        match (was, buckets.is_some()) {
            (false, true) => {
                LIMITED_VOLUMES.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                LIMITED_VOLUMES.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// The limits in force (None: not limited).
    pub fn limit(&self) -> Option<RateLimit> {
        self.buckets.lock().unwrap().as_ref().map(|b| RateLimit {
            ops: b.ops.as_ref().map(TokenBucket::config),
            bandwidth: b.bandwidth.as_ref().map(TokenBucket::config),
        })
    }

    pub fn is_limited(&self) -> bool {
        self.limited.load(Ordering::Relaxed)
    }

    /// Takes `cost` from both buckets if both have it at `now`; else takes nothing
    /// and says how long until they may. Unlimited: always now.
    ///
    /// `now` may lag the real time a little (the queues pass the clock read that
    /// ended the previous request): the buckets then refill a little later, which
    /// never admits more than the limit. It must not run ahead.
    pub fn admit(&self, cost: Cost, now: Instant) -> Result<(), Duration> {
        let mut guard = self.buckets.lock().unwrap();
        let Some(b) = guard.as_mut() else {
            return Ok(());
        };
        let wait_ops = b
            .ops
            .as_mut()
            .map_or(Duration::ZERO, |t| t.wait_for(cost.ops, now));
        let wait_bytes = b
            .bandwidth
            .as_mut()
            .map_or(Duration::ZERO, |t| t.wait_for(cost.bytes, now));
        let wait = wait_ops.max(wait_bytes);
        if !wait.is_zero() {
            return Err(wait);
        }
        b.take(cost);
        Ok(())
    }

    /// Charges `cost` without waiting (a request too large to be held back, see
    /// `device/later/`): the requests after it wait for it instead.
    pub fn charge(&self, cost: Cost) {
        if let Some(b) = self.buckets.lock().unwrap().as_mut() {
            b.take(cost);
        }
    }

    /// A request that waited `waited` went on.
    pub fn waited(&self, waited: Duration) {
        self.waited_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Drop for VolumeQos {
    fn drop(&mut self) {
        self.set(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(size: u64, refill_time_ms: u64) -> Option<BucketConfig> {
        Some(BucketConfig {
            size,
            one_time_burst: 0,
            refill_time_ms,
        })
    }

    #[test]
    fn allowed_dir_options_build_the_buckets() {
        let mut l = RateLimit::default();
        for o in ["ops_size=1000", "bw_size=1048576", "bw_refill_time_ms=100"] {
            l.set_option(o).unwrap();
        }
        assert_eq!(l.ops, ops(1000, 1000));
        assert_eq!(
            l.bandwidth,
            Some(BucketConfig {
                size: 1 << 20,
                one_time_burst: 0,
                refill_time_ms: 100
            })
        );
        l.check().unwrap();
        assert!(l.set_option("ops_rate=1").is_err());
        assert!(l.set_option("iops_size=1").is_err());
        assert!(l.set_option("ops_size=-1").is_err());
        assert!(l.set_option("ops_size").is_err());
        let mut only_refill = RateLimit::default();
        only_refill.set_option("ops_refill_time_ms=10").unwrap();
        assert!(only_refill.check().is_err(), "a bucket needs its size");
    }

    #[test]
    fn both_buckets_must_have_the_cost_and_neither_is_taken_otherwise() {
        let q = VolumeQos::default();
        q.set(Some(RateLimit {
            ops: ops(10, 1000),
            bandwidth: Some(BucketConfig {
                size: 8192,
                one_time_burst: 0,
                refill_time_ms: 1000,
            }),
        }));
        let t = Instant::now();
        let read = Cost {
            ops: 1,
            bytes: 4096,
        };
        assert!(q.admit(read, t).is_ok());
        assert!(q.admit(read, t).is_ok());
        // The bytes ran out; the ops bucket keeps its 8 tokens.
        assert!(q.admit(read, t).is_err());
        let stat = Cost { ops: 1, bytes: 0 };
        for _ in 0..8 {
            assert!(q.admit(stat, t).is_ok());
        }
        assert!(q.admit(stat, t).is_err());
    }

    #[test]
    fn set_counts_limited_volumes_and_keeps_unchanged_buckets() {
        let t = Instant::now();
        let q = VolumeQos::default();
        q.set(Some(RateLimit {
            ops: ops(2, 1000),
            bandwidth: None,
        }));
        assert!(q.is_limited());
        assert!(any_limited());
        let one = Cost { ops: 1, bytes: 0 };
        q.admit(one, t).unwrap();
        q.admit(one, t).unwrap();
        // The same ops bucket again (a bandwidth limit added): still empty.
        q.set(Some(RateLimit {
            ops: ops(2, 1000),
            bandwidth: ops(1 << 20, 1000),
        }));
        assert!(q.admit(one, t).is_err());
        // A new ops bucket starts full.
        q.set(Some(RateLimit {
            ops: ops(3, 1000),
            bandwidth: None,
        }));
        assert!(q.admit(one, t).is_ok());
        q.set(Some(RateLimit::default()));
        assert!(!q.is_limited(), "an empty limit lifts it");
        assert!(q.admit(one, t).is_ok());
    }
}
