//! The requests a serving process killed under the guest had taken off a ring and
//! not answered (`device/inflight.rs` found them): each is answered on the same ring,
//! from its chain in guest memory, as the file system decides
//! ([`AfterCrash`]): run again when it is idempotent, answered EIO when it may have
//! been applied, returned without a reply when it owes none. Counted in the session
//! region's counters (`/metrics`).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use log::{info, warn};

use super::lock_waits::late_reply;
use super::{chain_at, Later};
use crate::device::guest_buffers::Broken;
use crate::device::memory::GuestMem;
use crate::device::memory::Locked;
use crate::device::request::{copy_request, with_buffer};
use crate::device::ring::{Completions, RingRef};
use crate::fs::request::{AfterCrash, LateReply};
use crate::fs::FsServer;

/// How the requests a killed serving process left were answered.
#[derive(Debug, Default)]
pub struct Answered {
    /// Ran again (idempotent).
    pub rerun: u64,
    /// Answered EIO (not idempotent).
    pub failed: u64,
}

/// Answers the chains `heads` (in the order they were taken) on the ring `state`,
/// which runs.
pub fn answer_recovered(
    server: &Arc<FsServer>,
    mem: &GuestMem,
    ring: &RingRef,
    later: &Later,
    state: &mut Locked,
    heads: &[u16],
) -> io::Result<Answered> {
    let mut done = Completions::new(ring);
    crate::metrics::start_batch();
    let (mut rerun, mut failed) = (0u64, 0u64);
    for &head in heads {
        let Some(chain) = chain_at(mem, state, head) else {
            warn!(
                "queue {}: a request left by the killed serving process names descriptor \
                 {head}, which is no chain of this ring: dropped",
                ring.index
            );
            continue;
        };
        let outcome = with_buffer(|buf| -> io::Result<()> {
            if let Err(Broken(why)) = copy_request(&chain, buf) {
                ring.health.stop_after_chain(ring.index, &why);
                return Ok(());
            }
            match server.after_crash(buf) {
                AfterCrash::Rerun => {
                    rerun += 1;
                    later.serve_late(server, ring, state, &mut done, chain, buf)
                }
                AfterCrash::Fail => {
                    failed += 1;
                    let len = late_reply(&chain, LateReply::failed_by_crash(buf));
                    ring.counters.served.fetch_add(1, Ordering::Relaxed);
                    done.add(state, head, len)
                }
                AfterCrash::Drop => done.add(state, head, 0),
            }
        });
        outcome?;
    }
    info!(
        "queue {}: of the requests the killed serving process left, {rerun} ran again and \
         {failed} were answered EIO (not idempotent)",
        ring.index
    );
    done.flush(state)?;
    Ok(Answered { rerun, failed })
}
