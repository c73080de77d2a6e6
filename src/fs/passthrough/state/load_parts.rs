//! The steps of a load: a node found again, a handle reopened or adopted, locks
//! taken again or waited for.

use super::super::super::file_handle::{open_raw_handle, raw_handle_of};
use super::super::super::lock_ranges::HeldRange;
use super::super::super::share::Share;
use super::super::prelude::*;
use super::*;
use crate::state::format::{self, FileHandle};

impl PassthroughFs {
    /// Opens the state's node again: by path from its parent or volume root, else by
    /// its file handle (then checked to lie inside the volume). The error says why,
    /// for the message.
    pub(super) fn find_node(
        &self,
        root: Option<&InodeData>,
        parent: Option<&InodeData>,
        components: &[CString],
        node: &format::Node,
    ) -> Result<File, RestoreError> {
        let root = root.ok_or(RestoreError::Refused("its volume has no root here"))?;
        let file = if !components.is_empty() {
            let from = match parent {
                Some(p) => p.fd().map_err(at("its directory"))?,
                None => root.fd().map_err(at("the volume's root"))?,
            };
            self.walk(&from, components)?
        } else if let Some(h) = &node.file_handle {
            self.open_contained_handle(root, h)?
        } else {
            return Err(RestoreError::Refused(
                "the source could not say where it is (unlinked while held?)",
            ));
        };
        let st = sys::stat_fd(&file)?;
        let found = st.st_mode & libc::S_IFMT;
        if found != node.file_type {
            return Err(RestoreError::TypeChanged {
                now: found,
                held: node.file_type,
            });
        }
        if let (Some(h), false) = (&node.file_handle, components.is_empty()) {
            // --migration-verify-handles at the source: the very inode, or none.
            match raw_handle_of(&file) {
                Ok((t, bytes)) if t == h.handle_type && bytes == h.bytes => {}
                Ok(_) => {
                    return Err(RestoreError::Refused(
                        "another inode than the guest held (its file handle differs)",
                    ))
                }
                Err(e) => return Err(at("its file handle")(e)),
            }
        }
        Ok(file)
    }

    /// Opens a file handle from the state on the volume's mount, and keeps it only if
    /// the inode lies inside the volume: a directory whose `..` chain reaches the
    /// volume's root, or a file whose path below the root leads back to it.
    pub(super) fn open_contained_handle(
        &self,
        root: &InodeData,
        h: &FileHandle,
    ) -> Result<File, RestoreError> {
        let root_fd = root.fd()?;
        let mount = self.mount_fd(&root_fd).map_err(at("the volume's mount"))?;
        let file = open_raw_handle(&mount, h.handle_type, &h.bytes, libc::O_PATH)
            .map_err(at("open_by_handle_at"))?;
        let root_key = root.key();
        let st = sys::stat_fd(&file)?;
        let inside = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let mut cur = file.try_clone()?;
            let mut ok = false;
            for _ in 0..MAX_DEPTH {
                let s = sys::stat_fd(&cur)?;
                if (s.st_dev, s.st_ino) == (root_key.dev, root_key.ino) {
                    ok = true;
                    break;
                }
                let up = sys::openat(&cur, c"..", libc::O_PATH | libc::O_NOFOLLOW, 0)?;
                let u = sys::stat_fd(&up)?;
                if (u.st_dev, u.st_ino) == (s.st_dev, s.st_ino) {
                    break; // the file system's root: the volume was not on the way
                }
                cur = up;
            }
            ok
        } else {
            let root_link = self.fd_link(&*root_fd)?;
            self.path_below(&root_link, &file)
                .and_then(|p| check_path(&p).ok())
                .and_then(|c| self.walk(&root_fd, &c).ok())
                .and_then(|again| sys::stat_fd(&again).ok())
                .is_some_and(|s| (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino))
        };
        if !inside {
            return Err(RestoreError::Refused(
                "its file handle leads outside the volume",
            ));
        }
        Ok(file)
    }

    /// A node found again, as the node the state names (not registered: see
    /// [`InodeStore::commit_found`](super::super::super::inodes::InodeStore::commit_found)).
    pub(super) fn found_node(
        &self,
        share: &Arc<Share>,
        file: File,
        node: &format::Node,
    ) -> Result<Arc<InodeData>, RestoreError> {
        let st = sys::stat_fd(&file)?;
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&file),
        };
        let file_type = st.st_mode & libc::S_IFMT;
        let inode = self.inode_ref_for(share, file, file_type, key.mnt_id)?;
        Ok(self
            .inodes
            .found(node.id, inode, key, file_type, share.clone()))
    }

    /// Opens a handle of the state again, with its flags as far as this daemon's
    /// options and the volume allow (never O_TRUNC, O_CREAT or O_EXCL again).
    pub(super) fn reopen_restored(
        &self,
        node: &InodeData,
        h: &format::Handle,
    ) -> Result<File, RestoreError> {
        let keep = libc::O_ACCMODE
            | libc::O_APPEND
            | libc::O_NONBLOCK
            | libc::O_DIRECT
            | libc::O_NOATIME
            | libc::O_SYNC
            | libc::O_DSYNC;
        let mut flags = self.host_open_flags((h.flags & keep) as u32);
        if node.is_dir() {
            flags = (flags & !libc::O_ACCMODE) | libc::O_RDONLY | libc::O_DIRECTORY;
        } else if node.share.read_only && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(RestoreError::Refused(
                "open for writing on a read-only volume",
            ));
        }
        let file = self.reopen(node, flags)?;
        if let Some(off) = h.dir_offset {
            // SAFETY: lseek on an fd we own.
            cvt64(unsafe { libc::lseek64(file.as_raw_fd(), off as i64, libc::SEEK_SET) })
                .map_err(at("its directory position"))?;
        }
        Ok(file)
    }

    /// Takes an open file the source handed over, if it is this node's inode and its
    /// access mode is one the volume allows.
    pub(super) fn adopt_handed(
        &self,
        node: &InodeData,
        file: File,
        flags: i32,
    ) -> Result<File, RestoreError> {
        let st = sys::stat_fd(&file)?;
        let key = node.key();
        if (st.st_dev, st.st_ino) != (key.dev, key.ino) {
            return Err(RestoreError::Refused(
                "the file the source handed over is another inode",
            ));
        }
        // SAFETY: F_GETFL on an fd we own.
        let fl = cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) })?;
        if node.share.read_only && fl & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(RestoreError::Refused(
                "a writable file handed over on a read-only volume",
            ));
        }
        if fl & libc::O_ACCMODE != flags & libc::O_ACCMODE {
            return Err(RestoreError::Refused(
                "the file the source handed over has another access mode",
            ));
        }
        Ok(file)
    }

    /// Opens `owner`'s lock file on `node` and takes its ranges again. Returns the
    /// file, the ranges still held by another (the source on this host, until it
    /// exits: waited for once the session runs), and false (not handed over).
    pub(super) fn take_posix_locks(
        &self,
        node: &Arc<InodeData>,
        access: i32,
        ranges: &[HeldRange],
    ) -> Result<TakenLocks, RestoreError> {
        if node.file_type() != libc::S_IFREG && node.file_type() != libc::S_IFDIR {
            return Err(RestoreError::Refused("locks on a special file"));
        }
        if node.share.read_only && access != libc::O_RDONLY {
            return Err(RestoreError::Refused(
                "a writable lock file on a read-only volume",
            ));
        }
        let file = self.reopen(node, access | libc::O_NONBLOCK)?;
        let pending = set_ranges(&file, ranges)?;
        Ok((Arc::new(file), pending, false))
    }

    /// A lock file the source handed over (checked by [`Self::adopt_handed`]) is
    /// trusted only as far as the host says: each range is taken on it again, which
    /// changes nothing where it holds the range, takes it where no one does, and
    /// leaves it to be waited for where another holds it. Handed over (true) only if
    /// it holds every range.
    pub(super) fn verify_handed_posix(
        &self,
        file: File,
        ranges: &[HeldRange],
    ) -> Result<TakenLocks, RestoreError> {
        let pending = set_ranges(&file, ranges)?;
        let handed_over = pending.is_empty();
        Ok((Arc::new(file), pending, handed_over))
    }

    /// Waits, on a thread of its own, for the locks another still held at the load.
    /// Each wait is a registered lock wait: a new session or a detach ends it.
    pub(super) fn wait_for_pending(&self, pending: Vec<PendingLock>) {
        log::warn!(
            "{} lock(s) of the guest are still held by another (the migration's source until \
             it exits?): taken as soon as they are let go",
            pending.len()
        );
        let locks = self.locks.clone();
        // Started by the launcher, whatever thread loads the state: it runs under
        // the lock waiters' list, not under the loading thread's as well.
        let spawned = crate::sandbox::threads::spawn(
            "volfsd-locktake",
            crate::sandbox::ThreadRole::LockWaiter,
            move || {
                for p in pending {
                    let (what, result) = match p {
                        PendingLock::Posix { node, file, fl } => {
                            let result = locks.wait(&node, || {
                                let mut fl = fl;
                                // SAFETY: fcntl with a valid flock struct on an fd we own.
                                cvt(unsafe {
                                    libc::fcntl(
                                        file.as_raw_fd(),
                                        libc::F_OFD_SETLKW,
                                        &mut fl as *mut libc::flock,
                                    )
                                })
                                .map(|_| ())
                            });
                            (
                                format!("{:?} node {}", node.share.name, node.nodeid),
                                result,
                            )
                        }
                        PendingLock::Flock { handle, op } => {
                            let result = locks.wait(&handle.inode, || {
                                // SAFETY: flock on an fd we own.
                                cvt(unsafe { libc::flock(handle.file.as_raw_fd(), op) }).map(|_| ())
                            });
                            (
                                format!(
                                    "{:?} node {}",
                                    handle.inode.share.name, handle.inode.nodeid
                                ),
                                result,
                            )
                        }
                    };
                    match result {
                        Ok(()) => log::info!("lock on {what} taken again"),
                        Err(e) => log::warn!("lock on {what} could not be taken again: {e}"),
                    }
                }
            },
        );
        if let Err(e) = spawned {
            log::warn!("cannot start the thread that takes locks again: {e}");
        }
    }
}

/// A lock file, the ranges another still holds on it, and whether the source handed
/// it over holding every range.
pub(super) type TakenLocks = (Arc<File>, Vec<libc::flock>, bool);

/// Takes `ranges` on the open file `file` (F_OFD_SETLK); returns those another
/// holds.
fn set_ranges(file: &File, ranges: &[HeldRange]) -> Result<Vec<libc::flock>, RestoreError> {
    let mut pending = Vec::new();
    for r in ranges {
        let lock = FileLock {
            start: r.start,
            end: r.end,
            lock_type: r.kind as u32,
            pid: 0,
        };
        let fl = locks::to_flock(&lock)?;
        let mut try_fl = fl;
        // SAFETY: fcntl with a valid flock struct on an fd we own.
        match cvt(unsafe {
            libc::fcntl(
                file.as_raw_fd(),
                libc::F_OFD_SETLK,
                &mut try_fl as *mut libc::flock,
            )
        }) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                pending.push(fl)
            }
            Err(e) => return Err(at("F_OFD_SETLK")(e)),
        }
    }
    Ok(pending)
}

/// A lock another held when the state was loaded.
pub(super) enum PendingLock {
    Posix {
        node: Arc<InodeData>,
        file: Arc<File>,
        fl: libc::flock,
    },
    Flock {
        handle: Arc<HandleData>,
        op: libc::c_int,
    },
}
