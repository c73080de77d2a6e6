//! Names and attributes: lookup, forget, stat, create and remove entries, links,
//! statfs, access.

use super::files::kill_suidgid_fd;
use super::prelude::*;

impl PassthroughFs {
    /// DESTROY: nothing here; the server starts the next session over
    /// (`reset_session`) when the guest comes back.
    pub(super) fn destroy(&self) {}

    pub(super) fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        let mut want = FsOptions::ASYNC_READ
            | FsOptions::PARALLEL_DIROPS
            | FsOptions::BIG_WRITES
            | FsOptions::ATOMIC_O_TRUNC
            | FsOptions::DO_READDIRPLUS
            | FsOptions::READDIRPLUS_AUTO
            | FsOptions::MAX_PAGES
            | FsOptions::SUBMOUNTS
            | FsOptions::POSIX_LOCKS
            | FsOptions::FLOCK_LOCKS
            // Without it the guest completes async direct I/O one request at a time:
            // with cache=none every guest I/O is direct, so iodepth would be lost.
            | FsOptions::ASYNC_DIO
            // The guest tells us when a write, truncate or chown by a non-owner must
            // clear the setuid/setgid bits; the daemon's own root would keep them.
            | FsOptions::HANDLE_KILLPRIV_V2
            | FsOptions::INIT_EXT;
        if self.cfg.cache != CacheMode::None {
            want |= FsOptions::AUTO_INVAL_DATA;
        }
        // Without FUSE_SUBMOUNTS the guest ignores every ATTR_SUBMOUNT: one st_dev for
        // the whole share, as virtiofsd gives with --no-announce-submounts.
        if !self.cfg.announce_submounts {
            want.remove(FsOptions::SUBMOUNTS);
        }
        if !self.cfg.readdirplus {
            want.remove(FsOptions::DO_READDIRPLUS | FsOptions::READDIRPLUS_AUTO);
        }
        // POSIX ACLs: the guest kernel checks permissions against them (it turns on
        // default_permissions) and leaves the umask to us where a default ACL applies.
        let acl = FsOptions::POSIX_ACL | FsOptions::DONT_MASK;
        let acl_on = match self.cfg.posix_acl {
            AclMode::Never => false,
            _ if capable.contains(acl) => true,
            AclMode::Auto => {
                log::warn!(
                    "--posix-acl=auto: the guest kernel does not offer POSIX ACLs; serving without"
                );
                false
            }
            AclMode::Always => {
                log::error!("--posix-acl=always: the guest kernel does not offer POSIX ACLs; refusing FUSE INIT");
                return Err(errno(libc::EPROTO));
            }
        };
        self.acl.store(acl_on, Ordering::Relaxed);
        if acl_on {
            want |= acl;
        }
        Ok(want & capable)
    }

    /// Opens `name` under `parent` without following symlinks and registers it. The
    /// open is the caller's (search access to `parent`, with translation).
    pub(super) fn do_lookup(
        &self,
        ctx: &Context,
        parent: &Arc<InodeData>,
        name: &CStr,
    ) -> io::Result<Entry> {
        check_name(name)?;
        if name.to_bytes() == b"." {
            return self.ref_existing(parent);
        }
        if name.to_bytes() == b".." {
            return self.lookup_dotdot(ctx, parent);
        }
        let parent_fd = parent.fd()?;
        let file = {
            let _caller = self.as_caller(ctx)?;
            sys::openat(&*parent_fd, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?
        };
        self.register(file, parent, name.to_bytes())
    }

    /// A guest kernel never sends `LOOKUP ..`; a malicious one may. It may only reach a
    /// directory the guest already holds, and never climbs above the share root.
    pub(super) fn lookup_dotdot(
        &self,
        ctx: &Context,
        parent: &Arc<InodeData>,
    ) -> io::Result<Entry> {
        if parent.is_share_root() {
            // The virtual layer answers `..` of a share root; here it stays put.
            return self.ref_existing(parent);
        }
        let parent_fd = parent.fd()?;
        let file = {
            let _caller = self.as_caller(ctx)?;
            sys::openat(&*parent_fd, c"..", libc::O_PATH | libc::O_NOFOLLOW, 0)?
        };
        let st = sys::stat_fd(&file)?;
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: sys::mount_id(&file),
        };
        match self.inodes.lookup_key(&key) {
            Some(existing)
                if Arc::ptr_eq(&existing.share, &parent.share)
                    && Self::is_same_inode(&existing, &file) =>
            {
                self.ref_existing(&existing)
            }
            _ => Err(errno(libc::ENOENT)),
        }
    }

    pub(super) fn ref_existing(&self, data: &Arc<InodeData>) -> io::Result<Entry> {
        let st = sys::stat_fd(&data.fd()?)?;
        let dup = data.inode_ref().try_clone()?;
        let node = self
            .inodes
            .insert_or_ref(dup, data.key(), data.file_type(), data, b"")?;
        Ok(self.entry_from(&node, st, None))
    }

    pub(super) fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        self.do_lookup(ctx, &dir, name)
    }

    pub(super) fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        self.inodes.forget(inode, count);
    }

    pub(super) fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        self.inodes.forget_many(&requests);
    }

    pub(super) fn getattr(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        let data = self.inode(inode)?;
        Ok((self.stat_with_handle(&data, handle)?, self.timeout))
    }

    pub(super) fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        let data = self.inode(inode)?;
        let h = handle.and_then(|fh| self.handle(fh, inode).ok());
        // Before acting as the caller: opening a node's file handle needs the
        // daemon's own rights.
        let data_fd = data.fd()?;
        let proc_name = ProcFdName::new(data_fd.as_raw_fd());
        // The guest's ids, as the host's (`--translate-uid/gid`); a forbidden one is
        // EPERM before any host call.
        let uid = match valid.contains(SetattrValid::UID) {
            true => self.cfg.uids.to_host(attr.st_uid)?,
            false => u32::MAX,
        };
        let gid = match valid.contains(SetattrValid::GID) {
            true => self.cfg.gids.to_host(attr.st_gid)?,
            false => u32::MAX,
        };
        let caller = self.as_caller(ctx)?;

        if valid.contains(SetattrValid::MODE) {
            // SAFETY: fchmodat on the /proc/self/fd magic link of our own fd.
            cvt(unsafe {
                match &h {
                    Some(h) => libc::fchmod(h.file.as_raw_fd(), attr.st_mode),
                    None => libc::fchmodat(
                        self.proc_self_fd.as_raw_fd(),
                        proc_name.as_cstr().as_ptr(),
                        attr.st_mode,
                        0,
                    ),
                }
            })?;
        }
        if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            // SAFETY: fchownat with an empty path acts on the fd itself.
            cvt(unsafe {
                libc::fchownat(
                    data_fd.as_raw_fd(),
                    c"".as_ptr(),
                    uid,
                    gid,
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
            if valid.contains(SetattrValid::KILL_SUIDGID) {
                self.kill_suidgid_path(&data, &data_fd)?;
            }
        }
        if valid.contains(SetattrValid::SIZE) {
            match data.file_type() {
                libc::S_IFREG => {}
                libc::S_IFDIR => return Err(errno(libc::EISDIR)),
                // truncate(2) of a FIFO, socket or device: never opened here.
                _ => return Err(errno(libc::EINVAL)),
            }
            let owned;
            let fd = match &h {
                Some(h) => h.file.as_raw_fd(),
                None => {
                    // As the caller: truncate(2) needs write access to the file.
                    owned = if caller.is_some() {
                        self.reopen_fd(&*data_fd, libc::O_WRONLY)?
                    } else {
                        self.reopen(&data, libc::O_WRONLY)?
                    };
                    owned.as_raw_fd()
                }
            };
            if valid.contains(SetattrValid::KILL_SUIDGID) {
                kill_suidgid_fd(fd)?;
            }
            // SAFETY: ftruncate on an fd we own.
            cvt(unsafe { libc::ftruncate64(fd, attr.st_size) })?;
        }
        if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME) {
            let omit = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            };
            let mut times = [omit, omit];
            if valid.contains(SetattrValid::ATIME) {
                times[0] = if valid.contains(SetattrValid::ATIME_NOW) {
                    now
                } else {
                    libc::timespec {
                        tv_sec: attr.st_atime,
                        tv_nsec: attr.st_atime_nsec,
                    }
                };
            }
            if valid.contains(SetattrValid::MTIME) {
                times[1] = if valid.contains(SetattrValid::MTIME_NOW) {
                    now
                } else {
                    libc::timespec {
                        tv_sec: attr.st_mtime,
                        tv_nsec: attr.st_mtime_nsec,
                    }
                };
            }
            // SAFETY: `times` is a valid two-element array; the path names our own fd.
            cvt(unsafe {
                match &h {
                    Some(h) => libc::futimens(h.file.as_raw_fd(), times.as_ptr()),
                    None if data.file_type() == libc::S_IFLNK => libc::utimensat(
                        data_fd.as_raw_fd(),
                        c"".as_ptr(),
                        times.as_ptr(),
                        libc::AT_EMPTY_PATH,
                    ),
                    None => libc::utimensat(
                        self.proc_self_fd.as_raw_fd(),
                        proc_name.as_cstr().as_ptr(),
                        times.as_ptr(),
                        0,
                    ),
                }
            })?;
        }
        drop(caller);
        Ok((self.guest_ids(sys::stat_fd(&data_fd)?), self.timeout))
    }

    pub(super) fn readlink(&self, _ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        let data = self.inode(inode)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: readlinkat with an empty path reads the symlink the fd refers to.
        let n = unsafe {
            libc::readlinkat(
                data.fd()?.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        let n = cvt64(n as i64)? as usize;
        buf.truncate(n);
        Ok(buf)
    }

    pub(super) fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        check_entry_name(name, libc::EEXIST)?;
        let dir_fd = dir.fd()?;
        {
            let _creds = self.caller_creds(ctx)?;
            // SAFETY: both strings are NUL-terminated.
            cvt(unsafe { libc::symlinkat(linkname.as_ptr(), dir_fd.as_raw_fd(), name.as_ptr()) })?;
        }
        self.do_lookup(ctx, &dir, name)
    }

    pub(super) fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        check_entry_name(name, libc::EEXIST)?;
        let dir_fd = dir.fd()?;
        let mode = self.creation_mode(&dir, mode, umask);
        {
            let _creds = self.caller_creds(ctx)?;
            // SAFETY: NUL-terminated name, dir fd owned by the inode.
            cvt(unsafe {
                libc::mknodat(dir_fd.as_raw_fd(), name.as_ptr(), mode, rdev as libc::dev_t)
            })?;
        }
        self.do_lookup(ctx, &dir, name)
    }

    pub(super) fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        let dir = self.inode(parent)?;
        check_entry_name(name, libc::EEXIST)?;
        let dir_fd = dir.fd()?;
        let mode = self.creation_mode(&dir, mode, umask);
        {
            let _creds = self.caller_creds(ctx)?;
            // SAFETY: NUL-terminated name, dir fd owned by the inode.
            cvt(unsafe { libc::mkdirat(dir_fd.as_raw_fd(), name.as_ptr(), mode) })?;
        }
        self.do_lookup(ctx, &dir, name)
    }

    pub(super) fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        let dir = self.inode(parent)?;
        check_name(name)?;
        if is_dot_or_dotdot(name) {
            return Err(errno(libc::EISDIR));
        }
        let dir_fd = dir.fd()?;
        // As the caller: write access to the directory, and its sticky bit.
        let _caller = self.as_caller(ctx)?;
        // SAFETY: NUL-terminated name, dir fd owned by the inode.
        cvt(unsafe { libc::unlinkat(dir_fd.as_raw_fd(), name.as_ptr(), 0) }).map(|_| ())
    }

    pub(super) fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        let dir = self.inode(parent)?;
        check_name(name)?;
        match name.to_bytes() {
            b"." => return Err(errno(libc::EINVAL)),
            b".." => return Err(errno(libc::ENOTEMPTY)),
            _ => {}
        }
        let dir_fd = dir.fd()?;
        let _caller = self.as_caller(ctx)?;
        // SAFETY: NUL-terminated name, dir fd owned by the inode.
        cvt(unsafe { libc::unlinkat(dir_fd.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })
            .map(|_| ())
    }

    pub(super) fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        let od = self.inode(olddir)?;
        let nd = self.inode(newdir)?;
        check_entry_name(oldname, libc::EBUSY)?;
        check_entry_name(newname, libc::EBUSY)?;
        if !Arc::ptr_eq(&od.share, &nd.share) {
            return Err(errno(libc::EXDEV));
        }
        let (od_fd, nd_fd) = (od.fd()?, nd.fd()?);
        {
            let _caller = self.as_caller(ctx)?;
            sys::renameat2(&*od_fd, oldname, &*nd_fd, newname, flags)?;
        }
        if self.journal().is_some() {
            let old = FoundAt {
                parent: od.nodeid,
                name: oldname.to_bytes(),
            };
            let new = FoundAt {
                parent: nd.nodeid,
                name: newname.to_bytes(),
            };
            self.record_moved(old, &nd, &nd_fd, newname);
            if flags & libc::RENAME_EXCHANGE != 0 {
                self.record_moved(new, &od, &od_fd, oldname);
            }
        }
        Ok(())
    }

    /// The journal names each node by where it was found: the node the guest holds
    /// that a rename just moved from `from` to `name` in `dir` is recorded there now,
    /// if it was recorded at `from`
    /// ([`InodeStore::moved`](super::super::inodes::InodeStore::moved)). A name that
    /// changed again meanwhile (another request, the host) names another inode or
    /// none, and nothing is recorded.
    fn record_moved(&self, from: FoundAt, dir: &InodeData, dir_fd: &File, name: &CStr) {
        let Ok(file) = sys::openat(dir_fd, name, libc::O_PATH | libc::O_NOFOLLOW, 0) else {
            return;
        };
        let Ok((st, mnt_id)) = sys::stat_and_mount_id(&file) else {
            return;
        };
        let key = InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id,
        };
        if let Some(data) = self.inodes.lookup_key(&key) {
            if Arc::ptr_eq(&data.share, &dir.share) && Self::is_same_inode(&data, &file) {
                let to = FoundAt {
                    parent: dir.nodeid,
                    name: name.to_bytes(),
                };
                self.inodes.moved(&data, from, to);
            }
        }
    }

    pub(super) fn link(
        &self,
        ctx: &Context,
        inode: u64,
        newparent: u64,
        newname: &CStr,
    ) -> io::Result<Entry> {
        let data = self.inode(inode)?;
        let dir = self.inode(newparent)?;
        check_entry_name(newname, libc::EEXIST)?;
        if !Arc::ptr_eq(&data.share, &dir.share) {
            return Err(errno(libc::EXDEV));
        }
        let data_fd = data.fd()?;
        let dir_fd = dir.fd()?;
        let proc_name = ProcFdName::new(data_fd.as_raw_fd());
        {
            // As the caller: write access to the directory, and the host's
            // protected_hardlinks rule (own the file, or may read and write it).
            let _caller = self.as_caller(ctx)?;
            // SAFETY: linkat through the /proc/self/fd magic link of our own fd.
            cvt(unsafe {
                libc::linkat(
                    self.proc_self_fd.as_raw_fd(),
                    proc_name.as_cstr().as_ptr(),
                    dir_fd.as_raw_fd(),
                    newname.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })?;
        }
        self.do_lookup(ctx, &dir, newname)
    }

    pub(super) fn statfs(&self, _ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        let data = self.inode(inode)?;
        let mut out = MaybeUninit::<statvfs64>::zeroed();
        // SAFETY: fstatvfs fills `out`; the result is checked.
        cvt(unsafe { libc::fstatvfs64(data.fd()?.as_raw_fd(), out.as_mut_ptr()) })?;
        // SAFETY: fstatvfs succeeded.
        let mut st = unsafe { out.assume_init() };
        if data.share.read_only {
            st.f_flag |= libc::ST_RDONLY;
        }
        Ok(st)
    }

    pub(super) fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        let data = self.inode(inode)?;
        let data_fd = data.fd()?;
        let proc_name = ProcFdName::new(data_fd.as_raw_fd());
        // Without translation the guest's own ids (a forbidden one cannot be had
        // there); with it, as every identity-dependent call.
        let _creds = match self.translating {
            true => self.as_caller(ctx)?,
            false => self.caller_creds(ctx)?,
        };
        // faccessat2 with AT_EACCESS checks as the fs ids just switched to; plain
        // faccessat would check the daemon's real ids (root) and allow everything.
        // SAFETY: faccessat2 through the magic link of our own fd.
        cvt64(unsafe {
            libc::syscall(
                libc::SYS_faccessat2,
                self.proc_self_fd.as_raw_fd(),
                proc_name.as_cstr().as_ptr(),
                mask as libc::c_int,
                libc::AT_EACCESS,
            )
        })
        .map(|_| ())
    }
}
