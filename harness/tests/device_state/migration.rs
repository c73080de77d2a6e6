//! A session saved at one daemon carries on at another (ids, handles, locks), the
//! source serves on after a save, and a file deleted before the load is ESTALE.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use volfsd::exports::state::format::{Location, SessionState};
use volfsd_harness::fixtures::host::{host_sees_flock, host_sees_lock};
use volfsd_harness::fixtures::{assert_errno, is_virtiofsd, Daemon, RDONLY, ROOT};
use volfsd_harness::frontend::fuse::{FuseClient, FuseOps};

use crate::{decode, destination, hold_things, let_go, resume_on};

#[test]
fn a_saved_session_carries_on_in_a_new_daemon_with_its_ids_handles_and_locks() {
    if is_virtiofsd() {
        return; // virtiofsd has no POSIX locks to carry (ENOSYS)
    }
    let src = Daemon::start("state-src", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    let held = hold_things(&mut c, &host);
    c.write(held.file, held.fh, 0, b"written at the source\n")
        .unwrap();
    let bytes = c.stop_and_save_state().expect("save");
    let state = decode(&bytes);
    assert!(state.fuse.is_some(), "the INIT is in the state");
    assert!(state
        .nodes
        .iter()
        .any(|n| n.id == held.file && n.lookups >= 1));
    assert!(state
        .nodes
        .iter()
        .any(|n| n.id == held.file && matches!(&n.location, Location::Child { parent, name } if *parent == held.dir && name == b"f")));
    assert_eq!(state.handles.len(), 3, "{:?}", state.handles);
    assert_eq!(
        state.locks.len(),
        2,
        "a POSIX lock and a flock: {:?}",
        state.locks
    );
    assert!(state
        .handles
        .iter()
        .any(|h| h.id == held.dir_fh && h.dir_offset.is_some_and(|o| o > 0)));

    let dst = destination(&src, "state-dst", &[]);
    let mut g = resume_on(&dst, &bytes).expect("the destination loads the state");
    // The source goes away as after a migration (its daemon exits with its
    // frontend): the locks stay held, by the destination (which took them again, or
    // was handed them).
    drop(c);
    let mut src = src;
    assert!(
        src.wait_exit(Duration::from_secs(10)).is_some(),
        "the source exits"
    );
    assert!(
        host_sees_lock(&host.join("d/f")),
        "POSIX lock held after the move"
    );
    assert!(
        host_sees_flock(&host.join("d/f")),
        "flock held after the move"
    );
    // The same ids and handles, no INIT.
    assert_eq!(
        c_getattr_ino(&mut g, held.file),
        std::fs::metadata(host.join("d/f")).unwrap().ino()
    );
    let data = g
        .read(held.file, held.fh, 0, 100)
        .expect("read through the old handle");
    assert_eq!(data, b"written at the source\n");
    g.write(held.file, held.fh, 0, b"WRITTEN")
        .expect("write through it");
    assert!(std::fs::read(host.join("d/f"))
        .unwrap()
        .starts_with(b"WRITTEN"));
    assert_eq!(
        g.lookup(held.dir, "f").unwrap().nodeid,
        held.file,
        "same node id"
    );
    let rest = g
        .readdir(held.dir, held.dir_fh, 0, 4096)
        .expect("the open directory");
    assert!(rest.len() >= 7, "{} entries", rest.len());
    // New ids continue above the guest's.
    std::fs::write(host.join("d/new"), b"n").unwrap();
    let new = g.lookup(held.dir, "new").unwrap().nodeid;
    assert!(new >= state.next_node_id, "{new} vs {}", state.next_node_id);
    // The guest lets go of its locks as usual.
    let_go(&mut g, &held, &host);
}

fn c_getattr_ino(c: &mut FuseClient, node: u64) -> u64 {
    c.getattr(node).expect("getattr of a carried node").attr.ino
}

#[test]
fn a_save_changes_nothing_at_the_source_which_serves_on_after_a_failed_migration() {
    let src = Daemon::start("state-nondestructive", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    let held = hold_things(&mut c, &host);
    let first = c.save_state_paused().unwrap();
    let again = c.save_state_paused().unwrap();
    // Each save offers the open files under a new token; the rest is the same.
    let without_offer = |b: &[u8]| SessionState {
        handoff: None,
        ..decode(b)
    };
    assert_eq!(
        without_offer(&first),
        without_offer(&again),
        "a save is repeatable"
    );
    // The migration failed and the VMM resumed the source: it serves on.
    assert_eq!(c.read(held.file, held.fh, 0, 6).unwrap(), b"before");
    assert!(host_sees_lock(&host.join("d/f")));
    assert!(host_sees_flock(&host.join("d/f")));
    // What the saves offered a destination on this host is withdrawn: when the
    // guest closes the file (FLUSH with its lock owner, RELEASE of both handles),
    // the host sees its locks go (found by the VM checkpoint suite).
    c.flush(held.file, held.fh, 7).unwrap();
    c.release(held.file, held.fh, libc::O_RDWR as u32).unwrap();
    c.release(held.file, held.flock_fh, libc::O_RDONLY as u32)
        .unwrap();
    assert!(
        !host_sees_lock(&host.join("d/f")) && !host_sees_flock(&host.join("d/f")),
        "the guest's locks are gone on the host:\n{}",
        src.log()
    );
}

#[test]
fn a_file_deleted_before_the_load_is_estale_with_guest_error_and_fails_the_load_with_abort() {
    let src = Daemon::start("state-deleted", &[]);
    let mut c = src.client();
    let host = src.dir.shared();
    std::fs::write(host.join("keep"), b"keep").unwrap();
    std::fs::write(host.join("gone"), b"gone").unwrap();
    let keep = c.lookup(ROOT, "keep").unwrap().nodeid;
    let keep_fh = c.open(keep, RDONLY).unwrap().fh;
    let gone = c.lookup(ROOT, "gone").unwrap().nodeid;
    let gone_fh = c.open(gone, RDONLY).unwrap().fh;
    let bytes = c.stop_and_save_state().unwrap();
    // The VM and its daemon are gone (the daemon exits with its frontend).
    drop(c);
    std::fs::remove_file(host.join("gone")).unwrap();
    let abort = destination(&src, "state-deleted-abort", &[]);
    let e = resume_on(&abort, &bytes)
        .err()
        .expect("abort: the load fails");
    assert!(format!("{e}").contains("CHECK_DEVICE_STATE"), "{e}");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        abort.log().contains("\"gone\""),
        "the log names the file:\n{}",
        abort.log()
    );
    let lenient = destination(
        &src,
        "state-deleted-lenient",
        &["--migration-on-error=guest-error"],
    );
    let mut g = resume_on(&lenient, &bytes).expect("guest-error: the load succeeds");
    assert_eq!(g.read(keep, keep_fh, 0, 10).unwrap(), b"keep");
    assert_errno(g.getattr(gone), libc::ESTALE);
    assert_errno(g.read(gone, gone_fh, 0, 10), libc::ESTALE);
}
