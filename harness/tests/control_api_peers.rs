//! The control socket, end to end: the daemon binary with `--control-socket`, driven
//! over HTTP/1.1 on the Unix socket by the fixtures' hand-written client
//! (`volfsd_harness::fixtures::control`), while the frontend plays the VMM and the
//! guest kernel.
//!
//! Peer credentials: clients of other uids are refused unless allowed (the test
//! binary runs itself again as another uid, see `peer_probe`).
//!
//! Needs root (setuid for the peer-credential probe).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use volfsd_harness::fixtures::control::*;
use volfsd_harness::fixtures::mounts::*;
use volfsd_harness::fixtures::TestDir;

// ---------------------------------------------------------------------------------
// 3. Peer credentials
// ---------------------------------------------------------------------------------

/// Not a test of its own: the peer-credential tests run this binary again with only
/// this test, as another uid, to be a client of that uid.
#[test]
#[ignore]
fn peer_probe() {
    let Some(sock) = std::env::var_os("VOLFSD_PROBE_SOCKET") else {
        return;
    };
    let raw = std::env::var("VOLFSD_PROBE_REQUEST").unwrap();
    let uid = nix::unistd::getuid();
    let line = match UnixStream::connect(&sock) {
        Err(e) => format!("CONNECT_ERR {}", e.raw_os_error().unwrap_or(-1)),
        Ok(mut s) => {
            s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            let _ = s.write_all(raw.as_bytes());
            let mut all = Vec::new();
            let _ = s.read_to_end(&mut all);
            match parse_one(&all) {
                Some((r, _)) => format!("REPLY {} {}", r.status, r.body),
                None => format!("CLOSED {}", all.len()),
            }
        }
    };
    println!("\nPROBE uid={uid} {line}");
}

/// Runs [`peer_probe`] as `uid`; returns its PROBE line after the uid.
fn probe_as(uid: u32, sock: &Path, raw: &[u8]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "peer_probe", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("VOLFSD_PROBE_SOCKET", sock)
        .env(
            "VOLFSD_PROBE_REQUEST",
            String::from_utf8_lossy(raw).as_ref(),
        )
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .output()
        .expect("running the probe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PROBE "))
        .unwrap_or_else(|| {
            panic!(
                "probe printed nothing: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string();
    let prefix = format!("uid={uid} ");
    line.strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("probe ran as another uid: {line}"))
        .to_string()
}

#[test]
fn other_uids_are_refused_unless_allowed() {
    let nobody = 65534;
    let put = request_bytes("PUT", "/volumes/evil", Some(r#"{"path":"d"}"#), true);

    let dir = TestDir::new("peercred");
    std::fs::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o711)).unwrap();
    let c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    c.mkdir("d");
    // The 0600 root-owned socket: another uid cannot even connect.
    let r = probe_as(nobody, &c.sock, &put);
    assert_eq!(r, format!("CONNECT_ERR {}", libc::EACCES), "{r}");
    // With the file opened up, the daemon's SO_PEERCRED check refuses it.
    std::fs::set_permissions(&c.sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let r = probe_as(nobody, &c.sock, &put);
    eprintln!("uid {nobody} on a 0666 socket: {r}");
    let body = r
        .strip_prefix("REPLY 403 ")
        .unwrap_or_else(|| panic!("expected 403, got {r}"));
    let v: Value = serde_json::from_str(body).unwrap();
    assert!(v["error"].as_str().unwrap().contains("65534"), "{v}");
    // Root is still served and nothing was attached.
    assert_eq!(c.list(), json!([]));
    c.attach("d", "d");
    assert_eq!(c.names(), ["d"]);
    std::fs::set_permissions(&c.sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(c);

    // --control-allow-uid 65534: the daemon itself lets that uid connect (an ACL
    // entry on the socket, no chmod by hand) and serves it; others are still refused.
    let dir = TestDir::new("peercred-allow");
    std::fs::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o711)).unwrap();
    let c = Ctl::start_with(
        dir,
        MountGuard::default(),
        &[],
        &["--control-allow-uid", "65534"],
    );
    c.mkdir("d");
    let r = probe_as(nobody, &c.sock, &put);
    let body = r
        .strip_prefix("REPLY 201 ")
        .unwrap_or_else(|| panic!("expected 201, got {r}"));
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["name"], "evil");
    assert_eq!(c.names(), ["evil"]);
    let r = probe_as(
        65533,
        &c.sock,
        &request_bytes("DELETE", "/volumes/evil", None, true),
    );
    assert_eq!(r, format!("CONNECT_ERR {}", libc::EACCES), "uid 65533: {r}");
    assert_eq!(c.names(), ["evil"]);
    let r = probe_as(
        nobody,
        &c.sock,
        &request_bytes("DELETE", "/volumes/evil", None, true),
    );
    assert!(r.starts_with("REPLY 204 "), "{r}");
    assert_eq!(c.list(), json!([]));
}
