//! A popped chain's buffers used in place (`guest_buffers.rs` finds them): the
//! reply written into the writable ones ([`GuestReply`]: the header's room first, the
//! body after it, then the header) and a WRITE's data read from the readable ones
//! after the request ([`GuestData`]), each write setting the dirty-page log's bits of
//! the pages it touched (the slices carry their region's log).

use std::io;

use fuse_backend_rs::abi::fuse_abi::OutHeader;
use fuse_backend_rs::api::filesystem::{ZeroCopyReader, ZeroCopyWriter};
use fuse_backend_rs::common::file_buf::FileVolatileSlice;
use fuse_backend_rs::common::file_traits::FileReadWriteVolatile;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Bytes, VolatileSlice};

use smallvec::SmallVec;

use super::guest_buffers::{GuestSlice, INLINE};
use crate::fs::buffers::{Reply, WriteData, HEADER};

/// Where a read or write is in a list of slices: the slice, and the offset in it.
#[derive(Clone, Copy, Default)]
struct Cursor {
    index: usize,
    offset: usize,
}

impl Cursor {
    /// The cursor `count` bytes on (past the end: at the end).
    fn advance<S: BitmapSlice>(
        mut self,
        slices: &[VolatileSlice<'_, S>],
        mut count: usize,
    ) -> Self {
        while count > 0 && self.index < slices.len() {
            let left = slices[self.index].len() - self.offset;
            if count < left {
                self.offset += count;
                return self;
            }
            count -= left;
            self.index += 1;
            self.offset = 0;
        }
        while self.index < slices.len() && self.offset == slices[self.index].len() {
            self.index += 1;
            self.offset = 0;
        }
        self
    }

    /// The slices from here, `count` bytes at most, for a vectored system call.
    fn iovecs<'a, S: BitmapSlice>(
        self,
        slices: &[VolatileSlice<'a, S>],
        mut count: usize,
    ) -> SmallVec<[FileVolatileSlice<'a>; INLINE]> {
        let mut out = SmallVec::new();
        let mut offset = self.offset;
        for s in &slices[self.index.min(slices.len())..] {
            if count == 0 {
                break;
            }
            let n = (s.len() - offset).min(count);
            if n > 0 {
                // In bounds: offset + n <= len.
                if let Ok(part) = s.subslice(offset, n) {
                    out.push(FileVolatileSlice::from_volatile_slice(&part));
                }
            }
            count -= n;
            offset = 0;
        }
        out
    }

    /// Marks `count` bytes from here written in the dirty-page log.
    fn mark_dirty<S: BitmapSlice>(self, slices: &[VolatileSlice<'_, S>], mut count: usize) {
        let mut offset = self.offset;
        for s in &slices[self.index.min(slices.len())..] {
            if count == 0 {
                return;
            }
            let n = (s.len() - offset).min(count);
            s.bitmap().mark_dirty(offset, n);
            count -= n;
            offset = 0;
        }
    }
}

/// Copies `bytes` into `slices` from `at` on (the caller checked they fit).
fn copy_into<S: BitmapSlice>(slices: &[VolatileSlice<'_, S>], at: Cursor, mut bytes: &[u8]) {
    let mut offset = at.offset;
    for s in &slices[at.index.min(slices.len())..] {
        if bytes.is_empty() {
            return;
        }
        let n = (s.len() - offset).min(bytes.len());
        // In bounds (offset + n <= len); the write sets the log's bits.
        let _ = s.write_slice(&bytes[..n], offset);
        bytes = &bytes[n..];
        offset = 0;
    }
}

fn out_of_room(available: usize, requested: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("data out of range, available {available} requested {requested}"),
    )
}

/// A reply written into a chain's writable buffers: the header's room first, the
/// body after it.
pub(crate) struct GuestReply<'s, 'm> {
    slices: &'s [GuestSlice<'m>],
    /// The writable bytes in all.
    total: usize,
    /// Where the body starts (after the header's room) and where it ends now.
    body_start: Cursor,
    end: Cursor,
    body: usize,
}

impl<'s, 'm> GuestReply<'s, 'm> {
    pub(crate) fn new(slices: &'s [GuestSlice<'m>]) -> Self {
        let total = slices.iter().map(|s| s.len()).sum();
        let body_start = Cursor::default().advance(slices, HEADER);
        GuestReply {
            slices,
            total,
            body_start,
            end: body_start,
            body: 0,
        }
    }
}

impl io::Write for GuestReply<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let available = self.available_bytes();
        if buf.len() > available {
            return Err(out_of_room(available, buf.len()));
        }
        copy_into(self.slices, self.end, buf);
        self.end = self.end.advance(self.slices, buf.len());
        self.body += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ZeroCopyWriter for GuestReply<'_, '_> {
    fn write_from(
        &mut self,
        f: &mut dyn FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let available = self.available_bytes();
        if count > available {
            return Err(out_of_room(available, count));
        }
        let iovecs = self.end.iovecs(self.slices, count);
        if iovecs.is_empty() {
            return Ok(0);
        }
        let n = f.read_vectored_at_volatile(&iovecs, off)?;
        self.end.mark_dirty(self.slices, n);
        self.end = self.end.advance(self.slices, n);
        self.body += n;
        Ok(n)
    }

    fn available_bytes(&self) -> usize {
        self.total.saturating_sub(HEADER + self.body)
    }
}

impl Reply for GuestReply<'_, '_> {
    fn clear_body(&mut self) {
        self.end = self.body_start;
        self.body = 0;
    }

    fn body_len(&self) -> usize {
        self.body
    }

    fn write_header(&mut self, header: &OutHeader) -> io::Result<()> {
        if self.total < HEADER {
            return Err(out_of_room(self.total, HEADER));
        }
        copy_into(
            self.slices,
            Cursor::default(),
            vm_memory::ByteValued::as_slice(header),
        );
        Ok(())
    }
}

/// A WRITE's data, read from the chain's readable buffers after its arguments.
pub(crate) struct GuestData<'s, 'm> {
    slices: &'s [GuestSlice<'m>],
    at: Cursor,
    remaining: usize,
}

impl<'s, 'm> GuestData<'s, 'm> {
    /// The readable bytes from `skip` on.
    pub(crate) fn new(slices: &'s [GuestSlice<'m>], skip: usize) -> Self {
        let total: usize = slices.iter().map(|s| s.len()).sum();
        GuestData {
            slices,
            at: Cursor::default().advance(slices, skip),
            remaining: total.saturating_sub(skip),
        }
    }
}

impl io::Read for GuestData<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        let mut offset = self.at.offset;
        for s in &self.slices[self.at.index.min(self.slices.len())..] {
            if done == buf.len() {
                break;
            }
            let n = (s.len() - offset).min(buf.len() - done);
            if let Ok(part) = s.subslice(offset, n) {
                part.copy_to(&mut buf[done..done + n]);
            }
            done += n;
            offset = 0;
        }
        self.at = self.at.advance(self.slices, done);
        self.remaining -= done;
        Ok(done)
    }
}

impl ZeroCopyReader for GuestData<'_, '_> {
    fn read_to(
        &mut self,
        f: &mut dyn FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let iovecs = self.at.iovecs(self.slices, count.min(self.remaining));
        if iovecs.is_empty() {
            return Ok(0);
        }
        let n = f.write_vectored_at_volatile(&iovecs, off)?;
        self.at = self.at.advance(self.slices, n);
        self.remaining -= n;
        Ok(n)
    }
}

impl WriteData for GuestData<'_, '_> {
    fn remaining(&self) -> usize {
        self.remaining
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GuestMmap;
    use crate::fs::buffers::{error, ok};
    use vm_memory::{ByteValued, GuestAddress, GuestMemory};

    fn memory() -> GuestMmap {
        GuestMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    fn slices<'m>(mem: &'m GuestMmap, parts: &[(u64, usize)]) -> Vec<GuestSlice<'m>> {
        parts
            .iter()
            .map(|&(a, n)| mem.get_slice(GuestAddress(a), n).unwrap())
            .collect()
    }

    fn read(mem: &GuestMmap, at: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        mem.read_slice(&mut v, GuestAddress(at)).unwrap();
        v
    }

    #[test]
    fn a_reply_spans_its_buffers_whatever_their_sizes() {
        let mem = memory();
        // A header split over two buffers, the body over two more.
        let s = slices(
            &mem,
            &[(0x1000, 10), (0x2000, 10), (0x3000, 3), (0x4000, 100)],
        );
        let mut r = GuestReply::new(&s);
        assert_eq!(r.available_bytes(), 123 - HEADER);
        assert_eq!(ok(&mut r, 5, b"0123456789").unwrap(), HEADER + 10);
        let header = OutHeader {
            len: 26,
            error: 0,
            unique: 5,
        };
        let mut want = header.as_slice().to_vec();
        want.extend_from_slice(b"0123456789");
        let mut got = read(&mem, 0x1000, 10);
        got.extend(read(&mem, 0x2000, 10));
        got.extend(read(&mem, 0x3000, 3));
        got.extend(read(&mem, 0x4000, 3));
        assert_eq!(got, want);
    }

    #[test]
    fn an_error_after_a_body_rewrites_the_header_only() {
        let mem = memory();
        let s = slices(&mem, &[(0x1000, 64)]);
        let mut r = GuestReply::new(&s);
        io::Write::write_all(&mut r, b"body").unwrap();
        assert_eq!(error(&mut r, 9, libc::ENOENT).unwrap(), HEADER);
        let h = *OutHeader::from_slice(&read(&mem, 0x1000, HEADER)).unwrap();
        assert_eq!((h.len, h.error, h.unique), (16, -libc::ENOENT, 9));
    }

    #[test]
    fn too_small_buffers_take_no_reply() {
        let mem = memory();
        let s = slices(&mem, &[(0x1000, 8)]);
        let mut r = GuestReply::new(&s);
        assert_eq!(r.available_bytes(), 0);
        assert!(error(&mut r, 1, libc::EIO).is_err());
        let s = slices(&mem, &[(0x1000, 20)]);
        let mut r = GuestReply::new(&s);
        assert!(
            io::Write::write_all(&mut r, b"12345").is_err(),
            "4 bytes of room"
        );
        assert_eq!(r.body_len(), 0);
    }

    #[test]
    fn file_data_goes_straight_into_the_buffers_after_the_header() {
        let mem = memory();
        let mut file = tempfile();
        std::io::Write::write_all(&mut file, &[7u8; 300]).unwrap();
        let s = slices(&mem, &[(0x1000, HEADER), (0x2000, 100), (0x3000, 400)]);
        let mut r = GuestReply::new(&s);
        assert_eq!(r.write_from(&mut file, 250, 0).unwrap(), 250);
        assert!(r.write_from(&mut file, 251, 0).is_err(), "250 bytes left");
        assert_eq!(read(&mem, 0x2000, 100), vec![7u8; 100]);
        assert_eq!(read(&mem, 0x3000, 150), vec![7u8; 150]);
        assert_eq!(read(&mem, 0x3000 + 150, 1), vec![0]);
    }

    #[test]
    fn write_data_is_read_after_its_arguments() {
        let mem = memory();
        mem.write_slice(&[1u8; 50], GuestAddress(0x1000)).unwrap();
        mem.write_slice(&[2u8; 50], GuestAddress(0x2000)).unwrap();
        let s = slices(&mem, &[(0x1000, 50), (0x2000, 50)]);
        let mut d = GuestData::new(&s, 40);
        assert_eq!(d.remaining(), 60);
        let mut file = tempfile();
        assert_eq!(d.read_to(&mut file, 100, 0).unwrap(), 60);
        assert_eq!(d.remaining(), 0);
        let mut back = vec![0u8; 60];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 0).unwrap();
        let mut want = vec![1u8; 10];
        want.extend(vec![2u8; 50]);
        assert_eq!(back, want);
    }

    fn tempfile() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "volfsd-guest-buffers-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
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
