//! The vhost-user socket: made from --socket-path (a stale socket replaced, any
//! other file refused, the mode and group set) or taken from --fd (checked to be a
//! socket), and the socket file removed at exit only while it is still ours.

use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use vhost::vhost_user::Listener;

use super::DaemonError;
use crate::config::SocketSource;

/// A socket file this daemon bound, removed when it exits (by its directory's fd and
/// its name: the root may have changed since): only while it is still
/// that very file (device and inode as bound). Another daemon may have bound the
/// same path since (cloud-hypervisor's restore and migrations name one socket path
/// for the source's back-end and the destination's): its file is left alone.
pub(super) struct SocketFile {
    dir: std::fs::File,
    name: std::ffi::CString,
    bound: Option<(libc::dev_t, libc::ino_t)>,
}

impl SocketFile {
    /// Called right after the bind: the file found now is ours.
    pub(super) fn open(path: &Path) -> Result<SocketFile, DaemonError> {
        use std::os::unix::ffi::OsStrExt;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let socket = || path.display().to_string();
        let bad = |why| DaemonError::BadSocket {
            socket: socket(),
            why,
        };
        let name = path.file_name().ok_or_else(|| bad("no file name"))?;
        let dir = std::fs::File::open(dir).map_err(|e| DaemonError::Socket {
            socket: socket(),
            step: Some("opening its directory".to_string()),
            source: e.into(),
        })?;
        let name = std::ffi::CString::new(name.as_bytes()).map_err(|_| bad("NUL in name"))?;
        let mut file = SocketFile {
            dir,
            name,
            bound: None,
        };
        file.bound = file.socket_now();
        Ok(file)
    }

    /// The device and inode of the socket at the path now, if a socket is there.
    fn socket_now(&self) -> Option<(libc::dev_t, libc::ino_t)> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: fstatat on a directory fd we own and a C string; `st` is read only
        // when it succeeded.
        unsafe {
            if libc::fstatat(
                self.dir.as_raw_fd(),
                self.name.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            ) != 0
            {
                return None;
            }
            let st = st.assume_init();
            (st.st_mode & libc::S_IFMT == libc::S_IFSOCK).then_some((st.st_dev, st.st_ino))
        }
    }

    pub(super) fn remove(&self) {
        if self.bound.is_some() && self.socket_now() == self.bound {
            // SAFETY: unlinkat on a directory fd we own and a C string.
            unsafe {
                libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0);
            }
        }
    }
}

pub(super) fn make_listener(
    socket: &SocketSource,
    group: Option<u32>,
) -> Result<Listener, DaemonError> {
    match socket {
        SocketSource::Path(path) => {
            remove_stale_socket(path)?;
            // Bound under umask 077 (set by `run`): 0700 from the start.
            let listener = Listener::new(path, false).map_err(|source| DaemonError::Listen {
                path: path.clone(),
                source,
            })?;
            set_socket_mode(path, group)?;
            Ok(listener)
        }
        SocketSource::Fd(fd) => {
            check_listening_socket(*fd)?;
            // SAFETY: the fd was handed to us by the launcher for exactly this use and
            // was checked to be a socket; the Listener takes ownership.
            Ok(unsafe { Listener::from_raw_fd(*fd) })
        }
    }
}

/// The vhost-user socket's final mode. Without a group: 0700, owner only (as
/// virtiofsd). With `--socket-group`: the group is set first, then the mode becomes
/// 0770, the mode virtiofsd gives it (it binds under umask 007 and then chowns; here
/// the group never has access before it is the right group).
fn set_socket_mode(path: &Path, group: Option<u32>) -> Result<(), DaemonError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |what: String, e: crate::error::HostError| DaemonError::Socket {
        socket: format!("--socket-path {}", path.display()),
        step: Some(what),
        source: e,
    };
    let mode = match group {
        Some(gid) => {
            nix::unistd::fchownat(
                None,
                path,
                None,
                Some(nix::unistd::Gid::from_raw(gid)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| err(format!("--socket-group {gid}: chown"), e.into()))?;
            0o770
        }
        None => 0o700,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| err("chmod".to_string(), e.into()))
}

/// A socket file left by an earlier run is replaced; any other file is an error, so
/// a typo in --socket-path cannot delete someone's data.
fn remove_stale_socket(path: &Path) -> Result<(), DaemonError> {
    let socket = format!("--socket-path {}", path.display());
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| DaemonError::Socket {
                socket,
                step: Some("removing stale socket".to_string()),
                source: e.into(),
            })
        }
        Ok(_) => Err(DaemonError::BadSocket {
            socket,
            why: "exists and is not a socket",
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DaemonError::Socket {
            socket,
            step: None,
            source: e.into(),
        }),
    }
}

fn check_listening_socket(fd: RawFd) -> Result<(), DaemonError> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    let socket = format!("--fd {fd}");
    // SAFETY: fstat fills `st`; the result is checked.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } < 0 {
        return Err(DaemonError::Socket {
            socket,
            step: None,
            source: crate::error::HostError::last(),
        });
    }
    // SAFETY: fstat succeeded.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(DaemonError::BadSocket {
            socket,
            why: "not a socket",
        });
    }
    Ok(())
}
