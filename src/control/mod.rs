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
use std::time::Duration;

use log::{debug, info, warn};

pub use api::Api;

/// Clients served at once; more get 503 and are closed.
pub const MAX_CLIENTS: usize = 16;
/// How long a client may take to send a whole request (and may stay idle between
/// requests on a kept-alive connection).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    api: Arc<Api>,
    allowed_uids: Vec<u32>,
    clients: Arc<AtomicUsize>,
}

impl ControlServer {
    /// Creates the socket with mode 0600. A stale socket file is replaced; any other
    /// file at `path` is an error.
    pub fn bind(path: &Path, api: Api, extra_uids: &[u32]) -> Result<Self, String> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(|e| {
                format!(
                    "--control-socket {}: removing stale socket: {e}",
                    path.display()
                )
            })?,
            Ok(_) => {
                return Err(format!(
                    "--control-socket {}: exists and is not a socket",
                    path.display()
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("--control-socket {}: {e}", path.display())),
        }
        // Create it private from the start: bind under a 0177 umask, then chmod to be
        // explicit about the mode whatever the umask was.
        // SAFETY: umask only changes this process's file creation mask; restored below.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|e| format!("--control-socket {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("--control-socket {}: chmod: {e}", path.display()))?;
        // SAFETY: getuid cannot fail.
        let own = unsafe { libc::getuid() };
        let mut allowed_uids = vec![0, own];
        allowed_uids.extend_from_slice(extra_uids);
        Ok(ControlServer {
            listener,
            path: path.to_path_buf(),
            api: Arc::new(api),
            allowed_uids,
            clients: Arc::new(AtomicUsize::new(0)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves clients on a thread of its own until the process exits.
    pub fn spawn(self) -> io::Result<()> {
        std::thread::Builder::new()
            .name("volfsd-control".to_string())
            .spawn(move || self.accept_loop())?;
        Ok(())
    }

    fn accept_loop(self) {
        info!("control socket listening on {}", self.path.display());
        for stream in self.listener.incoming() {
            let stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    warn!("control socket accept: {e}");
                    continue;
                }
            };
            self.admit(stream);
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
        if !self.allowed_uids.contains(&uid) {
            warn!("control socket: refused a client with uid {uid}");
            let _ = http::write_response(
                &mut stream,
                403,
                &format!("{{\"error\":\"uid {uid} may not use this socket\"}}"),
                true,
            );
            return;
        }
        if self.clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            self.clients.fetch_sub(1, Ordering::AcqRel);
            warn!("control socket: more than {MAX_CLIENTS} clients, refusing one");
            let _ = http::write_response(
                &mut stream,
                503,
                &format!("{{\"error\":\"more than {MAX_CLIENTS} clients at once\"}}"),
                true,
            );
            return;
        }
        let api = self.api.clone();
        let clients = self.clients.clone();
        let spawned = std::thread::Builder::new()
            .name("volfsd-ctl-client".to_string())
            .spawn(move || {
                serve_client(stream, &api);
                clients.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.clients.fetch_sub(1, Ordering::AcqRel);
            warn!("control socket: cannot start a client thread: {e}");
        }
    }
}

fn serve_client(mut stream: UnixStream, api: &Api) {
    let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
    let mut buf = Vec::new();
    loop {
        // An idle keep-alive connection is closed after the same timeout.
        let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
        match http::read_request(&mut stream, &mut buf, Some(READ_TIMEOUT)) {
            Ok(req) => {
                let reply = api.handle(&req.method, &req.path, &req.body);
                debug!("control: {} {} -> {}", req.method, req.path, reply.status);
                if reply.status >= 400 {
                    info!(
                        "control: {} {} -> {} {}",
                        req.method, req.path, reply.status, reply.body
                    );
                }
                if http::write_response(&mut stream, reply.status, &reply.body, req.close).is_err()
                    || req.close
                {
                    return;
                }
            }
            Err(http::ReadError::Closed) => return,
            Err(http::ReadError::Reply(status, msg)) => {
                info!("control: bad request -> {status} {msg}");
                let body = serde_json::json!({ "error": msg }).to_string();
                let _ = http::write_response(&mut stream, status, &body, true);
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
