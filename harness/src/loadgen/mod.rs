//! Load generator for vhost-user-fs backends (`volfsd-loadgen`).
//!
//! Plays the VMM and the guest's virtio-fs driver against any vhost-user-fs
//! socket (volfsd or virtiofsd): memfd guest memory, N request queues plus
//! hiprio, FUSE INIT, then QD requests in flight per queue, one thread per
//! queue. Every reply is validated and every byte of data checked (reads
//! against a deterministic pattern, writes afterwards on the host), and any
//! mismatch is an error.
//!
//! With `--volumes a,b` ([`run_volumes`]) the load is spread over several volumes
//! of one daemon (started with `--allowed-dir a --allowed-dir b`): each volume has
//! its own work dir (`a/volfsd-loadgen`, reached from the guest's root as `/a`),
//! and in-flight slot i of every queue works on volume `i % n`, so the requests of
//! all volumes share each virtqueue. The report then has per-volume results, with
//! the completions of each 100 ms interval on the wall clock (per-volume QoS:
//! benches/qos.sh changes a volume's limits while the load runs and reads when
//! the rate follows).

mod drive;
pub mod driver;
mod error;
pub mod floor;
mod hold;
mod latency;
pub mod pattern;
mod prepare;
mod run;
mod session;
mod setup;
pub mod volumes;
pub mod workloads;

pub use error::{Error, ParseError};
pub use hold::HeldInodes;
pub use run::{run, run_volumes};
pub use volumes::{Interval, VolumeResult, SERIES_INTERVAL};

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

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
    /// RandRead4k with one request in flight on one queue: the per-request latency
    /// with no queueing.
    Qd1Read4k,
    /// Getattr with one request in flight on one queue.
    Qd1Getattr,
}

impl Workload {
    pub const ALL: [Workload; 10] = [
        Workload::RandRead4k,
        Workload::RandWrite4k,
        Workload::SeqRead1m,
        Workload::SeqWrite1m,
        Workload::Lookup,
        Workload::Getattr,
        Workload::Metadata,
        Workload::Readdirplus,
        Workload::Qd1Read4k,
        Workload::Qd1Getattr,
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
            Workload::Qd1Read4k => "qd1read4k",
            Workload::Qd1Getattr => "qd1getattr",
        }
    }

    /// The workload whose requests this one sends (the QD1 ones send those of their
    /// QD N counterpart).
    pub fn kind(self) -> Workload {
        match self {
            Workload::Qd1Read4k => Workload::RandRead4k,
            Workload::Qd1Getattr => Workload::Getattr,
            w => w,
        }
    }

    /// One request in flight in all, on the first queue, whatever `--qd` and
    /// `--queues` say.
    pub fn is_qd1(self) -> bool {
        self.kind() != self
    }

    /// Parses a comma-separated list; `all` means every workload, `none` none (for
    /// footprint runs: connect, INIT, idle or hold inodes, disconnect).
    pub fn parse_list(s: &str) -> Result<Vec<Workload>, ParseError> {
        if s.trim() == "none" {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(Self::ALL);
                continue;
            }
            let w = Self::ALL
                .into_iter()
                .find(|w| w.name() == part)
                .ok_or_else(|| ParseError::UnknownWorkload(part.to_string()))?;
            out.push(w);
        }
        if out.is_empty() {
            return Err(ParseError::NoWorkload);
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
    /// The daemon's pid: its process tree's CPU time over each workload is reported.
    pub daemon_pid: Option<i32>,
    /// Look up this many files after INIT and never forget them (0: none).
    pub hold_inodes: usize,
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
    /// utime + stime of the daemon's whole process tree over the workload (with
    /// `--daemon-pid`), in seconds, and per request served in µs.
    pub daemon_cpu_seconds: Option<f64>,
    pub daemon_cpu_us_per_request: Option<f64>,
    pub verified: bool,
    /// Wall clock (unix time, ms) when the timed part started and when its last
    /// operation completed.
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    /// With `--volumes`: each volume's share, in the order given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_volume: Vec<VolumeResult>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_inodes: Option<HeldInodes>,
    /// `--volumes`, in the order given (empty: the shared dir's root, as before).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
}

pub type LgResult<T> = Result<T, Error>;

/// Largest block of the 1 MiB workloads, and of the host-side preparation.
const LARGE_BLOCK: usize = 1 << 20;

/// Human-readable table of a report.
pub fn table(report: &Report) -> String {
    let mut s = format!(
        "{:<12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>11}  {}\n",
        "workload",
        "ops/s",
        "requests/s",
        "MiB/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "cpu us/req",
        "op"
    );
    for r in &report.results {
        let cpu = r
            .daemon_cpu_us_per_request
            .map(|c| format!("{c:.2}"))
            .unwrap_or_else(|| "-".into());
        s += &format!(
            "{:<12} {:>12.0} {:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>11}  {}\n",
            r.workload,
            r.ops_per_sec,
            r.requests_per_sec,
            r.mib_per_sec,
            r.latency.p50_us,
            r.latency.p99_us,
            r.latency.p999_us,
            cpu,
            r.op_unit
        );
    }
    if report.results.iter().any(|r| !r.per_volume.is_empty()) {
        s += &format!(
            "\n{:<12} {:<16} {:>12} {:>12} {:>10} {:>10} {:>10}\n",
            "workload", "volume", "ops", "ops/s", "MiB/s", "p50 us", "p99 us"
        );
        for r in &report.results {
            for v in &r.per_volume {
                s += &format!(
                    "{:<12} {:<16} {:>12} {:>12.0} {:>10.1} {:>10.1} {:>10.1}\n",
                    r.workload,
                    v.volume,
                    v.ops,
                    v.ops_per_sec,
                    v.mib_per_sec,
                    v.latency.p50_us,
                    v.latency.p99_us
                );
            }
        }
    }
    s
}

/// Parses sizes like 4096, 64K, 256M, 1G.
pub fn parse_size(s: &str) -> Result<u64, ParseError> {
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
        .ok_or_else(|| ParseError::BadSize(s.to_string()))
}
