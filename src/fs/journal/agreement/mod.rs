//! The two records of the guest's session agree: after any sequence of guest
//! requests, the journal's rebuild (`FsServer::rebuild_journal`, what a serving
//! process started after a crash loads) and a snapshot of the same daemon
//! (`FsServer::save_session`, what a migration writes) say the same about what
//! the guest holds.
//!
//! Each run builds a stack as the daemon does under a keeper (a journal in half A
//! of a session region), on a fresh tree in the temp directory, in one of two
//! layouts: the whole SharedDir, or `--allowed-dir` volumes (`top/a` read-write
//! with a volume id, `top/b` read-only, `c` read-write: a virtual directory `top`
//! above two of them). It serves a random sequence of FUSE requests, sent as raw
//! bytes through `FsServer::handle_local` as a guest's would come, and compares the
//! two records at a few random points and at the end. The sequence comes from a
//! seeded xorshift generator: a failure prints the seed, the requests it sent (with
//! their answers) and the difference; `VOLFSD_AGREEMENT_SEED=<seed>` runs that one
//! seed again.
//!
//! The guest behaves as a Linux guest kernel does where the journal depends on it
//! (see [`Model`]): it forgets a node only once no dentry it holds lies in it and
//! no file of it is open (a dentry pins its parent; an open file its dentry), and
//! an unlinked dentry stays (pinning its parent) as long as its node is held.
//! Everything else is random: names that exist and names that do not, requests on
//! read-only volumes, on detached volumes, on handles of other nodes, before INIT.
//!
//! What is compared (after sorting everything by id: the two list in different
//! orders): see [`Agreed`] and [`compare`].
//!
//! Needs root: each volume is a private mount (`open_tree`), as in the daemon.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use fuse_backend_rs::transport::{FuseDevWriter, Writer};

use super::rebuild::Rebuilt;
use super::Journal;
use crate::fs::{build, CacheMode, FsServer, PassthroughConfig, ShareSpec, Stack};
use crate::region::{Half, Region};
use crate::state::format::{self, GuestView, Location, SessionState};
use crate::state::SaveOptions;

/// Sequences per run, and requests per sequence.
const RUNS: u64 = 200;
const OPS: usize = 60;

/// Names the guest asks for: the trees below are made of them, so that a name
/// exists about as often as not.
const NAMES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "top"];
/// The FUSE lock owners the guest's processes are.
const OWNERS: [u64; 3] = [0x100, 0x101, 0x102];

mod compare;
mod model;
mod rig;

use compare::*;
use model::*;
use rig::*;

/// One region for a test: made once, its half A cleared for each run.
fn region() -> &'static Region {
    Box::leak(Box::new(
        Region::create().expect("a session region (a memfd)"),
    ))
}

/// One random run: `OPS` requests of seed `seed`, compared at a few random points
/// and at the end.
fn run(seed: u64, region: &'static Region) -> Coverage {
    let mut rng = Rng::new(seed);
    let layout = if seed.is_multiple_of(2) {
        Layout::Volumes
    } else {
        Layout::Whole
    };
    let mut s = Rig::new(layout, region);
    s.apply(&Op::Init);
    for i in 0..OPS {
        let op = s.random_op(&mut rng);
        s.apply(&op);
        if rng.one_in(12) {
            s.check(&format!("seed {seed}, after request {}", i + 1));
        }
    }
    s.check(&format!("seed {seed}, at the end"));
    std::mem::take(&mut s.coverage)
}

#[test]
fn the_journal_and_a_snapshot_agree_after_random_requests() {
    let region = region();
    if let Some(seed) = std::env::var("VOLFSD_AGREEMENT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run(seed, region);
        return;
    }
    // More seeds, for a longer search: VOLFSD_AGREEMENT_RUNS=<count>.
    let runs = std::env::var("VOLFSD_AGREEMENT_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(RUNS);
    let mut total = Coverage::default();
    for seed in 1..=runs {
        total.add(&run(seed, region));
    }
    eprintln!("{total:#?}");
}
