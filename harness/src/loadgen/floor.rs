//! The host floor (`volfsd-loadgen --floor`): each workload's host system calls,
//! the least a daemon serving it must make, in a tight loop on one thread, on the
//! same files and directory the workloads use. A daemon's CPU per request beyond
//! it is that daemon's own overhead (the ring, the copy, decoding, its layers, the
//! reply, notifications), which benches/report.py shows beside the ratios.
//!
//! No daemon and no socket: the loop calls the host directly.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::prepare::{prepare_dir, prepare_read_file, prepare_write_file, say};
use super::workloads::entry_name;
use super::{Error, LgResult, Options, Workload, DIR_10K, LARGE_BLOCK, READ_FILE, WORK_DIR};

/// One workload's floor.
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    pub workload: String,
    /// The system calls of one operation, as the loop makes them.
    pub syscalls: &'static str,
    pub ops: u64,
    /// The loop thread's CPU time (user + system) per operation.
    pub cpu_us_per_op: f64,
    pub wall_us_per_op: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct FloorReport {
    pub shared_dir: String,
    pub seconds_per_workload: f64,
    pub floors: Vec<Floor>,
}

/// The floor of each of `opts.workloads` that has one (READDIRPLUS is left out: its
/// requests are not one system call's worth). The 1 MiB ones are one `preadv` or
/// `pwritev` of 1 MiB, sequential, into or from one buffer: the kernel's copy
/// between the page cache and memory, which no daemon can avoid without DAX.
pub fn measure(opts: &Options) -> LgResult<FloorReport> {
    let wd = opts.shared_dir.join(WORK_DIR);
    std::fs::create_dir_all(&wd).map_err(Error::at(&wd))?;
    prepare_read_file(opts, &wd)?;
    prepare_dir(opts, &wd)?;
    let seconds = opts.duration.unwrap_or(Duration::from_secs(3));
    let mut floors = Vec::new();
    for w in &opts.workloads {
        let Some(syscalls) = syscalls(w.kind()) else {
            continue;
        };
        say(opts, &format!("floor of {}: {syscalls}", w.name()));
        let mut op = operation(opts, &wd, w.kind())?;
        // Warm up (the page cache, the dentries), then measure.
        for _ in 0..1000 {
            op()?;
        }
        let (cpu0, t0) = (thread_cpu(), Instant::now());
        let mut ops = 0u64;
        while t0.elapsed() < seconds {
            for _ in 0..256 {
                op()?;
            }
            ops += 256;
        }
        let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
        floors.push(Floor {
            workload: w.name().to_string(),
            syscalls,
            ops,
            cpu_us_per_op: cpu.as_secs_f64() * 1e6 / ops as f64,
            wall_us_per_op: wall.as_secs_f64() * 1e6 / ops as f64,
        });
    }
    let _ = std::fs::remove_dir_all(wd.join("floor-meta"));
    if opts.keep_files {
        let _ = std::fs::remove_file(wd.join("floor-write.dat"));
    } else {
        let _ = std::fs::remove_dir_all(&wd);
    }
    Ok(FloorReport {
        shared_dir: opts.shared_dir.display().to_string(),
        seconds_per_workload: seconds.as_secs_f64(),
        floors,
    })
}

fn syscalls(w: Workload) -> Option<&'static str> {
    Some(match w {
        Workload::RandRead4k => "pread 4 KiB at a random offset",
        Workload::RandWrite4k => "pwrite 4 KiB at a random offset",
        Workload::Getattr => "fstatat(O_PATH fd, \"\", AT_EMPTY_PATH)",
        Workload::Lookup => "openat(dir, name, O_PATH) + fstatat + close",
        Workload::Metadata => {
            "openat(dir, name, O_CREAT|O_EXCL|O_RDWR) + pwrite 4 KiB + close + unlinkat"
        }
        Workload::SeqRead1m => "preadv 1 MiB (one iovec), sequential",
        Workload::SeqWrite1m => "pwritev 1 MiB (one iovec), sequential",
        _ => return None,
    })
}

type Op = Box<dyn FnMut() -> LgResult<()>>;

/// The 1 MiB floors' buffers: one per request the workloads keep in flight (QD 32).
const FLOOR_BUFFERS: usize = 32;

fn operation(opts: &Options, wd: &Path, w: Workload) -> LgResult<Op> {
    let blocks = (opts.file_size / 4096).max(1);
    let mut rng = 0x5eed_f100u64;
    let mut next = move || {
        // xorshift: the same cheap generator for every run.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut buf = vec![0u8; 4096];
    Ok(match w {
        Workload::RandRead4k => {
            let path = wd.join(READ_FILE);
            let f = File::open(&path).map_err(Error::at(&path))?;
            Box::new(move || {
                let off = (next() % blocks * 4096) as libc::off_t;
                // SAFETY: reads into our own 4 KiB buffer.
                let r = unsafe { libc::pread(f.as_raw_fd(), buf.as_mut_ptr().cast(), 4096, off) };
                check("pread", r)
            })
        }
        Workload::RandWrite4k => {
            let f = floor_write_file(opts, wd)?;
            Box::new(move || {
                let off = (next() % blocks * 4096) as libc::off_t;
                // SAFETY: writes from our own 4 KiB buffer.
                let r = unsafe { libc::pwrite(f.as_raw_fd(), buf.as_ptr().cast(), 4096, off) };
                check("pwrite", r)
            })
        }
        Workload::Getattr => {
            let fd = open_path(&wd.join(DIR_10K).join(entry_name(0)), libc::O_PATH)?;
            Box::new(move || fstat_empty(fd.as_raw_fd()))
        }
        Workload::Lookup => {
            let dir = open_path(&wd.join(DIR_10K), libc::O_PATH | libc::O_DIRECTORY)?;
            let names: Vec<CString> = (0..opts.files)
                .map(|i| CString::new(entry_name(i)).expect("no NUL"))
                .collect();
            let mut i = 0usize;
            Box::new(move || {
                i = (i + 1) % names.len();
                // SAFETY: a NUL-terminated name; the fd is closed below.
                let fd = unsafe {
                    libc::openat(
                        dir.as_raw_fd(),
                        names[i].as_ptr(),
                        libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    )
                };
                check("openat", fd as isize)?;
                let r = fstat_empty(fd);
                // SAFETY: the fd opened above, closed once.
                unsafe { libc::close(fd) };
                r
            })
        }
        Workload::Metadata => {
            let path = wd.join("floor-meta");
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir(&path).map_err(Error::at(&path))?;
            let dir = open_path(&path, libc::O_PATH | libc::O_DIRECTORY)?;
            let mut n = 0u64;
            Box::new(move || {
                n += 1;
                let name = CString::new(format!("m{n}")).expect("no NUL");
                // SAFETY: a NUL-terminated name; the fd is closed below.
                let fd = unsafe {
                    libc::openat(
                        dir.as_raw_fd(),
                        name.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                        0o644,
                    )
                };
                check("openat O_CREAT", fd as isize)?;
                // SAFETY: our own buffer and the fd opened above, closed once; a
                // NUL-terminated name. pwrite's errno is taken before close.
                let (w, u) = unsafe {
                    let w = check("pwrite", libc::pwrite(fd, buf.as_ptr().cast(), 4096, 0));
                    libc::close(fd);
                    (w, libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0))
                };
                w?;
                check("unlinkat", u as isize)
            })
        }
        Workload::SeqRead1m | Workload::SeqWrite1m => {
            let write = w == Workload::SeqWrite1m;
            let f = if write {
                floor_write_file(opts, wd)?
            } else {
                let path = wd.join(READ_FILE);
                File::open(&path).map_err(Error::at(&path))?
            };
            let blocks = (opts.file_size / LARGE_BLOCK as u64).max(1);
            // As many buffers as the daemons' requests in flight (QD 32), each touched
            // once as guest memory is: the loop measures the copy over the same
            // working set, not faults, and not a buffer that stays in the cache.
            let mut bufs: Vec<Vec<u8>> = (0..FLOOR_BUFFERS)
                .map(|_| vec![0x5au8; LARGE_BLOCK])
                .collect();
            let mut block = 0u64;
            Box::new(move || {
                let off = (block * LARGE_BLOCK as u64) as libc::off_t;
                let big = &mut bufs[block as usize % FLOOR_BUFFERS];
                block = (block + 1) % blocks;
                let iov = libc::iovec {
                    iov_base: big.as_mut_ptr().cast(),
                    iov_len: big.len(),
                };
                // SAFETY: one iovec over our own 1 MiB buffer.
                let r = unsafe {
                    if write {
                        libc::pwritev(f.as_raw_fd(), &iov, 1, off)
                    } else {
                        libc::preadv(f.as_raw_fd(), &iov, 1, off)
                    }
                };
                check(if write { "pwritev" } else { "preadv" }, r)
            })
        }
        other => return Err(Error::NoFloor(other)),
    })
}

/// The write workloads' file, made as the daemons' is (the size of the run, sparse)
/// under a name of the floor's own, open for writing.
fn floor_write_file(opts: &Options, wd: &Path) -> LgResult<File> {
    let o = Options {
        workloads: Vec::new(),
        ..opts.clone()
    };
    let path = prepare_write_file(&o, wd)?;
    let target = wd.join("floor-write.dat");
    std::fs::rename(&path, &target).map_err(Error::at(&target))?;
    File::options()
        .write(true)
        .open(&target)
        .map_err(Error::at(&target))
}

fn open_path(path: &Path, flags: i32) -> LgResult<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::NulInPath(path.to_path_buf()))?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Host {
            path: path.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat_empty(fd: RawFd) -> LgResult<()> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstatat fills the stat buffer it is given.
    let r = unsafe { libc::fstatat(fd, c"".as_ptr(), st.as_mut_ptr(), libc::AT_EMPTY_PATH) };
    check("fstatat", r as isize)
}

/// A system call's result: an error (with errno) if negative.
fn check(call: &'static str, r: isize) -> LgResult<()> {
    if r < 0 {
        Err(Error::Syscall {
            call,
            source: std::io::Error::last_os_error(),
        })
    } else {
        Ok(())
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
