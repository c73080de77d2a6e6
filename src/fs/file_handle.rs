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

/// Handles up to this size are kept inline (ext4, xfs, tmpfs and FUSE use 8–12 bytes);
/// larger ones (btrfs, overlayfs) go to the heap.
const INLINE_HANDLE: usize = 12;

/// The kernel's `MAX_HANDLE_SZ`.
const MAX_HANDLE_SZ: usize = 128;

/// The kernel's `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: libc::c_int,
    f_handle: [u8; MAX_HANDLE_SZ],
}

#[derive(Clone, Debug, Eq, PartialEq)]
enum HandleBytes {
    Inline { len: u8, bytes: [u8; INLINE_HANDLE] },
    Heap(Box<[u8]>),
}

/// An opaque file handle of a host inode.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct FileHandle {
    handle_type: libc::c_int,
    bytes: HandleBytes,
}

impl FileHandle {
    /// The handle of the inode `fd` refers to (an `O_PATH` fd works), without following
    /// a symlink. EOPNOTSUPP where the file system cannot make one.
    pub fn of(fd: &impl AsRawFd) -> io::Result<FileHandle> {
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
        let bytes = if len <= INLINE_HANDLE {
            let mut inline = [0u8; INLINE_HANDLE];
            inline[..len].copy_from_slice(&raw.f_handle[..len]);
            HandleBytes::Inline {
                len: len as u8,
                bytes: inline,
            }
        } else {
            HandleBytes::Heap(raw.f_handle[..len].into())
        };
        Ok(FileHandle {
            handle_type: raw.handle_type,
            bytes,
        })
    }

    fn as_bytes(&self) -> &[u8] {
        match &self.bytes {
            HandleBytes::Inline { len, bytes } => &bytes[..*len as usize],
            HandleBytes::Heap(b) => b,
        }
    }

    /// Opens the inode with `flags` (`O_CLOEXEC` is added), on the mount `mount_fd`
    /// is on. ESTALE once the inode is gone (unlinked and closed everywhere).
    pub fn open(&self, mount_fd: &impl AsRawFd, flags: libc::c_int) -> io::Result<File> {
        let src = self.as_bytes();
        let mut raw = RawHandle {
            handle_bytes: src.len() as u32,
            handle_type: self.handle_type,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        raw.f_handle[..src.len()].copy_from_slice(src);
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
}

/// What a node holds to reach its host inode.
pub enum InodeRef {
    Fd(File),
    Handle(FileHandle),
}

impl InodeRef {
    pub fn try_clone(&self) -> io::Result<InodeRef> {
        Ok(match self {
            InodeRef::Fd(f) => InodeRef::Fd(f.try_clone()?),
            InodeRef::Handle(h) => InodeRef::Handle(h.clone()),
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
            (InodeRef::Handle(a), InodeRef::Handle(b)) => a == b,
            _ => true,
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
    fn inline_and_heap_handles_compare_by_content() {
        let a = FileHandle {
            handle_type: 1,
            bytes: HandleBytes::Inline {
                len: 8,
                bytes: [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0],
            },
        };
        let mut b = a.clone();
        assert_eq!(a, b);
        b.handle_type = 2;
        assert_ne!(a, b, "the type is part of the handle");
        let heap = FileHandle {
            handle_type: 1,
            bytes: HandleBytes::Heap(vec![9u8; 20].into()),
        };
        assert_eq!(heap.as_bytes().len(), 20);
        assert_ne!(a, heap);
    }

    #[test]
    fn a_handle_reopens_its_inode_where_the_fs_supports_it() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("volfsd-fh-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let f = File::open(&path).unwrap();
        let h = match FileHandle::of(&f) {
            Ok(h) => h,
            // A temp dir on a file system without handles: nothing to check here.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                std::fs::remove_file(&path).unwrap();
                return;
            }
            Err(e) => panic!("name_to_handle_at: {e}"),
        };
        let mount = File::open(&dir).unwrap();
        match h.open(&mount, libc::O_PATH) {
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
