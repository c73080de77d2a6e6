//! Detach revokes access: requests in flight while a volume is detached leave no node
//! id, handle or fd behind, the host can unmount the volume, and every later request
//! on the old ids fails cleanly. (volfsd only: virtiofsd has no runtime detach.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::mount::umount;
use volfsd_harness::frontend::fuse::FuseQueue;
use volfsd_harness::frontend::{FuseClient, FuseOps};

use volfsd_harness::fixtures::control::{request, Resp};
use volfsd_harness::fixtures::host::*;
use volfsd_harness::fixtures::mounts::MountGuard;
use volfsd_harness::fixtures::{self, Daemon, TestDir, RDONLY, ROOT};

/// What one guest queue does while the volume comes and goes: look it up, open a
/// file in it, read, list it with READDIRPLUS, and keep old ids and handles around
/// so that they are used again after the detach.
fn hammer(mut q: FuseQueue, stop: Arc<AtomicBool>, unexpected: Arc<AtomicU64>) {
    q.set_timeout(Duration::from_secs(10));
    let mut old: Vec<(u64, u64)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let ok_errno = |e: &volfsd_harness::frontend::Error| {
            e.errno().is_some_and(|n| {
                [libc::ENOENT, libc::ESTALE, libc::EBADF, libc::ENFILE].contains(&n)
            })
        };
        let check = |r: Result<(), volfsd_harness::frontend::Error>| {
            if let Err(e) = r {
                if !ok_errno(&e) {
                    eprintln!("unexpected: {e}");
                    unexpected.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        let vol = match q.lookup(ROOT, "vol") {
            Ok(e) => e.nodeid,
            Err(e) => {
                check(Err(e));
                // Old ids after the detach: they must fail, cleanly.
                for &(node, fh) in old.iter().rev().take(4) {
                    check(q.getattr(node).map(|_| ()));
                    check(q.read(node, fh, 0, 64).map(|_| ()));
                }
                continue;
            }
        };
        let step: Result<(), volfsd_harness::frontend::Error> = (|| {
            let f = q.lookup(vol, "f")?;
            let open = q.open(f.nodeid, RDONLY)?;
            q.read(f.nodeid, open.fh, 0, 64)?;
            old.push((f.nodeid, open.fh));
            let dir = q.opendir(vol, RDONLY)?;
            q.readdirplus(vol, dir.fh, 0, 4096)?;
            old.push((vol, dir.fh));
            Ok(())
        })();
        check(step);
        if old.len() > 64 {
            old.drain(..32);
        }
    }
}

#[test]
fn detach_during_requests_leaves_no_fd_and_the_volume_unmounts() {
    if fixtures::is_virtiofsd() {
        eprintln!("skipped: virtiofsd has no control socket to detach volumes with");
        return;
    }
    let dir = TestDir::new("detach-revoke");
    let src = dir.root.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..8 {
        std::fs::write(src.join(format!("f{i}")), b"data").unwrap();
    }
    std::fs::write(src.join("f"), b"volume data").unwrap();
    let target = dir.shared().join("vol");
    std::fs::create_dir(&target).unwrap();
    let ctl = dir.control_socket();
    let ctl_arg = format!("--control-socket={}", ctl.display());
    let d = Daemon::start_in(dir, &[ctl_arg.as_str()]);
    let inodes = inodes_under(&src);

    let mut cfg = d.config();
    cfg.request_queues = 2;
    cfg.queue_size = 256;
    let (device, _hiprio, queues) = FuseClient::connect_and_init(&cfg).unwrap().into_parts();
    let stop = Arc::new(AtomicBool::new(false));
    let unexpected = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = queues
        .into_iter()
        .map(|q| {
            let (stop, unexpected) = (stop.clone(), unexpected.clone());
            std::thread::spawn(move || hammer(q, stop, unexpected))
        })
        .collect();

    let mut worst = Duration::ZERO;
    for round in 0..100 {
        // Unmounted at drop if a round fails.
        let mut guard = MountGuard::default();
        guard.bind(&src, &target);
        let Resp { status, body, .. } =
            request(&ctl, "PUT", "/volumes/vol", Some(r#"{"path":"vol"}"#));
        assert_eq!(status, 201, "round {round}: attach: {body}");
        std::thread::sleep(Duration::from_millis(5 + (round % 4) * 5));
        let Resp { status, body, .. } = request(&ctl, "DELETE", "/volumes/vol", None);
        assert_eq!(status, 204, "round {round}: detach: {body}");
        let t = std::time::Instant::now();
        let clean = poll(Duration::from_secs(1), || {
            fds_into(d.pid(), None, &inodes).is_empty()
        });
        worst = worst.max(t.elapsed());
        assert!(
            clean,
            "round {round}: fds into the detached volume 1 s after DELETE: {:?}",
            fds_into(d.pid(), None, &inodes)
        );
        // The host unmounts it, without MNT_DETACH.
        umount(&target).unwrap_or_else(|e| panic!("round {round}: umount: {e}"));
        drop(guard);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("guest queue thread");
    }
    drop(device);
    assert_eq!(
        unexpected.load(Ordering::Relaxed),
        0,
        "requests on old ids must fail with ENOENT/ESTALE/EBADF"
    );
    eprintln!("slowest release after DELETE: {worst:?}");
}
