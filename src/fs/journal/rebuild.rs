//! The journal of a serving process that was killed, made into a device state
//! (`state::format`), so that its successor loads it as it loads any state: the same
//! checks (every record is untrusted: the dead process served a guest), the same
//! reopening of nodes, handles and locks, ESTALE for what cannot be found again.
//!
//! Each node is named by its parent and name when it was found (its path, if no
//! rename moved it since) and by its file handle where the file system makes one:
//! the load opens the path, checks it is that very inode, and opens the handle
//! when the path leads elsewhere (`LoadOptions::after_crash`). A node without a
//! handle is checked by device and inode number once loaded ([`Rebuilt::inodes`]).

use std::collections::{HashMap, HashSet};

use super::{Handle, NodeRecord, ReadRecord, Record};
use crate::state::format::{self, FileHandle, Location, SessionState};

/// An attached volume here, as the rebuild needs it.
#[derive(Clone, Debug)]
pub struct VolumeHere {
    pub name: String,
    pub read_only: bool,
    pub volume_id: Option<String>,
    pub rate_limit: Option<format::RateLimit>,
}

/// What the journal's half header said.
#[derive(Clone, Copy, Debug, Default)]
pub struct HalfFacts {
    pub next_node_id: u64,
    pub next_handle_id: u64,
    pub fuse: Option<format::FuseSession>,
}

/// The state, and what the load cannot check by itself.
#[derive(Debug, Default)]
pub struct Rebuilt {
    pub state: SessionState,
    /// Nodes named by path only (no file handle): the inode (device, number) each
    /// must be once loaded, or it is another file now.
    pub inodes: Vec<(u64, u64, u64)>,
    /// Records left out: of a volume not attached here, or naming what is not there.
    pub dropped: usize,
    /// The volumes the journal names that are not attached here (their nodes are
    /// among `dropped`).
    pub missing_volumes: Vec<String>,
}

/// Keeps the latest record of each thing (a crash between writing a new record and
/// freeing the old one leaves both).
fn latest<K: std::hash::Hash + Eq, T>(items: impl Iterator<Item = (K, u64, T)>) -> HashMap<K, T> {
    let mut best: HashMap<K, (u64, T)> = HashMap::new();
    for (k, seq, v) in items {
        match best.get(&k) {
            Some((s, _)) if *s >= seq => {}
            _ => {
                best.insert(k, (seq, v));
            }
        }
    }
    best.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

/// How deep node `id` lies below its volume's root through the parents and names
/// the journal gives (None: no path leads there: a name missing, a parent that is
/// not a directory of its volume, a cycle). Iterative: a hostile journal may chain
/// a million parents.
fn depth_of(
    id: u64,
    nodes: &HashMap<u64, NodeRecord<Vec<u8>>>,
    memo: &mut HashMap<u64, Option<usize>>,
) -> Option<usize> {
    if let Some(&d) = memo.get(&id) {
        return d;
    }
    let mut chain = Vec::new();
    let mut on_chain = HashSet::new();
    let mut cur = id;
    // The depth of the parent of the chain's last node.
    let base = loop {
        let n = &nodes[&cur];
        chain.push(cur);
        on_chain.insert(cur);
        if n.name.is_empty() {
            break None;
        }
        if n.parent == n.volume {
            break Some(0);
        }
        match nodes.get(&n.parent) {
            Some(p)
                if p.file_type == libc::S_IFDIR
                    && p.volume == n.volume
                    && !on_chain.contains(&n.parent) =>
            {
                if let Some(&d) = memo.get(&n.parent) {
                    break d;
                }
                cur = n.parent
            }
            _ => break None,
        }
    };
    let mut d = base;
    for &link in chain.iter().rev() {
        d = d.map(|x| x + 1);
        memo.insert(link, d);
    }
    memo[&id]
}

/// Makes the state of `records`, for the volumes attached `here` (by name) and the
/// daemon's `view`.
pub fn rebuild(
    records: Vec<ReadRecord>,
    facts: HalfFacts,
    here: &[VolumeHere],
    view: format::GuestView,
) -> Rebuilt {
    let mut roots = Vec::new();
    let mut nodes = Vec::new();
    let mut handles = Vec::new();
    let mut locks = Vec::new();
    let mut vdirs = Vec::new();
    // An id no daemon hands out (0, past the bound a loaded counter has, a
    // virtual directory's where a node's belongs) is not a record of a session.
    let node_id = |id: u64| (1..crate::state::MAX_LOADED_ID).contains(&id);
    let mut out = Rebuilt::default();
    for r in records {
        let in_range = match &r.record {
            Record::Root { id, .. } => node_id(*id),
            Record::Node(n) => node_id(n.id),
            Record::Handle { id, node, .. } => node_id(*id) && node_id(*node),
            Record::Lock { node, .. } => node_id(*node),
            Record::VirtualDir { .. } => true,
        };
        if !in_range {
            out.dropped += 1;
            continue;
        }
        match r.record {
            Record::Root { id, name } => roots.push((id, r.seq, name)),
            Record::Node(n) => nodes.push((n.id, r.seq, n)),
            Record::Handle {
                id,
                node,
                flags,
                flock,
            } => handles.push((id, r.seq, (node, flags, flock))),
            Record::Lock {
                node,
                owner,
                access,
                ranges,
            } => locks.push(((node, owner), r.seq, (access, ranges))),
            Record::VirtualDir { id, path } => vdirs.push((id, r.seq, path)),
        }
    }
    // Volumes: a root record whose name is attached here; the latest per name.
    let by_name = latest(
        latest(roots.into_iter())
            .into_iter()
            .map(|(id, name)| (name, id, id)),
    );
    let mut volumes: Vec<format::Volume> = Vec::new();
    let mut volume_of_root: HashMap<u64, u32> = HashMap::new();
    let mut names: Vec<(Vec<u8>, u64)> = by_name.into_iter().collect();
    names.sort();
    for (name, root) in names {
        let Some(v) = here.iter().find(|v| v.name.as_bytes() == name.as_slice()) else {
            out.dropped += 1;
            out.missing_volumes
                .push(String::from_utf8_lossy(&name).into_owned());
            continue;
        };
        volume_of_root.insert(root, volumes.len() as u32);
        volumes.push(format::Volume {
            name: v.name.clone(),
            read_only: v.read_only,
            volume_id: v.volume_id.clone(),
            rate_limit: v.rate_limit,
            root,
        });
    }
    let nodes: HashMap<u64, NodeRecord<Vec<u8>>> = latest(nodes.into_iter())
        .into_iter()
        .filter(|(id, n)| {
            let keep = n.lookups > 0
                && volume_of_root.contains_key(&n.volume)
                && !volume_of_root.contains_key(id);
            if !keep {
                out.dropped += 1;
            }
            keep
        })
        .collect();
    // Parents before children: each node's depth below its volume's root, through
    // the parents the journal names (a cycle or a missing parent: no path).
    let mut depth: HashMap<u64, Option<usize>> = HashMap::new();
    let mut ordered: Vec<(Option<usize>, u64)> = nodes
        .keys()
        .map(|&id| (depth_of(id, &nodes, &mut depth), id))
        .collect();
    ordered.sort_unstable_by_key(|&(d, id)| (d.map_or(usize::MAX, |d| d), id));
    let mut state_nodes = Vec::with_capacity(ordered.len() + volumes.len());
    for v in &volumes {
        state_nodes.push(format::Node {
            id: v.root,
            lookups: 1,
            volume: volume_of_root[&v.root],
            file_type: libc::S_IFDIR,
            location: Location::Root,
            file_handle: None,
        });
    }
    let mut max_node = volumes.iter().map(|v| v.root).max().unwrap_or(0);
    for (d, id) in ordered {
        let n = &nodes[&id];
        let handle = n
            .handle
            .as_ref()
            .map(|Handle { handle_type, bytes }| FileHandle {
                handle_type: *handle_type,
                bytes: bytes.clone(),
            });
        let location = match d {
            Some(_) => Location::Child {
                parent: n.parent,
                name: n.name.clone(),
            },
            None => Location::Unknown,
        };
        if handle.is_none() {
            if location == Location::Unknown {
                out.dropped += 1;
                continue;
            }
            out.inodes.push((id, n.dev, n.ino));
        }
        max_node = max_node.max(id);
        state_nodes.push(format::Node {
            id,
            lookups: n.lookups,
            volume: volume_of_root[&n.volume],
            file_type: n.file_type,
            location,
            file_handle: handle,
        });
    }
    let kept: HashSet<u64> = state_nodes.iter().map(|n| n.id).collect();
    let mut state_handles = Vec::new();
    let mut flocks = Vec::new();
    let mut max_handle = 0;
    let mut handles: Vec<_> = latest(handles.into_iter()).into_iter().collect();
    handles.sort_unstable_by_key(|(id, _)| *id);
    for (id, (node, flags, flock)) in handles {
        if !kept.contains(&node) || id == 0 {
            out.dropped += 1;
            continue;
        }
        max_handle = max_handle.max(id);
        state_handles.push(format::Handle {
            id,
            node,
            flags: flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC),
            dir_offset: None,
        });
        if let Some(kind) = flock {
            flocks.push(format::Lock::Flock { handle: id, kind });
        }
    }
    let mut state_locks = Vec::new();
    let mut locks: Vec<_> = latest(locks.into_iter()).into_iter().collect();
    locks.sort_unstable_by_key(|(k, _)| *k);
    for ((node, owner), (access, ranges)) in locks {
        if !kept.contains(&node) {
            out.dropped += 1;
            continue;
        }
        for (start, end, kind) in ranges {
            state_locks.push(format::Lock::Posix {
                node,
                owner,
                access,
                start,
                end,
                kind,
            });
        }
    }
    state_locks.extend(flocks);
    let mut virtual_dirs: Vec<format::VirtualDir> = latest(vdirs.into_iter())
        .into_iter()
        .filter_map(|(nodeid, path)| {
            Some(format::VirtualDir {
                path: String::from_utf8(path).ok()?,
                nodeid,
            })
        })
        .collect();
    virtual_dirs.sort_by(|a, b| a.path.cmp(&b.path));
    out.state = SessionState {
        written_by: "the journal of a serving process that crashed".into(),
        config: view,
        fuse: facts.fuse,
        volumes,
        virtual_dirs,
        nodes: state_nodes,
        next_node_id: facts.next_node_id.max(max_node + 1),
        handles: state_handles,
        next_handle_id: facts.next_handle_id.max(max_handle + 1),
        locks: state_locks,
        parked: Vec::new(),
        handoff: None,
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, parent: u64, name: &str, volume: u64, dir: bool) -> ReadRecord {
        ReadRecord {
            seq: id,
            record: Record::Node(NodeRecord {
                id,
                lookups: 2,
                parent,
                name: name.as_bytes().to_vec(),
                volume,
                file_type: if dir { libc::S_IFDIR } else { libc::S_IFREG },
                dev: 1,
                ino: id * 10,
                mnt_id: 3,
                handle: None,
            }),
        }
    }

    fn root(id: u64, name: &str, seq: u64) -> ReadRecord {
        ReadRecord {
            seq,
            record: Record::Root {
                id,
                name: name.as_bytes().to_vec(),
            },
        }
    }

    fn here(name: &str) -> VolumeHere {
        VolumeHere {
            name: name.into(),
            read_only: false,
            volume_id: None,
            rate_limit: None,
        }
    }

    #[test]
    fn parents_come_before_children_and_the_latest_record_wins() {
        let records = vec![
            node(12, 11, "f", 2, false),
            node(11, 10, "sub", 2, true),
            node(10, 2, "dir", 2, true),
            root(2, "data", 1),
            // The same node again, later: this one is kept.
            ReadRecord {
                seq: 99,
                record: Record::Node(NodeRecord {
                    lookups: 7,
                    ..match node(12, 11, "f", 2, false).record {
                        Record::Node(n) => n,
                        _ => unreachable!(),
                    }
                }),
            },
            ReadRecord {
                seq: 5,
                record: Record::Handle {
                    id: 4,
                    node: 12,
                    flags: libc::O_RDWR | libc::O_TRUNC,
                    flock: Some(libc::F_WRLCK),
                },
            },
            ReadRecord {
                seq: 6,
                record: Record::Lock {
                    node: 12,
                    owner: 9,
                    access: libc::O_RDWR,
                    ranges: vec![(0, 9, libc::F_WRLCK)],
                },
            },
        ];
        let r = rebuild(
            records,
            HalfFacts {
                next_node_id: 5,
                next_handle_id: 0,
                fuse: None,
            },
            &[here("data")],
            Default::default(),
        );
        let ids: Vec<u64> = r.state.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![2, 10, 11, 12]);
        assert_eq!(r.state.nodes[3].lookups, 7);
        assert_eq!(
            r.state.nodes[3].location,
            Location::Child {
                parent: 11,
                name: b"f".to_vec()
            }
        );
        assert_eq!(r.state.next_node_id, 13, "above every id held");
        assert_eq!(r.state.next_handle_id, 5);
        assert_eq!(r.state.handles[0].flags, libc::O_RDWR, "no O_TRUNC again");
        assert_eq!(r.state.locks.len(), 2, "the POSIX lock and the flock");
        // No file handles: each node is checked by its inode once loaded.
        assert_eq!(r.inodes.len(), 3);
        assert_eq!(r.dropped, 0);
    }

    #[test]
    fn what_names_no_attached_volume_or_no_node_is_left_out() {
        let records = vec![
            root(2, "data", 1),
            root(3, "gone", 2),
            node(10, 3, "x", 3, false),
            // A cycle of parents, and a parent that is no directory: no path, no
            // handle: left out.
            node(20, 21, "a", 2, true),
            node(21, 20, "b", 2, true),
            node(22, 23, "c", 2, false),
            node(23, 2, "file", 2, false),
            ReadRecord {
                seq: 9,
                record: Record::Handle {
                    id: 1,
                    node: 10,
                    flags: 0,
                    flock: None,
                },
            },
        ];
        let r = rebuild(
            records,
            HalfFacts::default(),
            &[here("data")],
            Default::default(),
        );
        let ids: Vec<u64> = r.state.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![2, 23]);
        assert!(r.state.handles.is_empty());
        assert_eq!(r.state.volumes.len(), 1);
        assert!(r.dropped >= 5, "{}", r.dropped);
    }

    #[test]
    fn a_node_with_a_file_handle_and_no_path_is_kept_for_its_handle() {
        let mut n = match node(30, 99, "", 2, false).record {
            Record::Node(n) => n,
            _ => unreachable!(),
        };
        n.handle = Some(Handle {
            handle_type: 1,
            bytes: vec![1, 2, 3, 4, 5, 6, 7, 8],
        });
        let records = vec![
            root(2, "data", 1),
            ReadRecord {
                seq: 3,
                record: Record::Node(n),
            },
        ];
        let r = rebuild(
            records,
            HalfFacts::default(),
            &[here("data")],
            Default::default(),
        );
        assert_eq!(r.state.nodes.len(), 2);
        assert_eq!(r.state.nodes[1].location, Location::Unknown);
        assert!(r.state.nodes[1].file_handle.is_some());
        assert!(r.inodes.is_empty());
    }
}
