//! The control socket, end to end: the daemon binary with `--control-socket`, driven
//! over HTTP/1.1 on the Unix socket by the fixtures' hand-written client
//! (`volfsd_harness::fixtures::control`), while the frontend plays the VMM and the
//! guest kernel.
//!
//! What the guest sees: a volume attached at runtime, every fd released on detach
//! and stale ids failing cleanly, re-attach of a name, 1,000 attach/detach cycles.
//!
//! Needs root (bind mounts).

use std::collections::{BTreeSet, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use nix::mount::umount;
use serde_json::json;
use volfsd_harness::fixtures::control::*;
use volfsd_harness::fixtures::guest::*;
use volfsd_harness::fixtures::host::{fd_count, fds_into, inodes_under, poll};
use volfsd_harness::fixtures::mounts::*;
use volfsd_harness::fixtures::{self, TestDir, RDONLY, RDWR, ROOT};
use volfsd_harness::frontend::FuseOps;

// ---------------------------------------------------------------------------------
// 4.-6. What the guest sees
// ---------------------------------------------------------------------------------

#[test]
fn attach_at_runtime_is_seen_by_the_guest() {
    let c = Ctl::start("guest-attach", &[]);
    let shared = c.shared();
    let mut fc = c.client();
    assert!(poll(Duration::from_secs(5), || c.health()
        ["frontend_connected"]
        == true));
    let h = c.health();
    assert!(h["active_queues"].as_u64().unwrap() >= 1, "{h}");

    // The virtual root starts empty.
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
    fixtures::assert_errno(fc.lookup(ROOT, "data"), libc::ENOENT);

    c.mkdir("data");
    std::fs::write(shared.join("data/pre"), b"from the host").unwrap();
    c.attach("data", "data");
    assert_eq!(guest_names(&mut fc, ROOT), set(&["data"]));
    let dh = fc.opendir(ROOT, RDONLY).unwrap();
    let entries = fc.readdirplus_all(ROOT, dh.fh).unwrap();
    let e = entries
        .iter()
        .find(|e| e.dirent.name_str() == "data")
        .unwrap();
    assert_eq!(e.entry.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    fc.releasedir(ROOT, dh.fh).unwrap();

    let data = fc.lookup(ROOT, "data").expect("lookup data");
    assert_eq!(
        data.attr.ino,
        std::fs::metadata(shared.join("data")).unwrap().ino()
    );
    assert_eq!(guest_names(&mut fc, data.nodeid), set(&["pre"]));
    let pre = fc.lookup(data.nodeid, "pre").unwrap();
    let o = fc.open(pre.nodeid, RDONLY).unwrap();
    assert_eq!(fc.read(pre.nodeid, o.fh, 0, 100).unwrap(), b"from the host");
    fc.release(pre.nodeid, o.fh, RDONLY).unwrap();

    let (f, fh) = fc.create(data.nodeid, "new", RDWR, 0o644).expect("create");
    assert_eq!(fc.write(f.nodeid, fh.fh, 0, b"guest wrote").unwrap(), 11);
    assert_eq!(
        std::fs::read(shared.join("data/new")).unwrap(),
        b"guest wrote"
    );
    assert_eq!(fc.read(f.nodeid, fh.fh, 6, 100).unwrap(), b"wrote");
    fixtures::assert_errno(fc.lookup(data.nodeid, "missing"), libc::ENOENT);

    let v = c.volume("data");
    assert_eq!(v["open_handles"], 1, "{v}");
    assert!(v["live_inodes"].as_u64().unwrap() >= 3, "{v}");
    assert_eq!(v["stats"]["bytes_written"], 11, "{v}");
    assert_eq!(v["stats"]["bytes_read"], 13 + 5, "{v}");
    assert!(v["stats"]["ops"].as_u64().unwrap() >= 8, "{v}");
    assert_eq!(v["stats"]["errors"], 1, "{v}");
    fc.release(f.nodeid, fh.fh, RDWR).unwrap();
    assert_eq!(c.volume("data")["open_handles"], 0);

    // A second volume appears beside it; detaching one leaves the other.
    c.mkdir("more");
    c.attach("more", "more");
    assert_eq!(guest_names(&mut fc, ROOT), set(&["data", "more"]));
    c.detach("data");
    assert_eq!(guest_names(&mut fc, ROOT), set(&["more"]));
    fixtures::assert_errno(fc.lookup(ROOT, "data"), libc::ENOENT);
    assert_eq!(c.health()["volumes"], 1);
}

#[test]
fn detach_releases_every_fd_and_stale_ids_fail_cleanly() {
    let dir = TestDir::new("guest-detach");
    let host = dir.root.join("host-data");
    std::fs::create_dir_all(host.join("sub")).unwrap();
    std::fs::write(host.join("f"), b"content").unwrap();
    std::fs::write(host.join("sub/g"), b"g").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let shared = c.shared();
    let data = c.mkdir("data");
    c.mounts.bind(&host, &data);
    c.mkdir("other");
    std::fs::write(shared.join("other/o"), b"other content").unwrap();
    c.attach("data", "data");
    c.attach("other", "other");
    let pid = c.d.pid();
    let inodes = inodes_under(&data);

    let mut fc = c.client();
    let root = fc.lookup(ROOT, "data").unwrap();
    let f = fc.lookup(root.nodeid, "f").unwrap();
    let fh = fc.open(f.nodeid, RDONLY).unwrap().fh;
    assert_eq!(fc.read(f.nodeid, fh, 0, 100).unwrap(), b"content");
    let sub = fc.lookup(root.nodeid, "sub").unwrap();
    let subh = fc.opendir(sub.nodeid, RDONLY).unwrap().fh;
    let v = c.volume("data");
    assert_eq!(v["open_handles"], 2, "{v}");
    assert!(v["live_inodes"].as_u64().unwrap() >= 3, "{v}");
    let before = fds_into(pid, Some(&data), &inodes);
    assert!(
        !before.is_empty(),
        "sanity: the daemon holds fds into the volume while attached"
    );
    eprintln!("fds into the volume before detach: {before:?}");

    c.detach("data");
    let mut left = Vec::new();
    let released = poll(Duration::from_secs(1), || {
        left = fds_into(pid, Some(&data), &inodes);
        left.is_empty()
    });
    assert!(
        released,
        "fds into the volume 1 s after detach: {left:?}\n{}",
        c.d.log()
    );

    // Stale ids fail cleanly.
    let e_read = assert_stale("READ on a stale handle", fc.read(f.nodeid, fh, 0, 100));
    let e_getattr = assert_stale("GETATTR on a stale file", fc.getattr(f.nodeid));
    let e_getattr_dir = assert_stale("GETATTR on a stale dir", fc.getattr(sub.nodeid));
    let e_getattr_root = assert_stale("GETATTR on a stale root", fc.getattr(root.nodeid));
    let e_lookup = assert_stale("LOOKUP in a stale dir", fc.lookup(sub.nodeid, "g"));
    let e_readdir = assert_stale(
        "READDIRPLUS on a stale dir handle",
        fc.readdirplus(sub.nodeid, subh, 0, 4096),
    );
    let e_open = assert_stale("OPEN of a stale file", fc.open(f.nodeid, RDONLY));
    let e_create = errno_of(
        "CREATE in a stale root",
        fc.create(root.nodeid, "x", RDWR, 0o644),
    );
    eprintln!(
        "stale errnos: READ {e_read} GETATTR(file) {e_getattr} GETATTR(dir) {e_getattr_dir} \
         GETATTR(root) {e_getattr_root} LOOKUP {e_lookup} READDIRPLUS {e_readdir} OPEN {e_open} \
         CREATE {e_create}"
    );
    assert!(!host.join("x").exists());
    // RELEASE of the stale handles does not crash anything either.
    let _ = fc.release(f.nodeid, fh, RDONLY);
    let _ = fc.releasedir(sub.nodeid, subh);
    fixtures::assert_errno(fc.lookup(ROOT, "data"), libc::ENOENT);

    // The other volume is still served.
    let other = fc.lookup(ROOT, "other").unwrap();
    let o = fc.lookup(other.nodeid, "o").unwrap();
    let oh = fc.open(o.nodeid, RDONLY).unwrap().fh;
    assert_eq!(fc.read(o.nodeid, oh, 0, 100).unwrap(), b"other content");
    let (n, nh) = fc.create(other.nodeid, "n", RDWR, 0o644).unwrap();
    fc.write(n.nodeid, nh.fh, 0, b"still served").unwrap();
    assert_eq!(
        std::fs::read(shared.join("other/n")).unwrap(),
        b"still served"
    );
    assert_eq!(c.names(), ["other"]);

    // The host can unmount the bind without MNT_DETACH.
    umount(&data).unwrap_or_else(|e| panic!("umount {}: {e}", data.display()));
    assert!(!is_mount_point(&data));
    std::fs::remove_dir(&data).unwrap();
    assert_eq!(std::fs::read(host.join("f")).unwrap(), b"content");
}

#[test]
fn reattach_same_name_gives_a_fresh_view() {
    let c = Ctl::start("guest-reattach", &[]);
    let shared = c.shared();
    c.mkdir("A/dir");
    c.mkdir("B/dir");
    std::fs::write(shared.join("A/f"), b"A").unwrap();
    std::fs::write(shared.join("B/f"), b"B").unwrap();
    std::fs::write(shared.join("B/only-b"), b"").unwrap();
    let mut fc = c.client();

    c.attach("v", "A");
    let (root_a, f_a, fh_a, data) = open_f(&mut fc, "v");
    assert_eq!(data, b"A");
    let dir_a = fc.lookup(root_a, "dir").unwrap().nodeid;
    let dh_a = fc.opendir(root_a, RDONLY).unwrap().fh;
    c.detach("v");

    c.attach("v", "B");
    let (root_b, f_b, fh_b, data) = open_f(&mut fc, "v");
    assert_eq!(data, b"B");
    assert_eq!(guest_names(&mut fc, root_b), set(&["dir", "f", "only-b"]));
    let dir_b = fc.lookup(root_b, "dir").unwrap().nodeid;
    let old: BTreeSet<u64> = [root_a, f_a, dir_a].into();
    for n in [root_b, f_b, dir_b] {
        assert!(!old.contains(&n), "node id {n} reused after re-attach");
    }
    // Nothing from before returns data, old or new.
    assert_stale("READ old handle", fc.read(f_a, fh_a, 0, 100));
    assert_stale("READ old handle, new node", fc.read(f_b, fh_a, 0, 100));
    assert_stale("READ new handle, old node", fc.read(f_a, fh_b, 0, 100));
    assert_stale("GETATTR old file", fc.getattr(f_a));
    assert_stale("GETATTR old root", fc.getattr(root_a));
    assert_stale("LOOKUP old root", fc.lookup(root_a, "f"));
    assert_stale("LOOKUP old root, new name", fc.lookup(root_a, "only-b"));
    assert_stale("LOOKUP old dir", fc.lookup(dir_a, "x"));
    assert_stale("OPEN old file", fc.open(f_a, RDONLY));
    assert_stale(
        "READDIRPLUS old handle",
        fc.readdirplus(root_a, dh_a, 0, 4096),
    );
    assert_eq!(fc.read(f_b, fh_b, 0, 100).unwrap(), b"B");
}

#[test]
fn thousand_attach_detach_cycles_never_alias() {
    let c = Ctl::start("guest-cycles", &[]);
    let shared = c.shared();
    c.mkdir("A");
    c.mkdir("B");
    std::fs::write(shared.join("A/f"), b"A").unwrap();
    std::fs::write(shared.join("B/f"), b"B").unwrap();
    let pid = c.d.pid();
    let mut fc = c.client();
    // Warm up once so every lazily created fd exists before counting.
    c.attach("v", "A");
    let (r0, f0, fh0, _) = open_f(&mut fc, "v");
    c.detach("v");
    let fds_before = fd_count(pid);

    let mut seen: HashSet<u64> = [r0, f0].into();
    let mut history: Vec<(u64, u64, u64)> = vec![(r0, f0, fh0)];
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    for cycle in 0..1000 {
        let (dir, want) = if cycle % 2 == 0 {
            ("B", b"B")
        } else {
            ("A", b"A")
        };
        c.attach("v", dir);
        let (root, f, fh, data) = open_f(&mut fc, "v");
        assert_eq!(data, want, "cycle {cycle}");
        assert!(
            seen.insert(root),
            "cycle {cycle}: root node id {root} seen before"
        );
        assert!(seen.insert(f), "cycle {cycle}: f node id {f} seen before");
        assert_eq!(fc.read(f, fh, 0, 100).unwrap(), want, "cycle {cycle}");
        // Spot-check: the previous cycle and three earlier ones.
        let mut sample = vec![history.len() - 1];
        for _ in 0..3 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            sample.push((rng % history.len() as u64) as usize);
        }
        for i in sample {
            let (or, of, ofh) = history[i];
            let what = format!("cycle {cycle}, ids of cycle {i}");
            assert_stale(&what, fc.getattr(of));
            assert_stale(&what, fc.read(of, ofh, 0, 100));
            assert_stale(&what, fc.read(f, ofh, 0, 100));
            assert_stale(&what, fc.lookup(or, "f"));
        }
        // Half the handles are released by the guest, half left to the detach.
        if cycle % 2 == 1 {
            fc.release(f, fh, RDONLY).unwrap();
        }
        history.push((root, f, fh));
        c.detach("v");
    }
    // Every old id is dead, and no fd leaked.
    for (i, (r, f, fh)) in history.iter().enumerate() {
        assert_stale(&format!("root of cycle {i}"), fc.getattr(*r));
        assert_stale(&format!("f of cycle {i}"), fc.getattr(*f));
        assert_stale(&format!("fh of cycle {i}"), fc.read(*f, *fh, 0, 1));
    }
    let fds_after = fd_count(pid);
    assert!(
        fds_after <= fds_before + 2,
        "fd leak over 1000 cycles: {fds_before} -> {fds_after}"
    );
    assert_eq!(c.list(), json!([]));
}

/// Every request on a volume is counted once for it, on its way out, failures
/// included: a failed WRITE, READLINK or STATFS counts like any other.
#[test]
fn every_request_counts_once_failures_included() {
    let c = Ctl::start("guest-stats", &[]);
    c.mkdir("v");
    std::fs::write(c.shared().join("v/f"), b"data").unwrap();
    c.attach("v", "v");
    let mut fc = c.client();
    let v = fc.lookup(ROOT, "v").unwrap().nodeid;
    let f = fc.lookup(v, "f").unwrap().nodeid;
    let stats = |c: &Ctl| {
        let s = &c.volume("v")["stats"];
        (s["ops"].as_u64().unwrap(), s["errors"].as_u64().unwrap())
    };
    let (ops, errors) = stats(&c);
    fc.getattr(f).expect("getattr");
    assert!(
        fc.write(f, 999_999, 0, b"x").is_err(),
        "write on a bogus handle"
    );
    assert!(fc.readlink(f).is_err(), "readlink of a regular file");
    fc.statfs(f).expect("statfs");
    assert_eq!(stats(&c), (ops + 4, errors + 2));
}
