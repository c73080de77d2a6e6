//! Per-volume request metrics, exported in Prometheus's text format by the control
//! API (`GET /metrics`, `exposition.rs`).
//!
//! Each volume counts, per FUSE operation ([`Op`]): requests that succeeded and
//! that failed, and their durations in a histogram with fixed buckets; and, per errno
//! class ([`ERRNO_CLASSES`]), its errors. The read-only guard, where every request is
//! already counted for its volume, records them (`fs/readonly.rs`). Every label
//! comes from a bounded set: operations and errno classes are enumerated here, and
//! volumes are bounded by the attach limit. All counters are relaxed atomics, two
//! adds per request (three when it failed), no lock.

pub mod exposition;
pub mod process;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

thread_local! {
    /// When this thread's previous volume request ended, within the current batch.
    static LAST_END: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// A queue worker starts a batch of requests (it woke up to drain its ring): the
/// next request's clock starts now, not at the end of the previous batch.
pub fn start_batch() {
    LAST_END.with(|c| c.set(None));
}

/// As [`start_batch`], for a worker that read the clock as it woke (to decide on
/// polling): the first request's clock starts at `now`, read once for both.
pub fn start_batch_at(now: Instant) {
    LAST_END.with(|c| c.set(Some(now)));
}

/// The start of a request's clock: the end of this thread's previous volume request
/// in the batch (back to back, so one clock read per request serves as the end of
/// one and the start of the next), else now. A request's duration therefore also
/// holds the ring and decoding work just before it. Clock reads are the whole cost
/// of the histogram: about 65 ns each under a hypervisor that traps the TSC.
pub fn request_clock() -> Instant {
    LAST_END.with(|c| c.take()).unwrap_or_else(Instant::now)
}

/// A recent time for a decision that may lag the clock a little but never run
/// ahead of it (QoS admission): the end of this thread's previous request in the
/// batch, read for the histogram, else the clock. With `--no-metrics` no request
/// reads the clock, so this always does.
pub fn recent_clock() -> Instant {
    LAST_END.with(|c| c.get()).unwrap_or_else(Instant::now)
}

/// The request that started at `start` is done: its duration, and the next one's
/// start.
pub fn request_done(start: Instant) -> Duration {
    let now = Instant::now();
    LAST_END.with(|c| c.set(Some(now)));
    now.duration_since(start)
}

/// Declares [`Op`] with its variants, [`Op::ALL`] in declaration order, and
/// [`Op::name`] (the variant's own name): one list, not three.
macro_rules! ops {
    ($($op:ident),* $(,)?) => {
        /// The FUSE operations counted per volume, named as the `op` label shows them.
        /// Variant names are the `FileSystem` method names, so that the read-only
        /// guard, generated from the one list of operations (`fs/ops.rs`), names each
        /// operation by its method.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, Eq, PartialEq)]
        #[repr(usize)]
        pub enum Op {
            $($op),*
        }

        impl Op {
            pub const ALL: [Op; [$(Op::$op),*].len()] = [$(Op::$op),*];

            /// The `op` label.
            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$op => stringify!($op)),*
                }
            }
        }
    };
}

ops! {
    lookup, getattr, setattr, readlink, symlink, mknod, mkdir, unlink, rmdir, rename,
    link, open, create, read, write, flush, fsync, fallocate, release, statfs, setxattr,
    getxattr, listxattr, removexattr, opendir, readdir, readdirplus, fsyncdir,
    releasedir, access, lseek, getlk, setlk, setlkw, tmpfile, copy_file_range, syncfs,
}

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

/// One operation's counters on one volume. Requests are counted once, in their
/// duration bucket, by result: a request costs two atomic adds (its bucket and the
/// duration sum), not a third for a separate total (a locked add is ~9 ns here, a
/// clock read ~32 ns: `benches/clock-cost.c`). Sums of counters that only grow still
/// only grow, so the totals derived from them are counters too.
#[derive(Default)]
pub struct OpMetrics {
    /// Succeeded requests per bucket, not cumulative (the exposition adds them up);
    /// the last one is above every bound.
    pub ok: [AtomicU64; DURATION_BUCKETS.len() + 1],
    /// Failed requests per bucket, the same way.
    pub errors: [AtomicU64; DURATION_BUCKETS.len() + 1],
    pub duration_nanos: AtomicU64,
}

/// One operation's counters, each read once.
pub struct OpSnapshot {
    pub ok: u64,
    pub errors: u64,
    /// Requests per bucket, ok and failed, not cumulative.
    pub buckets: [u64; DURATION_BUCKETS.len() + 1],
    pub duration_nanos: u64,
}

impl OpSnapshot {
    pub fn count(&self) -> u64 {
        self.ok + self.errors
    }
}

impl OpMetrics {
    pub fn snapshot(&self) -> OpSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut buckets = [0; DURATION_BUCKETS.len() + 1];
        let (mut ok, mut errors) = (0, 0);
        for (i, b) in buckets.iter_mut().enumerate() {
            let (o, e) = (load(&self.ok[i]), load(&self.errors[i]));
            *b = o + e;
            ok += o;
            errors += e;
        }
        OpSnapshot {
            ok,
            errors,
            buckets,
            duration_nanos: load(&self.duration_nanos),
        }
    }
}

/// Every counter of one volume.
pub struct VolumeMetrics {
    pub ops: [OpMetrics; Op::ALL.len()],
    pub errnos: [AtomicU64; ERRNO_CLASSES.len() + 1],
}

impl Default for VolumeMetrics {
    fn default() -> Self {
        VolumeMetrics {
            ops: std::array::from_fn(|_| OpMetrics::default()),
            errnos: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl VolumeMetrics {
    /// Counts one request: its operation, how long it took, and its errno (None: it
    /// succeeded).
    pub fn record(&self, op: Op, took: Duration, errno: Option<i32>) {
        let m = &self.ops[op as usize];
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BUCKET_NANOS
            .iter()
            .position(|&b| nanos <= b)
            .unwrap_or(BUCKET_NANOS.len());
        match errno {
            None => m.ok[bucket].fetch_add(1, Ordering::Relaxed),
            Some(e) => {
                self.errnos[errno_class(e)].fetch_add(1, Ordering::Relaxed);
                m.errors[bucket].fetch_add(1, Ordering::Relaxed)
            }
        };
        m.duration_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Requests recorded, every operation and result.
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|m| m.snapshot().count()).sum()
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
        m.record(Op::read, Duration::from_micros(30), None);
        m.record(Op::read, Duration::from_micros(10), Some(libc::ENOENT));
        m.record(Op::read, Duration::from_secs(60), Some(libc::E2BIG));
        let r = m.ops[Op::read as usize].snapshot();
        assert_eq!((r.ok, r.errors, r.count()), (1, 2, 3));
        assert_eq!(r.buckets[0], 1, "10 µs is in the first bucket");
        assert_eq!(r.buckets[2], 1, "30 µs is under 50 µs");
        assert_eq!(r.buckets[DURATION_BUCKETS.len()], 1);
        assert_eq!(r.duration_nanos, 60_000_040_000);
        assert_eq!(m.requests(), 3);
        assert_eq!(
            m.errnos[errno_class(libc::ENOENT)].load(Ordering::Relaxed),
            1
        );
        assert_eq!(m.errnos[OTHER_ERRNO].load(Ordering::Relaxed), 1);
    }
}
