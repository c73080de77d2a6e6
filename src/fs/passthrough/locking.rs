//! POSIX locks and flock on the guest's handles (the tables are in `fs/locks.rs`).

use super::prelude::*;

impl PassthroughFs {
    /// Releases `owner`'s POSIX locks on `inode` (the guest process closed a file).
    pub(super) fn release_owner_locks(&self, inode: u64, owner: u64) {
        self.locks.release_owner(inode, owner);
    }

    pub(super) fn lock(
        &self,
        inode: u64,
        fh: u64,
        owner: u64,
        lock: &FileLock,
        lk_flags: u32,
        wait: bool,
    ) -> io::Result<()> {
        let h = self.handle(fh, inode)?;
        if lk_flags & FUSE_LK_FLOCK != 0 {
            let op = locks::flock_op(lock.lock_type, wait)?;
            // SAFETY: flock on an fd we own.
            let flock = || cvt(unsafe { libc::flock(h.file.as_raw_fd(), op) }).map(|_| ());
            if wait {
                self.locks.wait(&h.inode, flock)?;
            } else {
                flock()?;
            }
            h.set_flock(lock.lock_type as i32);
            return Ok(());
        }
        let fl = locks::to_flock(lock)?;
        let owner_file = self
            .locks
            .owner_file(&h, owner, |mode| self.reopen(&h.inode, mode))?;
        let cmd = if wait {
            libc::F_OFD_SETLKW
        } else {
            libc::F_OFD_SETLK
        };
        let set = || {
            let mut fl = fl;
            // SAFETY: fcntl with a valid flock struct on an fd we own.
            cvt(unsafe { libc::fcntl(owner_file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) })
                .map(|_| ())
        };
        if wait {
            self.locks.wait(&h.inode, set)?;
        } else {
            set()?;
        }
        self.locks.record(inode, owner, lock);
        Ok(())
    }

    pub(super) fn getlk(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        lk_flags: u32,
    ) -> io::Result<FileLock> {
        let h = self.handle(handle, inode)?;
        if lk_flags & FUSE_LK_FLOCK != 0 {
            // flock has no "test": the kernel never asks.
            return Err(errno(libc::EINVAL));
        }
        let mut fl = locks::to_flock(&lock)?;
        // Test on the owner's own lock file when it has one, so that its own locks
        // never show as conflicts (they are OFD locks of that file, not the handle's).
        let owner_file = self.locks.existing(inode, owner);
        let fd = owner_file
            .as_ref()
            .map(|f| f.as_raw_fd())
            .unwrap_or(h.file.as_raw_fd());
        // SAFETY: fcntl with a valid flock struct on an fd we own.
        cvt(unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl as *mut libc::flock) })?;
        Ok(locks::from_flock(&fl, &lock))
    }

    pub(super) fn setlk(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        lk_flags: u32,
    ) -> io::Result<()> {
        self.lock(inode, handle, owner, &lock, lk_flags, false)
    }

    pub(super) fn setlkw(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        lk_flags: u32,
    ) -> io::Result<()> {
        self.lock(inode, handle, owner, &lock, lk_flags, true)
    }
}
