//! End-to-end tests: start the daemon binary, drive it through the frontend
//! (acting as VMM + guest virtio-fs driver) and check both the FUSE replies
//! and the host directory.
//!
//! Run against the reference implementation with
//! `VOLFSD_TEST_DAEMON=~/.cargo/bin/virtiofsd cargo test --test vhost_user --test vhost_user_robustness`;
//! tests that depend on volfsd-specific behaviour say so where they branch.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{GetattrIn, Opcode, SetattrIn, SetattrValid};
use volfsd_harness::frontend::fuse::{FuseOps, InitParams, Request, XattrReply};
use volfsd_harness::frontend::FuseClient;

use volfsd_harness::fixtures::guest::create_with;
use volfsd_harness::fixtures::{self, assert_errno, host_read, Daemon, RDWR, ROOT};

const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;

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

/// Without `--xattr` every extended-attribute request gets ENOSYS, whatever the
/// name, so the guest kernel stops sending them: it asks for `security.capability`
/// before every write, which a hidden name answered ENODATA used to keep coming.
#[test]
fn xattrs_when_disabled_are_enosys_for_every_name() {
    let d = Daemon::start("xattr-off", &[]);
    let mut c = d.client();
    let (node, _) = create_with(&mut c, ROOT, "x", b"");
    for name in [
        "security.capability",
        "trusted.x",
        "user.test",
        "system.posix_acl_access",
    ] {
        assert_errno(c.getxattr(node, name, 64), libc::ENOSYS);
        assert_errno(c.setxattr(node, name, b"v", 0), libc::ENOSYS);
        assert_errno(c.removexattr(node, name), libc::ENOSYS);
    }
    assert_errno(c.listxattr(node, 64), libc::ENOSYS);
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
