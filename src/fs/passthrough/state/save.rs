//! Saving: each node the guest holds named by its volume and path (and file handle).

use std::collections::{HashMap, HashSet};

use super::super::super::file_handle::raw_handle_of;
use super::super::super::share::Share;
use super::super::prelude::*;
use super::*;
use crate::state::format::{self, FileHandle, Location};
use crate::state::{MigrationMode, SaveOptions, VolumeLabel};

impl SavedTables {
    fn with_previewed(mut self, previewed: Vec<format::Previewed>) -> Self {
        self.previewed = previewed;
        self
    }
}

/// A node of a save, its path below its volume's root, its `(st_dev, st_ino)`.
type Found = (format::Node, Option<Vec<u8>>, (u64, u64));

/// The nodes of a save: each with its inode's `(st_dev, st_ino)`, and those an
/// upgrade's preview named (as [`format::Previewed`]).
pub(super) struct SavedNodes {
    pub nodes: Vec<format::Node>,
    pub keys: Vec<(u64, u64)>,
    pub previewed: Vec<format::Previewed>,
}

impl PassthroughFs {
    /// The nodes, handles and locks the guest holds, for the device state.
    /// `volumes` lists each volume's share at its index in the state. `previewed`:
    /// the node ids an upgrade's preview named, saved as such (no system call each);
    /// None: every node in full, as a migration's state has them.
    pub fn save_tables(
        &self,
        volumes: &[Arc<Share>],
        opts: &SaveOptions,
        previewed: Option<&PreviewIds>,
    ) -> SavedTables {
        let SavedNodes {
            nodes, previewed, ..
        } = self.save_nodes(volumes, opts, previewed, None);
        let full: HashSet<u64> = nodes.iter().map(|n| n.id).collect();
        // `previewed` is in id order.
        let saved =
            |id: u64| full.contains(&id) || previewed.binary_search_by_key(&id, |p| p.id).is_ok();
        self.save_open_files(nodes, &previewed, saved)
            .with_previewed(previewed)
    }

    /// The nodes the guest holds, named by path (and handle); a node of `previewed`
    /// (no volume root) only by its id and lookups.
    pub(super) fn save_nodes(
        &self,
        volumes: &[Arc<Share>],
        opts: &SaveOptions,
        previewed: Option<&PreviewIds>,
        mark: Option<u8>,
    ) -> SavedNodes {
        let index_of = |share: &Arc<Share>| volumes.iter().position(|v| Arc::ptr_eq(v, share));
        let mut root_links: HashMap<usize, Vec<u8>> = HashMap::new();
        let mut root_fds: HashMap<usize, File> = HashMap::new();
        // After a preview, the nodes it named that still live only by id and lookups,
        // read under the table's lock without copying the list (in the pause); the
        // others (the volume roots, the nodes new since) in full below.
        let mut as_previewed = Vec::new();
        let all = match previewed {
            None => self.inodes.snapshot(),
            Some(ids) => {
                let mut full = Vec::new();
                as_previewed.reserve(ids.len());
                self.inodes.visit(|data| {
                    if !data.is_share_root() && ids.contains(data) {
                        as_previewed.push(format::Previewed {
                            id: data.nodeid,
                            lookups: data.lookups(),
                        });
                    } else {
                        full.push(data.clone());
                    }
                });
                as_previewed.sort_unstable_by_key(|p| p.id);
                full.sort_unstable_by_key(|d| d.nodeid);
                full
            }
        };
        for data in all.iter().filter(|d| d.is_share_root()) {
            if let Some(v) = index_of(&data.share) {
                if let Ok(fd) = data.fd() {
                    if let Ok(link) = self.fd_link(&*fd) {
                        root_links.insert(v, link);
                    }
                    if let Ok(dup) = fd.try_clone() {
                        root_fds.insert(v, dup);
                    }
                }
            }
        }
        let want_handles = opts.verify_handles || opts.mode == MigrationMode::FileHandles;
        // (node, volume, path) with the path below the volume's root; roots first.
        let mut found: Vec<Found> = Vec::with_capacity(all.len());
        for data in &all {
            let Some(volume) = index_of(&data.share) else {
                continue; // detached while the guest was stopped: not the guest's any more
            };
            let key = data.key();
            if let (Some(id), false) = (mark, data.is_share_root()) {
                data.mark_previewed(id); // an upgrade's preview names it
            }
            let fd = data.fd().ok();
            let file_handle = match (&fd, want_handles) {
                (Some(fd), true) => raw_handle_of(&**fd)
                    .ok()
                    .map(|(handle_type, bytes)| FileHandle { handle_type, bytes }),
                _ => None,
            };
            let path = if data.is_share_root() {
                None
            } else {
                fd.as_ref().and_then(|fd| {
                    let path = self.path_below(root_links.get(&volume)?, fd)?;
                    if opts.confirm_paths {
                        // The path must lead to this very inode now, or it is no path.
                        let components = check_path(&path).ok()?;
                        let again = self.walk(root_fds.get(&volume)?, &components).ok()?;
                        let st = sys::stat_fd(&again).ok()?;
                        if (st.st_dev, st.st_ino) != (key.dev, key.ino) {
                            log::warn!(
                                "{}: {:?} no longer leads to node {}: saved without a path",
                                VolumeLabel(&data.share.name),
                                display(&path),
                                data.nodeid
                            );
                            return None;
                        }
                    }
                    Some(path)
                })
            };
            if !data.is_share_root() && path.is_none() {
                log::warn!(
                    "{}: node {} ({}) has no path below it (unlinked or moved out); {}",
                    VolumeLabel(&data.share.name),
                    data.nodeid,
                    type_name(data.file_type()),
                    if file_handle.is_some() {
                        "a destination with --migration-mode=file-handles finds it by its file handle"
                    } else {
                        "a destination cannot find it (the load fails, or it is ESTALE with \
                         --migration-on-error=guest-error)"
                    }
                );
            }
            found.push((
                format::Node {
                    id: data.nodeid,
                    lookups: data.lookups(),
                    volume: volume as u32,
                    file_type: data.file_type(),
                    location: if data.is_share_root() {
                        Location::Root
                    } else {
                        Location::Unknown
                    },
                    file_handle,
                },
                path,
                (key.dev, key.ino),
            ));
        }
        // Parents before children: a directory's path is shorter than its entries'.
        found.sort_by_key(|(n, p, _)| {
            (
                n.location != Location::Root,
                p.as_ref()
                    .map_or(usize::MAX, |p| p.iter().filter(|&&b| b == b'/').count()),
                n.id,
            )
        });
        let mut dirs: HashMap<(u32, Vec<u8>), u64> = HashMap::new();
        let mut nodes = Vec::with_capacity(found.len());
        let mut keys = Vec::with_capacity(found.len());
        for (mut node, path, key) in found {
            if let Some(path) = path {
                let (parent_path, name) = match path.iter().rposition(|&b| b == b'/') {
                    Some(i) => (&path[..i], &path[i + 1..]),
                    None => (&path[..0], &path[..]),
                };
                let parent = if parent_path.is_empty() {
                    volumes.get(node.volume as usize).and_then(|_| {
                        all.iter()
                            .find(|d| {
                                d.is_share_root()
                                    && index_of(&d.share) == Some(node.volume as usize)
                            })
                            .map(|d| d.nodeid)
                    })
                } else {
                    dirs.get(&(node.volume, parent_path.to_vec())).copied()
                };
                node.location = match parent {
                    Some(parent) => Location::Child {
                        parent,
                        name: name.to_vec(),
                    },
                    None => Location::Path(path.clone()),
                };
                if node.file_type == libc::S_IFDIR {
                    dirs.insert((node.volume, path), node.id);
                }
            }
            nodes.push(node);
            keys.push(key);
        }
        SavedNodes {
            nodes,
            keys,
            previewed: as_previewed,
        }
    }

    /// The handles and locks on the nodes `saved` names, with the nodes.
    fn save_open_files(
        &self,
        nodes: Vec<format::Node>,
        _previewed: &[format::Previewed],
        saved: impl Fn(u64) -> bool,
    ) -> SavedTables {
        let mut handles = Vec::new();
        let mut flock_handles = Vec::new();
        let mut locks = Vec::new();
        for (id, h) in self.handles.snapshot() {
            if !saved(h.inode.nodeid) {
                continue;
            }
            // SAFETY: F_GETFL on an fd we own.
            let fl = unsafe { libc::fcntl(h.file.as_raw_fd(), libc::F_GETFL) };
            let flags = if fl < 0 { libc::O_RDONLY } else { fl }
                & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
            handles.push(format::Handle {
                id,
                node: h.inode.nodeid,
                flags,
                dir_offset: h
                    .inode
                    .is_dir()
                    .then(|| h.dir_offset.load(Ordering::Relaxed)),
            });
            if let Some(kind) = h.flock_kind() {
                locks.push(format::Lock::Flock { handle: id, kind });
                flock_handles.push((id, h.clone()));
            }
        }
        let mut lock_files = Vec::new();
        for held in self.locks.snapshot() {
            if !saved(held.inode.nodeid) {
                continue;
            }
            // SAFETY: F_GETFL on an fd we own.
            let fl = unsafe { libc::fcntl(held.file.as_raw_fd(), libc::F_GETFL) };
            let access = if fl < 0 {
                libc::O_RDONLY
            } else {
                fl & libc::O_ACCMODE
            };
            for r in &held.ranges {
                locks.push(format::Lock::Posix {
                    node: held.inode.nodeid,
                    owner: held.owner,
                    access,
                    start: r.start,
                    end: r.end,
                    kind: r.kind,
                });
            }
            lock_files.push(((held.inode.nodeid, held.owner), held.file.clone()));
        }
        SavedTables {
            nodes,
            previewed: Vec::new(),
            handles,
            locks,
            next_node_id: self.inodes.next_id(),
            next_handle_id: self.handles.next_id(),
            lock_files,
            flock_handles,
        }
    }
}
