//! The control socket, end to end: the daemon binary with `--control-socket`, driven
//! over HTTP/1.1 on the Unix socket by the fixtures' hand-written client
//! (`volfsd_harness::fixtures::control`), while the frontend plays the VMM and the
//! guest kernel.
//!
//! `volfsd ctl`: attach (with `--bind`), list, stats, detach, and what it rolls back
//! or refuses.
//!
//! Needs root (bind mounts).

use serde_json::{json, Value};
use volfsd_harness::fixtures::control::*;
use volfsd_harness::fixtures::guest::*;
use volfsd_harness::fixtures::mounts::*;
use volfsd_harness::fixtures::{self, TestDir, RDONLY, RDWR, ROOT};
use volfsd_harness::frontend::FuseOps;

// ---------------------------------------------------------------------------------
// 8. volfsd ctl
// ---------------------------------------------------------------------------------

#[test]
fn ctl_attach_bind_list_stats_detach() {
    let dir = TestDir::new("ctl");
    let h_rw = dir.root.join("h-rw");
    let h_ro = dir.root.join("h-ro");
    std::fs::create_dir(&h_rw).unwrap();
    std::fs::create_dir(&h_ro).unwrap();
    std::fs::write(h_rw.join("rw.txt"), b"rw").unwrap();
    std::fs::write(h_ro.join("ro.txt"), b"ro").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let shared = c.shared();
    let (t_rw, t_ro) = (shared.join("rw"), shared.join("ro"));
    c.mounts.watch(&t_rw);
    c.mounts.watch(&t_ro);
    let mut fc = c.client();

    assert_eq!(c.ctl_ok(&["list"]).trim(), "no volumes attached");

    let out = c.ctl_ok(&["attach", "rw", "--bind", h_rw.to_str().unwrap()]);
    assert_eq!(
        out.trim(),
        format!("attached rw (rw) from {}", t_rw.display())
    );
    assert!(is_mount_point(&t_rw));
    let out = c.ctl_ok(&[
        "attach",
        "ro",
        "--bind",
        h_ro.to_str().unwrap(),
        "--read-only",
        "--volume-id",
        "vid-ro",
        "--json",
    ]);
    let v: Value = serde_json::from_str(out.trim()).expect("attach --json");
    assert_eq!(v["name"], "ro");
    assert_eq!(v["read_only"], true);
    assert_eq!(v["volume_id"], "vid-ro");
    assert_eq!(v["path"], t_ro.to_str().unwrap());
    let m = mounts_at(None, &t_ro);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "the ro bind is mounted read-only: {m:?}"
    );

    // The guest sees both; writes land in rw and fail with EROFS in ro.
    assert_eq!(guest_names(&mut fc, ROOT), set(&["ro", "rw"]));
    let rw = fc.lookup(ROOT, "rw").unwrap().nodeid;
    let ro = fc.lookup(ROOT, "ro").unwrap().nodeid;
    assert_eq!(guest_names(&mut fc, rw), set(&["rw.txt"]));
    assert_eq!(guest_names(&mut fc, ro), set(&["ro.txt"]));
    let (n, nh) = fc.create(rw, "new", RDWR, 0o644).unwrap();
    assert_eq!(fc.write(n.nodeid, nh.fh, 0, b"12345").unwrap(), 5);
    assert_eq!(std::fs::read(h_rw.join("new")).unwrap(), b"12345");
    fixtures::assert_errno(fc.create(ro, "new", RDWR, 0o644), libc::EROFS);
    fixtures::assert_errno(fc.mkdir(ro, "d", 0o755), libc::EROFS);
    let rotxt = fc.lookup(ro, "ro.txt").unwrap().nodeid;
    fixtures::assert_errno(fc.open(rotxt, RDWR), libc::EROFS);
    let roh = fc.open(rotxt, RDONLY).unwrap().fh;
    assert_eq!(fc.read(rotxt, roh, 0, 10).unwrap(), b"ro");
    assert!(!h_ro.join("new").exists());
    let e = std::fs::write(t_ro.join("host-write"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));

    // list, human and JSON.
    let out = c.ctl_ok(&["list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let cols: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        cols,
        ["NAME", "RO", "HANDLES", "INODES", "OPS", "READ", "WRITTEN", "ERRORS", "PATH"]
    );
    let row = |name: &str| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|c| c[0] == name)
            .unwrap_or_else(|| panic!("no row for {name}: {out}"))
    };
    let r = row("rw");
    assert_eq!(r[1], "rw");
    assert_eq!(r[2], "1", "one open handle: {r:?}");
    assert_eq!(r[6], "5", "5 bytes written: {r:?}");
    assert_eq!(r[8], t_rw.to_str().unwrap());
    let r = row("ro");
    assert_eq!(r[1], "ro");
    assert_eq!(r[5], "2", "2 bytes read: {r:?}");
    assert_eq!(r[8], t_ro.to_str().unwrap());
    let list: Value = serde_json::from_str(&c.ctl_ok(&["list", "--json"])).unwrap();
    assert_eq!(list, c.list());
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ro", "rw"]);

    // stats, all and one, human and JSON.
    let out = c.ctl_ok(&["stats"]);
    assert!(out.starts_with("frontend connected: true\n"), "{out}");
    assert!(out.contains("request queues + hiprio"), "{out}");
    assert!(
        out.contains("NAME") && out.contains(t_rw.to_str().unwrap()),
        "{out}"
    );
    let out = c.ctl_ok(&["stats", "rw"]);
    let field = |k: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .trim()
            .to_string()
    };
    assert_eq!(field("name"), "rw");
    assert_eq!(field("volume_id"), "-");
    assert_eq!(field("path"), t_rw.to_str().unwrap());
    assert_eq!(field("read_only"), "false");
    assert_eq!(field("open_handles"), "1");
    assert_eq!(field("bytes_written"), "5");
    let one: Value = serde_json::from_str(&c.ctl_ok(&["stats", "ro", "--json"])).unwrap();
    assert_eq!(one, c.volume("ro"));
    assert_eq!(one["stats"]["bytes_read"], 2);
    let all: Value = serde_json::from_str(&c.ctl_ok(&["stats", "--json"])).unwrap();
    assert_eq!(all, c.list());
    let err = c.ctl_err(&["stats", "nope"]);
    assert!(err.contains("404"), "{err}");

    // detach unmounts the bind and removes the mount point it created.
    let out = c.ctl_ok(&["detach", "rw"]);
    assert_eq!(
        out.trim(),
        format!("detached rw and unmounted {}", t_rw.display())
    );
    assert!(!is_mount_point(&t_rw));
    assert!(!t_rw.exists());
    assert_eq!(std::fs::read(h_rw.join("new")).unwrap(), b"12345");
    c.ctl_ok(&["detach", "ro"]);
    assert!(!is_mount_point(&t_ro));
    assert!(!t_ro.exists());
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
    let err = c.ctl_err(&["detach", "rw"]);
    assert!(err.contains("404"), "{err}");
    assert_eq!(c.ctl_ok(&["list"]).trim(), "no volumes attached");
    assert!(std::fs::read_dir(&shared).unwrap().next().is_none());
}

#[test]
fn ctl_failed_attach_rolls_back_the_bind() {
    let dir = TestDir::new("ctl-rollback");
    let h = dir.root.join("h");
    std::fs::create_dir(&h).unwrap();
    std::fs::write(h.join("h.txt"), b"h").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let shared = c.shared();
    for n in ["x", "y", "bad.name", "o1"] {
        c.mounts.watch(&shared.join(n));
    }
    let hs = h.to_str().unwrap();
    c.mkdir("other1");
    c.mkdir("other2");
    c.attach("x", "other1");
    c.attach("y", "other2");
    let before = c.list();

    // Name conflict, mount point created by ctl: unmounted and removed.
    let err = c.ctl_err(&["attach", "x", "--bind", hs]);
    assert!(err.contains("409"), "{err}");
    assert!(!is_mount_point(&shared.join("x")));
    assert!(
        !shared.join("x").exists(),
        "the created mount point is removed"
    );

    // Name conflict, mount point existed: unmounted, kept, content untouched.
    let y = c.mkdir("y");
    std::fs::write(y.join("marker"), b"m").unwrap();
    let err = c.ctl_err(&["attach", "y", "--bind", hs, "--read-only"]);
    assert!(err.contains("409"), "{err}");
    assert!(!is_mount_point(&y));
    assert_eq!(std::fs::read(y.join("marker")).unwrap(), b"m");
    assert!(!y.join("h.txt").exists());

    // Bad name (400).
    let err = c.ctl_err(&["attach", "bad.name", "--bind", hs]);
    assert!(err.contains("400"), "{err}");
    assert!(!is_mount_point(&shared.join("bad.name")));
    assert!(!shared.join("bad.name").exists());

    // Overlapping the directory of a volume (409): other1 is x's directory.
    let err = c.ctl_err(&["attach", "o1", "--path", "other1", "--bind", hs]);
    assert!(err.contains("409"), "{err}");
    assert!(!is_mount_point(&shared.join("other1")));

    // A bind source that does not exist: nothing mounted, nothing created.
    let err = c.ctl_err(&["attach", "z", "--bind", "/nonexistent/volfsd-test"]);
    assert!(err.contains("bind"), "{err}");
    assert!(!shared.join("z").exists());

    assert_eq!(c.list(), before);
    assert_eq!(std::fs::read(h.join("h.txt")).unwrap(), b"h");
    assert_eq!(
        std::fs::read_dir(&h).unwrap().count(),
        1,
        "nothing written to the bind source"
    );
}

/// `ctl detach` whose unmount fails (the host holds a file open in the bind mount)
/// attaches the volume again and fails, as documented; a later detach succeeds.
#[test]
fn ctl_detach_with_busy_bind_reattaches() {
    let dir = TestDir::new("ctl-busy");
    let h = dir.root.join("h");
    std::fs::create_dir(&h).unwrap();
    std::fs::write(h.join("f"), b"busy").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let b = c.shared().join("b");
    c.mounts.watch(&b);
    let mut fc = c.client();
    c.ctl_ok(&[
        "attach",
        "b",
        "--bind",
        h.to_str().unwrap(),
        "--volume-id",
        "vid-b",
    ]);
    let (_, _, _, data) = open_f(&mut fc, "b");
    assert_eq!(data, b"busy");

    let holder = std::fs::File::open(b.join("f")).unwrap();
    let err = c.ctl_err(&["detach", "b"]);
    assert!(err.contains("re-attached"), "{err}");
    assert!(is_mount_point(&b));
    let v = c.volume("b");
    assert_eq!(v["volume_id"], "vid-b");
    assert_eq!(v["path"], b.to_str().unwrap());
    let (_, _, _, data) = open_f(&mut fc, "b");
    assert_eq!(data, b"busy", "the guest has the volume again");

    drop(holder);
    c.ctl_ok(&["detach", "b"]);
    assert!(!is_mount_point(&b));
    assert!(!b.exists());
    assert_eq!(c.list(), json!([]));
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
}

/// `ctl attach --bind` of a name that is already attached must not stack a second
/// bind mount on the volume's directory: the guest keeps being served the first
/// mount, the new one hides it from the host, and `ctl detach` unmounts only one.
#[test]
fn ctl_attach_retry_does_not_stack_bind_mounts() {
    let dir = TestDir::new("ctl-retry");
    let h1 = dir.root.join("h1");
    let h2 = dir.root.join("h2");
    std::fs::create_dir(&h1).unwrap();
    std::fs::create_dir(&h2).unwrap();
    std::fs::write(h1.join("f"), b"1").unwrap();
    std::fs::write(h2.join("f"), b"2").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let z = c.shared().join("z");
    c.mounts.watch(&z);
    let mut fc = c.client();

    c.ctl_ok(&["attach", "z", "--bind", h1.to_str().unwrap()]);
    assert_eq!(mounts_at(None, &z).len(), 1);

    // Identical retry: succeeds, still one mount.
    let out = c.ctl(&["attach", "z", "--bind", h1.to_str().unwrap()]);
    let retry_ok = out.status.success();
    let after_retry = mounts_at(None, &z).len();
    // Other source: whatever the answer, the host path and the guest agree.
    let out2 = c.ctl(&["attach", "z", "--bind", h2.to_str().unwrap()]);
    let after_other = mounts_at(None, &z).len();
    let host_sees = std::fs::read(z.join("f")).unwrap();
    let (_, _, _, guest_sees) = open_f(&mut fc, "z");

    let detach = c.ctl(&["detach", "z"]);
    let left = mounts_at(None, &z).len();

    let mut problems = Vec::new();
    if !retry_ok {
        problems.push(format!("an identical `ctl attach` retry failed: {out:?}"));
    }
    if after_retry != 1 {
        problems.push(format!(
            "an identical retry left {after_retry} bind mounts stacked at {}",
            z.display()
        ));
    }
    if after_other != 1 {
        problems.push(format!(
            "`ctl attach z --bind h2` ({}: {}) left {after_other} bind mounts stacked",
            out2.status,
            String::from_utf8_lossy(&out2.stdout).trim()
        ));
    }
    if host_sees != guest_sees {
        problems.push(format!(
            "the host path shows f={:?} but the guest reads f={:?}",
            String::from_utf8_lossy(&host_sees),
            String::from_utf8_lossy(&guest_sees)
        ));
    }
    if !detach.status.success() || left != 0 {
        problems.push(format!(
            "after `ctl detach z` ({}) {left} mounts remain at {}",
            detach.status,
            z.display()
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
