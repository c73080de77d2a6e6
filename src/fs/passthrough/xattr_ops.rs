//! Extended attributes, within the namespaces `fs/xattrs.rs` allows.

use super::prelude::*;

impl PassthroughFs {
    pub(super) fn xattr_file(&self, inode: &InodeData) -> io::Result<File> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        match inode.file_type() {
            libc::S_IFREG | libc::S_IFDIR => self.reopen(inode, libc::O_RDONLY | libc::O_NONBLOCK),
            // xattrs of special files and symlinks would need a path-based call.
            _ => Err(errno(libc::ENOTSUP)),
        }
    }

    /// Without `--xattr`, ENOSYS before anything else, whatever the name: the guest
    /// kernel then stops asking (it asked for `security.capability` before every
    /// write, one request more per written file, while a hidden name got ENODATA).
    fn xattrs_served(&self) -> io::Result<()> {
        if self.cfg.xattr {
            Ok(())
        } else {
            Err(errno(libc::ENOSYS))
        }
    }

    pub(super) fn setxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.xattrs_served()?;
        let data = self.inode(inode)?;
        xattrs::check_write(name, self.cfg.privileged_xattrs)?;
        let f = self.xattr_file(&data)?;
        // As the caller: only the owner may change a POSIX ACL, and only a writer a
        // user.* attribute (the switch drops the daemon's CAP_FOWNER for the call);
        // with translation, `trusted.*` and `security.*` as the host decides for it.
        let _caller = self.as_caller_for_xattrs(ctx)?;
        // SAFETY: valid name and value buffer.
        cvt(unsafe {
            libc::fsetxattr(
                f.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr() as *const libc::c_void,
                value.len(),
                flags as libc::c_int,
            )
        })
        .map(|_| ())
    }

    pub(super) fn getxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        self.xattrs_served()?;
        let data = self.inode(inode)?;
        if xattrs::is_hidden(name.to_bytes(), self.cfg.privileged_xattrs) {
            return Err(errno(libc::ENODATA));
        }
        let f = self.xattr_file(&data)?;
        // The size comes from the guest: no value is larger than XATTR_SIZE_MAX, so a
        // larger buffer is never needed (Linux clamps the same way).
        let mut buf = vec![0u8; xattrs::clamp_size(size)];
        // As the caller with translation: reading `user.*` needs read access.
        let caller = self.as_caller(ctx)?;
        // SAFETY: `buf` is valid for its length (an empty one asks the size).
        let n = unsafe {
            libc::fgetxattr(
                f.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        };
        drop(caller);
        let n = cvt64(n as i64)? as usize;
        if size == 0 {
            Ok(GetxattrReply::Count(n as u32))
        } else {
            buf.truncate(n);
            Ok(GetxattrReply::Value(buf))
        }
    }

    pub(super) fn listxattr(
        &self,
        ctx: &Context,
        inode: u64,
        size: u32,
    ) -> io::Result<ListxattrReply> {
        let data = self.inode(inode)?;
        let f = self.xattr_file(&data)?;
        // The host list is read whole (bounded by XATTR_LIST_MAX), hidden names are
        // taken out, and the guest's size is checked against what is left.
        let mut buf = vec![0u8; xattrs::LIST_MAX];
        let caller = self.as_caller(ctx)?;
        // SAFETY: `buf` is valid for its length.
        let n = unsafe {
            libc::flistxattr(
                f.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        drop(caller);
        let n = cvt64(n as i64)? as usize;
        buf.truncate(n);
        let names = xattrs::visible_names(&buf, self.cfg.privileged_xattrs);
        if size == 0 {
            Ok(ListxattrReply::Count(names.len() as u32))
        } else if names.len() > size as usize {
            Err(errno(libc::ERANGE))
        } else {
            Ok(ListxattrReply::Names(names))
        }
    }

    pub(super) fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        self.xattrs_served()?;
        let data = self.inode(inode)?;
        xattrs::check_write(name, self.cfg.privileged_xattrs)?;
        let f = self.xattr_file(&data)?;
        let _caller = self.as_caller_for_xattrs(ctx)?;
        // SAFETY: valid NUL-terminated name.
        cvt(unsafe { libc::fremovexattr(f.as_raw_fd(), name.as_ptr()) }).map(|_| ())
    }
}
