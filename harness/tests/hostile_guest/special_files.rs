//! Special files: the guest may create FIFOs, sockets and device nodes (as on Linux),
//! but the daemon never opens one for real on the host.

use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{CreateIn, Opcode, SetattrIn, SetattrValid};
use volfsd_harness::frontend::fuse::Request;
use volfsd_harness::frontend::FuseOps;

use volfsd_harness::fixtures::host::*;
use volfsd_harness::fixtures::{self, assert_errno, Daemon, TestDir, RDONLY, RDWR, ROOT};

/// /dev/kmsg's numbers: reading it gives the host kernel log.
const KMSG: (u32, u32) = (1, 11);

fn rdev(major: u32, minor: u32) -> u32 {
    libc::makedev(major, minor) as u32
}

#[test]
fn mknod_of_a_host_device_then_open_and_read_gets_no_host_data() {
    let d = Daemon::start("mknod-kmsg", &[]);
    let mut c = d.client();
    // Creating the node is allowed, as on Linux and in virtiofsd.
    let e = c
        .mknod(ROOT, "kmsg", libc::S_IFCHR | 0o666, rdev(KMSG.0, KMSG.1))
        .expect("MKNOD of a character device");
    // Opening it would give the host's kernel log: refused, read or write.
    for flags in [RDONLY, RDWR, libc::O_WRONLY as u32] {
        assert_errno(c.open(e.nodeid, flags), libc::EBADF);
    }
    // A forged handle number cannot read either.
    assert!(c.read(e.nodeid, 1, 0, 4096).is_err());
    // The daemon holds no open fd of the device: only O_PATH, if anything.
    let kmsg = std::fs::metadata("/dev/kmsg").map(|m| std::os::unix::fs::MetadataExt::rdev(&m));
    if let Ok(kmsg_rdev) = kmsg {
        for e in std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .unwrap()
            .flatten()
        {
            let Ok(m) = std::fs::metadata(e.path()) else {
                continue;
            };
            if std::os::unix::fs::MetadataExt::rdev(&m) == kmsg_rdev {
                let fd = e.file_name().to_string_lossy().to_string();
                let info =
                    std::fs::read_to_string(format!("/proc/{}/fdinfo/{fd}", d.pid())).unwrap();
                assert!(
                    info.contains("flags:\t012"),
                    "fd {fd} on a kmsg node is not O_PATH: {info}"
                );
            }
        }
    }
}

#[test]
fn device_node_planted_in_a_read_only_volume_is_never_opened() {
    let dir = TestDir::new("ro-dev");
    std::fs::create_dir(dir.shared().join("ro")).unwrap();
    mknod_char(&dir.shared().join("ro/kmsg"), KMSG.0, KMSG.1);
    let args: &[&str] = if fixtures::is_virtiofsd() {
        &["--readonly"]
    } else {
        &["--allowed-dir=ro:ro"]
    };
    let d = Daemon::start_in(dir, args);
    let mut c = d.client();
    let vol = c.lookup(ROOT, "ro").expect("lookup ro").nodeid;
    let node = c
        .lookup(vol, "kmsg")
        .expect("lookup the planted node")
        .nodeid;
    assert_errno(c.open(node, RDONLY), libc::EBADF);
}

#[test]
fn fifo_open_does_not_stall_the_queue() {
    let d = Daemon::start("fifo", &[]);
    let mut c = d.client();
    let e = c
        .mknod(ROOT, "fifo", libc::S_IFIFO | 0o666, 0)
        .expect("MKNOD of a FIFO");
    mkfifo(&d.host("planted-fifo"));
    let planted = c.lookup(ROOT, "planted-fifo").unwrap().nodeid;
    c.set_timeout(Duration::from_secs(5));
    for node in [e.nodeid, planted] {
        let t = Instant::now();
        // O_RDONLY on a FIFO without a writer would block in open(2) for ever.
        assert_errno(c.open(node, RDONLY), libc::EBADF);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "OPEN took {:?}",
            t.elapsed()
        );
        // The same queue keeps answering.
        c.getattr(ROOT).expect("GETATTR after OPEN of a FIFO");
    }
}

#[test]
fn create_over_a_planted_device_node_does_not_open_it() {
    let d = Daemon::start("create-dev", &[]);
    mknod_char(&d.host("null"), 1, 3);
    mkfifo(&d.host("fifo"));
    let mut c = d.client();
    c.set_timeout(Duration::from_secs(5));
    for name in ["null", "fifo"] {
        // Without O_EXCL, open(O_CREAT) of an existing name opens it: not here.
        assert_errno(
            c.create(ROOT, name, RDWR | libc::O_TRUNC as u32, 0o644),
            libc::EBADF,
        );
        // With O_EXCL the name exists.
        assert_errno(
            c.create(ROOT, name, RDWR | libc::O_EXCL as u32, 0o644),
            libc::EEXIST,
        );
    }
    // An existing regular file is still opened (and truncated) by CREATE.
    std::fs::write(d.host("plain"), b"old contents").unwrap();
    c.create(ROOT, "plain", RDWR | libc::O_TRUNC as u32, 0o644)
        .expect("CREATE over a regular file");
    assert_eq!(std::fs::read(d.host("plain")).unwrap(), b"");
}

#[test]
fn size_change_and_syncfs_of_special_files_get_clean_errnos() {
    let d = Daemon::start("special-ops", &[]);
    let mut c = d.client();
    let fifo = c
        .mknod(ROOT, "fifo", libc::S_IFIFO | 0o666, 0)
        .unwrap()
        .nodeid;
    let dev = c
        .mknod(ROOT, "null", libc::S_IFCHR | 0o666, rdev(1, 3))
        .unwrap()
        .nodeid;
    for node in [fifo, dev] {
        let attr = SetattrIn {
            valid: SetattrValid::SIZE.bits(),
            size: 0,
            ..Default::default()
        };
        // truncate(2) says EINVAL; virtiofsd answers EBADF. Either is clean.
        match c.setattr(node, &attr) {
            Err(e) if matches!(e.errno(), Some(libc::EINVAL | libc::EBADF)) => {}
            other => panic!("SETATTR size of a special file: {other:?}"),
        }
        const SYNCFS: u32 = 50;
        let r = c.call(&Request::with_raw_opcode(SYNCFS, node).arg(&0u64));
        assert!(
            matches!(r, Err(ref e) if e.errno().is_some()),
            "SYNCFS on a special file: {r:?}"
        );
    }
    // CREATE with a bogus mode never produces something the daemon then opens.
    let r = c.call(
        &Request::new(Opcode::Create, ROOT)
            .arg(&CreateIn {
                flags: RDWR,
                mode: libc::S_IFCHR | 0o666,
                umask: 0,
                fuse_flags: 0,
            })
            .name("odd")
            .reply_size(160),
    );
    if r.is_ok() {
        let m = std::fs::symlink_metadata(d.host("odd")).unwrap();
        assert!(m.file_type().is_file(), "CREATE made a {:?}", m.file_type());
    }
}
