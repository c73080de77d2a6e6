//! The device state through the vhost-user socket, as VMMs move it: one daemon saves
//! the guest's session (SET_DEVICE_STATE_FD SAVE after GET_VRING_BASE), a new daemon
//! loads it before its rings are set up, and the guest carries on with the node
//! ids, handles and locks it held, without a new FUSE_INIT. And a state that is not
//! one, or lies, is refused without touching the host.

#[path = "device_state/forged.rs"]
mod forged;
#[path = "device_state/handover.rs"]
mod handover;
#[path = "device_state/migration.rs"]
mod migration;
#[path = "device_state/preview.rs"]
mod preview;

use std::path::Path;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use volfsd::exports::state::format::{self, SessionState};
use volfsd_harness::fixtures::host::{host_sees_flock, host_sees_lock};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{Daemon, TestDir, RDONLY, RDWR, ROOT};
use volfsd_harness::frontend::fuse::{FuseClient, FuseOps};

/// A second daemon on the first one's shared directory (a later `--shared-dir` wins).
fn destination(src: &Daemon, test: &str, extra: &[&str]) -> Daemon {
    let shared = format!("--shared-dir={}", src.dir.shared().display());
    let mut args: Vec<&str> = vec![&shared];
    args.extend_from_slice(extra);
    Daemon::start_in(TestDir::new(test), &args)
}

/// Connects to `d` as a migration's destination VMM: loads `state`, then sets up
/// memory and queues; no FUSE_INIT follows (the guest made it at the source).
fn resume_on(d: &Daemon, state: &[u8]) -> volfsd_harness::frontend::Result<FuseClient> {
    let mut cfg = d.config();
    cfg.load_state = Some(state.to_vec());
    FuseClient::connect(&cfg)
}

fn decode(bytes: &[u8]) -> SessionState {
    format::decode(bytes).expect("the daemon writes a state it can read")
}

struct Held {
    dir: u64,
    file: u64,
    fh: u64,
    flock_fh: u64,
    dir_fh: u64,
}

/// The guest's side before the move: a directory, a file open for writing with a
/// POSIX lock, the same file open again with a flock, the directory open.
fn hold_things(c: &mut FuseClient, host: &Path) -> Held {
    std::fs::create_dir_all(host.join("d")).unwrap();
    std::fs::write(host.join("d/f"), b"before the move\n").unwrap();
    for i in 0..5 {
        std::fs::write(host.join(format!("d/e{i}")), b"x").unwrap();
    }
    let dir = c.lookup(ROOT, "d").unwrap().nodeid;
    let file = c.lookup(dir, "f").unwrap().nodeid;
    let fh = c.open(file, RDWR).unwrap().fh;
    c.call(&lock_request(
        Opcode::Setlk,
        file,
        fh,
        7,
        libc::F_WRLCK,
        false,
    ))
    .expect("POSIX lock");
    let flock_fh = c.open(file, RDONLY).unwrap().fh;
    c.call(&lock_request(
        Opcode::Setlk,
        file,
        flock_fh,
        8,
        libc::F_RDLCK,
        true,
    ))
    .expect("flock");
    let dir_fh = c.opendir(dir, 0).unwrap().fh;
    // Half a listing: the stream has a position.
    let first = c.readdir(dir, dir_fh, 0, 200).unwrap();
    assert!(!first.is_empty());
    Held {
        dir,
        file,
        fh,
        flock_fh,
        dir_fh,
    }
}

/// The guest lets go of the POSIX lock and the flock `hold_things` took, and the
/// host sees both free.
fn let_go(g: &mut FuseClient, held: &Held, host: &Path) {
    g.call(&lock_request(
        Opcode::Setlk,
        held.file,
        held.fh,
        7,
        libc::F_UNLCK,
        false,
    ))
    .unwrap();
    g.call(&lock_request(
        Opcode::Setlk,
        held.file,
        held.flock_fh,
        8,
        libc::F_UNLCK,
        true,
    ))
    .unwrap();
    assert!(!host_sees_lock(&host.join("d/f")));
    assert!(!host_sees_flock(&host.join("d/f")));
}
