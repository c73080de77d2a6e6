//! A host file's fd as fuse-backend-rs's `FileReadWriteVolatile`, for READ and WRITE:
//! one `preadv` or `pwritev` over all of the guest's buffers, their iovecs on the
//! stack. The crate's own implementation for `File` collects them into a `Vec` first:
//! an allocation and a free per request (callgrind, seqread1m: 1 of each per READ).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};

use fuse_backend_rs::common::file_buf::FileVolatileSlice;
use fuse_backend_rs::common::file_traits::FileReadWriteVolatile;

/// iovecs kept on the stack: a 1 MiB request in 4 KiB pages (a guest's READ or WRITE
/// of unmerged pages). More go to the heap; IOV_MAX (1,024) bounds them.
const INLINE_IOVECS: usize = 256;

/// The fd of an open file, borrowed for one request.
pub(super) struct HostFile(RawFd);

impl HostFile {
    pub(super) fn of(f: &impl AsRawFd) -> HostFile {
        HostFile(f.as_raw_fd())
    }
}

/// Calls `io` with the iovecs of `bufs`: on the stack, uninitialised but for the
/// ones filled (a 4 KiB array moved or zeroed per request costs more than the
/// allocation it replaces: callgrind), on the heap past [`INLINE_IOVECS`].
fn with_iovecs(
    bufs: &[FileVolatileSlice],
    io: impl FnOnce(*const libc::iovec, libc::c_int) -> isize,
) -> io::Result<usize> {
    let iovec = |s: &FileVolatileSlice| libc::iovec {
        iov_base: s.as_ptr().cast(),
        iov_len: s.len(),
    };
    if bufs.is_empty() {
        return Ok(0);
    }
    if bufs.len() > INLINE_IOVECS {
        let heap: Vec<libc::iovec> = bufs.iter().map(iovec).collect();
        return result(io(heap.as_ptr(), heap.len() as libc::c_int));
    }
    let mut inline = [const { MaybeUninit::<libc::iovec>::uninit() }; INLINE_IOVECS];
    for (slot, s) in inline.iter_mut().zip(bufs) {
        slot.write(iovec(s));
    }
    // The first bufs.len() entries are initialised above; the kernel reads only those.
    result(io(inline.as_ptr().cast(), bufs.len() as libc::c_int))
}

fn result(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

impl FileReadWriteVolatile for HostFile {
    // Only positioned I/O: a handle's file offset is never used.
    fn read_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::ESPIPE))
    }

    fn write_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::ESPIPE))
    }

    fn read_at_volatile(&mut self, slice: FileVolatileSlice, offset: u64) -> io::Result<usize> {
        self.read_vectored_at_volatile(&[slice], offset)
    }

    fn write_at_volatile(&mut self, slice: FileVolatileSlice, offset: u64) -> io::Result<usize> {
        self.write_vectored_at_volatile(&[slice], offset)
    }

    fn read_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        offset: u64,
    ) -> io::Result<usize> {
        // SAFETY: the iovecs cover the guest's (or our own) buffers, which the slices
        // borrow for the call; the kernel writes only inside them.
        with_iovecs(bufs, |iov, n| unsafe {
            libc::preadv(self.0, iov, n, offset as i64)
        })
    }

    fn write_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        offset: u64,
    ) -> io::Result<usize> {
        // SAFETY: as above; the kernel only reads the buffers.
        with_iovecs(bufs, |iov, n| unsafe {
            libc::pwritev(self.0, iov, n, offset as i64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek};

    #[test]
    fn reads_and_writes_over_many_buffers_at_an_offset() {
        let mut f = tempfile_in_tmp();
        let mut parts: Vec<Vec<u8>> = (0..300u32).map(|i| vec![(i % 251) as u8; 7]).collect();
        let slices: Vec<FileVolatileSlice> = parts
            .iter_mut()
            // SAFETY: each slice covers its own Vec, alive for the test.
            .map(|p| unsafe { FileVolatileSlice::from_mut_slice(p) })
            .collect();
        let n = HostFile::of(&f)
            .write_vectored_at_volatile(&slices, 5)
            .unwrap();
        assert_eq!(n, 300 * 7);
        let mut all = Vec::new();
        f.rewind().unwrap();
        f.read_to_end(&mut all).unwrap();
        assert_eq!(&all[..5], &[0; 5]);
        assert_eq!(all[5 + 7 * 260], (260 % 251) as u8);
        let mut back = vec![0u8; 300 * 7];
        // SAFETY: the slice covers `back`, alive for the call.
        let s = unsafe { FileVolatileSlice::from_mut_slice(&mut back) };
        assert_eq!(HostFile::of(&f).read_at_volatile(s, 5).unwrap(), 300 * 7);
        assert_eq!(back, all[5..]);
    }

    #[test]
    fn an_error_carries_the_errno() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mut b = [0u8; 4];
        // SAFETY: the slice covers `b`.
        let s = unsafe { FileVolatileSlice::from_mut_slice(&mut b) };
        // /dev/null opened read-only: a write is EBADF.
        let e = HostFile::of(&f).write_at_volatile(s, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("volfsd-host-file-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}
