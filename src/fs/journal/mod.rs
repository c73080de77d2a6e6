//! The journal: what the guest holds (node ids, open handles, POSIX locks, volume
//! roots and virtual directories, its FUSE INIT), recorded in the session region
//! (`src/region/`) as the tables change, so that a serving process started
//! after this one was killed can serve the guest on with the same ids
//! (`rebuild.rs` makes a device state of it). Only under a keeper (`--upgradable`):
//! the daemon makes the one [`Journal`] and hands it to the tables (each holds an
//! `Option<&Journal>`); without one, no table records anything.
//!
//! One record per thing, in a slot of its own, written by the one process that holds
//! the half: fields first, then the slot's state word with a release store, so that
//! a process killed in the middle leaves a slot that reads as free, never a torn
//! record. A record that changes as a whole (a lock owner's ranges) is written anew
//! into another slot before the old one is freed; a reader that finds both keeps
//! the later (its sequence number). Counts that change on every request (a node's
//! lookups) are updated in place with one atomic operation: no system call, no lock.
//!
//! ```text
//! slot:  0 state u32 | 4 kind u8, handle length u8, name length u16 | 8 seq u64
//!        16 id | 24 count | 32 parent | 40 volume | 48 dev | 56 ino      (u64 each)
//!        64 file type u32, handle type i32 | 72 mount id u64
//!        80 data: the file handle's bytes, then the name (or path, or ranges)
//! ```
//!
//! This file is the writer (slots allocated, written, updated in place, freed);
//! `records.rs` the records' layout, encoded and read back.

pub mod rebuild;
mod records;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::region::{Half, HalfView, Region, SlotClass, SlotPtr};

use records::{encode, handle_count, COUNT, FREE, LIVE, META, SEQ, STATE};
pub use records::{read_half, Handle, NodeRecord, ReadRecord, Record, DATA};

/// A record's place: its class and index (the top bit: large).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Slot(u32);

impl Slot {
    /// "No record": what a table keeps when it records nothing.
    pub const NONE: u32 = u32::MAX;
    const LARGE: u32 = 1 << 31;

    fn new(class: SlotClass, index: u32) -> Slot {
        match class {
            SlotClass::Small => Slot(index),
            SlotClass::Large => Slot(index | Slot::LARGE),
        }
    }

    /// As a table keeps it (an AtomicU32 or a u32 beside its object).
    pub fn raw(self) -> u32 {
        self.0
    }

    pub fn from_raw(raw: u32) -> Option<Slot> {
        (raw != Slot::NONE).then_some(Slot(raw))
    }

    fn class(self) -> SlotClass {
        if self.0 & Slot::LARGE != 0 {
            SlotClass::Large
        } else {
            SlotClass::Small
        }
    }

    fn index(self) -> usize {
        (self.0 & !Slot::LARGE) as usize
    }
}

/// The slots of one class: those never used start at `used`; freed ones are reused.
#[derive(Default)]
struct Slots {
    used: u32,
    free: Vec<u32>,
}

/// The journal of this serving process: the half it writes.
pub struct Journal {
    half: HalfView<'static>,
    small: Mutex<Slots>,
    large: Mutex<Slots>,
    /// A record did not fit (too long, or the half is full): said once.
    warned: AtomicBool,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").finish_non_exhaustive()
    }
}

/// A record freed when it is dropped: the record of a handle or a lock file, which
/// lives as long as what it names.
pub struct Recorded {
    journal: &'static Journal,
    slot: Slot,
}

impl Recorded {
    pub fn journal(&self) -> &'static Journal {
        self.journal
    }

    pub fn slot(&self) -> Slot {
        self.slot
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        self.journal.free(self.slot);
    }
}

impl Journal {
    /// Writes `record` as [`Self::write`] does; the record is freed when the value
    /// returned is dropped.
    pub fn record(&'static self, record: &Record<&[u8]>) -> Option<Recorded> {
        let slot = self.write(record)?;
        Some(Recorded {
            journal: self,
            slot,
        })
    }

    /// The journal of a serving process that records into `half` of `region` (the
    /// keeper cleared it). Made once, where the daemon sets up its session region,
    /// and handed to each table that records into it.
    pub fn new(region: &'static Region, half: Half) -> Journal {
        Journal {
            half: region.half(half),
            small: Mutex::default(),
            large: Mutex::default(),
            warned: AtomicBool::new(false),
        }
    }

    fn slot(&self, slot: Slot) -> Option<SlotPtr<'static>> {
        self.half.slot(slot.class(), slot.index())
    }

    fn alloc(&self, data_len: usize) -> Option<Slot> {
        let class = if DATA + data_len <= SlotClass::Small.len() {
            SlotClass::Small
        } else if DATA + data_len <= SlotClass::Large.len() {
            SlotClass::Large
        } else {
            return None;
        };
        let header = self.half.header();
        let (slots, used) = match class {
            SlotClass::Small => (&self.small, &header.small_used),
            SlotClass::Large => (&self.large, &header.large_used),
        };
        let mut s = slots.lock().unwrap_or_else(|p| p.into_inner());
        let index = match s.free.pop() {
            Some(i) => i,
            None if (s.used as usize) < class.count() => {
                s.used += 1;
                used.store(s.used, Ordering::Release);
                s.used - 1
            }
            None => return None,
        };
        Some(Slot::new(class, index))
    }

    /// Writes `record`; None when it cannot be recorded (too long, or no slot left):
    /// then a serving process started after a crash will not have it (said once).
    pub fn write(&self, record: &Record<&[u8]>) -> Option<Slot> {
        let slot = encode(record).and_then(|e| Some((self.alloc(e.len)?, e)));
        let Some((slot, e)) = slot else {
            if !self.warned.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "journal: a record too long for a slot, or the journal is full: what \
                     the guest holds is not all recorded for a crash"
                );
            }
            return None;
        };
        let p = self.slot(slot)?;
        p.u32(META).store(e.meta, Ordering::Relaxed);
        for &(offset, value) in &e.fields[..e.nfields] {
            p.u64(offset).store(value, Ordering::Relaxed);
        }
        p.write_bytes(DATA, &e.data[..e.len]);
        let seq = self.half.header().seq.fetch_add(1, Ordering::Relaxed) + 1;
        p.u64(SEQ).store(seq, Ordering::Relaxed);
        p.u32(STATE).store(LIVE, Ordering::Release);
        Some(slot)
    }

    /// Frees a record (the thing it names is gone). Freeing twice frees once.
    pub fn free(&self, slot: Slot) {
        let Some(p) = self.slot(slot) else {
            return;
        };
        if p.u32(STATE).swap(FREE, Ordering::Release) != LIVE {
            return;
        }
        let slots = match slot.class() {
            SlotClass::Small => &self.small,
            SlotClass::Large => &self.large,
        };
        slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free
            .push(slot.index() as u32);
    }

    /// Whether `slot` holds a node record that names the node `name` in `parent`
    /// (where it was found, or moved to since).
    pub fn names(&self, slot: Slot, parent: u64, name: &[u8]) -> bool {
        let Some(p) = self.slot(slot) else {
            return false;
        };
        records::names_node(&p, parent, name)
    }

    /// A node's lookups went up by `n` (a lookup of a node it holds).
    pub fn add_lookups(&self, slot: Slot, n: u64) {
        if let Some(p) = self.slot(slot) {
            p.u64(COUNT).fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A node's lookups are `n` now (a FORGET).
    pub fn set_lookups(&self, slot: Slot, n: u64) {
        if let Some(p) = self.slot(slot) {
            p.u64(COUNT).store(n, Ordering::Relaxed);
        }
    }

    /// The flock held through a handle now (`F_UNLCK`: none).
    pub fn set_flock(&self, slot: Slot, kind: i32) {
        if let Some(p) = self.slot(slot) {
            let count = p.u64(COUNT).load(Ordering::Relaxed);
            p.u64(COUNT)
                .store(handle_count(count as u32 as i32, kind), Ordering::Relaxed);
        }
    }

    /// The ids the tables hand out next are at least these.
    pub fn next_ids(&self, node: Option<u64>, handle: Option<u64>) {
        let h = self.half.header();
        if let Some(n) = node {
            h.next_node_id.fetch_max(n, Ordering::Relaxed);
        }
        if let Some(n) = handle {
            h.next_handle_id.fetch_max(n, Ordering::Relaxed);
        }
    }

    /// The guest's FUSE INIT (None: the session has none yet).
    pub fn set_init(&self, init: Option<crate::state::format::FuseSession>) {
        let h = self.half.header();
        match init {
            Some(f) => {
                h.init_minor.store(f.minor, Ordering::Relaxed);
                h.init_offered.store(f.offered, Ordering::Relaxed);
                h.init_granted.store(f.granted, Ordering::Relaxed);
                h.init_set.store(1, Ordering::Release);
            }
            None => h.init_set.store(0, Ordering::Release),
        }
    }
}

#[cfg(test)]
mod agreement;
#[cfg(test)]
mod tests;
