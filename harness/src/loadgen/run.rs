//! Running the workloads: the per-queue threads, the limits, the latency
//! percentiles, and [`run`], which connects and runs every workload in order.

use std::collections::HashMap;
use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::driver::{self, SlotQueue};
use super::prepare::{
    prepare_dir, prepare_read_file, prepare_write_file, say, verify_write_file, work_dir,
};
use super::session::{forget_batch, Session};
use super::workloads::{
    entry_name, Ctx, DataJob, GetattrJob, Job, LookupJob, MetaJob, ReaddirJob, Step,
};
use super::{
    e, Latency, LgResult, Options, Report, Workload, WorkloadResult, DIR_10K, LARGE_BLOCK,
    READ_FILE, WORK_DIR, WRITE_FILE,
};
use super::{pattern, workloads};
use crate::fixtures::host::{clock_ticks_per_second, tree_cpu_ticks};
use crate::frontend::{FuseOps, FuseQueue};

/// How many more operations may start: a deadline or a shared budget.
enum Limit {
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

#[derive(Default)]
struct ThreadOut {
    ops: u64,
    requests: u64,
    bytes: u64,
    lat_ns: Vec<u64>,
    forgets: HashMap<u64, u64>,
}

/// Drives QD jobs on one queue until the limit is reached and every started
/// operation has finished.
fn drive(
    q: &mut SlotQueue,
    jobs: &mut [Box<dyn Job>],
    ctx: &mut Ctx,
    limit: &Limit,
    hiprio: &Mutex<FuseQueue>,
) -> LgResult<ThreadOut> {
    let mut out = ThreadOut {
        lat_ns: Vec::with_capacity(1 << 16),
        ..Default::default()
    };
    let qname = format!("queue {}", q.index());
    let ctxq = |_: &SlotQueue| qname.clone();
    let mut active = 0usize;
    let submit =
        |q: &mut SlotQueue, slot: usize, req: driver::Req, fill: Option<workloads::Fill>| {
            if let Some(f) = fill {
                pattern::fill(f.seed, f.off, &mut q.payload_mut(slot)[..f.len]);
            }
            q.submit(slot, &req).map(|_| ()).map_err(e(ctxq(q)))
        };
    for (slot, job) in jobs.iter_mut().enumerate() {
        if !limit.take() {
            break;
        }
        let (req, fill) = job.begin(ctx);
        submit(q, slot, req, fill)?;
        active += 1;
    }
    q.kick().map_err(e(ctxq(q)))?;
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
                .map_err(e(&qname))?;
                first = false;
                out.requests += 1;
                out.lat_ns.push(done.latency.as_nanos() as u64);
                let slot = done.slot;
                let step = jobs[slot].reply(ctx, done.error, done.body)?;
                (slot, step)
            };
            match step {
                Step::More(req, fill) => submit(q, slot, req, fill)?,
                Step::Done(bytes) => {
                    out.ops += 1;
                    out.bytes += bytes;
                    if limit.take() {
                        let (req, fill) = jobs[slot].begin(ctx);
                        submit(q, slot, req, fill)?;
                    } else {
                        active -= 1;
                    }
                }
            }
        }
        q.kick().map_err(e(ctxq(q)))?;
        if ctx.forgets.len() >= ctx.forget_batch {
            forget_batch(hiprio, std::mem::take(&mut ctx.forgets))?;
        }
    }
    out.forgets = std::mem::take(&mut ctx.forgets);
    Ok(out)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64 / 1000.0
}

/// Runs one workload: per-thread setup (open handles), the timed part, teardown.
fn run_workload(s: &mut Session, opts: &Options, named: Workload) -> LgResult<WorkloadResult> {
    let w = named.kind();
    let q0 = &mut s.queues[0];
    let base = q0.lookup(1, WORK_DIR).map_err(e("LOOKUP work dir"))?.nodeid;
    let mut setup_forgets: HashMap<u64, u64> = HashMap::from([(base, 1)]);
    let mut written: Option<Arc<Vec<AtomicU64>>> = None;
    let mut write_path = None;
    let mut meta_dir = None;
    let block: u32 = match w {
        Workload::SeqRead1m | Workload::SeqWrite1m => (LARGE_BLOCK as u32).min(s.max_write),
        _ => 4096,
    };
    if u64::from(block) > opts.file_size {
        return Err(format!("--file-size must be at least {block}"));
    }

    // Node ids the jobs need.
    let mut file_node = 0;
    let mut dir_node = 0;
    let mut nodes: Arc<Vec<u64>> = Arc::new(Vec::new());
    match w {
        Workload::RandRead4k | Workload::SeqRead1m => {
            prepare_read_file(opts)?;
            file_node = q0
                .lookup(base, READ_FILE)
                .map_err(e("LOOKUP read file"))?
                .nodeid;
            *setup_forgets.entry(file_node).or_default() += 1;
        }
        Workload::RandWrite4k | Workload::SeqWrite1m => {
            write_path = Some(prepare_write_file(opts)?);
            file_node = q0
                .lookup(base, WRITE_FILE)
                .map_err(e("LOOKUP write file"))?
                .nodeid;
            *setup_forgets.entry(file_node).or_default() += 1;
            let blocks = opts.file_size.div_ceil(4096);
            written = Some(Arc::new(
                (0..blocks.div_ceil(64))
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            ));
        }
        Workload::Lookup | Workload::Getattr | Workload::Readdirplus => {
            prepare_dir(opts)?;
            dir_node = q0.lookup(base, DIR_10K).map_err(e("LOOKUP dir"))?.nodeid;
            *setup_forgets.entry(dir_node).or_default() += 1;
            if w == Workload::Getattr {
                let mut v = Vec::with_capacity(opts.files);
                for i in 0..opts.files {
                    let n = q0
                        .lookup(dir_node, &entry_name(i))
                        .map_err(e("LOOKUP entry"))?
                        .nodeid;
                    *setup_forgets.entry(n).or_default() += 1;
                    v.push(n);
                }
                nodes = Arc::new(v);
            }
        }
        Workload::Metadata => {
            let name = format!("meta-{}", std::process::id());
            let p = work_dir(opts).join(&name);
            let _ = fs::remove_dir_all(&p);
            fs::create_dir(&p).map_err(e(p.display()))?;
            meta_dir = Some(p);
            dir_node = q0.lookup(base, &name).map_err(e("LOOKUP meta dir"))?.nodeid;
            *setup_forgets.entry(dir_node).or_default() += 1;
        }
        Workload::Qd1Read4k | Workload::Qd1Getattr => unreachable!("kind() maps the QD1 workloads"),
    }

    // Each thread opens its own handle (like separate guest processes).
    let mut fhs = Vec::new();
    if file_node != 0 {
        let flags = if written.is_some() {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        } as u32;
        for q in s.queues.iter_mut() {
            fhs.push(q.open(file_node, flags).map_err(e("OPEN"))?.fh);
        }
    }

    let limit = match (opts.ops, opts.duration) {
        (Some(n), _) => Limit::Budget(AtomicU64::new(n)),
        (None, Some(d)) => Limit::Until(Instant::now() + d),
        (None, None) => Limit::Until(Instant::now() + Duration::from_secs(10)),
    };
    let (qd, nq) = if named.is_qd1() {
        (1, 1)
    } else {
        (opts.qd, s.queues.len())
    };
    let hiprio = &s.hiprio;
    let cpu_before = opts.daemon_pid.map(tree_cpu_ticks);
    let start = Instant::now();
    let results: Vec<LgResult<ThreadOut>> = std::thread::scope(|scope| {
        let handles: Vec<_> = s
            .queues
            .iter_mut()
            .take(nq)
            .enumerate()
            .map(|(t, q)| {
                let limit = &limit;
                let fh = fhs.get(t).copied().unwrap_or(0);
                let nodes = nodes.clone();
                let written = written.clone();
                let file_size = opts.file_size;
                let files = opts.files;
                scope.spawn(move || {
                    let mut ctx =
                        Ctx::new(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                    ctx.written = written;
                    if w == Workload::Metadata {
                        ctx.forget_batch = 16;
                    }
                    // Sequential streams: each thread starts at its share of the file.
                    let blocks = file_size / u64::from(block);
                    ctx.cursor = blocks / nq as u64 * t as u64;
                    let mut jobs: Vec<Box<dyn Job>> = (0..qd)
                        .map(|slot| -> Box<dyn Job> {
                            match w {
                                Workload::RandRead4k => Box::new(DataJob::new(
                                    file_node, fh, file_size, block, true, false,
                                )),
                                Workload::RandWrite4k => Box::new(DataJob::new(
                                    file_node, fh, file_size, block, true, true,
                                )),
                                Workload::SeqRead1m => Box::new(DataJob::new(
                                    file_node, fh, file_size, block, false, false,
                                )),
                                Workload::SeqWrite1m => Box::new(DataJob::new(
                                    file_node, fh, file_size, block, false, true,
                                )),
                                Workload::Lookup => Box::new(LookupJob::new(dir_node, files)),
                                Workload::Getattr => Box::new(GetattrJob::new(nodes.clone())),
                                Workload::Metadata => Box::new(MetaJob::new(dir_node, t, slot)),
                                Workload::Readdirplus => Box::new(ReaddirJob::new(dir_node, files)),
                                Workload::Qd1Read4k | Workload::Qd1Getattr => {
                                    unreachable!("kind() maps the QD1 workloads")
                                }
                            }
                        })
                        .collect();
                    drive(q, &mut jobs, &mut ctx, limit, hiprio)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("worker thread panicked".into()))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let daemon_cpu_seconds = opts.daemon_pid.zip(cpu_before).map(|(pid, before)| {
        tree_cpu_ticks(pid).saturating_sub(before) as f64 / clock_ticks_per_second()
    });

    let mut total = ThreadOut::default();
    let mut first_err = None;
    for r in results {
        match r {
            Ok(t) => {
                total.ops += t.ops;
                total.requests += t.requests;
                total.bytes += t.bytes;
                total.lat_ns.extend(t.lat_ns);
                for (k, v) in t.forgets {
                    *total.forgets.entry(k).or_default() += v;
                }
            }
            Err(err) => {
                first_err.get_or_insert(err);
            }
        }
    }
    if let Some(err) = first_err {
        return Err(format!("{}: {err}", named.name()));
    }

    // Teardown (not timed): handles, lookups, host-side checks, cleanup.
    if file_node != 0 {
        let flags = if written.is_some() {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        } as u32;
        for (q, fh) in s.queues.iter_mut().zip(&fhs) {
            q.release(file_node, *fh, flags).map_err(e("RELEASE"))?;
        }
    }
    for (k, v) in setup_forgets {
        *total.forgets.entry(k).or_default() += v;
    }
    s.forget_all(std::mem::take(&mut total.forgets))?;
    if let (Some(path), Some(bits)) = (&write_path, &written) {
        let n = verify_write_file(path, opts.file_size, bits)?;
        if n == 0 && total.ops > 0 {
            return Err(format!(
                "{}: no block of the write file was written",
                w.name()
            ));
        }
        if !opts.keep_files {
            let _ = fs::remove_file(path);
        }
    }
    if let Some(dir) = &meta_dir {
        let left: Vec<_> = fs::read_dir(dir)
            .map_err(e(dir.display()))?
            .filter_map(|d| d.ok())
            .map(|d| d.file_name())
            .collect();
        if !left.is_empty() {
            return Err(format!(
                "metadata: {} files left in {} after UNLINK (e.g. {:?})",
                left.len(),
                dir.display(),
                left[0]
            ));
        }
        fs::remove_dir(dir).map_err(e(dir.display()))?;
    }

    total.lat_ns.sort_unstable();
    let lat = &total.lat_ns;
    let mean = if lat.is_empty() {
        0.0
    } else {
        lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1000.0
    };
    Ok(WorkloadResult {
        workload: named.name().into(),
        op_unit: named.op_unit().into(),
        ops: total.ops,
        requests: total.requests,
        bytes: total.bytes,
        seconds,
        ops_per_sec: total.ops as f64 / seconds,
        requests_per_sec: total.requests as f64 / seconds,
        mib_per_sec: total.bytes as f64 / seconds / (1u64 << 20) as f64,
        latency: Latency {
            p50_us: percentile(lat, 0.50),
            p99_us: percentile(lat, 0.99),
            p999_us: percentile(lat, 0.999),
            mean_us: mean,
            max_us: lat.last().copied().unwrap_or(0) as f64 / 1000.0,
        },
        daemon_cpu_seconds,
        daemon_cpu_us_per_request: daemon_cpu_seconds
            .filter(|_| total.requests > 0)
            .map(|c| c * 1e6 / total.requests as f64),
        verified: true,
    })
}

/// Connects, runs every workload in order, cleans up; any failure is an error.
pub fn run(opts: &Options) -> LgResult<Report> {
    if opts.queues == 0 || opts.qd == 0 {
        return Err("--queues and --qd must be at least 1".into());
    }
    if opts.file_size < 4096 || !opts.file_size.is_multiple_of(4096) {
        return Err("--file-size must be a positive multiple of 4096".into());
    }
    if !opts.shared_dir.is_dir() {
        return Err(format!(
            "shared dir {} is not a directory",
            opts.shared_dir.display()
        ));
    }
    let wd = work_dir(opts);
    fs::create_dir_all(&wd).map_err(e(wd.display()))?;
    let mut session = Session::connect(opts)?;
    // For start-up measured to the first INIT reply (benches/footprint.py): the
    // same clock as Python's time.monotonic().
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    eprintln!(
        "loadgen: INIT-DONE monotonic_ns={}",
        i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec)
    );
    say(
        opts,
        &format!(
            "connected to {}: {} request queue(s), QD {}, max_write {}",
            opts.socket.display(),
            session.queues.len(),
            opts.qd,
            session.max_write
        ),
    );
    if !opts.idle_before.is_zero() {
        eprintln!("loadgen: IDLE connected, idle for {:?}", opts.idle_before);
        std::thread::sleep(opts.idle_before);
    }
    let held_inodes = match opts.hold_inodes {
        0 => None,
        n => Some(super::hold::hold(&mut session, opts, n)?),
    };
    let mut results = Vec::new();
    let mut outcome = Ok(());
    for &w in &opts.workloads {
        say(opts, &format!("running {}", w.name()));
        match run_workload(&mut session, opts, w) {
            Ok(r) => {
                say(
                    opts,
                    &format!(
                        "{}: {:.0} ops/s, {:.1} MiB/s, p99 {:.0} us (verified)",
                        r.workload, r.ops_per_sec, r.mib_per_sec, r.latency.p99_us
                    ),
                );
                results.push(r);
            }
            Err(err) => {
                outcome = Err(err);
                break;
            }
        }
    }
    if outcome.is_ok() && !opts.hold_after.is_zero() {
        eprintln!(
            "loadgen: HOLD workloads done, holding for {:?}",
            opts.hold_after
        );
        std::thread::sleep(opts.hold_after);
    }
    let max_write = session.max_write;
    drop(session);
    if !opts.keep_files {
        let _ = fs::remove_dir_all(&wd);
    }
    outcome?;
    Ok(Report {
        socket: opts.socket.display().to_string(),
        queues: opts.queues,
        qd: opts.qd,
        file_size: opts.file_size,
        files: opts.files,
        max_write,
        results,
        held_inodes,
    })
}
