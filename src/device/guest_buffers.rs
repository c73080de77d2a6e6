//! A popped chain's buffers in guest memory, found in one walk of its descriptors:
//! the readable ones (the request, a WRITE's data) and the writable ones (the
//! reply). The reply is written into them in place ([`GuestReply`]) and a WRITE's
//! data read from them in place ([`GuestData`]), each write setting the dirty-page
//! log's bits of the pages it touched (the slices carry their region's log).
//!
//! fuse-backend-rs's `VirtioFsWriter` and `Reader` do the same over a queue of
//! slices they allocate per request (room for 64), after a walk of their own:
//! together with its server's decoding that was about a third of a small request's
//! instructions (docs/PROFILING.md). Here the slices of a chain of up to
//! [`INLINE`] descriptors each way live on the stack.

use std::io;
use std::ops::Deref;

use fuse_backend_rs::abi::fuse_abi::OutHeader;
use fuse_backend_rs::api::filesystem::{ZeroCopyReader, ZeroCopyWriter};
use fuse_backend_rs::common::file_buf::FileVolatileSlice;
use fuse_backend_rs::common::file_traits::FileReadWriteVolatile;
use smallvec::SmallVec;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, VolatileMemory, VolatileSlice};

use super::memory::GuestMmap;
use crate::fs::buffers::{Reply, WriteData, HEADER};
use crate::fs::request::{copy_limit, HEADER_LEN, MAX_REQUEST};

/// A ring rule the frontend broke: why, for the one log line that stops the queue.
#[derive(Debug)]
pub struct Broken(pub String);

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Broken {}

/// Descriptors each way kept without an allocation: a FUSE request's header and
/// arguments, its name, a page or two of data.
pub(crate) const INLINE: usize = 8;

/// A slice of guest memory as a chain's descriptor names it, with its region's log.
pub(crate) type GuestSlice<'m> = VolatileSlice<'m, vm_memory::bitmap::MS<'m, GuestMmap>>;
type Slices<'m> = SmallVec<[GuestSlice<'m>; INLINE]>;

/// A chain's buffers, readable and writable, each in the chain's order.
pub(crate) struct ChainBuffers<'m> {
    pub readable: Slices<'m>,
    pub writable: Slices<'m>,
}

/// A ring's descriptor table, mapped once per drain: each descriptor of a chain is
/// then one read at an offset, where virtio-queue's iterator looked its address up
/// in guest memory again for each (its region, its bounds, a copy through `memcpy`):
/// that was a quarter of a small request's instructions.
pub(crate) struct DescTable<'m> {
    mem: &'m GuestMmap,
    addr: GuestAddress,
    size: u16,
    /// The whole table, when it lies in one region (else each entry is read through
    /// `mem`, as virtio-queue reads it).
    view: Option<GuestSlice<'m>>,
}

impl<'m> DescTable<'m> {
    /// The table of `size` descriptors at guest address `addr`.
    pub(crate) fn new(mem: &'m GuestMmap, addr: u64, size: u16) -> Self {
        let addr = GuestAddress(addr);
        let view = mem.get_slice(addr, usize::from(size) * DESC).ok();
        DescTable {
            mem,
            addr,
            size,
            view,
        }
    }

    /// The descriptors of the chain whose head is `head`.
    pub(crate) fn chain(&self, head: u16) -> Descriptors<'_, 'm> {
        Descriptors {
            mem: self.mem,
            table: Table::Ring(self),
            size: self.size,
            next: head,
            ttl: self.size,
            yielded: 0,
        }
    }
}

const DESC: usize = std::mem::size_of::<Descriptor>();

/// Where a chain's descriptors are read now: its ring's table, or an indirect one.
enum Table<'t, 'm> {
    Ring(&'t DescTable<'m>),
    /// An indirect table, mapped (None: it is read through guest memory entry by
    /// entry, as the ring's table may be).
    Indirect(GuestAddress, Option<GuestSlice<'m>>),
}

/// A chain's descriptors, in the order and with the ends of virtio-queue's
/// `DescriptorChain` iterator (whose rules `descriptors_match_virtio_queues` checks
/// this against): at most as many as its table is long, one indirect table at most,
/// 4 GiB in all; an entry that cannot be read ends it.
pub(crate) struct Descriptors<'t, 'm> {
    mem: &'m GuestMmap,
    table: Table<'t, 'm>,
    size: u16,
    next: u16,
    ttl: u16,
    yielded: u32,
}

impl Descriptors<'_, '_> {
    fn read(&self, index: u16) -> Option<Descriptor> {
        let offset = usize::from(index) * DESC;
        let (base, view) = match &self.table {
            Table::Ring(t) => (t.addr, t.view.as_ref()),
            Table::Indirect(addr, view) => (*addr, view.as_ref()),
        };
        match view {
            Some(v) => v.get_ref::<Descriptor>(offset).ok().map(|r| r.load()),
            None => {
                let at = base.checked_add(offset as u64)?;
                self.mem.read_obj::<Descriptor>(at).ok()
            }
        }
    }
}

impl Iterator for Descriptors<'_, '_> {
    type Item = Descriptor;

    fn next(&mut self) -> Option<Descriptor> {
        if self.ttl == 0 || self.next >= self.size {
            return None;
        }
        let desc = self.read(self.next)?;
        if desc.refers_to_indirect_table() {
            // No indirect table inside an indirect table; a whole number of entries,
            // at most 65,535 (VIRTIO 1.2, 2.7.5.3.1).
            if matches!(self.table, Table::Indirect(..))
                || !(desc.len() as usize).is_multiple_of(DESC)
            {
                return None;
            }
            let entries = u16::try_from(desc.len() as usize / DESC).ok()?;
            let view = self.mem.get_slice(desc.addr(), desc.len() as usize).ok();
            self.table = Table::Indirect(desc.addr(), view);
            self.size = entries;
            self.next = 0;
            self.ttl = entries;
            return self.next();
        }
        // A chain longer than 4 GiB in all is illegal (VIRTIO 1.2, 2.7.5.2): it ends.
        self.yielded = self.yielded.checked_add(desc.len())?;
        if desc.has_next() {
            self.next = desc.next();
            self.ttl -= 1;
        } else {
            self.ttl = 0;
        }
        Some(desc)
    }
}

/// Walks `chain` once: finds each descriptor's memory in `mem` and copies the
/// readable part into `buf`, the whole request or as much as [`copy_limit`] says
/// once the header is in (a WRITE's data is read in place later). A chain whose walk
/// ends on a descriptor that still names a next one (a loop, an index past the
/// table), or names memory the guest does not have, is broken.
pub(crate) fn read_chain<'m>(
    mem: &'m GuestMmap,
    descriptors: impl Iterator<Item = Descriptor>,
    buf: &mut Vec<u8>,
) -> Result<ChainBuffers<'m>, Broken> {
    buf.clear();
    // The largest request, until its header says how much of it to keep.
    let mut limit = MAX_REQUEST;
    let mut header_seen = false;
    let bufs = walk(mem, descriptors, |slice| {
        if buf.len() >= limit {
            return;
        }
        let start = buf.len();
        let n = slice.len().min(limit - start);
        buf.resize(start + n, 0);
        slice.copy_to(&mut buf[start..]);
        if !header_seen && buf.len() >= HEADER_LEN {
            header_seen = true;
            limit = copy_limit(buf);
            buf.truncate(limit.min(buf.len()));
        }
    })?;
    Ok(bufs)
}

/// A chain's buffers without a copy of the request (one answered later, whose copy
/// was kept).
pub(crate) fn chain_buffers<'m, M: Deref<Target = GuestMmap> + Clone>(
    mem: &'m GuestMmap,
    chain: &DescriptorChain<M>,
) -> Result<ChainBuffers<'m>, Broken> {
    walk(mem, chain.clone(), |_| {})
}

fn walk<'m>(
    mem: &'m GuestMmap,
    descriptors: impl Iterator<Item = Descriptor>,
    mut on_readable: impl FnMut(&GuestSlice<'m>),
) -> Result<ChainBuffers<'m>, Broken> {
    let mut bufs = ChainBuffers {
        readable: SmallVec::new(),
        writable: SmallVec::new(),
    };
    let mut last_has_next = false;
    for desc in descriptors {
        last_has_next = desc.has_next();
        let slice = mem
            .get_slice(desc.addr(), desc.len() as usize)
            .map_err(|e| Broken(format!("descriptor at {:#x}: {e}", desc.addr().0)))?;
        if desc.is_write_only() {
            bufs.writable.push(slice);
        } else {
            on_readable(&slice);
            bufs.readable.push(slice);
        }
    }
    if last_has_next {
        return Err(Broken(
            "a descriptor chain loops or leaves the descriptor table".into(),
        ));
    }
    Ok(bufs)
}

/// A position in a list of slices: the slice, and the offset in it.
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
    use crate::fs::buffers::{error, ok};
    use vm_memory::{ByteValued, GuestAddress};

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

    /// Random descriptor tables (flags, next indices, lengths, indirect tables in
    /// and out of memory, loops): the fast walk yields exactly what virtio-queue's
    /// `DescriptorChain` yields, chain after chain.
    #[test]
    fn descriptors_match_virtio_queues() {
        use virtio_queue::desc::RawDescriptor;
        use virtio_queue::mock::MockSplitQueue;
        use virtio_queue::{Queue, QueueOwnedT};
        let mem = memory();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        const INDIRECT_AT: u64 = 0x8_0000;
        let (mut long, mut indirect) = (0, 0);
        for round in 0..2000 {
            let size = [4u16, 8, 16][round % 3];
            let q = MockSplitQueue::create(&mem, GuestAddress(0), size);
            let entry = |rand: &mut dyn FnMut(u64) -> u64| {
                let flags = (rand(8) as u16) & 0b111;
                let (addr, len) = if flags & 4 != 0 {
                    // An indirect table: here, misaligned, outside memory, or of odd length.
                    let addr = [INDIRECT_AT, INDIRECT_AT + 3, 1 << 40][rand(3) as usize];
                    (addr, [16u32, 48, 64, 20][rand(4) as usize])
                } else {
                    (0x1_0000 + rand(0x1000), rand(300) as u32)
                };
                Descriptor::new(addr, len, flags, rand(u64::from(size) + 2) as u16)
            };
            for i in 0..size {
                q.desc_table()
                    .store(i, RawDescriptor::from(entry(&mut rand)))
                    .unwrap();
            }
            for i in 0..4u64 {
                let d = entry(&mut rand);
                mem.write_obj(d, GuestAddress(INDIRECT_AT + 16 * i))
                    .unwrap();
                mem.write_obj(d, GuestAddress(INDIRECT_AT + 3 + 16 * i))
                    .unwrap();
            }
            let head = rand(u64::from(size)) as u16;
            q.avail().ring().ref_at(0).unwrap().store(u16::to_le(head));
            q.avail().idx().store(u16::to_le(1));
            let mut queue: Queue = q.create_queue().unwrap();
            let chain = queue.iter(&mem).unwrap().next().unwrap();
            let key = |d: Descriptor| (d.addr().0, d.len(), d.flags(), d.next());
            let theirs: Vec<_> = chain.clone().map(key).collect();
            let table = DescTable::new(&mem, q.desc_table_addr().0, size);
            let ours: Vec<_> = table.chain(head).map(key).collect();
            assert_eq!(ours, theirs, "round {round}, head {head}");
            long += usize::from(theirs.len() >= 3);
            // An indirect table's entries: the same pseudo-random entries, so their
            // lengths differ from the ring's only by chance; count walks that left
            // the ring (its own entries all name 0x1_0000.. or an indirect table).
            let from_table = |d: &(u64, u32, u16, u16)| {
                (0..size).any(|i| key(q.desc_table().load(i).map(Descriptor::from).unwrap()) == *d)
            };
            indirect += usize::from(theirs.iter().any(|d| !from_table(d)));
        }
        assert!(
            long > 50 && indirect > 50,
            "{long} long chains, {indirect} indirect"
        );
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
