//! Serving one virtqueue: pop descriptor chains, run each FUSE request, return it.
//!
//! Everything here is reached by guest-controlled data, so nothing may panic, spin or
//! log without bound:
//! - each request is copied out of guest memory once, in one walk of its chain, and
//!   served from that copy (a WRITE's data aside, see `request.rs`);
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
//! - the requests answered later (throttled lines, lock waits: `later/`) are
//!   answered under the lock too, or kept until the ring runs again, or dropped if a
//!   new driver set it up anew.
//!
//! What a request is, and its reply, are the file system's (`fs/request.rs`): this
//! file knows rings.

use std::io;
use std::num::Wrapping;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vhost_user_backend::VringState;
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::GuestAddressSpace;

use super::guest_buffers::Broken;
use super::guest_buffers::{read_chain, DescTable};
use super::later::{complete, release_waiting, Later, Taken, Wake};
use super::memory::GuestMem;
use super::memory::Locked;
use super::request::with_buffer;
use super::ring::{queue_err, Completions, Mem, RingRef};
use super::split_ring::SplitRing;
use crate::fs::FsServer;

/// One queue as its worker serves it: its ring, and what waits beside it.
pub struct QueueRef<'a> {
    pub ring: RingRef<'a>,
    pub later: Later<'a>,
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
    let (health, index) = (queue.ring.health, queue.ring.index);
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
            release_waiting(server, &queue.ring, &queue.later, state, Wake::Drain)
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

/// Why a drain ended early.
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

/// Pops and serves until the ring is empty, under the vring's lock (`state`): the
/// frontend can neither stop nor set up the ring anew meanwhile.
fn drain(
    server: &Arc<FsServer>,
    mem: &Mem,
    queue: &QueueRef,
    state: &mut Locked,
) -> Result<(), DrainError> {
    let ring = &queue.ring;
    let (index, event_idx) = (ring.index, ring.event_idx);
    let counters = ring.counters;
    let ring_id = ring.health.ring(state);
    // Polling needs the guest's notifications off while the worker watches: with
    // EVENT_IDX they are. Its clock read is the first request's too.
    let can_poll = event_idx && ring.poller.is_on();
    let mut polling = if can_poll {
        let now = std::time::Instant::now();
        crate::metrics::start_batch_at(now);
        ring.poller.keeps_coming(now)
    } else {
        crate::metrics::start_batch();
        false
    };
    // The descriptor table, mapped once: the frontend cannot move it while the
    // vring's lock is held.
    let table = {
        let q = state.get_queue();
        DescTable::new(mem, q.desc_table(), q.size())
    };
    let split = SplitRing::map(mem, state);
    // Requests served by this drain: a second one means requests keep coming.
    let mut served = 0u32;
    loop {
        if event_idx {
            state.disable_notification().map_err(queue_err(index))?;
        }
        let mut done = Completions::on(ring, split.as_ref());
        loop {
            let Some(chain) =
                pop_checked(mem, state, split.as_ref()).map_err(DrainError::BrokenRing)?
            else {
                break;
            };
            let head = chain.head_index();
            served = served.saturating_add(1);
            ring.inflight.taken(ring_id.table, head);
            // One worker per queue: plain stores, no read-modify-write.
            counters.in_flight.store(1, Ordering::Relaxed);
            let taken = with_buffer(|buf| -> Result<Taken, Broken> {
                let bufs = read_chain(mem, table.chain(head), buf)?;
                queue.later.take(server, ring, ring_id, chain, buf, bufs)
            });
            counters.in_flight.store(0, Ordering::Relaxed);
            complete(
                ring,
                state,
                &mut done,
                head,
                taken.map_err(DrainError::Broken)?,
            )?;
        }
        done.flush(state)?;
        ring.poller.ran_dry(crate::metrics::latest_clock());
        // A second request in this drain, in the same pass or found by the re-check
        // below after notifications were re-enabled: requests keep coming.
        polling |= can_poll && served > 1;
        if polling
            && ring
                .poller
                .watch(|| has_pending(mem, state, split.as_ref()))?
        {
            continue;
        }
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

/// Whether the driver has published a chain not popped yet (the poll's watch).
fn has_pending(mem: &Mem, state: &Locked, split: Option<&SplitRing>) -> Result<bool, DrainError> {
    let avail = avail_idx(mem, state, split).map_err(DrainError::BrokenRing)?;
    Ok(avail != Wrapping(state.get_queue().next_avail()))
}

/// The driver's avail index, through the drain's mapped rings when there are.
fn avail_idx(
    mem: &Mem,
    state: &Locked,
    split: Option<&SplitRing>,
) -> Result<Wrapping<u16>, Broken> {
    match split.and_then(|s| s.avail_idx()) {
        Some(idx) => Ok(idx),
        None => state
            .get_queue()
            .avail_idx(&**mem, std::sync::atomic::Ordering::Acquire)
            .map_err(|e| Broken(format!("unreadable avail ring: {e}"))),
    }
}

/// Pops the next chain after checking the avail index: one further ahead than the
/// queue is long is a broken frontend (virtio-queue would log and return nothing,
/// and with EVENT_IDX the worker would spin on it).
fn pop_checked(
    mem: &Mem,
    state: &mut Locked,
    split: Option<&SplitRing>,
) -> Result<Option<DescriptorChain<Mem>>, Broken> {
    let avail = avail_idx(mem, state, split)?;
    let q = state.get_queue_mut();
    let next = Wrapping(q.next_avail());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::memory::test_vring as vring;
    use vhost_user_backend::VringT;

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
}
