//! Running the workloads: the per-queue threads, the limits, the latency
//! percentiles, and [`run`], which connects and runs every workload in order.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::driver::{self, SlotQueue};
use super::prepare::{prepare_dir, prepare_read_file, prepare_write_file, say, verify_write_file};
use super::session::{forget_batch, Session};
use super::volumes::{
    self, lookup_work_dir, slot_volume, unix_ms, Series, Target, VolumeResult, SERIES_INTERVAL,
};
use super::workloads::{
    entry_name, Ctx, DataJob, GetattrJob, Job, LookupJob, MetaJob, ReaddirJob, Step,
};
use super::{pattern, workloads};
use super::{
    Error, Latency, LgResult, Options, Report, Workload, WorkloadResult, DIR_10K, LARGE_BLOCK,
    READ_FILE, WRITE_FILE,
};
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

/// What one thread did for one volume.
#[derive(Default)]
struct VolOut {
    ops: u64,
    requests: u64,
    bytes: u64,
    lat_ns: Vec<u64>,
    series: Series,
}

impl VolOut {
    fn add(&mut self, other: VolOut) {
        self.ops += other.ops;
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.lat_ns.extend(other.lat_ns);
        self.series.merge(&other.series);
    }
}

#[derive(Default)]
struct ThreadOut {
    /// Per volume (one without `--volumes`).
    vols: Vec<VolOut>,
    forgets: HashMap<u64, u64>,
}

/// Drives QD jobs on one queue until the limit is reached and every started
/// operation has finished. Job `slot` works on volume `vol_of[slot]`; its
/// completions are counted there, in intervals from `start`.
#[allow(clippy::too_many_arguments)]
fn drive(
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

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64 / 1000.0
}

/// The percentiles of latencies in ns, sorted.
fn latency(sorted: &[u64]) -> Latency {
    let mean = if sorted.is_empty() {
        0.0
    } else {
        sorted.iter().sum::<u64>() as f64 / sorted.len() as f64 / 1000.0
    };
    Latency {
        p50_us: percentile(sorted, 0.50),
        p99_us: percentile(sorted, 0.99),
        p999_us: percentile(sorted, 0.999),
        mean_us: mean,
        max_us: sorted.last().copied().unwrap_or(0) as f64 / 1000.0,
    }
}

/// What one volume's jobs need, set up before the timed part.
#[derive(Default)]
struct VolSetup {
    file_node: u64,
    dir_node: u64,
    nodes: Arc<Vec<u64>>,
    written: Option<Arc<Vec<AtomicU64>>>,
    write_path: Option<PathBuf>,
    meta_dir: Option<PathBuf>,
    /// The data file's handle on each queue (opened by the queue itself, like
    /// separate guest processes).
    fhs: Vec<u64>,
}

/// Prepares one volume's files on the host and looks up the nodes its jobs use.
fn setup_volume(
    q0: &mut SlotQueue,
    opts: &Options,
    t: &Target,
    w: Workload,
    forgets: &mut HashMap<u64, u64>,
) -> LgResult<VolSetup> {
    let wd = t.work_dir();
    let l = t.label();
    let base = lookup_work_dir(q0, t, forgets)?;
    let mut v = VolSetup::default();
    match w {
        Workload::RandRead4k | Workload::SeqRead1m => {
            prepare_read_file(opts, &wd)?;
            v.file_node = q0
                .lookup(base, READ_FILE)
                .map_err(Error::step(format!("{l}LOOKUP read file")))?
                .nodeid;
            *forgets.entry(v.file_node).or_default() += 1;
        }
        Workload::RandWrite4k | Workload::SeqWrite1m => {
            v.write_path = Some(prepare_write_file(opts, &wd)?);
            v.file_node = q0
                .lookup(base, WRITE_FILE)
                .map_err(Error::step(format!("{l}LOOKUP write file")))?
                .nodeid;
            *forgets.entry(v.file_node).or_default() += 1;
            let blocks = opts.file_size.div_ceil(4096);
            v.written = Some(Arc::new(
                (0..blocks.div_ceil(64))
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            ));
        }
        Workload::Lookup | Workload::Getattr | Workload::Readdirplus => {
            prepare_dir(opts, &wd)?;
            v.dir_node = q0
                .lookup(base, DIR_10K)
                .map_err(Error::step(format!("{l}LOOKUP dir")))?
                .nodeid;
            *forgets.entry(v.dir_node).or_default() += 1;
            if w == Workload::Getattr {
                let mut nodes = Vec::with_capacity(opts.files);
                for i in 0..opts.files {
                    let n = q0
                        .lookup(v.dir_node, &entry_name(i))
                        .map_err(|source| Error::Frontend {
                            step: format!("{l}LOOKUP entry {}", entry_name(i)),
                            source,
                        })?
                        .nodeid;
                    *forgets.entry(n).or_default() += 1;
                    nodes.push(n);
                }
                v.nodes = Arc::new(nodes);
            }
        }
        Workload::Metadata => {
            let name = format!("meta-{}", std::process::id());
            let p = wd.join(&name);
            let _ = fs::remove_dir_all(&p);
            fs::create_dir(&p).map_err(Error::at(&p))?;
            v.meta_dir = Some(p);
            v.dir_node = q0
                .lookup(base, &name)
                .map_err(Error::step(format!("{l}LOOKUP meta dir")))?
                .nodeid;
            *forgets.entry(v.dir_node).or_default() += 1;
        }
        Workload::Qd1Read4k | Workload::Qd1Getattr => unreachable!("kind() maps the QD1 workloads"),
    }
    Ok(v)
}

/// The job of one slot, on its volume's nodes.
#[allow(clippy::too_many_arguments)]
fn make_job(
    w: Workload,
    v: &VolSetup,
    vol: usize,
    thread: usize,
    slot: usize,
    file_size: u64,
    block: u32,
    files: usize,
) -> Box<dyn Job> {
    let fh = v.fhs.get(thread).copied().unwrap_or(0);
    let data = |random, write| {
        Box::new(
            DataJob::new(v.file_node, fh, file_size, block, random, write)
                .for_volume(vol, v.written.clone()),
        )
    };
    match w {
        Workload::RandRead4k => data(true, false),
        Workload::RandWrite4k => data(true, true),
        Workload::SeqRead1m => data(false, false),
        Workload::SeqWrite1m => data(false, true),
        Workload::Lookup => Box::new(LookupJob::new(v.dir_node, files)),
        Workload::Getattr => Box::new(GetattrJob::new(v.nodes.clone())),
        Workload::Metadata => Box::new(MetaJob::new(v.dir_node, thread, slot)),
        Workload::Readdirplus => Box::new(ReaddirJob::new(v.dir_node, files)),
        Workload::Qd1Read4k | Workload::Qd1Getattr => {
            unreachable!("kind() maps the QD1 workloads")
        }
    }
}

/// Runs one workload: per-thread setup (open handles), the timed part, teardown.
fn run_workload(
    s: &mut Session,
    opts: &Options,
    targets: &[Target],
    named: Workload,
) -> LgResult<WorkloadResult> {
    let w = named.kind();
    let block: u32 = match w {
        Workload::SeqRead1m | Workload::SeqWrite1m => (LARGE_BLOCK as u32).min(s.max_write),
        _ => 4096,
    };
    if u64::from(block) > opts.file_size {
        return Err(Error::FileSizeBelowBlock {
            file_size: opts.file_size,
            block,
        });
    }

    // Node ids the jobs need, per volume.
    let mut setup_forgets: HashMap<u64, u64> = HashMap::new();
    let mut setups = Vec::with_capacity(targets.len());
    for t in targets {
        setups.push(setup_volume(
            &mut s.queues[0],
            opts,
            t,
            w,
            &mut setup_forgets,
        )?);
    }
    let flags = if w == Workload::RandWrite4k || w == Workload::SeqWrite1m {
        libc::O_RDWR
    } else {
        libc::O_RDONLY
    } as u32;
    // Each thread opens its own handle (like separate guest processes).
    for (v, t) in setups.iter_mut().zip(targets) {
        if v.file_node != 0 {
            for q in s.queues.iter_mut() {
                v.fhs.push(
                    q.open(v.file_node, flags)
                        .map_err(Error::step(format!("{}OPEN", t.label())))?
                        .fh,
                );
            }
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
    let nvol = targets.len();
    let vol_of: Vec<usize> = (0..qd).map(|slot| slot_volume(slot, nvol)).collect();
    let hiprio = &s.hiprio;
    let setups_ref = &setups;
    let vol_of_ref = &vol_of;
    let cpu_before = opts.daemon_pid.map(tree_cpu_ticks);
    let start = Instant::now();
    let start_wall = SystemTime::now();
    // For scripts that act while the load runs (benches/qos.sh): the timed part
    // starts now, setup done, on the clock of the per-volume series.
    eprintln!(
        "loadgen: START {} unix_ms={}",
        named.name(),
        unix_ms(start_wall)
    );
    let results: Vec<LgResult<ThreadOut>> = std::thread::scope(|scope| {
        let handles: Vec<_> = s
            .queues
            .iter_mut()
            .take(nq)
            .enumerate()
            .map(|(t, q)| {
                let limit = &limit;
                let file_size = opts.file_size;
                let files = opts.files;
                scope.spawn(move || {
                    let mut ctx =
                        Ctx::new(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                    if w == Workload::Metadata {
                        ctx.forget_batch = 16;
                    }
                    // Sequential streams: each thread starts at its share of the
                    // file (of each volume).
                    let blocks = file_size / u64::from(block);
                    ctx.cursors = vec![blocks / nq as u64 * t as u64; nvol];
                    let mut jobs: Vec<Box<dyn Job>> = vol_of_ref
                        .iter()
                        .enumerate()
                        .map(|(slot, &v)| {
                            make_job(w, &setups_ref[v], v, t, slot, file_size, block, files)
                        })
                        .collect();
                    drive(
                        q, &mut jobs, vol_of_ref, nvol, &mut ctx, limit, hiprio, start,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(queue, h)| h.join().unwrap_or(Err(Error::WorkerPanicked { queue })))
            .collect()
    });
    let elapsed = start.elapsed();
    let seconds = elapsed.as_secs_f64();
    let daemon_cpu_seconds = opts.daemon_pid.zip(cpu_before).map(|(pid, before)| {
        tree_cpu_ticks(pid).saturating_sub(before) as f64 / clock_ticks_per_second()
    });

    let mut vols: Vec<VolOut> = (0..nvol).map(|_| VolOut::default()).collect();
    let mut forgets: HashMap<u64, u64> = HashMap::new();
    let mut first_err = None;
    for r in results {
        match r {
            Ok(t) => {
                for (acc, v) in vols.iter_mut().zip(t.vols) {
                    acc.add(v);
                }
                for (k, v) in t.forgets {
                    *forgets.entry(k).or_default() += v;
                }
            }
            Err(err) => {
                first_err.get_or_insert(err);
            }
        }
    }
    if let Some(err) = first_err {
        return Err(Error::Workload {
            workload: named,
            source: Box::new(err),
        });
    }

    // Teardown (not timed): handles, lookups, host-side checks, cleanup.
    for v in &setups {
        if v.file_node != 0 {
            for (q, fh) in s.queues.iter_mut().zip(&v.fhs) {
                q.release(v.file_node, *fh, flags)
                    .map_err(Error::step("RELEASE"))?;
            }
        }
    }
    for (k, v) in setup_forgets {
        *forgets.entry(k).or_default() += v;
    }
    s.forget_all(forgets)?;
    for ((v, t), out) in setups.iter().zip(targets).zip(&vols) {
        if let (Some(path), Some(bits)) = (&v.write_path, &v.written) {
            let n = verify_write_file(path, opts.file_size, bits)?;
            if n == 0 && out.ops > 0 {
                return Err(Error::NothingWritten {
                    workload: w,
                    volume: t.label(),
                });
            }
            if !opts.keep_files {
                let _ = fs::remove_file(path);
            }
        }
        if let Some(dir) = &v.meta_dir {
            let left: Vec<_> = fs::read_dir(dir)
                .map_err(Error::at(dir))?
                .filter_map(|d| d.ok())
                .map(|d| d.file_name())
                .collect();
            if !left.is_empty() {
                return Err(Error::FilesLeft {
                    dir: dir.clone(),
                    count: left.len(),
                    example: left[0].clone(),
                });
            }
            fs::remove_dir(dir).map_err(Error::at(dir))?;
        }
    }

    let start_unix_ms = unix_ms(start_wall);
    let mib = (1u64 << 20) as f64;
    let mut per_volume = Vec::new();
    let mut total = VolOut::default();
    for (v, t) in vols.into_iter().zip(targets) {
        let mut v = v;
        v.lat_ns.sort_unstable();
        if !t.name.is_empty() {
            per_volume.push(VolumeResult {
                volume: t.name.clone(),
                ops: v.ops,
                requests: v.requests,
                bytes: v.bytes,
                ops_per_sec: v.ops as f64 / seconds,
                mib_per_sec: v.bytes as f64 / seconds / mib,
                latency: latency(&v.lat_ns),
                interval_ms: SERIES_INTERVAL.as_millis() as u64,
                series: v.series.intervals(start_unix_ms, elapsed),
            });
        }
        total.add(v);
    }
    total.lat_ns.sort_unstable();
    Ok(WorkloadResult {
        workload: named.name().into(),
        op_unit: named.op_unit().into(),
        ops: total.ops,
        requests: total.requests,
        bytes: total.bytes,
        seconds,
        ops_per_sec: total.ops as f64 / seconds,
        requests_per_sec: total.requests as f64 / seconds,
        mib_per_sec: total.bytes as f64 / seconds / mib,
        latency: latency(&total.lat_ns),
        daemon_cpu_seconds,
        daemon_cpu_us_per_request: daemon_cpu_seconds
            .filter(|_| total.requests > 0)
            .map(|c| c * 1e6 / total.requests as f64),
        verified: true,
        start_unix_ms,
        end_unix_ms: start_unix_ms + elapsed.as_millis() as u64,
        per_volume,
    })
}

/// Connects, runs every workload in order at the shared dir's root, cleans up;
/// any failure is an error.
pub fn run(opts: &Options) -> LgResult<Report> {
    run_volumes(opts, &[])
}

/// Connects, runs every workload in order over `volumes` (see [`volumes`]; none:
/// the shared dir's root), cleans up; any failure is an error.
pub fn run_volumes(opts: &Options, volumes: &[String]) -> LgResult<Report> {
    if opts.queues == 0 || opts.qd == 0 {
        return Err(Error::NoQueueOrSlot);
    }
    if opts.file_size < 4096 || !opts.file_size.is_multiple_of(4096) {
        return Err(Error::FileSizeNotBlocks(opts.file_size));
    }
    if !opts.shared_dir.is_dir() {
        return Err(Error::SharedDirNotDir(opts.shared_dir.clone()));
    }
    let targets = volumes::targets(&opts.shared_dir, volumes)?;
    if opts.workloads.iter().any(|w| !w.is_qd1()) {
        volumes::check_qd(opts, volumes.len())?;
    }
    for t in &targets {
        if !t.host_dir.is_dir() {
            return Err(Error::VolumeNotDir {
                volume: t.name.clone(),
                path: t.host_dir.clone(),
            });
        }
        let wd = t.work_dir();
        fs::create_dir_all(&wd).map_err(Error::at(&wd))?;
    }
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
        n => Some(super::hold::hold(&mut session, opts, &targets[0], n)?),
    };
    let mut results = Vec::new();
    let mut outcome = Ok(());
    for &w in &opts.workloads {
        say(opts, &format!("running {}", w.name()));
        match run_workload(&mut session, opts, &targets, w) {
            Ok(r) => {
                say(
                    opts,
                    &format!(
                        "{}: {:.0} ops/s, {:.1} MiB/s, p99 {:.0} us (verified)",
                        r.workload, r.ops_per_sec, r.mib_per_sec, r.latency.p99_us
                    ),
                );
                for v in &r.per_volume {
                    say(
                        opts,
                        &format!(
                            "{}: volume {}: {:.0} ops/s, {:.1} MiB/s, p99 {:.0} us",
                            r.workload, v.volume, v.ops_per_sec, v.mib_per_sec, v.latency.p99_us
                        ),
                    );
                }
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
        for t in &targets {
            let _ = fs::remove_dir_all(t.work_dir());
        }
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
        volumes: volumes.to_vec(),
    })
}
