//! Guest memory for the fake VM: one memfd-backed region shared with the backend
//! through VHOST_USER_SET_MEM_TABLE, plus a first-fit allocator for vrings and
//! request buffers.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::sync::{Arc, Mutex};

use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{Address, Bytes, FileOffset, GuestAddress, GuestMemory as _, GuestMemoryMmap};

use super::error::{Error, Result};

/// Allocation granularity: keeps every buffer cache-line aligned, which also
/// satisfies the vring alignment rules (16 for descriptors, 4 for used ring).
const ALLOC_ALIGN: u64 = 64;

/// Guest physical memory shared with the backend.
pub struct GuestMemory {
    mmap: GuestMemoryMmap,
    size: u64,
    free_ranges: Mutex<FreeRanges>,
}

impl GuestMemory {
    /// Creates `size` bytes of guest memory at guest physical address 0,
    /// backed by a memfd so the backend can map it.
    pub fn new(size: u64) -> Result<Arc<Self>> {
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(Error::InvalidArgument(format!(
                "guest memory size {size} must be a non-zero multiple of 4096"
            )));
        }
        let name = CString::new("volfsd-frontend-guest-ram").expect("static name has no NUL");
        let fd =
            nix::sys::memfd::memfd_create(&name, nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
                .map_err(|e| Error::io("memfd_create for guest memory", e.into()))?;
        let file = File::from(fd);
        file.set_len(size)
            .map_err(|e| Error::io(format!("resizing guest memfd to {size} bytes"), e))?;
        let mmap = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            size as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .map_err(|e| {
            Error::io(
                "mapping guest memfd",
                std::io::Error::other(format!("{e:?}")),
            )
        })?;
        Ok(Arc::new(GuestMemory {
            mmap,
            size,
            free_ranges: Mutex::new(FreeRanges::new(0, size)),
        }))
    }

    /// Total size in bytes; valid guest addresses are `0..size()`.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The vm-memory view, for reading and writing guest memory.
    pub fn mmap(&self) -> &GuestMemoryMmap {
        &self.mmap
    }

    /// The region description sent to the backend in SET_MEM_TABLE.
    pub fn region_info(&self) -> Result<VhostUserMemoryRegionInfo> {
        let region = self
            .mmap
            .iter()
            .next()
            .ok_or_else(|| Error::InvalidArgument("guest memory has no region".into()))?;
        VhostUserMemoryRegionInfo::from_guest_region(region)
            .map_err(|e| Error::vhost("describing guest memory region", e))
    }

    /// Host virtual address of a guest address: vhost-user vring addresses are
    /// given in the frontend's address space.
    pub fn host_address(&self, addr: GuestAddress) -> Result<u64> {
        self.mmap
            .get_host_address(addr)
            .map(|p| p as u64)
            .map_err(|e| Error::memory(format!("host address of {:#x}", addr.0), e))
    }

    /// Allocates `len` bytes (rounded up to 64) of zeroed guest memory.
    pub fn alloc(self: &Arc<Self>, len: u64) -> Result<GuestBuffer> {
        let rounded = len.max(1).div_ceil(ALLOC_ALIGN) * ALLOC_ALIGN;
        let addr = self
            .free_ranges
            .lock()
            .expect("allocator lock poisoned")
            .take(rounded)
            .ok_or(Error::OutOfGuestMemory { requested: len })?;
        let buf = GuestBuffer {
            memory: Arc::clone(self),
            addr: GuestAddress(addr),
            len,
            reserved: rounded,
        };
        buf.fill(0)?;
        Ok(buf)
    }

    /// Bytes currently free in the allocator (for leak checks and statistics).
    pub fn free_bytes(&self) -> u64 {
        self.free_ranges
            .lock()
            .expect("allocator lock poisoned")
            .total()
    }

    fn release(&self, addr: u64, len: u64) {
        self.free_ranges
            .lock()
            .expect("allocator lock poisoned")
            .give_back(addr, len);
    }
}

/// A range of guest memory owned by the frontend; returned to the allocator on drop.
pub struct GuestBuffer {
    memory: Arc<GuestMemory>,
    addr: GuestAddress,
    len: u64,
    reserved: u64,
}

impl GuestBuffer {
    /// Guest physical address of the first byte.
    pub fn addr(&self) -> GuestAddress {
        self.addr
    }

    /// Usable length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        self.memory
            .mmap
            .write_slice(data, self.addr.unchecked_add(offset))
            .map_err(|e| Error::memory(format!("writing buffer at {:#x}", self.addr.0), e))
    }

    /// Reads `len` bytes starting at `offset`.
    pub fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check_range(offset, len)?;
        let mut out = vec![0u8; len as usize];
        self.memory
            .mmap
            .read_slice(&mut out, self.addr.unchecked_add(offset))
            .map_err(|e| Error::memory(format!("reading buffer at {:#x}", self.addr.0), e))?;
        Ok(out)
    }

    /// Sets every byte to `byte` (used to poison reply buffers so stale data is detectable).
    pub fn fill(&self, byte: u8) -> Result<()> {
        let pattern = vec![byte; self.len as usize];
        self.write_at(0, &pattern)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} outside buffer of {} bytes",
                self.len
            ))),
        }
    }
}

impl Drop for GuestBuffer {
    fn drop(&mut self) {
        self.memory.release(self.addr.0, self.reserved);
    }
}

impl std::fmt::Debug for GuestBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GuestBuffer({:#x}+{})", self.addr.0, self.len)
    }
}

/// First-fit free list of [start, start+len) ranges, coalesced on release.
struct FreeRanges {
    ranges: BTreeMap<u64, u64>,
}

impl FreeRanges {
    fn new(start: u64, len: u64) -> Self {
        let mut ranges = BTreeMap::new();
        ranges.insert(start, len);
        FreeRanges { ranges }
    }

    fn take(&mut self, len: u64) -> Option<u64> {
        let (&start, &free_len) = self.ranges.iter().find(|(_, &l)| l >= len)?;
        self.ranges.remove(&start);
        if free_len > len {
            self.ranges.insert(start + len, free_len - len);
        }
        Some(start)
    }

    fn give_back(&mut self, mut start: u64, mut len: u64) {
        // Merge with the preceding range if it ends where this one starts.
        if let Some((&prev_start, &prev_len)) = self.ranges.range(..start).next_back() {
            if prev_start + prev_len == start {
                self.ranges.remove(&prev_start);
                start = prev_start;
                len += prev_len;
            }
        }
        // Merge with the following range if it starts where this one ends.
        if let Some(&next_len) = self.ranges.get(&(start + len)) {
            self.ranges.remove(&(start + len));
            len += next_len;
        }
        self.ranges.insert(start, len);
    }

    fn total(&self) -> u64 {
        self.ranges.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ranges_coalesce_back_to_one_range() {
        let mut fr = FreeRanges::new(0, 1024);
        let a = fr.take(64).unwrap();
        let b = fr.take(128).unwrap();
        let c = fr.take(64).unwrap();
        assert_eq!((a, b, c), (0, 64, 192));
        fr.give_back(b, 128);
        assert_eq!(fr.take(100), Some(64), "first fit reuses the hole");
        fr.give_back(64, 100);
        assert_eq!(fr.ranges.len(), 2, "64..192 merged, 256.. separate");
        fr.give_back(a, 64);
        fr.give_back(c, 64);
        assert_eq!(fr.ranges.len(), 1);
        assert_eq!(fr.total(), 1024);
    }

    #[test]
    fn alloc_zeroes_and_drop_returns_memory() {
        let mem = GuestMemory::new(1 << 20).unwrap();
        let before = mem.free_bytes();
        {
            let buf = mem.alloc(100).unwrap();
            buf.write_at(0, b"hello").unwrap();
            assert_eq!(buf.read_at(0, 5).unwrap(), b"hello");
            assert_eq!(buf.read_at(5, 3).unwrap(), vec![0; 3]);
            assert!(buf.write_at(98, b"xyz").is_err());
            assert_eq!(mem.free_bytes(), before - 128);
        }
        assert_eq!(mem.free_bytes(), before);
        assert!(matches!(
            mem.alloc(2 << 20),
            Err(Error::OutOfGuestMemory { .. })
        ));
        assert!(mem.region_info().unwrap().mmap_handle >= 0);
    }
}
