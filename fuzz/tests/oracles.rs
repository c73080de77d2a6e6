//! The oracles themselves catch what they are meant to (so a quiet fuzz run means
//! something).

use std::os::unix::fs::PermissionsExt;
use std::sync::Mutex;

use volfsd_fuzz::common::{check_fds, open_fds, tree_checksum, Scratch};

/// The fd oracle looks at every fd of the process: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn fd_oracle_flags_an_fd_outside_and_passes_one_inside() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("oracle-fd", None);
    std::fs::write(s.path().join("inside"), b"x").unwrap();
    let base = open_fds();
    let inside = std::fs::File::open(s.path().join("inside")).unwrap();
    check_fds(&base, s.path());
    let outside = std::fs::File::open("/etc/passwd").unwrap();
    let r = std::panic::catch_unwind(|| check_fds(&base, s.path()));
    assert!(r.is_err(), "an fd to /etc/passwd went unnoticed");
    drop((inside, outside));
}

#[test]
fn checksum_sees_content_mode_and_names() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("oracle-sum", None);
    let p = s.path();
    std::fs::create_dir(p.join("d")).unwrap();
    std::fs::write(p.join("d/f"), b"abc").unwrap();
    let a = tree_checksum(p);
    assert_eq!(a, tree_checksum(p));
    std::fs::write(p.join("d/f"), b"abd").unwrap();
    let b = tree_checksum(p);
    assert_ne!(a, b, "content");
    std::fs::set_permissions(p.join("d/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let c = tree_checksum(p);
    assert_ne!(b, c, "mode");
    std::fs::rename(p.join("d/f"), p.join("d/g")).unwrap();
    assert_ne!(c, tree_checksum(p), "name");
}
