//! Serving one virtqueue: pop descriptor chains, run each FUSE request, return it.
//!
//! Everything here is reached by guest-controlled data, so nothing may panic, spin or
//! log without bound:
//! - each request is copied out of guest memory once, in one walk of its chain, and
//!   served from that copy (a WRITE's data aside, see `fs/server.rs`);
//! - a queue whose frontend breaks the ring's rules (an avail index further ahead
//!   than the queue is long, a chain that loops or points outside guest memory) is
//!   stopped with one log line, and stays stopped until the frontend sets it up again.
//!
//! A ring the frontend stopped gets nothing more. vhost-user-backend answers
//! GET_VRING_BASE (a paused VM, a live migration's switch-over) without telling the
//! backend; the frontend then syncs the dirty-page log a last time and takes the
//! returned index as the count of requests answered. A reply written after that is
//! neither copied nor counted, and the guest waits for it for ever. So every write
//! to a ring and its buffers happens under the vring's lock (GET_VRING_BASE takes it
//! too, to mark the queue not ready), after checking that the queue is ready and is
//! still the same ring:
//! - a drain holds the lock from its first pop to its last completion, serving
//!   under it: GET_VRING_BASE waits for the requests popped, and its index counts
//!   them answered. One worker thread serves each queue, so nothing else waits;
//! - the throttled requests ([`release_waiting`]) and the lock waits
//!   ([`wait_off_thread`]), answered later, are answered under the lock too, or kept
//!   until the ring runs again, or dropped if a new driver set it up anew.

use std::cell::RefCell;
use std::io;
use std::num::Wrapping;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLockWriteGuard};
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{InHeader, Opcode};
use fuse_backend_rs::transport::{Reader, VirtioFsWriter};
use log::{debug, warn};
use vhost_user_backend::{VringState, VringT};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{Bytes, GuestAddressSpace, GuestMemory, GuestMemoryLoadGuard};

use crate::fs::reply::reply_error;
use crate::fs::server::{parse_header, LockAnswer, MAX_REQUEST, WRITE_PREFIX};
use crate::fs::{FsServer, RequestError};

use super::throttle::{WaitRoom, WakeTimer, MAX_WAITING_REQUEST};
use super::{GuestMem, GuestMmap, Vring};

pub(crate) type Mem = GuestMemoryLoadGuard<GuestMmap>;

/// A queue's vring, locked: taken with `vring.get_mut()` and held while the ring and
/// the buffers of its chains are written.
pub type Locked<'a> = RwLockWriteGuard<'a, VringState<GuestMem>>;

/// The state a queue keeps across kicks.
#[derive(Default)]
pub struct QueueHealth {
    /// The frontend broke the ring's rules: nothing more is served on this queue
    /// until the frontend sets it up again.
    stopped: AtomicBool,
    /// (descriptor table address, next avail index) when the queue was last drained:
    /// anything else at the next kick means the frontend set the queue up again.
    last_seen: Mutex<Option<(u64, u16)>>,
    /// Bumped when the queue's ring is gone for good (a new driver set it up anew, a
    /// device reset): a chain popped before belongs to no ring any more.
    generation: AtomicU64,
}

fn position(state: &VringState<GuestMem>) -> (u64, u16) {
    let q = state.get_queue();
    (q.desc_table(), q.next_avail())
}

/// The ring a popped chain came from: it may be answered only on that ring.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct RingId {
    /// The descriptor table's guest address.
    pub(crate) table: u64,
    /// [`QueueHealth`]'s generation when the chain was popped.
    pub(crate) generation: u64,
}

/// Whether a chain popped earlier may be answered now.
#[derive(Debug, Eq, PartialEq)]
pub enum Answer {
    /// Its ring runs: answer it now, under the same lock.
    Now,
    /// Its ring is stopped (a paused VM): keep the answer until it runs again.
    Later,
    /// Its ring is gone (a new driver, a device reset): drop the answer.
    Never,
}

/// What the first look at a kicked queue found.
#[derive(Debug, Eq, PartialEq)]
pub enum QueueStart {
    /// Serving as before.
    Same,
    /// The frontend set up the queue again and a new driver starts it from index 0:
    /// a guest reboot or a driver reset.
    NewDriver,
}

impl QueueHealth {
    /// Compares the queue with how it was left, clears a stop if the frontend set it
    /// up again, and tells whether a new driver started it (then the chains popped
    /// from the old ring are answered no more).
    pub fn check_restart(&self, state: &VringState<GuestMem>) -> QueueStart {
        match self.set_up_anew(state) {
            None => QueueStart::Same,
            Some(new_driver) => {
                self.stopped.store(false, Ordering::Release);
                if new_driver {
                    self.ring_gone();
                    QueueStart::NewDriver
                } else {
                    QueueStart::Same
                }
            }
        }
    }

    /// Whether the frontend set the queue up again since the last drain (Some), and
    /// if so whether from index 0, as a new driver does (Some(true)).
    fn set_up_anew(&self, state: &VringState<GuestMem>) -> Option<bool> {
        let now = position(state);
        let last = *self.last_seen.lock().unwrap();
        match last {
            Some(seen) if seen != now => Some(now.1 == 0),
            _ => None,
        }
    }

    /// The queue's ring is gone (a new driver, a device reset): nothing popped from
    /// it is answered any more.
    pub fn ring_gone(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The ring a chain popped now comes from.
    pub fn ring(&self, state: &VringState<GuestMem>) -> RingId {
        RingId {
            table: state.get_queue().desc_table(),
            generation: self.generation.load(Ordering::Acquire),
        }
    }

    /// Whether a chain popped from `ring` may be answered now. Called under the
    /// vring's lock, which the answer then keeps until it is in the used ring: the
    /// frontend cannot stop the ring in between.
    pub fn answer_to(&self, state: &VringState<GuestMem>, ring: RingId) -> Answer {
        let q = state.get_queue();
        if self.generation.load(Ordering::Acquire) != ring.generation
            || q.desc_table() != ring.table
            || self.is_stopped()
        {
            return Answer::Never;
        }
        if !q.ready() || !state.is_enabled() {
            // GET_VRING_BASE or SET_VRING_ENABLE 0: a paused VM, or the switch-over
            // of a live migration (then the daemon exits before it runs again).
            return Answer::Later;
        }
        if self.set_up_anew(state) == Some(true) {
            // A new driver on the same addresses, not kicked yet (the kick would
            // bump the generation): not the ring the chain came from.
            return Answer::Never;
        }
        Answer::Now
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Forgets the rings (a new frontend sets up its own).
    pub fn reset(&self) {
        self.stopped.store(false, Ordering::Release);
        *self.last_seen.lock().unwrap() = None;
    }

    /// Remembers where the queue stands after a drain. The drain held the vring's
    /// lock since `check_restart`, so the frontend cannot have set the queue up anew
    /// meanwhile (it could before the lock was held across the drain: then a rebooted
    /// guest's first request was served in the old session, a CI flake in
    /// a_queue_restarted_by_a_new_driver_ends_the_session).
    fn remember(&self, state: &VringState<GuestMem>) {
        *self.last_seen.lock().unwrap() = Some(position(state));
    }

    /// Stops the queue where its ring broke (the avail index, the rings' memory).
    /// The position is remembered too: a drain can serve requests and then meet the
    /// broken ring in its re-check, and the kick that follows must not read that as a
    /// new setup (it did, and the queue was stopped and logged twice).
    fn stop(&self, state: &VringState<GuestMem>, index: usize, why: &str) {
        self.remember(state);
        self.stop_after_chain(index, why);
    }

    /// Stops the queue after a broken chain (its descriptors or buffers). The chain
    /// was popped, so the ring has moved on from the last position remembered: the
    /// next kick serves again, and the broken chain costs the guest that request only.
    fn stop_after_chain(&self, index: usize, why: &str) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            warn!(
                "queue {index}: stopped: {why}; it serves again once the frontend sets it up anew"
            );
        }
    }
}

/// One queue's counters, read by the control API.
#[derive(Debug, Default)]
pub struct QueueCounters {
    /// Requests served.
    pub served: AtomicU64,
    /// Requests its worker is serving now, 0 or 1: a queue has one worker thread (a
    /// lock wait handed to a thread of its own is not one: [`lock_waiters`]).
    pub in_flight: AtomicU64,
}

/// A ring rule the frontend broke.
struct Broken(String);

/// One queue as its worker serves it.
pub struct QueueRef<'a> {
    pub vring: &'a Vring,
    /// The queue's index on the device (0: hiprio).
    pub index: usize,
    pub event_idx: bool,
    pub counters: &'a QueueCounters,
    /// Where its throttled requests wait (None: never throttled, the hiprio queue).
    pub room: Option<&'a Mutex<WaitRoom>>,
    /// The worker's wake timer, armed for the next waiting request.
    pub timer: Option<&'a WakeTimer>,
    /// The queue's health, shared with the lock waits it hands to threads of their
    /// own.
    pub health: &'a Arc<QueueHealth>,
}

/// Drains the queue, re-checking after notifications are re-enabled (EVENT_IDX) so that
/// a request published in between is not missed; then serves the waiting requests
/// whose turn came. `state` is the queue's vring, locked by the caller (who looked
/// at it with [`QueueHealth::check_restart`] under the same lock).
pub fn process(
    server: &Arc<FsServer>,
    mem: &GuestMem,
    queue: &QueueRef,
    state: &mut Locked,
) -> io::Result<()> {
    let (health, index) = (queue.health, queue.index);
    if health.is_stopped() {
        return Ok(());
    }
    // Stopped by the frontend (GET_VRING_BASE, SET_VRING_ENABLE 0) before the lock
    // was ours: nothing is popped from it. virtio-queue would pop nothing either, and
    // the pending chains would read as a broken ring.
    if !state.get_queue().ready() || !state.is_enabled() {
        return Ok(());
    }
    let mem = mem.memory();
    if let Err(Broken(why)) = check_layout(state) {
        health.stop(state, index, &why);
        return Ok(());
    }
    match drain(server, &mem, queue, state) {
        Ok(()) => {
            health.remember(state);
            release_waiting(server, queue, state, Wake::Drain)
        }
        Err(DrainError::BrokenRing(Broken(why))) => {
            health.stop(state, index, &why);
            Ok(())
        }
        Err(DrainError::Broken(Broken(why))) => {
            health.stop_after_chain(index, &why);
            Ok(())
        }
        Err(DrainError::Io(e)) => Err(e),
    }
}

enum DrainError {
    /// The ring itself (its avail index, its memory): nothing more can be popped.
    BrokenRing(Broken),
    /// One popped chain (its descriptors, its buffers).
    Broken(Broken),
    Io(io::Error),
}

impl From<io::Error> for DrainError {
    fn from(e: io::Error) -> Self {
        DrainError::Io(e)
    }
}

/// Completions put in the used ring and not yet signalled to the guest.
///
/// One interrupt per batch, not per request: each eventfd write wakes the frontend's
/// thread, and on a loaded host that context switch is the largest cost of a small
/// request. The batch is bounded in requests and in bytes, so large reads are not
/// held back behind each other.
struct Completions {
    index: usize,
    event_idx: bool,
    unsignalled: usize,
    bytes: usize,
}

impl Completions {
    fn new(queue: &QueueRef) -> Self {
        Completions {
            index: queue.index,
            event_idx: queue.event_idx,
            unsignalled: 0,
            bytes: 0,
        }
    }

    fn add(&mut self, state: &mut Locked, head: u16, len: u32) -> io::Result<()> {
        state.add_used(head, len).map_err(queue_err(self.index))?;
        self.unsignalled += 1;
        self.bytes += len as usize;
        if self.unsignalled == SIGNAL_BATCH || self.bytes >= SIGNAL_BATCH_BYTES {
            self.flush(state)?;
        }
        Ok(())
    }

    fn flush(&mut self, state: &mut Locked) -> io::Result<()> {
        if self.unsignalled > 0 {
            notify(state, self.event_idx, self.index)?;
            self.unsignalled = 0;
            self.bytes = 0;
        }
        Ok(())
    }
}

/// Pops and serves until the ring is empty, under the vring's lock (`state`): the
/// frontend can neither stop nor set up the ring anew meanwhile.
fn drain(
    server: &Arc<FsServer>,
    mem: &Mem,
    queue: &QueueRef,
    state: &mut Locked,
) -> Result<(), DrainError> {
    let (index, event_idx) = (queue.index, queue.event_idx);
    let counters = queue.counters;
    let ring = queue.health.ring(state);
    crate::metrics::start_batch();
    loop {
        if event_idx {
            state.disable_notification().map_err(queue_err(index))?;
        }
        let mut done = Completions::new(queue);
        loop {
            let Some(chain) = pop_checked(mem, state).map_err(DrainError::BrokenRing)? else {
                break;
            };
            let head = chain.head_index();
            // One worker per queue: plain stores, no read-modify-write.
            counters.in_flight.store(1, Ordering::Relaxed);
            let outcome = REQUEST.with(|buf| {
                let mut buf = buf.borrow_mut();
                let outcome = admit_and_serve(server, queue, ring, chain, &mut buf);
                // A large request (a SETXATTR value, a batch of forgets) must not
                // keep its buffer in every worker for good.
                if buf.capacity() > KEPT_REQUEST_CAPACITY {
                    buf.clear();
                    buf.shrink_to(KEPT_REQUEST_CAPACITY);
                }
                outcome
            });
            counters.in_flight.store(0, Ordering::Relaxed);
            match outcome? {
                Outcome::Reply(len) => {
                    counters.served.fetch_add(1, Ordering::Relaxed);
                    done.add(state, head, len)?;
                }
                // Handed to a lock-wait thread, which returns it itself.
                Outcome::HandedOver => {
                    counters.served.fetch_add(1, Ordering::Relaxed);
                }
                // Out of the ring, in its volume's line: served when its turn comes.
                Outcome::Waiting => {}
            }
        }
        done.flush(state)?;
        if !event_idx || !state.enable_notification().map_err(queue_err(index))? {
            return Ok(());
        }
    }
}

/// The three parts of a split ring must not overlap: a used ring laid over the avail
/// ring would have every completion rewrite the avail index, and the worker would
/// find one more request pending for ever (found by the `virtqueue` fuzz target).
fn check_layout(state: &VringState<GuestMem>) -> Result<(), Broken> {
    let q = state.get_queue();
    let size = u64::from(q.size());
    // Descriptor table, avail ring (flags, idx, ring, used_event), used ring (flags,
    // idx, ring of 8-byte elements, avail_event).
    let parts = [
        ("descriptor table", q.desc_table(), 16 * size),
        ("avail ring", q.avail_ring(), 6 + 2 * size),
        ("used ring", q.used_ring(), 6 + 8 * size),
    ];
    for (i, (a, a_start, a_len)) in parts.iter().enumerate() {
        let a_end = a_start.checked_add(*a_len).ok_or_else(|| {
            Broken(format!(
                "the {a} at {a_start:#x} runs past the address space"
            ))
        })?;
        for (b, b_start, b_len) in &parts[i + 1..] {
            let b_end = b_start.saturating_add(*b_len);
            if *a_start < b_end && *b_start < a_end {
                return Err(Broken(format!(
                    "the {a} at {a_start:#x} overlaps the {b} at {b_start:#x}"
                )));
            }
        }
    }
    Ok(())
}

/// Pops the next chain after checking the avail index: one further ahead than the
/// queue is long is a broken frontend (virtio-queue would log and return nothing,
/// and with EVENT_IDX the worker would spin on it).
fn pop_checked(mem: &Mem, state: &mut Locked) -> Result<Option<DescriptorChain<Mem>>, Broken> {
    let q = state.get_queue_mut();
    let next = Wrapping(q.next_avail());
    let avail = q
        .avail_idx(&**mem, std::sync::atomic::Ordering::Acquire)
        .map_err(|e| Broken(format!("unreadable avail ring: {e}")))?;
    let pending = (avail - next).0;
    if pending > q.size() {
        return Err(Broken(format!(
            "avail index {} is {pending} entries ahead of {} on a queue of {}",
            avail.0,
            next.0,
            q.size()
        )));
    }
    if pending == 0 {
        return Ok(None);
    }
    match q.pop_descriptor_chain(mem.clone()) {
        Some(chain) => Ok(Some(chain)),
        // A chain is pending but virtio-queue will not pop it: the queue is not
        // valid (its rings are not all in guest memory). With EVENT_IDX the worker
        // would find it pending again for ever (found by the `virtqueue` target).
        None => Err(Broken(format!(
            "{pending} chains pending but the queue cannot be read (rings outside guest memory?)"
        ))),
    }
}

thread_local! {
    /// The local copy of the request being served, one per worker thread.
    static REQUEST: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(4096));
}

/// Request buffer capacity a worker keeps between requests.
const KEPT_REQUEST_CAPACITY: usize = 64 * 1024;

/// Copies the readable part of `chain` into `buf` in one walk: the whole request,
/// or for a WRITE only its header and WriteIn (the data is read in place later).
/// A chain whose walk ends on a descriptor that still names a next one (a loop, an
/// index past the table, memory the guest does not have) is broken.
fn copy_request<M>(chain: &DescriptorChain<M>, buf: &mut Vec<u8>) -> Result<(), Broken>
where
    M: std::ops::Deref + Clone,
    M::Target: GuestMemory,
{
    let mem = chain.memory();
    buf.clear();
    let mut limit = MAX_REQUEST;
    let mut last_has_next = false;
    for desc in chain.clone() {
        last_has_next = desc.has_next();
        if desc.is_write_only() || buf.len() >= limit {
            continue;
        }
        let start = buf.len();
        let n = (desc.len() as usize).min(limit - start);
        buf.resize(start + n, 0);
        mem.read_slice(&mut buf[start..], desc.addr())
            .map_err(|e| Broken(format!("descriptor at {:#x}: {e}", desc.addr().0)))?;
        if start < HEADER && buf.len() >= HEADER && parse_header(buf).is_some_and(is_write) {
            limit = WRITE_PREFIX;
            buf.truncate(limit.min(buf.len()));
        }
    }
    if last_has_next {
        return Err(Broken(
            "a descriptor chain loops or leaves the descriptor table".into(),
        ));
    }
    Ok(())
}

const HEADER: usize = std::mem::size_of::<InHeader>();

fn is_write(h: InHeader) -> bool {
    h.opcode == Opcode::Write as u32
}

/// What became of a popped request.
enum Outcome {
    /// Served: its reply length, for the used ring.
    Reply(u32),
    /// A lock-wait thread took it over and returns it itself.
    HandedOver,
    /// Throttled: it waits in its volume's line.
    Waiting,
}

/// Copies the request out of guest memory, and either serves it or, when its volume
/// is over its limit (or has requests waiting already), puts it in the volume's line.
fn admit_and_serve(
    server: &Arc<FsServer>,
    queue: &QueueRef,
    ring: RingId,
    chain: DescriptorChain<Mem>,
    buf: &mut Vec<u8>,
) -> Result<Outcome, DrainError> {
    copy_request(&chain, buf).map_err(DrainError::Broken)?;
    if let Some(room) = queue.room {
        // No limit anywhere (the usual case): not even the volume is looked up.
        if crate::qos::any_limited() {
            if let Some((share, cost)) = server.limited_volume(buf) {
                // The clock read that ended the previous request, if metrics made
                // one: a clock read costs ~65 ns under a TSC-trapping hypervisor.
                let now = crate::metrics::recent_clock();
                let mut room = room.lock().unwrap();
                let waits = room.has_line(&share) || share.stats.qos.admit(cost, now).is_err();
                if waits {
                    if buf.len() <= MAX_WAITING_REQUEST {
                        room.push(&share, ring, chain, buf, cost, now);
                        return Ok(Outcome::Waiting);
                    }
                    // Too large to keep a copy of: served now, and paid for by the
                    // requests after it.
                    share.stats.qos.charge(cost);
                }
            }
        }
    }
    serve_copied(server, queue, ring, chain, buf)
}

/// Runs one request whose local copy is `buf`, popped from `ring`.
fn serve_copied(
    server: &Arc<FsServer>,
    queue: &QueueRef,
    ring: RingId,
    chain: DescriptorChain<Mem>,
    buf: &mut [u8],
) -> Result<Outcome, DrainError> {
    let (index, mem) = (queue.index, chain.memory());
    let Some(header) = parse_header(buf) else {
        debug!("queue {index}: request shorter than a FUSE header");
        return Ok(Outcome::Reply(0));
    };
    if header.opcode == Opcode::Setlkw as u32 {
        return Ok(
            match wait_off_thread(server, queue, ring, &header, chain, buf) {
                Some(len) => Outcome::Reply(len),
                None => Outcome::HandedOver,
            },
        );
    }
    let writer = match VirtioFsWriter::new(mem, chain.clone()) {
        Ok(w) => w,
        Err(e) => return Err(DrainError::Broken(Broken(format!("reply buffers: {e}")))),
    };
    let write_data = if is_write(header) {
        match Reader::from_descriptor_chain(mem, chain.clone()) {
            // An error here leaves None: the WRITE then fails its size check.
            Ok(mut r) => r.split_at(WRITE_PREFIX).ok(),
            Err(e) => return Err(DrainError::Broken(Broken(format!("write data: {e}")))),
        }
    } else {
        None
    };
    let result = server.handle_request(buf, write_data, writer.into());
    Ok(Outcome::Reply(reply_len(result, mem, chain.clone(), index)))
}

/// How often a stopped queue's waiting requests are looked at again.
const PAUSED_POLL: std::time::Duration = std::time::Duration::from_millis(50);

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
        let head = waiting.chain.head_index();
        queue.counters.in_flight.store(1, Ordering::Relaxed);
        let outcome = serve_copied(server, queue, ring, waiting.chain, &mut waiting.request);
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
            Err(DrainError::Io(e)) => result = Err(e),
        }
    }
    done.flush(state)?;
    result
}

/// The reply length of a served request: a request that failed without a reply but
/// whose header was readable is owed one, so it is answered EINVAL.
fn reply_len(
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
const MAX_LOCK_WAITERS: usize = 64;
static LOCK_WAITERS: AtomicUsize = AtomicUsize::new(0);

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
fn wait_off_thread(
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
    let waiting = *header;
    let mut request = request.to_vec();
    let taken = chain.clone();
    let spawned = std::thread::Builder::new()
        .name("volfsd-lockwait".to_string())
        .spawn(move || {
            crate::sandbox::confine_thread_or_exit(crate::sandbox::ThreadRole::LockWaiter);
            let answer = server.wait_for_lock(&waiting, &mut request);
            answer_lock_wait(&vring, &health, ring, taken, answer, index);
            LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
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
fn answer_lock_wait(
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

/// Completions returned before the guest is interrupted while more are pending.
const SIGNAL_BATCH: usize = 8;
/// Reply bytes returned before the guest is interrupted while more are pending.
const SIGNAL_BATCH_BYTES: usize = 256 * 1024;

fn notify(state: &mut Locked, event_idx: bool, index: usize) -> io::Result<()> {
    if !event_idx || state.needs_notification().map_err(queue_err(index))? {
        state.signal_used_queue()?;
    }
    Ok(())
}

fn queue_err(index: usize) -> impl Fn(virtio_queue::Error) -> io::Error {
    move |e| io::Error::other(format!("queue {index}: {e}"))
}

/// FORGET, BATCH_FORGET and INTERRUPT get no reply.
fn expects_reply(opcode: u32) -> bool {
    opcode != Opcode::Forget as u32
        && opcode != Opcode::BatchForget as u32
        && opcode != Opcode::Interrupt as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_backend_rs::abi::fuse_abi::WriteIn;
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{ByteValued, GuestAddress, GuestMemoryAtomic};

    const NEXT: u16 = 1;
    const WRITE: u16 = 2;

    fn memory() -> GuestMmap {
        GuestMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap()
    }

    fn header(opcode: Opcode, len: usize) -> Vec<u8> {
        InHeader {
            len: len as u32,
            opcode: opcode as u32,
            unique: 7,
            nodeid: 1,
            ..Default::default()
        }
        .as_slice()
        .to_vec()
    }

    fn desc(addr: u64, len: usize, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(Descriptor::new(addr, len as u32, flags, next))
    }

    #[test]
    fn a_request_is_copied_whole_in_one_walk_and_a_write_only_to_its_args() {
        let mem = memory();
        let q = MockSplitQueue::new(&mem, 16);
        // A GETXATTR split over two readable descriptors, then a reply buffer.
        let mut req = header(Opcode::Getxattr, 40 + 8 + 6);
        req.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        req.extend_from_slice(b"user.a");
        mem.write_slice(&req[..30], GuestAddress(0x10_0000))
            .unwrap();
        mem.write_slice(&req[30..], GuestAddress(0x20_0000))
            .unwrap();
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, 30, 0, 0),
                desc(0x20_0000, req.len() - 30, 0, 0),
                desc(0x30_0000, 4096, WRITE, 0),
            ])
            .unwrap();
        let mut buf = Vec::new();
        assert!(copy_request(&chain, &mut buf).is_ok());
        assert_eq!(buf, req);
        // Guest memory rewritten after the copy changes nothing the server reads.
        mem.write_slice(&[0xff; 30], GuestAddress(0x10_0000))
            .unwrap();
        assert_eq!(parse_header(&buf).unwrap().opcode, Opcode::Getxattr as u32);

        // A WRITE keeps only its header and WriteIn locally; the data stays behind.
        let mut w = header(Opcode::Write, 80 + 4096);
        w.extend_from_slice(
            WriteIn {
                size: 4096,
                ..Default::default()
            }
            .as_slice(),
        );
        mem.write_slice(&w, GuestAddress(0x10_0000)).unwrap();
        let q = MockSplitQueue::new(&mem, 16);
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, 80, 0, 0),
                desc(0x20_0000, 4096, 0, 0),
                desc(0x30_0000, 64, WRITE, 0),
            ])
            .unwrap();
        assert!(copy_request(&chain, &mut buf).is_ok());
        assert_eq!(buf.len(), WRITE_PREFIX);
        assert_eq!(buf, w);
    }

    /// A 256-entry vring with its descriptors at 0, avail ring at 4 KiB, used at 8 KiB.
    fn vring() -> Vring {
        let vring = Vring::new(GuestMemoryAtomic::new(memory()), 256).unwrap();
        vring.set_queue_size(256);
        vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
        vring
    }

    #[test]
    fn overlapping_rings_are_broken() {
        // Descriptors at 0 (4 KiB), avail ring after them, used ring apart: fine.
        let vring = vring();
        assert!(check_layout(&vring.get_ref()).is_ok());
        // The used ring laid over the avail ring: broken.
        vring.set_queue_info(0, 0x1000, 0x1000).unwrap();
        assert!(check_layout(&vring.get_ref()).is_err());
        vring.set_queue_info(0, 0x800, 0x3000).unwrap();
        assert!(
            check_layout(&vring.get_ref()).is_err(),
            "avail ring inside the table"
        );
    }

    #[test]
    fn a_queue_stopped_after_serving_stays_stopped_until_set_up_anew() {
        let vring = vring();
        let health = QueueHealth::default();
        vring.set_queue_next_avail(1);
        health.remember(&vring.get_ref());
        // A drain serves one more request, then finds the ring broken.
        vring.set_queue_next_avail(2);
        health.stop(&vring.get_ref(), 1, "test");
        assert_eq!(health.check_restart(&vring.get_ref()), QueueStart::Same);
        assert!(health.is_stopped(), "the next kick keeps it stopped");
        // The frontend sets the queue up again: it serves again.
        vring.set_queue_info(0x4000, 0x5000, 0x6000).unwrap();
        vring.set_queue_next_avail(0);
        assert_eq!(
            health.check_restart(&vring.get_ref()),
            QueueStart::NewDriver
        );
        assert!(!health.is_stopped());
    }

    #[test]
    fn a_chain_is_answered_only_while_its_own_ring_runs() {
        let vring = vring();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        vring.set_queue_next_avail(5);
        let health = QueueHealth::default();
        // A drain popped a chain from the ring at 0 and remembered where it ended.
        health.remember(&vring.get_ref());
        let ring = health.ring(&vring.get_ref());
        let answer = || health.answer_to(&vring.get_ref(), ring);
        assert_eq!(answer(), Answer::Now);
        // Stopped by GET_VRING_BASE (or disabled): kept for later.
        vring.set_queue_ready(false);
        assert_eq!(answer(), Answer::Later);
        vring.set_queue_ready(true);
        vring.set_enabled(false);
        assert_eq!(answer(), Answer::Later);
        // Started again on the same rings where it stopped: answered.
        vring.set_enabled(true);
        assert_eq!(answer(), Answer::Now);
        // A new driver on the same addresses from index 0, before its first kick:
        // not the chain's ring.
        vring.set_queue_next_avail(0);
        assert_eq!(answer(), Answer::Never);
        // Its first kick sees the new driver; the old ring's chains stay unanswered
        // even once the new ring has moved on.
        assert_eq!(
            health.check_restart(&vring.get_ref()),
            QueueStart::NewDriver
        );
        health.remember(&vring.get_ref());
        vring.set_queue_next_avail(5);
        health.remember(&vring.get_ref());
        assert_eq!(answer(), Answer::Never);
        // A chain of the new ring is answered there, but not once the ring is set
        // up on other addresses, nor after a device reset.
        let ring = health.ring(&vring.get_ref());
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Now);
        vring.set_queue_info(0x4000, 0x5000, 0x6000).unwrap();
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Never);
        vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Now);
        health.ring_gone();
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Never);
    }

    #[test]
    fn a_looping_chain_is_broken() {
        let mem = memory();
        mem.write_slice(&header(Opcode::Getattr, 56), GuestAddress(0x10_0000))
            .unwrap();
        let q = MockSplitQueue::new(&mem, 16);
        // Descriptors 0 and 1 point at each other.
        let chain = q
            .build_multiple_desc_chains(&[
                desc(0x10_0000, 40, NEXT, 1),
                desc(0x10_0000, 40, NEXT, 0),
            ])
            .unwrap();
        let mut buf = Vec::new();
        assert!(copy_request(&chain, &mut buf).is_err());
    }
}
