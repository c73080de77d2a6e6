//! `--keep-serving`: the daemon outlives its frontend and serves the next one on the
//! same socket (a VMM restarted by the platform, a VM powered off and booted again),
//! and nothing of one guest's session reaches the next.

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd_harness::fixtures::host::{fd_count, host_sees_flock, host_sees_lock, status_kb};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, RDWR, ROOT};
use volfsd_harness::frontend::fuse::FuseOps;

/// The errnos an id or handle of an ended session may get.
const STALE: [i32; 3] = [libc::ENOENT, libc::ESTALE, libc::EBADF];

#[test]
fn a_hundred_frontends_one_after_another_each_start_clean_and_nothing_grows() {
    if is_virtiofsd() {
        return; // virtiofsd exits with its frontend
    }
    let mut d = Daemon::start("keep-serving", &["--keep-serving"]);
    let host = d.dir.shared();
    let mut previous: Option<(u64, u64, String)> = None;
    let mut baseline = None;
    for round in 0..100 {
        let mut c = d.client();
        if let Some((node, fh, name)) = previous.take() {
            // Nothing of the guest before: its ids, handles and locks are gone.
            for r in [
                c.getattr(node).map(|_| ()),
                c.read(node, fh, 0, 1).map(|_| ()),
            ] {
                match r {
                    Err(e) if e.errno().is_some_and(|n| STALE.contains(&n)) => {}
                    other => panic!("round {round}: the last guest's node or handle: {other:?}"),
                }
            }
            assert!(
                !host_sees_lock(&host.join(&name)),
                "round {round}: lock left"
            );
            assert!(
                !host_sees_flock(&host.join(&name)),
                "round {round}: flock left"
            );
        }
        let name = format!("f{}", round % 3);
        let (e, open) = c.create(ROOT, &name, RDWR, 0o644).expect("create");
        c.write(e.nodeid, open.fh, 0, format!("round {round}").as_bytes())
            .expect("write");
        c.call(&lock_request(
            Opcode::Setlk,
            e.nodeid,
            open.fh,
            1,
            libc::F_WRLCK,
            false,
        ))
        .expect("lock");
        c.call(&lock_request(
            Opcode::Setlk,
            e.nodeid,
            open.fh,
            2,
            libc::F_WRLCK,
            true,
        ))
        .expect("flock");
        assert!(host_sees_lock(&host.join(&name)));
        previous = Some((e.nodeid, open.fh, name));
        c.disconnect();
        assert!(
            d.is_running(),
            "round {round}: the daemon exited:\n{}",
            d.log()
        );
        // The session ends once the daemon sees the disconnect: its fds close then.
        if round == 10 {
            std::thread::sleep(Duration::from_millis(200));
            baseline = Some((fd_count(d.pid()), status_kb(d.pid(), "RssAnon")));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let (fds, rss) = baseline.unwrap();
    let (fds_now, rss_now) = (fd_count(d.pid()), status_kb(d.pid(), "RssAnon"));
    assert!(
        fds_now <= fds,
        "fds grew over 90 frontends: {fds} -> {fds_now}"
    );
    // Allocator noise aside (a thread's arena, a grown table), nothing per frontend:
    // 90 frontends leaking even 16 KiB each would be 1.4 MiB.
    assert!(
        rss_now <= rss + 1024,
        "RssAnon grew over 90 frontends: {rss} KiB -> {rss_now} KiB"
    );
    assert!(d.log().contains("waiting for the next one"), "{}", d.log());
}

#[test]
fn without_the_flag_the_daemon_exits_with_its_frontend() {
    let mut d = Daemon::start("no-keep-serving", &[]);
    let c = d.client();
    c.disconnect();
    assert!(
        d.wait_exit(Duration::from_secs(10))
            .is_some_and(|s| s.success()),
        "exits 0 when its frontend goes:\n{}",
        d.log()
    );
}
