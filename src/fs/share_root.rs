//! Opening a share's root: validating the configured path and giving the daemon a
//! private mount of it.
//!
//! Each share is reached only through a detached clone of its directory
//! (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`), marked `nodev,nosuid` by
//! `mount_setattr`, and read-only for a read-only share. So:
//! - the kernel refuses writes to a read-only share even if the daemon's own check
//!   (`readonly.rs`) had a bug;
//! - a device node in a share cannot be opened through the daemon even if its own
//!   check (only regular files and directories are opened) had a bug;
//! - `..` at the clone's root stays at the root, whatever a request says;
//! - rename and link between shares fail with EXDEV from the kernel too.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Component, Path, PathBuf};

use super::sys::cvt64;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// A share directory, validated against SharedDir.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct SharePath {
    /// Components relative to SharedDir: where the directory is on the host (a volume
    /// in the guest is named by its `ShareSpec::guest` path, which may differ).
    pub rel: Vec<String>,
    /// The absolute host path (SharedDir joined with `rel`).
    pub host: PathBuf,
}

impl SharePath {
    pub fn rel_string(&self) -> String {
        self.rel.join("/")
    }

    /// Whether one of the two paths lies inside (or is) the other.
    pub fn overlaps(&self, other: &SharePath) -> bool {
        let n = self.rel.len().min(other.rel.len());
        self.rel[..n] == other.rel[..n]
    }
}

/// Why a share's path was refused; the caller names the path and the flag or request
/// (`--allowed-dir PATH: ...`, `path PATH: ...`).
#[derive(Debug)]
pub enum SharePathError {
    Empty,
    DotDot,
    NotInside {
        shared_dir: PathBuf,
    },
    NotUtf8,
    NotPlain,
    IsSharedDir,
    Missing,
    /// stat or canonicalize failed otherwise.
    Host(io::Error),
    Symlink,
    NotADirectory,
    /// It resolves elsewhere than written, through a symlink on the way.
    ResolvesTo(PathBuf),
}

impl std::fmt::Display for SharePathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SharePathError::Empty => write!(f, "empty path"),
            SharePathError::DotDot => write!(f, "names '..'"),
            SharePathError::NotInside { shared_dir } => {
                write!(f, "is not inside SharedDir {}", shared_dir.display())
            }
            SharePathError::NotUtf8 => write!(f, "is not valid UTF-8"),
            SharePathError::NotPlain => write!(f, "is not a plain path inside SharedDir"),
            SharePathError::IsSharedDir => write!(
                f,
                "is SharedDir itself (use --readonly for a read-only whole share)"
            ),
            SharePathError::Missing => write!(f, "does not exist"),
            SharePathError::Host(e) => write!(f, "{e}"),
            SharePathError::Symlink => write!(f, "is a symlink"),
            SharePathError::NotADirectory => write!(f, "is not a directory"),
            SharePathError::ResolvesTo(to) => write!(
                f,
                "resolves through a symlink to {} (must resolve inside SharedDir as written)",
                to.display()
            ),
        }
    }
}

impl std::error::Error for SharePathError {}

/// Validates `path` (absolute, or relative to `shared_dir`, which must be canonical):
/// it names no `..`, contains no symlink between SharedDir and its end, lies strictly
/// inside SharedDir, exists, and is a directory. Errors name the reason.
pub fn resolve_share_path(shared_dir: &Path, path: &Path) -> Result<SharePath, SharePathError> {
    resolve_share_path_in(shared_dir, shared_dir, path)
}

/// [`resolve_share_path`] for a daemon whose SharedDir is now reached at `local_root`
/// (its root "/" inside the sandbox): paths are still named as on the host, under
/// `shared_dir`, and checked where the daemon sees them.
pub fn resolve_share_path_in(
    shared_dir: &Path,
    local_root: &Path,
    path: &Path,
) -> Result<SharePath, SharePathError> {
    if path.as_os_str().is_empty() {
        return Err(SharePathError::Empty);
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(SharePathError::DotDot);
    }
    let rel_path = if path.is_absolute() {
        match path.strip_prefix(shared_dir) {
            Ok(r) => r.to_path_buf(),
            Err(_) => {
                let shared_dir = shared_dir.to_path_buf();
                return Err(SharePathError::NotInside { shared_dir });
            }
        }
    } else {
        path.to_path_buf()
    };
    let mut rel = Vec::new();
    for c in rel_path.components() {
        match c {
            Component::Normal(s) => {
                rel.push(s.to_str().ok_or(SharePathError::NotUtf8)?.to_string())
            }
            Component::CurDir => {}
            _ => return Err(SharePathError::NotPlain),
        }
    }
    if rel.is_empty() {
        return Err(SharePathError::IsSharedDir);
    }
    let host = rel.iter().fold(shared_dir.to_path_buf(), |p, c| p.join(c));
    let local = rel.iter().fold(local_root.to_path_buf(), |p, c| p.join(c));
    let meta = std::fs::symlink_metadata(&local).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => SharePathError::Missing,
        _ => SharePathError::Host(e),
    })?;
    if meta.file_type().is_symlink() {
        return Err(SharePathError::Symlink);
    }
    if !meta.is_dir() {
        return Err(SharePathError::NotADirectory);
    }
    let canonical = local.canonicalize().map_err(SharePathError::Host)?;
    if canonical != local {
        return Err(SharePathError::ResolvesTo(canonical));
    }
    Ok(SharePath { rel, host })
}

/// Opens the share directory beneath SharedDir without following any symlink, then
/// gives the daemon its own detached `nodev,nosuid` mount of it, read-only when asked.
pub fn open_share_root(shared_dir: &File, rel: &[String], read_only: bool) -> io::Result<File> {
    private_mount(&open_share_dir(shared_dir, rel)?, read_only)
}

/// The first half of [`open_share_root`]: the share directory, opened beneath
/// SharedDir without following any symlink. Its errors keep their errno, for
/// [`changed_since_checked`].
pub fn open_share_dir(shared_dir: &File, rel: &[String]) -> io::Result<File> {
    open_beneath(shared_dir, rel)
}

/// What a path that [`resolve_share_path`] accepted has become, judged by the error
/// [`open_share_dir`] then gave: the host changed it in between (the checks walk the
/// path by name; the open is what counts). None for any other error.
pub fn changed_since_checked(e: &io::Error) -> Option<&'static str> {
    match e.raw_os_error()? {
        // openat2 with RESOLVE_NO_SYMLINKS, on the path or a directory on its way.
        libc::ELOOP => Some("it is now a symlink (or a directory on its way is)"),
        libc::ENOENT => Some("it no longer exists"),
        // The openat fallback, which opens O_DIRECTORY|O_NOFOLLOW, says this for a
        // symlink too.
        libc::ENOTDIR => Some("it is no longer a directory (a symlink or another file)"),
        _ => None,
    }
}

/// The second half of [`open_share_root`]: the daemon's own detached `nodev,nosuid`
/// mount of `dir`, read-only when asked.
pub fn private_mount(dir: &File, read_only: bool) -> io::Result<File> {
    let clone = clone_mount(dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("open_tree(OPEN_TREE_CLONE) of the share (needs CAP_SYS_ADMIN): {e}"),
        )
    })?;
    let mut attrs = MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID;
    if read_only {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    set_mount_attrs(&clone, attrs).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "mount_setattr(nodev,nosuid{}): {e}",
                if read_only { ",ro" } else { "" }
            ),
        )
    })?;
    Ok(clone)
}

/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, falling back to one
/// `openat(O_NOFOLLOW)` per component where openat2 is missing.
fn open_beneath(root: &File, rel: &[String]) -> io::Result<File> {
    if rel.is_empty() {
        return root.try_clone();
    }
    let joined = CString::new(rel.join("/")).map_err(|_| io::Error::other("NUL in path"))?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: valid path and `how` struct of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            joined.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    match cvt64(ret) {
        // SAFETY: a new fd owned by the File.
        Ok(fd) => return Ok(unsafe { File::from_raw_fd(fd as i32) }),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {}
        Err(e) => return Err(e),
    }
    let mut cur = root.try_clone()?;
    for c in rel {
        let name = CString::new(c.as_str()).map_err(|_| io::Error::other("NUL in path"))?;
        cur = super::sys::openat(
            &cur,
            &name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
    }
    Ok(cur)
}

fn clone_mount(dir: &File) -> io::Result<File> {
    // SAFETY: open_tree on an fd we own with an empty path; the new fd is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::AT_RECURSIVE as libc::c_uint
                | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    let fd = cvt64(ret)?;
    // SAFETY: a new fd owned by the File.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

fn set_mount_attrs(mount: &File, attrs: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr on a detached mount fd we own, with a valid attr struct.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    cvt64(ret).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("volfsd-sr-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p.canonicalize().unwrap()
    }

    #[test]
    fn resolves_relative_absolute_and_nested() {
        let sd = tmp("ok");
        std::fs::create_dir_all(sd.join("rw/vol-a")).unwrap();
        let p = resolve_share_path(&sd, Path::new("rw/vol-a")).unwrap();
        assert_eq!(p.rel, vec!["rw", "vol-a"]);
        let p = resolve_share_path(&sd, &sd.join("rw")).unwrap();
        assert_eq!(p.rel, vec!["rw"]);
        std::fs::remove_dir_all(&sd).unwrap();
    }

    #[test]
    fn rejects_with_reasons() {
        let sd = tmp("bad");
        std::fs::create_dir(sd.join("d")).unwrap();
        std::fs::write(sd.join("f"), b"").unwrap();
        std::os::unix::fs::symlink("d", sd.join("l")).unwrap();
        std::os::unix::fs::symlink("/etc", sd.join("d/etc")).unwrap();
        let err = |p: &str| {
            resolve_share_path(&sd, Path::new(p))
                .unwrap_err()
                .to_string()
        };
        assert!(err("missing").contains("does not exist"));
        assert!(err("f").contains("not a directory"));
        assert!(err("l").contains("symlink"));
        assert!(err("d/etc").contains("symlink"));
        assert!(err("d/../d").contains(".."));
        assert!(err("/etc").contains("not inside"));
        assert!(err(".").contains("SharedDir itself"));
        std::fs::remove_dir_all(&sd).unwrap();
    }

    #[test]
    fn overlap_is_prefix_on_components() {
        let a = SharePath {
            rel: vec!["rw".into()],
            host: PathBuf::new(),
        };
        let b = SharePath {
            rel: vec!["rw".into(), "x".into()],
            host: PathBuf::new(),
        };
        let c = SharePath {
            rel: vec!["rw2".into()],
            host: PathBuf::new(),
        };
        assert!(a.overlaps(&b) && b.overlaps(&a) && a.overlaps(&a));
        assert!(!a.overlaps(&c));
    }

    #[test]
    fn clone_is_nodev_even_for_a_read_write_share() {
        let sd = tmp("nodev");
        std::fs::create_dir(sd.join("v")).unwrap();
        let node = std::ffi::CString::new(sd.join("v/null").to_str().unwrap()).unwrap();
        // SAFETY: mknod of /dev/null's numbers at a valid path.
        let made =
            unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        assert_eq!(made, 0, "mknod: {}", io::Error::last_os_error());
        let root = File::open(&sd).unwrap();
        let clone = open_share_root(&root, &["v".to_string()], false).unwrap();
        let err = super::super::sys::openat(&clone, c"null", libc::O_RDWR, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));
        std::fs::remove_dir_all(&sd).unwrap();
    }

    #[test]
    fn a_checked_path_changed_before_its_open_is_named() {
        let sd = tmp("changed");
        let root = File::open(&sd).unwrap();
        let rel = ["v".to_string()];
        let why = |rel: &[String]| {
            let e = open_share_dir(&root, rel).unwrap_err();
            changed_since_checked(&e).unwrap_or_else(|| panic!("not a change: {e}"))
        };
        assert!(why(&rel).contains("no longer exists"));
        std::os::unix::fs::symlink("/", sd.join("v")).unwrap();
        assert!(why(&rel).contains("symlink"));
        std::fs::remove_file(sd.join("v")).unwrap();
        std::fs::write(sd.join("v"), b"").unwrap();
        assert!(why(&rel).contains("no longer a directory"));
        std::fs::remove_file(sd.join("v")).unwrap();
        // A symlink on the way.
        std::fs::create_dir(sd.join("real")).unwrap();
        std::fs::create_dir(sd.join("real/w")).unwrap();
        std::os::unix::fs::symlink("real", sd.join("v")).unwrap();
        assert!(why(&["v".to_string(), "w".to_string()]).contains("symlink"));
        // Another error is not a change of the path.
        assert_eq!(
            changed_since_checked(&io::Error::from_raw_os_error(libc::EPERM)),
            None
        );
        std::fs::remove_dir_all(&sd).unwrap();
    }

    #[test]
    fn read_only_clone_refuses_writes_in_the_kernel() {
        let sd = tmp("ro");
        std::fs::create_dir(sd.join("v")).unwrap();
        let root = File::open(&sd).unwrap();
        let clone = open_share_root(&root, &["v".to_string()], true).unwrap();
        let err = super::super::sys::openat(&clone, c"new", libc::O_CREAT | libc::O_WRONLY, 0o644)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        assert!(!sd.join("v/new").exists());
        std::fs::remove_dir_all(&sd).unwrap();
    }
}
