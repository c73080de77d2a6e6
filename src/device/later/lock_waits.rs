//! Lock waits (SETLKW) on threads of their own: a wait may block until another
//! guest process, or another sandbox, unlocks, and that unlock must not queue
//! behind it on the worker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use log::{debug, warn};
use vhost_user_backend::VringT;
use virtio_queue::{DescriptorChain, QueueT};

use super::{Parked, Taken, PAUSED_POLL};
use crate::device::guest_buffers::chain_buffers;
use crate::device::guest_io::GuestReply;
use crate::device::inflight::InFlight;
use crate::device::memory::Vring;
use crate::device::ring::{notify, Answer, Mem, QueueHealth, RingId, RingRef};
use crate::fs::request::LateReply;
use crate::fs::FsServer;

/// Lock waits served at once off the queue threads; more get ENOLCK.
const MAX_LOCK_WAITERS: usize = 64;
static LOCK_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Lock waits now on threads of their own.
pub fn lock_waiters() -> usize {
    LOCK_WAITERS.load(Ordering::Relaxed)
}

/// Runs a request that may wait on a thread of its own. [`Taken::OnThread`] when the
/// thread took the chain, [`Taken::Answered`] when it was answered here (ENOLCK, from
/// the file system) because too many waits run or no thread could be started. It
/// is never served inline: the worker holds the vring's lock while it serves, and a
/// frontend stopping the ring would wait behind a wait that may never end.
///
/// The thread waits without the vring's lock, then answers as [`answer_when_running`]
/// says.
pub(super) fn wait_off_thread(
    server: &Arc<FsServer>,
    ring: &RingRef,
    parked: &Arc<Parked>,
    ring_id: RingId,
    chain: DescriptorChain<Mem>,
    request: &[u8],
) -> Taken {
    let index = ring.index;
    let refuse = |chain: &DescriptorChain<Mem>| {
        let len = late_reply(chain, LateReply::busy(request));
        Taken::Answered(len)
    };
    if LOCK_WAITERS.fetch_add(1, Ordering::AcqRel) >= MAX_LOCK_WAITERS {
        LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        warn!("queue {index}: more than {MAX_LOCK_WAITERS} lock waits, refusing one with ENOLCK");
        return refuse(&chain);
    }
    let server = server.clone();
    let vring = ring.vring.clone();
    let health = ring.health.clone();
    let inflight = ring.inflight;
    let mut copy = request.to_vec();
    let taken = chain.clone();
    // Known until answered: a device state saved meanwhile carries it.
    let id = parked.lock_wait_started(index, chain.head_index(), request);
    let on_thread = parked.clone();
    let spawned = crate::sandbox::threads::spawn(
        "volfsd-lockwait",
        crate::sandbox::ThreadRole::LockWaiter,
        move || {
            let answer = server.wait(&mut copy);
            let answer = Answered {
                chain: taken,
                reply: answer,
                inflight,
            };
            answer_when_running(&vring, &health, ring_id, answer, index);
            on_thread.lock_wait_done(id);
            LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        },
    );
    if let Err(e) = spawned {
        parked.lock_wait_done(id);
        LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        warn!("queue {index}: cannot start a lock-wait thread ({e}), refusing a wait with ENOLCK");
        return refuse(&chain);
    }
    Taken::OnThread
}

/// Writes a wait's answer and returns its chain to the used ring, under the
/// vring's lock and only while the ring it came from runs. A stopped ring (a paused
/// VM, a migration's switch-over) is looked at again every [`PAUSED_POLL`] until the
/// frontend starts it again on the same rings; a ring set up anew (a new driver)
/// or reset never gets the answer.
/// A wait's answer, with the chain it goes into and its ring's record of requests in
/// flight.
pub(crate) struct Answered {
    pub chain: DescriptorChain<Mem>,
    pub reply: LateReply,
    pub inflight: InFlight,
}

pub(crate) fn answer_when_running(
    vring: &Vring,
    health: &QueueHealth,
    ring: RingId,
    answer: Answered,
    index: usize,
) {
    let Answered {
        chain,
        reply: answer,
        inflight,
    } = answer;
    loop {
        {
            let mut state = vring.get_mut();
            match health.answer_to(&state, ring) {
                Answer::Now => {
                    let len = late_reply(&chain, answer);
                    match state.add_used(chain.head_index(), len) {
                        Ok(()) => {
                            inflight.answered(chain.head_index(), state.get_queue().next_used())
                        }
                        Err(e) => warn!("queue {index}: returning a lock wait: {e}"),
                    }
                    let event_idx = state.get_queue().event_idx_enabled();
                    let _ = notify(&mut state, event_idx, index);
                    return;
                }
                Answer::Never => {
                    debug!("queue {index}: a lock wait's answer dropped: its ring is gone");
                    return;
                }
                Answer::Later => {}
            }
        }
        std::thread::sleep(PAUSED_POLL);
    }
}

/// Writes a late answer into `chain`'s reply buffers; returns its length (0: the
/// buffers cannot take it).
pub(crate) fn late_reply(chain: &DescriptorChain<Mem>, answer: LateReply) -> u32 {
    chain_buffers(chain.memory(), chain)
        .map_or(0, |bufs| answer.write(&mut GuestReply::new(&bufs.writable)))
}
