//! A saved session is untrusted input: a device state read from a file or a
//! stream, the hand-over socket a state names, and the session region a frontend
//! hands back after a restart. Each is checked against the daemon's own
//! configuration before anything of it is applied, and a load that fails leaves the
//! daemon serving what it served (docs/SECURITY.md, "Loaded sessions").

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::Opcode;
use serde_json::json;
use volfsd::exports::region::Region;
use volfsd::exports::state::format::{self, Handoff, Location, SessionState};
use volfsd_harness::fixtures::host::{host_lock, host_sees_lock, poll};
use volfsd_harness::fixtures::requests::lock_request;
use volfsd_harness::fixtures::{assert_errno, is_virtiofsd, Daemon, TestDir, RDWR, ROOT};
use volfsd_harness::frontend::fuse::InitParams;
use volfsd_harness::frontend::{FuseClient, FuseOps};

fn decode(bytes: &[u8]) -> SessionState {
    format::decode(bytes).expect("the daemon writes a state it can read")
}

/// A daemon serving volumes `a` and `b`, a guest that looked both up and made a
/// file in `a`, and the state it saved (its queues run on).
struct Serving {
    d: Daemon,
    c: FuseClient,
    a: u64,
    b: u64,
    file: u64,
    saved: Vec<u8>,
}

fn serving(test: &str) -> Serving {
    let dir = TestDir::new(test);
    for v in ["a", "b"] {
        std::fs::create_dir(dir.shared().join(v)).unwrap();
    }
    let d = Daemon::start_in(dir, &["--allowed-dir=a", "--allowed-dir=b"]);
    let mut c = d.client();
    let a = c.lookup(ROOT, "a").unwrap().nodeid;
    let b = c.lookup(ROOT, "b").unwrap().nodeid;
    let (f, _) = c.create(a, "f", RDWR, 0o644).unwrap();
    let saved = c.save_state_paused().expect("save");
    Serving {
        d,
        c,
        a,
        b,
        file: f.nodeid,
        saved,
    }
}

impl Serving {
    /// `state` is refused (the VMM's CHECK_DEVICE_STATE fails), and the daemon
    /// serves the same node ids and volumes after it, a new session too.
    #[track_caller]
    fn refused_and_unchanged(&mut self, state: &SessionState, what: &str) {
        let bytes = format::encode(state);
        self.refused_bytes_and_unchanged(&bytes, what);
    }

    /// `bytes` are refused, and the daemon serves on as [`Self::refused_and_unchanged`]
    /// says.
    #[track_caller]
    fn refused_bytes_and_unchanged(&mut self, bytes: &[u8], what: &str) {
        let loaded = self.c.load_state_paused(bytes);
        assert!(loaded.is_err(), "{what}: loaded\n{}", self.d.log());
        for (node, name) in [(self.a, "a"), (self.b, "b"), (self.file, "a/f")] {
            self.c
                .getattr(node)
                .unwrap_or_else(|e| panic!("{what}: node {node} ({name}) after the refusal: {e}"));
        }
        assert_eq!(self.c.lookup(ROOT, "a").unwrap().nodeid, self.a, "{what}");
        assert_eq!(self.c.lookup(ROOT, "b").unwrap().nodeid, self.b, "{what}");
        assert_eq!(
            self.c.lookup(self.a, "f").unwrap().nodeid,
            self.file,
            "{what}"
        );
    }

    /// A valid state still loads, and a new session (a rebooted guest) finds both
    /// volumes.
    fn still_loads_and_starts_over(&mut self) {
        self.c.load_state_paused(&self.saved).unwrap_or_else(|e| {
            panic!("the valid state after the refusals: {e}\n{}", self.d.log())
        });
        self.c.getattr(self.file).expect("the state's file");
        self.c.init_session(&InitParams::default()).expect("INIT");
        for v in ["a", "b"] {
            let e = self
                .c
                .lookup(ROOT, v)
                .unwrap_or_else(|e| panic!("volume {v} in a new session: {e}\n{}", self.d.log()));
            self.c.getattr(e.nodeid).unwrap();
        }
    }
}

#[test]
fn a_state_whose_volumes_share_one_root_id_is_refused_and_changes_nothing() {
    if is_virtiofsd() {
        return;
    }
    let mut s = serving("ls-root-ids");
    let mut state = decode(&s.saved);
    assert_eq!(state.volumes.len(), 2);
    state.volumes[1].root = state.volumes[0].root;
    s.refused_and_unchanged(&state, "two volumes on one root id");
    // Swapped: two volumes on each other's ids is a valid renumbering, but a root id
    // that is a plain node of the state is not.
    let mut state = decode(&s.saved);
    state.volumes[0].root = s.file;
    s.refused_and_unchanged(&state, "a root on a file's id");
    s.still_loads_and_starts_over();
}

#[test]
fn a_refused_load_of_any_kind_leaves_the_daemon_as_it_was() {
    if is_virtiofsd() {
        return;
    }
    let mut s = serving("ls-any-refusal");
    let saved = decode(&s.saved);
    let file = s.file;
    // Bytes that are no state, or half of one.
    let half = s.saved[..s.saved.len() / 2].to_vec();
    s.refused_bytes_and_unchanged(b"not a device state", "not a state");
    s.refused_bytes_and_unchanged(&half, "a truncated state");
    let changed = |f: &dyn Fn(&mut SessionState)| {
        let mut st = saved.clone();
        f(&mut st);
        st
    };
    let cases: Vec<(SessionState, &str)> = vec![
        (
            changed(&|st| st.config.cache = "always".into()),
            "another --cache",
        ),
        (
            changed(&|st| st.volumes[1].name = "c".into()),
            "a volume not attached here",
        ),
        (
            changed(&|st| st.volumes[0].read_only = true),
            "a read-write volume saved read-only",
        ),
        (
            changed(&|st| {
                for n in &mut st.nodes {
                    if n.id == file {
                        n.location = Location::Child {
                            parent: n_parent(&n.location),
                            name: b"missing".to_vec(),
                        };
                    }
                }
            }),
            "a node that is not there (--migration-on-error=abort)",
        ),
        (
            changed(&|st| {
                for n in &mut st.nodes {
                    if n.id == file {
                        n.location = Location::Child {
                            parent: 999,
                            name: b"f".to_vec(),
                        };
                    }
                }
            }),
            "a node under a parent the state does not have",
        ),
        (
            changed(&|st| st.handles[0].node = 12_345),
            "a handle of no node",
        ),
        (
            changed(&|st| {
                st.parked.push(format::ParkedRequest {
                    queue: 0,
                    head: 0,
                    request: vec![0; 40],
                })
            }),
            "an unanswered request on the hiprio queue",
        ),
        (
            changed(&|st| {
                if let Some(f) = &mut st.fuse {
                    f.granted ^= 1 << 3;
                }
            }),
            "an INIT this daemon would not grant so",
        ),
        (
            changed(&|st| {
                st.locks.push(format::Lock::Flock {
                    handle: 999,
                    kind: libc::F_WRLCK,
                })
            }),
            "a flock on no handle",
        ),
    ];
    for (state, what) in &cases {
        s.refused_and_unchanged(state, what);
    }
    s.still_loads_and_starts_over();
}

/// The parent a node's location names (its volume root for a child of the root).
fn n_parent(l: &Location) -> u64 {
    match l {
        Location::Child { parent, .. } => *parent,
        _ => 0,
    }
}

#[test]
fn id_counters_at_the_end_of_their_range_are_refused() {
    if is_virtiofsd() {
        return;
    }
    let mut s = serving("ls-counters");
    let cases: [(Option<u64>, Option<u64>); 7] = [
        (Some(u64::MAX - 1), None),
        (Some(1 << 63), None),
        (Some(1 << 62), None),
        (Some(0), None),
        (Some(2), None),
        (None, Some(u64::MAX)),
        (None, Some(0)),
    ];
    for (next_node, next_handle) in cases {
        let mut state = decode(&s.saved);
        if let Some(n) = next_node {
            state.next_node_id = n;
        }
        if let Some(h) = next_handle {
            state.next_handle_id = h;
        }
        s.refused_and_unchanged(
            &state,
            &format!("next node id {next_node:#x?}, next handle id {next_handle:#x?}"),
        );
    }
    s.still_loads_and_starts_over();
    // New nodes never take a reserved or a live id.
    let a = s.c.lookup(ROOT, "a").unwrap().nodeid;
    let b = s.c.lookup(ROOT, "b").unwrap().nodeid;
    let (new, _) = s.c.create(a, "new", RDWR, 0o644).unwrap();
    assert!(
        ![ROOT, a, b].contains(&new.nodeid) && new.nodeid < (1 << 62),
        "a new node got id {:#x}",
        new.nodeid
    );
}

/// A file `name` in the shared directory that a guest holds a POSIX write lock on
/// (owner 7), saved with the lock; the source daemon has exited after (it keeps
/// the shared directory).
fn saved_with_a_lock(test: &str) -> (Daemon, Vec<u8>, u64) {
    let src = Daemon::start(test, &[]);
    let host = src.dir.shared();
    std::fs::write(host.join("f"), b"locked").unwrap();
    std::fs::set_permissions(host.join("f"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut c = src.client();
    let f = c.lookup(ROOT, "f").unwrap().nodeid;
    let fh = c.open(f, RDWR).unwrap().fh;
    c.call(&lock_request(Opcode::Setlk, f, fh, 7, libc::F_WRLCK, false))
        .expect("the guest's lock");
    let bytes = c.stop_and_save_state().expect("save");
    drop(c);
    let mut src = src;
    assert!(
        src.wait_exit(Duration::from_secs(10)).is_some(),
        "the source exits"
    );
    assert!(!host_sees_lock(&host.join("f")), "the source let go");
    (src, bytes, f)
}

fn destination(shared: &Path, test: &str) -> Daemon {
    let arg = format!("--shared-dir={}", shared.display());
    Daemon::start_in(TestDir::new(test), &[&arg])
}

fn resume_on(d: &Daemon, state: &[u8]) -> volfsd_harness::frontend::Result<FuseClient> {
    let mut cfg = d.config();
    cfg.load_state = Some(state.to_vec());
    FuseClient::connect(&cfg)
}

#[test]
fn a_restored_lock_held_by_another_then_a_reboot_leaves_the_daemon_serving() {
    if is_virtiofsd() {
        return;
    }
    let (src, bytes, f) = saved_with_a_lock("ls-pending-src");
    let host = src.dir.shared();
    // Another host process holds the lock when the state is loaded: the destination
    // waits for it on a thread of its own.
    let held = host_lock(&host.join("f"));
    let mut dst = destination(&host, "ls-pending-dst");
    let mut g = resume_on(&dst, &bytes).expect("the destination loads the state");
    assert!(
        poll(Duration::from_secs(5), || dst
            .log()
            .contains("still held by another")),
        "{}",
        dst.log()
    );
    // The guest reboots: the new session ends the wait.
    g.init_session(&InitParams::default()).expect("INIT");
    std::thread::sleep(Duration::from_millis(300));
    assert!(dst.is_running(), "the daemon died:\n{}", dst.log());
    assert_ne!(g.lookup(ROOT, "f").unwrap().nodeid, 0);
    assert!(g.getattr(f).is_err(), "the old session's node is gone");
    drop(held);

    // The same, and then the frontend goes away: a clean exit, not SIGSYS.
    let held = host_lock(&host.join("f"));
    let mut dst = destination(&host, "ls-pending-dst2");
    let g = resume_on(&dst, &bytes).expect("the destination loads the state");
    assert!(poll(Duration::from_secs(5), || dst
        .log()
        .contains("still held by another")));
    drop(g);
    let status = dst.wait_exit(Duration::from_secs(10)).expect("it exits");
    assert!(status.success(), "{status:?}\n{}", dst.log());
    drop(held);
}

/// The raw credentials of the calling thread only (glibc's wrappers change every
/// thread's).
fn set_thread_ids(uid: u32) {
    // SAFETY: the raw system call changes this thread's credentials only. The saved
    // uid stays 0, so the thread can come back.
    let r = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, 0) };
    assert_eq!(r, 0, "setresuid: {}", std::io::Error::last_os_error());
}

/// A hand-over source that is not the daemon: listens on the abstract socket
/// `name` as `uid`, takes the token, and sends `batches` batches of one entry each
/// (the lock file of `(node, owner)`: the file at `file`, opened as `uid` with no
/// lock on it), `gap` apart, then the end.
fn fake_source(
    name: &str,
    uid: u32,
    file: &Path,
    node: u64,
    batches: usize,
    gap: Duration,
) -> std::thread::JoinHandle<()> {
    use std::os::linux::net::SocketAddrExt;
    let (name, file) = (name.to_string(), file.to_path_buf());
    let (ready, wait) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        set_thread_ids(uid);
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        ready.send(()).unwrap();
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        let mut token = [0u8; 32];
        if s.read_exact(&mut token).is_err() {
            return;
        }
        for _ in 0..batches {
            let mut payload = 1u32.to_le_bytes().to_vec();
            payload.push(1);
            payload.extend_from_slice(&node.to_le_bytes());
            payload.extend_from_slice(&7u64.to_le_bytes());
            if send_fd(&s, &payload, f.as_raw_fd()).is_err() {
                return;
            }
            std::thread::sleep(gap);
        }
        let _ = s.write_all(&0u32.to_le_bytes());
    });
    wait.recv().unwrap();
    h
}

fn send_fd(s: &std::os::unix::net::UnixStream, payload: &[u8], fd: i32) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let iov = [std::io::IoSlice::new(payload)];
    let fds = [fd];
    sendmsg::<()>(
        s.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map(|_| ())
    .map_err(std::io::Error::from)
}

/// The saved state with its hand-over pointed at the abstract socket `name`.
fn pointed_at(bytes: &[u8], name: &str) -> Vec<u8> {
    let mut state = decode(bytes);
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string();
    state.handoff = Some(Handoff {
        boot_id,
        socket: name.to_string(),
        token: vec![0x5a; 32],
    });
    format::encode(&state)
}

#[test]
fn a_hand_over_socket_of_another_user_is_refused_and_the_lock_is_taken_on_the_host() {
    if is_virtiofsd() {
        return;
    }
    let (src, bytes, f) = saved_with_a_lock("ls-foreign-src");
    let host = src.dir.shared();
    let name = format!("volfsd-test-foreign-{}", std::process::id());
    let peer = fake_source(&name, 65534, &host.join("f"), f, 1, Duration::ZERO);
    let dst = destination(&host, "ls-foreign-dst");
    let mut g = resume_on(&dst, &pointed_at(&bytes, &name)).expect("the state loads");
    let log = dst.log();
    assert!(log.contains("uid 65534"), "the peer is named:\n{log}");
    // The guest's lock is really held on the host (the daemon took it itself), not
    // only believed held through a file another user handed over.
    assert!(host_sees_lock(&host.join("f")), "{log}");
    g.getattr(f).unwrap();
    drop(peer);
}

#[test]
fn a_hand_over_that_trickles_is_cut_off_and_a_handed_file_without_the_lock_is_not_trusted() {
    if is_virtiofsd() {
        return;
    }
    let (src, bytes, f) = saved_with_a_lock("ls-trickle-src");
    let host = src.dir.shared();
    let name = format!("volfsd-test-trickle-{}", std::process::id());
    // A peer of the daemon's own uid (no keeper: no pid to check) that sends an
    // entry every second for ever, each an open file of the right inode without
    // the lock on it.
    // SAFETY: geteuid cannot fail.
    let own = unsafe { libc::geteuid() };
    let _peer = fake_source(&name, own, &host.join("f"), f, 1000, Duration::from_secs(1));
    let dst = destination(&host, "ls-trickle-dst");
    let state = pointed_at(&bytes, &name);
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    let cfg_dst = dst.config();
    std::thread::spawn(move || {
        let mut cfg = cfg_dst;
        cfg.load_state = Some(state);
        let _ = tx.send(FuseClient::connect(&cfg));
    });
    let mut g = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("the load never ended:\n{}", dst.log()))
        .expect("the state loads");
    assert!(started.elapsed() < Duration::from_secs(120));
    assert!(host_sees_lock(&host.join("f")), "{}", dst.log());
    g.getattr(f).unwrap();
}

#[test]
fn a_handed_back_region_cannot_attach_a_directory_or_make_a_read_only_volume_writable() {
    if is_virtiofsd() {
        return;
    }
    let dir = TestDir::new("ls-region");
    for v in ["data", "secret"] {
        std::fs::create_dir(dir.shared().join(v)).unwrap();
    }
    std::fs::write(dir.shared().join("secret/key"), b"never given").unwrap();
    std::fs::write(dir.shared().join("data/f"), b"read-only").unwrap();
    let ctl = format!("--control-socket={}", dir.control_socket().display());
    let mut d = Daemon::start_in(dir, &["--upgradable", "--allowed-dir=data:ro", &ctl]);
    let mut cfg = d.config();
    cfg.inflight = true;
    let mut c = d.client_with(&cfg);
    let data = c.lookup(ROOT, "data").unwrap().nodeid;
    let f = c.lookup(data, "f").unwrap().nodeid;
    let fh = c.open(f, 0).unwrap().fh;
    // The region as a hostile frontend (or a stale one from another daemon on the
    // same shared directory) hands it back: `data` read-write, and `secret`.
    let inflight = c.device().take_inflight().expect("an inflight region");
    let forged = json!([
        {"name": "data", "volume": {"path": "data", "read_only": false}},
        {"name": "secret", "volume": {"path": "secret", "read_only": false}},
    ]);
    let region = Region::open(OwnedFd::from(inflight.1.try_clone().unwrap())).unwrap();
    region.set_volumes(&forged.to_string()).unwrap();
    drop(region);
    c.device().put_inflight(inflight);
    d.restart();
    c.reconnect(&cfg)
        .unwrap_or_else(|e| panic!("reconnect: {e}\n{}", d.log()));
    assert!(
        poll(Duration::from_secs(10), || d
            .log()
            .contains("took over the guest's session")),
        "{}",
        d.log()
    );
    let log = d.log();
    assert!(
        log.contains("secret"),
        "the refused volume is named:\n{log}"
    );
    assert_errno(c.lookup(ROOT, "secret"), libc::ENOENT);
    // The guest's session is back, read-only as the command line says.
    assert_eq!(c.read(f, fh, 0, 64).unwrap(), b"read-only");
    assert_errno(c.create(data, "new", RDWR, 0o644), libc::EROFS);
    assert_errno(c.open(f, RDWR), libc::EROFS);
    assert!(!d.dir.shared().join("data/new").exists());
}
