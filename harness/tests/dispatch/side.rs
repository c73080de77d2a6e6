//! One stack over its own copy of the fixture directory, served two ways: through
//! the queue worker's path (`serve_popped`) or through fuse-backend-rs's `Server`.

use std::path::{Path, PathBuf};

use fuse_backend_rs::abi::fuse_abi::{InHeader, InitIn, Opcode, OutHeader};
use fuse_backend_rs::transport::VirtioFsWriter;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{ByteValued, Bytes, GuestAddress};
use volfsd::exports::device::request::serve_popped;
use volfsd::exports::device::GuestMmap;
use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig};

use crate::wire::{header, msg, HDR};

pub(crate) const NEXT: u16 = 1;
pub(crate) const WRITE: u16 = 2;
pub(crate) const IN_AT: u64 = 0x10_0000;
pub(crate) const OUT_AT: u64 = 0x20_0000;

/// One stack over its own copy of the fixture directory.
pub(crate) struct Side {
    root: PathBuf,
    pub(crate) server: FsServer,
    mem: GuestMmap,
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

pub(crate) fn fixture(root: &Path) {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root.join("d/sub")).unwrap();
    std::fs::create_dir_all(root.join("e")).unwrap();
    std::fs::write(root.join("f"), vec![5u8; 9000]).unwrap();
    std::fs::write(root.join("d/x"), b"x").unwrap();
}

pub(crate) fn side(tag: &str) -> Side {
    let root = std::env::temp_dir().join(format!("volfsd-dispatch-{}-{tag}", std::process::id()));
    fixture(&root);
    let stack = fs::build(
        &root,
        None,
        false,
        PassthroughConfig::new(CacheMode::None, false),
    )
    .unwrap();
    let server = FsServer::new(&stack);
    let mem = GuestMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
    let mut s = Side { root, server, mem };
    let init = InitIn {
        major: 7,
        minor: 38,
        max_readahead: 0,
        flags: 0,
    };
    let r = s.ours(&msg(Opcode::Init, 0, 1, init.as_slice(), None), 4096);
    assert_eq!(header(&r).error, 0, "INIT");
    s
}

impl Side {
    /// Lays `request` out as the Linux driver does (header and arguments readable,
    /// then the reply's header and body writable) and returns the chain's queue.
    pub(crate) fn chain(&self, request: &[u8], reply_room: usize) -> Queue {
        self.mem
            .write_slice(&vec![0u8; reply_room + 16], GuestAddress(OUT_AT))
            .unwrap();
        self.mem.write_slice(request, GuestAddress(IN_AT)).unwrap();
        let split = request.len().min(HDR);
        let mut descs = vec![(IN_AT, split as u32, 0)];
        if request.len() > split {
            descs.push((IN_AT + split as u64, (request.len() - split) as u32, 0));
        }
        descs.push((OUT_AT, 16.min(reply_room) as u32, WRITE));
        if reply_room > 16 {
            descs.push((OUT_AT + 16, (reply_room - 16) as u32, WRITE));
        }
        let n = descs.len();
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                let (flags, next) = if i + 1 < n {
                    (flags | NEXT, i as u16 + 1)
                } else {
                    (flags, 0)
                };
                RawDescriptor::from(Descriptor::new(addr, len, flags, next))
            })
            .collect();
        let q = MockSplitQueue::create(&self.mem, GuestAddress(0), 16);
        q.add_desc_chains(&raw, 0).unwrap();
        q.create_queue().unwrap()
    }

    pub(crate) fn reply_bytes(&self, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.mem.read_slice(&mut out, GuestAddress(OUT_AT)).unwrap();
        out
    }

    /// Through the queue worker's path.
    pub(crate) fn ours(&mut self, request: &[u8], reply_room: usize) -> Vec<u8> {
        let mut q = self.chain(request, reply_room);
        let chain = q.iter(&self.mem).unwrap().next().unwrap();
        let len = serve_popped(&self.server, &chain).expect("a well-formed chain");
        self.reply_bytes(len as usize)
    }

    /// Through fuse-backend-rs's server, answered EINVAL when it fails without a
    /// reply, as the daemon answers such a request.
    pub(crate) fn library(&mut self, request: &[u8], reply_room: usize) -> Vec<u8> {
        let mut q = self.chain(request, reply_room);
        let chain = q.iter(&self.mem).unwrap().next().unwrap();
        let writer = VirtioFsWriter::new(&self.mem, chain.clone()).unwrap();
        let mut copy = request.to_vec();
        let unique = InHeader::from_slice(&request[..HDR]).unwrap().unique;
        let opcode = InHeader::from_slice(&request[..HDR]).unwrap().opcode;
        match self.server.handle_with_library(&mut copy, writer.into()) {
            Ok(len) => self.reply_bytes(len),
            Err(_) if opcode == Opcode::Forget as u32 || opcode == Opcode::BatchForget as u32 => {
                Vec::new()
            }
            Err(_) if reply_room >= 16 => OutHeader {
                len: 16,
                error: -libc::EINVAL,
                unique,
            }
            .as_slice()
            .to_vec(),
            Err(_) => Vec::new(),
        }
    }
}
