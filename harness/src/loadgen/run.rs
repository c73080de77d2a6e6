//! Running the workloads: the per-queue threads, the limits, the latency
//! percentiles, and [`run`], which connects and runs every workload in order.

use std::collections::HashMap;
use std::fs;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime};

use super::prepare::{say, verify_write_file};
use super::session::Session;
use super::volumes::{self, slot_volume, unix_ms, Target, VolumeResult, SERIES_INTERVAL};
use super::workloads::{Ctx, Job};
use super::{Error, LgResult, Options, Report, Workload, WorkloadResult, LARGE_BLOCK};
use crate::fixtures::host::{clock_ticks_per_second, tree_cpu_ticks};
use crate::frontend::FuseOps;

use super::drive::{drive, Limit, ThreadOut, VolOut};
use super::latency::latency;
use super::setup::{make_job, setup_volume};

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
