//! The dirty-page log of guest memory, for live migration: the bitmap each guest
//! memory region carries. Once the frontend sent SET_LOG_BASE, every write the daemon
//! makes through vm-memory sets the log bits of the pages it touched
//! (`log[page / 8] |= 1 << (page % 8)`, `page = guest physical address / 4096`).
//!
//! vhost-user-backend's own `BitmapMmapRegion` does the same, but costs a request
//! about 0.6 µs when no migration runs (`harness/benches/dirty_log_cost.rs`), a
//! fifth of a small request: every guest-memory slice vm-memory makes (several per
//! descriptor read, reply write and used-ring update) clones its `Arc`, and every
//! write takes its `RwLock`. Here a slice borrows the region's bitmap (no reference
//! count), and a write without a log reads one flag.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapReplace, MemRegionBitmap, MmapLogReg};
use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;
use vm_memory::{Address, GuestMemory, GuestMemoryMmap, GuestMemoryRegion, MmapRegion};

/// The page size of the vhost-user dirty log.
const LOG_PAGE: usize = 4096;

/// A guest memory region's bitmap. Clones share the log, as vhost-user-backend's do.
#[derive(Clone, Debug, Default)]
pub struct LogBitmap {
    log: Arc<RegionLog>,
}

#[derive(Debug, Default)]
struct RegionLog {
    /// Set with a log, cleared when LOG_ALL is turned off ([`stop_logging`]): without
    /// it a write reads this flag only. Every guest-memory write of the daemon happens
    /// under a vring's lock, and SET_FEATURES (which turns LOG_ALL on after
    /// SET_LOG_BASE) takes every vring's lock: a request served after it sees the
    /// flag.
    logging: AtomicBool,
    /// The region's part of the frontend's log. A lock, because cloud-hypervisor
    /// hands a new log at every round and the old one is unmapped once no write
    /// uses it.
    current: RwLock<Option<PageLog>>,
}

impl RegionLog {
    #[inline]
    fn mark_dirty(&self, offset: usize, len: usize) {
        if len == 0 || !self.logging.load(Ordering::Acquire) {
            return;
        }
        self.mark_logged(offset, len);
    }

    /// A log was given (a migration runs): kept out of line, so that what every
    /// write inlines without a log is the flag's load.
    #[inline(never)]
    fn mark_logged(&self, offset: usize, len: usize) {
        if let Some(log) = self.current.read().unwrap().as_ref() {
            log.mark_dirty(offset, len);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.logging.load(Ordering::Acquire)
            && self
                .current
                .read()
                .unwrap()
                .as_ref()
                .is_some_and(|log| log.dirty_at(offset))
    }
}

/// One region's view of the frontend's log.
#[derive(Debug)]
pub struct PageLog {
    logmem: Arc<MmapLogReg>,
    /// The region's guest physical address and length.
    start: usize,
    len: usize,
}

impl PageLog {
    /// The log pages of `[offset, offset + len)` (region-relative, `len` > 0), cut
    /// at the region's end.
    fn pages(&self, offset: usize, len: usize) -> std::ops::RangeInclusive<usize> {
        page_range(self.start, self.len, offset, len)
    }

    fn mark_dirty(&self, offset: usize, len: usize) {
        for page in self.pages(offset, len) {
            // In bounds: `new` checked that the log covers the region's last page.
            self.logmem[page / 8].fetch_or(1 << (page % 8), Ordering::Relaxed);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.pages(offset, 1)
            .any(|page| self.logmem[page / 8].load(Ordering::Relaxed) & (1 << (page % 8)) != 0)
    }
}

/// The log pages of bytes `[offset, offset + len)` of a region at guest physical
/// address `start`, `region_len` bytes long; empty when the range starts past the
/// region's end.
fn page_range(
    start: usize,
    region_len: usize,
    offset: usize,
    len: usize,
) -> std::ops::RangeInclusive<usize> {
    let end = offset.saturating_add(len).min(region_len);
    if len == 0 || offset >= end {
        #[allow(clippy::reversed_empty_ranges)]
        return 1..=0;
    }
    (start + offset) / LOG_PAGE..=(start + end - 1) / LOG_PAGE
}

impl MemRegionBitmap for PageLog {
    fn new<R: GuestMemoryRegion>(region: &R, logmem: Arc<MmapLogReg>) -> io::Result<Self> {
        // vhost-user-backend's own check that the log covers the region (its length
        // is not public): an error refuses the SET_LOG_BASE.
        AtomicBitmapMmap::new(region, logmem.clone())?;
        let start = usize::try_from(region.start_addr().raw_value())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let len = usize::try_from(region.len())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(PageLog { logmem, start, len })
    }
}

impl LogBitmap {
    /// No log any more: writes read the flag only, and the log is let go.
    fn stop(&self) {
        self.log.logging.store(false, Ordering::Release);
        *self.log.current.write().unwrap() = None;
    }
}

/// LOG_ALL was turned off (the migration ended or was cancelled): the regions of
/// `mem` stop logging until the next SET_LOG_BASE. vhost-user-backend 0.22 would keep
/// marking the last log for good, and a VM whose migration failed would pay for it on
/// every write.
pub fn stop_logging(mem: &GuestMemoryMmap<LogBitmap>) {
    for region in mem.iter() {
        let mapping: &MmapRegion<LogBitmap> = region;
        mapping.bitmap().stop();
    }
}

impl BitmapReplace for LogBitmap {
    type InnerBitmap = PageLog;

    fn replace(&self, log: PageLog) {
        *self.log.current.write().unwrap() = Some(log);
        self.log.logging.store(true, Ordering::Release);
    }
}

impl<'a> WithBitmapSlice<'a> for LogBitmap {
    type S = LogSlice<'a>;
}

impl Bitmap for LogBitmap {
    #[inline]
    fn mark_dirty(&self, offset: usize, len: usize) {
        self.log.mark_dirty(offset, len)
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.log.dirty_at(offset)
    }

    #[inline]
    fn slice_at(&self, offset: usize) -> LogSlice<'_> {
        LogSlice {
            log: Some(&self.log),
            base: offset,
        }
    }
}

impl NewBitmap for LogBitmap {
    fn with_len(_len: usize) -> Self {
        Self::default()
    }
}

/// A part of a region's bitmap, from `base` on: what vm-memory's slices of guest
/// memory carry. `Default` (no log) is what fuse-backend-rs gives buffers of the
/// daemon's own memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogSlice<'a> {
    log: Option<&'a RegionLog>,
    base: usize,
}

impl<'a> WithBitmapSlice<'_> for LogSlice<'a> {
    type S = Self;
}

impl BitmapSlice for LogSlice<'_> {}

impl Bitmap for LogSlice<'_> {
    #[inline]
    fn mark_dirty(&self, offset: usize, len: usize) {
        if let Some(log) = self.log {
            log.mark_dirty(self.base.saturating_add(offset), len)
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.log
            .is_some_and(|log| log.dirty_at(self.base.saturating_add(offset)))
    }

    #[inline]
    fn slice_at(&self, offset: usize) -> Self {
        LogSlice {
            log: self.log,
            base: self.base.saturating_add(offset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn pages_are_absolute_and_cut_at_the_region_end() {
        // A region of 4 pages at 1 MiB: page 256 is its first.
        let (start, len) = (1 << 20, 4 * LOG_PAGE);
        assert_eq!(page_range(start, len, 0, 1), 256..=256);
        assert_eq!(page_range(start, len, 4095, 2), 256..=257);
        assert_eq!(page_range(start, len, 4096, 4096), 257..=257);
        assert_eq!(page_range(start, len, 100, 3 * LOG_PAGE), 256..=259);
        // Past the end: cut, or nothing.
        assert_eq!(page_range(start, len, 3 * LOG_PAGE, 1 << 20), 259..=259);
        assert!(page_range(start, len, 4 * LOG_PAGE, 1).is_empty());
        assert!(page_range(start, len, usize::MAX, 1).is_empty());
        assert!(page_range(start, len, 0, 0).is_empty());
        // A region that does not start on a page boundary still logs the pages of
        // the addresses written.
        assert_eq!(page_range(0x1800, 0x2000, 0x700, 0x200), 1..=2);
    }

    #[test]
    fn without_a_log_writes_go_through_and_nothing_is_dirty() {
        let mem = GuestMemoryMmap::<LogBitmap>::from_ranges(&[(GuestAddress(0), 1 << 16)]).unwrap();
        mem.write_slice(&[1; 100], GuestAddress(0x1000)).unwrap();
        let mut back = [0u8; 100];
        mem.read_slice(&mut back, GuestAddress(0x1000)).unwrap();
        assert_eq!(back, [1; 100]);
        let region = mem.iter().next().unwrap();
        assert!(!region.bitmap().dirty_at(0x1000));
        assert!(!LogSlice::default().dirty_at(0));
    }
}
