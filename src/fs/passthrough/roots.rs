//! Volume roots: attached at a node id (with file handles where the volume allows),
//! detached, renumbered; a session reset; a volume's usage.

use super::prelude::*;
use super::*;

impl PassthroughFs {
    /// Registers `root` (a directory fd) as the root of `share`, at node id `nodeid`.
    pub fn attach_root(&self, nodeid: u64, root: File, share: Arc<Share>) -> io::Result<()> {
        let st = sys::stat_fd(&root)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(errno(libc::ENOTDIR));
        }
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&root),
        };
        if self.cfg.file_handles != FileHandleMode::Never {
            self.enable_handles(&share, &root, key.mnt_id)?;
        }
        self.inodes
            .insert_fixed(nodeid, root, key, libc::S_IFDIR, share)?;
        Ok(())
    }

    /// Decides whether `share`'s nodes are kept by file handle: its file system must
    /// make handles, and the daemon must be able to open them (CAP_DAC_READ_SEARCH).
    /// `prefer` falls back to fds with a warning; `mandatory` refuses the share.
    pub(super) fn enable_handles(&self, share: &Share, root: &File, mnt_id: u64) -> io::Result<()> {
        let ctx = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let works = InodeRef::handle_of(root)
            .map_err(|e| ctx("name_to_handle_at", e))
            .and_then(|h| {
                let mount = self.mount_fd(root)?;
                h.open_handle(&mount, libc::O_PATH)
                    .map(|_| mount)
                    .map_err(|e| ctx("open_by_handle_at", e))
            });
        match works {
            Ok(mount) => {
                share.mounts.insert(mnt_id, mount);
                share.set_use_handles(true);
                Ok(())
            }
            Err(e) if self.cfg.file_handles == FileHandleMode::Mandatory => Err(io::Error::new(
                e.kind(),
                format!(
                    "share {:?} ({}): --inode-file-handles=mandatory, but file handles do \
                     not work there: {e}",
                    share.name,
                    share.host_path.display()
                ),
            )),
            Err(e) => {
                log::warn!(
                    "share {:?} ({}): file handles do not work there ({e}); its nodes keep \
                     an O_PATH fd each",
                    share.name,
                    share.host_path.display()
                );
                Ok(())
            }
        }
    }

    /// The fd `open_by_handle_at` is given for the mount `dir` (an `O_PATH` fd of a
    /// directory) is on: the kernel takes no `O_PATH` fd there, so it is reopened.
    pub(super) fn mount_fd(&self, dir: &File) -> io::Result<File> {
        self.reopen_fd(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK)
    }

    /// What a new node of `share` keeps of the inode `file` (an `O_PATH` fd of type
    /// `file_type` on mount `mnt_id`): its file handle where the share uses handles,
    /// else the fd. A submount is entered through its root directory, which gives the
    /// mount its fd for reopening handles; until then its nodes keep fds.
    pub(super) fn inode_ref_for(
        &self,
        share: &Share,
        file: File,
        file_type: u32,
        mnt_id: u64,
    ) -> io::Result<InodeRef> {
        if !share.uses_handles() {
            return Ok(InodeRef::Fd(file));
        }
        match InodeRef::handle_of(&file) {
            Ok(h) => {
                if !share.mounts.contains(mnt_id) {
                    if file_type != libc::S_IFDIR {
                        // A file bind-mounted on its own: no directory to anchor it.
                        return match self.cfg.file_handles {
                            FileHandleMode::Mandatory => Err(errno(libc::EOPNOTSUPP)),
                            _ => Ok(InodeRef::Fd(file)),
                        };
                    }
                    share.mounts.insert(mnt_id, self.mount_fd(&file)?);
                }
                Ok(h)
            }
            Err(e) if self.cfg.file_handles == FileHandleMode::Mandatory => Err(e),
            // A submount whose file system makes no handles: fds there.
            Err(_) => Ok(InodeRef::Fd(file)),
        }
    }

    /// Whether the live node `data` is the inode `file` refers to (see
    /// [`InodeRef::same_inode`]).
    pub(super) fn is_same_inode(data: &InodeData, file: &File) -> bool {
        match data.inode_ref() {
            InodeRef::Fd(_) => true,
            handle => InodeRef::handle_of(file).is_ok_and(|f| f.same_inode(handle)),
        }
    }

    /// The entry of a share root as seen from the virtual directory above it: announced
    /// as a submount, so each share has its own st_dev in the guest.
    pub fn share_root_entry(&self, nodeid: u64) -> io::Result<Entry> {
        let data = self.inode(nodeid)?;
        let st = sys::stat_fd(&data.fd()?)?;
        let mut entry = self.entry_from(&data, st, None);
        entry.attr_flags |= ATTR_SUBMOUNT;
        Ok(entry)
    }

    /// Revokes `share` and releases every node, handle and lock file of it, waking
    /// lock waits on it. Requests in flight on it can register nothing more; their
    /// fds close as soon as they finish. Returns (nodes, handles) released.
    pub fn detach_share(&self, share: &Arc<Share>) -> (usize, usize) {
        share.revoke();
        let handles = self.handles.remove_share(share);
        self.locks.remove_share(share);
        let nodes = self.inodes.remove_share(share);
        (nodes, handles)
    }

    /// Starts a new guest session: every node id (but the share roots), handle and
    /// lock file of the previous one is dropped, and its lock waits end. Returns
    /// (nodes, handles, lock files) released.
    pub fn reset_session(&self) -> (usize, usize, usize) {
        self.lost.write().unwrap().clear();
        let nodes = self.inodes.reset_session();
        let handles = self.handles.reset_session();
        let lock_files = self.locks.reset_session();
        (nodes, handles, lock_files)
    }

    /// (live node ids, open handles) of `share`.
    pub fn share_usage(&self, share: &Share) -> (usize, usize) {
        (
            self.inodes.count_share(share),
            self.handles.count_share(share),
        )
    }
}
