//! The daemon's lifecycle: set up the process, build the file system stack, serve one
//! frontend, and exit 0 when it disconnects or on SIGTERM/SIGINT, removing the socket.

use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use log::{info, warn};
use nix::sys::signal::{SigSet, Signal};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::config::{Config, SocketSource};
use crate::control::{Api, ControlServer};
use crate::device::FsBackend;
use crate::fs::PassthroughConfig;

pub fn run(config: Config) -> Result<(), String> {
    crate::logging::init(config.log_level, config.syslog)?;
    set_rlimit_nofile(config.rlimit_nofile)?;
    // Both sockets are bound under umask 077, whatever umask we were started with: no
    // other user may connect to them before their final modes are set. Only once they
    // exist, and before any guest request runs, is the umask cleared for the guest's
    // files (see below).
    // SAFETY: umask only changes this process's file mode creation mask.
    unsafe { libc::umask(0o077) };

    // Block the termination signals in every thread; one thread waits for them.
    let mut term = SigSet::empty();
    term.add(Signal::SIGTERM);
    term.add(Signal::SIGINT);
    term.thread_block()
        .map_err(|e| format!("blocking SIGTERM/SIGINT: {e}"))?;
    // The lock-wait wake-up signal only ever interrupts a lock wait: blocked in every
    // thread but the one waiting (see fs/locks.rs).
    let mut wake = SigSet::empty();
    wake.add(Signal::SIGUSR1);
    wake.thread_block()
        .map_err(|e| format!("blocking SIGUSR1: {e}"))?;

    let stack = crate::fs::build(
        &config.shared_dir,
        config.allowed_dirs.as_deref(),
        config.readonly,
        PassthroughConfig {
            privileged_xattrs: config.privileged_xattrs,
            limits: config.limits,
            ..PassthroughConfig::new(config.cache, config.xattr)
        },
    )
    .map_err(|e| format!("--shared-dir {}: {e}", config.shared_dir.display()))?;
    let backend = Arc::new(FsBackend::new(&stack, config.num_request_queues));
    let stats = backend.stats();

    // The control socket is up before the frontend connects: an agent may attach
    // volumes before the VM boots.
    let control_path = match &config.control_socket {
        Some(path) => {
            let api = Api::new(
                stack.volumes.clone(),
                config.shared_dir.clone(),
                stats.clone(),
            );
            let server = ControlServer::bind(path, api, &config.control_allow_uids)?;
            server
                .spawn()
                .map_err(|e| format!("starting the control thread: {e}"))?;
            Some(path.clone())
        }
        None => None,
    };

    let mut listener = make_listener(&config.socket, config.socket_group)?;
    // The guest kernel applies the caller's umask itself; ours must not apply twice.
    // No guest request has run yet: the frontend connects in `daemon.start` below.
    // SAFETY: umask only changes this process's file mode creation mask.
    unsafe { libc::umask(0) };
    let socket_path = match &config.socket {
        SocketSource::Path(p) => Some(p.clone()),
        SocketSource::Fd(_) => None,
    };
    let cleanup: Vec<PathBuf> = socket_path
        .iter()
        .chain(control_path.iter())
        .cloned()
        .collect();
    spawn_signal_thread(term, cleanup.clone());

    let mut daemon = VhostUserDaemon::new(
        "volfsd".to_string(),
        backend.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::default()),
    )
    .map_err(|e| format!("creating the vhost-user daemon: {e}"))?;

    info!(
        "serving {} on {} ({} request queues, cache {:?}{})",
        config.shared_dir.display(),
        socket_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| format!("fd {}", listener.as_raw_fd())),
        config.num_request_queues,
        config.cache,
        if config.readonly { ", read-only" } else { "" },
    );
    daemon
        .start(&mut listener)
        .map_err(|e| format!("accepting the frontend: {e}"))?;
    info!("frontend connected");
    let result = daemon.wait();
    stats.connected.store(false, Ordering::Relaxed);
    // The frontend is gone: stop the queue workers and drop the socket file.
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    drop(listener);
    for p in &cleanup {
        let _ = std::fs::remove_file(p);
    }
    for (q, n) in stats.requests.iter().enumerate() {
        info!("queue {q}: {} requests served", n.load(Ordering::Relaxed));
    }
    match result {
        Ok(()) => {}
        Err(vhost_user_backend::Error::HandleRequest(
            vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
        )) => {}
        Err(e) => warn!("frontend connection ended with: {e}"),
    }
    info!("frontend disconnected, exiting");
    Ok(())
}

fn make_listener(socket: &SocketSource, group: Option<u32>) -> Result<Listener, String> {
    match socket {
        SocketSource::Path(path) => {
            remove_stale_socket(path)?;
            // Bound under umask 077 (set by `run`): 0700 from the start.
            let listener = Listener::new(path, false)
                .map_err(|e| format!("--socket-path {}: {e}", path.display()))?;
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
fn set_socket_mode(path: &Path, group: Option<u32>) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let err = |what: &str, e: &dyn std::fmt::Display| {
        format!("--socket-path {}: {what}: {e}", path.display())
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
            .map_err(|e| err(&format!("--socket-group {gid}: chown"), &e))?;
            0o770
        }
        None => 0o700,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| err("chmod", &e))
}

/// A socket file left by an earlier run is replaced; any other file is an error, so
/// a typo in --socket-path cannot delete someone's data.
fn remove_stale_socket(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(|e| {
            format!(
                "--socket-path {}: removing stale socket: {e}",
                path.display()
            )
        }),
        Ok(_) => Err(format!(
            "--socket-path {}: exists and is not a socket",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("--socket-path {}: {e}", path.display())),
    }
}

fn check_listening_socket(fd: RawFd) -> Result<(), String> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat fills `st`; the result is checked.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } < 0 {
        return Err(format!("--fd {fd}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fstat succeeded.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("--fd {fd}: not a socket"));
    }
    Ok(())
}

fn spawn_signal_thread(term: SigSet, files: Vec<PathBuf>) {
    std::thread::Builder::new()
        .name("volfsd-signals".to_string())
        .spawn(move || {
            let sig = term.wait();
            info!("received {sig:?}, exiting");
            for p in files {
                let _ = std::fs::remove_file(p);
            }
            log::logger().flush();
            std::process::exit(0);
        })
        .expect("spawning the signal thread");
}

fn set_rlimit_nofile(requested: Option<u64>) -> Result<(), String> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) =
        getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| format!("getrlimit(RLIMIT_NOFILE): {e}"))?;
    let (new_soft, new_hard) = match requested {
        Some(0) => return Ok(()),
        Some(n) => (n, n.max(hard)),
        // Default: as many fds as the kernel allows a process (fs.nr_open), as
        // virtiofsd does: each guest inode holds one. The guest's share of them is
        // bounded by the per-volume limits and the fd budget (fs/session.rs).
        None => {
            let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(hard);
            let want = nr_open.max(hard);
            if want > hard && setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok() {
                return Ok(());
            }
            // Without CAP_SYS_RESOURCE the hard limit stays.
            (hard, hard)
        }
    };
    if new_soft == soft && new_hard == hard {
        return Ok(());
    }
    setrlimit(Resource::RLIMIT_NOFILE, new_soft, new_hard)
        .map_err(|e| format!("--rlimit-nofile {new_soft}: {e}"))
}
