//! Open files: open and create (never a FIFO or device node), read, write, sync,
//! allocate, seek, copy; the setuid bits a non-owner's write clears.

// The FUSE operations' own argument lists.
#![allow(clippy::too_many_arguments)]

use super::prelude::*;

impl PassthroughFs {
    /// CREATE: a new file (O_CREAT|O_EXCL, as the caller), or, where the name exists
    /// and the guest did not ask for O_EXCL, the existing file, if it is a regular
    /// file: an existing FIFO or device node is never opened. The guest's O_TRUNC
    /// applies to an existing file, with the setuid bits cleared when it asks.
    pub(super) fn create_or_open(
        &self,
        ctx: &Context,
        dir: &InodeData,
        name: &CStr,
        args: &CreateIn,
    ) -> io::Result<File> {
        let flags = self.host_open_flags(args.flags);
        // Before the switch: opening a node's file handle needs the daemon's own ids.
        let dir_fd = dir.fd()?;
        let mode = self.creation_mode(dir, args.mode, args.umask);
        let _creds = self.caller_creds(ctx)?;
        let exclusive = flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        // A name that disappears between EEXIST and the lookup is created anew; a few
        // rounds settle any race with another writer of the directory.
        for _ in 0..4 {
            match sys::openat(&dir_fd, name, exclusive, mode) {
                Err(e)
                    if e.raw_os_error() == Some(libc::EEXIST)
                        && args.flags as libc::c_int & libc::O_EXCL == 0 => {}
                other => return other,
            }
            let path_fd = match sys::openat(&dir_fd, name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                other => other?,
            };
            let st = sys::stat_fd(&path_fd)?;
            return match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => {
                    let file = self.reopen_fd(&path_fd, flags)?;
                    if flags & libc::O_TRUNC != 0 && args.fuse_flags & FOPEN_IN_KILL_SUIDGID != 0 {
                        // The bits as they are after the open: a caller without
                        // CAP_FSETID had them cleared by the truncating open already.
                        kill_suidgid_fd(file.as_raw_fd())?;
                    }
                    Ok(file)
                }
                libc::S_IFDIR => Err(errno(libc::EISDIR)),
                // open(O_CREAT) on a symlink we never follow, as O_NOFOLLOW would.
                libc::S_IFLNK => Err(errno(libc::ELOOP)),
                _ => Err(errno(libc::EBADF)),
            };
        }
        Err(errno(libc::EAGAIN))
    }

    /// Clears setuid, and setgid where group-execute is set, as Linux does when a
    /// process without CAP_FSETID writes, truncates or chowns a regular file (the
    /// daemon has it, so it must do this itself when the guest asks), on the inode
    /// whose `O_PATH` fd is `path_fd`, through `/proc/self/fd`.
    pub(super) fn kill_suidgid_path(&self, inode: &InodeData, path_fd: &File) -> io::Result<()> {
        if inode.file_type() != libc::S_IFREG {
            return Ok(());
        }
        let st = sys::stat_fd(path_fd)?;
        match suidgid_cleared(st.st_mode) {
            Some(mode) => {
                let name = ProcFdName::new(path_fd.as_raw_fd());
                // SAFETY: fchmodat through the magic link of our own fd.
                cvt(unsafe {
                    libc::fchmodat(
                        self.proc_self_fd.as_raw_fd(),
                        name.as_cstr().as_ptr(),
                        mode,
                        0,
                    )
                })
                .map(|_| ())
            }
            None => Ok(()),
        }
    }

    pub(super) fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        let data = self.inode(inode)?;
        if data.is_dir() && (flags as libc::c_int & libc::O_ACCMODE) != libc::O_RDONLY {
            return Err(errno(libc::EISDIR));
        }
        // EBADF for FIFOs, sockets and device nodes (see `reopen`). As the caller
        // with translation: the host checks its access (and O_TRUNC clears setuid).
        let file = self.reopen_as_caller(ctx, &data, self.host_open_flags(flags))?;
        if flags as libc::c_int & libc::O_TRUNC != 0
            && fuse_flags & FOPEN_IN_KILL_SUIDGID != 0
            && data.file_type() == libc::S_IFREG
        {
            kill_suidgid_fd(file.as_raw_fd())?;
        }
        let is_dir = data.is_dir();
        let fh = self.handles.insert(data, file)?;
        Ok((Some(fh), self.open_options(is_dir), None))
    }

    pub(super) fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        let dir = self.inode(parent)?;
        check_entry_name(name, libc::EISDIR)?;
        let file = self.create_or_open(ctx, &dir, name, &args)?;
        let (entry, fh) = self.register_open(&dir, file, name.to_bytes())?;
        Ok((entry, Some(fh), self.open_options(false), None))
    }

    pub(super) fn read(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        let h = self.handle(handle, inode)?;
        let share = &h.inode.share;
        // Reads go straight from the file into the guest's buffers (one preadv).
        let n = w.write_from(&mut HostFile::of(&h.file), size as usize, offset)?;
        ShareStats::add(&share.stats.bytes_read, n as u64);
        Ok(n)
    }

    pub(super) fn write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        _flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        let h = self.handle(handle, inode)?;
        let share = &h.inode.share;
        if fuse_flags & WRITE_KILL_PRIV != 0 && h.inode.file_type() == libc::S_IFREG {
            kill_suidgid_fd(h.file.as_raw_fd())?;
        }
        // As the caller with translation: a writer without CAP_FSETID has the host
        // clear setuid and setgid, whatever the guest's flags say.
        let caller = self.as_caller(ctx)?;
        // Writes go straight from the guest's buffers into the file (one pwritev).
        let n = r.read_to(&mut HostFile::of(&h.file), size as usize, offset)?;
        drop(caller);
        ShareStats::add(&share.stats.bytes_written, n as u64);
        Ok(n)
    }

    pub(super) fn flush(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        lock_owner: u64,
    ) -> io::Result<()> {
        let h = self.handle(handle, inode)?;
        // A process's close() drops all its POSIX locks on the file.
        self.release_owner_locks(inode, lock_owner);
        // close(dup(fd)) gives the host file system the close-time semantics (NFS
        // flushes, POSIX lock release) that the guest's close() expects.
        // SAFETY: dup of an fd we own; the new fd is closed at once.
        let fd = cvt(unsafe { libc::dup(h.file.as_raw_fd()) })?;
        // SAFETY: `fd` was just created and is owned here.
        cvt(unsafe { libc::close(fd) }).map(|_| ())
    }

    pub(super) fn fsync(
        &self,
        _ctx: &Context,
        inode: u64,
        datasync: bool,
        handle: u64,
    ) -> io::Result<()> {
        let h = self.handle(handle, inode)?;
        let fd = h.file.as_raw_fd();
        // SAFETY: fsync/fdatasync on an fd we own.
        cvt(unsafe {
            if datasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }
        })
        .map(|_| ())
    }

    pub(super) fn fallocate(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        let h = self.handle(handle, inode)?;
        // A change of the file's data: setuid cleared as for a write.
        let _caller = self.as_caller(ctx)?;
        // SAFETY: fallocate on an fd we own; the kernel validates mode and range.
        cvt(unsafe {
            libc::fallocate64(
                h.file.as_raw_fd(),
                mode as libc::c_int,
                offset as i64,
                length as i64,
            )
        })
        .map(|_| ())
    }

    pub(super) fn release(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
        handle: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.handles.remove(handle, inode)
    }

    pub(super) fn lseek(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        let h = self.handle(handle, inode)?;
        // SAFETY: lseek on an fd we own. The guest passes its own position: the host
        // fd's position is only used here and by pread/pwrite, which ignore it.
        let r = cvt64(unsafe {
            libc::lseek64(h.file.as_raw_fd(), offset as i64, whence as libc::c_int)
        })?;
        Ok(r as u64)
    }

    /// TMPFILE: an unnamed file in `parent`, created as the caller.
    pub(super) fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        args: CreateIn,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        let dir = self.inode(parent)?;
        let flags = self.host_open_flags(args.flags) | libc::O_TMPFILE;
        let dir_fd = dir.fd()?;
        let mode = self.creation_mode(&dir, args.mode, args.umask);
        let file = {
            let _creds = self.caller_creds(ctx)?;
            sys::openat(&dir_fd, c".", flags & !libc::O_NOFOLLOW, mode)?
        };
        let (entry, fh) = self.register_open(&dir, file, b"")?;
        Ok((entry, fh, self.open_options(false)))
    }

    pub(super) fn copy_file_range(&self, ctx: &Context, range: CopyRange) -> io::Result<usize> {
        let hin = self.handle(range.fh_in, range.nodeid_in)?;
        let hout = self.handle(range.fh_out, range.nodeid_out)?;
        if range.flags != 0 {
            return Err(errno(libc::EINVAL));
        }
        let mut oi = range.off_in as i64;
        let mut oo = range.off_out as i64;
        let len = range.len.min(isize::MAX as u64) as usize;
        // A write of the output file: setuid cleared as for a write.
        let _caller = self.as_caller(ctx)?;
        // SAFETY: both fds are owned by live handles; offsets are valid pointers.
        let n = unsafe {
            libc::copy_file_range(
                hin.file.as_raw_fd(),
                &mut oi,
                hout.file.as_raw_fd(),
                &mut oo,
                len,
                0,
            )
        };
        let n = cvt64(n as i64)? as usize;
        ShareStats::add(&hout.inode.share.stats.bytes_written, n as u64);
        Ok(n)
    }

    pub(super) fn syncfs(&self, _ctx: &Context, nodeid: u64) -> io::Result<()> {
        let inode = self.inode(nodeid)?;
        // EBADF on a FIFO, socket or device node: those are never opened.
        let f = self.reopen(&inode, libc::O_RDONLY | libc::O_NONBLOCK)?;
        // SAFETY: syncfs on an fd we own.
        cvt(unsafe { libc::syncfs(f.as_raw_fd()) }).map(|_| ())
    }
}

/// The mode with setuid (and setgid, if group-executable) cleared, or None when
/// nothing needs clearing.
fn suidgid_cleared(mode: u32) -> Option<u32> {
    let mut new = mode & 0o7777;
    if mode & libc::S_ISUID != 0 {
        new &= !libc::S_ISUID;
    }
    if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        new &= !libc::S_ISGID;
    }
    (new != mode & 0o7777).then_some(new)
}

/// [`PassthroughFs::kill_suidgid_path`] on an open regular file, by its mode now.
pub(super) fn kill_suidgid_fd(fd: libc::c_int) -> io::Result<()> {
    let st = sys::stat_fd(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    match suidgid_cleared(st.st_mode) {
        // SAFETY: fchmod on an fd we own.
        Some(mode) => cvt(unsafe { libc::fchmod(fd, mode) }).map(|_| ()),
        None => Ok(()),
    }
}
