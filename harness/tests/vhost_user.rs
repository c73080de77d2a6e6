//! End-to-end tests: start the daemon binary, drive it through the frontend
//! (acting as VMM + guest virtio-fs driver) and check both the FUSE replies
//! and the host directory.
//!
//! Run against the reference implementation with
//! `VOLFSD_TEST_DAEMON=~/.cargo/bin/virtiofsd cargo test --test vhost_user`;
//! tests that depend on volfsd-specific behaviour say so where they branch.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{GetattrIn, Opcode, SetattrIn, SetattrValid};
use vm_memory::GuestAddress;
use volfsd_harness::frontend::fuse::{
    ChainPart, FuseOps, InitParams, RawChain, Request, XattrReply,
};
use volfsd_harness::frontend::{Error, FuseClient, Segment};

use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{self, assert_errno, host_read, Daemon, ROOT};

const RDWR: u32 = libc::O_RDWR as u32;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;

/// Creates `name` in `parent` with `data`, returns (nodeid, fh).
fn create_with(c: &mut FuseClient, parent: u64, name: &str, data: &[u8]) -> (u64, u64) {
    let (entry, open) = c.create(parent, name, RDWR, 0o644).expect("create");
    assert_eq!(
        c.write(entry.nodeid, open.fh, 0, data).expect("write"),
        data.len() as u32
    );
    (entry.nodeid, open.fh)
}

#[test]
fn init_negotiates_like_linux() {
    let d = Daemon::start("init", &[]);
    let mut c = FuseClient::connect(&d.config()).expect("connect");
    let features = c.device().features();
    assert!(features.acked_features & (1 << 32) != 0, "VERSION_1 acked");
    assert!(features.max_queues >= 2, "hiprio + one request queue");
    let out = c.init_session(&InitParams::default()).expect("init");
    assert_eq!(out.major, 7);
    assert!(out.minor >= 31, "minor {}", out.minor);
    assert!(out.max_write >= 4096, "max_write {}", out.max_write);
    let requested = InitParams::default().flags;
    let granted = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    assert_eq!(
        granted & !requested,
        0,
        "granted unrequested flags {granted:#x}"
    );
    // A working session after INIT.
    assert_eq!(
        c.getattr(ROOT).expect("getattr root").attr.mode & libc::S_IFMT,
        S_IFDIR
    );
}

#[test]
fn lookup_and_getattr_see_host_files() {
    let d = Daemon::start("lookup", &[]);
    std::fs::write(d.host("hostfile"), b"12345").unwrap();
    let mut c = d.client();
    let entry = c.lookup(ROOT, "hostfile").expect("lookup");
    assert_ne!(entry.nodeid, 0);
    assert_eq!(entry.attr.size, 5);
    assert_eq!(
        entry.attr.ino,
        std::fs::metadata(d.host("hostfile")).unwrap().ino()
    );
    let attr = c.getattr(entry.nodeid).expect("getattr");
    assert_eq!(attr.attr.mode & libc::S_IFMT, S_IFREG);
    assert_errno(c.lookup(ROOT, "missing"), libc::ENOENT);
}

#[test]
fn create_write_read_roundtrip() {
    let d = Daemon::start("rw", &[]);
    let mut c = d.client();
    let (entry, open) = c.create(ROOT, "data", RDWR, 0o640).expect("create");
    let meta = std::fs::metadata(d.host("data")).expect("created on host");
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    assert_eq!(entry.attr.ino, meta.ino());

    // 256 KiB of patterned data in one WRITE, then a small overwrite.
    let big: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        c.write(entry.nodeid, open.fh, 0, &big).unwrap(),
        big.len() as u32
    );
    assert_eq!(c.write(entry.nodeid, open.fh, 10, b"HELLO").unwrap(), 5);
    let mut expected = big.clone();
    expected[10..15].copy_from_slice(b"HELLO");
    assert_eq!(host_read(&d.host("data")), expected);

    let read = c.read(entry.nodeid, open.fh, 0, 300 * 1024).expect("read");
    assert_eq!(read, expected, "short read at EOF returns the whole file");
    assert_eq!(
        c.read(entry.nodeid, open.fh, 8, 9).unwrap(),
        &expected[8..17]
    );
    assert!(c
        .read(entry.nodeid, open.fh, 1 << 20, 10)
        .unwrap()
        .is_empty());
    assert_eq!(
        c.getattr(entry.nodeid).unwrap().attr.size,
        expected.len() as u64
    );

    c.flush(entry.nodeid, open.fh, 0).expect("flush");
    c.release(entry.nodeid, open.fh, RDWR).expect("release");
    // Reopen read-only and read through the new handle.
    let ro = c.open(entry.nodeid, libc::O_RDONLY as u32).expect("open");
    assert_eq!(c.read(entry.nodeid, ro.fh, 10, 5).unwrap(), b"HELLO");
    c.release(entry.nodeid, ro.fh, 0).unwrap();
    assert_errno(
        c.create(ROOT, "data", RDWR | libc::O_EXCL as u32, 0o644),
        libc::EEXIST,
    );
}

#[test]
fn setattr_truncates_and_chmods() {
    let d = Daemon::start("setattr", &[]);
    let mut c = d.client();
    let (node, fh) = create_with(&mut c, ROOT, "f", b"0123456789");
    let truncate = SetattrIn {
        valid: SetattrValid::SIZE.bits(),
        size: 4,
        ..Default::default()
    };
    assert_eq!(c.setattr(node, &truncate).expect("truncate").attr.size, 4);
    assert_eq!(host_read(&d.host("f")), b"0123");

    let chmod = SetattrIn {
        valid: SetattrValid::MODE.bits(),
        mode: S_IFREG | 0o600,
        ..Default::default()
    };
    let attr = c.setattr(node, &chmod).expect("chmod").attr;
    assert_eq!(attr.mode & 0o7777, 0o600);
    let meta = std::fs::metadata(d.host("f")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);

    // Extend through the file handle (FATTR_FH), like ftruncate.
    let extend = SetattrIn {
        valid: SetattrValid::SIZE.bits() | fuse_backend_rs::abi::fuse_abi::FATTR_FH,
        fh,
        size: 8192,
        ..Default::default()
    };
    assert_eq!(c.setattr(node, &extend).expect("ftruncate").attr.size, 8192);
    assert_eq!(std::fs::metadata(d.host("f")).unwrap().len(), 8192);
}

#[test]
fn mkdir_and_readdirplus_lists_every_name() {
    let d = Daemon::start("readdir", &[]);
    let mut c = d.client();
    let dir = c.mkdir(ROOT, "dir", 0o755).expect("mkdir");
    assert_eq!(dir.attr.mode & libc::S_IFMT, S_IFDIR);
    assert!(d.host("dir").is_dir());

    // Long names force several READDIRPLUS rounds with a 4 KiB buffer.
    let mut expected = BTreeSet::new();
    for i in 0..30 {
        let name = format!("host-{i:02}-{}", "h".repeat(100));
        std::fs::write(d.host(&format!("dir/{name}")), b"").unwrap();
        expected.insert(name);
    }
    for i in 0..30 {
        let name = format!("fuse-{i:02}-{}", "f".repeat(100));
        let (node, fh) = create_with(&mut c, dir.nodeid, &name, &vec![b'x'; i]);
        c.release(node, fh, 0).unwrap();
        expected.insert(name);
    }

    let dh = c
        .opendir(dir.nodeid, libc::O_RDONLY as u32)
        .expect("opendir");
    let entries = c.readdirplus_all(dir.nodeid, dh.fh).expect("readdirplus");
    let names: Vec<String> = entries.iter().map(|e| e.dirent.name_str()).collect();
    let unique: BTreeSet<String> = names.iter().cloned().collect();
    assert_eq!(unique.len(), names.len(), "duplicate entries: {names:?}");
    let mut want = expected.clone();
    want.insert(".".into());
    want.insert("..".into());
    assert_eq!(unique, want);

    let mut lookups = Vec::new();
    for e in &entries {
        let name = e.dirent.name_str();
        if name == "." || name == ".." {
            continue;
        }
        let meta = std::fs::metadata(d.host(&format!("dir/{name}"))).unwrap();
        assert_eq!(e.entry.attr.ino, meta.ino(), "{name}");
        assert_eq!(e.entry.attr.size, meta.len(), "{name}");
        assert_ne!(e.entry.nodeid, 0, "{name} has a node id");
        lookups.push((e.entry.nodeid, 1));
    }
    // Plain READDIR agrees.
    let plain = c.readdir(dir.nodeid, dh.fh, 0, 64 * 1024).expect("readdir");
    assert_eq!(plain.len(), want.len());
    c.releasedir(dir.nodeid, dh.fh).expect("releasedir");
    c.batch_forget(&lookups).expect("batch_forget");
    assert!(c.getattr(dir.nodeid).is_ok(), "served after batch forget");
}

#[test]
fn rename_and_rename2_flags() {
    let d = Daemon::start("rename", &[]);
    let mut c = d.client();
    create_with(&mut c, ROOT, "a", b"AAA");
    create_with(&mut c, ROOT, "b", b"BBB");
    let sub = c.mkdir(ROOT, "sub", 0o755).unwrap();

    c.rename(ROOT, "a", sub.nodeid, "a2").expect("rename");
    assert!(!d.host("a").exists());
    assert_eq!(host_read(&d.host("sub/a2")), b"AAA");

    assert_errno(
        c.rename2(sub.nodeid, "a2", ROOT, "b", libc::RENAME_NOREPLACE),
        libc::EEXIST,
    );
    assert_eq!(
        host_read(&d.host("b")),
        b"BBB",
        "NOREPLACE left target alone"
    );
    assert_eq!(host_read(&d.host("sub/a2")), b"AAA");

    c.rename2(sub.nodeid, "a2", ROOT, "b", libc::RENAME_EXCHANGE)
        .expect("exchange");
    assert_eq!(host_read(&d.host("b")), b"AAA");
    assert_eq!(host_read(&d.host("sub/a2")), b"BBB");

    c.rename2(ROOT, "b", ROOT, "c", libc::RENAME_NOREPLACE)
        .expect("noreplace to a free name");
    assert_eq!(host_read(&d.host("c")), b"AAA");
    assert_errno(c.rename(ROOT, "missing", ROOT, "x"), libc::ENOENT);
}

#[test]
fn link_symlink_readlink() {
    let d = Daemon::start("links", &[]);
    let mut c = d.client();
    let (node, _) = create_with(&mut c, ROOT, "orig", b"data");
    let linked = c.link(node, ROOT, "hard").expect("link");
    assert_eq!(linked.nodeid, node, "hard link resolves to the same node");
    assert_eq!(linked.attr.nlink, 2);
    let meta = std::fs::metadata(d.host("hard")).unwrap();
    assert_eq!(meta.nlink(), 2);
    assert_eq!(meta.ino(), std::fs::metadata(d.host("orig")).unwrap().ino());

    let sym = c.symlink(ROOT, "sym", "orig").expect("symlink");
    assert_eq!(sym.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        std::fs::read_link(d.host("sym")).unwrap().to_str(),
        Some("orig")
    );
    assert_eq!(c.readlink(sym.nodeid).expect("readlink"), b"orig");
    // Linux never sends READLINK for a non-symlink; EINVAL (readlink(2)) or
    // ENOENT (readlinkat on an O_PATH fd, what virtiofsd returns) are both fine.
    let errno = c.readlink(node).unwrap_err().errno();
    assert!(
        matches!(errno, Some(libc::EINVAL | libc::ENOENT)),
        "{errno:?}"
    );
}

#[test]
fn unlink_and_rmdir() {
    let d = Daemon::start("unlink", &[]);
    let mut c = d.client();
    let dir = c.mkdir(ROOT, "d", 0o700).unwrap();
    create_with(&mut c, dir.nodeid, "f", b"x");
    assert_errno(c.rmdir(ROOT, "d"), libc::ENOTEMPTY);
    assert_errno(c.unlink(ROOT, "d"), libc::EISDIR);
    c.unlink(dir.nodeid, "f").expect("unlink");
    assert!(!d.host("d/f").exists());
    c.rmdir(ROOT, "d").expect("rmdir");
    assert!(!d.host("d").exists());
    assert_errno(c.unlink(ROOT, "d"), libc::ENOENT);
}

#[test]
fn fallocate_lseek_fsync() {
    let d = Daemon::start("falloc", &[]);
    let mut c = d.client();
    let (node, fh) = create_with(&mut c, ROOT, "sparse", b"");
    let mib = 1u64 << 20;
    // Data only at 1 MiB: [0, 1 MiB) is a hole.
    assert_eq!(c.write(node, fh, mib, &[7u8; 4096]).unwrap(), 4096);
    assert_eq!(
        c.lseek(node, fh, 0, libc::SEEK_DATA as u32)
            .expect("SEEK_DATA"),
        mib
    );
    assert_eq!(
        c.lseek(node, fh, 0, libc::SEEK_HOLE as u32)
            .expect("SEEK_HOLE"),
        0
    );
    assert_eq!(
        c.lseek(node, fh, mib, libc::SEEK_HOLE as u32).unwrap(),
        mib + 4096,
        "the implicit hole at EOF"
    );
    assert_errno(
        c.lseek(node, fh, 4 * mib, libc::SEEK_DATA as u32),
        libc::ENXIO,
    );

    c.fallocate(node, fh, 0, 0, 8 * mib).expect("fallocate");
    let meta = std::fs::metadata(d.host("sparse")).unwrap();
    assert_eq!(meta.len(), 8 * mib);
    assert!(meta.blocks() * 512 >= 8 * mib, "blocks allocated");
    let keep = libc::FALLOC_FL_KEEP_SIZE as u32;
    c.fallocate(node, fh, keep, 0, 16 * mib)
        .expect("fallocate keep size");
    assert_eq!(std::fs::metadata(d.host("sparse")).unwrap().len(), 8 * mib);

    c.fsync(node, fh, false).expect("fsync");
    c.fsync(node, fh, true).expect("fdatasync");
}

#[test]
fn statfs_matches_host() {
    let d = Daemon::start("statfs", &[]);
    let mut c = d.client();
    let st = c.statfs(ROOT).expect("statfs");
    let host = nix::sys::statvfs::statvfs(&d.dir.shared()).unwrap();
    assert_eq!(u64::from(st.bsize), host.block_size());
    assert_eq!(st.blocks, host.blocks());
    assert_eq!(u64::from(st.namelen), host.name_max());
    assert!(st.bfree > 0 && st.files > 0);
}

#[test]
fn forget_and_batch_forget_keep_serving() {
    let d = Daemon::start("forget", &[]);
    let mut c = d.client();
    create_with(&mut c, ROOT, "f", b"1");
    c.mkdir(ROOT, "g", 0o755).unwrap();
    let f = c.lookup(ROOT, "f").unwrap().nodeid;
    c.lookup(ROOT, "f").unwrap();
    let g = c.lookup(ROOT, "g").unwrap().nodeid;
    // create + 2 lookups = 3 references to f; mkdir + lookup = 2 to g.
    c.forget(f, 3).expect("forget");
    c.batch_forget(&[(g, 2)]).expect("batch_forget");
    // Forgetting unknown nodes and over-forgetting must be harmless.
    c.batch_forget(&[(0xdead_beef, 1), (g, 100)])
        .expect("bogus batch_forget");
    c.forget(0xdead_beef, 1).expect("bogus forget");
    // Fresh lookups work and the files are intact.
    let again = c.lookup(ROOT, "f").expect("lookup after forget");
    assert_eq!(again.attr.size, 1);
    assert!(c.lookup(ROOT, "g").is_ok());
    assert!(d.host("f").exists() && d.host("g").is_dir());
}

#[test]
fn xattrs_when_enabled() {
    let d = Daemon::start("xattr", &["--xattr"]);
    let mut c = d.client();
    let (node, _) = create_with(&mut c, ROOT, "x", b"");
    c.setxattr(node, "user.test", b"value", 0)
        .expect("setxattr");
    assert_eq!(
        c.getxattr(node, "user.test", 0).expect("getxattr size"),
        XattrReply::Size(5)
    );
    assert_eq!(
        c.getxattr(node, "user.test", 64).expect("getxattr"),
        XattrReply::Data(b"value".to_vec())
    );
    assert_errno(c.getxattr(node, "user.test", 2), libc::ERANGE);
    match c.listxattr(node, 256).expect("listxattr") {
        XattrReply::Data(list) => assert!(
            list.split(|&b| b == 0).any(|n| n == b"user.test"),
            "{list:?}"
        ),
        other => panic!("listxattr: {other:?}"),
    }
    let on_host = nix_getxattr(&d.host("x"), "user.test");
    assert_eq!(on_host.as_deref(), Some(&b"value"[..]));
    c.removexattr(node, "user.test").expect("removexattr");
    assert_errno(c.getxattr(node, "user.test", 64), libc::ENODATA);
}

fn nix_getxattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and buf is valid for buf.len() bytes.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| {
        buf.truncate(len as usize);
        buf
    })
}

#[test]
fn readonly_share_rejects_writes() {
    let d = Daemon::start("readonly", &["--readonly"]);
    std::fs::write(d.host("existing"), b"abc").unwrap();
    let mut c = d.client();
    assert_errno(c.create(ROOT, "new", RDWR, 0o644), libc::EROFS);
    assert_errno(c.mkdir(ROOT, "dir", 0o755), libc::EROFS);
    let f = c.lookup(ROOT, "existing").unwrap();
    assert_errno(c.open(f.nodeid, RDWR), libc::EROFS);
    let ro = c
        .open(f.nodeid, libc::O_RDONLY as u32)
        .expect("read-only open");
    assert_eq!(c.read(f.nodeid, ro.fh, 0, 16).unwrap(), b"abc");
    assert!(!d.host("new").exists());
}

#[test]
fn two_request_queues_are_both_served() {
    let d = Daemon::start("mq", &[]);
    let mut cfg = d.config();
    cfg.request_queues = 2;
    if fixtures::is_virtiofsd() {
        // virtiofsd 1.x offers a single request queue (GET_QUEUE_NUM = 2).
        let err = FuseClient::connect(&cfg)
            .err()
            .expect("virtiofsd has one request queue");
        assert!(err.to_string().contains("request queues"), "{err}");
        return;
    }
    let mut c = d.client_with(&cfg);
    assert_eq!(c.request_queue_count(), 2);
    create_with(&mut c, ROOT, "f", b"hello");
    c.use_request_queue(1).unwrap();
    let f = c.lookup(ROOT, "f").expect("lookup on queue 2");
    c.use_request_queue(0).unwrap();
    assert_eq!(c.getattr(f.nodeid).unwrap().attr.size, 5);

    // 64 requests in flight on each queue before collecting any reply.
    let getattr = Request::new(Opcode::Getattr, f.nodeid)
        .arg(&GetattrIn::default())
        .reply_size(104);
    for q in 0..2 {
        let queue = c.request_queue(q).unwrap();
        let mut uniques = BTreeSet::new();
        for _ in 0..64 {
            uniques.insert(queue.submit(&getattr).unwrap());
        }
        queue.kick().unwrap();
        while !uniques.is_empty() {
            let done = queue.wait_completions(Duration::from_secs(10)).unwrap();
            assert!(
                !done.is_empty(),
                "queue {q}: timed out, {} left",
                uniques.len()
            );
            for completion in done {
                assert!(
                    uniques.remove(&completion.token),
                    "unexpected {completion:?}"
                );
                let attr = completion.into_reply().unwrap();
                assert_eq!(attr.body.len(), 104);
            }
        }
        assert_eq!(queue.in_flight(), 0);
    }
}

#[test]
fn request_queues_driven_from_parallel_threads() {
    let d = Daemon::start("threads", &[]);
    let mut cfg = d.config();
    cfg.request_queues = if fixtures::is_virtiofsd() { 1 } else { 3 };
    let mut c = d.client_with(&cfg);
    let (node, fh) = create_with(&mut c, ROOT, "shared", &[0u8; 64 * 1024]);
    let (_device, _hiprio, queues) = c.into_parts();
    let workers: Vec<_> = queues
        .into_iter()
        .enumerate()
        .map(|(i, mut queue)| {
            std::thread::spawn(move || {
                // Each thread owns its queue and its own 4 KiB slice of the file.
                let pattern = vec![b'a' + i as u8; 4096];
                let offset = (i as u64) * 4096;
                for round in 0..50 {
                    let n = queue.write(node, fh, offset, &pattern);
                    assert_eq!(
                        n.map_err(|e| e.to_string()),
                        Ok(4096),
                        "queue {i} round {round}"
                    );
                    let back = queue.read(node, fh, offset, 4096).expect("read");
                    assert_eq!(back, pattern, "queue {i} round {round}");
                }
                i
            })
        })
        .collect();
    let done: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let host = host_read(&d.host("shared"));
    for i in done {
        let slice = &host[i * 4096..(i + 1) * 4096];
        assert!(
            slice.iter().all(|&b| b == b'a' + i as u8),
            "queue {i} data on host"
        );
    }
}

#[test]
fn event_idx_with_many_requests_in_flight() {
    let d = Daemon::start("eventidx", &[]);
    let mut cfg = d.config();
    cfg.event_idx = true;
    cfg.queue_size = 64;
    let mut c = d.client_with(&cfg);
    let features = c.device().features();
    let offered = features.offered_features & (1 << 29) != 0;
    assert_eq!(
        features.acked_features & (1 << 29) != 0,
        offered,
        "EVENT_IDX acked iff offered"
    );
    let (node, fh) = create_with(&mut c, ROOT, "f", &[5u8; 4096]);
    let queue = c.request_queue(0).unwrap();
    // More requests than the ring holds at once: refill as completions arrive.
    let read = Request::new(Opcode::Read, node)
        .arg(&fuse_backend_rs::abi::fuse_abi::ReadIn {
            fh,
            size: 4096,
            ..Default::default()
        })
        .reply_size(4096);
    let (mut sent, mut done) = (0, 0);
    while done < 500 {
        while sent < 500 && queue.free_descriptors() >= 4 {
            queue.submit(&read).unwrap();
            sent += 1;
        }
        queue.kick().unwrap();
        let completions = queue.wait_completions(Duration::from_secs(10)).unwrap();
        assert!(
            !completions.is_empty(),
            "stalled at {done} of 500 (event_idx {offered})"
        );
        for completion in completions {
            assert_eq!(completion.into_reply().unwrap().body, vec![5u8; 4096]);
            done += 1;
        }
    }
}

/// What the daemon did with a malformed request. `Dropped` covers both a
/// chain never returned and one returned with used len 0.
#[derive(Debug)]
enum Outcome {
    Errno(i32),
    Dropped,
    Replied(usize),
}

/// Classifies a reply to a malformed request; a protocol-violating reply fails.
#[track_caller]
fn outcome<T>(result: Result<T, Error>, body_len: impl Fn(&T) -> usize) -> Outcome {
    let o = match result {
        Ok(reply) => Outcome::Replied(body_len(&reply)),
        Err(Error::Errno { errno, .. }) => Outcome::Errno(errno),
        Err(e) if e.is_timeout() => Outcome::Dropped,
        Err(Error::NoReply { .. }) => Outcome::Dropped,
        Err(e) => panic!("daemon broke the protocol: {e}"),
    };
    // Shown with --nocapture: what the daemon did at which call site.
    eprintln!("{}: {o:?}", std::panic::Location::caller());
    o
}

/// Asserts the daemon is still running and answering. virtiofsd instead
/// exits with status 1 on the first request it cannot decode (by design);
/// under virtiofsd that is checked and the calling test ends early.
macro_rules! assert_alive {
    ($d:expr, $c:expr, $what:expr) => {
        if !still_serving(&mut $d, &mut $c, $what) {
            return;
        }
    };
}

#[track_caller]
fn still_serving(d: &mut Daemon, c: &mut FuseClient, what: &str) -> bool {
    if fixtures::is_virtiofsd() && !d.is_running() {
        let status = d.wait_exit(Duration::from_secs(5)).expect("exited");
        assert_eq!(status.code(), Some(1), "virtiofsd after {what}");
        eprintln!("virtiofsd exited (status 1) after {what}; rest of test skipped");
        return false;
    }
    assert!(d.is_running(), "daemon died after {what}:\n{}", d.log());
    let attr = c.getattr(ROOT);
    if fixtures::is_virtiofsd() && !d.is_running() {
        return still_serving(d, c, what);
    }
    assert!(
        attr.is_ok(),
        "no service after {what}: {attr:?}\n{}",
        d.log()
    );
    true
}

#[test]
fn malformed_fuse_messages_are_rejected_and_daemon_survives() {
    let mut d = Daemon::start("malformed", &[]);
    let mut c = d.client();
    c.set_timeout(Duration::from_secs(2));
    create_with(&mut c, ROOT, "victim", b"x");
    let body = |r: &volfsd_harness::frontend::fuse::Reply| r.body.len();

    let o = outcome(c.send(9999, ROOT, &[], 64), body);
    assert!(
        matches!(o, Outcome::Errno(libc::ENOSYS)),
        "unknown opcode: {o:?}"
    );
    assert_alive!(d, c, "unknown opcode");

    let o = outcome(c.send(Opcode::Lookup as u32, ROOT, &[], 128), body);
    assert!(
        matches!(o, Outcome::Errno(_) | Outcome::Dropped),
        "LOOKUP without name: {o:?}"
    );
    assert_alive!(d, c, "LOOKUP without name");

    let o = outcome(c.send(Opcode::Lookup as u32, ROOT, b"victim", 128), body);
    assert!(
        matches!(o, Outcome::Errno(_) | Outcome::Dropped),
        "name without NUL: {o:?}"
    );
    assert_alive!(d, c, "name without NUL");

    for name in ["a/b", "../victim", "/victim", ".."] {
        let o = outcome(c.lookup(ROOT, name), |e| e.nodeid as usize);
        if name == ".." {
            // ".." of the root must stay inside the share.
            if let Outcome::Replied(node) = o {
                assert_eq!(node as u64, ROOT, "'..' of root escapes the share");
            }
        } else {
            assert!(
                matches!(o, Outcome::Errno(_) | Outcome::Dropped),
                "lookup {name:?} must fail, got {o:?}"
            );
        }
        assert_alive!(d, c, &format!("lookup {name:?}"));
    }
    assert_errno(c.create(ROOT, "sub/evil", RDWR, 0o644), libc::EINVAL);
    assert_alive!(d, c, "names with '/'");

    let o = outcome(c.send(Opcode::Mkdir as u32, ROOT, &[1, 2, 3], 128), body);
    assert!(
        matches!(o, Outcome::Errno(_) | Outcome::Dropped),
        "truncated MkdirIn: {o:?}"
    );
    let o = outcome(c.send(Opcode::Write as u32, ROOT, &[0; 10], 8), body);
    assert!(
        matches!(o, Outcome::Errno(_) | Outcome::Dropped),
        "truncated WriteIn: {o:?}"
    );
    let o = outcome(c.send(Opcode::Init as u32, 0, &[7, 0, 0, 0], 64), body);
    assert!(!matches!(o, Outcome::Replied(0)), "truncated INIT: {o:?}");
    assert_alive!(d, c, "truncated bodies");

    for (what, len) in [("header len too big", 9999u32), ("header len too small", 8)] {
        let req = Request::new(Opcode::Getattr, ROOT)
            .arg(&GetattrIn::default())
            .reply_size(104)
            .header_len(len);
        let o = outcome(c.call(&req), body);
        assert!(
            !matches!(o, Outcome::Replied(n) if n != 104),
            "{what}: {o:?}"
        );
        assert_alive!(d, c, what);
    }

    // Name lengths are derived from in_header.len for LOOKUP/UNLINK/...: lies
    // there must not be trusted (underflow, over-read, truncated name).
    for len in [0u32, 8, 41, 9999, u32::MAX] {
        let req = Request::new(Opcode::Lookup, ROOT)
            .name("victim")
            .reply_size(128)
            .header_len(len);
        let o = outcome(c.call(&req), |r| r.body.len());
        assert!(
            matches!(
                o,
                Outcome::Errno(_) | Outcome::Dropped | Outcome::Replied(128)
            ),
            "LOOKUP with header len {len}: {o:?}"
        );
        assert_alive!(d, c, &format!("LOOKUP with header len {len}"));
        let req = Request::new(Opcode::Unlink, ROOT)
            .name("victim")
            .header_len(len);
        let o = outcome(c.call(&req), |r| r.body.len());
        assert!(
            matches!(o, Outcome::Errno(_) | Outcome::Dropped),
            "UNLINK with header len {len}: {o:?}"
        );
        assert!(
            d.host("victim").exists(),
            "UNLINK with header len {len} removed it"
        );
        assert_alive!(d, c, &format!("UNLINK with header len {len}"));
    }

    for bogus in [0u64, 0xdead_beef, u64::MAX] {
        let o = outcome(c.getattr(bogus), |a| a.attr.ino as usize);
        assert!(
            matches!(o, Outcome::Errno(_) | Outcome::Dropped),
            "GETATTR node {bogus:#x}: {o:?}"
        );
        assert_alive!(d, c, "bogus node id");
    }

    // WRITE claiming more data than it carries.
    let victim = c.lookup(ROOT, "victim").unwrap();
    let open = c.open(victim.nodeid, RDWR).unwrap();
    let lying_write = Request::new(Opcode::Write, victim.nodeid)
        .arg(&fuse_backend_rs::abi::fuse_abi::WriteIn {
            fh: open.fh,
            size: 1 << 20,
            ..Default::default()
        })
        .bytes(b"only this".to_vec())
        .reply_size(8);
    // An error, or at most a truthful short write of the 9 bytes carried.
    let written = |r: &volfsd_harness::frontend::fuse::Reply| {
        r.parse::<fuse_backend_rs::abi::fuse_abi::WriteOut>()
            .expect("WRITE reply is a fuse_write_out")
            .size as usize
    };
    let o = outcome(c.call(&lying_write), written);
    assert!(
        matches!(
            o,
            Outcome::Errno(_) | Outcome::Dropped | Outcome::Replied(0..=9)
        ),
        "oversized WRITE: {o:?}"
    );
    assert!(std::fs::metadata(d.host("victim")).unwrap().len() <= 9);
    // READ asking for more than the reply buffer holds.
    let greedy_read = Request::new(Opcode::Read, victim.nodeid)
        .arg(&fuse_backend_rs::abi::fuse_abi::ReadIn {
            fh: open.fh,
            size: 1 << 20,
            ..Default::default()
        })
        .reply_size(16);
    let o = outcome(c.call(&greedy_read), body);
    assert!(
        !matches!(o, Outcome::Replied(n) if n > 16),
        "READ overflow: {o:?}"
    );
    assert_alive!(d, c, "lying WRITE/READ sizes");
    let o = outcome(c.read(victim.nodeid, 0xdead, 0, 16), Vec::len);
    assert!(matches!(o, Outcome::Errno(_)), "READ with bogus fh: {o:?}");
    assert_alive!(d, c, "bogus fh");
}

#[test]
fn malformed_descriptor_chains_do_not_kill_the_daemon() {
    let mut d = Daemon::start("chains", &[]);
    let mut c = d.client();
    c.set_timeout(Duration::from_secs(2));
    let mem_size = c.device().memory().size();
    let getattr = Request::new(Opcode::Getattr, ROOT)
        .arg(&GetattrIn::default())
        .reply_size(104);
    let queue = c.request_queue(0).unwrap();

    // Valid but unusual layouts must be answered normally.
    let split = queue
        .call_reshaped(&getattr, |chain| chain.split_readable(&[20]))
        .and_then(|done| done.into_reply());
    assert_eq!(
        split.expect("header split over two descriptors").body.len(),
        104
    );
    let bytewise = queue
        .call_reshaped(&getattr, |chain| chain.split_readable_every(1))
        .and_then(|done| done.into_reply());
    assert_eq!(bytewise.expect("one byte per descriptor").body.len(), 104);
    let reply_split = queue
        .call_reshaped(&getattr, |mut chain| {
            chain.writable = vec![
                ChainPart::Space(8),
                ChainPart::Space(8),
                ChainPart::Space(104),
            ];
            chain
        })
        .and_then(|done| done.into_reply());
    assert_eq!(reply_split.expect("out header split").body.len(), 104);
    assert_alive!(d, c, "split descriptors");

    type Reshape = fn(RawChain, u64) -> RawChain;
    let cases: [(&str, Reshape); 6] = [
        ("no writable buffer", |mut ch, _| {
            ch.writable.clear();
            ch
        }),
        ("reply buffer too small", |mut ch, _| {
            ch.writable = vec![ChainPart::Space(8)];
            ch
        }),
        ("readable descriptor outside guest memory", |mut ch, mem| {
            ch.readable = vec![ChainPart::Raw(Segment::new(GuestAddress(mem + 4096), 56))];
            ch
        }),
        ("writable descriptor outside guest memory", |mut ch, mem| {
            ch.writable = vec![ChainPart::Raw(Segment::new(GuestAddress(mem - 8), 120))];
            ch
        }),
        ("zero-length descriptors", |mut ch, _| {
            ch.readable.insert(0, ChainPart::Space(0));
            ch.writable.insert(0, ChainPart::Space(0));
            ch
        }),
        ("length wrapping the address space", |mut ch, _| {
            ch.readable.push(ChainPart::Raw(Segment::new(
                GuestAddress(u64::MAX - 16),
                u32::MAX,
            )));
            ch
        }),
    ];
    for (what, reshape) in cases {
        let queue = c.request_queue(0).unwrap();
        let result = queue.call_reshaped(&getattr, |chain| reshape(chain, mem_size));
        match result {
            // Either handed back (any length the chain allows) or dropped.
            Ok(done) => assert!(done.used_len <= 120, "{what}: {done:?}"),
            Err(e) => assert!(e.is_timeout(), "{what}: {e}"),
        }
        assert_alive!(d, c, what);
    }

    // A raw chain whose only buffer is garbage.
    let queue = c.request_queue(0).unwrap();
    let garbage = RawChain {
        readable: vec![ChainPart::Data(vec![0xff; 7])],
        writable: vec![ChainPart::Space(64)],
    };
    match queue.call_chain(&garbage) {
        Ok(done) => assert!(done.used_len <= 64),
        Err(e) => assert!(e.is_timeout(), "garbage chain: {e}"),
    }
    assert_alive!(d, c, "garbage chain");
}

#[test]
fn requests_before_init_are_refused() {
    let mut d = Daemon::start("preinit", &[]);
    let mut c = FuseClient::connect(&d.config()).expect("connect");
    c.set_timeout(Duration::from_secs(2));
    let o = outcome(c.getattr(ROOT), |_| 0);
    assert!(
        matches!(o, Outcome::Errno(_) | Outcome::Dropped),
        "GETATTR before INIT: {o:?}"
    );
    assert!(d.is_running());
    c.init_session(&InitParams::default())
        .expect("init after refusal");
    assert!(c.getattr(ROOT).is_ok());
}

#[test]
fn frontend_disconnect_exits_cleanly() {
    let mut d = Daemon::start("disconnect", &[]);
    let mut c = d.client();
    create_with(&mut c, ROOT, "f", b"x");
    // Stop the request queue like a VMM: the backend reports how far it got
    // in the avail ring (INIT, CREATE, WRITE).
    let base = c.device().stop_queue(1).expect("GET_VRING_BASE");
    assert_eq!(base, 3, "avail index after 3 requests");
    c.disconnect();
    let status = d.wait_exit(Duration::from_secs(10));
    assert_eq!(status.map(|s| s.code()), Some(Some(0)), "log:\n{}", d.log());
    if fixtures::is_virtiofsd() {
        // virtiofsd leaves its socket file behind.
        return;
    }
    assert!(!d.dir.socket().exists(), "socket file removed");
}

#[test]
fn sigterm_exits_cleanly() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    for connected in [false, true] {
        let mut d = Daemon::start("sigterm", &[]);
        let client = connected.then(|| d.client());
        kill(Pid::from_raw(d.pid()), Signal::SIGTERM).unwrap();
        let status = d
            .wait_exit(Duration::from_secs(10))
            .expect("exited after SIGTERM");
        drop(client);
        if fixtures::is_virtiofsd() {
            // virtiofsd has no SIGTERM handler: killed by the signal.
            assert!(!status.success() || status.code() == Some(0));
            continue;
        }
        assert_eq!(
            status.code(),
            Some(0),
            "connected={connected}, log:\n{}",
            d.log()
        );
        assert!(
            !d.dir.socket().exists(),
            "socket removed (connected={connected})"
        );
    }
}

/// POSIX locks between two lock owners, and SETLKW waiting off the queue thread: while
/// owner B waits for owner A's lock, the same queue keeps answering, and A's unlock
/// (sent on that queue, after B's wait) completes B's wait.
#[test]
fn posix_locks_conflict_between_owners_and_setlkw_does_not_stall_the_queue() {
    if fixtures::is_virtiofsd() {
        return; // virtiofsd 1.14 does not serve remote POSIX locks.
    }
    let d = Daemon::start("locks", &[]);
    let mut c = d.client();
    let (node, fh_a) = create_with(&mut c, ROOT, "locked", b"data");
    let fh_b = c.open(node, RDWR).expect("open for owner B").fh;
    let (owner_a, owner_b) = (0xa, 0xb);
    let q = c.request_queue(0).unwrap();
    q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_a,
        owner_a,
        libc::F_WRLCK,
        false,
    ))
    .expect("A locks")
    .expect_empty()
    .expect("A's lock reply");
    // B conflicts, A does not conflict with itself.
    let r = q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_b,
        owner_b,
        libc::F_WRLCK,
        false,
    ));
    assert_errno(r.and_then(|r| r.expect_empty()), libc::EAGAIN);
    q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_a,
        owner_a,
        libc::F_RDLCK,
        false,
    ))
    .expect("A converts its own lock")
    .expect_empty()
    .unwrap();
    // The host sees the guest's lock too (another sandbox would).
    let host = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.host("locked"))
        .unwrap();
    // SAFETY: plain data, zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: fcntl with a valid flock on an open fd.
    let r = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&host),
            libc::F_OFD_SETLK,
            &mut fl,
        )
    };
    assert_eq!(r, -1, "a host writer lock conflicts with the guest's lock");
    // B waits.
    let wait = q
        .submit(&lock_request(
            Opcode::Setlkw,
            node,
            fh_b,
            owner_b,
            libc::F_WRLCK,
            false,
        ))
        .unwrap();
    q.kick().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        q.poll_completions().unwrap().is_empty(),
        "B must still be waiting"
    );
    // The queue still serves other requests meanwhile.
    let attr = q.getattr(node);
    assert!(attr.is_ok(), "GETATTR while a lock waits: {attr:?}");
    // A unlocks; B's wait completes with success.
    q.call(&lock_request(
        Opcode::Setlk,
        node,
        fh_a,
        owner_a,
        libc::F_UNLCK,
        false,
    ))
    .expect("A unlocks")
    .expect_empty()
    .unwrap();
    let done = q
        .wait_for(wait, Duration::from_secs(5))
        .expect("B's wait ends");
    done.into_reply()
        .expect("valid reply")
        .expect_empty()
        .expect("B got the lock");
}

/// `--fd N`: the daemon serves a listening socket inherited from its launcher, and
/// leaves the socket file alone (it did not create it).
#[test]
fn serves_an_inherited_listening_socket() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    if fixtures::is_virtiofsd() {
        return;
    }
    let dir = fixtures::TestDir::new("fd");
    let listener = std::os::unix::net::UnixListener::bind(dir.socket()).unwrap();
    let raw = listener.as_raw_fd();
    let mut cmd = std::process::Command::new(fixtures::daemon_binary());
    cmd.arg("--fd=3")
        .arg(format!("--shared-dir={}", dir.shared().display()))
        .stdin(std::process::Stdio::null());
    // SAFETY: dup2 and fcntl are async-signal-safe; they run in the child before exec
    // and make the listener fd 3 without close-on-exec (dup2 onto itself keeps the
    // flag, hence the explicit clear).
    unsafe {
        cmd.pre_exec(move || {
            if raw != 3 && libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    // Only the daemon holds the listener now: if it died, connecting fails at once.
    drop(listener);
    std::fs::write(dir.shared().join("hello"), b"over fd 3").unwrap();
    let mut c =
        FuseClient::connect_and_init(&volfsd_harness::frontend::DeviceConfig::new(dir.socket()))
            .expect("connect through the inherited socket");
    let e = c.lookup(ROOT, "hello").expect("lookup");
    assert_eq!(e.attr.size, 9);
    c.disconnect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "exit 0 after the frontend left");
    assert!(
        dir.socket().exists(),
        "the launcher's socket file is not removed"
    );
}
