//! How the daemon ends and where it listens: a frontend's disconnect, SIGTERM, a
//! socket file another daemon bound again, an inherited listening socket (`--fd`).

use std::time::Duration;

use volfsd_harness::frontend::fuse::FuseOps;
use volfsd_harness::frontend::FuseClient;

use volfsd_harness::fixtures::guest::create_with;
use volfsd_harness::fixtures::{self, Daemon, ROOT};

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

/// cloud-hypervisor's restore and migrations name one socket path for the source's
/// back-end and the destination's: a second daemon started on the path replaces
/// the first one's socket file while the first still serves. The first one, when
/// it exits, must leave the second one's file alone (it used to remove whatever
/// socket was at the path, and the destination VMM then found none).
#[test]
fn a_socket_file_bound_again_by_another_daemon_is_left_alone_at_exit() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::os::unix::fs::MetadataExt;

    if fixtures::is_virtiofsd() {
        return;
    }
    let mut d = Daemon::start("socket-replaced", &[]);
    let client = d.client();
    let path = d.dir.socket();
    std::fs::remove_file(&path).unwrap();
    let other = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let ino = std::fs::metadata(&path).unwrap().ino();
    kill(Pid::from_raw(d.pid()), Signal::SIGTERM).unwrap();
    let status = d
        .wait_exit(Duration::from_secs(10))
        .expect("exited after SIGTERM");
    drop(client);
    assert_eq!(status.code(), Some(0), "log:\n{}", d.log());
    assert_eq!(
        std::fs::metadata(&path).map(|m| m.ino()).ok(),
        Some(ino),
        "the other daemon's socket file is still there"
    );
    drop(other);
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
