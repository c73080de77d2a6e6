//! Whose identity a host call runs as: the guest's ids as the host sees them, the
//! caller's host credentials for translated callers, and a new entry's mode.

use super::prelude::*;
use super::*;

impl PassthroughFs {
    /// The mode a new entry in `dir` is created with. Without POSIX ACLs the guest
    /// kernel has applied its umask already (applying it again changes nothing). With
    /// them it sends the mode unmasked (FUSE_DONT_MASK) and the umask applies only
    /// where the directory has no default ACL, as the guest's own kernel would do; the
    /// host file system, at umask 0, then inherits the default ACL itself.
    pub(super) fn creation_mode(&self, dir: &InodeData, mode: u32, umask: u32) -> u32 {
        if self.acl.load(Ordering::Relaxed) && self.has_default_acl(dir) {
            mode
        } else {
            mode & !umask
        }
    }

    pub(super) fn has_default_acl(&self, dir: &InodeData) -> bool {
        let Ok(f) = self.reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK) else {
            return false;
        };
        // SAFETY: a NUL-terminated name; a zero-size query writes nothing.
        let n = unsafe {
            libc::fgetxattr(
                f.as_raw_fd(),
                c"system.posix_acl_default".as_ptr(),
                std::ptr::null_mut(),
                0,
            )
        };
        n > 0
    }

    /// `st` with its owner and group as the guest sees them (`--translate-uid/gid`).
    pub(super) fn guest_ids(&self, mut st: stat64) -> stat64 {
        st.st_uid = self.cfg.uids.to_guest(st.st_uid);
        st.st_gid = self.cfg.gids.to_guest(st.st_gid);
        st
    }

    /// Takes on the guest caller's ids, translated to the host's, for a call that
    /// creates or changes what the caller owns; EPERM for a forbidden guest id.
    pub(super) fn caller_creds(&self, ctx: &Context) -> io::Result<Option<FsCredsGuard>> {
        let uid = self.cfg.uids.to_host(ctx.uid)?;
        let gid = self.cfg.gids.to_host(ctx.gid)?;
        if self.translating {
            FsCredsGuard::switch_translated(uid, gid)
        } else {
            Ok(FsCredsGuard::switch(uid, gid))
        }
    }

    /// The identity a host call whose outcome depends on who asks runs with (SETATTR,
    /// OPEN, WRITE and what else clears setuid bits, links, renames, removals, xattrs,
    /// lookups and directory opens).
    ///
    /// With `--translate-uid/gid` the guest kernel's permission checks are its own (its
    /// root may do anything), so only the daemon can stand for the host's rules: the
    /// call runs as the caller's translated host ids, without supplementary groups,
    /// and the host kernel decides as it would for that user, in the call itself (no
    /// check that a change could race). A non-root fsuid has no CAP_CHOWN,
    /// CAP_DAC_OVERRIDE, CAP_FOWNER or CAP_FSETID, so it cannot chmod or chown what it
    /// does not own, write what it may not write, or keep setuid bits across a write.
    /// A guest id that may not own anything (`forbid-guest`) acts as [`OVERFLOW_ID`].
    ///
    /// Without translation: None, the daemon's own identity, as in virtiofsd (the
    /// guest's root is the host's root; see docs/SECURITY.md).
    pub(super) fn as_caller(&self, ctx: &Context) -> io::Result<Option<FsCredsGuard>> {
        if !self.translating {
            return Ok(None);
        }
        let uid = self.cfg.uids.to_host(ctx.uid).unwrap_or(OVERFLOW_ID);
        let gid = self.cfg.gids.to_host(ctx.gid).unwrap_or(OVERFLOW_ID);
        FsCredsGuard::switch_translated(uid, gid)
    }

    /// [`Self::as_caller`] for an xattr change: `trusted.*` and `security.*` are
    /// decided by CAP_SYS_ADMIN and CAP_SETFCAP, which an fsuid switch leaves in place,
    /// so a translated caller who is not host root has them lowered too.
    /// A forbidden guest id gets EPERM, as for a create.
    pub(super) fn as_caller_for_xattrs(&self, ctx: &Context) -> io::Result<XattrCaller> {
        let creds = self.caller_creds(ctx)?;
        let lowered = if self.translating && self.cfg.uids.to_host(ctx.uid).ok() != Some(0) {
            EffectiveLowered::lower(CapSet::of(&[CAP_SYS_ADMIN, CAP_SETFCAP]))?
        } else {
            None
        };
        Ok(XattrCaller {
            _lowered: lowered,
            _creds: creds,
        })
    }

    /// Reopens `inode` with real open flags as the caller ([`Self::as_caller`]): the
    /// `O_PATH` fd is had first with the daemon's own rights (opening a file handle
    /// needs CAP_DAC_READ_SEARCH), then the magic link is opened as the caller, so
    /// the host checks the caller's access to the file.
    pub(super) fn reopen_as_caller(
        &self,
        ctx: &Context,
        inode: &InodeData,
        flags: libc::c_int,
    ) -> io::Result<File> {
        if !self.translating {
            return self.reopen(inode, flags);
        }
        check_openable(inode)?;
        let path_fd = inode.fd()?;
        let _caller = self.as_caller(ctx)?;
        self.reopen_fd(&*path_fd, flags)
    }
}
