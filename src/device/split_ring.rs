//! A split ring's avail and used rings, mapped once per drain: the avail index
//! read, a completion written to the used ring, and the decision to interrupt the
//! guest (VIRTIO 1.2, 2.7.7 and 2.7.10), each an access at an offset.
//!
//! virtio-queue's own accessors look each address up in guest memory again (its
//! region, its bounds) and copy two bytes through `memcpy`: with the chain's
//! descriptors, that was a quarter of a small request's instructions. What they
//! check is kept: a head inside the queue, the used element written before the used
//! index (a release store), and a full fence before `used_event` is read. A ring not
//! in one region of guest memory is left to virtio-queue.

use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use super::guest_buffers::GuestSlice;
use super::memory::GuestMmap;
use super::memory::Locked;

/// The avail ring's header (flags, idx) and element size; the used ring's.
const AVAIL_HEADER: usize = 4;
const USED_HEADER: usize = 4;
const USED_ELEM: usize = 8;

/// A queue's avail and used rings in guest memory, as one drain sees them.
pub(crate) struct SplitRing<'m> {
    avail: GuestSlice<'m>,
    used: GuestSlice<'m>,
    size: u16,
    event_idx: bool,
}

impl<'m> SplitRing<'m> {
    /// The rings of the queue `state` holds, when each lies in one region of `mem`.
    pub(crate) fn map(mem: &'m GuestMmap, state: &Locked) -> Option<Self> {
        let q = state.get_queue();
        let size = q.size();
        let avail_len = AVAIL_HEADER + 2 * usize::from(size) + 2;
        let used_len = USED_HEADER + USED_ELEM * usize::from(size) + 2;
        Some(SplitRing {
            avail: mem
                .get_slice(GuestAddress(q.avail_ring()), avail_len)
                .ok()?,
            used: mem.get_slice(GuestAddress(q.used_ring()), used_len).ok()?,
            size,
            event_idx: q.event_idx_enabled(),
        })
    }

    /// The driver's avail index (acquire: the entries before it are then visible).
    pub(crate) fn avail_idx(&self) -> Option<Wrapping<u16>> {
        self.avail
            .load::<u16>(2, Ordering::Acquire)
            .ok()
            .map(|i| Wrapping(u16::from_le(i)))
    }

    /// Returns the chain `head` with `len` bytes written, at the queue's next used
    /// position, and moves it on. False: `head` is no descriptor of this queue.
    pub(crate) fn add_used(&self, state: &mut Locked, head: u16, len: u32) -> bool {
        if head >= self.size {
            return false;
        }
        let q = state.get_queue_mut();
        let next = Wrapping(q.next_used());
        let slot = USED_HEADER + USED_ELEM * usize::from(next.0 % self.size);
        // The element (id, len: little-endian u32s, 4-byte aligned as the ring is),
        // then the index. In bounds: `map` mapped the whole ring; the stores set the
        // dirty log.
        let written = self
            .used
            .store(u32::from(head).to_le(), slot, Ordering::Relaxed)
            .is_ok()
            && self
                .used
                .store(len.to_le(), slot + 4, Ordering::Relaxed)
                .is_ok()
            && self
                .used
                .store(u16::to_le((next + Wrapping(1)).0), 2, Ordering::Release)
                .is_ok();
        if written {
            q.set_next_used((next + Wrapping(1)).0);
        }
        written
    }

    /// Whether the guest wants an interrupt for the completions from `since` up to
    /// the queue's next used index: always without EVENT_IDX (virtio-queue does
    /// not honour VRING_AVAIL_F_NO_INTERRUPT either), else when `used_event` lies in
    /// that range, as Linux's `vring_need_event`.
    pub(crate) fn needs_notification(&self, next_used: u16, since: u16) -> bool {
        // The used index written before `used_event` is read.
        fence(Ordering::SeqCst);
        if !self.event_idx {
            return true;
        }
        let offset = AVAIL_HEADER + 2 * usize::from(self.size);
        let Ok(event) = self.avail.load::<u16>(offset, Ordering::Relaxed) else {
            return true;
        };
        let (new, old, event) = (
            Wrapping(next_used),
            Wrapping(since),
            Wrapping(u16::from_le(event)),
        );
        new - event - Wrapping(1) < new - old
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::memory::test_vring as vring;
    use vhost_user_backend::VringT;
    use virtio_queue::desc::split::VirtqUsedElem;

    #[test]
    fn completions_land_in_the_used_ring_as_virtio_queue_writes_them() {
        let v = vring();
        let guest = GuestMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let mut state = v.get_mut();
        state.get_queue_mut().set_event_idx(true);
        let ring = SplitRing::map(&guest, &state).expect("rings in one region");
        assert!(ring.add_used(&mut state, 3, 77));
        assert!(ring.add_used(&mut state, 5, 0));
        assert!(!ring.add_used(&mut state, 256, 0), "no such descriptor");
        assert_eq!(state.get_queue().next_used(), 2);
        let used = 0x2000;
        let idx: u16 = guest.read_obj(GuestAddress(used + 2)).unwrap();
        let first: VirtqUsedElem = guest.read_obj(GuestAddress(used + 4)).unwrap();
        assert_eq!((idx, first.id(), first.len()), (2, 3, 77));
        // used_event 0: the guest wants an interrupt after the first completion.
        assert!(ring.needs_notification(2, 0));
        // used_event 5: not yet, until the sixth.
        guest
            .write_obj(5u16, GuestAddress(0x1000 + 4 + 2 * 256))
            .unwrap();
        assert!(!ring.needs_notification(2, 0));
        assert!(ring.needs_notification(6, 2));
        assert!(!ring.needs_notification(9, 6), "signalled already");
    }
}
