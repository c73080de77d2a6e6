//! volfsd-statebench: what a backend's device state adds to a migration's downtime.
//!
//! `tree` makes (or reuses) a share of N empty files in directories of 1,000.
//!
//! `run` plays a migrating VMM against two fresh daemons of one kind on that share,
//! with QEMU's message sequence:
//! - the source: connect, FUSE INIT, LOOKUP of every directory and every file (the
//!   guest then holds N + N/1000 nodes and the root);
//! - the migration starts: SET_LOG_BASE, then SET_FEATURES with VHOST_F_LOG_ALL
//!   (virtiofsd starts collecting its paths here, on a thread of its own);
//! - the precopy: by default until the source's process tree has been idle for
//!   500 ms (no CPU used, no thread running or waiting for the disk): what the daemon
//!   prepares at the start is then done, as when copying the guest's RAM outlasts it; `--precopy SECONDS` waits that long instead (0: the
//!   save follows at once, the daemon's preparation then falls into the downtime);
//! - the downtime: every ring stopped (SET_VRING_ENABLE 0, GET_VRING_BASE), the save
//!   (SET_DEVICE_STATE_FD SAVE, the pipe read to its end, CHECK_DEVICE_STATE), and
//!   the load into the destination, which was started with the source and connected
//!   only now, as a destination QEMU loads before it sets up memory and rings
//!   (SET_DEVICE_STATE_FD LOAD, every byte written, CHECK_DEVICE_STATE);
//! - a check that the load is real: GETATTR of the first, middle and last file's node
//!   id at the destination answers each file's inode.
//!
//! `upgrade` holds N nodes the same way through one volfsd started with
//! `--upgradable` (the keeper relays; docs/UPGRADE.md) and upgrades it K times by
//! SIGHUP, reading each pause from the keeper's log line; meanwhile the guest sends
//! GETATTRs one after another (the guest's view of the pause: the slowest one). After each upgrade the new
//! serving process must answer the first, middle and last file's node ids with their
//! inodes. benches/upgrade-pause.sh collects its lines.
//!
//! One JSON object per run (per upgrade for `upgrade`) is appended to `--json`
//! (benches/downtime.sh collects them); a failed transfer or check exits 1. No time
//! is asserted.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use fuse_backend_rs::abi::fuse_abi::{AttrOut, EntryOut, GetattrIn, Opcode};
use serde_json::json;
use volfsd_harness::fixtures::host::{
    clock_ticks_per_second, process_tree, serving_pid, status_kb, tree_cpu_ticks,
};
use volfsd_harness::fixtures::ROOT;
use volfsd_harness::frontend::{
    self, DeviceConfig, DirtyLog, FuseClient, FuseOps, FuseQueue, Request, StateTransferTimes,
};

/// Files per directory of the tree.
const PER_DIR: usize = 1000;
/// LOOKUPs in flight while the source is filled.
const LOOKUP_QD: usize = 32;
/// The precopy ends when the source was idle (no CPU used, no thread running or
/// waiting for the disk) for this long.
const IDLE_FOR: Duration = Duration::from_millis(500);

#[derive(Parser, Debug)]
#[command(name = "volfsd-statebench", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Make TREE/nN: N empty files in directories of 1,000 (kept and reused; the
    /// marker TREE/nN.complete says it is whole)
    Tree {
        #[arg(long)]
        tree: PathBuf,
        #[arg(long)]
        nodes: usize,
    },
    /// One migration of one daemon kind on TREE/nN; appends a JSON line to --json
    Run(RunArgs),
    /// Upgrades of one --upgradable volfsd holding TREE/nN; a JSON line per upgrade
    Upgrade(UpgradeArgs),
}

#[derive(clap::Args, Debug)]
struct UpgradeArgs {
    /// The volfsd binary (upgraded to itself: the binary at this path)
    #[arg(long)]
    volfsd: PathBuf,
    /// Extra daemon arguments, split at spaces
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    daemon_args: String,
    /// The directory of the trees (see `tree`)
    #[arg(long)]
    tree: PathBuf,
    /// Files the guest holds (the tree TREE/nN)
    #[arg(long)]
    nodes: usize,
    /// Upgrades in a row
    #[arg(long, default_value_t = 10)]
    upgrades: u32,
    /// Wait between two upgrades (the guest idle): the previous serving process
    /// has exited by then. 0: the next upgrade as soon as the keeper logged the last
    /// (back to back)
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// The guest sends GETATTRs one after another during each upgrade (its own
    /// view of the pause); one unanswered for 2 s counts as stalled and the queue's
    /// kick eventfd is written again (a kick lost in the hand-over, before the
    /// keeper's spurious kick: docs/UPGRADE.md)
    #[arg(long)]
    probe: bool,
    /// Sockets and the daemon's log go here
    #[arg(long)]
    work: PathBuf,
    /// Append one JSON line per upgrade to this file
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The daemon's name in the results (volfsd, virtiofsd, ...)
    #[arg(long)]
    name: String,
    /// Its command line, split at spaces; {sock} and {share} are replaced. Source
    /// and destination run the same line
    #[arg(long)]
    daemon: String,
    /// The directory of the trees (see `tree`)
    #[arg(long)]
    tree: PathBuf,
    /// Files the guest holds (the tree TREE/nN)
    #[arg(long)]
    nodes: usize,
    /// Sockets and daemon logs go here
    #[arg(long)]
    work: PathBuf,
    /// Repetition number, recorded as given
    #[arg(long, default_value_t = 1)]
    rep: u32,
    /// `idle`: wait until the source has been idle for 500 ms after LOG_ALL; or seconds
    #[arg(long, default_value = "idle")]
    precopy: String,
    /// Give up waiting for an idle source after this many seconds
    #[arg(long, default_value_t = 900.0)]
    precopy_max: f64,
    /// Append the result as one JSON line to this file
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.cmd {
        Cmd::Tree { tree, nodes } => make_tree(tree, *nodes).map(|_| ()),
        Cmd::Run(args) => run(args),
        Cmd::Upgrade(args) => upgrade(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("volfsd-statebench: FAILED: {e}");
            ExitCode::from(1)
        }
    }
}

/// What a run failed at: the step, the file, request or upgrade it concerned, and
/// the error of the call that failed. `main` prints it as
/// `volfsd-statebench: FAILED: {error}` (benches/smoke.sh greps FAILED).
#[derive(Debug)]
enum Error {
    /// A host call on a file or directory failed (`step`: "creating", "removing",
    /// ...; None where the path says enough: opening it, its metadata).
    File {
        step: Option<&'static str>,
        path: PathBuf,
        source: io::Error,
    },
    /// The daemon's command line has no program.
    EmptyDaemon,
    /// The daemon could not be started.
    Spawn { program: String, source: io::Error },
    /// A host call on no file failed (SIGHUP to the keeper, the kick eventfd).
    Host {
        step: &'static str,
        source: io::Error,
    },
    /// A step through the frontend failed (`step`: None where the frontend's
    /// error names the message or request itself).
    Frontend {
        step: Option<String>,
        source: frontend::Error,
    },
    /// `--precopy`: neither `idle` nor seconds.
    BadPrecopy(String),
    /// No LOOKUP was answered in 60 s (how many had been).
    NoLookupReply { done: usize },
    /// A completion of no LOOKUP submitted.
    StrayReply { token: u64 },
    /// LOOKUP answered another inode than the host's file has.
    HostInode {
        path: PathBuf,
        answered: u64,
        host: u64,
    },
    /// A held file's node answered another inode than before (`when`: "after the
    /// load", "after upgrade 3").
    NodeInode {
        file: usize,
        node: u64,
        got: u64,
        when: String,
        before: u64,
    },
    /// The root answered another inode than the share's during an upgrade.
    RootInode {
        upgrade: u32,
        answered: u64,
        share: u64,
    },
    /// A GETATTR the guest sent during an upgrade failed (after this many).
    Probe {
        upgrade: u32,
        after: u64,
        source: Box<Error>,
    },
    /// The keeper logged no outcome of the upgrade in 120 s.
    NoOutcome { upgrade: u32 },
    /// The keeper's line on the upgrade has no pause: the upgrade failed, and the
    /// line says why.
    NoPause { upgrade: u32, line: String },
    /// An error while a daemon served, with the last lines of its log.
    Daemon {
        source: Box<Error>,
        log_tail: String,
    },
}

impl Error {
    /// A failed host call on `path`, for `map_err`.
    fn file<'a>(
        step: Option<&'static str>,
        path: &'a Path,
    ) -> impl FnOnce(io::Error) -> Error + 'a {
        move |source| Error::File {
            step,
            path: path.to_path_buf(),
            source,
        }
    }

    /// A failed step through the frontend, for `map_err`.
    fn step(step: impl Into<String>) -> impl FnOnce(frontend::Error) -> Error {
        let step = Some(step.into());
        move |source| Error::Frontend { step, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::File {
                step: Some(step),
                path,
                source,
            } => write!(f, "{step} {}: {source}", path.display()),
            Error::File {
                step: None,
                path,
                source,
            } => write!(f, "{}: {source}", path.display()),
            Error::EmptyDaemon => write!(f, "--daemon is empty"),
            Error::Spawn { program, source } => write!(f, "starting {program}: {source}"),
            Error::Host { step, source } => write!(f, "{step}: {source}"),
            Error::Frontend {
                step: Some(step),
                source,
            } => write!(f, "{step}: {source}"),
            Error::Frontend { step: None, source } => write!(f, "{source}"),
            Error::BadPrecopy(v) => write!(f, "--precopy {v}: idle or seconds"),
            Error::NoLookupReply { done } => write!(f, "no LOOKUP reply in 60 s ({done} done)"),
            Error::StrayReply { token } => write!(f, "a reply to no LOOKUP: {token}"),
            Error::HostInode {
                path,
                answered,
                host,
            } => write!(
                f,
                "LOOKUP of {} answered inode {answered}, the host has {host}",
                path.display()
            ),
            Error::NodeInode {
                file,
                node,
                got,
                when,
                before,
            } => write!(
                f,
                "file {file} (node {node}): inode {got} {when}, {before} before"
            ),
            Error::RootInode {
                upgrade,
                answered,
                share,
            } => write!(
                f,
                "upgrade {upgrade}: the root answered inode {answered}, the share's is {share}"
            ),
            Error::Probe {
                upgrade,
                after,
                source,
            } => write!(
                f,
                "GETATTR during upgrade {upgrade} (after {after}): {source}"
            ),
            Error::NoOutcome { upgrade } => write!(f, "upgrade {upgrade}: no outcome in 120 s"),
            Error::NoPause { upgrade, line } => write!(f, "upgrade {upgrade}: {line}"),
            Error::Daemon { source, log_tail } => {
                write!(f, "{source} (daemon log: {log_tail})")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<frontend::Error> for Error {
    fn from(source: frontend::Error) -> Self {
        Error::Frontend { step: None, source }
    }
}

type Res<T> = Result<T, Error>;

fn dir_name(d: usize) -> String {
    format!("d{d:05}")
}

fn file_name(f: usize) -> String {
    format!("f{f:03}")
}

/// (directory index, file index in it) of file `i`.
fn place(i: usize) -> (usize, usize) {
    (i / PER_DIR, i % PER_DIR)
}

fn share_of(tree: &Path, nodes: usize) -> PathBuf {
    tree.join(format!("n{nodes}"))
}

/// Makes the tree unless its marker says it is whole; returns the share.
fn make_tree(tree: &Path, nodes: usize) -> Res<PathBuf> {
    let share = share_of(tree, nodes);
    let marker = tree.join(format!("n{nodes}.complete"));
    if fs::read_to_string(&marker).is_ok_and(|s| s.trim() == nodes.to_string()) {
        return Ok(share);
    }
    eprintln!(
        "statebench: making {} ({nodes} empty files)",
        share.display()
    );
    let start = Instant::now();
    let _ = fs::remove_file(&marker);
    if share.exists() {
        fs::remove_dir_all(&share).map_err(Error::file(Some("removing"), &share))?;
    }
    fs::create_dir_all(&share).map_err(Error::file(Some("creating"), &share))?;
    for i in 0..nodes {
        let (d, f) = place(i);
        let dir = share.join(dir_name(d));
        if f == 0 {
            fs::create_dir(&dir).map_err(Error::file(Some("creating"), &dir))?;
        }
        let p = dir.join(file_name(f));
        File::create(&p).map_err(Error::file(Some("creating"), &p))?;
    }
    // SAFETY: sync has no preconditions. The tree's metadata reaches the disk now,
    // not during a measurement.
    unsafe { libc::sync() };
    fs::write(&marker, format!("{nodes}\n")).map_err(Error::file(Some("writing"), &marker))?;
    eprintln!(
        "statebench: made {} in {:.1} s",
        share.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(share)
}

/// A daemon this run started; stopped (and waited for) when dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn spawn(template: &str, sock: &Path, share: &Path, log: PathBuf) -> Res<Daemon> {
        let line = template
            .replace("{sock}", &sock.display().to_string())
            .replace("{share}", &share.display().to_string());
        let mut words = line.split_whitespace();
        let program = words.next().ok_or(Error::EmptyDaemon)?;
        let _ = fs::remove_file(sock);
        let out = File::create(&log).map_err(Error::file(None, &log))?;
        let err = out
            .try_clone()
            .map_err(Error::file(Some("duplicating the fd of"), &log))?;
        let child = Command::new(program)
            .args(words)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Spawn {
                program: program.to_string(),
                source,
            })?;
        Ok(Daemon { child, log })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the daemon to exit by itself (its frontend went away), else kills it.
    fn finish(mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// `e`, with the end of this daemon's log, for `map_err`.
    fn failed(&self) -> impl FnOnce(Error) -> Error + '_ {
        move |e| Error::Daemon {
            source: Box::new(e),
            log_tail: self.log_tail(),
        }
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn device_config(sock: &Path) -> DeviceConfig {
    let mut cfg = DeviceConfig::new(sock);
    cfg.memory_size = 64 << 20;
    cfg.queue_size = 1024;
    cfg.event_idx = true;
    cfg.dirty_log = true;
    cfg.connect_timeout = Duration::from_secs(60);
    cfg
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn cpu_ms(ticks: u64) -> f64 {
    ticks as f64 * 1e3 / clock_ticks_per_second()
}

fn rss_anon_kb(pid: i32) -> u64 {
    process_tree(pid)
        .into_iter()
        .map(|p| status_kb(p, "RssAnon"))
        .sum()
}

fn fd_count(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{}/fd", serving_pid(pid)))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

fn times_json(t: &StateTransferTimes) -> serde_json::Value {
    json!({
        "set_fd_ms": ms(t.set_fd),
        "data_ms": ms(t.data),
        "check_ms": ms(t.check),
        "total_ms": ms(t.total()),
        "bytes": t.bytes,
    })
}

/// LOOKUPs of `(parent, name)`, `LOOKUP_QD` in flight; the replies in order.
fn lookup_all(q: &mut FuseQueue, names: &[(u64, String)]) -> Res<Vec<EntryOut>> {
    let mut out = vec![EntryOut::default(); names.len()];
    let mut tokens = std::collections::HashMap::new();
    let mut next = 0;
    let mut done = 0;
    while done < names.len() {
        while next < names.len() && tokens.len() < LOOKUP_QD {
            let (parent, name) = &names[next];
            let req = Request::new(Opcode::Lookup, *parent)
                .name(name)
                .reply_of::<EntryOut>();
            let token = q
                .submit(&req)
                .map_err(Error::step(format!("LOOKUP {name}")))?;
            tokens.insert(token, next);
            next += 1;
        }
        q.kick()?;
        let completions = q.wait_completions(Duration::from_secs(60))?;
        if completions.is_empty() {
            return Err(Error::NoLookupReply { done });
        }
        for c in completions {
            let i = tokens
                .remove(&c.token)
                .ok_or(Error::StrayReply { token: c.token })?;
            let entry: EntryOut = c
                .into_reply()
                .and_then(|r| r.parse())
                .map_err(Error::step(format!("LOOKUP {}", names[i].1)))?;
            out[i] = entry;
            done += 1;
        }
    }
    Ok(out)
}

/// Threads of the process tree of `pid` running or in an uninterruptible wait (the
/// state field of `/proc/PID/task/TID/stat` is R or D): work in progress that may
/// not show as CPU time yet (a thread waiting for the disk, or for a core).
fn busy_threads(pid: i32) -> usize {
    process_tree(pid)
        .into_iter()
        .flat_map(|p| {
            fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|t| {
            let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            matches!(state, Some("R" | "D"))
        })
        .count()
}

/// Waits until the process tree of `pid` used no CPU and had no thread running or
/// waiting for the disk for `IDLE_FOR` (or `max` passed); returns when it was last
/// busy, the CPU it used meanwhile, and whether it became idle.
fn wait_idle(pid: i32, max: Duration) -> (Duration, u64, bool) {
    let start = Instant::now();
    let first = tree_cpu_ticks(pid);
    let mut last = first;
    let mut last_busy = start;
    let mut busy_seen = Duration::ZERO;
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let now = tree_cpu_ticks(pid);
        if now != last || busy_threads(pid) > 0 {
            last = now;
            last_busy = Instant::now();
            busy_seen = last_busy - start;
        }
        if last_busy.elapsed() >= IDLE_FOR {
            return (busy_seen, last - first, true);
        }
        if start.elapsed() >= max {
            return (busy_seen, last - first, false);
        }
    }
}

/// A file the guest holds: (file index, node id, inode).
type Sample = (usize, u64, u64);

/// The guest holds the tree: every directory and file looked up once. Returns the
/// lookups' time, the nodes held, and (file index, node id, inode) of the first,
/// middle and last file, each checked against the host.
fn hold(c: &mut FuseClient, share: &Path, nodes: usize) -> Res<(f64, usize, Vec<Sample>)> {
    let dirs = nodes.div_ceil(PER_DIR);
    let lookups = Instant::now();
    let dir_names: Vec<(u64, String)> = (0..dirs).map(|d| (ROOT, dir_name(d))).collect();
    let q = c.request_queue(0)?;
    let dir_entries = lookup_all(q, &dir_names)?;
    let file_names: Vec<(u64, String)> = (0..nodes)
        .map(|i| {
            let (d, f) = place(i);
            (dir_entries[d].nodeid, file_name(f))
        })
        .collect();
    let file_entries = lookup_all(q, &file_names)?;
    let lookup_s = lookups.elapsed().as_secs_f64();
    let held = dirs + nodes;
    let samples: Vec<Sample> = [0, nodes / 2, nodes - 1]
        .into_iter()
        .map(|i| (i, file_entries[i].nodeid, file_entries[i].attr.ino))
        .collect();
    drop(file_entries);
    drop(file_names);
    for &(i, _, ino) in &samples {
        let (d, f) = place(i);
        let host = share.join(dir_name(d)).join(file_name(f));
        let host_ino = fs::metadata(&host).map_err(Error::file(None, &host))?.ino();
        if host_ino != ino {
            return Err(Error::HostInode {
                path: host,
                answered: ino,
                host: host_ino,
            });
        }
    }
    Ok((lookup_s, held, samples))
}

fn run(a: &RunArgs) -> Res<()> {
    let share = make_tree(&a.tree, a.nodes)?;
    fs::create_dir_all(&a.work).map_err(Error::file(Some("creating"), &a.work))?;
    let tag = format!("{}-n{}-rep{}", a.name, a.nodes, a.rep);
    let src_sock = a.work.join(format!("{}-src.sock", a.name));
    let dst_sock = a.work.join(format!("{}-dst.sock", a.name));
    let src = Daemon::spawn(
        &a.daemon,
        &src_sock,
        &share,
        a.work.join(format!("{tag}-src.log")),
    )?;
    let dst = Daemon::spawn(
        &a.daemon,
        &dst_sock,
        &share,
        a.work.join(format!("{tag}-dst.log")),
    )?;

    // The guest: INIT, then every directory and file looked up once.
    let mut c = FuseClient::connect(&device_config(&src_sock))
        .map_err(Error::step("source"))
        .map_err(src.failed())?;
    c.init_session(&Default::default())
        .map_err(Error::step("source INIT"))
        .map_err(src.failed())?;
    let (lookup_s, held, samples) = hold(&mut c, &share, a.nodes).map_err(src.failed())?;
    let src_rss_kb = rss_anon_kb(src.pid());
    let src_fds = fd_count(src.pid());

    // The migration starts: the dirty log, then LOG_ALL.
    let log = DirtyLog::new(c.device().memory().size())?;
    let t = Instant::now();
    c.device()
        .set_log_base(&log)
        .map_err(Error::from)
        .map_err(src.failed())?;
    let log_base = t.elapsed();
    let t = Instant::now();
    c.device()
        .set_log_all(true)
        .map_err(Error::from)
        .map_err(src.failed())?;
    let log_all = t.elapsed();

    // The precopy.
    let (prep, prep_ticks, prep_idle) = if a.precopy == "idle" {
        wait_idle(src.pid(), Duration::from_secs_f64(a.precopy_max))
    } else {
        let s: f64 = a
            .precopy
            .parse()
            .map_err(|_| Error::BadPrecopy(a.precopy.clone()))?;
        let before = tree_cpu_ticks(src.pid());
        std::thread::sleep(Duration::from_secs_f64(s));
        (Duration::ZERO, tree_cpu_ticks(src.pid()) - before, false)
    };

    // The downtime: rings stopped, the state saved, then loaded at the destination.
    let queues = c.request_queue_count() as u16 + 1;
    let t = Instant::now();
    for index in 0..queues {
        c.device()
            .stop_queue(index)
            .map_err(Error::from)
            .map_err(src.failed())?;
    }
    let stop = t.elapsed();
    let ticks = tree_cpu_ticks(src.pid());
    let state = c
        .device()
        .save_state()
        .map_err(Error::step("save"))
        .map_err(src.failed())?;
    let save = c.device().last_transfer().expect("a save was made");
    let save_cpu = tree_cpu_ticks(src.pid()) - ticks;

    let mut cfg = device_config(&dst_sock);
    cfg.load_state = Some(state);
    let ticks = tree_cpu_ticks(dst.pid());
    let mut g = FuseClient::connect(&cfg)
        .map_err(Error::step("load"))
        .map_err(dst.failed())?;
    let load = g.device().last_transfer().expect("a load was made");
    let load_cpu = tree_cpu_ticks(dst.pid()) - ticks;
    let state_bytes = cfg.load_state.take().map_or(0, |s| s.len());

    // The destination serves the guest's node ids.
    for &(i, nodeid, ino) in &samples {
        let got = g
            .getattr(nodeid)
            .map_err(Error::step(format!(
                "GETATTR of file {i} (node {nodeid}) after the load"
            )))
            .map_err(dst.failed())?
            .attr
            .ino;
        if got != ino {
            return Err(Error::NodeInode {
                file: i,
                node: nodeid,
                got,
                when: "after the load".into(),
                before: ino,
            });
        }
    }
    let dst_rss_kb = rss_anon_kb(dst.pid());
    let dst_fds = fd_count(dst.pid());

    let result = json!({
        "daemon": a.name,
        "command": a.daemon,
        "nodes": a.nodes,
        "held_nodes": held,
        "rep": a.rep,
        "precopy": a.precopy,
        "lookup_s": lookup_s,
        "src_rss_anon_kb": src_rss_kb,
        "src_fds": src_fds,
        "log_base_ms": ms(log_base),
        "log_all_ms": ms(log_all),
        "prep_ms": ms(prep),
        "prep_cpu_ms": cpu_ms(prep_ticks),
        "prep_idle": prep_idle,
        "stop_ms": ms(stop),
        "save": times_json(&save),
        "save_cpu_ms": cpu_ms(save_cpu),
        "load": times_json(&load),
        "load_cpu_ms": cpu_ms(load_cpu),
        "state_bytes": state_bytes,
        "save_ms": ms(save.total()),
        "load_ms": ms(load.total()),
        "sum_ms": ms(save.total() + load.total()),
        "dst_rss_anon_kb": dst_rss_kb,
        "dst_fds": dst_fds,
        "verified_nodes": samples.len(),
    });
    eprintln!(
        "statebench: {tag}: {held} nodes held (lookups {lookup_s:.1} s); LOG_ALL {:.2} ms, \
         prepared {:.0} ms; stop {:.2} ms; save {:.1} ms, {state_bytes} bytes; load {:.1} ms; \
         sum {:.1} ms; destination RssAnon {dst_rss_kb} kB",
        ms(log_all),
        ms(prep),
        ms(stop),
        ms(save.total()),
        ms(load.total()),
        ms(save.total() + load.total()),
    );
    if let Some(path) = &a.json {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(Error::file(None, path))?;
        writeln!(f, "{result}").map_err(Error::file(Some("appending to"), path))?;
    }

    // The source goes as after a migration, then the destination as its VM ends;
    // each exits by itself when its frontend disconnects.
    drop(c);
    drop(log);
    let src_exit = src.finish(Duration::from_secs(120));
    drop(g);
    let dst_exit = dst.finish(Duration::from_secs(120));
    if src_exit.is_none() || dst_exit.is_none() {
        eprintln!(
            "statebench: {tag}: a daemon did not exit within 120 s of its disconnect; killed"
        );
    }
    Ok(())
}

/// How long a GETATTR may go unanswered before it counts as stalled and the queue
/// is kicked again.
const STALL: Duration = Duration::from_secs(2);

/// A GETATTR of the root: its inode, and whether it stalled (no answer within
/// `STALL`, then answered after the queue's kick eventfd was written once more).
fn getattr_root(c: &mut FuseClient) -> Res<(u64, bool)> {
    let q = c.request_queue(0)?;
    let req = Request::new(Opcode::Getattr, ROOT)
        .arg(&GetattrIn::default())
        .reply_of::<AttrOut>();
    let token = q.submit(&req)?;
    q.kick()?;
    let mut stalled = false;
    let done = match q.wait_for(token, STALL) {
        Ok(done) => done,
        Err(_) => {
            stalled = true;
            // notify() would skip a kick for a request it kicked for already (and
            // with EVENT_IDX past the device's avail_event): write the kick eventfd
            // itself, as a spurious notification.
            q.ring()
                .kick_eventfd()
                .write(1)
                .map_err(|source| Error::Host {
                    step: "kick eventfd",
                    source,
                })?;
            q.wait_for(token, Duration::from_secs(30))
                .map_err(Error::step(format!(
                    "no answer {STALL:?} after its kick, nor 30 s after another"
                )))?
        }
    };
    let attr: AttrOut = done.into_reply().and_then(|r| r.parse())?;
    Ok((attr.attr.ino, stalled))
}

/// The first, middle and last file answer GETATTR with their inodes.
fn check_samples(c: &mut FuseClient, samples: &[Sample], when: &str) -> Res<()> {
    for &(i, nodeid, ino) in samples {
        let got = c
            .getattr(nodeid)
            .map_err(Error::step(format!(
                "GETATTR of file {i} (node {nodeid}) {when}"
            )))?
            .attr
            .ino;
        if got != ino {
            return Err(Error::NodeInode {
                file: i,
                node: nodeid,
                got,
                when: when.to_string(),
                before: ino,
            });
        }
    }
    Ok(())
}

fn upgrade(a: &UpgradeArgs) -> Res<()> {
    let share = make_tree(&a.tree, a.nodes)?;
    fs::create_dir_all(&a.work).map_err(Error::file(Some("creating"), &a.work))?;
    let sock = a.work.join("upgrade.sock");
    // No control socket: with one the guest's root would hold only volumes. The
    // upgrades go by SIGHUP to the keeper (the launched process), and the pause is
    // read from its log line, as `ctl upgrade` reports it.
    let template = format!(
        "{} --upgradable --socket-path {{sock}} --shared-dir {{share}} --cache none {}",
        a.volfsd.display(),
        a.daemon_args
    );
    let tag = format!("upgrade-n{}", a.nodes);
    let d = Daemon::spawn(&template, &sock, &share, a.work.join(format!("{tag}.log")))?;
    let mut c = FuseClient::connect(&device_config(&sock))
        .map_err(Error::from)
        .map_err(d.failed())?;
    c.init_session(&Default::default())
        .map_err(Error::step("INIT"))
        .map_err(d.failed())?;
    let (lookup_s, held, samples) = hold(&mut c, &share, a.nodes).map_err(d.failed())?;
    eprintln!("statebench: {tag}: {held} nodes held (lookups {lookup_s:.1} s)");
    let root_ino = fs::metadata(&share)
        .map_err(Error::file(None, &share))?
        .ino();
    let outcomes = |d: &Daemon| -> Vec<String> {
        fs::read_to_string(&d.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("keeper: upgraded:") || l.contains("keeper: upgrade failed"))
            .map(str::to_string)
            .collect()
    };
    for k in 1..=a.upgrades {
        if k > 1 {
            std::thread::sleep(Duration::from_millis(a.interval_ms));
        }
        let rss_kb = rss_anon_kb(d.pid());
        let before = outcomes(&d).len();
        let start = Instant::now();
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        if unsafe { libc::kill(d.pid(), libc::SIGHUP) } != 0 {
            return Err(Error::Host {
                step: "SIGHUP",
                source: io::Error::last_os_error(),
            });
        }
        // The guest meanwhile: one GETATTR after another until the keeper logs the
        // outcome.
        let (mut getattrs, mut slowest, mut stalls) = (0u64, Duration::ZERO, 0u32);
        let line = loop {
            if !a.probe {
                if let Some(l) = outcomes(&d).into_iter().nth(before) {
                    break l;
                }
                if start.elapsed() > Duration::from_secs(120) {
                    return Err(d.failed()(Error::NoOutcome { upgrade: k }));
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let t = Instant::now();
            let (ino, stalled) = getattr_root(&mut c)
                .map_err(|e| Error::Probe {
                    upgrade: k,
                    after: getattrs,
                    source: Box::new(e),
                })
                .map_err(d.failed())?;
            if stalled {
                stalls += 1;
            } else {
                slowest = slowest.max(t.elapsed());
            }
            getattrs += 1;
            if ino != root_ino {
                return Err(Error::RootInode {
                    upgrade: k,
                    answered: ino,
                    share: root_ino,
                });
            }
            if getattrs % 16 == 0 || stalled {
                if let Some(l) = outcomes(&d).into_iter().nth(before) {
                    break l;
                }
                if start.elapsed() > Duration::from_secs(120) {
                    return Err(d.failed()(Error::NoOutcome { upgrade: k }));
                }
            }
        };
        let upgrade_ms = ms(start.elapsed());
        let pause_ms: u64 = line
            .split("the guest waited ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                d.failed()(Error::NoPause {
                    upgrade: k,
                    line: line.clone(),
                })
            })?;
        check_samples(&mut c, &samples, &format!("after upgrade {k}")).map_err(d.failed())?;
        let result = json!({
            "nodes": a.nodes,
            "held_nodes": held,
            "daemon_args": a.daemon_args,
            "upgrade": k,
            "pause_ms": pause_ms,
            "upgrade_ms": upgrade_ms,
            "getattrs_during": getattrs,
            "slowest_getattr_ms": ms(slowest),
            "stalled_getattrs": stalls,
            "probe": a.probe,
            "interval_ms": a.interval_ms,
            "rss_anon_kb_before": rss_kb,
            "lookup_s": lookup_s,
            "verified_nodes": samples.len(),
        });
        eprintln!(
            "statebench: {tag}: upgrade {k}: the keeper's pause {pause_ms} ms; slowest of \
             {getattrs} GETATTRs {:.1} ms ({stalls} stalled); the whole upgrade {upgrade_ms:.0} ms",
            ms(slowest)
        );
        if let Some(path) = &a.json {
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(Error::file(None, path))?;
            writeln!(f, "{result}").map_err(Error::file(Some("appending to"), path))?;
        }
    }
    drop(c);
    if d.finish(Duration::from_secs(120)).is_none() {
        eprintln!(
            "statebench: {tag}: the daemon did not exit within 120 s of its disconnect; killed"
        );
    }
    Ok(())
}
