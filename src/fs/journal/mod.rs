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

pub mod rebuild;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::region::{Half, HalfView, Region, SlotClass, SlotPtr};

const STATE: usize = 0;
/// Kind (bits 0-7), handle length (8-15), name length (16-31).
const META: usize = 4;
const SEQ: usize = 8;
const ID: usize = 16;
const COUNT: usize = 24;
const PARENT: usize = 32;
const VOLUME: usize = 40;
const DEV: usize = 48;
const INO: usize = 56;
/// The file type, and the handle type above it.
const FILE_TYPE: usize = 64;
const MNT_ID: usize = 72;
/// Where a slot's data starts.
pub const DATA: usize = 80;

const FREE: u32 = 0;
const LIVE: u32 = 1;

/// The kernel's MAX_HANDLE_SZ: a longer one is no file handle.
pub const MAX_HANDLE: usize = 128;
/// Bytes of one lock range in a lock record: start, end, kind.
const RANGE: usize = 24;

/// What a record is.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
#[repr(u8)]
enum Kind {
    Root = 1,
    Node = 2,
    Handle = 3,
    Lock = 4,
    VirtualDir = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Root,
            2 => Kind::Node,
            3 => Kind::Handle,
            4 => Kind::Lock,
            5 => Kind::VirtualDir,
            _ => return None,
        })
    }
}

/// A node's file handle, as `name_to_handle_at` made it.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct Handle<B> {
    pub handle_type: i32,
    pub bytes: B,
}

/// One record, over borrowed bytes (written) or owned ones (read back).
#[derive(Clone, Debug, Eq, PartialEq)]
pub enum Record<B> {
    /// A volume's root: its node id and its name.
    Root { id: u64, name: B },
    /// A node the guest holds.
    Node(NodeRecord<B>),
    /// An open file or directory: its id, its node, its host open flags, the flock
    /// held through it.
    Handle {
        id: u64,
        node: u64,
        flags: i32,
        flock: Option<i32>,
    },
    /// One owner's POSIX locks on a node, with the lock file's access mode.
    Lock {
        node: u64,
        owner: u64,
        access: i32,
        ranges: Vec<(u64, u64, i32)>,
    },
    /// A virtual directory above nested volumes: its id and guest path.
    VirtualDir { id: u64, path: B },
}

/// A node: where it was found (its parent and name then), on which volume (the
/// root's id), which inode (device, inode number, mount id), and its file handle.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct NodeRecord<B> {
    pub id: u64,
    pub lookups: u64,
    pub parent: u64,
    pub name: B,
    pub volume: u64,
    pub file_type: u32,
    pub dev: u64,
    pub ino: u64,
    pub mnt_id: u32,
    pub handle: Option<Handle<B>>,
}

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
        if p.u32(STATE).load(Ordering::Acquire) != LIVE {
            return false;
        }
        let meta = p.u32(META).load(Ordering::Relaxed);
        let (hlen, nlen) = ((meta >> 8) as u8 as usize, (meta >> 16) as usize);
        Kind::from_u8(meta as u8) == Some(Kind::Node)
            && nlen == name.len()
            && hlen + nlen <= p.len() - DATA
            && p.u64(PARENT).load(Ordering::Relaxed) == parent
            && p.read_bytes(DATA + hlen, nlen) == name
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

/// A handle record's count: its flags, and its flock kind + 1 (0: none) above them.
fn handle_count(flags: i32, flock: i32) -> u64 {
    let lock = if flock == libc::F_UNLCK {
        0
    } else {
        (flock + 1) as u32 as u64
    };
    (flags as u32 as u64) | (lock << 32)
}

/// The largest data a slot holds.
const MAX_DATA: usize = crate::region::LARGE_SLOT - DATA;

/// A record as it goes into a slot: its meta word, its u64 fields, its data.
struct Encoded {
    meta: u32,
    fields: [(usize, u64); 8],
    nfields: usize,
    data: [u8; MAX_DATA],
    len: usize,
}

impl Encoded {
    fn new() -> Encoded {
        Encoded {
            meta: 0,
            fields: [(0, 0); 8],
            nfields: 0,
            data: [0; MAX_DATA],
            len: 0,
        }
    }

    fn field(&mut self, offset: usize, value: u64) {
        self.fields[self.nfields] = (offset, value);
        self.nfields += 1;
    }

    /// Appends `bytes`; false when they do not fit.
    fn push(&mut self, bytes: &[u8]) -> bool {
        let Some(room) = self.data.get_mut(self.len..self.len + bytes.len()) else {
            return false;
        };
        room.copy_from_slice(bytes);
        self.len += bytes.len();
        true
    }
}

/// A record as a slot holds it; None when it is too long for any slot.
fn encode(record: &Record<&[u8]>) -> Option<Encoded> {
    let mut e = Encoded::new();
    let (kind, hlen, nlen) = match record {
        Record::Root { id, name } => {
            e.field(ID, *id);
            if !e.push(name) {
                return None;
            }
            (Kind::Root, 0, name.len())
        }
        Record::Node(n) => {
            let handle = n.handle.as_ref().filter(|h| h.bytes.len() <= MAX_HANDLE);
            let hlen = handle.map_or(0, |h| h.bytes.len());
            if let Some(h) = handle {
                e.push(h.bytes);
            }
            // A name that makes the record too long is left out where a file handle
            // finds the node anyway.
            let name: &[u8] = if hlen + n.name.len() > MAX_DATA {
                &[]
            } else {
                n.name
            };
            if !e.push(name) || (hlen == 0 && name.is_empty() && !n.name.is_empty()) {
                return None;
            }
            e.field(ID, n.id);
            e.field(COUNT, n.lookups);
            e.field(PARENT, n.parent);
            e.field(VOLUME, n.volume);
            e.field(DEV, n.dev);
            e.field(INO, n.ino);
            e.field(
                FILE_TYPE,
                u64::from(n.file_type) | (handle.map_or(0, |h| h.handle_type) as u32 as u64) << 32,
            );
            e.field(MNT_ID, u64::from(n.mnt_id));
            (Kind::Node, hlen, name.len())
        }
        Record::Handle {
            id,
            node,
            flags,
            flock,
        } => {
            e.field(ID, *id);
            e.field(COUNT, handle_count(*flags, flock.unwrap_or(libc::F_UNLCK)));
            e.field(PARENT, *node);
            (Kind::Handle, 0, 0)
        }
        Record::Lock {
            node,
            owner,
            access,
            ranges,
        } => {
            for &(start, end, kind) in ranges {
                let ok = e.push(&start.to_ne_bytes())
                    && e.push(&end.to_ne_bytes())
                    && e.push(&(kind as i64).to_ne_bytes());
                if !ok {
                    return None;
                }
            }
            e.field(ID, *node);
            e.field(COUNT, *owner);
            e.field(
                PARENT,
                (*access as u32 as u64) | ((ranges.len() as u64) << 32),
            );
            (Kind::Lock, 0, 0)
        }
        Record::VirtualDir { id, path } => {
            e.field(ID, *id);
            if !e.push(path) {
                return None;
            }
            (Kind::VirtualDir, 0, path.len())
        }
    };
    e.meta = u32::from(kind as u8) | (hlen as u32) << 8 | (nlen as u32) << 16;
    Some(e)
}

/// A record read back, with its sequence number.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct ReadRecord {
    pub seq: u64,
    pub record: Record<Vec<u8>>,
}

/// Every live record of `half`, as a serving process that wrote it left it. The
/// bytes are treated as untrusted: a slot that does not decode is skipped.
pub fn read_half(half: HalfView<'_>) -> Vec<ReadRecord> {
    let h = half.header();
    let mut out = Vec::new();
    for (class, used) in [
        (SlotClass::Small, h.small_used.load(Ordering::Acquire)),
        (SlotClass::Large, h.large_used.load(Ordering::Acquire)),
    ] {
        for i in 0..(used as usize).min(class.count()) {
            let Some(p) = half.slot(class, i) else { break };
            if let Some(r) = decode(&p) {
                out.push(r);
            }
        }
    }
    out
}

fn decode(p: &SlotPtr<'_>) -> Option<ReadRecord> {
    if p.u32(STATE).load(Ordering::Acquire) != LIVE {
        return None;
    }
    let meta = p.u32(META).load(Ordering::Relaxed);
    let kind = Kind::from_u8(meta as u8)?;
    let hlen = (meta >> 8) as u8 as usize;
    let nlen = (meta >> 16) as usize;
    let room = p.len() - DATA;
    let f = |offset: usize| p.u64(offset).load(Ordering::Relaxed);
    let record = match kind {
        Kind::Root | Kind::VirtualDir => {
            if nlen > room {
                return None;
            }
            let name = p.read_bytes(DATA, nlen);
            match kind {
                Kind::Root => Record::Root { id: f(ID), name },
                _ => Record::VirtualDir {
                    id: f(ID),
                    path: name,
                },
            }
        }
        Kind::Node => {
            if hlen > MAX_HANDLE || hlen + nlen > room {
                return None;
            }
            let types = f(FILE_TYPE);
            Record::Node(NodeRecord {
                id: f(ID),
                lookups: f(COUNT),
                parent: f(PARENT),
                name: p.read_bytes(DATA + hlen, nlen),
                volume: f(VOLUME),
                file_type: types as u32,
                dev: f(DEV),
                ino: f(INO),
                mnt_id: f(MNT_ID) as u32,
                handle: (hlen > 0).then(|| Handle {
                    handle_type: (types >> 32) as u32 as i32,
                    bytes: p.read_bytes(DATA, hlen),
                }),
            })
        }
        Kind::Handle => {
            let count = f(COUNT);
            let lock = (count >> 32) as u32;
            Record::Handle {
                id: f(ID),
                node: f(PARENT),
                flags: count as u32 as i32,
                flock: (lock != 0).then(|| lock as i32 - 1),
            }
        }
        Kind::Lock => {
            let word = f(PARENT);
            let n = (word >> 32) as usize;
            if n * RANGE > room {
                return None;
            }
            let bytes = p.read_bytes(DATA, n * RANGE);
            let ranges = bytes
                .chunks_exact(RANGE)
                .map(|c| {
                    let w = |i: usize| u64::from_ne_bytes(c[i * 8..i * 8 + 8].try_into().unwrap());
                    (w(0), w(1), w(2) as i64 as i32)
                })
                .collect();
            Record::Lock {
                node: f(ID),
                owner: f(COUNT),
                access: word as u32 as i32,
                ranges,
            }
        }
    };
    Some(ReadRecord {
        seq: f(SEQ),
        record,
    })
}

#[cfg(test)]
mod agreement;
#[cfg(test)]
mod tests;
