//! The two records of the guest's session agree: after any sequence of guest
//! requests, the journal's rebuild (`FsServer::rebuild_journal`, what a serving
//! process started after a crash loads) and a snapshot of the same daemon
//! (`FsServer::save_session`, what a migration writes) say the same about what
//! the guest holds.
//!
//! Each run builds a stack as the daemon does under a keeper (a journal in half A
//! of a session region), on a fresh tree in the temp directory, in one of two
//! layouts: the whole SharedDir, or `--allowed-dir` volumes (`top/a` read-write
//! with a volume id, `top/b` read-only, `c` read-write: a virtual directory `top`
//! above two of them). It serves a random sequence of FUSE requests, sent as raw
//! bytes through `FsServer::handle_local` as a guest's would come, and compares the
//! two records at a few random points and at the end. The sequence comes from a
//! seeded xorshift generator: a failure prints the seed, the requests it sent (with
//! their answers) and the difference; `VOLFSD_AGREEMENT_SEED=<seed>` runs that one
//! seed again.
//!
//! The guest behaves as a Linux guest kernel does where the journal depends on it
//! (see [`Model`]): it forgets a node only once no dentry it holds lies in it and
//! no file of it is open (a dentry pins its parent; an open file its dentry), and
//! an unlinked dentry stays (pinning its parent) as long as its node is held.
//! Everything else is random: names that exist and names that do not, requests on
//! read-only volumes, on detached volumes, on handles of other nodes, before INIT.
//!
//! What is compared (after sorting everything by id: the two list in different
//! orders): see [`Agreed`] and [`compare`].
//!
//! Needs root: each volume is a private mount (`open_tree`), as in the daemon.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use fuse_backend_rs::transport::{FuseDevWriter, Writer};

use super::rebuild::Rebuilt;
use super::Journal;
use crate::fs::{build, CacheMode, FsServer, PassthroughConfig, ShareSpec, Stack};
use crate::region::{Half, Region};
use crate::state::format::{self, GuestView, Location, SessionState};
use crate::state::SaveOptions;

/// Sequences per run, and requests per sequence.
const RUNS: u64 = 200;
const OPS: usize = 60;

/// Names the guest asks for: the trees below are made of them, so that a name
/// exists about as often as not.
const NAMES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "top"];
/// The FUSE lock owners the guest's processes are.
const OWNERS: [u64; 3] = [0x100, 0x101, 0x102];

/// FUSE opcodes the test sends.
mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const RELEASE: u32 = 18;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const RELEASEDIR: u32 = 29;
    pub const SETLK: u32 = 32;
    pub const CREATE: u32 = 35;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const RENAME2: u32 = 45;
}

/// xorshift64*: a few lines, no crate, the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Never zero (xorshift's fixed point), and seeds 1, 2, 3 far apart.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len())])
    }
}

#[derive(Clone, Copy, Debug, Eq, PartialEq)]
enum Layout {
    /// No `--allowed-dir`: the whole SharedDir is the mount root.
    Whole,
    /// `--allowed-dir top/a --allowed-dir top/b:ro --allowed-dir c`.
    Volumes,
}

/// One guest request (or a control-socket action), with the ids the guest named.
#[derive(Clone, Debug)]
enum Op {
    Init,
    Destroy,
    Lookup { dir: u64, name: &'static str },
    Getattr { node: u64 },
    Mkdir { dir: u64, name: &'static str },
    Mknod { dir: u64, name: &'static str },
    Symlink { dir: u64, name: &'static str },
    Create { dir: u64, name: &'static str, flags: i32 },
    Open { node: u64, flags: i32 },
    Opendir { node: u64 },
    Release { node: u64, fh: u64, dir: bool },
    Flush { node: u64, fh: u64, owner: u64 },
    Forget { node: u64, count: u64 },
    BatchForget { forgets: Vec<(u64, u64)> },
    Unlink { dir: u64, name: &'static str },
    Rmdir { dir: u64, name: &'static str },
    Rename {
        olddir: u64,
        oldname: &'static str,
        newdir: u64,
        newname: &'static str,
        exchange: bool,
    },
    Link { node: u64, dir: u64, name: &'static str },
    /// SETLK of a POSIX lock (F_RDLCK, F_WRLCK, F_UNLCK) on `start..=end`.
    Posix {
        node: u64,
        fh: u64,
        owner: u64,
        start: u64,
        end: u64,
        kind: i32,
    },
    /// SETLK with FUSE_LK_FLOCK.
    Flock { node: u64, fh: u64, kind: i32 },
    /// `DELETE /volumes/NAME` on the control socket.
    Detach { volume: usize },
    /// `PUT /volumes/NAME` again, with the volume's spec.
    Attach { volume: usize },
}

/// What a request got: the errno (0: success; None: no reply, as for FORGET), the
/// node id and file type of an entry, and the handle of an open.
#[derive(Clone, Copy, Debug, Default)]
struct Answer {
    errno: Option<i32>,
    node: Option<(u64, u32)>,
    fh: Option<u64>,
}

impl Answer {
    fn ok(&self) -> bool {
        self.errno == Some(0)
    }
}

/// A dentry the guest kernel holds: a name in a directory node. Unlinked ones stay
/// while their node is held (an open file's, or a cwd's), pinning their parent.
#[derive(Clone, Debug)]
struct Dentry {
    parent: u64,
    name: &'static str,
    linked: bool,
}

#[derive(Clone, Debug)]
struct HeldNode {
    file_type: u32,
    lookups: u64,
    dentries: Vec<Dentry>,
}

/// What the guest kernel holds, as far as the requests it may send depend on it.
#[derive(Default)]
struct Model {
    nodes: BTreeMap<u64, HeldNode>,
    /// (fh, node, directory).
    handles: Vec<(u64, u64, bool)>,
    initialized: bool,
}

impl Model {
    fn fresh() -> Model {
        let mut m = Model::default();
        m.nodes.insert(
            crate::fs::registry::ROOT_ID,
            HeldNode {
                file_type: libc::S_IFDIR,
                lookups: u64::MAX / 2, // the kernel never forgets the root
                dentries: Vec::new(),
            },
        );
        m
    }

    fn dirs(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.file_type == libc::S_IFDIR)
            .map(|(&id, _)| id)
            .collect()
    }

    fn non_dirs(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.file_type != libc::S_IFDIR)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether the kernel could let `id` go: no dentry it holds lies in it, no file
    /// of it is open.
    fn may_evict(&self, id: u64) -> bool {
        id != crate::fs::registry::ROOT_ID
            && !self.handles.iter().any(|h| h.1 == id)
            && !self
                .nodes
                .iter()
                .any(|(&o, n)| o != id && n.dentries.iter().any(|d| d.parent == id))
    }

    /// The node whose linked dentry is `name` in `dir`.
    fn at(&self, dir: u64, name: &str) -> Option<u64> {
        self.nodes
            .iter()
            .find(|(_, n)| {
                n.dentries
                    .iter()
                    .any(|d| d.linked && d.parent == dir && d.name == name)
            })
            .map(|(&id, _)| id)
    }

    fn unlink(&mut self, dir: u64, name: &str) {
        if let Some(id) = self.at(dir, name) {
            for d in &mut self.nodes.get_mut(&id).unwrap().dentries {
                if d.parent == dir && d.name == name {
                    d.linked = false;
                }
            }
        }
    }

    fn entry(&mut self, dir: u64, name: &'static str, node: u64, file_type: u32) {
        if self.at(dir, name).is_some_and(|o| o != node) {
            self.unlink(dir, name);
        }
        let n = self.nodes.entry(node).or_insert(HeldNode {
            file_type,
            lookups: 0,
            dentries: Vec::new(),
        });
        n.lookups = n.lookups.saturating_add(1);
        if !n
            .dentries
            .iter()
            .any(|d| d.linked && d.parent == dir && d.name == name)
        {
            n.dentries.push(Dentry {
                parent: dir,
                name,
                linked: true,
            });
        }
    }

    fn forget(&mut self, node: u64, count: u64) {
        if let Some(n) = self.nodes.get_mut(&node) {
            n.lookups -= count.min(n.lookups);
            if n.lookups == 0 {
                self.nodes.remove(&node);
            }
        }
    }

    fn moved(&mut self, from: (u64, &str), to: (u64, &'static str)) -> Option<u64> {
        let id = self.at(from.0, from.1)?;
        for d in &mut self.nodes.get_mut(&id).unwrap().dentries {
            if d.linked && d.parent == from.0 && d.name == from.1 {
                (d.parent, d.name) = to;
            }
        }
        Some(id)
    }

    /// What the kernel does with its dentries when a request succeeds.
    fn apply(&mut self, op: &Op, a: &Answer) {
        if !a.ok() && !matches!(op, Op::Forget { .. } | Op::BatchForget { .. }) {
            return;
        }
        match *op {
            Op::Init => {
                *self = Model::fresh();
                self.initialized = true;
            }
            Op::Destroy => *self = Model::fresh(),
            Op::Lookup { dir, name }
            | Op::Mkdir { dir, name }
            | Op::Mknod { dir, name }
            | Op::Symlink { dir, name }
            | Op::Create { dir, name, .. }
            | Op::Link { dir, name, .. } => {
                let (node, file_type) = a.node.expect("an entry");
                self.entry(dir, name, node, file_type);
                if let (Op::Create { .. }, Some(fh)) = (op, a.fh) {
                    self.handles.push((fh, node, false));
                }
            }
            Op::Open { node, .. } | Op::Opendir { node } => {
                if let Some(fh) = a.fh.filter(|&fh| fh != 0) {
                    self.handles
                        .push((fh, node, matches!(op, Op::Opendir { .. })));
                }
            }
            Op::Release { fh, .. } => self.handles.retain(|h| h.0 != fh),
            Op::Forget { node, count } => self.forget(node, count),
            Op::BatchForget { ref forgets } => {
                for &(node, count) in forgets {
                    self.forget(node, count);
                }
            }
            Op::Unlink { dir, name } | Op::Rmdir { dir, name } => self.unlink(dir, name),
            Op::Rename {
                olddir,
                oldname,
                newdir,
                newname,
                exchange,
            } => {
                if (olddir, oldname) == (newdir, newname) {
                    return;
                }
                if exchange {
                    // Both names stay; their nodes trade places.
                    let a = self.at(olddir, oldname);
                    let b = self.at(newdir, newname);
                    for (id, from, to) in [
                        (a, (olddir, oldname), (newdir, newname)),
                        (b, (newdir, newname), (olddir, oldname)),
                    ] {
                        if let Some(id) = id {
                            for d in &mut self.nodes.get_mut(&id).unwrap().dentries {
                                if d.linked && (d.parent, d.name) == from {
                                    (d.parent, d.name) = to;
                                    break;
                                }
                            }
                        }
                    }
                } else {
                    let moving = self.at(olddir, oldname);
                    if self.at(newdir, newname).is_some() && moving != self.at(newdir, newname) {
                        self.unlink(newdir, newname);
                    }
                    self.moved((olddir, oldname), (newdir, newname));
                }
            }
            _ => {}
        }
    }
}

/// The volumes of the `Volumes` layout: `--allowed-dir` arguments.
const VOLUME_ARGS: [&str; 3] = ["top/a", "top/b:ro", "c"];

/// A fresh directory tree for one run, removed when dropped.
struct Tree {
    root: PathBuf,
}

impl Tree {
    fn new(layout: Layout) -> Tree {
        static N: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "volfsd-agreement-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        let volumes: &[&str] = match layout {
            Layout::Whole => &[""],
            Layout::Volumes => &["top/a", "top/b", "c"],
        };
        for v in volumes {
            let d = root.join(v);
            std::fs::create_dir_all(d.join("a/b")).unwrap();
            std::fs::write(d.join("a/c"), b"c\n").unwrap();
            std::fs::write(d.join("a/b/f"), b"f\n").unwrap();
            std::fs::write(d.join("e"), b"e\n").unwrap();
            std::os::unix::fs::symlink("e", d.join("d")).unwrap();
        }
        Tree { root }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A daemon recording into a journal, and the guest's side of it.
struct Session {
    layout: Layout,
    view: GuestView,
    specs: Vec<ShareSpec>,
    attached: Vec<bool>,
    region: &'static Region,
    // Dropped before the tree: fields drop in order.
    server: FsServer,
    stack: Stack,
    tree: Tree,
    replies: File,
    reply_buf: Vec<u8>,
    unique: u64,
    model: Model,
    /// Every request sent, with its answer: what a failure prints.
    log: Vec<String>,
    /// What the run exercised (see [`Coverage`]).
    coverage: Coverage,
}

/// What the runs exercised, summed: each kind of request that succeeded, and what
/// the compared records held. The test asserts each is reached, so that a change
/// that makes the requests fail (or the records empty) does not pass unnoticed.
#[derive(Debug, Default)]
struct Coverage {
    succeeded: BTreeMap<&'static str, u64>,
    checks: u64,
    nodes: u64,
    nested_nodes: u64,
    handles: u64,
    posix_locks: u64,
    flocks: u64,
    virtual_dirs: u64,
}

impl Coverage {
    fn add(&mut self, other: &Coverage) {
        for (k, v) in &other.succeeded {
            *self.succeeded.entry(k).or_default() += v;
        }
        self.checks += other.checks;
        self.nodes += other.nodes;
        self.nested_nodes += other.nested_nodes;
        self.handles += other.handles;
        self.posix_locks += other.posix_locks;
        self.flocks += other.flocks;
        self.virtual_dirs += other.virtual_dirs;
    }
}

impl Session {
    /// A stack on a fresh tree, recording into half A of `region` (cleared first).
    fn new(layout: Layout, region: &'static Region) -> Session {
        let tree = Tree::new(layout);
        region.clear_half(Half::A).expect("clearing the journal half");
        let journal: &'static Journal = Box::leak(Box::new(Journal::new(region, Half::A)));
        let mut specs = match layout {
            Layout::Whole => Vec::new(),
            Layout::Volumes => crate::config::parse_allowed_dirs(
                &tree.root,
                &VOLUME_ARGS.map(String::from),
            )
            .expect("the volumes' --allowed-dir"),
        };
        if let Some(s) = specs.first_mut() {
            s.volume_id = Some("vol-a".into());
        }
        let stack = build(
            &tree.root,
            (layout == Layout::Volumes).then_some(&specs[..]),
            false,
            PassthroughConfig {
                journal: Some(journal),
                ..PassthroughConfig::new(CacheMode::None, true)
            },
        )
        .expect("building the stack (the volumes' private mounts need root)");
        let server = FsServer::new(&stack);
        // SAFETY: memfd_create with a valid name; the fd is owned by the File.
        let replies = unsafe {
            let fd = libc::memfd_create(c"volfsd-agreement".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create");
            File::from_raw_fd(fd)
        };
        Session {
            layout,
            view: GuestView {
                cache: "none".into(),
                xattr: true,
                whole_share: layout == Layout::Whole,
                ..Default::default()
            },
            attached: vec![true; specs.len()],
            specs,
            region,
            server,
            stack,
            tree,
            replies,
            reply_buf: vec![0u8; 64 * 1024],
            unique: 0,
            model: Model::fresh(),
            log: Vec::new(),
            coverage: Coverage::default(),
        }
    }

    /// Sends one request (header + `body`); returns the reply's bytes (empty: none).
    fn send(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Vec<u8> {
        self.unique += 1;
        let mut req = Vec::with_capacity(40 + body.len());
        req.extend_from_slice(&((40 + body.len()) as u32).to_le_bytes());
        req.extend_from_slice(&opcode.to_le_bytes());
        req.extend_from_slice(&self.unique.to_le_bytes());
        req.extend_from_slice(&nodeid.to_le_bytes());
        req.extend_from_slice(&0u32.to_le_bytes()); // uid
        req.extend_from_slice(&0u32.to_le_bytes()); // gid
        req.extend_from_slice(&4242u32.to_le_bytes()); // pid
        req.extend_from_slice(&[0u8; 4]); // total_extlen, padding
        req.extend_from_slice(body);
        let fd = self.replies.as_raw_fd();
        {
            let writer = FuseDevWriter::<()>::new(fd, &mut self.reply_buf).expect("a writer");
            let _ = self.server.handle_local(&mut req, Writer::FuseDev(writer));
        }
        // SAFETY: plain system calls on our memfd, into a buffer of the size read.
        unsafe {
            let len = libc::lseek(fd, 0, libc::SEEK_CUR).max(0) as usize;
            let mut out = vec![0u8; len];
            let n = libc::pread(fd, out.as_mut_ptr().cast(), len, 0);
            out.truncate(n.max(0) as usize);
            libc::ftruncate(fd, 0);
            libc::lseek(fd, 0, libc::SEEK_SET);
            out
        }
    }

    /// Serves `op`, updates the guest's model, logs both; returns the answer.
    fn apply(&mut self, op: &Op) -> Answer {
        let answer = self.serve(op);
        self.model.apply(op, &answer);
        if matches!(op, Op::Init) && answer.ok() {
            self.model.initialized = true;
        }
        if matches!(op, Op::Destroy) {
            self.model.initialized = false;
        }
        if answer.ok() || (answer.errno.is_none() && !matches!(op, Op::Init)) {
            *self.coverage.succeeded.entry(op_name(op)).or_default() += 1;
        }
        let mut line = format!("{op:?}");
        match answer.errno {
            Some(0) => {
                if let Some((id, t)) = answer.node {
                    let _ = write!(line, " -> node {id} ({})", type_name(t));
                }
                if let Some(fh) = answer.fh {
                    let _ = write!(line, " fh {fh}");
                }
                if answer.node.is_none() && answer.fh.is_none() {
                    line.push_str(" -> ok");
                }
            }
            Some(e) => {
                let _ = write!(line, " -> {}", std::io::Error::from_raw_os_error(e));
            }
            None => {}
        }
        self.log.push(line);
        answer
    }

    fn serve(&mut self, op: &Op) -> Answer {
        let name0 = |n: &str| {
            let mut b = n.as_bytes().to_vec();
            b.push(0);
            b
        };
        let u32s = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (opcode, nodeid, body) = match *op {
            Op::Init => (op::INIT, 0, init_body()),
            Op::Destroy => (op::DESTROY, 0, Vec::new()),
            Op::Lookup { dir, name } => (op::LOOKUP, dir, name0(name)),
            Op::Getattr { node } => (op::GETATTR, node, vec![0u8; 16]),
            Op::Mkdir { dir, name } => {
                let mut b = u32s(&[0o755, 0o022]);
                b.extend(name0(name));
                (op::MKDIR, dir, b)
            }
            Op::Mknod { dir, name } => {
                let mut b = u32s(&[libc::S_IFIFO | 0o644, 0, 0o022, 0]);
                b.extend(name0(name));
                (op::MKNOD, dir, b)
            }
            Op::Symlink { dir, name } => {
                let mut b = name0(name);
                b.extend(name0("e"));
                (op::SYMLINK, dir, b)
            }
            Op::Create { dir, name, flags } => {
                let mut b = u32s(&[flags as u32, libc::S_IFREG | 0o644, 0o022, 0]);
                b.extend(name0(name));
                (op::CREATE, dir, b)
            }
            Op::Open { node, flags } => (op::OPEN, node, u32s(&[flags as u32, 0])),
            Op::Opendir { node } => (op::OPENDIR, node, u32s(&[libc::O_RDONLY as u32, 0])),
            Op::Release { node, fh, dir } => {
                let mut b = fh.to_le_bytes().to_vec();
                b.extend(u32s(&[0, 0]));
                b.extend(0u64.to_le_bytes());
                (if dir { op::RELEASEDIR } else { op::RELEASE }, node, b)
            }
            Op::Flush { node, fh, owner } => {
                let mut b = fh.to_le_bytes().to_vec();
                b.extend(u32s(&[0, 0]));
                b.extend(owner.to_le_bytes());
                (op::FLUSH, node, b)
            }
            Op::Forget { node, count } => (op::FORGET, node, count.to_le_bytes().to_vec()),
            Op::BatchForget { ref forgets } => {
                let mut b = u32s(&[forgets.len() as u32, 0]);
                for &(node, count) in forgets {
                    b.extend(node.to_le_bytes());
                    b.extend(count.to_le_bytes());
                }
                (op::BATCH_FORGET, 0, b)
            }
            Op::Unlink { dir, name } => (op::UNLINK, dir, name0(name)),
            Op::Rmdir { dir, name } => (op::RMDIR, dir, name0(name)),
            Op::Rename {
                olddir,
                oldname,
                newdir,
                newname,
                exchange,
            } => {
                let mut b = newdir.to_le_bytes().to_vec();
                if exchange {
                    b.extend(u32s(&[libc::RENAME_EXCHANGE, 0]));
                }
                b.extend(name0(oldname));
                b.extend(name0(newname));
                (
                    if exchange { op::RENAME2 } else { op::RENAME },
                    olddir,
                    b,
                )
            }
            Op::Link { node, dir, name } => {
                let mut b = node.to_le_bytes().to_vec();
                b.extend(name0(name));
                (op::LINK, dir, b)
            }
            Op::Posix {
                node,
                fh,
                owner,
                start,
                end,
                kind,
            } => (op::SETLK, node, lk_body(fh, owner, start, end, kind, 0)),
            Op::Flock { node, fh, kind } => (
                op::SETLK,
                node,
                lk_body(fh, 0, 0, i64::MAX as u64, kind, super::super::locks::FUSE_LK_FLOCK),
            ),
            Op::Detach { volume } => {
                let name = self.specs[volume].guest.join("/");
                let done = self.stack.volumes.detach(&name).is_some();
                self.attached[volume] &= !done;
                return Answer {
                    errno: Some(if done { 0 } else { libc::ENOENT }),
                    ..Default::default()
                };
            }
            Op::Attach { volume } => {
                let done = self.stack.volumes.attach(&self.specs[volume]).is_ok();
                self.attached[volume] |= done;
                return Answer {
                    errno: Some(if done { 0 } else { libc::EEXIST }),
                    ..Default::default()
                };
            }
        };
        let reply = self.send(opcode, nodeid, &body);
        let mut a = Answer::default();
        if reply.len() < 16 {
            return a;
        }
        let errno = -i32::from_le_bytes(reply[4..8].try_into().unwrap());
        a.errno = Some(errno);
        if errno != 0 {
            return a;
        }
        let u64_at = |at: usize| u64::from_le_bytes(reply[at..at + 8].try_into().unwrap());
        let entry = matches!(
            op,
            Op::Lookup { .. }
                | Op::Mkdir { .. }
                | Op::Mknod { .. }
                | Op::Symlink { .. }
                | Op::Create { .. }
                | Op::Link { .. }
        );
        if entry && reply.len() >= 16 + 128 {
            // fuse_entry_out: nodeid, then the attributes from byte 40 (mode at 60).
            let mode = u32::from_le_bytes(reply[116..120].try_into().unwrap());
            a.node = Some((u64_at(16), mode & libc::S_IFMT));
        }
        match op {
            Op::Create { .. } if reply.len() >= 16 + 128 + 8 => a.fh = Some(u64_at(144)),
            Op::Open { .. } | Op::Opendir { .. } if reply.len() >= 24 => a.fh = Some(u64_at(16)),
            _ => {}
        }
        a
    }

    /// A random request the guest could send now (see the module's doc).
    fn random_op(&self, rng: &mut Rng) -> Op {
        let m = &self.model;
        if !m.initialized && !rng.one_in(4) {
            return Op::Init;
        }
        let name = |rng: &mut Rng| NAMES[rng.below(NAMES.len())];
        let dirs = m.dirs();
        let dir = rng.pick(&dirs).unwrap_or(crate::fs::registry::ROOT_ID);
        let any: Vec<u64> = m.nodes.keys().copied().collect();
        let node = rng.pick(&any).unwrap_or(crate::fs::registry::ROOT_ID);
        let handle = rng.pick(&m.handles);
        let forget = |rng: &mut Rng, node: u64| -> u64 {
            let held = m.nodes.get(&node).map_or(0, |n| n.lookups);
            let count = 1 + rng.next() % held.clamp(1, 3);
            if count >= held && !m.may_evict(node) {
                held.saturating_sub(1)
            } else {
                count
            }
        };
        loop {
            let op = match rng.below(100) {
                0..=21 => Op::Lookup {
                    dir,
                    name: name(rng),
                },
                22..=24 => Op::Getattr { node },
                25..=29 => Op::Mkdir {
                    dir,
                    name: name(rng),
                },
                30..=31 => Op::Mknod {
                    dir,
                    name: name(rng),
                },
                32..=33 => Op::Symlink {
                    dir,
                    name: name(rng),
                },
                34..=39 => Op::Create {
                    dir,
                    name: name(rng),
                    flags: [libc::O_RDWR, libc::O_WRONLY, libc::O_RDONLY, libc::O_RDWR | libc::O_EXCL]
                        [rng.below(4)],
                },
                40..=46 => Op::Open {
                    node: rng.pick(&m.non_dirs()).unwrap_or(node),
                    flags: [libc::O_RDWR, libc::O_RDONLY, libc::O_WRONLY | libc::O_APPEND]
                        [rng.below(3)],
                },
                47..=50 => Op::Opendir { node: dir },
                51..=55 => match handle {
                    Some((fh, node, dir)) => Op::Release { node, fh, dir },
                    None => continue,
                },
                56..=57 => match handle {
                    Some((fh, node, _)) => Op::Flush {
                        node,
                        fh,
                        owner: OWNERS[rng.below(OWNERS.len())],
                    },
                    None => continue,
                },
                58..=64 => {
                    if node == crate::fs::registry::ROOT_ID {
                        continue;
                    }
                    match forget(rng, node) {
                        0 => continue,
                        count => Op::Forget { node, count },
                    }
                }
                65..=67 => {
                    // Up to three nodes, each forgotten as the kernel could.
                    let mut forgets = Vec::new();
                    let mut held: BTreeMap<u64, u64> = BTreeMap::new();
                    for _ in 0..1 + rng.below(3) {
                        let Some(n) = rng.pick(&any) else { break };
                        if n == crate::fs::registry::ROOT_ID || held.contains_key(&n) {
                            continue;
                        }
                        let c = forget(rng, n);
                        if c > 0 {
                            held.insert(n, c);
                            forgets.push((n, c));
                        }
                    }
                    if forgets.is_empty() {
                        continue;
                    }
                    Op::BatchForget { forgets }
                }
                68..=70 => Op::Unlink {
                    dir,
                    name: name(rng),
                },
                71..=72 => Op::Rmdir {
                    dir,
                    name: name(rng),
                },
                73..=78 => Op::Rename {
                    olddir: dir,
                    oldname: name(rng),
                    newdir: rng.pick(&dirs).unwrap_or(dir),
                    newname: name(rng),
                    exchange: rng.one_in(5),
                },
                79..=81 => Op::Link {
                    node: rng.pick(&m.non_dirs()).unwrap_or(node),
                    dir,
                    name: name(rng),
                },
                82..=89 => match handle {
                    Some((fh, node, _)) => {
                        let start = [0u64, 10, 20, 100][rng.below(4)];
                        let end = match rng.below(3) {
                            0 => start,
                            1 => start + 9,
                            _ => i64::MAX as u64,
                        };
                        Op::Posix {
                            node,
                            fh,
                            owner: OWNERS[rng.below(OWNERS.len())],
                            start,
                            end,
                            kind: [libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK][rng.below(3)],
                        }
                    }
                    None => continue,
                },
                90..=93 => match handle {
                    Some((fh, node, _)) => Op::Flock {
                        node,
                        fh,
                        kind: [libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK][rng.below(3)],
                    },
                    None => continue,
                },
                94..=96 if self.layout == Layout::Volumes => {
                    // A detached volume comes back more often than not.
                    let detached: Vec<usize> =
                        (0..self.specs.len()).filter(|&v| !self.attached[v]).collect();
                    match rng.pick(&detached) {
                        Some(volume) if !rng.one_in(3) => Op::Attach { volume },
                        _ => Op::Detach {
                            volume: rng.below(self.specs.len()),
                        },
                    }
                }
                // A new session ends what the guest held: rare, so that the rest
                // has something to act on.
                97 if rng.one_in(3) => Op::Destroy,
                98 if rng.one_in(3) => Op::Init,
                _ => continue,
            };
            return op;
        }
    }

    /// The two records now: (snapshot, journal's rebuild).
    fn records(&self) -> (SessionState, Rebuilt) {
        let opts = SaveOptions {
            // A path written is one that leads to the node now: what the location
            // check below compares the journal's with.
            confirm_paths: true,
            ..Default::default()
        };
        let (saved, _files) = self.server.save_session(self.view.clone(), &opts);
        let rebuilt = self
            .server
            .rebuild_journal(self.region.half(Half::A), &self.view);
        (saved, rebuilt)
    }

    /// Compares the two records; on a difference, panics with `what` (the seed), the
    /// requests sent, and the difference.
    fn check(&mut self, what: &str) {
        let (saved, rebuilt) = self.records();
        let c = &mut self.coverage;
        c.checks += 1;
        c.nodes += saved.nodes.len() as u64;
        c.nested_nodes += saved
            .nodes
            .iter()
            .filter(|n| {
                matches!(&n.location, Location::Child { parent, .. }
                    if saved.nodes.iter().any(|p| p.id == *parent && p.location != Location::Root))
            })
            .count() as u64;
        c.handles += saved.handles.len() as u64;
        for l in &saved.locks {
            match l {
                format::Lock::Posix { .. } => c.posix_locks += 1,
                format::Lock::Flock { .. } => c.flocks += 1,
            }
        }
        c.virtual_dirs += saved.virtual_dirs.len() as u64;
        if let Err(diff) = compare(&saved, &rebuilt.state, &self.volume_dirs()) {
            panic!(
                "the journal and the snapshot disagree ({what}, layout {:?}, after {} \
                 requests)\n\nrequests:\n  {}\n\ndifference (snapshot vs journal):\n{diff}\n\
                 snapshot: {saved:#?}\njournal: {:#?}",
                self.layout,
                self.log.len(),
                self.log.join("\n  "),
                rebuilt.state,
            );
        }
    }

    /// Each attached volume's directory on the host, by name.
    fn volume_dirs(&self) -> BTreeMap<String, PathBuf> {
        match self.layout {
            Layout::Whole => BTreeMap::from([(String::new(), self.tree.root.clone())]),
            Layout::Volumes => self
                .specs
                .iter()
                .map(|s| (s.guest.join("/"), s.path.host.clone()))
                .collect(),
        }
    }
}

/// The name of `op`'s kind, for [`Coverage`].
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Init => "INIT",
        Op::Destroy => "DESTROY",
        Op::Lookup { .. } => "LOOKUP",
        Op::Getattr { .. } => "GETATTR",
        Op::Mkdir { .. } => "MKDIR",
        Op::Mknod { .. } => "MKNOD",
        Op::Symlink { .. } => "SYMLINK",
        Op::Create { .. } => "CREATE",
        Op::Open { .. } => "OPEN",
        Op::Opendir { .. } => "OPENDIR",
        Op::Release { dir: false, .. } => "RELEASE",
        Op::Release { dir: true, .. } => "RELEASEDIR",
        Op::Flush { .. } => "FLUSH",
        Op::Forget { .. } => "FORGET",
        Op::BatchForget { .. } => "BATCH_FORGET",
        Op::Unlink { .. } => "UNLINK",
        Op::Rmdir { .. } => "RMDIR",
        Op::Rename {
            exchange: false, ..
        } => "RENAME",
        Op::Rename { exchange: true, .. } => "RENAME2 (exchange)",
        Op::Link { .. } => "LINK",
        Op::Posix {
            kind: libc::F_UNLCK,
            ..
        } => "SETLK (POSIX unlock)",
        Op::Posix { .. } => "SETLK (POSIX lock)",
        Op::Flock {
            kind: libc::F_UNLCK,
            ..
        } => "SETLK (flock unlock)",
        Op::Flock { .. } => "SETLK (flock)",
        Op::Detach { .. } => "detach",
        Op::Attach { .. } => "attach",
    }
}

fn type_name(t: u32) -> &'static str {
    match t {
        libc::S_IFDIR => "dir",
        libc::S_IFREG => "file",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        _ => "other",
    }
}

/// The INIT a Linux guest sends (FUSE 7.38, every flag offered).
fn init_body() -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&7u32.to_le_bytes());
    b.extend_from_slice(&38u32.to_le_bytes());
    b.extend_from_slice(&(128u32 * 1024).to_le_bytes());
    b.extend_from_slice(&0xffff_ffffu32.to_le_bytes());
    b.extend_from_slice(&0x0000_03ffu32.to_le_bytes());
    b.extend_from_slice(&[0u8; 44]);
    b
}

/// A `fuse_lk_in`.
fn lk_body(fh: u64, owner: u64, start: u64, end: u64, kind: i32, lk_flags: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(48);
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&owner.to_le_bytes());
    b.extend_from_slice(&start.to_le_bytes());
    b.extend_from_slice(&end.to_le_bytes());
    b.extend_from_slice(&(kind as u32).to_le_bytes());
    b.extend_from_slice(&4242u32.to_le_bytes()); // pid
    b.extend_from_slice(&lk_flags.to_le_bytes());
    b.extend_from_slice(&[0u8; 4]);
    b
}

/// What both records must say the same about, keyed by id so that the order each
/// lists things in does not matter.
///
/// Not compared, and why:
/// - `written_by`, `config`: who wrote it, and the view each was handed (the same
///   one); `parked`, `handoff`: a migration's own (requests a stopped ring held,
///   the source's open files), never in a journal.
/// - a node's `location`, as such: the snapshot names where the node is now
///   (its path, through `/proc/self/fd`), the journal where it was found (its
///   parent and name, kept up to date across renames). Compared instead by where
///   each leads on the host: see [`compare`].
/// - a node's `file_handle`: the stack runs without file handles
///   (`--inode-file-handles=never`, the default), so neither has one.
/// - a volume root's lookups: a root is a fixed node, which FORGET never drops, so
///   its count changes nothing; the journal keeps none (a root's record is its id
///   and name) and says 1, the snapshot says how many lookups reached it.
/// - a directory handle's `dir_offset`: the journal does not record it (every
///   READDIR names its own offset, so a loaded handle serves on without it).
/// - the id counters are compared as bounds (below): the journal's must not be
///   lower than the snapshot's, or a successor would hand out an id again.
#[derive(Debug, Default, PartialEq)]
struct Agreed {
    fuse: Option<format::FuseSession>,
    /// Name -> (read-only, volume id, rate limit, root id).
    volumes: BTreeMap<String, (bool, Option<String>, Option<format::RateLimit>, u64)>,
    virtual_dirs: BTreeMap<String, u64>,
    nodes: BTreeMap<u64, NodeFacts>,
    /// Id -> (node, host open flags).
    handles: BTreeMap<u64, (u64, i32)>,
    /// (node, owner, access, start, end, kind).
    posix_locks: BTreeSet<(u64, u64, i32, u64, u64, i32)>,
    /// (handle, kind).
    flocks: BTreeSet<(u64, i32)>,
}

#[derive(Debug, PartialEq)]
struct NodeFacts {
    /// By name: the two may number the volumes differently.
    volume: String,
    file_type: u32,
    /// None for a volume root (see [`Agreed`]).
    lookups: Option<u64>,
}

fn agreed(s: &SessionState) -> Agreed {
    let volume_name = |i: u32| {
        s.volumes
            .get(i as usize)
            .map_or_else(|| format!("#{i} (no such volume)"), |v| v.name.clone())
    };
    let mut a = Agreed {
        fuse: s.fuse,
        ..Default::default()
    };
    for v in &s.volumes {
        a.volumes.insert(
            v.name.clone(),
            (v.read_only, v.volume_id.clone(), v.rate_limit, v.root),
        );
    }
    for d in &s.virtual_dirs {
        a.virtual_dirs.insert(d.path.clone(), d.nodeid);
    }
    for n in &s.nodes {
        let facts = NodeFacts {
            volume: volume_name(n.volume),
            file_type: n.file_type,
            lookups: (n.location != Location::Root).then_some(n.lookups),
        };
        assert!(
            a.nodes.insert(n.id, facts).is_none(),
            "node {} listed twice",
            n.id
        );
    }
    for h in &s.handles {
        assert!(
            a.handles.insert(h.id, (h.node, h.flags)).is_none(),
            "handle {} listed twice",
            h.id
        );
    }
    for l in &s.locks {
        match *l {
            format::Lock::Posix {
                node,
                owner,
                access,
                start,
                end,
                kind,
            } => {
                a.posix_locks
                    .insert((node, owner, access, start, end, kind));
            }
            format::Lock::Flock { handle, kind } => {
                a.flocks.insert((handle, kind));
            }
        }
    }
    a
}

/// The two maps' differences, one line each.
fn diff_maps<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    what: &str,
    saved: &BTreeMap<K, V>,
    journal: &BTreeMap<K, V>,
    out: &mut String,
) {
    for (k, v) in saved {
        match journal.get(k) {
            None => {
                let _ = writeln!(out, "  {what} {k:?}: only in the snapshot: {v:?}");
            }
            Some(j) if j != v => {
                let _ = writeln!(out, "  {what} {k:?}: snapshot {v:?}, journal {j:?}");
            }
            _ => {}
        }
    }
    for (k, v) in journal {
        if !saved.contains_key(k) {
            let _ = writeln!(out, "  {what} {k:?}: only in the journal: {v:?}");
        }
    }
}

fn diff_sets<T: Ord + std::fmt::Debug>(
    what: &str,
    saved: &BTreeSet<T>,
    journal: &BTreeSet<T>,
    out: &mut String,
) {
    for x in saved.difference(journal) {
        let _ = writeln!(out, "  {what} {x:?}: only in the snapshot");
    }
    for x in journal.difference(saved) {
        let _ = writeln!(out, "  {what} {x:?}: only in the journal");
    }
}

/// Where node `id`'s location in `s` leads on the host: its volume's directory
/// (from `dirs`, by name), then the names up its chain of parents (or its path).
/// None: no location (unknown, or a parent the state does not hold).
fn host_path(s: &SessionState, id: u64, dirs: &BTreeMap<String, PathBuf>) -> Option<PathBuf> {
    let by_id: BTreeMap<u64, &format::Node> = s.nodes.iter().map(|n| (n.id, n)).collect();
    let mut names: Vec<&[u8]> = Vec::new();
    let mut cur = by_id.get(&id)?;
    for _ in 0..by_id.len() + 1 {
        match &cur.location {
            Location::Root => {
                let mut p = dirs.get(&s.volumes.get(cur.volume as usize)?.name)?.clone();
                for n in names.iter().rev() {
                    p.push(std::ffi::OsStr::from_bytes(n));
                }
                return Some(p);
            }
            Location::Child { parent, name } => {
                names.push(name);
                cur = by_id.get(parent)?;
            }
            Location::Path(path) => {
                let root = s
                    .volumes
                    .get(cur.volume as usize)
                    .and_then(|v| dirs.get(&v.name))?;
                let mut p = root.join(std::ffi::OsStr::from_bytes(path));
                for n in names.iter().rev() {
                    p.push(std::ffi::OsStr::from_bytes(n));
                }
                return Some(p);
            }
            Location::Unknown => return None,
        }
    }
    None // a cycle
}

/// The host inode (device, number) at `p`, not following a symlink.
fn inode_at(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether the journal's rebuild `journal` agrees with the snapshot `saved` (see
/// [`Agreed`] for what is compared); Err: the differences, one a line.
///
/// Beside the facts of [`Agreed`], each node's location is compared by where it
/// leads: where the snapshot's path leads to an inode on the host (it was
/// confirmed as it was written: that is the node's), the journal's parent and
/// name must lead to that same inode, or a successor after a crash would open
/// another file, or none, for the guest's node id. Where the snapshot has no path
/// (the node was unlinked, or its name is gone with a hard link's), no record can
/// find the node by its name, and the journal's may lead anywhere (the load checks
/// the inode it finds: `Rebuilt::inodes`).
fn compare(
    saved: &SessionState,
    journal: &SessionState,
    dirs: &BTreeMap<String, PathBuf>,
) -> Result<(), String> {
    let (s, j) = (agreed(saved), agreed(journal));
    let mut out = String::new();
    if s.fuse != j.fuse {
        let _ = writeln!(
            out,
            "  FUSE session: snapshot {:?}, journal {:?}",
            s.fuse, j.fuse
        );
    }
    diff_maps("volume", &s.volumes, &j.volumes, &mut out);
    diff_maps("virtual dir", &s.virtual_dirs, &j.virtual_dirs, &mut out);
    diff_maps("node", &s.nodes, &j.nodes, &mut out);
    diff_maps("handle", &s.handles, &j.handles, &mut out);
    diff_sets("POSIX lock", &s.posix_locks, &j.posix_locks, &mut out);
    diff_sets("flock", &s.flocks, &j.flocks, &mut out);
    if journal.next_node_id < saved.next_node_id {
        let _ = writeln!(
            out,
            "  next node id: snapshot {}, journal {} (lower: ids handed out again)",
            saved.next_node_id, journal.next_node_id
        );
    }
    if journal.next_handle_id < saved.next_handle_id {
        let _ = writeln!(
            out,
            "  next handle id: snapshot {}, journal {} (lower: ids handed out again)",
            saved.next_handle_id, journal.next_handle_id
        );
    }
    for n in &saved.nodes {
        if !j.nodes.contains_key(&n.id) || n.location == Location::Root {
            continue;
        }
        let Some(there) = host_path(saved, n.id, dirs).and_then(|p| inode_at(&p)) else {
            continue;
        };
        let jpath = host_path(journal, n.id, dirs);
        let jthere = jpath.as_deref().and_then(inode_at);
        if jthere != Some(there) {
            let _ = writeln!(
                out,
                "  node {}: the snapshot's location ({:?}, {:?}) leads to inode {there:?}, \
                 the journal's ({:?}, {:?}) to {jthere:?}",
                n.id,
                n.location,
                host_path(saved, n.id, dirs),
                journal
                    .nodes
                    .iter()
                    .find(|x| x.id == n.id)
                    .map(|x| &x.location),
                jpath,
            );
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(out)
    }
}

/// One region for a test: made once, its half A cleared for each run.
fn region() -> &'static Region {
    Box::leak(Box::new(
        Region::create().expect("a session region (a memfd)"),
    ))
}

/// One random run: `OPS` requests of seed `seed`, compared at a few random points
/// and at the end.
fn run(seed: u64, region: &'static Region) -> Coverage {
    let mut rng = Rng::new(seed);
    let layout = if seed % 2 == 0 {
        Layout::Volumes
    } else {
        Layout::Whole
    };
    let mut s = Session::new(layout, region);
    s.apply(&Op::Init);
    for i in 0..OPS {
        let op = s.random_op(&mut rng);
        s.apply(&op);
        if rng.one_in(12) {
            s.check(&format!("seed {seed}, after request {}", i + 1));
        }
    }
    s.check(&format!("seed {seed}, at the end"));
    std::mem::take(&mut s.coverage)
}

#[test]
fn the_journal_and_a_snapshot_agree_after_random_requests() {
    let region = region();
    if let Some(seed) = std::env::var("VOLFSD_AGREEMENT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run(seed, region);
        return;
    }
    // More seeds, for a longer search: VOLFSD_AGREEMENT_RUNS=<count>.
    let runs = std::env::var("VOLFSD_AGREEMENT_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(RUNS);
    let mut total = Coverage::default();
    for seed in 1..=runs {
        total.add(&run(seed, region));
    }
    eprintln!("{total:#?}");
}
