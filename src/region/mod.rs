//! The session region: one shared memory file (a memfd) per daemon under a keeper,
//! made by the keeper and mapped by each serving process, that outlives a serving
//! process killed under a running guest. A new serving process finds in it what the
//! dead one had: which requests it had taken off each ring and not answered yet
//! (`device/inflight.rs`), and the guest's node ids, handles and locks, recorded as
//! they changed (`fs/journal/`). It also holds the daemon's keeper counters
//! (upgrades, crashes, recoveries), which every serving process shows in `/metrics`.
//!
//! ```text
//! 0        header: magic, layout, the current journal half, counters   (4 KiB)
//! 4 KiB    per queue: the published used index and, per descriptor, 0 or the
//!          order in which it was taken (MAX_QUEUES x QUEUE_AREA)
//! VOLUMES  the attached volumes (the control API's bodies, JSON), twice: the
//!          keeper writes the slot not in use, then switches (2 x VOLUMES_SLOT)
//! HALVES   two journal halves, each a header page and its slots
//! ```
//!
//! Two journal halves, so that a process started for an upgrade records into its
//! own while the old one may still write into its half (a lock wait that ends after
//! the rings stopped): the keeper makes the new half current only when the new
//! process has taken over ([`Header::set_current`]).
//!
//! The file is sparse: only what is written takes memory. Every field is read and
//! written through atomics: other processes map the same pages. The bytes are
//! native-endian: the region never leaves the host (cloud-hypervisor keeps its fd
//! across a restart of the daemon, on the same host).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

mod counters;
mod halves;
pub use counters::{Counters, PauseKind};
pub use halves::{Half, HalfView, SlotClass, SlotPtr};

/// "VOLFSDRG", the first 8 bytes.
const MAGIC: u64 = u64::from_le_bytes(*b"VOLFSDRG");
/// The layout this daemon reads and writes.
pub const VERSION: u32 = 2;
/// Queues the region has room for: the hiprio queue and 63 request queues.
pub const MAX_QUEUES: usize = 64;
/// Descriptors per queue it has room for (the largest ring the device accepts).
pub const QUEUE_SIZE: usize = 1024;

const PAGE: usize = 4096;
const HEADER_LEN: usize = PAGE;
/// A queue's area: its used index (8 bytes with padding), its descriptor table's
/// address, its counter, and one u64 per descriptor.
pub const QUEUE_AREA: usize = 24 + 8 * QUEUE_SIZE;
const QUEUES_OFFSET: usize = HEADER_LEN;
const QUEUES_END: usize = QUEUES_OFFSET + MAX_QUEUES * QUEUE_AREA;

/// A journal slot's bytes: a small one (most records) and a large one (a long name,
/// a large file handle, many lock ranges).
pub const SMALL_SLOT: usize = 128;
pub const LARGE_SLOT: usize = 512;
/// Slots per half: room for two million small records (a guest holding a million
/// files and a million open handles) and 128 Ki large ones, 320 MiB of address
/// space of which only the written pages take memory.
pub const SMALL_SLOTS: usize = 1 << 21;
pub const LARGE_SLOTS: usize = 1 << 17;
/// A half: its header page, then its small slots, then its large ones.
pub const HALF_HEADER: usize = PAGE;
pub const HALF_LEN: usize = HALF_HEADER + SMALL_SLOTS * SMALL_SLOT + LARGE_SLOTS * LARGE_SLOT;
/// A volumes slot: its length (u64), then the JSON; as long as the longest
/// `volumes` line the keeper takes (keeper/channel.rs).
pub const VOLUMES_SLOT: usize = 1 << 20;
const VOLUMES_OFFSET: usize = QUEUES_END.div_ceil(PAGE) * PAGE;
const HALVES_OFFSET: usize = VOLUMES_OFFSET + 2 * VOLUMES_SLOT;
/// The whole region.
pub const REGION_LEN: usize = HALVES_OFFSET + 2 * HALF_LEN;

/// The region's areas: (what, offset, length). For a reader checking a region from
/// outside (the `region` fuzz target writes hostile bytes into them).
pub const AREAS: [(&str, usize, usize); 5] = [
    ("header", 0, HEADER_LEN),
    ("queues", QUEUES_OFFSET, QUEUES_END - QUEUES_OFFSET),
    ("volumes", VOLUMES_OFFSET, 2 * VOLUMES_SLOT),
    ("journal half A", HALVES_OFFSET, HALF_LEN),
    ("journal half B", HALVES_OFFSET + HALF_LEN, HALF_LEN),
];

/// What went wrong with a region, with what was being done.
#[derive(Debug)]
pub enum RegionError {
    Host {
        what: &'static str,
        source: io::Error,
    },
    /// Not a region of this layout (another daemon's, another version, too small).
    Layout(String),
}

impl std::fmt::Display for RegionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegionError::Host { what, source } => write!(f, "session region: {what}: {source}"),
            RegionError::Layout(why) => write!(f, "session region: {why}"),
        }
    }
}

impl std::error::Error for RegionError {}

fn host(what: &'static str) -> impl Fn(io::Error) -> RegionError {
    move |source| RegionError::Host { what, source }
}

/// The region, mapped.
pub struct Region {
    base: *mut u8,
    file: File,
}

// SAFETY: the mapping is shared memory accessed only through atomics and raw byte
// copies (journal data), never through references to non-atomic data; the pointer
// stays valid until drop.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// A new, empty region (the keeper's, at start).
    pub fn create() -> Result<Region, RegionError> {
        let fd = nix::sys::memfd::memfd_create(
            c"volfsd-session",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC
                | nix::sys::memfd::MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(|e| host("memfd_create")(e.into()))?;
        let file = File::from(fd);
        file.set_len(REGION_LEN as u64)
            .map_err(host("sizing the memfd"))?;
        // Its size for good: a mapping of a file that shrinks faults (SIGBUS), and
        // the fd goes to the frontend (GET_INFLIGHT_FD), which could truncate it.
        // SAFETY: fcntl on our own fd.
        let sealed = unsafe {
            libc::fcntl(
                file.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        };
        if sealed != 0 {
            return Err(host("sealing the memfd")(io::Error::last_os_error()));
        }
        let region = Region::map(file)?;
        let h = region.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.queues.store(MAX_QUEUES as u32, Ordering::Relaxed);
        h.queue_size.store(QUEUE_SIZE as u32, Ordering::Relaxed);
        h.region_len.store(REGION_LEN as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(region)
    }

    /// The region of `fd` (inherited from the keeper, or handed back by a frontend
    /// that kept it), checked to be one of this layout.
    pub fn open(fd: OwnedFd) -> Result<Region, RegionError> {
        let file = File::from(fd);
        // Only a region sealed at its size is mapped: one handed back by a frontend
        // could otherwise be truncated under the mapping (SIGBUS in the keeper).
        // SAFETY: fcntl on an fd we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(RegionError::Layout(
                "not a volfsd session region: not a memfd sealed against shrinking".into(),
            ));
        }
        let len = file.metadata().map_err(host("fstat"))?.len();
        if len < REGION_LEN as u64 {
            return Err(RegionError::Layout(format!(
                "{len} bytes, {REGION_LEN} expected"
            )));
        }
        let region = Region::map(file)?;
        let h = region.header();
        let found = (
            h.magic.load(Ordering::Acquire),
            h.version.load(Ordering::Relaxed),
            h.queues.load(Ordering::Relaxed) as usize,
            h.queue_size.load(Ordering::Relaxed) as usize,
            h.region_len.load(Ordering::Relaxed) as usize,
        );
        if found != (MAGIC, VERSION, MAX_QUEUES, QUEUE_SIZE, REGION_LEN) {
            return Err(RegionError::Layout(format!(
                "not a volfsd session region of layout {VERSION} (magic {:#x}, version {}, \
                 {} queues of {}, {} bytes)",
                found.0, found.1, found.2, found.3, found.4
            )));
        }
        Ok(region)
    }

    fn map(file: File) -> Result<Region, RegionError> {
        // SAFETY: a shared mapping of a file we own, of its whole length; checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(host("mmap")(io::Error::last_os_error()));
        }
        Ok(Region {
            base: base as *mut u8,
            file,
        })
    }

    /// The memfd, to hand to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// A pointer `offset` bytes into the region, of an object of `len` bytes.
    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset + len <= REGION_LEN, "session region: out of bounds");
        // SAFETY: in bounds of the mapping (checked).
        unsafe { self.base.add(offset) }
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the header is at 0, its size is within the first page, it is made
        // of atomics only, and the mapping lives as long as `self`.
        unsafe { &*(self.at(0, std::mem::size_of::<Header>()) as *const Header) }
    }

    /// The area of queue `index`, if the region has room for it.
    pub fn queue(&self, index: usize) -> Option<&QueueArea> {
        if index >= MAX_QUEUES {
            return None;
        }
        let p = self.at(QUEUES_OFFSET + index * QUEUE_AREA, QUEUE_AREA);
        // SAFETY: in bounds, aligned to 8, atomics only, lives as long as `self`.
        Some(unsafe { &*(p as *const QueueArea) })
    }

    /// Journal half `half` (0 or 1).
    pub fn half(&self, half: Half) -> HalfView<'_> {
        HalfView {
            region: self,
            offset: HALVES_OFFSET + half.index() * HALF_LEN,
        }
    }

    /// Keeps `json`, the volumes the serving process has attached, for the serving
    /// processes the keeper starts next (they attach them first): written into the
    /// slot not in use, which then becomes the one, so that a keeper killed while
    /// writing leaves the previous list whole. The keeper is the only writer.
    pub fn set_volumes(&self, json: &str) -> Result<(), RegionError> {
        if json.len() + 8 > VOLUMES_SLOT {
            return Err(RegionError::Layout(format!(
                "{} bytes of volumes, room for {}",
                json.len(),
                VOLUMES_SLOT - 8
            )));
        }
        let h = self.header();
        let next = if h.volumes_slot.load(Ordering::Acquire) == 1 {
            2
        } else {
            1
        };
        let at = VOLUMES_OFFSET + (next as usize - 1) * VOLUMES_SLOT;
        let len = self.at(at, 8) as *const AtomicU64;
        // SAFETY: in bounds, page-aligned, atomics only, lives as long as `self`.
        unsafe { &*len }.store(json.len() as u64, Ordering::Relaxed);
        for (i, b) in json.bytes().enumerate() {
            self.byte(at + 8 + i).store(b, Ordering::Relaxed);
        }
        h.volumes_slot.store(next, Ordering::Release);
        Ok(())
    }

    /// No list of volumes kept (a region handed back whose list is not this
    /// daemon's, when this daemon has none yet).
    pub fn forget_volumes(&self) {
        self.header().volumes_slot.store(0, Ordering::Release);
    }

    /// The attached volumes [`Region::set_volumes`] kept last (None: none, or not
    /// text).
    pub fn volumes(&self) -> Option<String> {
        let slot = self.header().volumes_slot.load(Ordering::Acquire);
        if slot != 1 && slot != 2 {
            return None;
        }
        let at = VOLUMES_OFFSET + (slot as usize - 1) * VOLUMES_SLOT;
        // SAFETY: as in set_volumes.
        let len = unsafe { &*(self.at(at, 8) as *const AtomicU64) }.load(Ordering::Relaxed);
        let len = usize::try_from(len)
            .ok()
            .filter(|l| l + 8 <= VOLUMES_SLOT)?;
        let bytes: Vec<u8> = (0..len)
            .map(|i| self.byte(at + 8 + i).load(Ordering::Relaxed))
            .collect();
        String::from_utf8(bytes).ok()
    }

    /// Writes `bytes` at `offset` (within the region): what a frontend that kept the
    /// region could have written into it before handing it back.
    pub fn write_raw(&self, offset: usize, bytes: &[u8]) {
        for (i, &b) in bytes.iter().enumerate() {
            self.byte(offset + i).store(b, Ordering::Relaxed);
        }
    }

    fn byte(&self, offset: usize) -> &AtomicU8 {
        // SAFETY: in bounds (checked by `at`); a byte needs no alignment.
        unsafe { &*(self.at(offset, 1) as *const AtomicU8) }
    }

    /// Forgets what half `half` recorded: its pages are given back (zeroes).
    pub fn clear_half(&self, half: Half) -> Result<(), RegionError> {
        self.punch(HALVES_OFFSET + half.index() * HALF_LEN, HALF_LEN)
    }

    /// Forgets every queue's requests in flight.
    pub fn clear_queues(&self) -> Result<(), RegionError> {
        self.punch(QUEUES_OFFSET, VOLUMES_OFFSET - QUEUES_OFFSET)
    }

    fn punch(&self, offset: usize, len: usize) -> Result<(), RegionError> {
        // SAFETY: fallocate on our own fd; the range is inside the file.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r != 0 {
            return Err(host("fallocate(PUNCH_HOLE)")(io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; nothing refers to it any more
        // (every view borrows `self`).
        unsafe { libc::munmap(self.base as *mut libc::c_void, REGION_LEN) };
    }
}

/// The region's first page.
#[repr(C)]
pub struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    queues: AtomicU32,
    queue_size: AtomicU32,
    /// The journal half the serving process of record writes (0 or 1).
    current: AtomicU32,
    region_len: AtomicU64,
    /// Whether a guest's session is recorded here (a frontend's rings ran): a region
    /// handed back after a restart of the whole daemon is recovered only then.
    in_session: AtomicU32,
    /// The volumes slot in use: 0 none written, 1 or 2.
    volumes_slot: AtomicU32,
    pub counters: Counters,
}

impl Header {
    /// The half the serving process of record writes.
    pub fn current(&self) -> Half {
        Half::from_index(self.current.load(Ordering::Acquire)).unwrap_or(Half::A)
    }

    /// Makes `half` the one of record (the keeper, once a new process took over).
    pub fn set_current(&self, half: Half) {
        self.current.store(half.index() as u32, Ordering::Release);
    }

    /// Whether a guest's session is recorded here (see the field).
    pub fn in_session(&self) -> bool {
        self.in_session.load(Ordering::Acquire) != 0
    }

    pub fn set_in_session(&self, on: bool) {
        self.in_session.store(u32::from(on), Ordering::Release);
    }
}

/// One queue's requests taken and not answered, as `device/inflight.rs` keeps them.
#[repr(C)]
pub struct QueueArea {
    /// The used index as last published (after the completion that set it).
    pub used_idx: AtomicU16,
    _pad: [AtomicU16; 3],
    /// The guest address of the descriptor table the heads belong to: a ring set
    /// up elsewhere since is another ring.
    pub desc_table: AtomicU64,
    /// The order given to the next request taken.
    pub counter: AtomicU64,
    /// Per descriptor head: 0, or the order in which it was taken.
    pub heads: [AtomicU64; QUEUE_SIZE],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_fits_and_is_aligned() {
        assert!(std::mem::size_of::<Header>() <= HEADER_LEN);
        assert_eq!(VOLUMES_OFFSET % PAGE, 0);
        assert_eq!(std::mem::size_of::<QueueArea>(), QUEUE_AREA);
        assert!(std::mem::size_of::<halves::HalfHeader>() <= HALF_HEADER);
        assert_eq!(HALVES_OFFSET % PAGE, 0);
        assert_eq!(HALF_LEN % PAGE, 0);
        assert_eq!(QUEUE_AREA % 8, 0);
    }

    #[test]
    fn a_region_is_seen_again_through_its_fd_and_a_foreign_file_is_refused() {
        let r = Region::create().unwrap();
        r.header().counters.crashes.fetch_add(3, Ordering::Relaxed);
        r.queue(5).unwrap().heads[7].store(42, Ordering::Relaxed);
        let slot = r.half(Half::B).slot(SlotClass::Large, 9).unwrap();
        slot.write_bytes(100, b"name");
        r.header().set_current(Half::B);
        let again = Region::open(r.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(again.header().counters.crashes.load(Ordering::Relaxed), 3);
        assert_eq!(again.queue(5).unwrap().heads[7].load(Ordering::Relaxed), 42);
        let slot = again.half(Half::B).slot(SlotClass::Large, 9).unwrap();
        assert_eq!(slot.read_bytes(100, 4), b"name");
        assert_eq!(again.header().current(), Half::B);
        assert!(again.queue(MAX_QUEUES).is_none());
        assert!(again
            .half(Half::A)
            .slot(SlotClass::Small, SMALL_SLOTS)
            .is_none());

        // A half cleared reads as zeroes; the other half and the header stay.
        again.clear_half(Half::B).unwrap();
        again.set_volumes("[]").unwrap();
        assert_eq!(slot.read_bytes(100, 4), vec![0; 4]);
        assert_eq!(r.header().counters.crashes.load(Ordering::Relaxed), 3);
        again.clear_queues().unwrap();
        assert_eq!(r.queue(5).unwrap().heads[7].load(Ordering::Relaxed), 0);
        assert_eq!(
            r.volumes().as_deref(),
            Some("[]"),
            "the volumes are no queue's"
        );

        // A file that is not a region, or too small, is refused.
        let other =
            nix::sys::memfd::memfd_create(c"other", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
                .unwrap();
        let f = File::from(other.try_clone().unwrap());
        assert!(matches!(Region::open(other), Err(RegionError::Layout(_))));
        f.set_len(REGION_LEN as u64).unwrap();
        let e = Region::open(f.into()).err().unwrap();
        assert!(e.to_string().contains("not a volfsd session region"), "{e}");
        // The region's own fd cannot be shrunk (it goes to the frontend).
        let ours = File::from(r.fd().try_clone_to_owned().unwrap());
        assert!(ours.set_len(4096).is_err(), "sealed against shrinking");
        // A memfd sealed at the size with another layout is refused by its header.
        let sealed = nix::sys::memfd::memfd_create(
            c"sealed",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC
                | nix::sys::memfd::MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .unwrap();
        let f = File::from(sealed);
        f.set_len(REGION_LEN as u64).unwrap();
        // SAFETY: fcntl on our own fd.
        assert_eq!(
            unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
            0
        );
        let e = Region::open(f.into()).err().unwrap();
        assert!(e.to_string().contains("layout"), "{e}");
    }

    #[test]
    fn the_volumes_kept_are_the_last_written_and_seen_again_through_the_fd() {
        let r = Region::create().unwrap();
        assert_eq!(r.volumes(), None);
        r.set_volumes(r#"[{"name":"a"}]"#).unwrap();
        r.set_volumes(r#"[{"name":"a"},{"name":"b"}]"#).unwrap();
        r.set_volumes("[]").unwrap();
        let again = Region::open(r.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(again.volumes().as_deref(), Some("[]"));
        let huge = "x".repeat(VOLUMES_SLOT);
        assert!(r.set_volumes(&huge).is_err());
        assert_eq!(
            again.volumes().as_deref(),
            Some("[]"),
            "a refused list changes nothing"
        );
        r.forget_volumes();
        assert_eq!(again.volumes(), None, "a list forgotten is no list");
    }

    #[test]
    fn pauses_are_counted_with_their_maximum_and_last() {
        let r = Region::create().unwrap();
        let c = &r.header().counters;
        c.add_pause(PauseKind::Upgrade, std::time::Duration::from_millis(7));
        c.add_pause(PauseKind::Upgrade, std::time::Duration::from_millis(3));
        let p = c.pauses(PauseKind::Upgrade);
        assert_eq!(p.count.load(Ordering::Relaxed), 2);
        assert_eq!(p.total_us.load(Ordering::Relaxed), 10_000);
        assert_eq!(p.max_us.load(Ordering::Relaxed), 7_000);
        assert_eq!(p.last_us.load(Ordering::Relaxed), 3_000);
        assert_eq!(
            c.pauses(PauseKind::Recovery).count.load(Ordering::Relaxed),
            0
        );
    }
}
