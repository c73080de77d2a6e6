//! The daemon under test: a stack on a fresh tree recording into a journal, the
//! requests sent to it as a guest's, and what the runs exercised (`Coverage`).

use super::*;

/// The volumes of the `Volumes` layout: `--allowed-dir` arguments.
pub(super) const VOLUME_ARGS: [&str; 3] = ["top/a", "top/b:ro", "c"];

/// A fresh directory tree for one run, removed when dropped.
pub(super) struct Tree {
    pub(super) root: PathBuf,
}

impl Tree {
    pub(super) fn new(layout: Layout) -> Tree {
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
pub(super) struct Rig {
    pub(super) layout: Layout,
    pub(super) view: GuestView,
    pub(super) specs: Vec<ShareSpec>,
    pub(super) attached: Vec<bool>,
    pub(super) region: &'static Region,
    // Dropped before the tree: fields drop in order.
    pub(super) server: FsServer,
    pub(super) stack: Stack,
    pub(super) tree: Tree,
    pub(super) replies: File,
    pub(super) reply_buf: Vec<u8>,
    pub(super) unique: u64,
    pub(super) model: Model,
    /// Every request sent, with its answer: what a failure prints.
    pub(super) log: Vec<String>,
    /// What the run exercised (see [`Coverage`]).
    pub(super) coverage: Coverage,
}

/// What the runs exercised, summed: each kind of request that succeeded, and what
/// the compared records held. The test asserts each is reached, so that a change
/// that makes the requests fail (or the records empty) does not pass unnoticed.
#[derive(Debug, Default)]
pub(super) struct Coverage {
    pub(super) succeeded: BTreeMap<&'static str, u64>,
    pub(super) checks: u64,
    pub(super) nodes: u64,
    pub(super) nested_nodes: u64,
    pub(super) handles: u64,
    pub(super) posix_locks: u64,
    pub(super) flocks: u64,
    pub(super) virtual_dirs: u64,
}

impl Coverage {
    pub(super) fn add(&mut self, other: &Coverage) {
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

impl Rig {
    /// A stack on a fresh tree, recording into half A of `region` (cleared first).
    pub(super) fn new(layout: Layout, region: &'static Region) -> Rig {
        let tree = Tree::new(layout);
        region
            .clear_half(Half::A)
            .expect("clearing the journal half");
        let journal: &'static Journal = Box::leak(Box::new(Journal::new(region, Half::A)));
        let mut specs = match layout {
            Layout::Whole => Vec::new(),
            Layout::Volumes => {
                crate::config::parse_allowed_dirs(&tree.root, &VOLUME_ARGS.map(String::from))
                    .expect("the volumes' --allowed-dir")
            }
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
        Rig {
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
    pub(super) fn send(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Vec<u8> {
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
    pub(super) fn apply(&mut self, op: &Op) -> Answer {
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

    pub(super) fn serve(&mut self, op: &Op) -> Answer {
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
                (if exchange { op::RENAME2 } else { op::RENAME }, olddir, b)
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
                lk_body(
                    fh,
                    0,
                    0,
                    i64::MAX as u64,
                    kind,
                    crate::fs::locks::FUSE_LK_FLOCK,
                ),
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
    pub(super) fn random_op(&self, rng: &mut Rng) -> Op {
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
                    flags: [
                        libc::O_RDWR,
                        libc::O_WRONLY,
                        libc::O_RDONLY,
                        libc::O_RDWR | libc::O_EXCL,
                    ][rng.below(4)],
                },
                40..=46 => Op::Open {
                    node: rng.pick(&m.non_dirs()).unwrap_or(node),
                    flags: [
                        libc::O_RDWR,
                        libc::O_RDONLY,
                        libc::O_WRONLY | libc::O_APPEND,
                    ][rng.below(3)],
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
                    let detached: Vec<usize> = (0..self.specs.len())
                        .filter(|&v| !self.attached[v])
                        .collect();
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
    pub(super) fn records(&self) -> (SessionState, Rebuilt) {
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
    pub(super) fn check(&mut self, what: &str) {
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
    pub(super) fn volume_dirs(&self) -> BTreeMap<String, PathBuf> {
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
