//! Per-volume request metrics, exported in Prometheus's text format by the control
//! API (`GET /metrics`, `exposition.rs`).
//!
//! Each volume counts, per FUSE operation ([`Op`]): requests that succeeded and
//! that failed, and, per errno class ([`ERRNO_CLASSES`]), its errors: every request,
//! exactly. Durations go into a histogram with fixed buckets, timed on a sample: the
//! first request of each drain of a queue, then one in [`SAMPLE_EVERY`]. A clock read
//! costs ~50 ns under this hypervisor (it traps the TSC), 2% of a small request:
//! timing every request was most of what metrics cost. At a low rate every request
//! is the first of its drain, so the histogram holds them all; at a high one it
//! holds one in 16, spread over the whole run.
//!
//! The counts are kept per queue worker ([`Counts`], one shard each, written by that
//! thread alone with a load and a store, no locked instruction) and summed when
//! read; threads that serve no queue share one shard, with atomic adds. The read-only
//! guard, where every request is already counted for its volume, records them
//! (`fs/readonly.rs`). Every label comes from a bounded set: operations and errno
//! classes are enumerated here, and volumes are bounded by the attach limit.

pub mod exposition;
pub mod process;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// After a drain's first request, one request in this many is timed.
pub const SAMPLE_EVERY: u32 = 16;

/// This thread's clock for the requests it serves.
#[derive(Clone, Copy)]
struct Clock {
    /// The clock read when the drain started, for its first request (polling reads
    /// it as the worker wakes).
    batch_start: Option<Instant>,
    /// Requests until the next timed one (0: the next is timed).
    countdown: u32,
    /// When the last timed request ended, and whether no request has been served
    /// since (then it is when the ring last changed hands).
    last_end: Option<Instant>,
    last_end_is_latest: bool,
}

thread_local! {
    static CLOCK: Cell<Clock> = const {
        Cell::new(Clock {
            batch_start: None,
            countdown: 0,
            last_end: None,
            last_end_is_latest: false,
        })
    };
    /// This thread's shard of the counts (a queue worker's own), or [`SHARED`].
    static SHARD: Cell<usize> = const { Cell::new(SHARED) };
}

fn with_clock<T>(f: impl FnOnce(&mut Clock) -> T) -> T {
    CLOCK.with(|c| {
        let mut clock = c.get();
        let out = f(&mut clock);
        c.set(clock);
        out
    })
}

/// A queue worker starts a batch of requests (it woke up to drain its ring): its
/// first request is timed, from the clock it reads then.
pub fn start_batch() {
    with_clock(|c| {
        *c = Clock {
            batch_start: None,
            countdown: 0,
            last_end: None,
            last_end_is_latest: false,
        }
    });
}

/// As [`start_batch`], for a worker that read the clock as it woke (to decide on
/// polling): the first request's clock starts at `now`, read once for both.
pub fn start_batch_at(now: Instant) {
    with_clock(|c| {
        *c = Clock {
            batch_start: Some(now),
            countdown: 0,
            last_end: Some(now),
            last_end_is_latest: true,
        }
    });
}

/// The start of a request's clock when it is timed (the first of its batch, then
/// one in [`SAMPLE_EVERY`]), else None. The first request's duration also holds the
/// ring and decoding work before it.
pub fn request_clock() -> Option<Instant> {
    with_clock(|c| {
        if c.countdown == 0 {
            c.countdown = SAMPLE_EVERY - 1;
            Some(c.batch_start.take().unwrap_or_else(Instant::now))
        } else {
            c.countdown -= 1;
            c.batch_start = None;
            c.last_end_is_latest = false;
            None
        }
    })
}

/// A recent time for a decision that may lag the clock a little but never run
/// ahead of it (QoS admission): when this thread's last timed request ended (at most
/// [`SAMPLE_EVERY`] requests ago), else the clock.
pub fn recent_clock() -> Instant {
    with_clock(|c| c.last_end).unwrap_or_else(Instant::now)
}

/// The time now, to within the request just served: the end of the last request
/// when it was timed, else a clock read (a drain's end, for polling's window).
pub fn latest_clock() -> Instant {
    match with_clock(|c| c.last_end.filter(|_| c.last_end_is_latest)) {
        Some(t) => t,
        None => Instant::now(),
    }
}

/// The timed request that started at `start` is done: its duration.
pub fn request_done(start: Instant) -> Duration {
    let now = Instant::now();
    with_clock(|c| {
        c.last_end = Some(now);
        c.last_end_is_latest = true;
    });
    now.duration_since(start)
}

/// The shard of threads that serve no queue.
const SHARED: usize = MAX_WORKERS;
/// Queue workers with a shard of their own; more share [`SHARED`].
const MAX_WORKERS: usize = 64;

/// This thread is queue worker `worker`: its requests are counted in its own
/// shard, which no other thread writes.
pub fn serve_as_worker(worker: usize) {
    SHARD.with(|s| s.set(worker.min(SHARED)));
}

/// The operations counted per volume: one per row of the operations' table that
/// names a metric (`fuse_ops.rs`).
pub use crate::fuse_ops::Op;

/// The errno classes errors are counted by: the ones a guest meets in normal use by
/// name, the rest as `other`.
pub const ERRNO_CLASSES: [(i32, &str); 22] = [
    (libc::ENOENT, "ENOENT"),
    (libc::EACCES, "EACCES"),
    (libc::EPERM, "EPERM"),
    (libc::EEXIST, "EEXIST"),
    (libc::ENOTEMPTY, "ENOTEMPTY"),
    (libc::ENOTDIR, "ENOTDIR"),
    (libc::EISDIR, "EISDIR"),
    (libc::EROFS, "EROFS"),
    (libc::ENOSPC, "ENOSPC"),
    (libc::EDQUOT, "EDQUOT"),
    (libc::EIO, "EIO"),
    (libc::EBADF, "EBADF"),
    (libc::EINVAL, "EINVAL"),
    (libc::ENFILE, "ENFILE"),
    (libc::ESTALE, "ESTALE"),
    (libc::ENODATA, "ENODATA"),
    (libc::EAGAIN, "EAGAIN"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::EXDEV, "EXDEV"),
    (libc::EINTR, "EINTR"),
    (libc::ENAMETOOLONG, "ENAMETOOLONG"),
];
/// The index of `other` among the classes.
pub const OTHER_ERRNO: usize = ERRNO_CLASSES.len();

/// The class of an errno: its index in [`ERRNO_CLASSES`], or [`OTHER_ERRNO`].
pub fn errno_class(errno: i32) -> usize {
    ERRNO_CLASSES
        .iter()
        .position(|&(e, _)| e == errno)
        .unwrap_or(OTHER_ERRNO)
}

/// The histogram's upper bounds, in seconds (the `le` label), from 10 µs (a cached
/// getattr) to 10 s (a backend that stalls); slower requests land in `+Inf` only.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.5, 1.0, 10.0,
];
/// The same bounds in nanoseconds, for the request path.
const BUCKET_NANOS: [u64; 16] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    500_000_000,
    1_000_000_000,
    10_000_000_000,
];

/// One shard of a volume's exact counts.
struct Counts {
    /// Per operation: requests that succeeded, and that failed.
    ops: [[AtomicU64; 2]; Op::ALL.len()],
    errnos: [AtomicU64; ERRNO_CLASSES.len() + 1],
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            ops: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
            errnos: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Adds one: a load and a store in a worker's own shard, which only it writes; an
/// atomic add in the shared one.
#[inline]
fn bump(counter: &AtomicU64, own: bool) {
    if own {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    } else {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One operation's timed requests: per bucket (not cumulative; the exposition adds
/// them up; the last one is above every bound), and their durations' sum.
#[derive(Default)]
struct Timed {
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    nanos: AtomicU64,
}

/// One operation's counters, each read once.
pub struct OpSnapshot {
    pub ok: u64,
    pub errors: u64,
    /// Timed requests per bucket, not cumulative.
    pub buckets: [u64; DURATION_BUCKETS.len() + 1],
    pub duration_nanos: u64,
}

impl OpSnapshot {
    pub fn count(&self) -> u64 {
        self.ok + self.errors
    }

    /// The requests timed.
    pub fn timed(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// Every counter of one volume.
pub struct VolumeMetrics {
    /// The exact counts: one shard per queue worker that served this volume, made
    /// when it first did, and the shared one (the last).
    shards: [OnceLock<Box<Counts>>; MAX_WORKERS + 1],
    timed: [Timed; Op::ALL.len()],
}

impl Default for VolumeMetrics {
    fn default() -> Self {
        VolumeMetrics {
            shards: std::array::from_fn(|_| OnceLock::new()),
            timed: std::array::from_fn(|_| Timed::default()),
        }
    }
}

impl VolumeMetrics {
    /// Counts one request: its operation, its errno (None: it succeeded) and, when
    /// it was timed, how long it took.
    pub fn record(&self, op: Op, took: Option<Duration>, errno: Option<i32>) {
        let shard = SHARD.with(|s| s.get());
        let counts = self.shards[shard].get_or_init(Box::default);
        let own = shard != SHARED;
        bump(&counts.ops[op as usize][usize::from(errno.is_some())], own);
        if let Some(e) = errno {
            bump(&counts.errnos[errno_class(e)], own);
        }
        if let Some(took) = took {
            let t = &self.timed[op as usize];
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            let bucket = BUCKET_NANOS
                .iter()
                .position(|&b| nanos <= b)
                .unwrap_or(BUCKET_NANOS.len());
            t.buckets[bucket].fetch_add(1, Ordering::Relaxed);
            t.nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }

    fn shards(&self) -> impl Iterator<Item = &Counts> {
        self.shards.iter().filter_map(|s| s.get().map(|b| &**b))
    }

    /// One operation's counts, summed over the shards, and its timed requests.
    pub fn op(&self, op: Op) -> OpSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (mut ok, mut errors) = (0, 0);
        for c in self.shards() {
            ok += load(&c.ops[op as usize][0]);
            errors += load(&c.ops[op as usize][1]);
        }
        let t = &self.timed[op as usize];
        OpSnapshot {
            ok,
            errors,
            buckets: std::array::from_fn(|i| load(&t.buckets[i])),
            duration_nanos: load(&t.nanos),
        }
    }

    /// Errors of errno class `class` (an index of [`ERRNO_CLASSES`], or
    /// [`OTHER_ERRNO`]), summed over the shards.
    pub fn errors_of_class(&self, class: usize) -> u64 {
        self.shards()
            .map(|c| c.errnos[class].load(Ordering::Relaxed))
            .sum()
    }

    /// Requests recorded, every operation and result.
    pub fn requests(&self) -> u64 {
        self.shards()
            .flat_map(|c| c.ops.iter().flatten())
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_is_listed_once_with_its_own_name() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op:?} out of order");
        }
        let mut names: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
        assert_eq!(
            format!("{:?}", Op::copy_file_range),
            Op::copy_file_range.name()
        );
    }

    #[test]
    fn bucket_bounds_agree() {
        for (s, n) in DURATION_BUCKETS.iter().zip(BUCKET_NANOS) {
            assert_eq!((s * 1e9).round() as u64, n);
        }
        assert!(BUCKET_NANOS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_request_lands_in_its_bucket_and_class() {
        let m = VolumeMetrics::default();
        m.record(Op::read, Some(Duration::from_micros(30)), None);
        m.record(
            Op::read,
            Some(Duration::from_micros(10)),
            Some(libc::ENOENT),
        );
        m.record(Op::read, Some(Duration::from_secs(60)), Some(libc::E2BIG));
        m.record(Op::read, None, None);
        let r = m.op(Op::read);
        assert_eq!((r.ok, r.errors, r.count(), r.timed()), (2, 2, 4, 3));
        assert_eq!(r.buckets[0], 1, "10 µs is in the first bucket");
        assert_eq!(r.buckets[2], 1, "30 µs is under 50 µs");
        assert_eq!(r.buckets[DURATION_BUCKETS.len()], 1);
        assert_eq!(r.duration_nanos, 60_000_040_000);
        assert_eq!(m.requests(), 4);
        assert_eq!(m.errors_of_class(errno_class(libc::ENOENT)), 1);
        assert_eq!(m.errors_of_class(OTHER_ERRNO), 1);
    }

    #[test]
    fn workers_count_in_shards_of_their_own_and_reads_sum_them() {
        let m = std::sync::Arc::new(VolumeMetrics::default());
        let threads: Vec<_> = (0..3)
            .map(|w| {
                let m = m.clone();
                std::thread::spawn(move || {
                    serve_as_worker(w);
                    for _ in 0..1000 {
                        m.record(Op::getattr, None, None);
                    }
                })
            })
            .collect();
        for _ in 0..1000 {
            m.record(Op::getattr, None, Some(libc::EIO));
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
        let g = m.op(Op::getattr);
        assert_eq!((g.ok, g.errors), (3000, 1000));
        assert_eq!(m.shards().count(), 4, "three workers and the shared shard");
    }

    #[test]
    fn the_first_request_of_a_batch_is_timed_then_one_in_sample_every() {
        start_batch();
        let timed: Vec<bool> = (0..2 * SAMPLE_EVERY + 1)
            .map(|_| match request_clock() {
                Some(t) => {
                    request_done(t);
                    true
                }
                None => false,
            })
            .collect();
        assert_eq!(timed.iter().filter(|&&t| t).count(), 3);
        assert!(timed[0] && timed[SAMPLE_EVERY as usize] && timed[2 * SAMPLE_EVERY as usize]);
        // A new batch times its first request again, from the wake-up's clock.
        let woke = Instant::now();
        start_batch_at(woke);
        assert_eq!(request_clock(), Some(woke));
        assert!(request_clock().is_none());
        assert!(
            latest_clock() >= woke,
            "an untimed request last: the clock is read"
        );
    }
}
