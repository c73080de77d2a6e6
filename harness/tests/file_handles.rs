//! `--inode-file-handles`: with `prefer` (or `mandatory`) a node the guest holds is
//! kept by file handle, so it costs the daemon no fd and does not keep an unlinked
//! file alive on the host; a reused inode number is a new node, never the old one.
//! Each test runs the real daemon with its default sandbox and seccomp filter, so the
//! capability and the system calls the handles need are checked too.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use volfsd_harness::fixtures::guest::errno_of;
use volfsd_harness::fixtures::host::{fd_count, poll};
use volfsd_harness::fixtures::{self, Daemon, TestDir, RDONLY, ROOT};
use volfsd_harness::frontend::FuseOps;

const FILES: usize = 3_000;

fn skip_for_virtiofsd() -> bool {
    if fixtures::is_virtiofsd() {
        eprintln!("skipped: volfsd's own fd accounting and logs");
        return true;
    }
    false
}

/// The daemon with `--inode-file-handles=MODE` (and `extra`) on a share holding
/// `files` (relative path, contents; parent directories are made).
fn daemon_with(test: &str, mode: &str, files: &[(&str, &[u8])], extra: &[&str]) -> Daemon {
    let dir = TestDir::new(test);
    for (rel, data) in files {
        let p = dir.shared().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    let arg = format!("--inode-file-handles={mode}");
    let mut args = vec![arg.as_str()];
    args.extend_from_slice(extra);
    Daemon::start_in(dir, &args)
}

/// The daemon's fds that still point at a deleted file.
fn deleted_fds(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|l| l.display().to_string())
        .filter(|l| l.ends_with("(deleted)"))
        // The frontend's guest RAM is a memfd: not a file of the share.
        .filter(|l| !l.contains("memfd:"))
        .collect()
}

#[test]
fn with_prefer_held_inodes_cost_no_fds_and_still_serve() {
    if skip_for_virtiofsd() {
        return;
    }
    let dir = TestDir::new("fh-prefer");
    for i in 0..FILES {
        std::fs::write(dir.shared().join(format!("f{i}")), format!("data {i}")).unwrap();
    }
    let d = Daemon::start_in(dir, &["--inode-file-handles=prefer"]);
    let mut c = d.client();
    c.set_timeout(Duration::from_secs(30));
    let before = fd_count(d.pid());
    let mut nodes = Vec::new();
    for i in 0..FILES {
        let e = c.lookup(ROOT, &format!("f{i}")).unwrap();
        assert_eq!(e.attr.size, format!("data {i}").len() as u64);
        nodes.push(e.nodeid);
    }
    let held = fd_count(d.pid());
    assert!(
        held < before + 10,
        "{FILES} held inodes took {} fds (before {before}, now {held})",
        held - before
    );
    // Every held node still reaches its own file: attributes, data, a write.
    for (i, &n) in nodes.iter().enumerate().step_by(97) {
        let a = c.getattr(n).unwrap();
        assert_eq!(a.attr.size, format!("data {i}").len() as u64, "f{i}");
    }
    let (n7, want) = (nodes[7], b"data 7");
    let fh = c.open(n7, RDONLY).unwrap().fh;
    assert_eq!(c.read(n7, fh, 0, 64).unwrap(), want);
    c.release(n7, fh, RDONLY).unwrap();
    let rw = c.open(nodes[8], libc::O_RDWR as u32).unwrap().fh;
    c.write(nodes[8], rw, 0, b"DATA").unwrap();
    c.release(nodes[8], rw, libc::O_RDWR as u32).unwrap();
    let host = std::fs::read(d.dir.shared().join("f8")).unwrap();
    assert_eq!(host, b"DATA 8");
    // A directory kept by handle works as a parent.
    let sub = c.mkdir(ROOT, "sub", 0o755).unwrap().nodeid;
    let inner = c.mkdir(sub, "inner", 0o755).unwrap();
    assert_eq!(c.lookup(sub, "inner").unwrap().nodeid, inner.nodeid);
    assert!(d.dir.shared().join("sub/inner").is_dir());
    // Forgetting gives nothing back that was not taken: the count stays flat.
    for &n in &nodes {
        c.forget(n, 1).unwrap();
    }
    assert!(fd_count(d.pid()) < before + 10);
    let log = d.log();
    assert!(!log.contains("file handles do not work"), "{log}");
}

#[test]
fn with_prefer_an_unlinked_file_is_not_kept_alive() {
    if skip_for_virtiofsd() {
        return;
    }
    for mode in ["never", "prefer"] {
        let data = vec![1u8; 1 << 20];
        let d = daemon_with(
            &format!("fh-unlinked-{mode}"),
            mode,
            &[("gone", &data)],
            &[],
        );
        let mut c = d.client();
        let node = c.lookup(ROOT, "gone").unwrap().nodeid;
        // Written back first: writeback in flight would hold the inode a moment
        // past the unlink, and a handle opens an inode the kernel still holds.
        std::fs::File::open(d.host("gone"))
            .unwrap()
            .sync_all()
            .unwrap();
        std::fs::remove_file(d.host("gone")).unwrap();
        let kept = deleted_fds(d.pid());
        if mode == "never" {
            // The O_PATH fd of the held node pins the inode, as in virtiofsd.
            assert_eq!(kept.len(), 1, "{kept:?}");
            assert_eq!(c.getattr(node).unwrap().attr.nlink, 0);
        } else {
            assert!(kept.is_empty(), "the daemon keeps {kept:?} alive");
            // Gone once nothing else on the host holds it (at once, here).
            let mut last = None;
            let gone = poll(Duration::from_secs(5), || {
                last = Some(c.getattr(node).map(|a| a.attr.nlink));
                last.as_ref().is_some_and(|r| r.is_err())
            });
            assert!(gone, "getattr of a deleted node: {last:?}");
            let e = errno_of("getattr of a deleted node", c.getattr(node));
            assert_eq!(e, libc::ESTALE);
        }
        c.forget(node, 1).unwrap();
    }
}

#[test]
fn with_prefer_a_reused_inode_number_is_a_new_node() {
    if skip_for_virtiofsd() {
        return;
    }
    let d = daemon_with("fh-reuse", "prefer", &[("old", b"old")], &[]);
    let mut c = d.client();
    let old = c.lookup(ROOT, "old").unwrap();
    let shared = d.dir.shared();
    std::fs::remove_file(shared.join("old")).unwrap();
    // ext4 hands the freed inode number out again at once; try a few names.
    let mut reused = None;
    for i in 0..64 {
        let p = shared.join(format!("new{i}"));
        std::fs::write(&p, b"new content").unwrap();
        if std::fs::metadata(&p).unwrap().ino() == old.attr.ino {
            reused = Some(format!("new{i}"));
            break;
        }
    }
    let Some(name) = reused else {
        eprintln!("skipped: this file system did not reuse the inode number");
        return;
    };
    let new = c.lookup(ROOT, &name).unwrap();
    assert_eq!(new.attr.ino, old.attr.ino, "same inode number on the host");
    assert_ne!(new.nodeid, old.nodeid, "a new inode must get a new node id");
    assert_eq!(c.getattr(new.nodeid).unwrap().attr.size, 11);
    let e = errno_of("getattr of the old node", c.getattr(old.nodeid));
    assert_eq!(e, libc::ESTALE);
    // The old node goes on forget without taking the new one along.
    c.forget(old.nodeid, 1).unwrap();
    assert_eq!(c.getattr(new.nodeid).unwrap().attr.size, 11);
}

#[test]
fn mandatory_serves_a_share_that_makes_handles() {
    if skip_for_virtiofsd() {
        return;
    }
    let d = daemon_with("fh-mandatory", "mandatory", &[("f", b"hello")], &[]);
    let mut c = d.client();
    let before = fd_count(d.pid());
    let f = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(fd_count(d.pid()), before, "no fd for a node kept by handle");
    let fh = c.open(f, RDONLY).unwrap().fh;
    assert_eq!(c.read(f, fh, 0, 16).unwrap(), b"hello");
}

/// The mount fd a handle is opened on is the share's own mount, so a file of a
/// read-only volume opened through its handle is on the volume's read-only mount:
/// the kernel refuses writes to it whatever the daemon's own EROFS guard does.
#[test]
fn with_prefer_a_read_only_volume_is_reopened_on_its_read_only_mount() {
    if skip_for_virtiofsd() {
        return;
    }
    let d = daemon_with(
        "fh-ro-mount",
        "prefer",
        &[("ro/f", b"read-only data")],
        &["--allowed-dir=ro:ro"],
    );
    let mut c = d.client();
    let vol = c.lookup(ROOT, "ro").unwrap().nodeid;
    let node = c.lookup(vol, "f").unwrap().nodeid;
    let fh = c.open(node, RDONLY).unwrap().fh;
    assert_eq!(c.read(node, fh, 0, 64).unwrap(), b"read-only data");
    let host = std::fs::metadata(d.host("ro/f")).unwrap();
    let pid = d.pid();
    let mut seen = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(m) = std::fs::metadata(e.path()) else {
            continue;
        };
        if (m.dev(), m.ino()) != (host.dev(), host.ino()) {
            continue;
        }
        // statvfs through the magic link reports the flags of the mount the fd is on
        // (the volume's private mount, detached, so not in any mountinfo).
        let st = nix::sys::statvfs::statvfs(&e.path()).unwrap();
        assert!(
            st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY),
            "fd {:?} of the read-only volume's file is on a writable mount",
            e.file_name()
        );
        seen += 1;
    }
    assert_eq!(seen, 1, "the open file is the one fd onto the inode");
}

#[test]
fn an_unknown_mode_is_refused_by_name() {
    if skip_for_virtiofsd() {
        return;
    }
    let out = std::process::Command::new(fixtures::daemon_binary())
        .args([
            "--socket-path=/nonexistent/s",
            "--shared-dir=/",
            "--inode-file-handles=sometimes",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--inode-file-handles"), "{err}");
}
