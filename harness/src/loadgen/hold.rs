//! `--hold-inodes N`: the daemon's cost per inode the guest holds. N empty files
//! are looked up once each and never forgotten, as a guest that walked a large tree
//! keeps them in its dentry cache; the footprint is then sampled from outside
//! (benches/scale.py) while the load generator holds them.

use std::fs::{self, File};
use std::time::Instant;

use serde::Serialize;

use super::prepare::say;
use super::session::Session;
use super::volumes::{lookup_work_dir, Target};
use super::{Error, LgResult, Options};
use crate::frontend::FuseOps;

/// What `--hold-inodes` got.
#[derive(Clone, Debug, Serialize)]
pub struct HeldInodes {
    pub requested: usize,
    pub held: usize,
    /// The errno that stopped the lookups early (ENFILE at the daemon's limit).
    pub stopped_by_errno: Option<i32>,
    pub lookup_seconds: f64,
}

fn dir_name(n: usize) -> String {
    format!("inodes-{n}")
}

/// N empty files `i0000000`.. in their own directory; reused when complete.
fn prepare(opts: &Options, target: &Target, n: usize) -> LgResult<()> {
    let dir = target.work_dir().join(dir_name(n));
    if fs::read_dir(&dir)
        .map(|rd| rd.count() == n)
        .unwrap_or(false)
    {
        return Ok(());
    }
    say(
        opts,
        &format!("preparing {} ({n} empty files)", dir.display()),
    );
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(Error::at(&dir))?;
    for i in 0..n {
        let p = dir.join(format!("i{i:07}"));
        File::create(&p).map_err(Error::at(&p))?;
    }
    Ok(())
}

/// Looks up N files (in the work dir of `target`, the first volume) and keeps every
/// node id; stops at the first errno reply.
pub(super) fn hold(
    session: &mut Session,
    opts: &Options,
    target: &Target,
    n: usize,
) -> LgResult<HeldInodes> {
    prepare(opts, target, n)?;
    let q = &mut session.queues[0];
    let base = lookup_work_dir(q, target, &mut Default::default())?;
    let dir = q
        .lookup(base, &dir_name(n))
        .map_err(Error::step("LOOKUP inodes dir"))?
        .nodeid;
    let start = Instant::now();
    let mut held = 0;
    let mut stopped_by_errno = None;
    for i in 0..n {
        match q.lookup(dir, &format!("i{i:07}")) {
            Ok(_) => held += 1,
            Err(err) => match err.errno() {
                Some(errno) => {
                    stopped_by_errno = Some(errno);
                    break;
                }
                None => {
                    return Err(Error::Frontend {
                        step: format!("LOOKUP i{i:07}"),
                        source: err,
                    })
                }
            },
        }
    }
    let lookup_seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "loadgen: HELD {held} of {n} inodes{} in {lookup_seconds:.1} s",
        stopped_by_errno.map_or(String::new(), |e| format!(" (stopped by errno {e})"))
    );
    Ok(HeldInodes {
        requested: n,
        held,
        stopped_by_errno,
        lookup_seconds,
    })
}
