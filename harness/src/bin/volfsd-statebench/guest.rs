//! The guest's side: looking the tree up to hold its nodes, GETATTRs of the root that
//! tell a stall, and the check that sampled files answer with their inodes.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{AttrOut, EntryOut, GetattrIn, Opcode};
use volfsd_harness::fixtures::ROOT;
use volfsd_harness::frontend::{FuseClient, FuseOps, FuseQueue, Request};

use crate::error::{Error, Res};
use crate::tree::{dir_name, file_name, place, PER_DIR};

/// LOOKUPs in flight while the source is filled.
pub(crate) const LOOKUP_QD: usize = 32;

/// LOOKUPs of `(parent, name)`, `LOOKUP_QD` in flight; the replies in order.
pub(crate) fn lookup_all(q: &mut FuseQueue, names: &[(u64, String)]) -> Res<Vec<EntryOut>> {
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

/// A file the guest holds: (file index, node id, inode).
pub(crate) type Sample = (usize, u64, u64);

/// The guest holds the tree: every directory and file looked up once. Returns the
/// lookups' time, the nodes held, and (file index, node id, inode) of the first,
/// middle and last file, each checked against the host.
pub(crate) fn hold(
    c: &mut FuseClient,
    share: &Path,
    nodes: usize,
) -> Res<(f64, usize, Vec<Sample>)> {
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

/// How long a GETATTR may go unanswered before it counts as stalled and the queue
/// is kicked again.
pub(crate) const STALL: Duration = Duration::from_secs(2);

/// A GETATTR of the root: its inode, and whether it stalled (no answer within
/// `STALL`, then answered after the queue's kick eventfd was written once more).
pub(crate) fn getattr_root(c: &mut FuseClient) -> Res<(u64, bool)> {
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
pub(crate) fn check_samples(c: &mut FuseClient, samples: &[Sample], when: &str) -> Res<()> {
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
