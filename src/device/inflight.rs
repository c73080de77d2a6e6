//! The requests a ring gave the daemon that it has not answered yet, kept in the
//! session region under a keeper (`src/region/`), so that a serving process
//! started after this one was killed answers them: none is lost, and none is
//! applied twice (`fs/request.rs` decides which run again).
//!
//! As in the vhost-user inflight protocol (libvhost-user's `vu_check_queue_inflights`):
//! a head is marked with its order when its chain is popped, and unmarked after its
//! completion is in the used ring, whose published index is recorded then. After a
//! crash, the heads still marked were taken and not answered, but for the last one
//! returned, when the process died between returning it and unmarking it: the
//! guest's used index, ahead of the recorded one, tells (its entries in the used ring
//! name them). Every popped chain is either answered (counted in the used index) or
//! marked, so the ring continues at `used index + marked`.
//!
//! Marking costs two stores per request and no system call. Without a keeper there
//! is no region and nothing is marked.

use std::sync::atomic::Ordering;

use crate::region::{QueueArea, Region, QUEUE_SIZE};

/// One queue's requests in flight (None: no session region).
#[derive(Clone, Copy, Default)]
pub struct InFlight(Option<&'static QueueArea>);

/// What a crash left on one ring.
#[derive(Debug, Default, Eq, PartialEq)]
pub struct Unanswered {
    /// The heads of the chains taken and not answered, in the order they were taken.
    pub heads: Vec<u16>,
    /// Where the ring continues: the chains before it are answered or in `heads`.
    pub next_avail: u16,
}

impl InFlight {
    /// Queue `index`'s, in this process's session region (None: no keeper).
    pub fn of(region: Option<&'static Region>, index: usize) -> InFlight {
        InFlight(region.and_then(|r| r.queue(index)))
    }

    #[cfg(test)]
    fn on(area: &'static QueueArea) -> InFlight {
        InFlight(Some(area))
    }

    pub fn is_kept(&self) -> bool {
        self.0.is_some()
    }

    /// The chain `head` of the ring at `desc_table` was popped (under the vring's
    /// lock).
    pub fn taken(&self, desc_table: u64, head: u16) {
        let Some(area) = self.0 else { return };
        let Some(slot) = area.heads.get(usize::from(head)) else {
            return;
        };
        if area.desc_table.load(Ordering::Relaxed) != desc_table {
            area.desc_table.store(desc_table, Ordering::Relaxed);
        }
        let order = area.counter.fetch_add(1, Ordering::Relaxed) + 1;
        slot.store(order, Ordering::Relaxed);
    }

    /// The chain `head` is in the used ring, whose index is `used_idx` now. After the
    /// ring's own writes: a crash in between leaves it marked, and the used index
    /// tells it was returned.
    pub fn answered(&self, head: u16, used_idx: u16) {
        let Some(area) = self.0 else { return };
        if let Some(slot) = area.heads.get(usize::from(head)) {
            slot.store(0, Ordering::Release);
        }
        area.used_idx.store(used_idx, Ordering::Release);
    }

    /// Forgets every request of the ring (a new driver, a reset: they will never be
    /// answered).
    pub fn clear(&self) {
        let Some(area) = self.0 else { return };
        for slot in &area.heads {
            slot.store(0, Ordering::Relaxed);
        }
        area.used_idx.store(0, Ordering::Release);
    }

    /// What the process that kept this queue before left unanswered on the ring at
    /// `desc_table`, of `size` descriptors, whose used index in guest memory is
    /// `used_idx`; `used_id` reads the head named by entry `i` of the used ring.
    /// Everything read is the guest's or a dead process's: bounded, never trusted.
    /// The marks are left as they are: each is cleared when its request is answered.
    pub fn unanswered(
        &self,
        desc_table: u64,
        size: u16,
        used_idx: u16,
        used_id: impl Fn(u16) -> Option<u32>,
    ) -> Unanswered {
        match self.0 {
            Some(area) => unanswered_in(area, desc_table, size, used_idx, used_id),
            None => Unanswered {
                heads: Vec::new(),
                next_avail: used_idx,
            },
        }
    }
}

/// [`InFlight::unanswered`] of the queue area `area` (of a region handed back, say).
pub fn unanswered_in(
    area: &QueueArea,
    desc_table: u64,
    size: u16,
    used_idx: u16,
    used_id: impl Fn(u16) -> Option<u32>,
) -> Unanswered {
    let none = Unanswered {
        heads: Vec::new(),
        next_avail: used_idx,
    };
    let size = usize::from(size).min(QUEUE_SIZE);
    if area.desc_table.load(Ordering::Relaxed) != desc_table {
        // Another ring's heads: a ring set up elsewhere since.
        return none;
    }
    let mut marked: Vec<(u64, u16)> = area.heads[..size]
        .iter()
        .enumerate()
        .filter_map(|(h, s)| {
            let order = s.load(Ordering::Acquire);
            (order != 0).then_some((order, h as u16))
        })
        .collect();
    // Returned but still marked: the used entries published after the index
    // recorded (at most the one in whose return the process died; a guest that
    // wrote its own used index gets at most a ring's worth looked at).
    let recorded = area.used_idx.load(Ordering::Acquire);
    let published = used_idx.wrapping_sub(recorded).min(size as u16);
    for i in 0..published {
        if let Some(id) = used_id(recorded.wrapping_add(i)) {
            marked.retain(|&(_, h)| u32::from(h) != id);
        }
    }
    marked.sort_unstable();
    Unanswered {
        next_avail: used_idx.wrapping_add(marked.len() as u16),
        heads: marked.into_iter().map(|(_, h)| h).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::Region;

    fn area() -> InFlight {
        let region: &'static Region = Box::leak(Box::new(Region::create().unwrap()));
        InFlight::on(region.queue(1).unwrap())
    }

    const TABLE: u64 = 0x1000;

    #[test]
    fn what_was_taken_and_not_answered_is_found_in_order() {
        let q = area();
        // Taken: 5, 2, 9; answered: 2 (used index 1).
        q.taken(TABLE, 5);
        q.taken(TABLE, 2);
        q.taken(TABLE, 9);
        q.answered(2, 1);
        let used = |_: u16| Some(2);
        let u = q.unanswered(TABLE, 16, 1, used);
        assert_eq!(u.heads, vec![5, 9]);
        assert_eq!(u.next_avail, 3);
    }

    #[test]
    fn a_chain_returned_but_not_unmarked_when_the_process_died_is_answered() {
        let q = area();
        q.taken(TABLE, 5);
        q.taken(TABLE, 7);
        q.answered(5, 1);
        // 7 returned at used index 1 -> 2, the process died before unmarking it.
        let used = |i: u16| match i {
            0 => Some(5),
            1 => Some(7),
            _ => None,
        };
        let u = q.unanswered(TABLE, 16, 2, used);
        assert!(u.heads.is_empty());
        assert_eq!(u.next_avail, 2);
        // A guest that moved its used index far ahead costs at most a ring's scan.
        let u = q.unanswered(TABLE, 16, 40_000, |_| Some(99));
        assert_eq!(u.heads, vec![7]);
    }

    #[test]
    fn another_ring_or_a_cleared_one_has_nothing_unanswered() {
        let q = area();
        q.taken(TABLE, 5);
        assert!(q.unanswered(0x9000, 16, 0, |_| None).heads.is_empty());
        assert_eq!(q.unanswered(TABLE, 16, 0, |_| None).heads, vec![5]);
        // A head past the ring's size is no head of it.
        assert!(q.unanswered(TABLE, 4, 0, |_| None).heads.is_empty());
        q.clear();
        assert!(q.unanswered(TABLE, 16, 0, |_| None).heads.is_empty());
        // Without a region nothing is kept, and the ring continues where the guest
        // says it was answered.
        let none = InFlight::default();
        none.taken(TABLE, 1);
        assert_eq!(none.unanswered(TABLE, 16, 7, |_| None).next_avail, 7);
        assert!(!none.is_kept());
    }
}
