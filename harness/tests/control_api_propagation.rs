//! The control socket, end to end: the daemon binary with `--control-socket`, driven
//! over HTTP/1.1 on the Unix socket by the fixtures' hand-written client
//! (`volfsd_harness::fixtures::control`), while the frontend plays the VMM and the
//! guest kernel.
//!
//! A bind mount made after start reaches the sandboxed daemon (its own mount
//! namespace, a slave of the host's, with SharedDir as its root) when SharedDir is a
//! shared mount; when it is not, an attach that expects the bind mount is refused
//! rather than exposing the empty directory under it.
//!
//! Needs root (bind mounts, mount namespaces).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use nix::mount::umount;
use volfsd_harness::fixtures::control::*;
use volfsd_harness::fixtures::guest::*;
use volfsd_harness::fixtures::host::{fds_into, inodes_under, poll};
use volfsd_harness::fixtures::mounts::*;
use volfsd_harness::fixtures::{TestDir, RDONLY, RDWR, ROOT};
use volfsd_harness::frontend::FuseOps;

// ---------------------------------------------------------------------------------
// 7. A bind mount made after start reaches the daemon's own mount namespace
// ---------------------------------------------------------------------------------

#[test]
fn bind_mount_after_start_propagates_into_the_sandbox() {
    // TestDir makes SharedDir a shared mount, as the platform must.
    let dir = TestDir::new("slave-ns");
    let d = dir.shared().canonicalize().unwrap();
    let host = dir.root.join("host-vol");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("hello.txt"), b"from the bind mount").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let pid = c.d.pid();
    // Inside the sandbox SharedDir is the root: the volume's mount point is /vol.
    let inside = Path::new("/vol");
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_ne!(
        ns(&pid.to_string()),
        ns("self"),
        "the daemon runs in its own mount namespace"
    );
    let mut fc = c.client();
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));

    // After start: a bind mount on the host, under the shared SharedDir.
    let vol = d.join("vol");
    std::fs::create_dir(&vol).unwrap();
    c.mounts.bind(&host, &vol);
    assert!(
        poll(Duration::from_secs(2), || !mounts_at(Some(pid), inside)
            .is_empty()),
        "the bind mount did not propagate into the daemon's namespace"
    );
    let inodes = inodes_under(&vol);
    c.attach("vol", "vol");
    let root = fc.lookup(ROOT, "vol").unwrap();
    assert_eq!(
        root.attr.ino,
        std::fs::metadata(&host).unwrap().ino(),
        "the guest sees the bind-mounted dir, not the empty mountpoint"
    );
    assert_eq!(guest_names(&mut fc, root.nodeid), set(&["hello.txt"]));
    let f = fc.lookup(root.nodeid, "hello.txt").unwrap();
    let fh = fc.open(f.nodeid, RDONLY).unwrap().fh;
    assert_eq!(
        fc.read(f.nodeid, fh, 0, 100).unwrap(),
        b"from the bind mount"
    );
    let (n, nh) = fc.create(root.nodeid, "from-guest", RDWR, 0o644).unwrap();
    fc.write(n.nodeid, nh.fh, 0, b"guest").unwrap();
    assert_eq!(std::fs::read(host.join("from-guest")).unwrap(), b"guest");

    c.detach("vol");
    let mut left = Vec::new();
    assert!(
        poll(Duration::from_secs(1), || {
            left = fds_into(pid, None, &inodes);
            left.is_empty()
        }),
        "fds into the volume after detach: {left:?}"
    );
    umount(&vol).unwrap_or_else(|e| panic!("umount {}: {e}", vol.display()));
    assert!(!is_mount_point(&vol));
    assert!(
        poll(Duration::from_secs(2), || mounts_at(Some(pid), inside)
            .is_empty()),
        "the umount did not propagate into the daemon's namespace"
    );
    std::fs::remove_dir(&vol).unwrap();
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
}

/// Without a shared SharedDir the agent's bind mount never reaches the daemon: `ctl
/// attach --bind` is refused with the reason, and its bind mount undone, instead of
/// the guest getting the empty mount point.
#[test]
fn attach_bind_without_a_shared_shared_dir_is_refused_with_the_reason() {
    let dir = TestDir::new("private-shared-dir");
    // Undo the fixture's shared mount: a plain directory, as on a host where nobody
    // made it shared.
    nix::mount::umount2(&dir.shared(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    let d = dir.shared().canonicalize().unwrap();
    let host = dir.root.join("host-vol");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("hello.txt"), b"x").unwrap();
    let c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    assert!(
        poll(Duration::from_secs(2), || c
            .d
            .log()
            .contains("is not on a shared mount")),
        "the daemon warns at start:\n{}",
        c.d.log()
    );
    let out = c.ctl(&["attach", "vol", "--bind", host.to_str().unwrap()]);
    assert!(!out.status.success(), "attach must fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("409") && err.contains("shared mount"),
        "the error names the cause: {err}"
    );
    assert!(
        !is_mount_point(&d.join("vol")),
        "the bind mount is rolled back"
    );
    assert!(
        !d.join("vol").exists(),
        "the mount point it made is removed"
    );
    let mut fc = c.client();
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
}

/// `expect` names the directory the caller means; the daemon compares it with what it
/// sees at the path.
#[test]
fn attach_checks_the_expected_directory() {
    let c = Ctl::start_with(TestDir::new("expect"), MountGuard::default(), &[], &[]);
    let vol = c.mkdir("vol");
    let m = std::fs::metadata(&vol).unwrap();
    let other = std::fs::metadata(c.shared()).unwrap();
    let r = c.put(
        "vol",
        &serde_json::json!({ "path": "vol", "expect": { "dev": other.dev(), "ino": other.ino() } }),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("shared mount"), "{}", r.body);
    assert!(
        c.req("GET", "/volumes/vol", None).status == 404,
        "not attached"
    );
    c.put(
        "vol",
        &serde_json::json!({ "path": "vol", "expect": { "dev": m.dev(), "ino": m.ino() } }),
    )
    .expect(201);
}
