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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryAtomic,
    GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

use super::WaitRoom;
use crate::device::memory::{GuestMem, GuestMmap};
use crate::device::ring::Mem;
use crate::device::ring::MAX_QUEUE_SIZE;
use crate::fs::request::is_request;
use crate::state::format::ParkedRequest;

/// The requests a device holds unanswered, and those a loaded state handed it.
#[derive(Default)]
pub struct Parked {
    /// Lock waits on threads of their own, by an id of their own.
    lock_waits: Mutex<HashMap<u64, ParkedRequest>>,
    next_id: AtomicU64,
    /// Requests of a loaded state, per queue, not answered yet.
    incoming: Mutex<HashMap<u16, Vec<ParkedRequest>>>,
    /// `incoming` is not empty: read on every kick, so without its lock.
    any_incoming: AtomicBool,
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
    pub fn collect<'a>(
        &self,
        rooms: impl Iterator<Item = (u16, &'a Mutex<WaitRoom>)>,
    ) -> Vec<ParkedRequest> {
        let mut all: Vec<ParkedRequest> =
            self.lock_waits.lock().unwrap().values().cloned().collect();
        for (queue, room) in rooms {
            for (head, request) in room.lock().unwrap().unanswered() {
                all.push(ParkedRequest {
                    queue,
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

    /// Whether the requests of a loaded state can be taken: refuses what cannot be
    /// one (a queue this device has not, a head past the largest ring, a request
    /// that is not one, more than the rings hold). Checked before the load changes
    /// anything.
    pub fn check(requests: &[ParkedRequest], queues: usize) -> Result<(), Refused> {
        if requests.len() > queues * MAX_QUEUE_SIZE {
            return Err(Refused::TooMany(requests.len()));
        }
        for p in requests {
            if p.queue == 0 || usize::from(p.queue) >= queues {
                return Err(Refused::Queue(p.queue));
            }
            if usize::from(p.head) >= MAX_QUEUE_SIZE {
                return Err(Refused::Head(p.head));
            }
            if !is_request(&p.request) {
                return Err(Refused::NotARequest(p.request.len()));
            }
        }
        Ok(())
    }

    /// Takes the requests of a loaded state, to answer once their queues run
    /// (refused as [`Self::check`] refuses).
    pub fn deliver(&self, requests: Vec<ParkedRequest>, queues: usize) -> Result<(), Refused> {
        Self::check(&requests, queues)?;
        let mut incoming: HashMap<u16, Vec<ParkedRequest>> = HashMap::new();
        for p in requests {
            incoming.entry(p.queue).or_default().push(p);
        }
        let mut held = self.incoming.lock().unwrap();
        *held = incoming;
        self.any_incoming.store(!held.is_empty(), Ordering::Release);
        Ok(())
    }

    /// Whether requests of a loaded state wait for their queue to run (one load: it
    /// is asked on every kick).
    pub fn has_incoming(&self) -> bool {
        self.any_incoming.load(Ordering::Acquire)
    }

    /// The loaded requests of `queue`, taken to be answered.
    pub fn take_incoming(&self, queue: usize) -> Vec<ParkedRequest> {
        let mut held = self.incoming.lock().unwrap();
        let taken = held.remove(&(queue as u16)).unwrap_or_default();
        self.any_incoming.store(!held.is_empty(), Ordering::Release);
        taken
    }

    /// Forgets what a loaded state handed over (a new frontend, a reset).
    pub fn forget_incoming(&self) {
        self.incoming.lock().unwrap().clear();
        self.any_incoming.store(false, Ordering::Release);
    }
}

/// Why a loaded state's unanswered requests were refused, whole.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// More than the rings can hold.
    TooMany(usize),
    /// On a queue this device has not, or the hiprio queue (which never parks).
    Queue(u16),
    /// At a descriptor past the largest ring.
    Head(u16),
    /// Bytes that cannot be a request, by their length.
    NotARequest(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooMany(n) => write!(f, "{n} unanswered requests: more than the rings hold"),
            Refused::Queue(q) => write!(f, "an unanswered request on queue {q}"),
            Refused::Head(h) => write!(f, "an unanswered request at descriptor {h}"),
            Refused::NotARequest(n) => write!(f, "an unanswered request of {n} bytes"),
        }
    }
}

impl std::error::Error for Refused {}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::request::MAX_REQUEST;

    /// A GETATTR request's bytes: a valid header, as a guest sends it.
    fn getattr() -> Vec<u8> {
        let mut r = vec![0u8; 56];
        r[0..4].copy_from_slice(&56u32.to_le_bytes()); // len
        r[4..8].copy_from_slice(&3u32.to_le_bytes()); // opcode GETATTR
        r[8..16].copy_from_slice(&1u64.to_le_bytes()); // unique
        r[16..24].copy_from_slice(&1u64.to_le_bytes()); // nodeid
        r
    }

    fn at(queue: u16, head: u16, request: Vec<u8>) -> ParkedRequest {
        ParkedRequest {
            queue,
            head,
            request,
        }
    }

    #[test]
    fn a_state_s_requests_are_taken_per_queue_and_the_flag_follows() {
        let p = Parked::default();
        assert!(!p.has_incoming());
        p.deliver(vec![at(1, 0, getattr()), at(2, 5, getattr())], 3)
            .unwrap();
        assert!(p.has_incoming());
        assert_eq!(p.take_incoming(1).len(), 1);
        assert!(p.has_incoming(), "queue 2's is still there");
        assert_eq!(p.take_incoming(2).len(), 1);
        assert!(!p.has_incoming());
        p.deliver(vec![at(1, 0, getattr())], 3).unwrap();
        p.forget_incoming();
        assert!(!p.has_incoming() && p.take_incoming(1).is_empty());
    }

    #[test]
    fn forged_unanswered_requests_are_refused_whole() {
        let p = Parked::default();
        let refused = |requests: Vec<ParkedRequest>| {
            let e = p.deliver(requests, 3).unwrap_err();
            assert!(!p.has_incoming(), "nothing kept after: {e}");
            e.to_string()
        };
        // The hiprio queue never parks; a queue the device has not.
        assert!(refused(vec![at(0, 0, getattr())]).contains("queue 0"));
        assert!(refused(vec![at(3, 0, getattr())]).contains("queue 3"));
        // A head past the largest ring.
        let past = MAX_QUEUE_SIZE as u16;
        assert!(refused(vec![at(1, past, getattr())]).contains("descriptor"));
        // Not a request: too short for a header, or longer than any request.
        assert!(refused(vec![at(1, 0, vec![0u8; 8])]).contains("8 bytes"));
        let long = vec![0u8; MAX_REQUEST + 1];
        assert!(refused(vec![at(1, 0, long)]).contains("bytes"));
        // More than the rings can hold, one bad among good ones.
        let many = (0..=3 * MAX_QUEUE_SIZE)
            .map(|_| at(1, 0, getattr()))
            .collect();
        assert!(refused(many).contains("more than the rings hold"));
        assert!(refused(vec![at(1, 0, getattr()), at(0, 1, getattr())]).contains("queue 0"));
    }
}
