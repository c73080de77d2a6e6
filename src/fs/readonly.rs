//! The read-only guard, the outermost layer of the stack, and the one place where
//! each request is counted against its volume on its way out.
//!
//! Review "is every mutation refused?" from the list of operations (`ops.rs`): its
//! `write` column refuses the operation with EROFS on a read-only volume, `read` lets
//! it through, and every operation on a node counts once (and its error, if any) for
//! the node's volume. The kernel enforces the same rule underneath (each read-only
//! volume is a read-only mount), so a mistake here still cannot write.

use std::cell::RefCell;
use std::io;
use std::sync::Arc;

use super::layer::fs_layer;
use super::share::{Share, ShareStats};
use super::sys::errno;
use super::volumes::VolumeFs;
use crate::metrics::{self, Op};

pub struct ReadOnlyGuard {
    inner: VolumeFs,
    /// Record each request's operation, duration and errno (`--no-metrics`: only the
    /// per-volume totals).
    metrics: bool,
}

impl ReadOnlyGuard {
    pub fn new(inner: VolumeFs, metrics: bool) -> Self {
        crate::logging::set_request_context(current_request);
        ReadOnlyGuard { inner, metrics }
    }

    pub fn inner(&self) -> &VolumeFs {
        &self.inner
    }

    /// Runs `run`, the operation `op` on `node`: refused with EROFS if it `mutates`
    /// a read-only volume, and counted for the volume (one lookup of its share),
    /// with its duration and errno unless metrics are off. Virtual directories belong
    /// to no volume and are not counted.
    fn guard<T>(
        &self,
        op: Op,
        node: u64,
        mutates: bool,
        run: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let Some(share) = self.inner.share_of(node) else {
            return run();
        };
        // With metrics on, the metrics count the request (and time one in a few).
        let started = if self.metrics {
            metrics::request_clock()
        } else {
            ShareStats::add(&share.stats.ops, 1);
            None
        };
        // The share is this thread's current request while it runs: every log line
        // written meanwhile names its volume and operation.
        let refused = mutates && share.read_only;
        let (share, r) = in_request(share, op, || {
            let r = if refused {
                Err(errno(libc::EROFS))
            } else {
                run()
            };
            if let Err(e) = &r {
                log::debug!("{} failed: {e}", op.name());
            }
            r
        });
        let errno = r
            .as_ref()
            .err()
            .map(|e| e.raw_os_error().unwrap_or(libc::EIO));
        if errno.is_some() {
            count_error(Some(&share));
        }
        if self.metrics {
            let took = started.map(metrics::request_done);
            share.stats.metrics.record(op, took, errno);
        }
        r
    }

    /// The read-only check alone, for the second node of a rename.
    fn refuse_if_read_only(&self, node: u64) -> io::Result<()> {
        match self.inner.share_of(node) {
            Some(s) if s.read_only => {
                count_error(Some(&s));
                Err(errno(libc::EROFS))
            }
            _ => Ok(()),
        }
    }
}

thread_local! {
    /// The volume and operation this thread is serving, for the log's fields.
    static CURRENT: RefCell<Option<(Arc<Share>, Op)>> = const { RefCell::new(None) };
}

/// Runs `f` with `share` and `op` as this thread's current request, and gives the
/// share back (moved in and out: no reference count is touched). The request
/// before it comes back even if `f` unwinds.
fn in_request<T>(share: Arc<Share>, op: Op, f: impl FnOnce() -> T) -> (Arc<Share>, T) {
    struct Restore(Option<(Arc<Share>, Op)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = outer);
        }
    }
    let restore = Restore(CURRENT.with(|c| c.replace(Some((share, op)))));
    let r = f();
    let (share, _) = CURRENT
        .with(|c| c.take())
        .expect("the current request is set while it runs");
    drop(restore);
    (share, r)
}

/// Calls `f` with the volume and operation of the request this thread is serving,
/// if any: the log's [`crate::logging::RequestContext`], registered by
/// [`ReadOnlyGuard::new`].
fn current_request(f: &mut crate::logging::RequestSink<'_>) {
    CURRENT.with(|c| match c.try_borrow() {
        Ok(current) => f(current.as_ref().map(|(s, op)| (s.name.as_str(), op.name()))),
        Err(_) => f(None),
    })
}

fn count_error(share: Option<&Share>) {
    if let Some(s) = share {
        ShareStats::add(&s.stats.errors, 1);
    }
}

// Every operation as the list's `read`/`write` column says: nothing differs.
fs_layer! {
    self: ReadOnlyGuard => inner;
    others = guard;
}
