//! What the dirty-page log's bitmap costs the queue worker when no migration runs:
//! the guest-memory work of one request (pop its chain, copy the request out, write
//! the reply through fuse-backend-rs's `VirtioFsWriter`, put it in the used ring),
//! timed on guest memory without a bitmap (`GuestMemoryMmap<()>`, what the daemon
//! used before), with vhost-user-backend's `BitmapMmapRegion` and with the daemon's
//! own `LogBitmap` (`src/device/dirty_log.rs`), no log given, alternately, several
//! rounds. No file system work: the differences are all the bitmaps'.
//!
//! `cargo bench -p volfsd-harness --bench dirty_log_cost`. Output: ns per request of
//! each, the median over the rounds, for a GETATTR-sized and a 4 KiB READ-sized
//! reply.

use std::time::Instant;

use fuse_backend_rs::transport::VirtioFsWriter;
use vhost_user_backend::bitmap::BitmapMmapRegion;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::{Bitmap, BitmapSlice};
use vm_memory::mmap::NewBitmap;
use vm_memory::{
    Address, Bytes, FileOffset, GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap,
};
use volfsd::device::GuestMmap;

/// The daemon's bitmap, named through its memory type.
type Daemons = <<GuestMmap as GuestMemory>::R as GuestMemoryRegion>::B;

const MEM_SIZE: usize = 4 << 20;
const QUEUE_SIZE: u16 = 256;
const REQUESTS: u64 = 200_000;
const ROUNDS: usize = 9;
const REQUEST_AT: u64 = 0x10_0000;
const HEADER_AT: u64 = 0x20_0000;
const BODY_AT: u64 = 0x30_0000;
const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;

/// The guest memory as a memfd, mapped once per view: the driver writes through a
/// view without a bitmap, so only the device's side differs between the runs.
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

/// One request's guest-memory work, `n` times, on the device's view `mem`; a chain
/// with an 80-byte request and a reply of `reply` bytes after the 16-byte header.
/// Returns ns per request.
fn run<B>(file: &std::fs::File, reply: usize, n: u64) -> f64
where
    B: Bitmap + NewBitmap + 'static,
    for<'a> <B as vm_memory::bitmap::WithBitmapSlice<'a>>::S: BitmapSlice,
{
    let driver = view::<()>(file);
    let mem = view::<B>(file);
    // The rings apart, each in its own page; one chain at head 0: the request, the
    // reply's header, its body.
    let (desc, avail, used) = (GuestAddress(0), GuestAddress(0x1000), GuestAddress(0x2000));
    let parts = [
        (REQUEST_AT, 80, VRING_DESC_F_NEXT, 1),
        (HEADER_AT, 16, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2),
        (BODY_AT, reply as u32, VRING_DESC_F_WRITE, 0),
    ];
    for (i, (addr, len, flags, next)) in parts.into_iter().enumerate() {
        let d = RawDescriptor::from(Descriptor::new(addr, len, flags, next));
        driver
            .write_obj(d, desc.unchecked_add(16 * i as u64))
            .unwrap();
    }
    // Every avail entry names head 0 (memory starts zeroed).
    let avail_idx = avail.unchecked_add(2);
    let mut q = Queue::new(QUEUE_SIZE).unwrap();
    q.set_size(QUEUE_SIZE);
    q.try_set_desc_table_address(desc).unwrap();
    q.try_set_avail_ring_address(avail).unwrap();
    q.try_set_used_ring_address(used).unwrap();
    q.set_ready(true);
    let payload = vec![0x5au8; 16 + reply];
    let mut request = [0u8; 80];
    let t = Instant::now();
    for i in 0..n {
        // Publish a ring's worth at a time.
        if i % u64::from(QUEUE_SIZE) == 0 {
            let next = q.next_avail().wrapping_add(QUEUE_SIZE);
            driver.write_obj(next, avail_idx).unwrap();
        }
        let chain = q.pop_descriptor_chain(&mem).expect("a chain");
        let head = chain.head_index();
        for d in chain.clone().readable() {
            mem.read_slice(&mut request[..d.len() as usize], d.addr())
                .unwrap();
        }
        let mut w = VirtioFsWriter::new(&mem, chain).unwrap();
        std::io::Write::write_all(&mut w, &payload).unwrap();
        q.add_used(&mem, head, payload.len() as u32).unwrap();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let file = memfd();
    println!(
        "{:<16} {:>10} {:>18} {:>12}",
        "reply", "no bitmap", "BitmapMmapRegion", "LogBitmap"
    );
    for (name, reply) in [("getattr (104 B)", 104), ("read (4 KiB)", 4096)] {
        // Warm up each.
        run::<()>(&file, reply, REQUESTS / 10);
        run::<BitmapMmapRegion>(&file, reply, REQUESTS / 10);
        run::<Daemons>(&file, reply, REQUESTS / 10);
        let mut ns: [Vec<f64>; 3] = Default::default();
        for _ in 0..ROUNDS {
            ns[0].push(run::<()>(&file, reply, REQUESTS));
            ns[1].push(run::<BitmapMmapRegion>(&file, reply, REQUESTS));
            ns[2].push(run::<Daemons>(&file, reply, REQUESTS));
        }
        let [a, b, c] = ns.map(median);
        println!(
            "{name:<16} {a:>8.1}ns {b:>10.1}ns ({:+6.1}) {c:>6.1}ns ({:+5.1})",
            b - a,
            c - a
        );
    }
}
