//! The control socket: attach, detach, list and stats of volumes while the VM runs.
//!
//! HTTP/1.1 + JSON over a Unix socket (see `docs/control-api.md`). It runs on its own
//! threads: the accept loop, and one short-lived thread per client, at most
//! [`MAX_CLIENTS`] at once. Every read is bounded by [`READ_TIMEOUT`], so a stuck
//! client holds only its own thread, never the virtqueue workers.

pub mod api;
pub mod client;
pub mod http;

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, info, warn};

pub use api::Api;

/// Clients served at once; more get 503 and are closed.
pub const MAX_CLIENTS: usize = 16;
/// How long a client may take to send a whole request (and may stay idle between
/// requests on a kept-alive connection).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The bound control socket, before it serves (it is bound before the sandbox changes
/// the root, and serves once the file system stack exists).
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    allowed_uids: Vec<u32>,
    clients: Arc<AtomicUsize>,
    /// An fd kept open to be closed when accept fails for lack of fds, so that an
    /// operator can still be served at the fd limit (see [`ControlServer::accept_loop`]).
    reserve_fd: Option<UnixListener>,
}

/// Back-off of the accept loop when it cannot accept (no fds, no memory): it never spins.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// At most one "cannot accept" warning per this interval.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

/// A duplicate of the listening socket: it only holds an fd slot, and needs no path
/// (inside the sandbox there is no /dev/null).
fn open_reserve_fd(listener: &UnixListener) -> Option<UnixListener> {
    listener.try_clone().ok()
}

/// The tags and permission bits of a POSIX ACL in its xattr form
/// (`<linux/posix_acl_xattr.h>`, `<linux/posix_acl.h>`).
const ACL_XATTR_VERSION: u32 = 2;
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const ACL_RW: u16 = 0o6;
const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// The `system.posix_acl_access` value giving the owner and each of `uids` read and
/// write (what connect(2) needs) and nobody else anything: `user::rw-`,
/// `user:UID:rw-`..., `group::---`, `mask::rw-`, `other::---`. `uids` must be sorted
/// and unique, as the kernel requires.
pub fn socket_acl(uids: &[u32]) -> Vec<u8> {
    let mut entries = vec![(ACL_USER_OBJ, ACL_RW, ACL_UNDEFINED_ID)];
    entries.extend(uids.iter().map(|&u| (ACL_USER, ACL_RW, u)));
    entries.push((ACL_GROUP_OBJ, 0, ACL_UNDEFINED_ID));
    entries.push((ACL_MASK, ACL_RW, ACL_UNDEFINED_ID));
    entries.push((ACL_OTHER, 0, ACL_UNDEFINED_ID));
    let mut out = ACL_XATTR_VERSION.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

/// What binding the control socket failed at: the socket's path and the step.
#[derive(Debug)]
pub enum ControlError {
    Socket {
        path: PathBuf,
        problem: SocketProblem,
    },
}

/// What went wrong with the control socket's file.
#[derive(Debug)]
pub enum SocketProblem {
    /// A host call failed; `step` names it (None: the stat or the bind itself).
    Host {
        step: Option<&'static str>,
        source: io::Error,
    },
    /// Another kind of file is in the way (never removed).
    NotASocket,
    /// The path holds a NUL byte.
    NulInPath,
}

impl ControlError {
    fn host(path: &Path, step: Option<&'static str>, source: io::Error) -> ControlError {
        ControlError::Socket {
            path: path.to_path_buf(),
            problem: SocketProblem::Host { step, source },
        }
    }
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ControlError::Socket { path, problem } = self;
        write!(f, "--control-socket {}: ", path.display())?;
        match problem {
            SocketProblem::Host {
                step: Some(step),
                source,
            } => write!(f, "{step}: {source}"),
            SocketProblem::Host { step: None, source } => write!(f, "{source}"),
            SocketProblem::NotASocket => write!(f, "exists and is not a socket"),
            SocketProblem::NulInPath => write!(f, "NUL in path"),
        }
    }
}

impl std::error::Error for ControlError {}

/// Lets exactly `uids` (besides the owner) connect to the socket at `path`: a POSIX
/// access ACL entry per uid. Where the file system has no ACLs, the socket is made
/// 0666 instead, with a warning: then only the SO_PEERCRED check refuses other uids.
fn grant_uids(path: &Path, uids: &[u32]) -> Result<(), ControlError> {
    use std::os::unix::ffi::OsStrExt;
    let acl = socket_acl(uids);
    let cpath =
        std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| ControlError::Socket {
            path: path.to_path_buf(),
            problem: SocketProblem::NulInPath,
        })?;
    // SAFETY: both strings are NUL-terminated and `acl` is valid for its length; the
    // result is checked. lsetxattr does not follow a symlink put in the socket's place.
    let r = unsafe {
        libc::lsetxattr(
            cpath.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            acl.as_ptr() as *const libc::c_void,
            acl.len(),
            0,
        )
    };
    // Once, at start-up: a lifecycle line, outside the log budget.
    if r == 0 {
        info!(
            target: crate::logging::LIFECYCLE,
            "control socket {}: uids {uids:?} may connect (POSIX ACL)",
            path.display()
        );
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(ControlError::host(
            path,
            Some("setting the ACL for --control-allow-uid"),
            e,
        ));
    }
    warn!(
        target: crate::logging::LIFECYCLE,
        "control socket {}: the file system has no POSIX ACLs, so the socket is made \
         mode 0666 for --control-allow-uid {uids:?}; only the peer-credential check \
         refuses other uids",
        path.display()
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| ControlError::host(path, Some("chmod"), e))
}

impl ControlServer {
    /// The fds this server holds (the socket and its reserve), for a process that
    /// forks to close in the branch that does not serve.
    pub fn fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        std::iter::once(self.listener.as_raw_fd())
            .chain(self.reserve_fd.iter().map(AsRawFd::as_raw_fd))
            .collect()
    }

    /// Creates the socket with mode 0600. A stale socket file is replaced; any other
    /// file at `path` is an error.
    pub fn bind(path: &Path, extra_uids: &[u32]) -> Result<Self, ControlError> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
                .map_err(|e| ControlError::host(path, Some("removing stale socket"), e))?,
            Ok(_) => {
                return Err(ControlError::Socket {
                    path: path.to_path_buf(),
                    problem: SocketProblem::NotASocket,
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ControlError::host(path, None, e)),
        }
        // Create it private from the start: bind under a 0177 umask, then chmod to be
        // explicit about the mode whatever the umask was.
        // SAFETY: umask only changes this process's file creation mask; restored below.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|e| ControlError::host(path, None, e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| ControlError::host(path, Some("chmod"), e))?;
        // SAFETY: geteuid cannot fail.
        let own = unsafe { libc::geteuid() };
        let mut others: Vec<u32> = extra_uids.iter().copied().filter(|&u| u != own).collect();
        others.sort_unstable();
        others.dedup();
        if !others.is_empty() {
            grant_uids(path, &others)?;
        }
        Ok(Self::serving(listener, path, extra_uids))
    }

    /// The control socket a serving process started by the keeper (an upgrade)
    /// takes over: bound, and its ACL set, by the first process.
    pub fn inherited(fd: std::os::fd::OwnedFd, path: &Path, extra_uids: &[u32]) -> Self {
        Self::serving(UnixListener::from(fd), path, extra_uids)
    }

    fn serving(listener: UnixListener, path: &Path, extra_uids: &[u32]) -> Self {
        // SAFETY: geteuid cannot fail.
        let own = unsafe { libc::geteuid() };
        let mut allowed_uids = vec![0, own];
        allowed_uids.extend_from_slice(extra_uids);
        let reserve_fd = open_reserve_fd(&listener);
        ControlServer {
            listener,
            path: path.to_path_buf(),
            allowed_uids,
            clients: Arc::new(AtomicUsize::new(0)),
            reserve_fd,
        }
    }

    /// Serves clients with `api` on a thread of its own, confined for the control
    /// role (as each client's thread is), until the process exits.
    pub fn spawn(self, api: Api) -> io::Result<()> {
        let serving = Serving {
            server: self,
            api: Arc::new(api),
        };
        crate::sandbox::threads::spawn_confined(
            "volfsd-control",
            crate::sandbox::ThreadRole::Control,
            move || serving.accept_loop(),
        )
    }
}

/// A control server with its API, on its accept thread.
struct Serving {
    server: ControlServer,
    api: Arc<Api>,
}

impl Serving {
    /// Accepts clients forever. When accept fails for lack of fds (EMFILE, ENFILE) the
    /// reserve fd is closed and accept retried, so one operator is served even at the
    /// limit; without a reserve, and on any other failure, the loop sleeps
    /// [`ACCEPT_BACKOFF`] before retrying (a pending connection makes accept fail at
    /// once, so retrying at once would spin) and warns at most every 10 s.
    fn accept_loop(mut self) {
        // Once per process: a lifecycle line, outside the log budget.
        info!(
            target: crate::logging::LIFECYCLE,
            "control socket listening on {}",
            self.server.path.display()
        );
        let mut failures: u64 = 0;
        let mut last_warn: Option<Instant> = None;
        loop {
            if self.server.reserve_fd.is_none() {
                self.server.reserve_fd = open_reserve_fd(&self.server.listener);
            }
            match self.server.listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let no_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    if no_fds {
                        if let Some(reserve) = self.server.reserve_fd.take() {
                            drop(reserve);
                            if let Ok((stream, _)) = self.server.listener.accept() {
                                warn!(
                                    "control socket: out of file descriptors ({e}); \
                                     serving a client on the reserve fd"
                                );
                                self.admit(stream);
                                continue;
                            }
                        }
                    }
                    failures += 1;
                    if last_warn.is_none_or(|t| t.elapsed() >= ACCEPT_WARN_EVERY) {
                        warn!(
                            "control socket accept: {e} ({failures} failures so far); \
                             retrying every {} ms",
                            ACCEPT_BACKOFF.as_millis()
                        );
                        last_warn = Some(Instant::now());
                    }
                    std::thread::sleep(ACCEPT_BACKOFF);
                }
            }
        }
    }

    fn admit(&self, mut stream: UnixStream) {
        let uid = match peer_uid(&stream) {
            Ok(uid) => uid,
            Err(e) => {
                warn!("control socket: cannot read peer credentials: {e}");
                return;
            }
        };
        if !self.server.allowed_uids.contains(&uid) {
            warn!("control socket: refused a client with uid {uid}");
            let _ = http::write_response(
                &mut stream,
                403,
                http::JSON,
                &format!("{{\"error\":\"uid {uid} may not use this socket\"}}"),
                true,
            );
            return;
        }
        if self.server.clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            self.server.clients.fetch_sub(1, Ordering::AcqRel);
            warn!("control socket: more than {MAX_CLIENTS} clients, refusing one");
            let _ = http::write_response(
                &mut stream,
                503,
                http::JSON,
                &format!("{{\"error\":\"more than {MAX_CLIENTS} clients at once\"}}"),
                true,
            );
            return;
        }
        let api = self.api.clone();
        let clients = self.server.clients.clone();
        let spawned = crate::sandbox::threads::spawn(
            "volfsd-ctl-client",
            crate::sandbox::ThreadRole::Control,
            move || {
                serve_client(stream, &api, uid);
                clients.fetch_sub(1, Ordering::AcqRel);
            },
        );
        if let Err(e) = spawned {
            self.server.clients.fetch_sub(1, Ordering::AcqRel);
            warn!("control socket: cannot start a client thread: {e}");
        }
    }
}

fn serve_client(mut stream: UnixStream, api: &Api, uid: u32) {
    let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
    let mut buf = Vec::new();
    loop {
        // An idle keep-alive connection is closed after the same timeout.
        let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
        match http::read_request(&mut stream, &mut buf, Some(READ_TIMEOUT)) {
            Ok(req) => {
                let reply = api.handle_from(uid, &req.method, &req.path, &req.body);
                debug!("control: {} {} -> {}", req.method, req.path, reply.status);
                if reply.status >= 400 {
                    info!(
                        "control: {} {} -> {} {}",
                        req.method, req.path, reply.status, reply.body
                    );
                }
                let written = http::write_response(
                    &mut stream,
                    reply.status,
                    reply.content_type,
                    &reply.body,
                    req.close,
                );
                // After PUT /upgrade's "ok": the keeper ends this process only now.
                crate::keeper::channel::reply_sent();
                if written.is_err() || req.close {
                    return;
                }
            }
            Err(http::ReadError::Closed) => return,
            Err(http::ReadError::Reply(status, msg)) => {
                info!("control: bad request -> {status} {msg}");
                let body = serde_json::json!({ "error": msg }).to_string();
                let _ = http::write_response(&mut stream, status, http::JSON, &body, true);
                return;
            }
            Err(http::ReadError::Io(e)) => {
                debug!("control: client read: {e}");
                return;
            }
        }
    }
}

fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills `cred` of the length given; the result is checked.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}
