//! One request off a ring: its local copy, made in the one walk of its chain that
//! finds its buffers (`guest_buffers.rs`), and its reply, written by the file system
//! into those buffers (`fs/request.rs`, the transport's one door to it).

use std::cell::RefCell;
use std::ops::Deref;

use fuse_backend_rs::transport::VirtioFsWriter;
use virtio_queue::DescriptorChain;

use super::guest_buffers::Broken;
use super::guest_buffers::{chain_buffers, read_chain, ChainBuffers};
use super::guest_io::{GuestData, GuestReply};
use super::memory::GuestMmap;
use crate::fs::buffers::WriteData;
use crate::fs::request::{has_write_data, WRITE_PREFIX};
use crate::fs::FsServer;

thread_local! {
    /// The local copy of the request being served, one per worker thread.
    static REQUEST: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(4096));
}

/// Request buffer capacity a worker keeps between requests.
const KEPT_REQUEST_CAPACITY: usize = 64 * 1024;

/// Runs `f` with the worker's request buffer, which it then trims: a large request
/// (a SETXATTR value, a batch of forgets) must not keep its buffer in every worker
/// for good.
pub(crate) fn with_buffer<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    REQUEST.with(|buf| {
        let mut buf = buf.borrow_mut();
        let out = f(&mut buf);
        if buf.capacity() > KEPT_REQUEST_CAPACITY {
            buf.clear();
            buf.shrink_to(KEPT_REQUEST_CAPACITY);
        }
        out
    })
}

/// Copies the readable part of `chain` into `buf` (see [`read_chain`]), for a
/// request whose buffers are looked at again later.
pub(crate) fn copy_request<M: Deref<Target = GuestMmap> + Clone>(
    chain: &DescriptorChain<M>,
    buf: &mut Vec<u8>,
) -> Result<(), Broken> {
    read_chain(chain.memory(), chain.clone(), buf).map(|_| ())
}

/// Serves the request whose local copy is `request`, popped as `chain` (`bufs`: its
/// buffers, when the walk that copied it found them), and returns its reply's length
/// for the used ring. A chain whose buffers cannot be walked is broken.
pub(crate) fn serve<M: Deref<Target = GuestMmap> + Clone>(
    server: &FsServer,
    chain: &DescriptorChain<M>,
    request: &mut [u8],
    bufs: Option<ChainBuffers>,
) -> Result<u32, Broken> {
    match bufs {
        Some(bufs) => Ok(serve_in(server, chain, request, &bufs)),
        None => Ok(serve_in(
            server,
            chain,
            request,
            &chain_buffers(chain.memory(), chain)?,
        )),
    }
}

fn serve_in<M: Deref<Target = GuestMmap> + Clone>(
    server: &FsServer,
    chain: &DescriptorChain<M>,
    request: &mut [u8],
    bufs: &ChainBuffers,
) -> u32 {
    let mem = chain.memory();
    let mut reply = GuestReply::new(&bufs.writable);
    let mut data = has_write_data(request).then(|| GuestData::new(&bufs.readable, WRITE_PREFIX));
    let server_writer = || VirtioFsWriter::new(mem, chain.clone()).ok().map(Into::into);
    server.serve(
        request,
        data.as_mut().map(|d| d as &mut dyn WriteData),
        &mut reply,
        server_writer,
    )
}

/// Serves a chain popped from a ring as a queue worker does (its request copied
/// and its buffers found in one walk, then served), for the harness's benches and
/// comparison tests. Returns the reply's length, or the ring rule the chain broke.
pub fn serve_popped<M: Deref<Target = GuestMmap> + Clone>(
    server: &FsServer,
    chain: &DescriptorChain<M>,
) -> Result<u32, Broken> {
    with_buffer(|buf| {
        let bufs = read_chain(chain.memory(), chain.clone(), buf)?;
        serve(server, chain, buf, Some(bufs))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GuestMmap;
    use crate::fs::server::parse_header;
    use fuse_backend_rs::abi::fuse_abi::{InHeader, Opcode, WriteIn};
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{ByteValued, Bytes, GuestAddress};

    const NEXT: u16 = 1;
    const WRITE: u16 = 2;

    fn memory() -> GuestMmap {
        GuestMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap()
    }
    fn header(opcode: Opcode, len: usize) -> Vec<u8> {
        InHeader {
            len: len as u32,
            opcode: opcode as u32,
            unique: 7,
            nodeid: 1,
            ..Default::default()
        }
        .as_slice()
        .to_vec()
    }

    fn desc(addr: u64, len: usize, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(Descriptor::new(addr, len as u32, flags, next))
    }

    #[test]
    fn a_request_is_copied_whole_in_one_walk_and_a_write_only_to_its_args() {
        let mem = memory();
        let q = MockSplitQueue::new(&mem, 16);
        // A GETXATTR split over two readable descriptors, then a reply buffer.
        let mut req = header(Opcode::Getxattr, 40 + 8 + 6);
        req.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        req.extend_from_slice(b"user.a");
        mem.write_slice(&req[..30], GuestAddress(0x10_0000))
            .unwrap();
        mem.write_slice(&req[30..], GuestAddress(0x20_0000))
            .unwrap();
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, 30, 0, 0),
                desc(0x20_0000, req.len() - 30, 0, 0),
                desc(0x30_0000, 4096, WRITE, 0),
            ])
            .unwrap();
        let mut buf = Vec::new();
        assert!(copy_request(&chain, &mut buf).is_ok());
        assert_eq!(buf, req);
        // Guest memory rewritten after the copy changes nothing the server reads.
        mem.write_slice(&[0xff; 30], GuestAddress(0x10_0000))
            .unwrap();
        assert_eq!(parse_header(&buf).unwrap().opcode, Opcode::Getxattr as u32);

        // A WRITE keeps only its header and WriteIn locally; the data stays behind.
        let mut w = header(Opcode::Write, 80 + 4096);
        w.extend_from_slice(
            WriteIn {
                size: 4096,
                ..Default::default()
            }
            .as_slice(),
        );
        mem.write_slice(&w, GuestAddress(0x10_0000)).unwrap();
        let q = MockSplitQueue::new(&mem, 16);
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, 80, 0, 0),
                desc(0x20_0000, 4096, 0, 0),
                desc(0x30_0000, 64, WRITE, 0),
            ])
            .unwrap();
        assert!(copy_request(&chain, &mut buf).is_ok());
        assert_eq!(buf.len(), WRITE_PREFIX);
        assert_eq!(buf, w);
    }

    /// A 256-entry vring with its descriptors at 0, avail ring at 4 KiB, used at 8 KiB.
    #[test]
    fn a_looping_chain_is_broken() {
        let mem = memory();
        mem.write_slice(&header(Opcode::Getattr, 56), GuestAddress(0x10_0000))
            .unwrap();
        let q = MockSplitQueue::new(&mem, 16);
        // Descriptors 0 and 1 point at each other.
        let chain = q
            .build_multiple_desc_chains(&[
                desc(0x10_0000, 40, NEXT, 1),
                desc(0x10_0000, 40, NEXT, 0),
            ])
            .unwrap();
        let mut buf = Vec::new();
        assert!(copy_request(&chain, &mut buf).is_err());
    }
}
