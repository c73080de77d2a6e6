//! The control socket, end to end: the daemon binary with `--control-socket`, driven
//! over HTTP/1.1 on the Unix socket by the fixtures' hand-written client
//! (`volfsd_harness::fixtures::control`), while the frontend plays the VMM and the
//! guest kernel.
//!
//! Concurrency, the client limit and timeouts: concurrent clients, the 17th client's
//! 503, stuck and trickling clients' 408, heads over 16 KiB.
//!
//! Needs root.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::json;
use volfsd_harness::fixtures::control::*;
use volfsd_harness::fixtures::host::poll;
use volfsd_harness::fixtures::{assert_errno, ROOT};
use volfsd_harness::frontend::FuseOps;

// ---------------------------------------------------------------------------------
// 2. Concurrency, client limit, timeouts
// ---------------------------------------------------------------------------------

#[test]
fn concurrent_clients_attach_detach_and_list() {
    let c = Ctl::start("concurrent", &[]);
    let shared = c.shared();
    const THREADS: usize = 8;
    const ROUNDS: usize = 25;
    for i in 0..THREADS {
        c.mkdir(&format!("d{i}"));
    }
    std::thread::scope(|s| {
        for i in 0..THREADS {
            let c = &c;
            let shared = &shared;
            s.spawn(move || {
                let name = format!("t{i}");
                let path = shared.join(format!("d{i}"));
                for round in 0..ROUNDS {
                    let v = c
                        .put(
                            &name,
                            &json!({ "path": path, "volume_id": format!("v{round}") }),
                        )
                        .expect(201)
                        .json();
                    assert_eq!(v["name"], name.as_str());
                    assert_eq!(v["volume_id"], format!("v{round}"));
                    let got = c.volume(&name);
                    assert_eq!(got["path"], path.to_str().unwrap());
                    assert_eq!(got["volume_id"], format!("v{round}"));
                    // Every listed volume is consistent; ours is there.
                    let list = c.list();
                    let mut mine = 0;
                    for v in list.as_array().unwrap() {
                        let n = v["name"].as_str().unwrap();
                        let j: usize = n[1..].parse().unwrap();
                        assert_eq!(v["path"], shared.join(format!("d{j}")).to_str().unwrap());
                        if n == name {
                            mine += 1;
                        }
                    }
                    assert_eq!(mine, 1, "{list}");
                    assert!(c.health()["volumes"].as_u64().unwrap() >= 1);
                    // Another thread's name cannot be taken by us.
                    let other = format!("t{}", (i + 1) % THREADS);
                    let r = c.put(&other, &json!({ "path": path }));
                    assert!(
                        r.status == 409 || r.status == 201,
                        "PUT {other} at our dir: {r:?}"
                    );
                    if r.status == 201 {
                        panic!("{other} attached at {} which {name} holds", path.display());
                    }
                    c.detach(&name);
                    c.req("GET", &format!("/volumes/{name}"), None)
                        .expect_error(404);
                }
            });
        }
    });
    assert_eq!(c.list(), json!([]));
    assert_eq!(c.health()["volumes"], 0);
}

/// `renameat2(a, b, flags)`.
fn rename2(a: &std::path::Path, b: &std::path::Path, flags: libc::c_uint) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let a = std::ffi::CString::new(a.as_os_str().as_bytes()).unwrap();
    let b = std::ffi::CString::new(b.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated paths; renameat2 with AT_FDCWD.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn attach_racing_a_host_that_swaps_the_directory_for_a_symlink_gets_no_500() {
    let c = Ctl::start("attach-symlink-race", &[]);
    let shared = c.shared();
    let vol = c.mkdir("vol");
    std::fs::write(vol.join("inside"), b"").unwrap();
    // The symlink leads out of SharedDir, to a directory the guest must never see.
    let outside = c.d.dir.root.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("outside"), b"").unwrap();
    let link = shared.join("vol.link");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let away = shared.join("vol.away");
    let mut fc = c.client();
    let stop = std::sync::atomic::AtomicBool::new(false);
    const ROUNDS: usize = 2000;
    let (mut attached, mut refused_400, mut refused_409) = (0, 0, 0);
    let swaps = std::thread::scope(|s| {
        let swapper = s.spawn(|| {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // vol becomes the symlink and back (atomically: it always exists)...
                rename2(&vol, &link, libc::RENAME_EXCHANGE).unwrap();
                rename2(&vol, &link, libc::RENAME_EXCHANGE).unwrap();
                // ...and is gone for a moment.
                rename2(&vol, &away, 0).unwrap();
                rename2(&away, &vol, 0).unwrap();
                swaps += 1;
            }
            swaps
        });
        // Stops the swapper however this thread leaves the scope: a failed assertion
        // must fail the test, not leave the scope waiting for the swapper for ever.
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let stopper = Stop(&stop);
        for round in 0..ROUNDS {
            let r = c.put("vol", &json!({ "path": vol }));
            match r.status {
                200 | 201 => {
                    attached += 1;
                    assert_eq!(c.volume("vol")["path"], vol.to_str().unwrap());
                    // What the guest sees is the directory inside SharedDir (wherever
                    // the host moved it since), never the symlink's target.
                    let root = fc.lookup(ROOT, "vol").expect("lookup of the volume");
                    fc.lookup(root.nodeid, "inside")
                        .unwrap_or_else(|e| panic!("round {round}: not the directory: {e}"));
                    assert_errno(fc.lookup(root.nodeid, "outside"), libc::ENOENT);
                    c.detach("vol");
                }
                400 | 409 => {
                    let status = r.status;
                    let msg = r.expect_error(status);
                    // The cause is named: the path is (or became) a symlink, or
                    // was missing when looked at.
                    assert!(
                        msg.contains("symlink")
                            || msg.contains("does not exist")
                            || msg.contains("no longer exists"),
                        "round {round}: {status} {msg}"
                    );
                    if status == 400 {
                        refused_400 += 1;
                    } else {
                        refused_409 += 1;
                    }
                }
                _ => panic!("round {round}: {r:?}\n{}", c.d.log()),
            }
        }
        drop(stopper);
        swapper.join().unwrap()
    });
    eprintln!(
        "{ROUNDS} attaches against {swaps} host swaps: {attached} attached, \
         {refused_400} refused 400, {refused_409} refused 409"
    );
    assert!(swaps > 0, "the host never swapped");
    assert_eq!(c.list(), json!([]));
    // Settled: the directory attaches.
    c.attach("vol", "vol");
}

#[test]
fn seventeenth_client_gets_503_and_slots_come_back() {
    let c = Ctl::start("limit", &[]);
    // 16 idle clients hold every slot (each is accepted in order).
    let mut idle: Vec<UnixStream> = (0..16).map(|_| connect(&c.sock)).collect();
    let r = send_raw(&c.sock, &request_bytes("GET", "/health", None, false));
    assert_eq!(r.header("connection"), Some("close"));
    let msg = r.expect_error(503);
    eprintln!("503: {msg}");
    // Every one of the 16 is being served.
    for s in &mut idle {
        s.write_all(&request_bytes("GET", "/health", None, false))
            .unwrap();
        assert_eq!(
            read_resp(s, &mut Vec::new()).expect(200).json()["volumes"],
            0
        );
    }
    // A 17th is refused while they are connected, then served once they leave.
    send_raw(&c.sock, &request_bytes("GET", "/volumes", None, true)).expect_error(503);
    drop(idle);
    let mut last = None;
    let ok = poll(Duration::from_secs(5), || {
        let r = send_raw(&c.sock, &request_bytes("GET", "/health", None, true));
        let ok = r.status == 200;
        last = Some(r);
        ok
    });
    assert!(ok, "not served after the idle clients left: {last:?}");
    // All 16 slots come back once every idle client's thread has seen it leave.
    let ok = poll(Duration::from_secs(5), || {
        let _again: Vec<UnixStream> = (0..15).map(|_| connect(&c.sock)).collect();
        let r = send_raw(&c.sock, &request_bytes("GET", "/volumes", None, true));
        let ok = r.status == 200;
        last = Some(r);
        ok
    });
    assert!(ok, "16 clients not served again: {last:?}");
}

#[test]
fn stuck_client_gets_408_and_does_not_stall_others() {
    let c = Ctl::start("stuck", &[]);
    c.mkdir("s");
    let mut stuck = connect(&c.sock);
    stuck
        .write_all(b"PUT /volumes/s HTTP/1.1\r\nHost: x\r\nContent-Le")
        .unwrap();
    let t0 = Instant::now();
    // Others are served meanwhile.
    c.attach("s", "s");
    assert_eq!(c.names(), ["s"]);
    c.detach("s");
    c.health();
    let served_in = t0.elapsed();
    if served_in < Duration::from_secs(4) {
        stuck.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let e = stuck.read(&mut b).expect_err("no reply to a half head yet");
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        stuck.set_nonblocking(false).unwrap();
    }
    let r = read_resp(&mut stuck, &mut Vec::new());
    let waited = t0.elapsed();
    assert_eq!(r.header("connection"), Some("close"));
    let msg = r.expect_error(408);
    eprintln!("408 after {waited:?}: {msg}");
    assert!(
        waited >= Duration::from_millis(4500),
        "408 before the 5 s timeout: {waited:?}"
    );
    let mut rest = Vec::new();
    stuck.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    // The half request changed nothing.
    assert_eq!(c.list(), json!([]));
    c.attach("s", "s");
}

/// A client that trickles its request head a byte at a time must still get 408 once
/// the head has taken longer than the 5 s timeout: otherwise 16 such clients lock
/// every other client (the node agent) out for as long as they like.
#[test]
fn trickling_client_gets_408_when_head_is_not_done_in_time() {
    let c = Ctl::start("trickle", &[]);
    let mut s = connect(&c.sock);
    s.write_all(b"GET /health HTTP/1.1\r\nX-Pad: ").unwrap();
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let mut got = None;
    // Up to 12 s of one byte a second: more than twice the timeout.
    while t0.elapsed() < Duration::from_secs(12) {
        std::thread::sleep(Duration::from_secs(1));
        s.set_nonblocking(true).unwrap();
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk) {
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("read: {e}"),
        }
        s.set_nonblocking(false).unwrap();
        if let Some((r, _)) = parse_one(&buf) {
            got = Some((r, t0.elapsed()));
            break;
        }
        if s.write_all(b"a").is_err() {
            let r = read_resp(&mut s, &mut buf);
            got = Some((r, t0.elapsed()));
            break;
        }
    }
    let Some((r, when)) = got else {
        panic!(
            "the daemon was still reading a request head after {:?} of trickling \
             (the 5 s timeout is per read(), not per request head)",
            t0.elapsed()
        );
    };
    eprintln!("trickling client answered after {when:?}: {r:?}");
    r.expect_error(408);
}

/// `MAX_HEAD` is 16 KiB ("431 beyond"); a 17 KiB head must not be accepted because
/// it happened to arrive in full before the size check.
#[test]
fn head_over_16_kib_gets_431() {
    let c = Ctl::start("head-limit", &[]);
    c.mkdir("d");
    for pad in [17 * 1024, 20 * 1024 - 200] {
        let mut raw = format!(
            "PUT /volumes/d HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n",
            "a".repeat(pad)
        );
        let body = r#"{"path":"d"}"#;
        raw.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        let r = send_raw(&c.sock, raw.as_bytes());
        assert_eq!(
            r.status,
            431,
            "a {} byte request head was accepted: {r:?}",
            raw.len() - body.len()
        );
        r.expect_error(431);
        assert_eq!(c.list(), json!([]));
    }
}
