//! How a node refers to its host inode: an `O_PATH` fd, or a file handle
//! (`name_to_handle_at`) that is opened again (`open_by_handle_at`) when a request
//! needs the inode. A handle costs no fd and does not keep an unlinked inode alive,
//! so a guest holding a million inodes holds no host fds for them
//! (`--inode-file-handles`, with virtiofsd's meaning).
//!
//! Handles are made by the daemon from fds it opened inside a share; none comes from
//! the guest, and none is handed to it. `open_by_handle_at` needs `CAP_DAC_READ_SEARCH`;
//! the mount fd it is given is an fd on the node's own mount inside the share, so the
//! reopened inode keeps that mount's flags (a read-only share stays read-only).

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use super::sys::{cvt, errno};

/// `--inode-file-handles`.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub enum FileHandleMode {
    /// One `O_PATH` fd per node (the default, as in virtiofsd).
    #[default]
    Never,
    /// A file handle per node where the file system gives one, an fd elsewhere.
    Prefer,
    /// A file handle per node; a file system without handles is refused.
    Mandatory,
}

/// The kernel's `MAX_HANDLE_SZ`.
const MAX_HANDLE_SZ: usize = 128;

/// The kernel's `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: libc::c_int,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// A file handle too large to keep inline, as `name_to_handle_at` made it.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct FileHandle {
    handle_type: libc::c_int,
    bytes: Box<[u8]>,
}

fn name_to_handle(fd: &impl AsRawFd) -> io::Result<(libc::c_int, [u8; MAX_HANDLE_SZ], usize)> {
    let mut raw = RawHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `raw` has room for MAX_HANDLE_SZ bytes as its header says; the empty
    // path with AT_EMPTY_PATH names the fd itself.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut raw as *mut RawHandle,
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        ) as libc::c_int
    })?;
    let len = raw.handle_bytes as usize;
    if len > MAX_HANDLE_SZ {
        return Err(errno(libc::EOVERFLOW));
    }
    Ok((raw.handle_type, raw.f_handle, len))
}

fn open_by_handle(
    mount_fd: &impl AsRawFd,
    handle_type: libc::c_int,
    bytes: &[u8],
    flags: libc::c_int,
) -> io::Result<File> {
    let mut raw = RawHandle {
        handle_bytes: bytes.len() as u32,
        handle_type,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    raw.f_handle[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `raw` is a valid file_handle of `handle_bytes` bytes; the returned fd
    // is checked and owned.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            &mut raw as *mut RawHandle,
            flags | libc::O_CLOEXEC,
        ) as libc::c_int
    })?;
    // SAFETY: `fd` was just returned by open_by_handle_at and nobody else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The file handle of the inode `fd` refers to, as (type, bytes): what the device
/// state carries.
pub fn raw_handle_of(fd: &impl AsRawFd) -> io::Result<(libc::c_int, Vec<u8>)> {
    let (handle_type, bytes, len) = name_to_handle(fd)?;
    Ok((handle_type, bytes[..len].to_vec()))
}

/// Opens a handle as [`raw_handle_of`] gave it, on the mount of `mount_fd`. A handle
/// from outside (a device state) can name any inode of that file system: the caller
/// checks where the inode is before it uses it.
pub fn open_raw_handle(
    mount_fd: &impl AsRawFd,
    handle_type: libc::c_int,
    bytes: &[u8],
    flags: libc::c_int,
) -> io::Result<File> {
    if bytes.is_empty() || bytes.len() > MAX_HANDLE_SZ {
        return Err(errno(libc::EINVAL));
    }
    open_by_handle(mount_fd, handle_type, bytes, flags)
}

/// Handles up to this size whose type fits a byte are kept inline in the node:
/// ext4 and xfs make 8 bytes, tmpfs and FUSE (s3fs, JuiceFS) 12. Larger ones
/// (btrfs, overlayfs) go to the heap.
const INLINE_HANDLE: usize = 12;

/// A file handle small enough to keep inline (16 bytes with the enum's tag).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct SmallHandle {
    handle_type: u8,
    len: u8,
    bytes: [u8; INLINE_HANDLE],
}

/// What a node holds to reach its host inode. A million of these are held by a guest
/// that holds a million inodes, so it is kept to 16 bytes.
#[derive(Debug)]
pub enum InodeRef {
    Fd(File),
    Small(SmallHandle),
    Big(Box<FileHandle>),
}

impl InodeRef {
    /// The file handle of the inode `fd` refers to (an `O_PATH` fd works), without
    /// following a symlink. EOPNOTSUPP where the file system cannot make one.
    pub fn handle_of(fd: &impl AsRawFd) -> io::Result<InodeRef> {
        let (handle_type, bytes, len) = name_to_handle(fd)?;
        Ok(match u8::try_from(handle_type) {
            Ok(t) if len <= INLINE_HANDLE => {
                let mut inline = [0u8; INLINE_HANDLE];
                inline[..len].copy_from_slice(&bytes[..len]);
                InodeRef::Small(SmallHandle {
                    handle_type: t,
                    len: len as u8,
                    bytes: inline,
                })
            }
            _ => InodeRef::Big(Box::new(FileHandle {
                handle_type,
                bytes: bytes[..len].into(),
            })),
        })
    }

    /// Opens a node kept by handle with `flags` (`O_CLOEXEC` is added), on the mount
    /// `mount_fd` is on (not an `O_PATH` fd: the kernel refuses those there). ESTALE
    /// once the inode is gone (unlinked and closed everywhere); EBADF for a node kept
    /// by fd (callers use the fd).
    pub fn open_handle(&self, mount_fd: &impl AsRawFd, flags: libc::c_int) -> io::Result<File> {
        match self {
            InodeRef::Fd(_) => Err(errno(libc::EBADF)),
            InodeRef::Small(h) => open_by_handle(
                mount_fd,
                libc::c_int::from(h.handle_type),
                &h.bytes[..h.len as usize],
                flags,
            ),
            InodeRef::Big(h) => open_by_handle(mount_fd, h.handle_type, &h.bytes, flags),
        }
    }

    /// The file handle's type and bytes (None: a node kept by fd).
    pub fn handle_bytes(&self) -> Option<(libc::c_int, &[u8])> {
        match self {
            InodeRef::Fd(_) => None,
            InodeRef::Small(h) => {
                Some((libc::c_int::from(h.handle_type), &h.bytes[..h.len as usize]))
            }
            InodeRef::Big(h) => Some((h.handle_type, &h.bytes)),
        }
    }

    pub fn try_clone(&self) -> io::Result<InodeRef> {
        Ok(match self {
            InodeRef::Fd(f) => InodeRef::Fd(f.try_clone()?),
            InodeRef::Small(h) => InodeRef::Small(*h),
            InodeRef::Big(h) => InodeRef::Big(h.clone()),
        })
    }

    /// Whether this node keeps a host fd open (counted against the fd budget).
    pub fn holds_fd(&self) -> bool {
        matches!(self, InodeRef::Fd(_))
    }

    /// Whether `self` and `other`, which have the same (dev, ino, mount), are the same
    /// inode. A held fd keeps its inode alive, so its number cannot be reused; two
    /// handles differ when the number was reused by a new inode (its generation).
    pub fn same_inode(&self, other: &InodeRef) -> bool {
        match (self, other) {
            (InodeRef::Fd(_), _) | (_, InodeRef::Fd(_)) => true,
            (InodeRef::Small(a), InodeRef::Small(b)) => a == b,
            (InodeRef::Big(a), InodeRef::Big(b)) => a == b,
            _ => false,
        }
    }
}

/// An `O_PATH` fd of a node for the length of one request: borrowed from the node,
/// or opened from its handle and closed when dropped.
pub enum InodeFd<'a> {
    Borrowed(&'a File),
    Owned(File),
}

impl Deref for InodeFd<'_> {
    type Target = File;
    fn deref(&self) -> &File {
        match self {
            InodeFd::Borrowed(f) => f,
            InodeFd::Owned(f) => f,
        }
    }
}

impl AsRawFd for InodeFd<'_> {
    fn as_raw_fd(&self) -> RawFd {
        self.deref().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reference_stays_16_bytes() {
        assert_eq!(std::mem::size_of::<InodeRef>(), 16);
    }

    #[test]
    fn handles_compare_by_type_and_content() {
        let small = |t: u8, b: u8| {
            InodeRef::Small(SmallHandle {
                handle_type: t,
                len: 8,
                bytes: [b; INLINE_HANDLE],
            })
        };
        assert!(small(1, 1).same_inode(&small(1, 1)));
        assert!(
            !small(1, 1).same_inode(&small(2, 1)),
            "the type is part of it"
        );
        assert!(!small(1, 1).same_inode(&small(1, 2)));
        let big = InodeRef::Big(Box::new(FileHandle {
            handle_type: 1,
            bytes: vec![1u8; 20].into(),
        }));
        assert!(!big.same_inode(&small(1, 1)));
        assert!(big.same_inode(&big.try_clone().unwrap()));
    }

    #[test]
    fn a_handle_reopens_its_inode_where_the_fs_supports_it() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("volfsd-fh-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let f = File::open(&path).unwrap();
        let h = match InodeRef::handle_of(&f) {
            Ok(h) => h,
            // A temp dir on a file system without handles: nothing to check here.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                std::fs::remove_file(&path).unwrap();
                return;
            }
            Err(e) => panic!("name_to_handle_at: {e}"),
        };
        let mount = File::open(&dir).unwrap();
        match h.open_handle(&mount, libc::O_PATH) {
            Ok(g) => {
                let (a, b) = (
                    super::super::sys::stat_fd(&f).unwrap(),
                    super::super::sys::stat_fd(&g).unwrap(),
                );
                assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
            }
            // Not root (no CAP_DAC_READ_SEARCH): the daemon then keeps fds.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
        }
        std::fs::remove_file(&path).unwrap();
    }
}
