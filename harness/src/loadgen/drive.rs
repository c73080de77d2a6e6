//! One queue's thread: QD jobs driven until the limit, completions counted per
//! volume and interval, latencies recorded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::driver::{self, SlotQueue};
use super::session::forget_batch;
use super::volumes::Series;
use super::workloads::{Ctx, Job, Step};
use super::{pattern, workloads};
use super::{Error, LgResult};
use crate::frontend::FuseQueue;

/// How many more operations may start: a deadline or a shared budget.
pub(crate) enum Limit {
    Until(Instant),
    Budget(AtomicU64),
}

impl Limit {
    pub(super) fn take(&self) -> bool {
        match self {
            Limit::Until(t) => Instant::now() < *t,
            Limit::Budget(left) => left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok(),
        }
    }
}

/// What one thread did for one volume.
#[derive(Default)]
pub(crate) struct VolOut {
    pub(crate) ops: u64,
    pub(crate) requests: u64,
    pub(crate) bytes: u64,
    pub(crate) lat_ns: Vec<u64>,
    pub(crate) series: Series,
}

impl VolOut {
    pub(crate) fn add(&mut self, other: VolOut) {
        self.ops += other.ops;
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.lat_ns.extend(other.lat_ns);
        self.series.merge(&other.series);
    }
}

#[derive(Default)]
pub(crate) struct ThreadOut {
    /// Per volume (one without `--volumes`).
    pub(crate) vols: Vec<VolOut>,
    pub(crate) forgets: HashMap<u64, u64>,
}

/// Drives QD jobs on one queue until the limit is reached and every started
/// operation has finished. Job `slot` works on volume `vol_of[slot]`; its
/// completions are counted there, in intervals from `start`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn drive(
    q: &mut SlotQueue,
    jobs: &mut [Box<dyn Job>],
    vol_of: &[usize],
    nvol: usize,
    ctx: &mut Ctx,
    limit: &Limit,
    hiprio: &Mutex<FuseQueue>,
    start: Instant,
) -> LgResult<ThreadOut> {
    let mut out = ThreadOut {
        vols: (0..nvol.max(1)).map(|_| VolOut::default()).collect(),
        ..Default::default()
    };
    for (v, vo) in out.vols.iter_mut().enumerate() {
        let share = vol_of.iter().filter(|&&x| x == v).count();
        if share > 0 {
            vo.lat_ns = Vec::with_capacity((1 << 16) / vol_of.len() * share);
        }
    }
    let qname = format!("queue {}", q.index());
    let on_queue = || Error::step(&qname);
    let mut active = 0usize;
    let submit =
        |q: &mut SlotQueue, slot: usize, req: driver::Req, fill: Option<workloads::Fill>| {
            if let Some(f) = fill {
                pattern::fill(f.seed, f.off, &mut q.payload_mut(slot)[..f.len]);
            }
            q.submit(slot, &req).map(|_| ()).map_err(on_queue())
        };
    for (slot, job) in jobs.iter_mut().enumerate() {
        if !limit.take() {
            break;
        }
        let (req, fill) = job.begin(ctx);
        submit(q, slot, req, fill)?;
        active += 1;
    }
    q.kick().map_err(on_queue())?;
    while active > 0 {
        // Take one completion (waiting if needed), then every one already
        // there, and kick once for all the resubmissions, like the driver.
        let mut first = true;
        loop {
            let (slot, step) = {
                let done = if first {
                    q.next_done()
                } else {
                    match q.try_next_done() {
                        Ok(Some(d)) => Ok(d),
                        Ok(None) => break,
                        Err(err) => Err(err),
                    }
                }
                .map_err(on_queue())?;
                first = false;
                let slot = done.slot;
                let vo = &mut out.vols[vol_of[slot]];
                vo.requests += 1;
                vo.lat_ns.push(done.latency.as_nanos() as u64);
                let step = jobs[slot].reply(ctx, done.error, done.body)?;
                (slot, step)
            };
            match step {
                Step::More(req, fill) => submit(q, slot, req, fill)?,
                Step::Done(bytes) => {
                    let vo = &mut out.vols[vol_of[slot]];
                    vo.ops += 1;
                    vo.bytes += bytes;
                    vo.series.record(start.elapsed(), bytes);
                    if limit.take() {
                        let (req, fill) = jobs[slot].begin(ctx);
                        submit(q, slot, req, fill)?;
                    } else {
                        active -= 1;
                    }
                }
            }
        }
        q.kick().map_err(on_queue())?;
        if ctx.forgets.len() >= ctx.forget_batch {
            forget_batch(hiprio, std::mem::take(&mut ctx.forgets))?;
        }
    }
    out.forgets = std::mem::take(&mut ctx.forgets);
    Ok(out)
}
