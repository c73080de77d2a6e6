//! Target `region`: a session region handed back to the daemon (SET_INFLIGHT_FD
//! after a restart of the whole daemon, or left by a killed serving process), read
//! by every code that reads one back: the keeper's checks (`Region::open`), the
//! attached volumes' slot, each queue's requests in flight (`unanswered_in`), and
//! each journal half, rebuilt into a session and loaded into a fresh stack
//! (`FsServer::recover_session`, as a serving process started after a crash does).
//!
//! Input: writes into a fresh region, each `area u8 | offset u32 LE | len u16 LE |
//! bytes`: `area` picks one of `AREAS` (header, queues, volumes, journal halves),
//! `offset` is taken modulo its length, and the bytes are cut at its end and at the
//! input's. The stack is the `state` target's: a read-write volume `rw`, a
//! read-only volume `ro`, a directory `hidden` no volume names, a symlink out.
//!
//! Oracle: no panic; everything returns within 2 s (a watchdog aborts); the
//! volumes attached stay the stack's own (`rw` read-write, `ro` read-only, nothing
//! else), whatever the region's list says; no fd opened refers to anything outside
//! the scratch tree, to `hidden`, or to a device; `ro` is unchanged.

use std::collections::BTreeMap;

use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig};
use volfsd::exports::region::{Journal, unanswered_in, Half, Region, AREAS, MAX_QUEUES, QUEUE_SIZE};

use crate::common::{check_fds, open_fds, tree_checksum, Watchdog};
use crate::state::{check_no_fd_into, guest_view, lookup_id, scratch_tree, send};

const MAX_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Applies the input's writes to `region`; returns the queues written to.
fn write_into(region: &Region, mut data: &[u8]) -> Vec<usize> {
    let mut queues = Vec::new();
    while data.len() >= 7 {
        let (area, rest) = data.split_first().unwrap();
        let offset = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        let len = u16::from_le_bytes(rest[4..6].try_into().unwrap()) as usize;
        let rest = &rest[6..];
        let (name, start, size) = AREAS[usize::from(*area) % AREAS.len()];
        let at = offset % size;
        let n = len.min(rest.len()).min(size - at);
        region.write_raw(start + at, &rest[..n]);
        if name == "queues" {
            queues.push(at / (size / MAX_QUEUES));
        }
        data = &rest[n..];
    }
    queues.sort_unstable();
    queues.dedup();
    queues
}

/// A fresh region, sized past a file size limit another target of this process
/// may have set (the `fuse` target's, without a tmpfs of its own).
fn fresh_region() -> Region {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct; the limit is put back after.
    unsafe {
        libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit);
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        libc::setrlimit(libc::RLIMIT_FSIZE, &raised);
    }
    let region = Region::create().expect("a fresh session region");
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) };
    region
}

/// The volumes a stack serves: name to read-only.
fn volumes_of(stack: &fs::Stack) -> BTreeMap<String, bool> {
    stack
        .volumes
        .list()
        .iter()
        .map(|v| (v.share.name.clone(), v.share.read_only))
        .collect()
}

pub fn run_region(data: &[u8]) {
    let mut guard = scratch_tree().lock().unwrap_or_else(|e| e.into_inner());
    let tree = &mut *guard;
    let root = tree.scratch.path().to_path_buf();
    let baseline = open_fds();
    let written = fresh_region();
    let queues = write_into(&written, data);
    Watchdog::arm(MAX_TIME, "reading a session region handed back");
    // What the keeper checks of a region handed back.
    let fd = written.fd().try_clone_to_owned().expect("dup of the memfd");
    drop(written);
    let Ok(region) = Region::open(fd) else {
        Watchdog::disarm();
        return;
    };
    let header = region.header();
    let _ = (header.in_session(), header.current());
    let claimed = region.volumes();
    if let Some(c) = &claimed {
        assert!(c.len() < (1 << 20), "a volumes slot read past its room");
    }
    // Each queue written to, as a ring of the largest size whose used ring names
    // heads the input chose.
    for q in queues {
        let area = region.queue(q).expect("a queue of the region");
        let table = area.desc_table.load(std::sync::atomic::Ordering::Relaxed);
        let used = area.used_idx.load(std::sync::atomic::Ordering::Relaxed);
        let u = unanswered_in(area, table, QUEUE_SIZE as u16, used.wrapping_add(3), |i| {
            Some(u32::from(i) % (QUEUE_SIZE as u32 + 2))
        });
        assert!(u.heads.len() <= QUEUE_SIZE);
        assert!(u.heads.iter().all(|&h| usize::from(h) < QUEUE_SIZE));
    }
    Watchdog::disarm();
    // Each journal half, as the session of a serving process killed under a guest.
    for half in [Half::A, Half::B] {
        let stack = fs::build(
            &root,
            Some(&tree.specs),
            false,
            PassthroughConfig::new(CacheMode::None, true),
        )
        .expect("building the file system stack (needs root for open_tree)");
        let server = FsServer::new(&stack);
        let before = volumes_of(&stack);
        Watchdog::arm(MAX_TIME, "recovering a session from a journal half");
        let outcome = server.recover_session(region.half(half), &guest_view());
        Watchdog::disarm();
        if std::env::var_os("VOLFSD_FUZZ_TRACE").is_some() {
            eprintln!("journal half {half:?}: {:?}", outcome);
        }
        assert_eq!(
            volumes_of(&stack),
            before,
            "the region changed the volumes served"
        );
        check_no_fd_into(&root.join("hidden"));
        drop(server);
        drop(stack);
    }
    drop(region);
    check_fds(&baseline, &root);
    assert_eq!(
        tree_checksum(&root.join("ro")),
        tree.ro_sum,
        "the ro volume changed"
    );
}

/// A guest's session on the scratch tree, recorded into `journal` (`make_seeds`
/// set it up): INIT, `rw`, `rw/d`, `rw/d/e`, `rw/f` opened for writing with a lock,
/// `ro/f`. `then` runs while the session lives.
pub fn with_recorded_session<T>(journal: &'static Journal, then: impl FnOnce() -> T) -> T {
    let mut guard = scratch_tree().lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut *guard;
    let root = st.scratch.path().to_path_buf();
    let server = crate::state::build_recording(&root, &st.specs, Some(journal));
    let init = crate::fuse::request(
        crate::fuse::op::INIT as u32,
        0,
        0,
        0,
        &crate::fuse::init_body(),
    );
    assert_eq!(send(&server, st, init), Some(0));
    let rw = lookup_id(&server, st, 1, "rw").unwrap();
    let d = lookup_id(&server, st, rw, "d").unwrap();
    let _ = lookup_id(&server, st, d, "e");
    let f = lookup_id(&server, st, rw, "f").unwrap();
    let ro = lookup_id(&server, st, 1, "ro").unwrap();
    let _ = lookup_id(&server, st, ro, "f");
    let mut open = Vec::new();
    open.extend_from_slice(&(libc::O_RDWR as u32).to_le_bytes());
    open.extend_from_slice(&0u32.to_le_bytes());
    let _ = send(
        &server,
        st,
        crate::fuse::request(crate::fuse::op::OPEN as u32, 8, f, 0, &open),
    );
    let out = then();
    drop(server);
    out
}

/// Seeds: regions a real stack recorded its session into (see `make_seeds`), as the
/// writes that make them, one per area's written bytes.
pub fn seed_writes(region: &Region) -> Vec<u8> {
    let mut out = Vec::new();
    let fd = region.fd();
    for (i, (_, start, size)) in AREAS.iter().enumerate() {
        // Only the pages a region holds are read (it is sparse).
        let mut at = 0;
        while at < *size {
            let mut page = vec![0u8; 4096.min(size - at)];
            // SAFETY: pread into our buffer from the memfd.
            let n = unsafe {
                libc::pread(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    page.as_mut_ptr().cast(),
                    page.len(),
                    (start + at) as libc::off_t,
                )
            };
            if n > 0 && page.iter().any(|&b| b != 0) {
                let last = page.iter().rposition(|&b| b != 0).unwrap() + 1;
                out.push(i as u8);
                out.extend_from_slice(&(at as u32).to_le_bytes());
                out.extend_from_slice(&(last as u16).to_le_bytes());
                out.extend_from_slice(&page[..last]);
            }
            at += 4096;
        }
    }
    out
}
