//! Requests the guest sent that were taken off a ring and not answered when the
//! frontend stopped it: a lock wait (SETLKW, answered when the lock is granted) and a
//! throttled request (in its volume's line). A migration's source cannot answer them
//! any more (the frontend stopped the rings and synced the dirty log for the last
//! time), so they travel in the device state, and the destination answers them on
//! the same rings, from the same descriptor chains in the migrated guest memory:
//! the guest's process sees its call return, late, as on the source.
//!
//! Only the request's local copy travels (a WRITE's header, its data stays in guest
//! memory, as for any WRITE); the chain is found again by its head descriptor
//! ([`chain_at`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryAtomic,
    GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

use super::queue::Mem;
use super::throttle::WaitRoom;
use super::{GuestMem, GuestMmap, MAX_QUEUE_SIZE};
use crate::fs::server::{parse_header, MAX_REQUEST};
use crate::state::format::ParkedRequest;

/// The requests a device holds unanswered, and those a loaded state handed it.
#[derive(Default)]
pub struct Parked {
    /// Lock waits on threads of their own, by an id of their own.
    lock_waits: Mutex<HashMap<u64, ParkedRequest>>,
    next_id: AtomicU64,
    /// Requests of a loaded state, per queue, not answered yet.
    incoming: Mutex<HashMap<u16, Vec<ParkedRequest>>>,
}

impl Parked {
    /// Registers a lock wait a thread now serves; [`Self::lock_wait_done`] with the
    /// id once it answered (or dropped) it.
    pub fn lock_wait_started(&self, queue: usize, head: u16, request: &[u8]) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock_waits.lock().unwrap().insert(
            id,
            ParkedRequest {
                queue: queue as u16,
                head,
                request: request.to_vec(),
            },
        );
        id
    }

    pub fn lock_wait_done(&self, id: u64) {
        self.lock_waits.lock().unwrap().remove(&id);
    }

    /// What is unanswered now, for the device state: lock waits and the throttled
    /// requests of `rooms` (indexed by queue).
    pub fn collect(&self, rooms: &[Mutex<WaitRoom>]) -> Vec<ParkedRequest> {
        let mut all: Vec<ParkedRequest> =
            self.lock_waits.lock().unwrap().values().cloned().collect();
        for (queue, room) in rooms.iter().enumerate() {
            for (head, request) in room.lock().unwrap().unanswered() {
                all.push(ParkedRequest {
                    queue: queue as u16,
                    head,
                    request,
                });
            }
        }
        // Queue order is the guest's order within a queue: throttled requests keep
        // their line's order; lock waits are independent of each other.
        all.sort_by_key(|p| p.queue);
        all
    }

    /// Takes the requests of a loaded state, to answer once their queues run.
    /// Refuses what cannot be one (a queue this device has not, a head past the
    /// largest ring, a request that is not one, more than the rings hold).
    pub fn deliver(&self, requests: Vec<ParkedRequest>, queues: usize) -> Result<(), String> {
        if requests.len() > queues * MAX_QUEUE_SIZE {
            return Err(format!(
                "{} unanswered requests: more than the rings hold",
                requests.len()
            ));
        }
        let mut incoming: HashMap<u16, Vec<ParkedRequest>> = HashMap::new();
        for p in requests {
            if p.queue == 0 || usize::from(p.queue) >= queues {
                return Err(format!("an unanswered request on queue {}", p.queue));
            }
            if usize::from(p.head) >= MAX_QUEUE_SIZE {
                return Err(format!("an unanswered request at descriptor {}", p.head));
            }
            if p.request.len() > MAX_REQUEST || parse_header(&p.request).is_none() {
                return Err(format!(
                    "an unanswered request of {} bytes",
                    p.request.len()
                ));
            }
            incoming.entry(p.queue).or_default().push(p);
        }
        *self.incoming.lock().unwrap() = incoming;
        Ok(())
    }

    /// Whether requests of a loaded state wait for their queue to run.
    pub fn has_incoming(&self) -> bool {
        !self.incoming.lock().unwrap().is_empty()
    }

    /// The loaded requests of `queue`, taken to be answered.
    pub fn take_incoming(&self, queue: usize) -> Vec<ParkedRequest> {
        self.incoming
            .lock()
            .unwrap()
            .remove(&(queue as u16))
            .unwrap_or_default()
    }

    /// Forgets what a loaded state handed over (a new frontend, a reset).
    pub fn forget_incoming(&self) {
        self.incoming.lock().unwrap().clear();
    }
}

/// Where the one-entry avail ring that finds a chain again is put: above any guest
/// physical address a VMM gives (x86-64 guests have at most 52 bits).
const SCRATCH_GPA: u64 = 1 << 56;

/// The descriptor chain whose head is `head` in the ring the vring `state` is set up
/// on, read from guest memory `mem` as a pop reads it.
///
/// virtio-queue makes a chain only by popping it from an avail ring, and its
/// constructor from a head is private to it. So a private queue is set up on the
/// guest's descriptor table with an avail ring of one entry, `head`, in a scratch
/// region added to (a copy of) the guest memory map above every guest address, and
/// popped. The chain reads and writes guest memory through the guest's own regions
/// (their dirty logs included); the scratch region is never part of a reply.
pub fn chain_at(
    mem: &GuestMem,
    state: &vhost_user_backend::VringState<GuestMem>,
    head: u16,
) -> Option<DescriptorChain<Mem>> {
    let ring = state.get_queue();
    let size = ring.size();
    if head >= size {
        return None;
    }
    let guest = mem.memory();
    if guest
        .iter()
        .any(|r| r.last_addr().raw_value() >= SCRATCH_GPA)
    {
        return None;
    }
    let scratch = MmapRegion::new(4096).ok()?;
    let region = GuestRegionMmap::new(scratch, GuestAddress(SCRATCH_GPA))?;
    let combined: GuestMmap = (*guest).insert_region(Arc::new(region)).ok()?;
    // Avail ring: flags 0, idx 1, ring[0] = head; the used ring after it (never
    // written: the chain is returned on the real ring).
    let avail = GuestAddress(SCRATCH_GPA);
    combined.write_obj(0u16, avail).ok()?;
    combined.write_obj(1u16, avail.checked_add(2)?).ok()?;
    combined.write_obj(head, avail.checked_add(4)?).ok()?;
    let mut q = Queue::new(size).ok()?;
    q.set_size(size);
    q.set_desc_table_address(
        Some(ring.desc_table() as u32),
        Some((ring.desc_table() >> 32) as u32),
    );
    q.set_avail_ring_address(Some(SCRATCH_GPA as u32), Some((SCRATCH_GPA >> 32) as u32));
    let used = SCRATCH_GPA + 2048;
    q.set_used_ring_address(Some(used as u32), Some((used >> 32) as u32));
    q.set_ready(true);
    let load = GuestMemoryAtomic::new(combined).memory();
    q.pop_descriptor_chain(load)
}
