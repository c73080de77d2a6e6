//! The dirty-page log a VMM hands the backend for a live migration
//! (VHOST_USER_SET_LOG_BASE with VHOST_USER_PROTOCOL_F_LOG_SHMFD): a memfd of one bit
//! per 4 KiB page of guest memory, `log[page / 8] |= 1 << (page % 8)` with
//! `page = guest physical address / 4096`, set by the backend for every page it
//! writes while `VHOST_F_LOG_ALL` is on.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use vhost::VhostUserDirtyLogRegion;

use super::error::{Error, Result};

/// The page size of the vhost-user dirty log.
pub const LOG_PAGE: u64 = 4096;

/// A dirty log covering guest physical addresses `0..memory_size`.
pub struct DirtyLog {
    file: File,
    size: u64,
}

impl DirtyLog {
    /// A zeroed log for `memory_size` bytes of guest memory, its size rounded up to
    /// whole 8-byte words as QEMU sizes it (`VHOST_LOG_CHUNK`).
    pub fn new(memory_size: u64) -> Result<Self> {
        let pages = memory_size.div_ceil(LOG_PAGE);
        let size = pages.div_ceil(64) * 8;
        let name = CString::new("volfsd-frontend-dirty-log").expect("static name has no NUL");
        let fd =
            nix::sys::memfd::memfd_create(&name, nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
                .map_err(|e| Error::io("memfd_create for the dirty log", e.into()))?;
        let file = File::from(fd);
        file.set_len(size)
            .map_err(|e| Error::io(format!("resizing the dirty log to {size} bytes"), e))?;
        Ok(DirtyLog { file, size })
    }

    /// What SET_LOG_BASE sends: the memfd, its size and offset.
    pub fn region(&self) -> VhostUserDirtyLogRegion {
        VhostUserDirtyLogRegion {
            mmap_size: self.size,
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    /// The pages whose bit is set, ascending. Read through the memfd: the backend's
    /// mapping and this read share the same pages.
    pub fn dirty_pages(&self) -> Result<Vec<u64>> {
        let mut bytes = vec![0u8; self.size as usize];
        self.file
            .read_exact_at(&mut bytes, 0)
            .map_err(|e| Error::io("reading the dirty log", e))?;
        Ok(bytes
            .iter()
            .enumerate()
            .flat_map(|(i, b)| {
                (0..8)
                    .filter(move |bit| b & (1 << bit) != 0)
                    .map(move |bit| i as u64 * 8 + bit)
            })
            .collect())
    }

    /// Clears every bit, as a VMM does after it copied the dirty pages.
    pub fn clear(&self) -> Result<()> {
        self.file
            .write_all_at(&vec![0u8; self.size as usize], 0)
            .map_err(|e| Error::io("clearing the dirty log", e))
    }
}

/// The log pages `[addr, addr + len)` touches (none for an empty range).
pub fn pages_of(addr: u64, len: u64) -> impl Iterator<Item = u64> {
    let first = addr / LOG_PAGE;
    let end = if len == 0 {
        first
    } else {
        (addr + len - 1) / LOG_PAGE + 1
    };
    first..end
}
