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

use super::parked::{chain_at, Parked};
use super::throttle::{WaitRoom, WakeTimer, MAX_WAITING_REQUEST};
use super::{GuestMem, GuestMmap, Vring};
use crate::state::format::ParkedRequest;

mod health;
mod later;
#[cfg(test)]
mod tests;

pub use health::{Answer, QueueHealth, QueueStart, RingId};
pub use later::{answer_parked, lock_waiters, release_waiting, Wake};
use later::{reply_len, wait_off_thread};

pub(crate) type Mem = GuestMemoryLoadGuard<GuestMmap>;

/// A queue's vring, locked: taken with `vring.get_mut()` and held while the ring and
/// the buffers of its chains are written.
pub type Locked<'a> = RwLockWriteGuard<'a, VringState<GuestMem>>;

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
    /// Where lock waits in progress are known (a device state carries them).
    pub parked: &'a Arc<Parked>,
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
