//! A popped chain's buffers in guest memory, found in one walk of its descriptors:
//! the readable ones (the request, a WRITE's data) and the writable ones (the
//! reply). `guest_io.rs` writes the reply into them in place (`GuestReply`) and
//! reads a WRITE's data from them in place (`GuestData`), each write setting the
//! dirty-page log's bits of the pages it touched (the slices carry their region's log).
//!
//! fuse-backend-rs's `VirtioFsWriter` and `Reader` do the same over a queue of
//! slices they allocate per request (room for 64), after a walk of their own:
//! together with its server's decoding that was about a third of a small request's
//! instructions (docs/PROFILING.md). Here the slices of a chain of up to
//! [`INLINE`] descriptors each way live on the stack.

use std::ops::Deref;

use smallvec::SmallVec;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, VolatileMemory, VolatileSlice};

use super::memory::GuestMmap;
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

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn memory() -> GuestMmap {
        GuestMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
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
}
