//! `--upgradable`: the connection keeper sits between the frontend and the serving
//! process (src/keeper/). Here: everything the guest does goes through it unchanged,
//! in each sandbox mode the fixture runs, the daemon ends as without it, and a
//! serving process that dies ends it too (until crash recovery exists).

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd_harness::fixtures::host::host_sees_lock;
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, RDWR, ROOT};
use volfsd_harness::frontend::fuse::FuseOps;

#[test]
fn the_guest_is_served_through_the_keeper_and_the_daemon_exits_with_its_frontend() {
    if is_virtiofsd() {
        return;
    }
    let mut d = Daemon::start("upgradable", &["--upgradable"]);
    assert_ne!(
        d.pid(),
        d.launched_pid(),
        "the keeper is the launched process"
    );
    let mut c = d.client();
    let (e, open) = c.create(ROOT, "f", RDWR, 0o644).expect("create");
    c.write(e.nodeid, open.fh, 0, b"through the keeper")
        .expect("write");
    let got = c.read(e.nodeid, open.fh, 0, 64).expect("read");
    assert_eq!(got, b"through the keeper");
    c.call(&lock_request(
        Opcode::Setlk,
        e.nodeid,
        open.fh,
        1,
        libc::F_WRLCK,
        false,
    ))
    .expect("lock");
    assert!(
        host_sees_lock(&d.host("f")),
        "the guest's lock is held on the host"
    );
    let looked = c.lookup(ROOT, "f").expect("lookup");
    assert_eq!(looked.nodeid, e.nodeid);
    c.disconnect();
    assert!(
        d.wait_exit(Duration::from_secs(10))
            .is_some_and(|s| s.success()),
        "exits 0 when its frontend goes:\n{}",
        d.log()
    );
    let log = d.log();
    assert!(log.contains("keeper: the frontend disconnected"), "{log}");
    assert!(!d.dir.socket().exists(), "the socket is removed:\n{log}");
}

#[test]
fn keep_serving_through_the_keeper_serves_the_next_frontend() {
    if is_virtiofsd() {
        return;
    }
    let mut d = Daemon::start("upgradable-keep", &["--upgradable", "--keep-serving"]);
    for round in 0..3 {
        let mut c = d.client();
        let name = format!("f{round}");
        let (e, open) = c.create(ROOT, &name, RDWR, 0o644).expect("create");
        c.write(e.nodeid, open.fh, 0, b"x").expect("write");
        c.disconnect();
        assert!(d.is_running(), "round {round}:\n{}", d.log());
    }
    // SIGTERM to the keeper reaches the serving process, which exits 0; so does the
    // keeper.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.launched_pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(
        d.wait_exit(Duration::from_secs(10))
            .is_some_and(|s| s.success()),
        "{}",
        d.log()
    );
}

#[test]
fn a_killed_serving_process_ends_the_daemon_and_its_socket() {
    if is_virtiofsd() {
        return;
    }
    let mut d = Daemon::start("upgradable-killed", &["--upgradable"]);
    let mut c = d.client();
    c.lookup(ROOT, ".").ok();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = d.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| !s.success()), "{}", d.log());
    assert!(!d.dir.socket().exists(), "{}", d.log());
    drop(c);
}
