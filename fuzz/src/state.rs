//! Target `state`: the device-state loader (`state::format::decode`, then
//! `FsServer::load_session`), which reads bytes a VMM hands over from wherever the
//! state was saved: another host, an old snapshot file, anyone who could write it.
//!
//! Input: the first byte picks the load's options (bit 0:
//! `--migration-on-error=guest-error`; bit 1: loaded as a crashed process's
//! successor loads its journal; bit 2: the rest mutates a valid state, below), then
//! the state's bytes as a VMM would hand them over (header and postcard body).
//! With bit 2, the next byte picks one of the states a real stack saved (the seeds)
//! and each following 10 bytes (`op u8 | index u8 | value u64 LE`) change it where
//! a byte-level mutation rarely reaches: the id counters, a volume's root id, mode,
//! name, place or presence in the volume table, a node's id, volume or lookups, a
//! handle's id, a virtual directory added. The state is loaded into a fresh stack
//! on a SharedDir with a read-write volume `rw`, a read-only volume `ro` and a
//! directory `hidden` no volume names, beside a symlink out of the tree, whose
//! guest has a session already (INIT, `rw` looked up). A loaded state is then used:
//! GETATTR of every node id it names and READ through every handle, as the guest
//! would on.
//!
//! Oracle: no panic; decoding and loading return within 2 s (a watchdog aborts);
//! a state refused changes nothing (the session before it serves on: `rw`'s node
//! id answers, and a new INIT works); after each input no fd the loader or the
//! requests opened refers to anything outside the scratch tree, to `hidden`, or to
//! a device; `ro` is unchanged.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use fuse_backend_rs::transport::{FuseDevWriter, Writer};
use volfsd::exports::fs::passthrough::state::HandedFiles;
use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig, ShareSpec};
use volfsd::exports::region::Journal;
use volfsd::exports::state::format::{self, GuestView};
use volfsd::exports::state::{LoadOptions, OnError};

use crate::common::{check_fds, open_fds, tree_checksum, tree_inodes, Scratch, Watchdog};
use crate::fuse::{init_body, op, request};

const MAX_TIME: std::time::Duration = std::time::Duration::from_secs(2);
/// At most this many node ids and handles of a loaded state are used afterwards.
const MAX_USES: usize = 32;

/// The scratch tree the state and region targets load sessions on, and what their
/// requests reply into.
pub struct State {
    pub scratch: Scratch,
    pub specs: Vec<ShareSpec>,
    pub ro_sum: u64,
    replies: File,
    reply_buf: Vec<u8>,
}

/// The scratch tree, made once per process.
pub fn scratch_tree() -> &'static Mutex<State> {
    state()
}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| {
        let scratch = Scratch::new("state", Some(16));
        let p = scratch.path().to_path_buf();
        for d in ["rw/d/e", "ro/d", "hidden"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        std::fs::write(p.join("rw/f"), b"rw file\n").unwrap();
        std::fs::write(p.join("rw/d/g"), b"g\n").unwrap();
        std::fs::write(p.join("ro/f"), b"ro file\n").unwrap();
        std::fs::write(p.join("hidden/secret"), b"SECRET").unwrap();
        let _ = std::os::unix::fs::symlink("/etc", p.join("rw/out"));
        let _ = std::os::unix::fs::symlink("../hidden", p.join("rw/up"));
        let specs = volfsd::exports::config::parse_allowed_dirs(
            &p,
            &["rw".to_string(), "ro:ro".to_string()],
        )
        .unwrap();
        // SAFETY: memfd_create with a valid name; the fd is owned by the File.
        let replies = unsafe {
            let fd = libc::memfd_create(c"volfsd-fuzz-state".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create");
            File::from_raw_fd(fd)
        };
        let ro_sum = tree_checksum(&p.join("ro"));
        Mutex::new(State {
            scratch,
            specs,
            ro_sum,
            replies,
            reply_buf: vec![0u8; 64 * 1024],
        })
    })
}

/// The stack's options as the state records them (what a matching daemon runs with).
pub fn guest_view() -> GuestView {
    GuestView {
        cache: "none".into(),
        xattr: true,
        ..Default::default()
    }
}

/// A fresh stack on the scratch tree, as the daemon builds it.
pub fn build(root: &Path, specs: &[ShareSpec]) -> FsServer {
    build_recording(root, specs, None)
}

/// The same, recording the guest's session into `journal`, as a serving process
/// under a keeper does.
pub fn build_recording(
    root: &Path,
    specs: &[ShareSpec],
    journal: Option<&'static Journal>,
) -> FsServer {
    let stack = fs::build(
        root,
        Some(specs),
        false,
        PassthroughConfig {
            journal,
            ..PassthroughConfig::new(CacheMode::None, true)
        },
    )
    .expect("building the file system stack (needs root for open_tree)");
    FsServer::new(&stack)
}

/// Sends one request; returns the reply's errno (0 for success; None: no reply).
pub(crate) fn send(server: &FsServer, st: &mut State, mut req: Vec<u8>) -> Option<i32> {
    let fd = st.replies.as_raw_fd();
    {
        let writer = Writer::FuseDev(FuseDevWriter::<()>::new(fd, &mut st.reply_buf).ok()?);
        let _ = server.handle_local(&mut req, writer);
    }
    let mut header = [0u8; 16];
    // SAFETY: plain syscalls on our memfd.
    let n = unsafe {
        let n = libc::pread(fd, header.as_mut_ptr().cast(), 16, 0);
        libc::ftruncate(fd, 0);
        libc::lseek(fd, 0, libc::SEEK_SET);
        n
    };
    (n == 16).then(|| i32::from_le_bytes(header[4..8].try_into().unwrap()))
}

/// The seeds' states, saved once per process.
fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(seed_states)
}

/// `state` changed by the 10-byte mutations of `ops` (see the module's doc).
fn mutate(state: &mut format::SessionState, ops: &[u8]) {
    const NAMES: [&str; 6] = ["rw", "ro", "hidden", "", "rw/d", "x"];
    for op in ops.chunks_exact(10) {
        let (kind, i) = (op[0], usize::from(op[1]));
        let v = u64::from_le_bytes(op[2..].try_into().unwrap());
        let nv = state.volumes.len();
        let (nn, nh) = (state.nodes.len(), state.handles.len());
        match kind % 13 {
            0 => state.next_node_id = v,
            1 => state.next_handle_id = v,
            2 if nv > 0 => state.volumes[i % nv].root = v,
            3 if nv > 0 => state.volumes[i % nv].read_only ^= true,
            4 if nv > 0 => state.volumes[i % nv].name = NAMES[v as usize % NAMES.len()].into(),
            5 if nv > 0 => state.volumes.swap(i % nv, v as usize % nv),
            6 if nv > 0 => {
                state.volumes.remove(i % nv);
            }
            7 if nv > 0 => {
                let v = state.volumes[i % nv].clone();
                state.volumes.push(v)
            }
            8 if nn > 0 => state.nodes[i % nn].id = v,
            9 if nn > 0 => state.nodes[i % nn].volume = v as u32,
            10 => state.virtual_dirs.push(format::VirtualDir {
                path: NAMES[i % NAMES.len()].into(),
                nodeid: v,
            }),
            11 if nh > 0 => state.handles[i % nh].id = v,
            12 if nn > 0 => state.nodes[i % nn].lookups = v,
            _ => {}
        }
    }
}

/// The node id of `name` in `parent` (None: the lookup failed).
pub(crate) fn lookup_id(server: &FsServer, st: &mut State, parent: u64, name: &str) -> Option<u64> {
    let mut b = name.as_bytes().to_vec();
    b.push(0);
    let mut req = request(op::LOOKUP as u32, 7, parent, 0, &b);
    let fd = st.replies.as_raw_fd();
    {
        let w = Writer::FuseDev(FuseDevWriter::<()>::new(fd, &mut st.reply_buf).ok()?);
        let _ = server.handle_local(&mut req, w);
    }
    let mut out = [0u8; 24];
    // SAFETY: plain syscalls on our memfd.
    let n = unsafe {
        let n = libc::pread(fd, out.as_mut_ptr().cast(), 24, 0);
        libc::ftruncate(fd, 0);
        libc::lseek(fd, 0, libc::SEEK_SET);
        n
    };
    let errno = i32::from_le_bytes(out[4..8].try_into().unwrap());
    (n == 24 && errno == 0).then(|| u64::from_le_bytes(out[16..24].try_into().unwrap()))
}

pub fn run_state(data: &[u8]) {
    let seeds = seeds();
    let mut guard = state().lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut *guard;
    let root = st.scratch.path().to_path_buf();
    let Some((&options, bytes)) = data.split_first() else {
        return;
    };
    let mutated;
    let bytes = if options & 4 != 0 {
        let Some((&pick, ops)) = bytes.split_first() else {
            return;
        };
        let mut seed =
            format::decode(&seeds[usize::from(pick) % seeds.len()]).expect("a seed decodes");
        mutate(&mut seed, ops);
        mutated = format::encode(&seed);
        &mutated[..]
    } else {
        bytes
    };
    let opts = LoadOptions {
        on_error: if options & 1 != 0 {
            OnError::GuestError
        } else {
            OnError::Abort
        },
        // Bit 1: as a serving process's successor after a crash loads it.
        after_crash: options & 2 != 0,
    };
    let server = build(&root, &st.specs);
    let baseline = open_fds();
    // The guest has a session already: a refused state must leave it as it is.
    let init = request(op::INIT as u32, 1, 0, 0, &init_body());
    assert_eq!(send(&server, st, init), Some(0), "the first INIT");
    let rw = lookup_id(&server, st, 1, "rw").expect("rw looked up");
    Watchdog::arm(MAX_TIME, "decoding and loading a device state");
    let decoded = format::decode(bytes);
    let loaded = decoded.as_ref().ok().map(|s| {
        server
            .load_session(s, &guest_view(), &opts, HandedFiles::default())
            .map(|_| ())
    });
    Watchdog::disarm();
    match (decoded, loaded) {
        (Ok(s), Some(Ok(()))) => {
            // Used as the guest would on: every node id and handle it names.
            let init = s.fuse.is_some();
            for (i, node) in s.nodes.iter().take(MAX_USES).enumerate() {
                let getattr = request(op::GETATTR as u32, i as u64, node.id, 0, &[0u8; 16]);
                let errno = send(&server, st, getattr);
                if !init {
                    // No INIT in the state: the session is not open yet.
                    assert_ne!(errno, Some(0), "a request served before any INIT");
                }
            }
            for (i, h) in s.handles.iter().take(MAX_USES).enumerate() {
                let mut read = Vec::new();
                read.extend_from_slice(&h.id.to_le_bytes());
                read.extend_from_slice(&0u64.to_le_bytes());
                read.extend_from_slice(&64u32.to_le_bytes());
                read.extend_from_slice(&[0u8; 20]);
                let _ = send(
                    &server,
                    st,
                    request(op::READ as u32, 100 + i as u64, h.node, 0, &read),
                );
            }
        }
        (_, Some(Err(_))) | (Err(_), None) => {
            // Refused: the session before it serves on.
            let errno = send(
                &server,
                st,
                request(op::GETATTR as u32, 1, rw, 0, &[0u8; 16]),
            );
            assert_eq!(errno, Some(0), "rw's node {rw} after a refused state");
            // The daemon serves a guest that starts anew.
            let init = request(op::INIT as u32, 2, 0, 0, &init_body());
            assert_eq!(
                send(&server, st, init),
                Some(0),
                "INIT after a refused state"
            );
        }
        _ => {}
    }
    check_fds(&baseline, &root);
    check_no_fd_into(&root.join("hidden"));
    drop(server);
    assert_eq!(
        tree_checksum(&root.join("ro")),
        st.ro_sum,
        "the ro volume changed"
    );
    // What a load created in rw stays for the next input: rw is the guest's.
}

/// No fd of the process refers to an inode under `dir`.
pub fn check_no_fd_into(dir: &Path) {
    let inodes = tree_inodes(dir);
    for (fd, target) in open_fds() {
        let Ok(st) = std::fs::metadata(format!("/proc/self/fd/{fd}")) else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        assert!(
            !inodes.contains(&(st.dev(), st.ino())),
            "fd {fd} ({target}) reaches {} that no volume names",
            dir.display()
        );
    }
}

/// Seeds: states a real stack saved after a session of lookups, opens and locks on
/// the scratch tree (see `make_seeds`).
pub fn seed_states() -> Vec<Vec<u8>> {
    let mut guard = state().lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut *guard;
    let root = st.scratch.path().to_path_buf();
    let server = build(&root, &st.specs);
    assert_eq!(
        send(&server, st, request(op::INIT as u32, 0, 0, 0, &init_body())),
        Some(0)
    );
    let lookup = |server: &FsServer, st: &mut State, parent: u64, name: &str| -> u64 {
        let mut b = name.as_bytes().to_vec();
        b.push(0);
        let mut req = request(op::LOOKUP as u32, 7, parent, 0, &b);
        let fd = st.replies.as_raw_fd();
        {
            let w = Writer::FuseDev(FuseDevWriter::<()>::new(fd, &mut st.reply_buf).unwrap());
            let _ = server.handle_local(&mut req, w);
        }
        let mut out = [0u8; 24];
        // SAFETY: plain syscalls on our memfd.
        unsafe {
            libc::pread(fd, out.as_mut_ptr().cast(), 24, 0);
            libc::ftruncate(fd, 0);
            libc::lseek(fd, 0, libc::SEEK_SET);
        }
        u64::from_le_bytes(out[16..24].try_into().unwrap())
    };
    let mut seeds = Vec::new();
    let save = |server: &FsServer| {
        let (s, _) = server.save_session(guest_view(), &Default::default());
        format::encode(&s)
    };
    seeds.push(save(&server));
    let rw = lookup(&server, st, 1, "rw");
    let d = lookup(&server, st, rw, "d");
    let _e = lookup(&server, st, d, "e");
    let f = lookup(&server, st, rw, "f");
    let ro = lookup(&server, st, 1, "ro");
    let _rof = lookup(&server, st, ro, "f");
    let mut open = Vec::new();
    open.extend_from_slice(&(libc::O_RDWR as u32).to_le_bytes());
    open.extend_from_slice(&0u32.to_le_bytes());
    let _ = send(&server, st, request(op::OPEN as u32, 8, f, 0, &open));
    seeds.push(save(&server));
    // With a lock on f (handle 1, owner 9, the whole file).
    let mut lk = Vec::new();
    lk.extend_from_slice(&1u64.to_le_bytes()); // fh
    lk.extend_from_slice(&9u64.to_le_bytes()); // owner
    lk.extend_from_slice(&0u64.to_le_bytes()); // start
    lk.extend_from_slice(&(i64::MAX as u64).to_le_bytes()); // end
    lk.extend_from_slice(&(libc::F_WRLCK as u32).to_le_bytes());
    lk.extend_from_slice(&1u32.to_le_bytes()); // pid
    lk.extend_from_slice(&[0u8; 8]); // lk_flags, padding
    let _ = send(&server, st, request(op::SETLK as u32, 9, f, 0, &lk));
    seeds.push(save(&server));
    let _ = d;
    seeds
}
