//! What a volume's jobs need before the timed part (its files prepared on the host,
//! its nodes looked up, handles opened) and the job of each slot.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::driver::SlotQueue;
use super::prepare::{prepare_dir, prepare_read_file, prepare_write_file};
use super::volumes::{lookup_work_dir, Target};
use super::workloads::{entry_name, DataJob, GetattrJob, Job, LookupJob, MetaJob, ReaddirJob};
use super::{Error, LgResult, Options, Workload, DIR_10K, READ_FILE, WRITE_FILE};
use crate::frontend::FuseOps;

/// What one volume's jobs need, set up before the timed part.
#[derive(Default)]
pub(crate) struct VolSetup {
    pub(crate) file_node: u64,
    pub(crate) dir_node: u64,
    pub(crate) nodes: Arc<Vec<u64>>,
    pub(crate) written: Option<Arc<Vec<AtomicU64>>>,
    pub(crate) write_path: Option<PathBuf>,
    pub(crate) meta_dir: Option<PathBuf>,
    /// The data file's handle on each queue (opened by the queue itself, like
    /// separate guest processes).
    pub(crate) fhs: Vec<u64>,
}

/// Prepares one volume's files on the host and looks up the nodes its jobs use.
pub(crate) fn setup_volume(
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
pub(crate) fn make_job(
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
