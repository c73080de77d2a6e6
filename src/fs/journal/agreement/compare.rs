//! What the two records are compared on (`Agreed`), read from each, and the
//! difference printed when they disagree.

use super::*;

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
pub(super) struct Agreed {
    pub(super) fuse: Option<format::FuseSession>,
    /// Name -> (read-only, volume id, rate limit, root id).
    pub(super) volumes: BTreeMap<String, (bool, Option<String>, Option<format::RateLimit>, u64)>,
    pub(super) virtual_dirs: BTreeMap<String, u64>,
    pub(super) nodes: BTreeMap<u64, NodeFacts>,
    /// Id -> (node, host open flags).
    pub(super) handles: BTreeMap<u64, (u64, i32)>,
    /// (node, owner, access, start, end, kind).
    pub(super) posix_locks: BTreeSet<(u64, u64, i32, u64, u64, i32)>,
    /// (handle, kind).
    pub(super) flocks: BTreeSet<(u64, i32)>,
}

#[derive(Debug, PartialEq)]
pub(super) struct NodeFacts {
    /// By name: the two may number the volumes differently.
    pub(super) volume: String,
    pub(super) file_type: u32,
    /// None for a volume root (see [`Agreed`]).
    pub(super) lookups: Option<u64>,
}

pub(super) fn agreed(s: &SessionState) -> Agreed {
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
pub(super) fn diff_maps<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
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

pub(super) fn diff_sets<T: Ord + std::fmt::Debug>(
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
pub(super) fn host_path(
    s: &SessionState,
    id: u64,
    dirs: &BTreeMap<String, PathBuf>,
) -> Option<PathBuf> {
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
pub(super) fn inode_at(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
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
pub(super) fn compare(
    saved: &SessionState,
    journal: &SessionState,
    dirs: &BTreeMap<String, PathBuf>,
) -> Result<(), Disagreement> {
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
        Err(Disagreement(out))
    }
}

/// Where the two records differ, a line per difference (what, snapshot vs journal).
#[derive(Debug)]
pub(super) struct Disagreement(String);

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
