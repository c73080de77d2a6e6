//! Directories: open, list (getdents64, READDIRPLUS lookups), sync, release.

use std::cell::RefCell;

use super::prelude::*;

thread_local! {
    /// A worker's getdents64 buffer, kept between READDIRs.
    static DIRENTS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl PassthroughFs {
    pub(super) fn do_readdir(
        &self,
        nodeid: u64,
        fh: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, &HandleData) -> io::Result<usize>,
    ) -> io::Result<()> {
        // The node and handle first: a bogus one is refused whatever the size.
        let h = self.handle(fh, nodeid)?;
        if size == 0 {
            return Ok(());
        }
        let _guard = h.dir_lock.lock().unwrap();
        // SAFETY: lseek on an fd we own; the result is checked.
        cvt64(unsafe { libc::lseek64(h.file.as_raw_fd(), offset as i64, libc::SEEK_SET) })?;
        // The worker's own buffer, zeroed once, not per request.
        DIRENTS.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize((size as usize).clamp(1024, 64 * 1024), 0);
            loop {
                let n = sys::getdents64(&h.file, &mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                for entry in sys::Dirents::new(&buf[..n]) {
                    let entry = entry?;
                    let next = entry.offset;
                    if add_entry(entry, &h)? == 0 {
                        // The reply buffer is full; the guest continues from `offset`
                        // later.
                        return Ok(());
                    }
                    h.dir_offset.store(next, Ordering::Relaxed);
                }
            }
        })
    }

    pub(super) fn opendir(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        let data = self.inode(inode)?;
        if !data.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        // As the caller with translation: the host checks its read access.
        let file = self.reopen_as_caller(
            ctx,
            &data,
            (self.host_open_flags(flags) & !libc::O_ACCMODE) | libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        let fh = self.handles.insert(data, file)?;
        Ok((Some(fh), self.open_options(true)))
    }

    pub(super) fn readdir(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.do_readdir(inode, handle, size, offset, &mut |e, _| add_entry(e))
    }

    pub(super) fn readdirplus(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.do_readdir(inode, handle, size, offset, &mut |e, h| {
            let name = e.name;
            if name == b"." || name == b".." {
                // The kernel links no dentry for these; a zero node id takes no reference.
                return add_entry(e, Entry::default());
            }
            // The name with its NUL, on the stack (a host name is at most 255 bytes).
            let mut with_nul = [0u8; 256];
            if let Some(b) = with_nul.get_mut(..name.len()) {
                b.copy_from_slice(name);
            }
            let cname = with_nul
                .get(..=name.len())
                .and_then(|b| CStr::from_bytes_with_nul(b).ok())
                .ok_or_else(|| errno(libc::EIO))?;
            let entry = match self.do_lookup(ctx, &h.inode, cname) {
                Ok(entry) => entry,
                // Gone since getdents: skip it, as if it had not been listed.
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(1),
                Err(err) => return Err(err),
            };
            let nodeid = entry.inode;
            let n = add_entry(e, entry)?;
            if n == 0 {
                // Not sent: give back the reference the lookup took.
                self.inodes.forget(nodeid, 1);
            }
            Ok(n)
        })
    }

    pub(super) fn fsyncdir(
        &self,
        ctx: &Context,
        inode: u64,
        datasync: bool,
        handle: u64,
    ) -> io::Result<()> {
        self.fsync(ctx, inode, datasync, handle)
    }

    pub(super) fn releasedir(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
        handle: u64,
    ) -> io::Result<()> {
        self.handles.remove(handle, inode)
    }
}
