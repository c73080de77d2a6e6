//! Requests answered later, on the ring they came from: throttled lines, lock
//! waits on threads of their own, and a loaded state's parked requests.

use super::*;

/// Answers requests a loaded device state handed over (`parked.rs`) on the ring
/// `state`, which runs: each from its chain, found again by its head in the
/// migrated guest memory, as a drain would serve it (a lock wait goes to a thread of
/// its own). A throttled one is not held again: it waited at the source.
pub fn answer_parked(
    server: &Arc<FsServer>,
    mem: &GuestMem,
    queue: &QueueRef,
    state: &mut Locked,
    requests: Vec<ParkedRequest>,
) -> io::Result<()> {
    let ring = queue.health.ring(state);
    let mut done = Completions::new(queue);
    crate::metrics::start_batch();
    for p in requests {
        let Some(chain) = chain_at(mem, state, p.head) else {
            warn!(
                "queue {}: an unanswered request of the loaded state names descriptor {}, \
                 which is no chain of this ring: dropped",
                queue.index, p.head
            );
            continue;
        };
        let mut request = p.request;
        if let Some(e) = serve_late(server, queue, ring, state, &mut done, chain, &mut request)? {
            return Err(e);
        }
    }
    done.flush(state)
}

/// Serves one request answered late (throttled, or handed over by a loaded state)
/// and queues its completion. Err: the ring could not be written; Ok(Some): the
/// request's own I/O error, for the caller to report.
fn serve_late(
    server: &Arc<FsServer>,
    queue: &QueueRef,
    ring: RingId,
    state: &mut Locked,
    done: &mut Completions,
    chain: DescriptorChain<Mem>,
    request: &mut [u8],
) -> io::Result<Option<io::Error>> {
    let head = chain.head_index();
    queue.counters.in_flight.store(1, Ordering::Relaxed);
    let outcome = serve_copied(server, queue, ring, chain, request);
    queue.counters.in_flight.store(0, Ordering::Relaxed);
    match outcome {
        Ok(Outcome::Reply(len)) => {
            queue.counters.served.fetch_add(1, Ordering::Relaxed);
            done.add(state, head, len)?;
        }
        Ok(_) => {
            queue.counters.served.fetch_add(1, Ordering::Relaxed);
        }
        Err(DrainError::Broken(Broken(why)) | DrainError::BrokenRing(Broken(why))) => {
            queue.health.stop_after_chain(queue.index, &why);
        }
        Err(DrainError::Io(e)) => return Ok(Some(e)),
    }
    Ok(None)
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
    queue: &QueueRef,
    state: &mut Locked,
    why: Wake,
) -> io::Result<()> {
    let (Some(room), Some(timer)) = (queue.room, queue.timer) else {
        return Ok(());
    };
    let mut ready = Vec::new();
    let ring = {
        let mut room = room.lock().unwrap();
        if why == Wake::Timer {
            room.timer_fired();
        } else if !room.needs_look() {
            return Ok(());
        }
        let Some(ring) = room.ring().filter(|_| !room.is_empty()) else {
            return Ok(());
        };
        let now = Instant::now();
        match queue.health.answer_to(state, ring) {
            Answer::Never => {
                let n = room.clear();
                debug!(
                    "queue {}: {n} throttled requests dropped: their ring is gone",
                    queue.index
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
        ring
    };
    crate::metrics::start_batch();
    let mut done = Completions::new(queue);
    let mut result = Ok(());
    for mut waiting in ready {
        let chain = waiting.chain;
        if let Some(e) = serve_late(
            server,
            queue,
            ring,
            state,
            &mut done,
            chain,
            &mut waiting.request,
        )? {
            result = Err(e);
        }
    }
    done.flush(state)?;
    result
}

/// The reply length of a served request: a request that failed without a reply but
/// whose header was readable is owed one, so it is answered EINVAL.
pub(super) fn reply_len(
    result: Result<usize, RequestError>,
    mem: &GuestMmap,
    chain: DescriptorChain<Mem>,
    index: usize,
) -> u32 {
    match result {
        Ok(n) => n as u32,
        Err(RequestError::NoHeader) => 0,
        Err(RequestError::Failed {
            opcode,
            unique,
            why,
        }) => {
            debug!("queue {index}: opcode {opcode} unique {unique}: {why}");
            if !expects_reply(opcode) {
                return 0;
            }
            // A completion with no bytes would read as a zeroed header, i.e.
            // success. Rewrite the reply from the start of the chain as EINVAL.
            match VirtioFsWriter::new(mem, chain) {
                Ok(w) => reply_error(&mut w.into(), unique, libc::EINVAL)
                    .map(|n| n as u32)
                    .unwrap_or(0),
                Err(_) => 0,
            }
        }
    }
}

/// Lock waits served at once off the queue threads; more get ENOLCK.
pub(super) const MAX_LOCK_WAITERS: usize = 64;
pub(super) static LOCK_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Lock waits now on threads of their own.
pub fn lock_waiters() -> usize {
    LOCK_WAITERS.load(Ordering::Relaxed)
}

/// Runs a FUSE_SETLKW on a thread of its own: it may block until another guest
/// process (or another sandbox) unlocks, and the unlock must not queue behind it.
/// Returns None when the thread took the chain, Some(len) when it was answered here:
/// ENOLCK when too many waits run, or when no thread could be started. It is never
/// served inline: the worker holds the vring's lock while it serves, and a frontend
/// stopping the ring would wait behind a wait that may never end.
///
/// The thread waits without the vring's lock, then answers as [`answer_lock_wait`]
/// says.
pub(super) fn wait_off_thread(
    server: &Arc<FsServer>,
    queue: &QueueRef,
    ring: RingId,
    header: &InHeader,
    chain: DescriptorChain<Mem>,
    request: &[u8],
) -> Option<u32> {
    let index = queue.index;
    let refuse = |chain: &DescriptorChain<Mem>| {
        let len = VirtioFsWriter::new(chain.memory(), chain.clone())
            .ok()
            .and_then(|w| reply_error(&mut w.into(), header.unique, libc::ENOLCK).ok())
            .unwrap_or(0);
        Some(len as u32)
    };
    if LOCK_WAITERS.fetch_add(1, Ordering::AcqRel) >= MAX_LOCK_WAITERS {
        LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        warn!("queue {index}: more than {MAX_LOCK_WAITERS} lock waits, refusing one with ENOLCK");
        return refuse(&chain);
    }
    let server = server.clone();
    let vring = queue.vring.clone();
    let health = queue.health.clone();
    let parked = queue.parked.clone();
    let waiting = *header;
    let mut request = request.to_vec();
    let taken = chain.clone();
    // Known until answered: a device state saved meanwhile carries it.
    let id = parked.lock_wait_started(index, chain.head_index(), &request);
    let on_thread = parked.clone();
    let spawned = std::thread::Builder::new()
        .name("volfsd-lockwait".to_string())
        .spawn(move || {
            crate::sandbox::confine_thread_or_exit(crate::sandbox::ThreadRole::LockWaiter);
            let answer = server.wait_for_lock(&waiting, &mut request);
            answer_lock_wait(&vring, &health, ring, taken, answer, index);
            on_thread.lock_wait_done(id);
            LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        parked.lock_wait_done(id);
        LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        warn!("queue {index}: cannot start a lock-wait thread ({e}), refusing a wait with ENOLCK");
        return refuse(&chain);
    }
    None
}

/// Writes a lock wait's answer and returns its chain to the used ring, under the
/// vring's lock and only while the ring it came from runs. A stopped ring (a paused
/// VM, a migration's switch-over) is looked at again every [`PAUSED_POLL`] until the
/// frontend starts it again on the same rings; a ring set up anew (a new driver)
/// or reset never gets the answer.
pub(super) fn answer_lock_wait(
    vring: &Vring,
    health: &QueueHealth,
    ring: RingId,
    chain: DescriptorChain<Mem>,
    answer: LockAnswer,
    index: usize,
) {
    loop {
        {
            let mut state = vring.get_mut();
            match health.answer_to(&state, ring) {
                Answer::Now => {
                    let len = VirtioFsWriter::new(chain.memory(), chain.clone())
                        .ok()
                        .and_then(|w| answer.write(&mut w.into()).ok())
                        .unwrap_or(0);
                    if let Err(e) = state.add_used(chain.head_index(), len as u32) {
                        warn!("queue {index}: returning a lock wait: {e}");
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
