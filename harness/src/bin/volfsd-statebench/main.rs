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

mod daemon;
mod error;
mod guest;
mod measure;
mod run;
mod tree;
mod upgrade;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::run::run;
use crate::tree::make_tree;
use crate::upgrade::upgrade;

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
