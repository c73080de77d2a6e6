//! The guest as the test drives it: the random requests (`Op`), what a Linux guest
//! kernel would hold after them (`Model`), and the requests' bytes.

use super::*;

/// FUSE opcodes the test sends.
pub(super) mod op {
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
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        // Never zero (xorshift's fixed point), and seeds 1, 2, 3 far apart.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(super) fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub(super) fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len())])
    }
}

#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub(super) enum Layout {
    /// No `--allowed-dir`: the whole SharedDir is the mount root.
    Whole,
    /// `--allowed-dir top/a --allowed-dir top/b:ro --allowed-dir c`.
    Volumes,
}

/// One guest request (or a control-socket action), with the ids the guest named.
#[derive(Clone, Debug)]
pub(super) enum Op {
    Init,
    Destroy,
    Lookup {
        dir: u64,
        name: &'static str,
    },
    Getattr {
        node: u64,
    },
    Mkdir {
        dir: u64,
        name: &'static str,
    },
    Mknod {
        dir: u64,
        name: &'static str,
    },
    Symlink {
        dir: u64,
        name: &'static str,
    },
    Create {
        dir: u64,
        name: &'static str,
        flags: i32,
    },
    Open {
        node: u64,
        flags: i32,
    },
    Opendir {
        node: u64,
    },
    Release {
        node: u64,
        fh: u64,
        dir: bool,
    },
    Flush {
        node: u64,
        fh: u64,
        owner: u64,
    },
    Forget {
        node: u64,
        count: u64,
    },
    BatchForget {
        forgets: Vec<(u64, u64)>,
    },
    Unlink {
        dir: u64,
        name: &'static str,
    },
    Rmdir {
        dir: u64,
        name: &'static str,
    },
    Rename {
        olddir: u64,
        oldname: &'static str,
        newdir: u64,
        newname: &'static str,
        exchange: bool,
    },
    Link {
        node: u64,
        dir: u64,
        name: &'static str,
    },
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
    Flock {
        node: u64,
        fh: u64,
        kind: i32,
    },
    /// `DELETE /volumes/NAME` on the control socket.
    Detach {
        volume: usize,
    },
    /// `PUT /volumes/NAME` again, with the volume's spec.
    Attach {
        volume: usize,
    },
}

/// What a request got: the errno (0: success; None: no reply, as for FORGET), the
/// node id and file type of an entry, and the handle of an open.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Answer {
    pub(super) errno: Option<i32>,
    pub(super) node: Option<(u64, u32)>,
    pub(super) fh: Option<u64>,
}

impl Answer {
    pub(super) fn ok(&self) -> bool {
        self.errno == Some(0)
    }
}

/// A dentry the guest kernel holds: a name in a directory node. Unlinked ones stay
/// while their node is held (an open file's, or a cwd's), pinning their parent.
#[derive(Clone, Debug)]
pub(super) struct Dentry {
    pub(super) parent: u64,
    pub(super) name: &'static str,
    pub(super) linked: bool,
}

#[derive(Clone, Debug)]
pub(super) struct HeldNode {
    pub(super) file_type: u32,
    pub(super) lookups: u64,
    pub(super) dentries: Vec<Dentry>,
}

/// What the guest kernel holds, as far as the requests it may send depend on it.
#[derive(Default)]
pub(super) struct Model {
    pub(super) nodes: BTreeMap<u64, HeldNode>,
    /// (fh, node, directory).
    pub(super) handles: Vec<(u64, u64, bool)>,
    pub(super) initialized: bool,
}

impl Model {
    pub(super) fn fresh() -> Model {
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

    pub(super) fn dirs(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.file_type == libc::S_IFDIR)
            .map(|(&id, _)| id)
            .collect()
    }

    pub(super) fn non_dirs(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.file_type != libc::S_IFDIR)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether the kernel could let `id` go: no dentry it holds lies in it, no file
    /// of it is open.
    pub(super) fn may_evict(&self, id: u64) -> bool {
        id != crate::fs::registry::ROOT_ID
            && !self.handles.iter().any(|h| h.1 == id)
            && !self
                .nodes
                .iter()
                .any(|(&o, n)| o != id && n.dentries.iter().any(|d| d.parent == id))
    }

    /// The node whose linked dentry is `name` in `dir`.
    pub(super) fn at(&self, dir: u64, name: &str) -> Option<u64> {
        self.nodes
            .iter()
            .find(|(_, n)| {
                n.dentries
                    .iter()
                    .any(|d| d.linked && d.parent == dir && d.name == name)
            })
            .map(|(&id, _)| id)
    }

    pub(super) fn unlink(&mut self, dir: u64, name: &str) {
        if let Some(id) = self.at(dir, name) {
            for d in &mut self.nodes.get_mut(&id).unwrap().dentries {
                if d.parent == dir && d.name == name {
                    d.linked = false;
                }
            }
        }
    }

    pub(super) fn entry(&mut self, dir: u64, name: &'static str, node: u64, file_type: u32) {
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

    pub(super) fn forget(&mut self, node: u64, count: u64) {
        if let Some(n) = self.nodes.get_mut(&node) {
            n.lookups -= count.min(n.lookups);
            if n.lookups == 0 {
                self.nodes.remove(&node);
            }
        }
    }

    pub(super) fn moved(&mut self, from: (u64, &str), to: (u64, &'static str)) -> Option<u64> {
        let id = self.at(from.0, from.1)?;
        for d in &mut self.nodes.get_mut(&id).unwrap().dentries {
            if d.linked && d.parent == from.0 && d.name == from.1 {
                (d.parent, d.name) = to;
            }
        }
        Some(id)
    }

    /// What the kernel does with its dentries when a request succeeds.
    pub(super) fn apply(&mut self, op: &Op, a: &Answer) {
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

/// The name of `op`'s kind, for [`Coverage`].
pub(super) fn op_name(op: &Op) -> &'static str {
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

pub(super) fn type_name(t: u32) -> &'static str {
    match t {
        libc::S_IFDIR => "dir",
        libc::S_IFREG => "file",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        _ => "other",
    }
}

/// The INIT a Linux guest sends (FUSE 7.38, every flag offered).
pub(super) fn init_body() -> Vec<u8> {
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
pub(super) fn lk_body(
    fh: u64,
    owner: u64,
    start: u64,
    end: u64,
    kind: i32,
    lk_flags: u32,
) -> Vec<u8> {
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
