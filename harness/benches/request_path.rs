//! Micro-benchmarks of the request path without a socket: FUSE requests
//! written into an in-process `GuestMemoryMmap`, descriptor chains built with
//! virtio-queue's mock driver, served by `FsServer::handle` exactly as a
//! queue worker does (`Reader::from_descriptor_chain` + `VirtioFsWriter`).
//! The same again with `--no-metrics` (group `request_path_no_metrics`). Plus the
//! control API's attach/detach round trip.
//!
//! Run: cargo bench --bench request_path

use std::path::Path;
use std::sync::Arc;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fuse_backend_rs::abi::fuse_abi::{
    EntryOut, GetattrIn, InHeader, InitIn, OpenIn, OpenOut, OutHeader, ReadIn, WriteIn,
};
use fuse_backend_rs::transport::{Reader, VirtioFsWriter};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT};
use vm_memory::{ByteValued, Bytes, GuestAddress};
use volfsd::exports::control::Api;
use volfsd::exports::device::{DeviceStats, GuestMmap};
use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig};

const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;
const MEM_SIZE: usize = 64 << 20;

/// The daemon's own guest memory type, dirty-page log included (empty here, as when
/// no migration runs), so the bench pays what the daemon pays per write.
type Mem = GuestMmap;

/// One request placed in guest memory with its own mock queue, so each
/// chain stays valid while others are built.
struct Prepared<'a> {
    chain: DescriptorChain<&'a Mem>,
}

/// Lays out `slot`'s request: readable `[header+args]` (+ `[data]`), writable
/// `[out header]` + `[reply]`, like the Linux driver.
fn prepare<'a>(
    mem: &'a Mem,
    slot: u64,
    opcode: u32,
    nodeid: u64,
    args: &[u8],
    data: Option<&[u8]>,
    reply_len: u32,
) -> Prepared<'a> {
    let ring = GuestAddress(slot * 0x10000);
    let base = 0x100_0000 + slot * 0x40_0000;
    let (in_addr, data_addr, out_addr, reply_addr) =
        (base, base + 0x1000, base + 0x20_0000, base + 0x20_1000);
    let data_len = data.map_or(0, |d| d.len());
    let header = InHeader {
        len: (std::mem::size_of::<InHeader>() + args.len() + data_len) as u32,
        opcode,
        unique: 2,
        nodeid,
        uid: 0,
        gid: 0,
        pid: 1,
        padding: 0,
    };
    let mut inbuf = header.as_slice().to_vec();
    inbuf.extend_from_slice(args);
    mem.write_slice(&inbuf, GuestAddress(in_addr)).unwrap();
    let mut descs = vec![RawDescriptor::from(SplitDescriptor::new(
        in_addr,
        inbuf.len() as u32,
        0,
        0,
    ))];
    if let Some(d) = data {
        mem.write_slice(d, GuestAddress(data_addr)).unwrap();
        descs.push(RawDescriptor::from(SplitDescriptor::new(
            data_addr,
            d.len() as u32,
            0,
            0,
        )));
    }
    descs.push(RawDescriptor::from(SplitDescriptor::new(
        out_addr,
        std::mem::size_of::<OutHeader>() as u32,
        VRING_DESC_F_WRITE,
        0,
    )));
    if reply_len > 0 {
        descs.push(RawDescriptor::from(SplitDescriptor::new(
            reply_addr,
            reply_len,
            VRING_DESC_F_WRITE,
            0,
        )));
    }
    // Chain the descriptors (NEXT flags, next = following index).
    let n = descs.len();
    let descs: Vec<RawDescriptor> = descs
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let d = SplitDescriptor::from(d);
            let (flags, next) = if i + 1 < n {
                (d.flags() | VRING_DESC_F_NEXT, i as u16 + 1)
            } else {
                (d.flags(), 0)
            };
            RawDescriptor::from(SplitDescriptor::new(d.addr().0, d.len(), flags, next))
        })
        .collect();
    let queue = MockSplitQueue::create(mem, ring, 16);
    queue.add_desc_chains(&descs, 0).unwrap();
    let mut q: Queue = queue.create_queue().unwrap();
    let chain = q.iter(mem).unwrap().next().unwrap();
    Prepared { chain }
}

/// Serves one prepared request like the queue worker; returns (errno, reply bytes).
fn serve(server: &FsServer, mem: &Mem, p: &Prepared) -> usize {
    let reader = Reader::from_descriptor_chain(mem, p.chain.clone()).unwrap();
    let writer = VirtioFsWriter::new(mem, p.chain.clone()).unwrap();
    server.handle(reader, writer.into()).unwrap()
}

fn out_header(mem: &Mem, p: &Prepared) -> OutHeader {
    let mut c = p.chain.clone();
    let desc = c.find(|d| d.is_write_only()).unwrap();
    mem.read_obj(desc.addr()).unwrap()
}

fn reply_body<T: ByteValued>(mem: &Mem, p: &Prepared) -> T {
    let c = p.chain.clone();
    let desc = c.filter(|d| d.is_write_only()).nth(1).unwrap();
    mem.read_obj(desc.addr()).unwrap()
}

/// Runs `p` once and checks it succeeded.
fn call(server: &FsServer, mem: &Mem, p: &Prepared) {
    let n = serve(server, mem, p);
    let h = out_header(mem, p);
    assert_eq!(h.error, 0, "request failed: {h:?}");
    assert_eq!(h.len as usize, n);
}

fn name(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn cfg() -> PassthroughConfig {
    PassthroughConfig::new(CacheMode::None, false)
}

fn shared_dir() -> tempdir::Dir {
    let d = tempdir::Dir::new("volfsd-bench");
    std::fs::write(d.path().join("f"), vec![7u8; 1 << 20]).unwrap();
    d
}

mod tempdir {
    use std::path::{Path, PathBuf};

    /// A directory under /tmp removed on drop.
    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(prefix: &str) -> Self {
            let p = std::env::temp_dir().join(format!("{prefix}.{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn request_path(c: &mut Criterion) {
    request_path_with(c, "request_path", true);
}

/// The same with `--no-metrics`: what per-operation metrics cost per request.
fn request_path_no_metrics(c: &mut Criterion) {
    request_path_with(c, "request_path_no_metrics", false);
}

fn request_path_with(c: &mut Criterion, group: &str, metrics: bool) {
    let dir = shared_dir();
    let fs = fs::build(
        dir.path(),
        None,
        false,
        PassthroughConfig { metrics, ..cfg() },
    )
    .unwrap();
    let server = FsServer::new(&fs);
    let mem = Mem::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap();

    let init = InitIn {
        major: 7,
        minor: 38,
        max_readahead: 128 << 10,
        flags: 0,
    };
    let p = prepare(&mem, 0, 26, 0, init.as_slice(), None, 256);
    serve(&server, &mem, &p);
    assert_eq!(out_header(&mem, &p).error, 0, "INIT failed");

    let lookup = prepare(&mem, 1, 1, 1, &name("f"), None, 128);
    call(&server, &mem, &lookup);
    let nodeid = reply_body::<EntryOut>(&mem, &lookup).nodeid;
    let open_in = OpenIn {
        flags: libc::O_RDWR as u32,
        fuse_flags: 0,
    };
    let open = prepare(&mem, 2, 14, nodeid, open_in.as_slice(), None, 16);
    call(&server, &mem, &open);
    let fh = reply_body::<OpenOut>(&mem, &open).fh;

    let getattr = prepare(
        &mem,
        3,
        3,
        nodeid,
        GetattrIn::default().as_slice(),
        None,
        104,
    );
    let read_in = ReadIn {
        fh,
        offset: 8192,
        size: 4096,
        ..Default::default()
    };
    let read = prepare(&mem, 4, 15, nodeid, read_in.as_slice(), None, 4096);
    let write_in = WriteIn {
        fh,
        offset: 12288,
        size: 4096,
        ..Default::default()
    };
    let data = vec![0x5au8; 4096];
    let write = prepare(&mem, 5, 16, nodeid, write_in.as_slice(), Some(&data), 8);
    for p in [&getattr, &read, &write] {
        call(&server, &mem, p);
    }

    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup", |b| {
        b.iter(|| black_box(serve(&server, &mem, &lookup)))
    });
    g.bench_function("getattr", |b| {
        b.iter(|| black_box(serve(&server, &mem, &getattr)))
    });
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("read_4k", |b| {
        b.iter(|| black_box(serve(&server, &mem, &read)))
    });
    g.bench_function("write_4k", |b| {
        b.iter(|| black_box(serve(&server, &mem, &write)))
    });
    g.finish();
}

fn control_api(c: &mut Criterion) {
    let dir = shared_dir();
    std::fs::create_dir(dir.path().join("x")).unwrap();
    let stack = fs::build(dir.path(), Some(&[]), false, cfg()).unwrap();
    let api = Api::new(
        stack.volumes,
        dir.path().to_path_buf(),
        dir.path().to_path_buf(),
        Arc::new(DeviceStats::default()),
    );
    let body = format!(
        r#"{{"path": "{}", "read_only": false}}"#,
        Path::new(dir.path()).join("x").display()
    );
    let put = api.handle("PUT", "/volumes/x", body.as_bytes());
    assert!(put.status / 100 == 2, "attach: {} {}", put.status, put.body);
    let del = api.handle("DELETE", "/volumes/x", b"");
    assert!(del.status / 100 == 2, "detach: {} {}", del.status, del.body);

    c.bench_function("control_api/attach_detach", |b| {
        b.iter(|| {
            let put = api.handle("PUT", "/volumes/x", body.as_bytes());
            let del = api.handle("DELETE", "/volumes/x", b"");
            black_box((put.status, del.status))
        })
    });
}

criterion_group!(benches, request_path, request_path_no_metrics, control_api);
criterion_main!(benches);
