//! Requests that answer later, on the ring they came from: one mechanism for every
//! request a queue worker takes off its ring and does not answer in the drain.
//!
//! - a throttled request waits in its volume's line (`lines.rs`) and is served when
//!   its volume's tokens come, on the worker's wake timer (`timer.rs`);
//! - a request that may wait (a lock wait, SETLKW) is served on a thread of its own
//!   (`lock_waits.rs`), so an unlock queued behind it is not held up;
//! - a loaded device state's unanswered requests (`parked.rs`) are served once their
//!   ring runs on the destination.
//!
//! Each keeps its chain and the ring it came from ([`RingId`]), and is answered
//! under the vring's lock only while that ring runs ([`QueueHealth::answer_to`]): a
//! stopped ring (a paused VM) keeps it for later, a ring set up anew (a new driver)
//! never gets it. The file system decides what a request is and writes every reply
//! (`fs/request.rs`); this module decides only when.

mod lines;
mod lock_waits;
mod parked;
mod recovered;
mod timer;

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use log::{debug, warn};
use virtio_queue::DescriptorChain;

use super::guest_buffers::Broken;
use super::guest_buffers::ChainBuffers;
use super::memory::GuestMem;
use super::memory::Locked;
use super::request;
use super::ring::{Answer, Completions, Mem, RingId, RingRef};
use crate::fs::FsServer;
use crate::state::format::ParkedRequest;

pub use lines::WaitRoom;
pub use lock_waits::lock_waiters;
pub use parked::{chain_at, Parked};
pub use recovered::answer_recovered;
pub use timer::WakeTimer;

/// What waits on one queue, beside its ring.
#[derive(Clone, Copy)]
pub struct Later<'a> {
    /// Where its throttled requests wait (None: never throttled, the hiprio queue).
    pub room: Option<&'a Mutex<WaitRoom>>,
    /// The worker's wake timer, armed for the next waiting request.
    pub timer: Option<&'a WakeTimer>,
    /// Lock waits in progress and a loaded state's requests (a device state carries
    /// them).
    pub parked: &'a Arc<Parked>,
}

/// What became of a popped request.
pub(crate) enum Taken {
    /// Answered now (served, or a wait refused): its reply's length.
    Answered(u32),
    /// A lock-wait thread took it and returns it itself.
    OnThread,
    /// It waits in its volume's line.
    InLine,
}

impl Later<'_> {
    /// Takes a request popped from `ring_id` as `chain` (its local copy `request`):
    /// into its volume's line when the volume is over its limit or has requests
    /// waiting already, to a thread of its own when it may wait, else served now.
    pub(crate) fn take(
        &self,
        server: &Arc<FsServer>,
        ring: &RingRef,
        ring_id: RingId,
        chain: DescriptorChain<Mem>,
        request: &mut [u8],
        bufs: ChainBuffers,
    ) -> Result<Taken, Broken> {
        let admission = server.admit(request);
        if let (Some(room), Some((share, cost))) = (self.room, admission.limited) {
            // The clock read that ended the previous request, if metrics made one: a
            // clock read costs ~65 ns under a TSC-trapping hypervisor.
            let now = crate::metrics::recent_clock();
            let mut room = room.lock().unwrap();
            if room.has_line(&share) || share.stats.qos.admit(cost, now).is_err() {
                if request.len() <= lines::MAX_WAITING_REQUEST {
                    room.push(&share, ring_id, chain, request, cost, now);
                    return Ok(Taken::InLine);
                }
                // Too large to keep a copy of: served now, and paid for by the
                // requests after it.
                share.stats.qos.charge(cost);
            }
        }
        self.serve_now(
            server,
            ring,
            ring_id,
            chain,
            request,
            admission.may_wait,
            Some(bufs),
        )
    }

    /// Serves a request now, or on a thread of its own when it may wait (then it is
    /// never served inline: the worker holds the vring's lock while it serves).
    /// `bufs`: the chain's buffers, when the walk that copied the request found them.
    #[allow(clippy::too_many_arguments)]
    fn serve_now(
        &self,
        server: &Arc<FsServer>,
        ring: &RingRef,
        ring_id: RingId,
        chain: DescriptorChain<Mem>,
        request: &mut [u8],
        may_wait: bool,
        bufs: Option<ChainBuffers>,
    ) -> Result<Taken, Broken> {
        if may_wait {
            return Ok(lock_waits::wait_off_thread(
                server,
                ring,
                self.parked,
                ring_id,
                chain,
                request,
            ));
        }
        request::serve(server, &chain, request, bufs).map(Taken::Answered)
    }

    /// Serves one request answered late (throttled, or handed over by a loaded
    /// state) on the ring `state`, which runs, and queues its completion. Err: the
    /// ring could not be written.
    fn serve_late(
        &self,
        server: &Arc<FsServer>,
        ring: &RingRef,
        state: &mut Locked,
        done: &mut Completions,
        chain: DescriptorChain<Mem>,
        request: &mut [u8],
    ) -> io::Result<()> {
        let head = chain.head_index();
        let ring_id = ring.health.ring(state);
        let may_wait = crate::fs::request::may_wait(request);
        ring.counters.in_flight.store(1, Ordering::Relaxed);
        let taken = self.serve_now(server, ring, ring_id, chain, request, may_wait, None);
        ring.counters.in_flight.store(0, Ordering::Relaxed);
        match taken {
            Ok(taken) => complete(ring, state, done, head, taken),
            Err(Broken(why)) => {
                ring.health.stop_after_chain(ring.index, &why);
                Ok(())
            }
        }
    }
}

/// Counts a request answered or handed to a thread, and queues the completion of
/// an answer.
pub(crate) fn complete(
    ring: &RingRef,
    state: &mut Locked,
    done: &mut Completions,
    head: u16,
    taken: Taken,
) -> io::Result<()> {
    match taken {
        Taken::Answered(len) => {
            ring.counters.served.fetch_add(1, Ordering::Relaxed);
            done.add(state, head, len)
        }
        Taken::OnThread => {
            ring.counters.served.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        // Counted when its turn comes.
        Taken::InLine => Ok(()),
    }
}

/// Answers requests a loaded device state handed over (`parked.rs`) on the ring
/// `state`, which runs: each from its chain, found again by its head in the
/// migrated guest memory, as a drain would serve it (a lock wait goes to a thread of
/// its own). A throttled one is not held again: it waited at the source.
pub fn answer_parked(
    server: &Arc<FsServer>,
    mem: &GuestMem,
    ring: &RingRef,
    later: &Later,
    state: &mut Locked,
    requests: Vec<ParkedRequest>,
) -> io::Result<()> {
    let mut done = Completions::new(ring);
    crate::metrics::start_batch();
    for p in requests {
        let Some(chain) = chain_at(mem, state, p.head) else {
            warn!(
                "queue {}: an unanswered request of the loaded state names descriptor {}, \
                 which is no chain of this ring: dropped",
                ring.index, p.head
            );
            continue;
        };
        let mut request = p.request;
        later.serve_late(server, ring, state, &mut done, chain, &mut request)?;
    }
    done.flush(state)
}

/// How often a stopped queue's waiting requests are looked at again.
pub(super) const PAUSED_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Why the waiting requests are looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// After a drain: only if it started a volume's line.
    Drain,
    /// The worker's timer fired (their turn, or a limit changed).
    Timer,
}

/// Serves the waiting requests whose turn came, and sets the worker's timer for the
/// next one. Requests that wait for a ring set up anew since (a new driver) are
/// dropped: that ring is gone. `state` is the queue's vring, locked by the caller:
/// whether the ring may be answered is checked, and the answers written, under that
/// one lock, so the frontend cannot stop the ring in between.
pub fn release_waiting(
    server: &Arc<FsServer>,
    ring: &RingRef,
    later: &Later,
    state: &mut Locked,
    why: Wake,
) -> io::Result<()> {
    let (Some(room), Some(timer)) = (later.room, later.timer) else {
        return Ok(());
    };
    let mut ready = Vec::new();
    {
        let mut room = room.lock().unwrap();
        if why == Wake::Timer {
            room.timer_fired();
        } else if !room.needs_look() {
            return Ok(());
        }
        let Some(ring_id) = room.ring().filter(|_| !room.is_empty()) else {
            return Ok(());
        };
        let now = Instant::now();
        match ring.health.answer_to(state, ring_id) {
            Answer::Never => {
                let n = room.clear();
                debug!(
                    "queue {}: {n} throttled requests dropped: their ring is gone",
                    ring.index
                );
                timer.disarm();
                return Ok(());
            }
            Answer::Later => {
                // Stopped by the frontend (GET_VRING_BASE: a paused VM): nothing may
                // be returned to the ring until it starts it again, on the same rings
                // (then they are answered) or on new ones (then they are dropped).
                room.set_timer(timer, now, Some(PAUSED_POLL));
                return Ok(());
            }
            Answer::Now => {}
        }
        let next = room.take_ready(now, &mut ready);
        room.set_timer(timer, now, next);
    }
    crate::metrics::start_batch();
    let mut done = Completions::new(ring);
    for mut waiting in ready {
        later.serve_late(
            server,
            ring,
            state,
            &mut done,
            waiting.chain,
            &mut waiting.request,
        )?;
    }
    done.flush(state)
}
