//! A request's buffers as the file system writes and reads them: its reply
//! ([`Reply`]) and a WRITE's data ([`WriteData`]), with their local forms.
//!
//! A reply is written into a [`Reply`]: the room for its header first, then its
//! body (bytes, or a READ's data straight from the file), then the header, once the
//! body's length is known. The guest's buffers are one kind (`device/guest_io.rs`,
//! written in place, no copy), a local buffer another ([`LocalReply`], for
//! `/dev/fuse`, which takes a reply in a single write). A WRITE's data is read from
//! the guest's buffers in place (`device/guest_buffers.rs`), or from the request's
//! local copy ([`LocalData`]).

use std::io::{self, Write};
use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader, WriteIn};
use fuse_backend_rs::api::filesystem::{ZeroCopyReader, ZeroCopyWriter};
use fuse_backend_rs::api::server::MAX_BUFFER_SIZE;
use fuse_backend_rs::common::file_buf::FileVolatileSlice;
use fuse_backend_rs::common::file_traits::FileReadWriteVolatile;
use fuse_backend_rs::encode_io_error_kind;
use fuse_backend_rs::transport::Writer;
use vm_memory::{bitmap::BitmapSlice, ByteValued};

/// The bytes of a reply's header.
pub const HEADER: usize = size_of::<OutHeader>();

/// The largest request accepted, WRITE data aside: a FUSE message of at most
/// MAX_BUFFER_SIZE (1 MiB) plus its header page, as fuse-backend-rs bounds it.
pub const MAX_REQUEST: usize = MAX_BUFFER_SIZE as usize + 0x1000;
/// The largest READ, READDIR or WRITE payload: the MAX_PAGES the guest negotiates.
pub const MAX_PAYLOAD: u32 = MAX_BUFFER_SIZE;
/// Bytes of a WRITE request kept in local memory: its header and WriteIn.
pub const WRITE_PREFIX: usize = size_of::<InHeader>() + size_of::<WriteIn>();

/// Where one reply is written. Its body goes through `io::Write` and
/// `ZeroCopyWriter::write_from` (each all or nothing: a body that does not fit is an
/// error, as in fuse-backend-rs's writers), after the header's room.
pub trait Reply: ZeroCopyWriter {
    /// Drops the body written so far: an error reply after part of a body.
    fn clear_body(&mut self);
    /// Bytes of body written so far.
    fn body_len(&self) -> usize;
    /// Writes `header` into the room at the start. The reply is then complete.
    fn write_header(&mut self, header: &OutHeader) -> io::Result<()>;
}

/// The errno a failed operation answers: its OS error, else one from its kind, as
/// fuse-backend-rs's server encodes it.
pub fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| encode_io_error_kind(e.kind()))
}

/// Completes a reply whose body is written: the header says its length and `error`
/// (0, or a negative errno). Returns the reply's length.
pub fn finish<R: Reply + ?Sized>(r: &mut R, unique: u64, error: i32) -> io::Result<usize> {
    let len = HEADER + r.body_len();
    let header = OutHeader {
        len: len as u32,
        error,
        unique,
    };
    r.write_header(&header)?;
    Ok(len)
}

/// A reply with `body` (written in one piece: nothing when it does not fit).
pub fn ok<R: Reply + ?Sized>(r: &mut R, unique: u64, body: &[u8]) -> io::Result<usize> {
    r.clear_body();
    r.write_all(body)?;
    finish(r, unique, 0)
}

/// An error reply: the header alone, whatever body was written before.
pub fn error<R: Reply + ?Sized>(r: &mut R, unique: u64, errno: i32) -> io::Result<usize> {
    r.clear_body();
    finish(r, unique, -errno)
}

/// A reply assembled in local memory, for a transport that takes it in one piece
/// (`/dev/fuse`): `bytes` holds the header's room and the body, up to `capacity`.
pub struct LocalReply {
    bytes: Vec<u8>,
    capacity: usize,
    done: bool,
}

impl LocalReply {
    /// An empty reply of at most `capacity` bytes, header included.
    pub fn new(capacity: usize) -> Self {
        LocalReply {
            bytes: vec![0; HEADER.min(capacity)],
            capacity,
            done: false,
        }
    }

    /// The whole reply, once its header is written.
    pub fn bytes(&self) -> Option<&[u8]> {
        self.done.then_some(&self.bytes[..])
    }

    /// Writes the finished reply to a fuse-backend-rs writer in one write.
    pub fn send<S: BitmapSlice>(&self, w: &mut Writer<'_, S>) -> io::Result<usize> {
        let bytes = self
            .bytes()
            .ok_or_else(|| io::Error::other("the reply was not finished"))?;
        w.write_all(bytes)?;
        w.commit(None)?;
        Ok(bytes.len())
    }

    fn room(&self, count: usize) -> io::Result<()> {
        if self.bytes.len() < HEADER || count > self.capacity - self.bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "data out of range, available {} requested {count}",
                    self.available_bytes()
                ),
            ));
        }
        Ok(())
    }
}

impl io::Write for LocalReply {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.room(buf.len())?;
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ZeroCopyWriter for LocalReply {
    fn write_from(
        &mut self,
        f: &mut dyn FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        self.room(count)?;
        let start = self.bytes.len();
        self.bytes.resize(start + count, 0);
        // SAFETY: the slice covers `count` initialised bytes of `self.bytes`, which
        // nothing else borrows while the read runs.
        let slice = unsafe { FileVolatileSlice::from_mut_slice(&mut self.bytes[start..]) };
        let n = f.read_vectored_at_volatile(&[slice], off);
        self.bytes.truncate(start + *n.as_ref().unwrap_or(&0));
        n
    }

    fn available_bytes(&self) -> usize {
        self.capacity.saturating_sub(self.bytes.len())
    }
}

impl Reply for LocalReply {
    fn clear_body(&mut self) {
        self.bytes.truncate(HEADER.min(self.capacity));
        self.done = false;
    }

    fn body_len(&self) -> usize {
        self.bytes.len().saturating_sub(HEADER)
    }

    fn write_header(&mut self, header: &OutHeader) -> io::Result<()> {
        if self.bytes.len() < HEADER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no room for the reply's header",
            ));
        }
        self.bytes[..HEADER].copy_from_slice(header.as_slice());
        self.done = true;
        Ok(())
    }
}

/// A WRITE's data, read straight into the file (`ZeroCopyReader::read_to`).
pub trait WriteData: ZeroCopyReader {
    /// Bytes of data not read yet.
    fn remaining(&self) -> usize;
}

/// A WRITE's data that follows its arguments in the request's local copy.
pub struct LocalData<'a> {
    bytes: &'a mut [u8],
    pos: usize,
}

impl<'a> LocalData<'a> {
    pub fn new(bytes: &'a mut [u8]) -> Self {
        LocalData { bytes, pos: 0 }
    }
}

impl io::Read for LocalData<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let rest = &self.bytes[self.pos..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }
}

impl ZeroCopyReader for LocalData<'_> {
    fn read_to(
        &mut self,
        f: &mut dyn FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let end = self.pos + count.min(self.bytes.len() - self.pos);
        // SAFETY: the slice is part of `self.bytes`, borrowed mutably by self.
        let slice = unsafe { FileVolatileSlice::from_mut_slice(&mut self.bytes[self.pos..end]) };
        let n = f.write_vectored_at_volatile(&[slice], off)?;
        self.pos += n;
        Ok(n)
    }
}

impl WriteData for LocalData<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(bytes: &[u8]) -> OutHeader {
        *OutHeader::from_slice(&bytes[..HEADER]).unwrap()
    }

    #[test]
    fn a_reply_is_its_header_then_its_body() {
        let mut r = LocalReply::new(64);
        assert_eq!(ok(&mut r, 7, b"abc").unwrap(), 19);
        let bytes = r.bytes().unwrap();
        let h = header_of(bytes);
        assert_eq!((h.len, h.error, h.unique), (19, 0, 7));
        assert_eq!(&bytes[HEADER..], b"abc");
    }

    #[test]
    fn an_error_drops_the_body_written_before_it() {
        let mut r = LocalReply::new(64);
        r.write_all(b"partial").unwrap();
        assert_eq!(error(&mut r, 9, libc::ENOENT).unwrap(), HEADER);
        let h = header_of(r.bytes().unwrap());
        assert_eq!((h.len, h.error, h.unique), (16, -libc::ENOENT, 9));
    }

    #[test]
    fn a_body_that_does_not_fit_is_refused_whole() {
        let mut r = LocalReply::new(20);
        assert!(r.write_all(b"12345").is_err());
        assert_eq!(r.body_len(), 0);
        assert!(r.bytes().is_none(), "no header yet");
        // Not even the header fits: no reply at all.
        let mut tiny = LocalReply::new(8);
        assert!(error(&mut tiny, 1, libc::EIO).is_err());
    }

    #[test]
    fn errors_without_an_os_code_are_encoded_by_kind() {
        assert_eq!(
            errno_of(&io::Error::from_raw_os_error(libc::EXDEV)),
            libc::EXDEV
        );
        assert_eq!(
            errno_of(&io::Error::new(io::ErrorKind::InvalidData, "x")),
            libc::EIO
        );
        assert_eq!(errno_of(&io::ErrorKind::NotFound.into()), libc::ENOENT);
    }
}
