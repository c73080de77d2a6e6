//! The region's two journal halves: which one, a half's header page, and its slots
//! (`fs/journal/` writes and reads the records in them).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use super::{Region, HALF_HEADER, LARGE_SLOT, LARGE_SLOTS, SMALL_SLOT, SMALL_SLOTS};

/// A journal half.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Half {
    A,
    B,
}

impl Half {
    pub fn index(self) -> usize {
        match self {
            Half::A => 0,
            Half::B => 1,
        }
    }

    pub fn from_index(i: u32) -> Option<Half> {
        match i {
            0 => Some(Half::A),
            1 => Some(Half::B),
            _ => None,
        }
    }

    pub fn other(self) -> Half {
        match self {
            Half::A => Half::B,
            Half::B => Half::A,
        }
    }
}

/// A journal half: its header and its slots.
#[derive(Clone, Copy)]
pub struct HalfView<'a> {
    pub(super) region: &'a Region,
    pub(super) offset: usize,
}

/// A journal half's first page.
#[repr(C)]
pub struct HalfHeader {
    /// The node and handle ids the next ones are handed out from (at least).
    pub next_node_id: AtomicU64,
    pub next_handle_id: AtomicU64,
    /// The guest's FUSE INIT: set (1) or not, its minor, the flags offered and granted.
    pub init_set: AtomicU32,
    pub init_minor: AtomicU32,
    pub init_offered: AtomicU64,
    pub init_granted: AtomicU64,
    /// Slots ever used (high-water marks): a reader looks no further.
    pub small_used: AtomicU32,
    pub large_used: AtomicU32,
    /// Bumped with every record written: a reader that finds two records for one
    /// thing (a crash between writing the new one and freeing the old) keeps the
    /// later.
    pub seq: AtomicU64,
}

/// A slot's class.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum SlotClass {
    Small,
    Large,
}

impl SlotClass {
    pub fn len(self) -> usize {
        match self {
            SlotClass::Small => SMALL_SLOT,
            SlotClass::Large => LARGE_SLOT,
        }
    }

    pub fn count(self) -> usize {
        match self {
            SlotClass::Small => SMALL_SLOTS,
            SlotClass::Large => LARGE_SLOTS,
        }
    }
}

impl<'a> HalfView<'a> {
    pub fn header(&self) -> &'a HalfHeader {
        let p = self
            .region
            .at(self.offset, std::mem::size_of::<HalfHeader>());
        // SAFETY: in bounds, page aligned, atomics only, lives as long as the region.
        unsafe { &*(p as *const HalfHeader) }
    }

    /// Slot `index` of `class`: its first byte, and its length.
    pub fn slot(&self, class: SlotClass, index: usize) -> Option<SlotPtr<'a>> {
        if index >= class.count() {
            return None;
        }
        let start = match class {
            SlotClass::Small => HALF_HEADER,
            SlotClass::Large => HALF_HEADER + SMALL_SLOTS * SMALL_SLOT,
        };
        let offset = self.offset + start + index * class.len();
        Some(SlotPtr {
            base: self.region.at(offset, class.len()),
            len: class.len(),
            _region: std::marker::PhantomData,
        })
    }
}

/// A journal slot's bytes in the region.
#[derive(Clone, Copy)]
pub struct SlotPtr<'a> {
    base: *mut u8,
    len: usize,
    _region: std::marker::PhantomData<&'a Region>,
}

impl<'a> SlotPtr<'a> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The u64 at byte `offset` (a multiple of 8).
    pub fn u64(&self, offset: usize) -> &'a AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: in bounds and aligned (slots are 128-byte aligned); the region
        // outlives 'a.
        unsafe { AtomicU64::from_ptr(self.base.add(offset) as *mut u64) }
    }

    /// The u32 at byte `offset` (a multiple of 4).
    pub fn u32(&self, offset: usize) -> &'a AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= self.len);
        // SAFETY: as for `u64`.
        unsafe { AtomicU32::from_ptr(self.base.add(offset) as *mut u32) }
    }

    /// The byte at `offset`.
    pub fn u8(&self, offset: usize) -> &'a AtomicU8 {
        assert!(offset < self.len);
        // SAFETY: as for `u64`.
        unsafe { AtomicU8::from_ptr(self.base.add(offset)) }
    }

    /// Writes `bytes` at `offset`. Only the writing process writes a slot it holds;
    /// readers read it after that process is gone, or after its state was published
    /// with a release store.
    pub fn write_bytes(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        for (i, b) in bytes.iter().enumerate() {
            self.u8(offset + i).store(*b, Ordering::Relaxed);
        }
    }

    /// Reads `len` bytes at `offset`.
    pub fn read_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.len);
        (0..len)
            .map(|i| self.u8(offset + i).load(Ordering::Relaxed))
            .collect()
    }
}
