//! What the dirty-page log's bitmap costs a request when no migration runs. One
//! binary serves the same requests the way a queue worker does (pop the chain, copy
//! the request out, `FsServer::handle_local` into fuse-backend-rs's
//! `VirtioFsWriter`, put it in the used ring) on guest memory of three types: no
//! bitmap (`GuestMemoryMmap<()>`, what the daemon used before), vhost-user-backend's
//! `BitmapMmapRegion`, and the daemon's own `LogBitmap` (`src/device/dirty_log.rs`),
//! no log given. The file system work is the same code in all three; only the
//! bitmap type differs, down to fuse-backend-rs's generic request code.
//!
//! Timing on this machine's hypervisor drifts by ±20% between runs of the same
//! binary, so the types run in short rounds, alternated, and the ratio to "no bitmap"
//! is taken per round (as benches/ab.sh does per pair), then its median.
//!
//! `cargo bench -p volfsd-harness --bench dirty_log_cost` (as root: the file system
//! stack clones its share with open_tree). Output: per request type, the median ns
//! of each and the median per-round ratio with its range.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{
    EntryOut, GetattrIn, InHeader, InitIn, Opcode, OpenIn, OpenOut, OutHeader, ReadIn,
};
use fuse_backend_rs::transport::VirtioFsWriter;
use vhost_user_backend::bitmap::BitmapMmapRegion;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;
use vm_memory::{
    Address, ByteValued, Bytes, FileOffset, GuestAddress, GuestMemory, GuestMemoryMmap,
    GuestMemoryRegion, GuestRegionMmap,
};
use volfsd::exports::device::GuestMmap;
use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig};

/// The daemon's bitmap, named through its memory type.
type Daemons = <<GuestMmap as GuestMemory>::R as GuestMemoryRegion>::B;

const MEM_SIZE: usize = 4 << 20;
const QUEUE_SIZE: u16 = 256;
const PER_ROUND: u64 = 20_000;
const ROUNDS: usize = 101;
const REQUEST_AT: u64 = 0x10_0000;
const HEADER_AT: u64 = 0x20_0000;
const BODY_AT: u64 = 0x30_0000;
const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;

/// The guest memory, a memfd mapped once per view: the driver writes through a view
/// without a bitmap, so only the device's side differs between the types.
fn memfd() -> std::fs::File {
    let name = std::ffi::CString::new("dirty-log-cost").unwrap();
    let fd = nix::sys::memfd::memfd_create(&name, nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
        .expect("memfd");
    let f = std::fs::File::from(fd);
    f.set_len(MEM_SIZE as u64).unwrap();
    f
}

fn view<B: NewBitmap>(file: &std::fs::File) -> GuestMemoryMmap<B> {
    let region = GuestRegionMmap::from_range(
        GuestAddress(0),
        MEM_SIZE,
        Some(FileOffset::new(file.try_clone().unwrap(), 0)),
    )
    .unwrap();
    GuestMemoryMmap::from_regions(vec![region]).unwrap()
}

/// A request in local memory: header and arguments.
fn request(opcode: Opcode, nodeid: u64, args: &[u8]) -> Vec<u8> {
    let mut r = InHeader {
        len: (std::mem::size_of::<InHeader>() + args.len()) as u32,
        opcode: opcode as u32,
        unique: 2,
        nodeid,
        ..Default::default()
    }
    .as_slice()
    .to_vec();
    r.extend_from_slice(args);
    r
}

/// A ring (descriptor table at 0, avail ring at 4 KiB, used ring at 8 KiB, every
/// avail entry naming head 0) holding one chain: `req`, then a 16-byte header and a
/// `reply`-byte body to write. Returns the device's queue.
fn ring(driver: &GuestMemoryMmap<()>, req: &[u8], reply: u32) -> Queue {
    driver.write_slice(req, GuestAddress(REQUEST_AT)).unwrap();
    let parts = [
        (REQUEST_AT, req.len() as u32, VRING_DESC_F_NEXT, 1),
        (HEADER_AT, 16, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2),
        (BODY_AT, reply, VRING_DESC_F_WRITE, 0),
    ];
    for (i, (addr, len, flags, next)) in parts.into_iter().enumerate() {
        let d = RawDescriptor::from(Descriptor::new(addr, len, flags, next));
        driver.write_obj(d, GuestAddress(16 * i as u64)).unwrap();
    }
    let mut q = Queue::new(QUEUE_SIZE).unwrap();
    q.set_size(QUEUE_SIZE);
    q.try_set_desc_table_address(GuestAddress(0)).unwrap();
    q.try_set_avail_ring_address(GuestAddress(0x1000)).unwrap();
    q.try_set_used_ring_address(GuestAddress(0x2000)).unwrap();
    q.set_ready(true);
    q
}

/// Serves `req` `n` times as a worker does, on the device's view of type `B`.
/// Returns ns per request.
fn run<B>(file: &std::fs::File, server: &FsServer, req: &[u8], reply: u32, n: u64) -> f64
where
    B: Bitmap + NewBitmap + 'static,
    for<'a> <B as WithBitmapSlice<'a>>::S: BitmapSlice + Default,
{
    let driver = view::<()>(file);
    let mem = view::<B>(file);
    let mut q = ring(&driver, req, reply);
    let avail_idx = GuestAddress(0x1000).unchecked_add(2);
    let mut local = Vec::with_capacity(4096);
    let t = Instant::now();
    for i in 0..n {
        // Publish a ring's worth at a time.
        if i % u64::from(QUEUE_SIZE) == 0 {
            let next = q.next_avail().wrapping_add(QUEUE_SIZE);
            driver.write_obj(next, avail_idx).unwrap();
        }
        let chain = q.pop_descriptor_chain(&mem).expect("a chain");
        let head = chain.head_index();
        local.clear();
        for d in chain.clone().readable() {
            let start = local.len();
            local.resize(start + d.len() as usize, 0);
            mem.read_slice(&mut local[start..], d.addr()).unwrap();
        }
        let w = VirtioFsWriter::new(&mem, chain).unwrap();
        let len = server.handle_local(&mut local, w.into()).unwrap();
        q.add_used(&mem, head, len as u32).unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    // Every type wrote the reply (a type that skipped it would look cheap).
    let h: OutHeader = driver.read_obj(GuestAddress(HEADER_AT)).unwrap();
    assert_eq!((h.error, h.len), (0, 16 + reply), "{h:?}");
    driver
        .write_obj(OutHeader::default(), GuestAddress(HEADER_AT))
        .unwrap();
    ns
}

/// Serves one request on plain memory and returns its reply's header and body.
/// (INIT and LOOKUP reply shorter than `reply`: their length is not checked.)
fn call(file: &std::fs::File, server: &FsServer, req: &[u8], reply: u32) -> Vec<u8> {
    let driver = view::<()>(file);
    let mem = view::<()>(file);
    let mut q = ring(&driver, req, reply);
    driver
        .write_obj(1u16, GuestAddress(0x1000).unchecked_add(2))
        .unwrap();
    let chain = q.pop_descriptor_chain(&mem).expect("a chain");
    let mut local = req.to_vec();
    let w = VirtioFsWriter::new(&mem, chain).unwrap();
    server.handle_local(&mut local, w.into()).unwrap();
    let h: OutHeader = driver.read_obj(GuestAddress(HEADER_AT)).unwrap();
    assert_eq!(h.error, 0, "request failed: {h:?}");
    let mut body = vec![0u8; reply as usize];
    driver.read_slice(&mut body, GuestAddress(BODY_AT)).unwrap();
    body
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("volfsd-dirty-log-cost.{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("f"), vec![7u8; 1 << 20]).unwrap();
    let stack = fs::build(
        Path::new(&dir),
        None,
        false,
        PassthroughConfig::new(CacheMode::None, false),
    )
    .expect("the file system stack (run as root)");
    let server = Arc::new(FsServer::new(&stack));
    let file = memfd();

    let init = InitIn {
        major: 7,
        minor: 38,
        max_readahead: 128 << 10,
        flags: 0,
    };
    call(
        &file,
        &server,
        &request(Opcode::Init, 0, init.as_slice()),
        256,
    );
    let entry = call(&file, &server, &request(Opcode::Lookup, 1, b"f\0"), 128);
    let node = EntryOut::from_slice(&entry).unwrap().nodeid;
    let open = OpenIn {
        flags: libc::O_RDONLY as u32,
        fuse_flags: 0,
    };
    let out = call(
        &file,
        &server,
        &request(Opcode::Open, node, open.as_slice()),
        16,
    );
    let fh = OpenOut::from_slice(&out).unwrap().fh;
    let read = ReadIn {
        fh,
        offset: 8192,
        size: 4096,
        ..Default::default()
    };
    let requests = [
        (
            "getattr",
            request(Opcode::Getattr, node, GetattrIn::default().as_slice()),
            104,
        ),
        (
            "read 4 KiB",
            request(Opcode::Read, node, read.as_slice()),
            4096,
        ),
    ];

    println!(
        "{:<11} {:>10} {:>18} {:>18}",
        "request", "no bitmap", "BitmapMmapRegion", "LogBitmap"
    );
    for (name, req, reply) in &requests {
        // Warm up each.
        run::<()>(&file, &server, req, *reply, PER_ROUND);
        run::<BitmapMmapRegion>(&file, &server, req, *reply, PER_ROUND);
        run::<Daemons>(&file, &server, req, *reply, PER_ROUND);
        let mut ns: [Vec<f64>; 3] = Default::default();
        for round in 0..ROUNDS {
            // The order rotates, so no type always runs first.
            let order = [round % 3, (round + 1) % 3, (round + 2) % 3];
            for t in order {
                let x = match t {
                    0 => run::<()>(&file, &server, req, *reply, PER_ROUND),
                    1 => run::<BitmapMmapRegion>(&file, &server, req, *reply, PER_ROUND),
                    _ => run::<Daemons>(&file, &server, req, *reply, PER_ROUND),
                };
                ns[t].push(x);
            }
        }
        let ratio = |t: usize| -> (f64, f64, f64) {
            let r: Vec<f64> = ns[t].iter().zip(&ns[0]).map(|(x, y)| x / y).collect();
            let (lo, hi) = r
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            (median(r), lo, hi)
        };
        let (b, c) = (ratio(1), ratio(2));
        println!(
            "{name:<11} {:>8.0}ns {:>6.0}ns {:.3}x {:>6.0}ns {:.3}x   (per-round ratio ranges {:.2}-{:.2}, {:.2}-{:.2})",
            median(ns[0].clone()),
            median(ns[1].clone()),
            b.0,
            median(ns[2].clone()),
            c.0,
            b.1,
            b.2,
            c.1,
            c.2
        );
    }
    drop(stack);
    let _ = std::fs::remove_dir_all(&dir);
}
