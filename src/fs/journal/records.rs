//! The journal's records as the slots hold them: what each kind is, its fields'
//! offsets (the layout in `mod.rs`), encoded for a write, and read back from a half
//! whose every byte is untrusted (a dead process, or a frontend, wrote it).

use std::sync::atomic::Ordering;

use crate::region::{HalfView, SlotClass, SlotPtr};

pub(super) const STATE: usize = 0;
/// Kind (bits 0-7), handle length (8-15), name length (16-31).
pub(super) const META: usize = 4;
pub(super) const SEQ: usize = 8;
const ID: usize = 16;
pub(super) const COUNT: usize = 24;
const PARENT: usize = 32;
const VOLUME: usize = 40;
const DEV: usize = 48;
const INO: usize = 56;
/// The file type, and the handle type above it.
const FILE_TYPE: usize = 64;
const MNT_ID: usize = 72;
/// Where a slot's data starts.
pub const DATA: usize = 80;

pub(super) const FREE: u32 = 0;
pub(super) const LIVE: u32 = 1;

/// The kernel's MAX_HANDLE_SZ: a longer one is no file handle.
pub const MAX_HANDLE: usize = 128;
/// Bytes of one lock range in a lock record: start, end, kind.
const RANGE: usize = 24;

/// What a record is.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
#[repr(u8)]
pub(super) enum Kind {
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

/// Whether the slot holds a live node record that names the node `name` in
/// `parent` (where it was found, or moved to since).
pub(super) fn names_node(p: &SlotPtr<'_>, parent: u64, name: &[u8]) -> bool {
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

/// The largest data a slot holds.
const MAX_DATA: usize = crate::region::LARGE_SLOT - DATA;

/// A record as it goes into a slot: its meta word, its u64 fields, its data.
pub(super) struct Encoded {
    pub(super) meta: u32,
    pub(super) fields: [(usize, u64); 8],
    pub(super) nfields: usize,
    pub(super) data: [u8; MAX_DATA],
    pub(super) len: usize,
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
pub(super) fn encode(record: &Record<&[u8]>) -> Option<Encoded> {
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

/// A handle record's count: its flags, and its flock kind + 1 (0: none) above them.
pub(super) fn handle_count(flags: i32, flock: i32) -> u64 {
    let lock = if flock == libc::F_UNLCK {
        0
    } else {
        (flock + 1) as u32 as u64
    };
    (flags as u32 as u64) | (lock << 32)
}
