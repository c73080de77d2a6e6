//! The control socket, end to end: the daemon binary with `--control-socket`, driven
//! over HTTP/1.1 on the Unix socket by the fixtures' hand-written client
//! (`volfsd_harness::fixtures::control`), while the frontend plays the VMM and the
//! guest kernel.
//!
//! Endpoints and status codes: every endpoint's documented status and body,
//! keep-alive and HTTP/1.0, bad inputs (4xx, JSON, nothing changed), and the socket
//! file itself.
//!
//! Needs root.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use volfsd_harness::fixtures::control::*;
use volfsd_harness::fixtures::guest::*;
use volfsd_harness::fixtures::host::poll;
use volfsd_harness::fixtures::mounts::*;
use volfsd_harness::fixtures::{daemon_binary, TestDir, ROOT};

// ---------------------------------------------------------------------------------
// 1. Endpoints and status codes
// ---------------------------------------------------------------------------------

#[test]
fn endpoints_answer_with_documented_status_and_bodies() {
    let c = Ctl::start("api-endpoints", &[]);
    let shared = c.shared();

    let h = c.health();
    assert_eq!(
        h,
        json!({
            "frontend_connected": false,
            "active_queues": 0,
            "request_queues": 4,
            "shared_dir": shared.to_str().unwrap(),
            "volumes": 0,
        })
    );
    assert_eq!(c.list(), json!([]));

    // 201: created, with every field.
    c.mkdir("a");
    std::fs::write(shared.join("a/hello"), b"hi").unwrap();
    let before = now_secs();
    let body = json!({ "path": shared.join("a"), "read_only": false, "volume_id": "vol-123" });
    let created = c.put("a", &body).expect(201);
    let a = created.json();
    assert_eq!(a["name"], "a");
    assert_eq!(a["volume_id"], "vol-123");
    assert_eq!(a["path"], shared.join("a").to_str().unwrap());
    assert_eq!(a["read_only"], false);
    let at = a["attached_at"].as_u64().expect("attached_at is a number");
    assert!(
        (before..=now_secs()).contains(&at),
        "attached_at {at} vs now"
    );
    assert_eq!(a["open_handles"], 0);
    assert!(a["live_inodes"].is_u64(), "{a}");
    assert_eq!(
        a["stats"],
        json!({ "ops": 0, "bytes_read": 0, "bytes_written": 0, "errors": 0 })
    );
    let keys: BTreeSet<&str> = a.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "name",
            "volume_id",
            "path",
            "read_only",
            "attached_at",
            "open_handles",
            "live_inodes",
            "stats",
            "qos"
        ]
        .into_iter()
        .collect(),
        "rate_limiter is absent for an unlimited volume"
    );
    assert_eq!(
        a["qos"],
        json!({ "throttled_requests": 0, "waiting_requests": 0, "wait_seconds": 0.0 })
    );

    // 200: an identical retry returns the same volume, unchanged.
    let retry = c.put("a", &body).expect(200);
    assert_eq!(retry.json(), a);
    assert_eq!(c.volume("a"), a);

    // A relative path is relative to SharedDir; defaults: rw... here ro, no volume_id.
    c.mkdir("b");
    let b = c
        .put("b", &json!({ "path": "b", "read_only": true }))
        .expect(201);
    let b = b.json();
    assert_eq!(b["path"], shared.join("b").to_str().unwrap());
    assert_eq!(b["read_only"], true);
    assert_eq!(b["volume_id"], Value::Null);
    // The same share written as an absolute path is the identical retry.
    c.put("b", &json!({ "path": shared.join("b"), "read_only": true }))
        .expect(200);
    assert_eq!(c.names(), ["a", "b"]);
    assert_eq!(c.health()["volumes"], 2);
    let listed = c.list();

    // 409: same name with other parameters, or overlapping another volume.
    c.mkdir("c");
    c.mkdir("a/sub");
    c.mkdir("p/q");
    c.attach("q", "p/q");
    let listed_q = c.list();
    let conflicts = [
        ("a", json!({ "path": "c", "volume_id": "vol-123" })),
        (
            "a",
            json!({ "path": "a", "read_only": true, "volume_id": "vol-123" }),
        ),
        ("a", json!({ "path": "a", "volume_id": "vol-999" })),
        ("a", json!({ "path": "a" })),
        ("b", json!({ "path": "b" })),
        ("x", json!({ "path": "a" })),
        ("x", json!({ "path": "a/sub" })),
        ("x", json!({ "path": "p" })),
    ];
    for (name, body) in &conflicts {
        let msg = c.put(name, body).expect_error(409);
        eprintln!("409 for {name} {body}: {msg}");
        assert_eq!(c.list(), listed_q, "a 409 ({name} {body}) changed nothing");
    }
    c.detach("q");
    assert_eq!(c.list(), listed);

    // 204, then 404 for a name that is gone.
    c.detach("b");
    c.req("DELETE", "/volumes/b", None).expect_error(404);
    c.req("GET", "/volumes/b", None).expect_error(404);
    c.req("DELETE", "/volumes/never", None).expect_error(404);
    assert_eq!(c.names(), ["a"]);
    // The name is free again, now read-write.
    assert_eq!(c.attach("b", "b")["read_only"], false);

    // 405 on a known resource, 404 elsewhere.
    for (m, p) in [
        ("POST", "/volumes/a"),
        ("PATCH", "/volumes"),
        ("DELETE", "/health"),
        ("PUT", "/volumes"),
        ("POST", "/volumes"),
        ("DELETE", "/volumes"),
    ] {
        c.req(m, p, Some("{}")).expect_error(405);
    }
    for (m, p) in [
        ("GET", "/"),
        ("GET", "/nope"),
        ("GET", "/volumes/a/b"),
        ("PUT", "/volumes/a/b"),
    ] {
        c.req(m, p, None).expect_error(404);
    }
    // A query string and a trailing slash are tolerated.
    assert_eq!(
        c.req("GET", "/volumes?x=1", None).expect(200).json(),
        c.list()
    );
    assert_eq!(c.req("GET", "/volumes/", None).expect(200).json(), c.list());
    assert_eq!(c.names(), ["a", "b"]);
}

#[test]
fn keep_alive_and_http_1_0() {
    let c = Ctl::start("api-keepalive", &[]);
    c.mkdir("k");
    // Two pipelined requests without Connection: close, then one with it.
    let mut s = connect(&c.sock);
    let mut raw = request_bytes("GET", "/health", None, false);
    raw.extend(request_bytes(
        "PUT",
        "/volumes/k",
        Some(r#"{"path":"k"}"#),
        false,
    ));
    s.write_all(&raw).unwrap();
    let mut buf = Vec::new();
    let r1 = read_resp(&mut s, &mut buf).expect(200);
    assert_eq!(r1.json()["volumes"], 0);
    assert_eq!(r1.header("connection"), None);
    let r2 = read_resp(&mut s, &mut buf).expect(201);
    assert_eq!(r2.json()["name"], "k");
    s.write_all(&request_bytes("DELETE", "/volumes/k", None, true))
        .unwrap();
    let r3 = read_resp(&mut s, &mut buf).expect(204);
    assert_eq!(r3.header("connection"), Some("close"));
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(buf.is_empty() && rest.is_empty());

    // HTTP/1.0: one request, then the daemon closes.
    let mut s = connect(&c.sock);
    s.write_all(b"GET /volumes HTTP/1.0\r\n\r\n").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let (r, used) = parse_one(&all).expect("a full reply");
    assert_eq!(used, all.len());
    assert_eq!(r.expect(200).json(), json!([]));
}

#[test]
fn bad_inputs_get_4xx_json_and_change_nothing() {
    let c = Ctl::start("api-bad", &[]);
    let shared = c.shared();
    c.mkdir("good");
    c.mkdir("d/sub");
    std::fs::write(shared.join("file"), b"x").unwrap();
    std::os::unix::fs::symlink("d", shared.join("link")).unwrap();
    std::os::unix::fs::symlink("/tmp", shared.join("out")).unwrap();
    std::os::unix::fs::symlink("/etc", shared.join("d/etc")).unwrap();
    c.attach("good", "good");
    let before = c.list();
    let host_before: BTreeSet<_> = std::fs::read_dir(&shared)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();

    let check_unchanged = |what: &str| {
        assert_eq!(c.list(), before, "{what} changed GET /volumes");
        let host: BTreeSet<_> = std::fs::read_dir(&shared)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(host, host_before, "{what} changed SharedDir");
    };

    // Bad names (the body is valid).
    let long = "x".repeat(129);
    for name in [
        "a.b",
        "a%20b",
        "a%2Fb",
        "..",
        ".",
        "a:b",
        "%C3%A9",
        "a+b",
        "a~b",
        long.as_str(),
    ] {
        let msg = c.put(name, &json!({ "path": "d" })).expect_error(400);
        eprintln!("400 for name {name:?}: {msg}");
        check_unchanged(&format!("PUT /volumes/{name}"));
    }

    // Bad bodies.
    for body in [
        "",
        "{",
        "not json",
        "null",
        "[]",
        r#"{"path": 5}"#,
        r#"{"read_only": true}"#,
        r#"{"path": "d", "extra": 1}"#,
        r#"{"path": "d", "readonly": true}"#,
        r#"{"path": "d", "read_only": "yes"}"#,
        r#"{"path": "d", "volume_id": 7}"#,
        r#"{"path": "d"} trailing"#,
        r#"{"path": "d", "path": "good"}"#,
    ] {
        let msg = c.req("PUT", "/volumes/new", Some(body)).expect_error(400);
        eprintln!("400 for body {body:?}: {msg}");
        check_unchanged(&format!("body {body:?}"));
    }

    // Bad paths.
    let abs = |p: &str| shared.join(p).to_str().unwrap().to_string();
    let bad_paths = [
        String::new(),
        "/etc".into(),
        "/tmp".into(),
        shared.parent().unwrap().to_str().unwrap().into(),
        shared.to_str().unwrap().into(),
        ".".into(),
        "missing".into(),
        abs("missing"),
        "file".into(),
        abs("file"),
        "link".into(),
        "link/sub".into(),
        "out".into(),
        "d/etc".into(),
        "d/../d".into(),
        "../x".into(),
        "d/sub/..".into(),
        abs("d/../d"),
        format!(
            "{}/../{}/d",
            shared.display(),
            shared.file_name().unwrap().to_str().unwrap()
        ),
    ];
    for p in &bad_paths {
        let msg = c.put("new", &json!({ "path": p })).expect_error(400);
        eprintln!("400 for path {p:?}: {msg}");
        check_unchanged(&format!("path {p:?}"));
    }

    // Framing errors, on raw connections.
    let head = |extra: &str| format!("PUT /volumes/new HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
    let big_body = format!(r#"{{"path":"d"{}}}"#, " ".repeat(64 * 1024));
    let cases: Vec<(u16, Vec<u8>)> = vec![
        (
            413,
            format!(
                "{}{big_body}",
                head(&format!("Content-Length: {}\r\n", big_body.len()))
            )
            .into_bytes(),
        ),
        (413, head("Content-Length: 65537\r\n").into_bytes()),
        (413, head("Content-Length: 99999999999\r\n").into_bytes()),
        (400, head("Content-Length: abc\r\n").into_bytes()),
        (400, head("Content-Length: -1\r\n").into_bytes()),
        (
            411,
            format!(
                "{}4\r\n{{}}  \r\n0\r\n\r\n",
                head("Transfer-Encoding: chunked\r\n")
            )
            .into_bytes(),
        ),
        (
            431,
            head(&format!("X-Big: {}\r\n", "a".repeat(32 * 1024))).into_bytes(),
        ),
        (400, b"\x01\x02 garbage\r\n\r\n".to_vec()),
        (400, b"GET /health HTTP/9\r\n\r\n".to_vec()),
    ];
    for (status, raw) in &cases {
        let preview = String::from_utf8_lossy(&raw[..raw.len().min(60)]).into_owned();
        let r = send_raw(&c.sock, raw);
        assert_eq!(r.header("connection"), Some("close"), "{preview:?}: {r:?}");
        let msg = r.expect_error(*status);
        eprintln!("{status} for {preview:?}: {msg}");
        check_unchanged(&preview);
    }

    // A client that closes mid-head or mid-body gets 400 (if it still reads).
    for raw in [
        "PUT /volumes/new HTTP/1.1\r\nHost".to_string(),
        format!("{}{{\"path\":", head("Content-Length: 13\r\n")),
    ] {
        let mut s = connect(&c.sock);
        s.write_all(raw.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let msg = read_resp(&mut s, &mut Vec::new()).expect_error(400);
        eprintln!("400 for a half request {raw:?}: {msg}");
        check_unchanged(&raw);
    }

    // The limits are inclusive: a 128-character name and a 64 KiB body are accepted.
    let name128 = "n".repeat(128);
    let mut body = r#"{"path":"d"}"#.to_string();
    body.push_str(&" ".repeat(64 * 1024 - body.len()));
    assert_eq!(body.len(), 64 * 1024);
    let r = c.req("PUT", &format!("/volumes/{name128}"), Some(&body));
    assert_eq!(r.expect(201).json()["name"], name128);
    c.detach(&name128);
    check_unchanged("the 128-character name");

    // The guest sees only the good volume.
    let mut fc = c.client();
    assert_eq!(guest_names(&mut fc, ROOT), set(&["good"]));
}

#[test]
fn control_socket_is_private_and_existing_files_are_handled() {
    let c = Ctl::start("sock-mode", &[]);
    let m = std::fs::symlink_metadata(&c.sock).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    assert_eq!(m.uid(), nix::unistd::geteuid().as_raw());
    drop(c);

    // A stale socket file is replaced.
    let dir = TestDir::new("sock-stale");
    let path = dir.control_socket();
    drop(UnixListener::bind(&path).unwrap());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(UnixStream::connect(&path).is_err(), "nobody listens on it");
    let c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    assert_eq!(c.health()["volumes"], 0);
    let m = std::fs::symlink_metadata(&c.sock).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    drop(c);

    // Any other file: exit 1, naming the path, and the file is left alone.
    for kind in ["file", "dir", "symlink"] {
        let dir = TestDir::new(&format!("sock-{kind}"));
        let path = dir.control_socket();
        match kind {
            "file" => std::fs::write(&path, b"precious").unwrap(),
            "dir" => std::fs::create_dir(&path).unwrap(),
            _ => std::os::unix::fs::symlink(dir.shared(), &path).unwrap(),
        }
        let mut child = Command::new(daemon_binary())
            .arg(format!("--socket-path={}", dir.socket().display()))
            .arg(format!("--shared-dir={}", dir.shared().display()))
            .arg(format!("--control-socket={}", path.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let exited = poll(Duration::from_secs(10), || {
            child.try_wait().unwrap().is_some()
        });
        if !exited {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            exited,
            "daemon kept running with a {kind} at --control-socket"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{kind}: {stderr}");
        assert!(
            stderr.contains(path.to_str().unwrap()),
            "{kind}: message names the path: {stderr}"
        );
        match kind {
            "file" => assert_eq!(std::fs::read(&path).unwrap(), b"precious"),
            "dir" => assert!(path.is_dir()),
            _ => assert!(std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()),
        }
    }
}
