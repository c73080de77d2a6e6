//! States that are not one, or lie (forged fields, handles, volumes the destination
//! lacks), are refused naming why, and open nothing on the host.

use std::time::Duration;

use volfsd::exports::state::format::{self, Location, SessionState};
use volfsd_harness::fixtures::{is_virtiofsd, Daemon, TestDir, RDONLY, ROOT};
use volfsd_harness::frontend::fuse::FuseOps;

use crate::{decode, destination, resume_on};

/// A valid state of one file held, saved by a real daemon, to forge others from.
fn sample_state(test: &str) -> (Daemon, Vec<u8>) {
    let src = Daemon::start(test, &[]);
    let mut c = src.client();
    std::fs::create_dir(src.host("d")).unwrap();
    std::fs::write(src.host("d/f"), b"f").unwrap();
    let d = c.lookup(ROOT, "d").unwrap().nodeid;
    let f = c.lookup(d, "f").unwrap().nodeid;
    c.open(f, RDONLY).unwrap();
    let bytes = c.stop_and_save_state().unwrap();
    drop(c);
    (src, bytes)
}

#[test]
fn forged_states_are_refused_naming_why_and_open_nothing() {
    if is_virtiofsd() {
        return;
    }
    let (src, bytes) = sample_state("state-forged");
    std::fs::write(src.dir.root.join("outside"), b"secret").unwrap();
    let valid = decode(&bytes);
    let file = valid
        .nodes
        .iter()
        .find(|n| n.file_type == libc::S_IFREG)
        .unwrap()
        .id;
    let with = |f: &dyn Fn(&mut SessionState)| {
        let mut s = valid.clone();
        f(&mut s);
        format::encode(&s)
    };
    let set_location = |l: Location| {
        move |s: &mut SessionState| {
            let n = s.nodes.iter_mut().find(|n| n.id == file).unwrap();
            n.location = l.clone();
        }
    };
    let mut cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "not a state",
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            &["not a volfsd device state"],
        ),
        (
            "truncated",
            bytes[..bytes.len() - 5].to_vec(),
            &["truncated"],
        ),
        (
            "another version",
            {
                let mut b = bytes.clone();
                b[8] = 99;
                b
            },
            &["format version 99"],
        ),
        (
            "a path with ..",
            with(&set_location(Location::Path(b"../outside".to_vec()))),
            &["the name \"..\""],
        ),
        (
            "an absolute path",
            with(&set_location(Location::Path(b"/etc/passwd".to_vec()))),
            &["absolute path"],
        ),
        (
            "a name with a slash",
            with(&set_location(Location::Child {
                parent: 1,
                name: b"d/f".to_vec(),
            })),
            &["has a '/'"],
        ),
        (
            "a parent that is no node",
            with(&set_location(Location::Child {
                parent: 999_999,
                name: b"f".to_vec(),
            })),
            &["no node before it"],
        ),
        (
            "an id past the counter",
            with(&|s: &mut SessionState| {
                let n = s.nodes.iter_mut().find(|n| n.id == file).unwrap();
                n.id = s.next_node_id + 5;
            }),
            &["out of range"],
        ),
        (
            "a volume not attached here",
            with(&|s: &mut SessionState| {
                s.volumes[0].name = "elsewhere".into();
            }),
            &["--allowed-dir"],
        ),
        (
            "another cache mode",
            with(&|s: &mut SessionState| s.config.cache = "always".into()),
            &["--cache"],
        ),
        (
            "a handle of no node",
            with(&|s: &mut SessionState| s.handles[0].node = 424_242),
            &["names no node"],
        ),
    ];
    // A file handle leading outside the volume (the test dir's own file).
    let outside = std::fs::File::open(src.dir.root.join("outside")).unwrap();
    if let Ok((t, h)) = raw_handle(&outside) {
        cases.push((
            "a file handle outside the volume",
            with(&|s: &mut SessionState| {
                let n = s.nodes.iter_mut().find(|n| n.id == file).unwrap();
                n.location = Location::Unknown;
                n.file_handle = Some(format::FileHandle {
                    handle_type: t,
                    bytes: h.clone(),
                });
            }),
            &["outside the volume", "open_by_handle_at"],
        ));
    }
    for (what, forged, why) in cases {
        let dst = destination(&src, "state-forged-dst", &[]);
        let outcome = resume_on(&dst, &forged);
        assert!(outcome.is_err(), "{what}: loaded");
        std::thread::sleep(Duration::from_millis(50));
        let log = dst.log();
        assert!(
            why.iter().any(|w| log.contains(w)),
            "{what}: the log does not say {why:?}:\n{log}"
        );
        // Nothing of the host was opened for it: no fd to the outside file.
        let fds = std::fs::read_dir(format!("/proc/{}/fd", dst.pid()))
            .map(|d| {
                d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter(|p| p.ends_with("outside") || p.ends_with("passwd"))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(fds, 0, "{what}: an fd outside the volume");
    }
}

/// name_to_handle_at of an open file.
fn raw_handle(f: &std::fs::File) -> std::io::Result<(i32, Vec<u8>)> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct H {
        bytes: u32,
        kind: i32,
        f: [u8; 128],
    }
    let mut h = H {
        bytes: 128,
        kind: 0,
        f: [0; 128],
    };
    let mut mnt = 0i32;
    // SAFETY: a valid file_handle buffer of 128 bytes; the empty path names the fd.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            f.as_raw_fd(),
            c"".as_ptr(),
            &mut h as *mut H,
            &mut mnt as *mut i32,
            libc::AT_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((h.kind, h.f[..h.bytes as usize].to_vec()))
}

#[test]
fn a_state_without_the_volumes_it_names_is_refused_naming_the_volume() {
    let dir = TestDir::new("state-vols");
    std::fs::create_dir(dir.shared().join("data")).unwrap();
    std::fs::create_dir(dir.shared().join("models")).unwrap();
    let src = Daemon::start_in(dir, &["--allowed-dir=data", "--allowed-dir=models:ro"]);
    let mut c = src.client();
    let data = c.lookup(ROOT, "data").unwrap().nodeid;
    std::fs::write(src.host("data/x"), b"x").unwrap();
    c.lookup(data, "x").unwrap();
    let bytes = c.stop_and_save_state().unwrap();
    let dst = destination(&src, "state-vols-dst", &["--allowed-dir=data"]);
    assert!(resume_on(&dst, &bytes).is_err());
    std::thread::sleep(Duration::from_millis(50));
    assert!(dst.log().contains("\"models\""), "{}", dst.log());
    // Read-only at the source, read-write here: refused too.
    let dst = destination(
        &src,
        "state-vols-dst2",
        &["--allowed-dir=data", "--allowed-dir=models"],
    );
    assert!(resume_on(&dst, &bytes).is_err());
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        dst.log().contains("read-only at the source"),
        "{}",
        dst.log()
    );
    // With both, as they were: the guest carries on with its ids.
    let dst = destination(
        &src,
        "state-vols-dst3",
        &["--allowed-dir=models:ro", "--allowed-dir=data"],
    );
    let mut g = resume_on(&dst, &bytes).expect("loads");
    assert_eq!(
        g.lookup(ROOT, "data").unwrap().nodeid,
        data,
        "the volume root's id"
    );
    assert!(g.lookup(data, "x").is_ok());
}
