//! volfsd-loadgen: drives a vhost-user-fs backend (volfsd, virtiofsd) like a
//! guest's virtio-fs driver and reports ops/s, MiB/s and latency percentiles.
//! Every reply and every byte of data is checked; any mismatch exits 1.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use volfsd_harness::loadgen::{self, Options, ParseError, Workload};

#[derive(Parser, Debug)]
#[command(name = "volfsd-loadgen", version, about)]
struct Cli {
    /// vhost-user-fs socket of the backend
    #[arg(long, required_unless_present = "floor")]
    socket: Option<PathBuf>,
    /// No daemon: each workload's host system calls in a tight loop on one thread,
    /// on the same files (the host floor a daemon's overhead is measured against).
    #[arg(long)]
    floor: bool,
    /// The backend's shared dir on the host (files are prepared and checked there)
    #[arg(long)]
    shared_dir: PathBuf,
    /// Request queues (one thread each)
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Requests in flight per queue
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Seconds per workload (default 10 unless --ops is given)
    #[arg(long)]
    duration: Option<f64>,
    /// Operations per workload instead of a duration
    #[arg(long)]
    ops: Option<u64>,
    /// Size of the data files (K/M/G suffixes)
    #[arg(long, default_value = "1G")]
    file_size: String,
    /// Entries of the LOOKUP/GETATTR/READDIRPLUS directory
    #[arg(long, default_value_t = 10_000)]
    files: usize,
    /// Comma-separated: randread4k,randwrite4k,seqread1m,seqwrite1m,lookup,getattr,metadata,readdirplus,
    /// qd1read4k,qd1getattr (one request in flight on one queue), all or none
    #[arg(long, visible_alias = "workloads", default_value = "all")]
    workload: String,
    /// Comma-separated volumes (NAME[,NAME...]) of a daemon started with
    /// `--allowed-dir NAME` for each: the volume NAME is SharedDir/NAME, /NAME in
    /// the guest, with its own work dir NAME/volfsd-loadgen. In-flight slot i of
    /// each queue works on volume i % n (so --qd must be at least n; the QD 1
    /// workloads load only the first), and the report has each volume's ops/s,
    /// latency and completions per 100 ms of the wall clock (JSON: per_volume).
    /// Default: none, the shared dir's root
    #[arg(long, value_name = "NAME[,NAME...]")]
    volumes: Option<String>,
    /// Write the results as JSON to this file
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the prepared read file and directory for the next run
    #[arg(long)]
    keep_files: bool,
    /// Only print the table
    #[arg(long)]
    quiet: bool,
    /// Seconds to stay connected and idle after INIT (footprint sampling)
    #[arg(long, default_value_t = 0.0)]
    idle_before: f64,
    /// Seconds to stay connected after the workloads (footprint sampling)
    #[arg(long, default_value_t = 0.0)]
    hold_after: f64,
    /// The daemon's pid: report its process tree's CPU time (utime + stime) per
    /// request for each workload
    #[arg(long)]
    daemon_pid: Option<i32>,
    /// Look up N empty files after INIT and never forget them, then run the
    /// workloads (`--workload none` for none) and hold for --hold-after: the
    /// daemon's memory and fds per held inode
    #[arg(long, default_value_t = 0)]
    hold_inodes: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let opts = match build(&cli) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("volfsd-loadgen: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.floor {
        return floor(&cli, &opts);
    }
    let volumes = cli
        .volumes
        .as_deref()
        .map(loadgen::volumes::parse_list)
        .unwrap_or_default();
    if cli.volumes.is_some() && volumes.is_empty() {
        eprintln!("volfsd-loadgen: --volumes needs at least one name");
        return ExitCode::from(2);
    }
    if let Err(e) = loadgen::volumes::targets(&opts.shared_dir, &volumes) {
        eprintln!("volfsd-loadgen: {e}");
        return ExitCode::from(2);
    }
    match loadgen::run_volumes(&opts, &volumes) {
        Ok(report) => {
            print!("{}", loadgen::table(&report));
            write_json(cli.json.as_deref(), &report)
        }
        Err(e) => {
            eprintln!("volfsd-loadgen: FAILED: {e}");
            ExitCode::from(1)
        }
    }
}

/// A flag whose value does not parse: the flag and why.
#[derive(Debug)]
struct BadFlag {
    flag: &'static str,
    source: ParseError,
}

impl fmt::Display for BadFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.flag, self.source)
    }
}

impl std::error::Error for BadFlag {}

fn build(cli: &Cli) -> Result<Options, BadFlag> {
    let flag = |flag| move |source| BadFlag { flag, source };
    Ok(Options {
        socket: cli.socket.clone().unwrap_or_default(),
        shared_dir: cli.shared_dir.clone(),
        queues: cli.queues,
        qd: cli.qd,
        duration: cli.duration.map(Duration::from_secs_f64),
        ops: cli.ops,
        file_size: loadgen::parse_size(&cli.file_size).map_err(flag("--file-size"))?,
        files: cli.files,
        workloads: Workload::parse_list(&cli.workload).map_err(flag("--workload"))?,
        keep_files: cli.keep_files,
        quiet: cli.quiet,
        idle_before: Duration::from_secs_f64(cli.idle_before),
        hold_after: Duration::from_secs_f64(cli.hold_after),
        daemon_pid: cli.daemon_pid,
        hold_inodes: cli.hold_inodes,
    })
}

fn floor(cli: &Cli, opts: &Options) -> ExitCode {
    match loadgen::floor::measure(opts) {
        Ok(report) => {
            println!(
                "{:<14} {:>12} {:>12}  system calls",
                "workload", "cpu us/op", "wall us/op"
            );
            for f in &report.floors {
                println!(
                    "{:<14} {:>12.3} {:>12.3}  {}",
                    f.workload, f.cpu_us_per_op, f.wall_us_per_op, f.syscalls
                );
            }
            write_json(cli.json.as_deref(), &report)
        }
        Err(e) => {
            eprintln!("volfsd-loadgen: floor: {e}");
            ExitCode::from(1)
        }
    }
}

/// The report as JSON into `path`, if given.
fn write_json(path: Option<&std::path::Path>, report: &impl serde::Serialize) -> ExitCode {
    let Some(path) = path else {
        return ExitCode::SUCCESS;
    };
    let text = serde_json::to_string_pretty(report).expect("report serializes");
    match std::fs::write(path, text + "\n") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("volfsd-loadgen: writing {}: {e}", path.display());
            ExitCode::from(1)
        }
    }
}
