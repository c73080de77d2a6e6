//! Target `virtqueue`: virtqueue processing with arbitrary descriptor tables and
//! avail rings: `device::queue::process` (what the vhost-user worker runs on a kick)
//! down to the FUSE server, on a SharedDir with a `rw` and a `ro:ro` volume.
//!
//! Input: a 16-byte control block, then the guest memory image:
//! ```text
//! 0  queue_size u16   2  desc_table u16   4  avail_ring u16   6  used_ring u16
//! 8  flags u8 (bit 0 EVENT_IDX, bit 1 serve it as the hiprio queue (index 0)
//!    instead of request queue 1, bit 2 kick twice)
//! 9  next_avail u16  11  next_used u16  13..16 unused
//! 16.. copied to guest memory: region A [0, 64 KiB) then region B
//!      [68 KiB, 72 KiB) (a hole between them)
//! ```
//! Ring addresses are offsets in guest memory. A fresh server (so a fresh FUSE
//! session: the input's own INIT decides whether requests are served) and a fresh
//! vring are made per input.
//!
//! Oracle: no panic; each `process` call returns within [`MAX_CALL`] of wall time
//! (a watchdog thread aborts the process otherwise, so AFL saves it as a crash),
//! having served at most the queue's size in chains (a chain loop or a lying avail
//! index must not keep it going); the read-only volume is unchanged.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic};
use volfsd::exports::device::inflight::InFlight;
use volfsd::exports::device::later::{Later, Parked, WaitRoom, WakeTimer};
use volfsd::exports::device::poll::Poller;
use volfsd::exports::device::queue::{self, QueueRef};
use volfsd::exports::device::ring::{QueueCounters, QueueHealth, RingRef};
use volfsd::exports::device::{GuestMem, GuestMmap, Vring, MAX_QUEUE_SIZE};
use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig, ShareSpec};

use crate::common::{limit_file_size, tree_checksum, Cursor, Scratch, Watchdog};

pub const REGION_A: (u64, usize) = (0, 64 * 1024);
pub const REGION_B: (u64, usize) = (68 * 1024, 4 * 1024);
pub const CONTROL_LEN: usize = 16;
/// What one `handle_event` may take (the fs requests included) before it counts as
/// unbounded.
const MAX_CALL: Duration = Duration::from_secs(2);

struct State {
    scratch: Scratch,
    mem: GuestMem,
    specs: Vec<ShareSpec>,
    ro_sum: u64,
}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| {
        let scratch = Scratch::new("virtqueue", Some(32));
        if !scratch.on_tmpfs() {
            limit_file_size(32 << 20);
        }
        let p = scratch.path().to_path_buf();
        std::fs::create_dir_all(p.join("rw/d")).unwrap();
        std::fs::write(p.join("rw/f"), b"rw-data\n").unwrap();
        std::fs::create_dir_all(p.join("ro/d")).unwrap();
        std::fs::write(p.join("ro/f"), b"ro-data\n").unwrap();
        let specs =
            // rw is rate-limited so that some requests wait out of the ring and are
            // served at a later kick (a bucket of 4 requests, refilled every 1 ms).
            volfsd::exports::config::parse_allowed_dirs(
                &p,
                &[
                    "rw,ops_size=4,ops_refill_time_ms=1".to_string(),
                    "ro:ro".to_string(),
                ],
            )
            .unwrap();
        let mem = GuestMmap::from_ranges(&[
            (GuestAddress(REGION_A.0), REGION_A.1),
            (GuestAddress(REGION_B.0), REGION_B.1),
        ])
        .expect("guest memory");
        let ro_sum = tree_checksum(&p.join("ro"));
        Mutex::new(State {
            scratch,
            mem: GuestMemoryAtomic::new(mem),
            specs,
            ro_sum,
        })
    })
}

fn load_image(mem: &GuestMmap, image: &[u8]) {
    let zero = vec![0u8; REGION_A.1];
    let (a, b) = image.split_at(image.len().min(REGION_A.1));
    mem.write_slice(&zero, GuestAddress(REGION_A.0)).unwrap();
    mem.write_slice(&zero[..REGION_B.1], GuestAddress(REGION_B.0))
        .unwrap();
    mem.write_slice(a, GuestAddress(REGION_A.0)).unwrap();
    let b = &b[..b.len().min(REGION_B.1)];
    mem.write_slice(b, GuestAddress(REGION_B.0)).unwrap();
}

pub fn run_virtqueue(data: &[u8]) {
    let guard = state().lock().unwrap_or_else(|e| e.into_inner());
    let st = &*guard;
    let mut c = Cursor::new(data);
    let queue_size = c.u16();
    let desc = c.u16() as u64;
    let avail = c.u16() as u64;
    let used = c.u16() as u64;
    let flags = c.u8();
    let next_avail = c.u16();
    let next_used = c.u16();
    c.take(3);
    let image = c.rest();
    let event_idx = flags & 1 != 0;
    let hiprio = flags & 2 != 0;
    let kicks = if flags & 4 != 0 { 2 } else { 1 };

    load_image(&st.mem.memory(), image);

    let root = st.scratch.path();
    let stack = fs::build(
        root,
        Some(&st.specs),
        false,
        PassthroughConfig::new(CacheMode::None, false),
    )
    .expect("building the file system stack (needs root for open_tree)");
    let server = Arc::new(FsServer::new(&stack));
    drop(stack);
    let health = Arc::new(QueueHealth::default());
    let poller = Poller::default();
    let counters = QueueCounters::default();
    let served = &counters.served;

    let vring = Vring::new(st.mem.clone(), MAX_QUEUE_SIZE as u16).unwrap();
    vring.set_queue_size(queue_size);
    // As vhost-user-backend does: an address the queue refuses leaves the earlier
    // one (0) in place, and the queue is made ready on the kick whatever it holds.
    let _ = vring.set_queue_info(desc, avail, used);
    vring.set_queue_event_idx(event_idx);
    vring.set_queue_next_avail(next_avail);
    vring.set_queue_next_used(next_used);
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    // The size the queue took (an invalid one leaves the maximum).
    let size = vring.get_ref().get_queue().size();
    if skip_open() && queue_invalid(&vring, &st.mem) {
        return;
    }
    let index = if hiprio { 0 } else { 1 };
    let room = Mutex::new(WaitRoom::default());
    let timer = WakeTimer::new().expect("a timerfd");
    let parked = Arc::new(Parked::default());
    let queue_ref = QueueRef {
        ring: RingRef {
            vring: &vring,
            index,
            event_idx,
            counters: &counters,
            health: &health,
            // No keeper: nothing is marked.
            inflight: InFlight::default(),
            // No polling: each input is drained once.
            poller: &poller,
        },
        later: Later {
            room: (!hiprio).then_some(&room),
            timer: (!hiprio).then_some(&timer),
            parked: &parked,
        },
    };

    for _ in 0..kicks {
        let before = served.load(Ordering::Relaxed);
        let waiting = room.lock().unwrap().len() as u64;
        let t = Instant::now();
        Watchdog::arm(MAX_CALL, "device::queue::process");
        // Errors are the frontend's (an unusable ring): they end the call, not the
        // process, as in the daemon's worker.
        // Under the vring's lock, as the worker serves a queue.
        let _ = queue::process(&server, &st.mem, &queue_ref, &mut vring.get_mut());
        Watchdog::disarm();
        let took = t.elapsed();
        let n = served.load(Ordering::Relaxed) - before;
        if crate::fuse::trace() {
            eprintln!("virtqueue: queue {index} size {size}: served {n} in {took:?}");
        }
        // One pass pops at most queue_size chains; with EVENT_IDX it re-checks once
        // the avail index stops moving, which it cannot here (nobody publishes). It
        // may also serve the throttled requests that waited from earlier passes.
        assert!(
            n <= size as u64 + waiting,
            "served {n} chains from a queue of {size} with {waiting} waiting"
        );
        assert!(took < MAX_CALL, "process took {took:?}");
    }
    drop(vring);
    drop(server);
    assert_eq!(
        tree_checksum(&root.join("ro")),
        st.ro_sum,
        "the read-only volume changed"
    );
}

/// `VOLFSD_FUZZ_SKIP_OPEN=1`: skip inputs whose queue virtio-queue finds invalid
/// (e.g. a ring not all in guest memory), the class of a finding while it was open,
/// so that a campaign can look for other bugs meanwhile. Off by default and in CI.
fn skip_open() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var_os("VOLFSD_FUZZ_SKIP_OPEN").is_some())
}

fn queue_invalid(vring: &Vring, mem: &GuestMem) -> bool {
    !vring.get_ref().get_queue().is_valid(&*mem.memory())
}

/// Writes a split-ring layout for the seed generator: `chains` is a list of
/// (readable bytes, writable length); each chain gets one descriptor per part.
/// Returns the full input (control block + image).
pub fn build_input(chains: &[(Vec<u8>, u32)], queue_size: u16, flags: u8) -> Vec<u8> {
    const DESC: u64 = 0x0;
    const AVAIL: u64 = 0x100;
    const USED: u64 = 0x180;
    const DATA: u64 = 0x300;
    let mut image = vec![0u8; DATA as usize];
    let mut data: Vec<u8> = Vec::new();
    let mut di = 0u16;
    let mut heads = Vec::new();
    for (readable, wlen) in chains {
        heads.push(di);
        let raddr = DATA + data.len() as u64;
        data.extend_from_slice(readable);
        while !data.len().is_multiple_of(8) {
            data.push(0);
        }
        let waddr = DATA + data.len() as u64;
        data.resize(data.len() + *wlen as usize, 0);
        // descriptor: addr u64, len u32, flags u16 (1 NEXT, 2 WRITE), next u16
        let mut put = |di: &mut u16, addr: u64, len: u32, fl: u16, next: u16| {
            let off = DESC as usize + *di as usize * 16;
            image[off..off + 8].copy_from_slice(&addr.to_le_bytes());
            image[off + 8..off + 12].copy_from_slice(&len.to_le_bytes());
            image[off + 12..off + 14].copy_from_slice(&fl.to_le_bytes());
            image[off + 14..off + 16].copy_from_slice(&next.to_le_bytes());
            *di += 1;
        };
        let next = di + 1;
        put(&mut di, raddr, readable.len() as u32, 1, next);
        put(&mut di, waddr, *wlen, 2, 0);
    }
    // avail ring: flags u16, idx u16, ring[]
    let a = AVAIL as usize;
    image[a + 2..a + 4].copy_from_slice(&(heads.len() as u16).to_le_bytes());
    for (i, h) in heads.iter().enumerate() {
        image[a + 4 + 2 * i..a + 6 + 2 * i].copy_from_slice(&h.to_le_bytes());
    }
    image.extend_from_slice(&data);
    image.truncate(REGION_A.1);
    let mut input = Vec::new();
    input.extend_from_slice(&queue_size.to_le_bytes());
    input.extend_from_slice(&(DESC as u16).to_le_bytes());
    input.extend_from_slice(&(AVAIL as u16).to_le_bytes());
    input.extend_from_slice(&(USED as u16).to_le_bytes());
    input.push(flags);
    input.extend_from_slice(&0u16.to_le_bytes());
    input.extend_from_slice(&0u16.to_le_bytes());
    input.extend_from_slice(&[0u8; 3]);
    input.extend_from_slice(&image);
    input
}
