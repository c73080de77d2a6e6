//! The control socket, end to end: the daemon binary with `--control-socket`, driven
//! over HTTP/1.1 on the Unix socket (a hand-written client, so every byte is under the
//! test's control), while the frontend plays the VMM and the guest kernel to check what
//! the guest sees of each attach and detach.
//!
//! Needs root (bind mounts, mount namespaces, setuid for the peer-credential probe).

mod common;

use std::collections::{BTreeSet, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::mount::{mount, umount, umount2, MntFlags, MsFlags};
use serde_json::{json, Value};
use volfsd::frontend::{Error as FuseError, FuseClient, FuseOps};

use common::{daemon_binary, Daemon, TestDir, ROOT};

const RDWR: u32 = libc::O_RDWR as u32;
const RDONLY: u32 = libc::O_RDONLY as u32;
/// Bound on every socket read/write of the test client, so a daemon bug cannot hang
/// the suite.
const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// Errnos a guest may get for a node id or handle of a detached volume.
const STALE_ERRNOS: [i32; 4] = [libc::ESTALE, libc::EIO, libc::ENOENT, libc::EBADF];

// ---------------------------------------------------------------------------------
// HTTP client
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    #[track_caller]
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("reply body is not JSON ({e}): {self:?}"))
    }

    #[track_caller]
    fn expect(self, status: u16) -> Resp {
        assert_eq!(self.status, status, "unexpected status: {self:?}");
        if status != 204 {
            assert_eq!(
                self.header("content-type"),
                Some("application/json"),
                "{self:?}"
            );
        }
        self
    }

    /// Asserts an error reply: `status` and a JSON `{"error": "<non-empty>"}` body.
    #[track_caller]
    fn expect_error(self, status: u16) -> String {
        let r = self.expect(status);
        let v = r.json();
        let obj = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {r:?}"));
        assert_eq!(obj.len(), 1, "error body has only `error`: {r:?}");
        let msg = obj["error"].as_str().unwrap_or_else(|| panic!("{r:?}"));
        assert!(!msg.is_empty(), "{r:?}");
        msg.to_string()
    }
}

fn connect(sock: &Path) -> UnixStream {
    let s = UnixStream::connect(sock)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", sock.display()));
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Parses one complete response at the start of `buf`: (response, bytes used).
fn parse_one(buf: &[u8]) -> Option<(Resp, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let head = match r.parse(buf).expect("malformed HTTP response") {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return None,
    };
    let headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().parse().expect("Content-Length"))
        .expect("every response has a Content-Length");
    if buf.len() < head + len {
        return None;
    }
    let resp = Resp {
        status: r.code.unwrap(),
        headers,
        body: String::from_utf8_lossy(&buf[head..head + len]).into_owned(),
    };
    Some((resp, head + len))
}

/// Reads one response from `s`; `buf` keeps bytes read past it.
#[track_caller]
fn read_resp(s: &mut UnixStream, buf: &mut Vec<u8>) -> Resp {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some((r, used)) = parse_one(buf) {
            buf.drain(..used);
            return r;
        }
        let n = s.read(&mut chunk).expect("reading a response");
        assert!(
            n > 0,
            "connection closed before a full response: {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sends `raw` on a new connection (write errors ignored: the daemon may answer and
/// close before reading everything) and reads one response.
#[track_caller]
fn send_raw(sock: &Path, raw: &[u8]) -> Resp {
    let mut s = connect(sock);
    let _ = s.write_all(raw);
    read_resp(&mut s, &mut Vec::new())
}

fn request_bytes(method: &str, path: &str, body: Option<&str>, close: bool) -> Vec<u8> {
    let body = body.unwrap_or("");
    let mut msg = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n",
        body.len()
    );
    if close {
        msg.push_str("Connection: close\r\n");
    }
    msg.push_str("\r\n");
    msg.push_str(body);
    msg.into_bytes()
}

#[track_caller]
fn request(sock: &Path, method: &str, path: &str, body: Option<&str>) -> Resp {
    let mut s = connect(sock);
    s.write_all(&request_bytes(method, path, body, true))
        .expect("sending a request");
    let mut buf = Vec::new();
    let r = read_resp(&mut s, &mut buf);
    // Connection: close is honoured: nothing after the reply. (A refused client, 403
    // or 503, whose request the daemon never read, gets ECONNRESET instead of EOF.)
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset && r.status >= 400 => {}
        Err(e) => panic!("reading to EOF after {r:?}: {e}"),
    }
    assert!(buf.is_empty() && rest.is_empty(), "bytes after the reply");
    r
}

// ---------------------------------------------------------------------------------
// Mounts
// ---------------------------------------------------------------------------------

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mountinfo lines (of `pid`, or of the test process) whose mount point is `path`.
fn mounts_at(pid: Option<i32>, path: &Path) -> Vec<String> {
    let file = match pid {
        Some(p) => format!("/proc/{p}/mountinfo"),
        None => "/proc/self/mountinfo".to_string(),
    };
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4).map(unescape).as_deref() == path.to_str())
        .map(str::to_string)
        .collect()
}

fn is_mount_point(path: &Path) -> bool {
    !mounts_at(None, path).is_empty()
}

/// Bind mounts made by a test (or by `volfsd ctl` for it): whatever is still mounted
/// at drop is lazily unmounted, so a failing test leaves nothing behind.
#[derive(Default)]
struct MountGuard(Vec<PathBuf>);

impl MountGuard {
    fn watch(&mut self, p: &Path) {
        self.0.push(p.to_path_buf());
    }

    #[track_caller]
    fn bind(&mut self, src: &Path, target: &Path) {
        mount(
            Some(src),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("mount --bind {} {}: {e}", src.display(), target.display()));
        self.watch(target);
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            for _ in 0..8 {
                if !is_mount_point(p) {
                    break;
                }
                let _ = umount2(p, MntFlags::MNT_DETACH);
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The daemon with a control socket
// ---------------------------------------------------------------------------------

struct Ctl {
    /// Dropped first: mounts go before the daemon and its test directory.
    mounts: MountGuard,
    d: Daemon,
    sock: PathBuf,
}

impl Ctl {
    fn start(test: &str, extra: &[&str]) -> Ctl {
        Ctl::start_with(TestDir::new(test), MountGuard::default(), &[], extra)
    }

    fn start_with(dir: TestDir, mounts: MountGuard, wrapper: &[&str], extra: &[&str]) -> Ctl {
        let sock = dir.control_socket();
        let arg = format!("--control-socket={}", sock.display());
        let mut args = vec![arg.as_str()];
        args.extend_from_slice(extra);
        let d = Daemon::start_wrapped(dir, wrapper, &args);
        Ctl { mounts, d, sock }
    }

    fn shared(&self) -> PathBuf {
        self.d.dir.shared().canonicalize().unwrap()
    }

    /// Creates `rel` (and parents) in SharedDir; returns its absolute path.
    fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.shared().join(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[track_caller]
    fn req(&self, method: &str, path: &str, body: Option<&str>) -> Resp {
        request(&self.sock, method, path, body)
    }

    #[track_caller]
    fn put(&self, name: &str, body: &Value) -> Resp {
        self.req("PUT", &format!("/volumes/{name}"), Some(&body.to_string()))
    }

    /// Attaches `name` at SharedDir/`rel`, expecting 201; returns the volume.
    #[track_caller]
    fn attach(&self, name: &str, rel: &str) -> Value {
        self.put(name, &json!({ "path": rel })).expect(201).json()
    }

    #[track_caller]
    fn detach(&self, name: &str) {
        let r = self
            .req("DELETE", &format!("/volumes/{name}"), None)
            .expect(204);
        assert!(r.body.is_empty(), "{r:?}");
    }

    #[track_caller]
    fn list(&self) -> Value {
        self.req("GET", "/volumes", None).expect(200).json()
    }

    #[track_caller]
    fn names(&self) -> Vec<String> {
        self.list()
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[track_caller]
    fn volume(&self, name: &str) -> Value {
        self.req("GET", &format!("/volumes/{name}"), None)
            .expect(200)
            .json()
    }

    #[track_caller]
    fn health(&self) -> Value {
        self.req("GET", "/health", None).expect(200).json()
    }

    /// Runs `volfsd ctl ARGS --control-socket SOCK`.
    fn ctl(&self, args: &[&str]) -> Output {
        let out = Command::new(daemon_binary())
            .arg("ctl")
            .args(args)
            .arg("--control-socket")
            .arg(&self.sock)
            .stdin(Stdio::null())
            .output()
            .expect("running volfsd ctl");
        eprintln!(
            "volfsd ctl {args:?}: {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `volfsd ctl ARGS`, which must succeed; returns stdout.
    #[track_caller]
    fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "volfsd ctl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.d.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `volfsd ctl ARGS`, which must fail with exit code 1; returns stderr.
    #[track_caller]
    fn ctl_err(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert_eq!(out.status.code(), Some(1), "volfsd ctl {args:?}: {out:?}");
        String::from_utf8(out.stderr).unwrap()
    }

    fn client(&self) -> FuseClient {
        self.d.client()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Names in the guest's view of directory `nodeid` (without `.` and `..`).
fn guest_names(c: &mut FuseClient, nodeid: u64) -> BTreeSet<String> {
    let dh = c.opendir(nodeid, RDONLY).expect("opendir");
    let names = c
        .readdirplus_all(nodeid, dh.fh)
        .expect("readdirplus")
        .iter()
        .map(|e| e.dirent.name_str())
        .filter(|n| n != "." && n != "..")
        .collect();
    c.releasedir(nodeid, dh.fh).expect("releasedir");
    names
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The errno of a failed request; panics on success or on a non-errno failure.
#[track_caller]
fn errno_of<T: std::fmt::Debug>(what: &str, r: Result<T, FuseError>) -> i32 {
    match r {
        Err(e) => e
            .errno()
            .unwrap_or_else(|| panic!("{what}: not an errno reply: {e}")),
        Ok(v) => panic!("{what}: succeeded on a detached volume: {v:?}"),
    }
}

/// Asserts a clean stale-id error; returns the errno.
#[track_caller]
fn assert_stale<T: std::fmt::Debug>(what: &str, r: Result<T, FuseError>) -> i32 {
    let e = errno_of(what, r);
    assert!(
        STALE_ERRNOS.contains(&e),
        "{what}: errno {e} ({}) is not one of ESTALE/EIO/ENOENT/EBADF",
        std::io::Error::from_raw_os_error(e)
    );
    e
}

/// (dev, ino) of `dir` and of everything under it.
fn inodes_under(dir: &Path) -> HashSet<(u64, u64)> {
    let mut out = HashSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        out.insert((m.dev(), m.ino()));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                todo.push(e.path());
            }
        }
    }
    out
}

/// The daemon's fds that point into `dir`: by path (readlink) or by inode, which also
/// catches fds on the daemon's private detached mounts (whose paths do not show the
/// host path).
fn fds_into(pid: i32, dir: &Path, inodes: &HashSet<(u64, u64)>) -> Vec<String> {
    let mut hits = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return hits;
    };
    for e in rd.flatten() {
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        let by_path = link.starts_with(dir);
        let by_inode = std::fs::metadata(e.path())
            .map(|m| inodes.contains(&(m.dev(), m.ino())))
            .unwrap_or(false);
        if by_path || by_inode {
            hits.push(format!(
                "fd {} -> {}",
                e.file_name().to_string_lossy(),
                link.display()
            ));
        }
    }
    hits
}

fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Polls `cond` every 10 ms until it holds or `limit` passes.
fn poll(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

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
            "stats"
        ]
        .into_iter()
        .collect()
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
        ("PATCH", "/volumes/a"),
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

// ---------------------------------------------------------------------------------
// 4.-6. What the guest sees
// ---------------------------------------------------------------------------------

#[test]
fn attach_at_runtime_is_seen_by_the_guest() {
    let c = Ctl::start("guest-attach", &[]);
    let shared = c.shared();
    let mut fc = c.client();
    assert!(poll(Duration::from_secs(5), || c.health()
        ["frontend_connected"]
        == true));
    let h = c.health();
    assert!(h["active_queues"].as_u64().unwrap() >= 1, "{h}");

    // The virtual root starts empty.
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
    crate::common::assert_errno(fc.lookup(ROOT, "data"), libc::ENOENT);

    c.mkdir("data");
    std::fs::write(shared.join("data/pre"), b"from the host").unwrap();
    c.attach("data", "data");
    assert_eq!(guest_names(&mut fc, ROOT), set(&["data"]));
    let dh = fc.opendir(ROOT, RDONLY).unwrap();
    let entries = fc.readdirplus_all(ROOT, dh.fh).unwrap();
    let e = entries
        .iter()
        .find(|e| e.dirent.name_str() == "data")
        .unwrap();
    assert_eq!(e.entry.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    fc.releasedir(ROOT, dh.fh).unwrap();

    let data = fc.lookup(ROOT, "data").expect("lookup data");
    assert_eq!(
        data.attr.ino,
        std::fs::metadata(shared.join("data")).unwrap().ino()
    );
    assert_eq!(guest_names(&mut fc, data.nodeid), set(&["pre"]));
    let pre = fc.lookup(data.nodeid, "pre").unwrap();
    let o = fc.open(pre.nodeid, RDONLY).unwrap();
    assert_eq!(fc.read(pre.nodeid, o.fh, 0, 100).unwrap(), b"from the host");
    fc.release(pre.nodeid, o.fh, RDONLY).unwrap();

    let (f, fh) = fc.create(data.nodeid, "new", RDWR, 0o644).expect("create");
    assert_eq!(fc.write(f.nodeid, fh.fh, 0, b"guest wrote").unwrap(), 11);
    assert_eq!(
        std::fs::read(shared.join("data/new")).unwrap(),
        b"guest wrote"
    );
    assert_eq!(fc.read(f.nodeid, fh.fh, 6, 100).unwrap(), b"wrote");
    crate::common::assert_errno(fc.lookup(data.nodeid, "missing"), libc::ENOENT);

    let v = c.volume("data");
    assert_eq!(v["open_handles"], 1, "{v}");
    assert!(v["live_inodes"].as_u64().unwrap() >= 3, "{v}");
    assert_eq!(v["stats"]["bytes_written"], 11, "{v}");
    assert_eq!(v["stats"]["bytes_read"], 13 + 5, "{v}");
    assert!(v["stats"]["ops"].as_u64().unwrap() >= 8, "{v}");
    assert_eq!(v["stats"]["errors"], 1, "{v}");
    fc.release(f.nodeid, fh.fh, RDWR).unwrap();
    assert_eq!(c.volume("data")["open_handles"], 0);

    // A second volume appears beside it; detaching one leaves the other.
    c.mkdir("more");
    c.attach("more", "more");
    assert_eq!(guest_names(&mut fc, ROOT), set(&["data", "more"]));
    c.detach("data");
    assert_eq!(guest_names(&mut fc, ROOT), set(&["more"]));
    crate::common::assert_errno(fc.lookup(ROOT, "data"), libc::ENOENT);
    assert_eq!(c.health()["volumes"], 1);
}

#[test]
fn detach_releases_every_fd_and_stale_ids_fail_cleanly() {
    let dir = TestDir::new("guest-detach");
    let host = dir.root.join("host-data");
    std::fs::create_dir_all(host.join("sub")).unwrap();
    std::fs::write(host.join("f"), b"content").unwrap();
    std::fs::write(host.join("sub/g"), b"g").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let shared = c.shared();
    let data = c.mkdir("data");
    c.mounts.bind(&host, &data);
    c.mkdir("other");
    std::fs::write(shared.join("other/o"), b"other content").unwrap();
    c.attach("data", "data");
    c.attach("other", "other");
    let pid = c.d.pid();
    let inodes = inodes_under(&data);

    let mut fc = c.client();
    let root = fc.lookup(ROOT, "data").unwrap();
    let f = fc.lookup(root.nodeid, "f").unwrap();
    let fh = fc.open(f.nodeid, RDONLY).unwrap().fh;
    assert_eq!(fc.read(f.nodeid, fh, 0, 100).unwrap(), b"content");
    let sub = fc.lookup(root.nodeid, "sub").unwrap();
    let subh = fc.opendir(sub.nodeid, RDONLY).unwrap().fh;
    let v = c.volume("data");
    assert_eq!(v["open_handles"], 2, "{v}");
    assert!(v["live_inodes"].as_u64().unwrap() >= 3, "{v}");
    let before = fds_into(pid, &data, &inodes);
    assert!(
        !before.is_empty(),
        "sanity: the daemon holds fds into the volume while attached"
    );
    eprintln!("fds into the volume before detach: {before:?}");

    c.detach("data");
    let mut left = Vec::new();
    let released = poll(Duration::from_secs(1), || {
        left = fds_into(pid, &data, &inodes);
        left.is_empty()
    });
    assert!(
        released,
        "fds into the volume 1 s after detach: {left:?}\n{}",
        c.d.log()
    );

    // Stale ids fail cleanly.
    let e_read = assert_stale("READ on a stale handle", fc.read(f.nodeid, fh, 0, 100));
    let e_getattr = assert_stale("GETATTR on a stale file", fc.getattr(f.nodeid));
    let e_getattr_dir = assert_stale("GETATTR on a stale dir", fc.getattr(sub.nodeid));
    let e_getattr_root = assert_stale("GETATTR on a stale root", fc.getattr(root.nodeid));
    let e_lookup = assert_stale("LOOKUP in a stale dir", fc.lookup(sub.nodeid, "g"));
    let e_readdir = assert_stale(
        "READDIRPLUS on a stale dir handle",
        fc.readdirplus(sub.nodeid, subh, 0, 4096),
    );
    let e_open = assert_stale("OPEN of a stale file", fc.open(f.nodeid, RDONLY));
    let e_create = errno_of(
        "CREATE in a stale root",
        fc.create(root.nodeid, "x", RDWR, 0o644),
    );
    eprintln!(
        "stale errnos: READ {e_read} GETATTR(file) {e_getattr} GETATTR(dir) {e_getattr_dir} \
         GETATTR(root) {e_getattr_root} LOOKUP {e_lookup} READDIRPLUS {e_readdir} OPEN {e_open} \
         CREATE {e_create}"
    );
    assert!(!host.join("x").exists());
    // RELEASE of the stale handles does not crash anything either.
    let _ = fc.release(f.nodeid, fh, RDONLY);
    let _ = fc.releasedir(sub.nodeid, subh);
    crate::common::assert_errno(fc.lookup(ROOT, "data"), libc::ENOENT);

    // The other volume is still served.
    let other = fc.lookup(ROOT, "other").unwrap();
    let o = fc.lookup(other.nodeid, "o").unwrap();
    let oh = fc.open(o.nodeid, RDONLY).unwrap().fh;
    assert_eq!(fc.read(o.nodeid, oh, 0, 100).unwrap(), b"other content");
    let (n, nh) = fc.create(other.nodeid, "n", RDWR, 0o644).unwrap();
    fc.write(n.nodeid, nh.fh, 0, b"still served").unwrap();
    assert_eq!(
        std::fs::read(shared.join("other/n")).unwrap(),
        b"still served"
    );
    assert_eq!(c.names(), ["other"]);

    // The host can unmount the bind without MNT_DETACH.
    umount(&data).unwrap_or_else(|e| panic!("umount {}: {e}", data.display()));
    assert!(!is_mount_point(&data));
    std::fs::remove_dir(&data).unwrap();
    assert_eq!(std::fs::read(host.join("f")).unwrap(), b"content");
}

/// Opens `f` in volume `name` through the guest: (root nodeid, f nodeid, fh, content).
fn open_f(fc: &mut FuseClient, name: &str) -> (u64, u64, u64, Vec<u8>) {
    let root = fc.lookup(ROOT, name).expect("lookup volume").nodeid;
    let f = fc.lookup(root, "f").expect("lookup f").nodeid;
    let fh = fc.open(f, RDONLY).expect("open f").fh;
    let data = fc.read(f, fh, 0, 100).expect("read f");
    (root, f, fh, data)
}

#[test]
fn reattach_same_name_gives_a_fresh_view() {
    let c = Ctl::start("guest-reattach", &[]);
    let shared = c.shared();
    c.mkdir("A/dir");
    c.mkdir("B/dir");
    std::fs::write(shared.join("A/f"), b"A").unwrap();
    std::fs::write(shared.join("B/f"), b"B").unwrap();
    std::fs::write(shared.join("B/only-b"), b"").unwrap();
    let mut fc = c.client();

    c.attach("v", "A");
    let (root_a, f_a, fh_a, data) = open_f(&mut fc, "v");
    assert_eq!(data, b"A");
    let dir_a = fc.lookup(root_a, "dir").unwrap().nodeid;
    let dh_a = fc.opendir(root_a, RDONLY).unwrap().fh;
    c.detach("v");

    c.attach("v", "B");
    let (root_b, f_b, fh_b, data) = open_f(&mut fc, "v");
    assert_eq!(data, b"B");
    assert_eq!(guest_names(&mut fc, root_b), set(&["dir", "f", "only-b"]));
    let dir_b = fc.lookup(root_b, "dir").unwrap().nodeid;
    let old: BTreeSet<u64> = [root_a, f_a, dir_a].into();
    for n in [root_b, f_b, dir_b] {
        assert!(!old.contains(&n), "node id {n} reused after re-attach");
    }
    // Nothing from before returns data, old or new.
    assert_stale("READ old handle", fc.read(f_a, fh_a, 0, 100));
    assert_stale("READ old handle, new node", fc.read(f_b, fh_a, 0, 100));
    assert_stale("READ new handle, old node", fc.read(f_a, fh_b, 0, 100));
    assert_stale("GETATTR old file", fc.getattr(f_a));
    assert_stale("GETATTR old root", fc.getattr(root_a));
    assert_stale("LOOKUP old root", fc.lookup(root_a, "f"));
    assert_stale("LOOKUP old root, new name", fc.lookup(root_a, "only-b"));
    assert_stale("LOOKUP old dir", fc.lookup(dir_a, "x"));
    assert_stale("OPEN old file", fc.open(f_a, RDONLY));
    assert_stale(
        "READDIRPLUS old handle",
        fc.readdirplus(root_a, dh_a, 0, 4096),
    );
    assert_eq!(fc.read(f_b, fh_b, 0, 100).unwrap(), b"B");
}

#[test]
fn thousand_attach_detach_cycles_never_alias() {
    let c = Ctl::start("guest-cycles", &[]);
    let shared = c.shared();
    c.mkdir("A");
    c.mkdir("B");
    std::fs::write(shared.join("A/f"), b"A").unwrap();
    std::fs::write(shared.join("B/f"), b"B").unwrap();
    let pid = c.d.pid();
    let mut fc = c.client();
    // Warm up once so every lazily created fd exists before counting.
    c.attach("v", "A");
    let (r0, f0, fh0, _) = open_f(&mut fc, "v");
    c.detach("v");
    let fds_before = fd_count(pid);

    let mut seen: HashSet<u64> = [r0, f0].into();
    let mut history: Vec<(u64, u64, u64)> = vec![(r0, f0, fh0)];
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    for cycle in 0..1000 {
        let (dir, want) = if cycle % 2 == 0 {
            ("B", b"B")
        } else {
            ("A", b"A")
        };
        c.attach("v", dir);
        let (root, f, fh, data) = open_f(&mut fc, "v");
        assert_eq!(data, want, "cycle {cycle}");
        assert!(
            seen.insert(root),
            "cycle {cycle}: root node id {root} seen before"
        );
        assert!(seen.insert(f), "cycle {cycle}: f node id {f} seen before");
        assert_eq!(fc.read(f, fh, 0, 100).unwrap(), want, "cycle {cycle}");
        // Spot-check: the previous cycle and three earlier ones.
        let mut sample = vec![history.len() - 1];
        for _ in 0..3 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            sample.push((rng % history.len() as u64) as usize);
        }
        for i in sample {
            let (or, of, ofh) = history[i];
            let what = format!("cycle {cycle}, ids of cycle {i}");
            assert_stale(&what, fc.getattr(of));
            assert_stale(&what, fc.read(of, ofh, 0, 100));
            assert_stale(&what, fc.read(f, ofh, 0, 100));
            assert_stale(&what, fc.lookup(or, "f"));
        }
        // Half the handles are released by the guest, half left to the detach.
        if cycle % 2 == 1 {
            fc.release(f, fh, RDONLY).unwrap();
        }
        history.push((root, f, fh));
        c.detach("v");
    }
    // Every old id is dead, and no fd leaked.
    for (i, (r, f, fh)) in history.iter().enumerate() {
        assert_stale(&format!("root of cycle {i}"), fc.getattr(*r));
        assert_stale(&format!("f of cycle {i}"), fc.getattr(*f));
        assert_stale(&format!("fh of cycle {i}"), fc.read(*f, *fh, 0, 1));
    }
    let fds_after = fd_count(pid);
    assert!(
        fds_after <= fds_before + 2,
        "fd leak over 1000 cycles: {fds_before} -> {fds_after}"
    );
    assert_eq!(c.list(), json!([]));
}

// ---------------------------------------------------------------------------------
// 7. A bind mount made after start reaches a daemon in a slave mount namespace
// ---------------------------------------------------------------------------------

#[test]
fn bind_mount_after_start_propagates_into_slave_namespace() {
    let dir = TestDir::new("slave-ns");
    let d = dir.shared().canonicalize().unwrap();
    let host = dir.root.join("host-vol");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("hello.txt"), b"from the bind mount").unwrap();
    let mut mounts = MountGuard::default();
    mounts.bind(&d, &d);
    mount(
        None::<&str>,
        &d,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .expect("mount --make-shared");
    let mut c = Ctl::start_with(
        dir,
        mounts,
        &["unshare", "-m", "--propagation", "slave", "--"],
        &[],
    );
    let pid = c.d.pid();
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_ne!(
        ns(&pid.to_string()),
        ns("self"),
        "the daemon runs in its own mount namespace"
    );
    let mut fc = c.client();
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));

    // After start: a bind mount on the host, under the shared SharedDir.
    let vol = d.join("vol");
    std::fs::create_dir(&vol).unwrap();
    c.mounts.bind(&host, &vol);
    assert!(
        poll(Duration::from_secs(2), || !mounts_at(Some(pid), &vol)
            .is_empty()),
        "the bind mount did not propagate into the daemon's namespace"
    );
    let inodes = inodes_under(&vol);
    c.attach("vol", "vol");
    let root = fc.lookup(ROOT, "vol").unwrap();
    assert_eq!(
        root.attr.ino,
        std::fs::metadata(&host).unwrap().ino(),
        "the guest sees the bind-mounted dir, not the empty mountpoint"
    );
    assert_eq!(guest_names(&mut fc, root.nodeid), set(&["hello.txt"]));
    let f = fc.lookup(root.nodeid, "hello.txt").unwrap();
    let fh = fc.open(f.nodeid, RDONLY).unwrap().fh;
    assert_eq!(
        fc.read(f.nodeid, fh, 0, 100).unwrap(),
        b"from the bind mount"
    );
    let (n, nh) = fc.create(root.nodeid, "from-guest", RDWR, 0o644).unwrap();
    fc.write(n.nodeid, nh.fh, 0, b"guest").unwrap();
    assert_eq!(std::fs::read(host.join("from-guest")).unwrap(), b"guest");

    c.detach("vol");
    let mut left = Vec::new();
    assert!(
        poll(Duration::from_secs(1), || {
            left = fds_into(pid, &vol, &inodes);
            left.is_empty()
        }),
        "fds into the volume after detach: {left:?}"
    );
    umount(&vol).unwrap_or_else(|e| panic!("umount {}: {e}", vol.display()));
    assert!(!is_mount_point(&vol));
    assert!(
        poll(Duration::from_secs(2), || mounts_at(Some(pid), &vol)
            .is_empty()),
        "the umount did not propagate into the daemon's namespace"
    );
    std::fs::remove_dir(&vol).unwrap();
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
}

// ---------------------------------------------------------------------------------
// 8. volfsd ctl
// ---------------------------------------------------------------------------------

#[test]
fn ctl_attach_bind_list_stats_detach() {
    let dir = TestDir::new("ctl");
    let h_rw = dir.root.join("h-rw");
    let h_ro = dir.root.join("h-ro");
    std::fs::create_dir(&h_rw).unwrap();
    std::fs::create_dir(&h_ro).unwrap();
    std::fs::write(h_rw.join("rw.txt"), b"rw").unwrap();
    std::fs::write(h_ro.join("ro.txt"), b"ro").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let shared = c.shared();
    let (t_rw, t_ro) = (shared.join("rw"), shared.join("ro"));
    c.mounts.watch(&t_rw);
    c.mounts.watch(&t_ro);
    let mut fc = c.client();

    assert_eq!(c.ctl_ok(&["list"]).trim(), "no volumes attached");

    let out = c.ctl_ok(&["attach", "rw", "--bind", h_rw.to_str().unwrap()]);
    assert_eq!(
        out.trim(),
        format!("attached rw (rw) from {}", t_rw.display())
    );
    assert!(is_mount_point(&t_rw));
    let out = c.ctl_ok(&[
        "attach",
        "ro",
        "--bind",
        h_ro.to_str().unwrap(),
        "--read-only",
        "--volume-id",
        "vid-ro",
        "--json",
    ]);
    let v: Value = serde_json::from_str(out.trim()).expect("attach --json");
    assert_eq!(v["name"], "ro");
    assert_eq!(v["read_only"], true);
    assert_eq!(v["volume_id"], "vid-ro");
    assert_eq!(v["path"], t_ro.to_str().unwrap());
    let m = mounts_at(None, &t_ro);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "the ro bind is mounted read-only: {m:?}"
    );

    // The guest sees both; writes land in rw and fail with EROFS in ro.
    assert_eq!(guest_names(&mut fc, ROOT), set(&["ro", "rw"]));
    let rw = fc.lookup(ROOT, "rw").unwrap().nodeid;
    let ro = fc.lookup(ROOT, "ro").unwrap().nodeid;
    assert_eq!(guest_names(&mut fc, rw), set(&["rw.txt"]));
    assert_eq!(guest_names(&mut fc, ro), set(&["ro.txt"]));
    let (n, nh) = fc.create(rw, "new", RDWR, 0o644).unwrap();
    assert_eq!(fc.write(n.nodeid, nh.fh, 0, b"12345").unwrap(), 5);
    assert_eq!(std::fs::read(h_rw.join("new")).unwrap(), b"12345");
    crate::common::assert_errno(fc.create(ro, "new", RDWR, 0o644), libc::EROFS);
    crate::common::assert_errno(fc.mkdir(ro, "d", 0o755), libc::EROFS);
    let rotxt = fc.lookup(ro, "ro.txt").unwrap().nodeid;
    crate::common::assert_errno(fc.open(rotxt, RDWR), libc::EROFS);
    let roh = fc.open(rotxt, RDONLY).unwrap().fh;
    assert_eq!(fc.read(rotxt, roh, 0, 10).unwrap(), b"ro");
    assert!(!h_ro.join("new").exists());
    let e = std::fs::write(t_ro.join("host-write"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));

    // list, human and JSON.
    let out = c.ctl_ok(&["list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let cols: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        cols,
        ["NAME", "RO", "HANDLES", "INODES", "OPS", "READ", "WRITTEN", "ERRORS", "PATH"]
    );
    let row = |name: &str| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|c| c[0] == name)
            .unwrap_or_else(|| panic!("no row for {name}: {out}"))
    };
    let r = row("rw");
    assert_eq!(r[1], "rw");
    assert_eq!(r[2], "1", "one open handle: {r:?}");
    assert_eq!(r[6], "5", "5 bytes written: {r:?}");
    assert_eq!(r[8], t_rw.to_str().unwrap());
    let r = row("ro");
    assert_eq!(r[1], "ro");
    assert_eq!(r[5], "2", "2 bytes read: {r:?}");
    assert_eq!(r[8], t_ro.to_str().unwrap());
    let list: Value = serde_json::from_str(&c.ctl_ok(&["list", "--json"])).unwrap();
    assert_eq!(list, c.list());
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ro", "rw"]);

    // stats, all and one, human and JSON.
    let out = c.ctl_ok(&["stats"]);
    assert!(out.starts_with("frontend connected: true\n"), "{out}");
    assert!(out.contains("request queues + hiprio"), "{out}");
    assert!(
        out.contains("NAME") && out.contains(t_rw.to_str().unwrap()),
        "{out}"
    );
    let out = c.ctl_ok(&["stats", "rw"]);
    let field = |k: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .trim()
            .to_string()
    };
    assert_eq!(field("name"), "rw");
    assert_eq!(field("volume_id"), "-");
    assert_eq!(field("path"), t_rw.to_str().unwrap());
    assert_eq!(field("read_only"), "false");
    assert_eq!(field("open_handles"), "1");
    assert_eq!(field("bytes_written"), "5");
    let one: Value = serde_json::from_str(&c.ctl_ok(&["stats", "ro", "--json"])).unwrap();
    assert_eq!(one, c.volume("ro"));
    assert_eq!(one["stats"]["bytes_read"], 2);
    let all: Value = serde_json::from_str(&c.ctl_ok(&["stats", "--json"])).unwrap();
    assert_eq!(all, c.list());
    let err = c.ctl_err(&["stats", "nope"]);
    assert!(err.contains("404"), "{err}");

    // detach unmounts the bind and removes the mount point it created.
    let out = c.ctl_ok(&["detach", "rw"]);
    assert_eq!(
        out.trim(),
        format!("detached rw and unmounted {}", t_rw.display())
    );
    assert!(!is_mount_point(&t_rw));
    assert!(!t_rw.exists());
    assert_eq!(std::fs::read(h_rw.join("new")).unwrap(), b"12345");
    c.ctl_ok(&["detach", "ro"]);
    assert!(!is_mount_point(&t_ro));
    assert!(!t_ro.exists());
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
    let err = c.ctl_err(&["detach", "rw"]);
    assert!(err.contains("404"), "{err}");
    assert_eq!(c.ctl_ok(&["list"]).trim(), "no volumes attached");
    assert!(std::fs::read_dir(&shared).unwrap().next().is_none());
}

#[test]
fn ctl_failed_attach_rolls_back_the_bind() {
    let dir = TestDir::new("ctl-rollback");
    let h = dir.root.join("h");
    std::fs::create_dir(&h).unwrap();
    std::fs::write(h.join("h.txt"), b"h").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let shared = c.shared();
    for n in ["x", "y", "bad.name", "o1"] {
        c.mounts.watch(&shared.join(n));
    }
    let hs = h.to_str().unwrap();
    c.mkdir("other1");
    c.mkdir("other2");
    c.attach("x", "other1");
    c.attach("y", "other2");
    let before = c.list();

    // Name conflict, mount point created by ctl: unmounted and removed.
    let err = c.ctl_err(&["attach", "x", "--bind", hs]);
    assert!(err.contains("409"), "{err}");
    assert!(!is_mount_point(&shared.join("x")));
    assert!(
        !shared.join("x").exists(),
        "the created mount point is removed"
    );

    // Name conflict, mount point existed: unmounted, kept, content untouched.
    let y = c.mkdir("y");
    std::fs::write(y.join("marker"), b"m").unwrap();
    let err = c.ctl_err(&["attach", "y", "--bind", hs, "--read-only"]);
    assert!(err.contains("409"), "{err}");
    assert!(!is_mount_point(&y));
    assert_eq!(std::fs::read(y.join("marker")).unwrap(), b"m");
    assert!(!y.join("h.txt").exists());

    // Bad name (400).
    let err = c.ctl_err(&["attach", "bad.name", "--bind", hs]);
    assert!(err.contains("400"), "{err}");
    assert!(!is_mount_point(&shared.join("bad.name")));
    assert!(!shared.join("bad.name").exists());

    // Overlapping the directory of a volume (409): other1 is x's directory.
    let err = c.ctl_err(&["attach", "o1", "--path", "other1", "--bind", hs]);
    assert!(err.contains("409"), "{err}");
    assert!(!is_mount_point(&shared.join("other1")));

    // A bind source that does not exist: nothing mounted, nothing created.
    let err = c.ctl_err(&["attach", "z", "--bind", "/nonexistent/volfsd-test"]);
    assert!(err.contains("bind"), "{err}");
    assert!(!shared.join("z").exists());

    assert_eq!(c.list(), before);
    assert_eq!(std::fs::read(h.join("h.txt")).unwrap(), b"h");
    assert_eq!(
        std::fs::read_dir(&h).unwrap().count(),
        1,
        "nothing written to the bind source"
    );
}

/// `ctl detach` whose unmount fails (the host holds a file open in the bind mount)
/// attaches the volume again and fails, as documented; a later detach succeeds.
#[test]
fn ctl_detach_with_busy_bind_reattaches() {
    let dir = TestDir::new("ctl-busy");
    let h = dir.root.join("h");
    std::fs::create_dir(&h).unwrap();
    std::fs::write(h.join("f"), b"busy").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let b = c.shared().join("b");
    c.mounts.watch(&b);
    let mut fc = c.client();
    c.ctl_ok(&[
        "attach",
        "b",
        "--bind",
        h.to_str().unwrap(),
        "--volume-id",
        "vid-b",
    ]);
    let (_, _, _, data) = open_f(&mut fc, "b");
    assert_eq!(data, b"busy");

    let holder = std::fs::File::open(b.join("f")).unwrap();
    let err = c.ctl_err(&["detach", "b"]);
    assert!(err.contains("re-attached"), "{err}");
    assert!(is_mount_point(&b));
    let v = c.volume("b");
    assert_eq!(v["volume_id"], "vid-b");
    assert_eq!(v["path"], b.to_str().unwrap());
    let (_, _, _, data) = open_f(&mut fc, "b");
    assert_eq!(data, b"busy", "the guest has the volume again");

    drop(holder);
    c.ctl_ok(&["detach", "b"]);
    assert!(!is_mount_point(&b));
    assert!(!b.exists());
    assert_eq!(c.list(), json!([]));
    assert_eq!(guest_names(&mut fc, ROOT), set(&[]));
}

/// `ctl attach --bind` of a name that is already attached must not stack a second
/// bind mount on the volume's directory: the guest keeps being served the first
/// mount, the new one hides it from the host, and `ctl detach` unmounts only one.
#[test]
fn ctl_attach_retry_does_not_stack_bind_mounts() {
    let dir = TestDir::new("ctl-retry");
    let h1 = dir.root.join("h1");
    let h2 = dir.root.join("h2");
    std::fs::create_dir(&h1).unwrap();
    std::fs::create_dir(&h2).unwrap();
    std::fs::write(h1.join("f"), b"1").unwrap();
    std::fs::write(h2.join("f"), b"2").unwrap();
    let mut c = Ctl::start_with(dir, MountGuard::default(), &[], &[]);
    let z = c.shared().join("z");
    c.mounts.watch(&z);
    let mut fc = c.client();

    c.ctl_ok(&["attach", "z", "--bind", h1.to_str().unwrap()]);
    assert_eq!(mounts_at(None, &z).len(), 1);

    // Identical retry: succeeds, still one mount.
    let out = c.ctl(&["attach", "z", "--bind", h1.to_str().unwrap()]);
    let retry_ok = out.status.success();
    let after_retry = mounts_at(None, &z).len();
    // Other source: whatever the answer, the host path and the guest agree.
    let out2 = c.ctl(&["attach", "z", "--bind", h2.to_str().unwrap()]);
    let after_other = mounts_at(None, &z).len();
    let host_sees = std::fs::read(z.join("f")).unwrap();
    let (_, _, _, guest_sees) = open_f(&mut fc, "z");

    let detach = c.ctl(&["detach", "z"]);
    let left = mounts_at(None, &z).len();

    let mut problems = Vec::new();
    if !retry_ok {
        problems.push(format!("an identical `ctl attach` retry failed: {out:?}"));
    }
    if after_retry != 1 {
        problems.push(format!(
            "an identical retry left {after_retry} bind mounts stacked at {}",
            z.display()
        ));
    }
    if after_other != 1 {
        problems.push(format!(
            "`ctl attach z --bind h2` ({}: {}) left {after_other} bind mounts stacked",
            out2.status,
            String::from_utf8_lossy(&out2.stdout).trim()
        ));
    }
    if host_sees != guest_sees {
        problems.push(format!(
            "the host path shows f={:?} but the guest reads f={:?}",
            String::from_utf8_lossy(&host_sees),
            String::from_utf8_lossy(&guest_sees)
        ));
    }
    if !detach.status.success() || left != 0 {
        problems.push(format!(
            "after `ctl detach z` ({}) {left} mounts remain at {}",
            detach.status,
            z.display()
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
