//! The virtiofsd features launchers ask for, checked against the running daemon
//! through the vhost-user frontend (the guest-side checks are the VM suites
//! `features` and `idmap`):
//! - `--allow-direct-io` and `--preserve-noatime`: the guest's O_DIRECT and
//!   O_NOATIME reach the host's open, and only with the flag (the daemon's own
//!   fdinfo shows it);
//! - `--posix-acl`: negotiated in FUSE INIT (`always` refuses a guest without it,
//!   `auto` serves one);
//! - `--cache=metadata`: files opened for direct I/O, directories kept, and long
//!   attribute and entry timeouts;
//! - `--translate-uid/gid`: owners shown translated, chown translated, a forbidden
//!   id refused;
//! - `--syslog` on a host without /dev/log: a warning on stderr, and it serves.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use fuse_backend_rs::abi::fuse_abi::{FsOptions, SetattrIn, SetattrValid};
use volfsd_harness::fixtures::{Daemon, RDONLY, ROOT};
use volfsd_harness::frontend::{FuseClient, FuseOps, InitParams};

/// FOPEN_DIRECT_IO, FOPEN_KEEP_CACHE and FOPEN_CACHE_DIR (fuse.h).
const FOPEN_DIRECT_IO: u32 = 1 << 0;
const FOPEN_KEEP_CACHE: u32 = 1 << 1;
const FOPEN_CACHE_DIR: u32 = 1 << 3;

/// The open flags (octal in fdinfo) of the daemon's fd on `path`'s inode that is
/// not one of its O_PATH node references.
fn daemon_open_flags(daemon: &Daemon, path: &Path) -> Option<u32> {
    let want = std::fs::metadata(path).unwrap();
    let pid = daemon.pid();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(m) = std::fs::metadata(fd.path()) else {
            continue;
        };
        if (m.dev(), m.ino()) != (want.dev(), want.ino()) {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .ok()?;
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())?;
        if flags & libc::O_PATH as u32 == 0 {
            return Some(flags);
        }
    }
    None
}

/// The flags of the daemon's host open of a file the guest opened with
/// `guest_flags`, on a daemon started with `extra`.
fn host_open_flags(extra: &[&str], guest_flags: u32) -> u32 {
    let daemon = Daemon::start("host-open-flags", extra);
    std::fs::write(daemon.host("f"), vec![7u8; 8192]).unwrap();
    let mut fc = daemon.client();
    let node = fc.lookup(ROOT, "f").unwrap().nodeid;
    let fh = fc.open(node, RDONLY | guest_flags).unwrap().fh;
    let flags = daemon_open_flags(&daemon, &daemon.host("f")).expect("the daemon holds f open");
    if flags & libc::O_DIRECT as u32 == 0 {
        // A buffered host open works with any guest buffer. With O_DIRECT the host
        // file system's alignment rules apply to the guest's buffers (the VM suite
        // `features` reads and writes through it).
        assert_eq!(fc.read(node, fh, 0, 4096).unwrap(), vec![7u8; 4096]);
    }
    flags
}

#[test]
fn the_guests_o_direct_reaches_the_host_only_with_allow_direct_io() {
    let direct = libc::O_DIRECT as u32;
    assert_eq!(
        host_open_flags(&[], direct) & direct,
        0,
        "O_DIRECT kept without --allow-direct-io"
    );
    assert_eq!(
        host_open_flags(&["--allow-direct-io"], direct) & direct,
        direct
    );
    assert_eq!(
        host_open_flags(&["-o", "allow_direct_io"], direct) & direct,
        direct
    );
}

#[test]
fn the_guests_o_noatime_reaches_the_host_only_with_preserve_noatime() {
    let noatime = libc::O_NOATIME as u32;
    assert_eq!(
        host_open_flags(&[], noatime) & noatime,
        0,
        "O_NOATIME kept by default"
    );
    assert_eq!(
        host_open_flags(&["--preserve-noatime"], noatime) & noatime,
        noatime
    );
}

/// FUSE INIT with `flags` offered: the flags granted, or the frontend's error (the
/// connection or the INIT's reply).
fn init_with(daemon: &Daemon, flags: FsOptions) -> volfsd_harness::frontend::Result<u64> {
    let mut fc = FuseClient::connect(&daemon.config())?;
    let mut params = InitParams::default();
    params.flags |= flags.bits();
    let out = fc.init_session(&params)?;
    Ok(u64::from(out.flags) | (u64::from(out.flags2) << 32))
}

#[test]
fn posix_acl_is_negotiated_as_asked() {
    let acl = FsOptions::POSIX_ACL | FsOptions::DONT_MASK;
    let granted = init_with(&Daemon::start("acl-always", &["--posix-acl"]), acl).unwrap();
    assert_eq!(granted & acl.bits(), acl.bits(), "granted {granted:#x}");

    let e = init_with(
        &Daemon::start("acl-always-old", &["--posix-acl=always"]),
        FsOptions::empty(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("71") || e.to_lowercase().contains("protocol"),
        "{e}"
    );

    let granted = init_with(
        &Daemon::start("acl-auto-old", &["--posix-acl=auto"]),
        FsOptions::empty(),
    )
    .unwrap();
    assert_eq!(granted & acl.bits(), 0);

    let granted = init_with(&Daemon::start("acl-never", &[]), acl).unwrap();
    assert_eq!(granted & acl.bits(), 0, "ACLs granted without --posix-acl");
}

#[test]
fn cache_metadata_caches_attributes_and_listings_but_not_data() {
    let daemon = Daemon::start("cache-metadata", &["--cache=metadata"]);
    std::fs::write(daemon.host("f"), b"data").unwrap();
    std::fs::create_dir(daemon.host("d")).unwrap();
    let mut fc = daemon.client();
    let f = fc.lookup(ROOT, "f").unwrap();
    assert_eq!((f.entry_valid, f.attr_valid), (86400, 86400));
    let open = fc.open(f.nodeid, RDONLY).unwrap();
    assert_eq!(open.open_flags & FOPEN_DIRECT_IO, FOPEN_DIRECT_IO);
    assert_eq!(open.open_flags & FOPEN_KEEP_CACHE, 0);
    let d = fc.lookup(ROOT, "d").unwrap().nodeid;
    let dir = fc.opendir(d, RDONLY).unwrap();
    assert_eq!(
        dir.open_flags & (FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE),
        FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE
    );
}

#[test]
fn translated_ids_in_attributes_and_chown() {
    let daemon = Daemon::start(
        "translate-ids",
        &[
            "--translate-uid=map:1000:2000:1",
            "--translate-gid=map:1000:2000:1",
            "--translate-uid=forbid-guest:3000:1",
        ],
    );
    let f = daemon.host("f");
    std::fs::write(&f, b"x").unwrap();
    std::os::unix::fs::chown(&f, Some(2000), Some(2000)).unwrap();
    let mut fc = daemon.client();
    let node = fc.lookup(ROOT, "f").unwrap();
    assert_eq!((node.attr.uid, node.attr.gid), (1000, 1000));
    let attr = fc.getattr(node.nodeid).unwrap().attr;
    assert_eq!((attr.uid, attr.gid), (1000, 1000));

    let chown = |uid: u32| SetattrIn {
        valid: SetattrValid::UID.bits(),
        uid,
        ..Default::default()
    };
    fc.setattr(node.nodeid, &chown(1000)).unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().uid(), 2000);
    fc.setattr(node.nodeid, &chown(7)).unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().uid(), 7);
    let e = fc.setattr(node.nodeid, &chown(3000)).unwrap_err();
    assert!(
        e.to_string().contains(&libc::EPERM.to_string()) || e.to_string().contains("EPERM"),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&f).unwrap().uid(), 7);
}

#[test]
fn syslog_without_dev_log_logs_to_stderr_and_serves() {
    // Where a syslog daemon listens, a mount namespace hides its socket.
    let daemon = if Path::new("/dev/log").exists() {
        Daemon::start_wrapped(
            volfsd_harness::fixtures::TestDir::new("syslog-fallback"),
            &[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                "mount --bind /dev/null /dev/log && exec \"$0\" \"$@\"",
            ],
            &["--syslog"],
        )
    } else {
        Daemon::start("syslog-fallback", &["--syslog"])
    };
    std::fs::write(daemon.host("f"), b"served").unwrap();
    let mut fc = daemon.client();
    let node = fc.lookup(ROOT, "f").unwrap().nodeid;
    let fh = fc.open(node, RDONLY).unwrap().fh;
    assert_eq!(fc.read(node, fh, 0, 100).unwrap(), b"served");
    let log = daemon.log();
    assert!(
        log.contains("--syslog: cannot connect to /dev/log") && log.contains("logging to stderr"),
        "{log}"
    );
}

#[test]
fn migration_flags_are_taken_and_the_migration_features_offered() {
    let daemon = Daemon::start(
        "migration-flags",
        &[
            "--migration-on-error=guest-error",
            "--migration-mode=find-paths",
            "--migration-verify-handles",
        ],
    );
    let device = volfsd_harness::frontend::VhostUserFsDevice::connect(&daemon.config()).unwrap();
    let f = device.features();
    // VHOST_F_LOG_ALL (virtio bit 26), VHOST_USER_PROTOCOL_F_LOG_SHMFD (1) and
    // VHOST_USER_PROTOCOL_F_DEVICE_STATE (19): what a VMM needs to migrate.
    assert_ne!(f.offered_features & (1 << 26), 0, "{f:?}");
    assert_eq!(
        f.offered_protocol_features & ((1 << 1) | (1 << 19)),
        (1 << 1) | (1 << 19),
        "{f:?}"
    );
    drop(device);
    let log = daemon.log();
    assert!(!log.contains("accepted and ignored"), "{log}");
}

#[test]
fn print_capabilities_answers_whatever_else_the_line_holds() {
    let bin = volfsd_harness::fixtures::volfsd_binary();
    for args in [
        &["--print-capabilities"][..],
        &[
            "--shared-dir",
            "/nonexistent",
            "--bogus",
            "--print-capabilities",
        ],
        &["-o", "source=/x,cache=sometimes", "--print-capabilities"],
    ] {
        let out = std::process::Command::new(&bin)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["type"], "fs");
        let features: Vec<&str> = doc["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert_eq!(
            features,
            [
                "migrate-precopy",
                "posix-acl-negotiation-mode",
                "separate-options"
            ]
        );
    }
}

#[test]
fn an_unimplemented_virtiofsd_flag_is_a_fast_exit_1_naming_it() {
    let bin = volfsd_harness::fixtures::volfsd_binary();
    for (flag, named) in [
        ("--xattrmap=:map::user.virtiofs.:", "'--xattrmap'"),
        ("--security-label", "'--security-label'"),
        ("--modcaps=+sys_admin", "'--modcaps'"),
        ("-owriteback", "'-o writeback'"),
    ] {
        let out = std::process::Command::new(&bin)
            .args(["--socket-path=/tmp/never.sock", "--shared-dir=/tmp", flag])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert!(stderr.contains(named), "{flag}: {stderr}");
    }
}

#[test]
fn submounts_are_announced_unless_no_announce_submounts() {
    let submounts = FsOptions::SUBMOUNTS.bits();
    let granted = init_with(&Daemon::start("submounts", &[]), FsOptions::empty()).unwrap();
    assert_eq!(granted & submounts, submounts, "granted {granted:#x}");
    let d = Daemon::start("no-submounts", &["--no-announce-submounts"]);
    let granted = init_with(&d, FsOptions::empty()).unwrap();
    assert_eq!(granted & submounts, 0, "granted {granted:#x}");
}

#[test]
fn readdirplus_is_offered_unless_no_readdirplus() {
    let plus = (FsOptions::DO_READDIRPLUS | FsOptions::READDIRPLUS_AUTO).bits();
    let granted = init_with(&Daemon::start("readdirplus", &[]), FsOptions::empty()).unwrap();
    assert_eq!(granted & plus, plus, "granted {granted:#x}");
    for flag in ["--no-readdirplus", "-ono_readdirplus"] {
        let granted = init_with(
            &Daemon::start("no-readdirplus", &[flag]),
            FsOptions::empty(),
        )
        .unwrap();
        assert_eq!(granted & plus, 0, "{flag}: granted {granted:#x}");
    }
}

#[test]
fn id_maps_are_refused_where_no_user_namespace_is_made() {
    let bin = volfsd_harness::fixtures::volfsd_binary();
    let dir = volfsd_harness::fixtures::TestDir::new("uid-map-refused");
    for (extra, why) in [
        (&["--uid-map=:0:0:1:"][..], "running as root"),
        (
            &["--uid-map=:0:0:1:", "--sandbox=none"][..],
            "need --sandbox namespace",
        ),
    ] {
        let out = std::process::Command::new(&bin)
            .arg(format!("--socket-path={}", dir.socket().display()))
            .arg(format!("--shared-dir={}", dir.shared().display()))
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(stderr.contains(why), "{extra:?}: {stderr}");
        assert!(
            !dir.socket().exists(),
            "{extra:?}: the socket was left behind"
        );
    }
}
