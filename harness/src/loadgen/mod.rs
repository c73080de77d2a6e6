//! Load generator for vhost-user-fs backends (`volfsd-loadgen`).
//!
//! Plays the VMM and the guest's virtio-fs driver against any vhost-user-fs
//! socket (volfsd or virtiofsd): memfd guest memory, N request queues plus
//! hiprio, FUSE INIT, then QD requests in flight per queue, one thread per
//! queue. Every reply is validated and every byte of data checked (reads
//! against a deterministic pattern, writes afterwards on the host), and any
//! mismatch is an error.

pub mod driver;
pub mod pattern;
pub mod workloads;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::frontend::fuse::UniqueSource;
use crate::frontend::{DeviceConfig, FuseOps, FuseQueue, InitParams, VhostUserFsDevice};
use driver::SlotQueue;
use workloads::{
    entry_name, entry_size, Ctx, DataJob, GetattrJob, Job, LookupJob, MetaJob, ReaddirJob, Step,
    SEED_READ, SEED_WRITE,
};

/// Directory the load generator works in, under the shared dir.
pub const WORK_DIR: &str = "volfsd-loadgen";
const READ_FILE: &str = "read.dat";
const WRITE_FILE: &str = "write.dat";
const DIR_10K: &str = "dir";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    RandRead4k,
    RandWrite4k,
    SeqRead1m,
    SeqWrite1m,
    Lookup,
    Getattr,
    Metadata,
    Readdirplus,
}

impl Workload {
    pub const ALL: [Workload; 8] = [
        Workload::RandRead4k,
        Workload::RandWrite4k,
        Workload::SeqRead1m,
        Workload::SeqWrite1m,
        Workload::Lookup,
        Workload::Getattr,
        Workload::Metadata,
        Workload::Readdirplus,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::RandRead4k => "randread4k",
            Workload::RandWrite4k => "randwrite4k",
            Workload::SeqRead1m => "seqread1m",
            Workload::SeqWrite1m => "seqwrite1m",
            Workload::Lookup => "lookup",
            Workload::Getattr => "getattr",
            Workload::Metadata => "metadata",
            Workload::Readdirplus => "readdirplus",
        }
    }

    /// Parses a comma-separated list; `all` means every workload.
    pub fn parse_list(s: &str) -> Result<Vec<Workload>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(Self::ALL);
                continue;
            }
            let w = Self::ALL
                .into_iter()
                .find(|w| w.name() == part)
                .ok_or_else(|| {
                    format!(
                        "unknown workload '{part}' (have: all, {})",
                        Self::ALL.map(|w| w.name()).join(", ")
                    )
                })?;
            out.push(w);
        }
        if out.is_empty() {
            return Err("no workload given".into());
        }
        Ok(out)
    }

    /// What one operation is, for the table.
    pub fn op_unit(self) -> &'static str {
        match self {
            Workload::Metadata => "file (CREATE+WRITE+RELEASE+UNLINK)",
            Workload::Readdirplus => "listing of the whole directory",
            _ => "request",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub socket: PathBuf,
    pub shared_dir: PathBuf,
    pub queues: u16,
    pub qd: usize,
    pub duration: Option<Duration>,
    pub ops: Option<u64>,
    pub file_size: u64,
    pub files: usize,
    pub workloads: Vec<Workload>,
    pub keep_files: bool,
    pub quiet: bool,
    /// Stay connected and idle this long after INIT, before the workloads.
    pub idle_before: Duration,
    /// Stay connected this long after the workloads, before disconnecting.
    pub hold_after: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    pub max_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub workload: String,
    pub op_unit: String,
    pub ops: u64,
    pub requests: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub requests_per_sec: f64,
    pub mib_per_sec: f64,
    /// Per FUSE request, submit to completion.
    pub latency: Latency,
    pub verified: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub socket: String,
    pub queues: u16,
    pub qd: usize,
    pub file_size: u64,
    pub files: usize,
    pub max_write: u32,
    pub results: Vec<WorkloadResult>,
}

pub type LgResult<T> = Result<T, String>;

fn e<E: std::fmt::Display>(what: impl std::fmt::Display) -> impl FnOnce(E) -> String {
    move |err| format!("{what}: {err}")
}

/// A connected session: hiprio queue + request queues with slots.
struct Session {
    _device: VhostUserFsDevice,
    hiprio: Mutex<FuseQueue>,
    queues: Vec<SlotQueue>,
    max_write: u32,
}

const LARGE_BLOCK: usize = 1 << 20;

impl Session {
    fn connect(opts: &Options) -> LgResult<Self> {
        let payload = LARGE_BLOCK;
        let slots = opts.qd + 1;
        let per_queue = slots as u64 * (payload as u64 + 2 * 4096 + 256);
        let memory_size =
            (u64::from(opts.queues) * per_queue + (16 << 20)).div_ceil(2 << 20) * (2 << 20);
        let cfg = DeviceConfig {
            socket_path: opts.socket.clone(),
            memory_size,
            request_queues: opts.queues,
            queue_size: 1024,
            event_idx: true,
            connect_timeout: Duration::from_secs(10),
        };
        let mut device = VhostUserFsDevice::connect(&cfg).map_err(e("connecting"))?;
        let memory = device.memory().clone();
        let uniques = UniqueSource::default();
        let mut qs = device.take_queues().into_iter();
        let hiprio = FuseQueue::new(
            qs.next().ok_or("device has no queue")?,
            memory.clone(),
            uniques.clone(),
        );
        let mut queues = Vec::new();
        for q in qs {
            queues.push(
                SlotQueue::new(q, &memory, uniques.clone(), slots, payload)
                    .map_err(e("setting up request queue"))?,
            );
        }
        let init = queues[0]
            .init(&InitParams::default())
            .map_err(e("FUSE_INIT"))?;
        // 1 MiB workloads use min(1 MiB, max_write), as the guest would split.
        let max_write = init.max_write.max(4096);
        Ok(Session {
            _device: device,
            hiprio: Mutex::new(hiprio),
            queues,
            max_write,
        })
    }

    fn forget_all(&self, forgets: HashMap<u64, u64>) -> LgResult<()> {
        forget_batch(&self.hiprio, forgets)
    }
}

fn forget_batch(hiprio: &Mutex<FuseQueue>, forgets: HashMap<u64, u64>) -> LgResult<()> {
    let list: Vec<(u64, u64)> = forgets.into_iter().collect();
    let mut q = hiprio.lock().expect("hiprio lock");
    for chunk in list.chunks(256) {
        q.batch_forget(chunk).map_err(e("BATCH_FORGET"))?;
    }
    Ok(())
}

// ------------------------------------------------------------- host-side preparation

fn work_dir(opts: &Options) -> PathBuf {
    opts.shared_dir.join(WORK_DIR)
}

/// The read file: `file_size` bytes of pattern SEED_READ. Reused when it has
/// the right size and sampled blocks verify; then read once so the page cache
/// is warm for every daemon alike.
fn prepare_read_file(opts: &Options) -> LgResult<()> {
    let path = work_dir(opts).join(READ_FILE);
    let mut buf = vec![0u8; LARGE_BLOCK];
    let reuse = match File::open(&path) {
        Ok(f) if f.metadata().map(|m| m.len()).unwrap_or(0) == opts.file_size => {
            let mut ok = true;
            for i in 0..16u64 {
                let off = (opts.file_size / 16 * i) / 4096 * 4096;
                let n = 4096.min(opts.file_size - off) as usize;
                if f.read_exact_at(&mut buf[..n], off).is_err()
                    || pattern::verify(SEED_READ, off, &buf[..n]).is_err()
                {
                    ok = false;
                    break;
                }
            }
            ok
        }
        _ => false,
    };
    if !reuse {
        say(
            opts,
            &format!("preparing {} ({} bytes)", path.display(), opts.file_size),
        );
        let mut f = File::create(&path).map_err(e(path.display()))?;
        let mut off = 0;
        while off < opts.file_size {
            let n = (LARGE_BLOCK as u64).min(opts.file_size - off) as usize;
            pattern::fill(SEED_READ, off, &mut buf[..n]);
            f.write_all(&buf[..n]).map_err(e(path.display()))?;
            off += n as u64;
        }
        f.sync_all().map_err(e(path.display()))?;
    }
    // Warm the host page cache: both daemons then read from memory.
    let mut f = File::open(&path).map_err(e(path.display()))?;
    while f.read(&mut buf).map_err(e(path.display()))? > 0 {}
    Ok(())
}

fn prepare_write_file(opts: &Options) -> LgResult<PathBuf> {
    let path = work_dir(opts).join(WRITE_FILE);
    let _ = fs::remove_file(&path);
    let f = File::create(&path).map_err(e(path.display()))?;
    f.set_len(opts.file_size).map_err(e(path.display()))?;
    Ok(path)
}

/// Every block the workload wrote must hold the pattern, every other one zeros.
fn verify_write_file(path: &Path, file_size: u64, written: &[AtomicU64]) -> LgResult<u64> {
    let mut f = File::open(path).map_err(e(path.display()))?;
    let mut buf = vec![0u8; LARGE_BLOCK];
    let mut off = 0u64;
    let mut blocks_written = 0;
    while off < file_size {
        let n = (LARGE_BLOCK as u64).min(file_size - off) as usize;
        f.read_exact(&mut buf[..n]).map_err(e(path.display()))?;
        for (i, block) in buf[..n].chunks(4096).enumerate() {
            let boff = off + 4096 * i as u64;
            let blk = boff / 4096;
            let was_written =
                written[(blk / 64) as usize].load(Ordering::Relaxed) & (1 << (blk % 64)) != 0;
            if was_written {
                blocks_written += 1;
                if let Err(at) = pattern::verify(SEED_WRITE, boff, block) {
                    return Err(format!(
                        "{}: written block at {boff} holds wrong data (first bad word at {at})",
                        path.display()
                    ));
                }
            } else if block.iter().any(|&b| b != 0) {
                return Err(format!(
                    "{}: block at {boff} was never written but is not zero",
                    path.display()
                ));
            }
        }
        off += n as u64;
    }
    Ok(blocks_written)
}

/// The directory of `files` entries, file i holding `entry_size(i)` bytes.
fn prepare_dir(opts: &Options) -> LgResult<()> {
    let dir = work_dir(opts).join(DIR_10K);
    let complete = fs::read_dir(&dir)
        .map(|rd| rd.count() == opts.files)
        .unwrap_or(false)
        && (0..opts.files).step_by(97).all(|i| {
            fs::metadata(dir.join(entry_name(i))).map(|m| m.len()).ok() == Some(entry_size(i))
        });
    if complete {
        return Ok(());
    }
    say(
        opts,
        &format!("preparing {} ({} files)", dir.display(), opts.files),
    );
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(e(dir.display()))?;
    let data = vec![b'x'; 512];
    for i in 0..opts.files {
        let p = dir.join(entry_name(i));
        let mut f = File::create(&p).map_err(e(p.display()))?;
        f.write_all(&data[..entry_size(i) as usize])
            .map_err(e(p.display()))?;
    }
    Ok(())
}

fn say(opts: &Options, msg: &str) {
    if !opts.quiet {
        eprintln!("loadgen: {msg}");
    }
}

// ------------------------------------------------------------- running

/// How many more operations may start: a deadline or a shared budget.
enum Limit {
    Until(Instant),
    Budget(AtomicU64),
}

impl Limit {
    fn take(&self) -> bool {
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
fn run_workload(s: &mut Session, opts: &Options, w: Workload) -> LgResult<WorkloadResult> {
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
    let qd = opts.qd;
    let nq = s.queues.len();
    let hiprio = &s.hiprio;
    let start = Instant::now();
    let results: Vec<LgResult<ThreadOut>> = std::thread::scope(|scope| {
        let handles: Vec<_> = s
            .queues
            .iter_mut()
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
        return Err(format!("{}: {err}", w.name()));
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
        workload: w.name().into(),
        op_unit: w.op_unit().into(),
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
    })
}

/// Human-readable table of a report.
pub fn table(report: &Report) -> String {
    let mut s = format!(
        "{:<12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}  {}\n",
        "workload", "ops/s", "requests/s", "MiB/s", "p50 us", "p99 us", "p99.9 us", "op"
    );
    for r in &report.results {
        s += &format!(
            "{:<12} {:>12.0} {:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1}  {}\n",
            r.workload,
            r.ops_per_sec,
            r.requests_per_sec,
            r.mib_per_sec,
            r.latency.p50_us,
            r.latency.p99_us,
            r.latency.p999_us,
            r.op_unit
        );
    }
    s
}

/// Parses sizes like 4096, 64K, 256M, 1G.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size '{s}'"))
}
