//! The daemon's lifecycle: set up the process, build the file system stack, serve one
//! frontend, and exit 0 when it disconnects or on SIGTERM/SIGINT, removing the socket.
//! What fails ends the daemon as a [`DaemonError`] (`error.rs`).

mod error;
mod memory;
mod recording;
mod sockets;

use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use log::{info, warn};
use nix::sys::signal::{SigSet, Signal};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::GuestMemoryAtomic;

use crate::config::{Config, SocketSource};
use crate::control::{Api, ControlServer};
use crate::device::state_transfer::StateConfig;
use crate::device::{FsBackend, GuestMmap};
use crate::fs::PassthroughConfig;
use crate::handoff::Handoff;
use crate::sandbox::{self, SandboxMode, ThreadRole};
use recording::Recording;
use sockets::{make_listener, SocketFile};

pub use error::DaemonError;

pub fn run(config: Config) -> Result<(), DaemonError> {
    let socket_paths: Vec<PathBuf> = match &config.socket {
        SocketSource::Path(p) => vec![p.clone()],
        SocketSource::Fd(_) => Vec::new(),
    }
    .into_iter()
    .chain(config.control_socket.iter().cloned())
    .collect();
    sandbox::malloc::fix_arena_limit()?;
    // Logging starts before the sandbox: it may connect to /dev/log.
    crate::logging::init(config.log_level, config.syslog, config.log_format)?;
    // A panic names its thread, place and message under any thread's filter.
    crate::logging::panic::install(|| {
        sandbox::current_role().is_some_and(sandbox::ThreadRole::is_essential)
    });
    for w in &config.warnings {
        log::warn!("{w}");
    }
    // Block the termination signals in every thread; one thread waits for them. From
    // the start: a launcher may signal as soon as the socket exists, and in namespace
    // mode the serving child is pid 1 of its namespace, which the kernel spares any
    // signal it neither handles nor blocks: SIGTERM would be lost, not queued.
    let mut term = SigSet::empty();
    term.add(Signal::SIGTERM);
    term.add(Signal::SIGINT);
    term.thread_block()
        .map_err(|e| DaemonError::host("blocking SIGTERM/SIGINT", e))?;
    // The lock-wait wake-up signal only ever interrupts a lock wait: blocked in every
    // thread but the one waiting (see fs/locks.rs).
    let mut wake = SigSet::empty();
    wake.add(Signal::SIGUSR1);
    wake.thread_block()
        .map_err(|e| DaemonError::host("blocking SIGUSR1", e))?;
    // Both sockets are bound under umask 077, whatever umask we were started with: no
    // other user may connect to them before their final modes are set. Only once they
    // exist, and before any guest request runs, is the umask cleared for the guest's
    // files (see `serve`).
    // SAFETY: umask only changes this process's file mode creation mask.
    unsafe { libc::umask(0o077) };
    // The sockets are bound first, before the sandbox, as virtiofsd binds its own: a
    // launcher waits for the socket file, and the namespaces and the fork cost about a
    // millisecond it need not wait for. The control socket first: once the vhost-user
    // socket exists, a launcher may expect both.
    // Started by the keeper: the session region it shares with it, and the journal
    // half to record into (the first serving process got both through the fork).
    let mut recording = match &config.keeper_region {
        Some(k) => Some(Recording::inherited(k)?),
        None => None,
    };
    if let Some(fd) = config.keeper_channel_fd {
        // SAFETY: the keeper passed this fd for exactly this use; owned once, here.
        crate::keeper::channel::serve_with(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    }
    let control = match (&config.control_socket, config.control_fd) {
        // SAFETY: the keeper passed this fd for exactly this use; owned once, here.
        (Some(path), Some(fd)) => Some(ControlServer::inherited(
            unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
            path,
            &config.control_allow_uids,
        )),
        (Some(path), None) => Some(ControlServer::bind(path, &config.control_allow_uids)?),
        (None, _) => None,
    };
    // The socket files stay removable after the root changed (by directory fd and
    // name); set-up that fails from here on removes them: nothing is left behind
    // half-started.
    // Under a keeper, the socket files are the keeper's to remove (a serving process
    // replaced by an upgrade must leave them).
    let serving_paths: Vec<PathBuf> = match config.upgradable || config.control_fd.is_some() {
        true => Vec::new(),
        false => socket_paths.clone(),
    };
    let bound = make_listener(&config.socket, config.socket_group).and_then(|listener| {
        let files = serving_paths.iter().map(|p| SocketFile::open(p));
        Ok((listener, files.collect::<Result<Vec<_>, _>>()?))
    });
    // --upgradable: the keeper forks off here, keeps the frontend's socket and
    // relays it; only the serving child goes on (src/keeper/process.rs).
    let bound = bound.and_then(|(listener, files)| {
        if !config.upgradable {
            return Ok((listener, files));
        }
        // The keeper keeps the control socket's listener for the next serving process.
        let fds: Vec<RawFd> = control.iter().flat_map(ControlServer::fds).collect();
        let keep = crate::keeper::process::Keep {
            control: fds.first().copied(),
            close: fds.get(1..).unwrap_or_default(),
            sockets: &socket_paths,
            keep_serving: config.keep_serving,
        };
        let child = crate::keeper::process::split(listener, keep).map_err(DaemonError::Keeper)?;
        crate::keeper::channel::serve_with(child.channel);
        recording = Some(Recording::forked(child.region));
        Ok((child.listener, files))
    });
    let (listener, socket_files) = match bound {
        Ok((listener, files)) => (listener, Arc::new(files)),
        Err(e) => {
            socket_paths
                .iter()
                .for_each(|p| sandbox::socket_path::remove_socket(p));
            return Err(e);
        }
    };
    let result = serve(
        config,
        control,
        listener,
        &serving_paths,
        socket_files.clone(),
        term,
        recording,
    );
    if result.is_err() {
        for f in socket_files.iter() {
            f.remove();
        }
    }
    result
}

/// Everything after the sockets exist: the sandbox, the file system stack, and the
/// one frontend until it disconnects.
fn serve(
    config: Config,
    control: Option<ControlServer>,
    mut listener: Listener,
    socket_paths: &[PathBuf],
    socket_files: Arc<Vec<SocketFile>>,
    term: SigSet,
    recording: Option<Recording>,
) -> Result<(), DaemonError> {
    // The sockets a migration's source and destination on this host hand the guest's
    // locks over with: made before the sandbox's network namespace, in the host's.
    let handoff = match Handoff::prepare() {
        Ok(h) => Some(h),
        Err(e) => {
            warn!("no same-host hand-over of the guest's locks on migration: {e}");
            None
        }
    };
    if let Some(fd) = config.keeper_source_pidfd {
        // SAFETY: the keeper passed this fd for exactly this use; owned once, here.
        let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // Not inherited by whatever this process might start.
        // SAFETY: fcntl on an fd we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        if let Some(h) = &handoff {
            h.expect_source(pidfd);
        }
    }
    // The supervisor that namespace mode leaves outside closes its copies of the
    // listening sockets: only the serving child holds them.
    let listening: Vec<RawFd> = std::iter::once(listener.as_raw_fd())
        .chain(control.iter().flat_map(ControlServer::fds))
        .chain(handoff.iter().flat_map(|h| h.fds()))
        .collect();
    // Namespaces first, while the process has one thread: namespace mode forks, and
    // only the sandboxed child returns.
    sandbox::enter(
        config.sandbox,
        &config.id_maps,
        config.seccomp,
        socket_paths.to_vec(),
        &listening,
    )?;
    // Every role's filter, compiled on the main thread before any thread that confines
    // itself starts (see seccomp::compile_for), and first thing after the fork: the
    // compiler's temporaries are freed before the daemon's long-lived allocations,
    // which then reuse their heap pages.
    sandbox::seccomp::compile_for(config.seccomp)?;
    sandbox::rlimits::set_nofile(config.rlimit_nofile)?;
    sandbox::rlimits::no_core_dumps()?;

    if control.is_some() && config.sandbox == SandboxMode::Namespace {
        warn_unless_shared(&config.shared_dir);
    }
    // Everything else the daemon needs from outside SharedDir is opened before the
    // root changes: /proc/self/fd (the sockets and the log are open already).
    let outside = sandbox::mounts::open_outside()?;
    // The serving process's own /proc files, for /metrics (there is no /proc inside).
    let process_files = match &control {
        Some(_) => Some(
            crate::metrics::process::ProcessFiles::open()
                .map_err(|e| DaemonError::host("sandbox: opening /proc/self/status and stat", e))?,
        ),
        None => None,
    };
    let root = sandbox::change_root(config.sandbox, &config.shared_dir)?;

    let stack = crate::fs::build(
        &root,
        config.allowed_dirs.as_deref(),
        config.readonly,
        PassthroughConfig {
            privileged_xattrs: config.privileged_xattrs,
            limits: config.limits,
            proc_self_fd: Some(Arc::new(outside.proc_self_fd)),
            file_handles: config.file_handles,
            allow_direct_io: config.allow_direct_io,
            readdirplus: config.readdirplus,
            preserve_noatime: config.preserve_noatime,
            announce_submounts: config.announce_submounts,
            posix_acl: config.posix_acl.into(),
            uids: config.uids.clone(),
            gids: config.gids.clone(),
            metrics: config.metrics,
            journal: recording.map(|r| r.journal),
            ..PassthroughConfig::new(config.cache, config.xattr)
        },
    )
    .map_err(|source| DaemonError::SharedDir {
        path: config.shared_dir.clone(),
        source,
    })?;

    // Setup is done: from here each thread keeps only what its role needs.
    sandbox::caps::lock_down_process()?;
    sandbox::set_policy(sandbox::Policy {
        seccomp: config.seccomp,
        drop_caps: true,
        privileged_xattrs: config.privileged_xattrs,
        file_handles: config.file_handles != crate::fs::file_handle::FileHandleMode::Never,
    });
    // Every thread from here on is started by the launcher, confined for its role.
    sandbox::threads::start_launcher()?;
    spawn_signal_thread(term, socket_files.clone());
    crate::logging::spawn_summary_thread(|job| {
        sandbox::threads::spawn_confined("volfsd-log", ThreadRole::Logger, job)
    })?;

    let backend = Arc::new(
        FsBackend::new(
            &stack,
            config.num_request_queues,
            config.poll,
            recording.map(|r| r.region),
        )
        .map_err(|e| DaemonError::host("creating the queue workers' wake timers", e))?,
    );
    let stats = backend.stats();

    // The control socket serves before the frontend connects: an agent may attach
    // volumes before the VM boots.
    if let Some(server) = control {
        let mut api = Api::new(
            stack.volumes.clone(),
            config.shared_dir.clone(),
            root.clone(),
            stats.clone(),
        );
        if let Some(files) = process_files {
            api = api.with_process_files(files);
        }
        if let Some(r) = recording {
            api = api.with_keeper_region(r.region);
        }
        // Started by the keeper after an upgrade or a crash: the volumes the previous
        // process had, before the guest's session is loaded.
        if let Some(volumes) = &config.keeper_volumes {
            api.restore_volumes(volumes);
        }
        server
            .spawn(api)
            .map_err(|e| DaemonError::host("starting the control thread", e))?;
    }

    // The thread that saves and loads the device state (migration, snapshots).
    let state_cfg = StateConfig {
        view: config.guest_view(),
        save: config.migration.save,
        load: config.migration.load,
        handoff,
    };
    backend
        .start_state_thread(state_cfg)
        .map_err(|e| DaemonError::host("starting the state thread", e))?;
    // Started by the keeper after a crash under the guest's session: the session the
    // killed process recorded is served on, before the keeper sets up the rings.
    if let Some(half) = config.keeper_region.and_then(|k| k.recover) {
        backend.recover(half).map_err(DaemonError::Recover)?;
    }
    // The queue workers are started by VhostUserDaemon::new; they inherit the
    // confinement of the thread that creates them, so a thread confined for the
    // worker role creates them: for the first frontend, and, with --keep-serving,
    // for each one after it.
    let mut daemons = DaemonFactory::start(backend.clone(), config.keep_serving)?;
    // Nothing is served before the namespace mode's supervisor is confined too.
    sandbox::supervisor::await_supervisor()?;
    // Set-up is over: what it touched and will not touch again goes back.
    memory::give_back_setup_memory();
    // The main thread, and the vhost-user thread `start` creates, from here on.
    sandbox::confine_thread(ThreadRole::Main)?;

    // The guest kernel applies the caller's umask itself; ours must not apply twice.
    // No guest request has run yet: the frontend connects in `daemon.start` below.
    // SAFETY: umask only changes this process's file mode creation mask.
    unsafe { libc::umask(0) };
    info!(
        "serving {} on {} ({} request queues, cache {:?}{}, sandbox {:?}, seccomp {:?})",
        config.shared_dir.display(),
        match &config.socket {
            SocketSource::Path(p) => p.display().to_string(),
            SocketSource::Fd(_) => format!("fd {}", listener.as_raw_fd()),
        },
        config.num_request_queues,
        config.cache,
        if config.readonly { ", read-only" } else { "" },
        config.sandbox,
        config.seccomp,
    );
    // virtiofsd's words: Kata's runtime-rs reads the daemon's stderr and takes this
    // line as the sign that it started.
    info!("Waiting for vhost-user socket connection...");
    loop {
        let mut daemon = daemons.next()?;
        backend
            .register_wake_timers(&daemon.get_epoll_handlers())
            .map_err(|e| DaemonError::host("adding the wake timers to the queue workers", e))?;
        daemon
            .start(&mut listener)
            .map_err(|source| DaemonError::Vhost {
                step: "accepting the frontend",
                source,
            })?;
        info!("frontend connected");
        let result = daemon.wait();
        stats.connected.store(false, Ordering::Relaxed);
        // The frontend is gone: stop the queue workers.
        for handler in daemon.get_epoll_handlers() {
            handler.send_exit_event();
        }
        drop(daemon);
        for (q, n) in stats.queues.iter().enumerate() {
            info!(
                "queue {q}: {} requests served",
                n.served.load(Ordering::Relaxed)
            );
        }
        match result {
            Ok(()) => {}
            Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => {}
            Err(e) => warn!("frontend connection ended with: {e}"),
        }
        if !config.keep_serving {
            break;
        }
        // As on a device reset: the guest's session ends, the volumes stay.
        backend.connection_ended();
        info!("frontend disconnected; waiting for the next one (--keep-serving)");
    }
    drop(listener);
    for f in socket_files.iter() {
        f.remove();
    }
    info!("frontend disconnected, exiting");
    Ok(())
}

/// Makes a vhost-user daemon (its queue workers) per frontend, on a thread confined
/// for the worker role: the workers inherit that confinement, which the main thread,
/// confined for its own role, could no longer give them.
enum DaemonFactory {
    /// `--keep-serving`: a thread that waits for the next frontend's turn.
    Thread(std::sync::mpsc::Sender<std::sync::mpsc::Sender<Result<Daemon, DaemonError>>>),
    /// One frontend: its daemon, made at start by a short-lived thread, so that no
    /// thread (a stack and its pages) waits for a frontend that never comes.
    Once(Option<Daemon>),
}

type Daemon = VhostUserDaemon<Arc<FsBackend>>;

fn new_daemon(backend: &Arc<FsBackend>) -> Result<Daemon, DaemonError> {
    VhostUserDaemon::new(
        "volfsd".to_string(),
        backend.clone(),
        GuestMemoryAtomic::new(GuestMmap::default()),
    )
    .map_err(|source| DaemonError::Vhost {
        step: "creating the vhost-user daemon",
        source,
    })
}

impl DaemonFactory {
    fn start(backend: Arc<FsBackend>, keep_serving: bool) -> Result<DaemonFactory, DaemonError> {
        if !keep_serving {
            let daemon = sandbox::threads::run("volfsd-worker-start", ThreadRole::Worker, {
                move || new_daemon(&backend)
            })
            .map_err(|e| DaemonError::host("starting the queue workers", e))??;
            return Ok(DaemonFactory::Once(Some(daemon)));
        }
        let (ask, asks) =
            std::sync::mpsc::channel::<std::sync::mpsc::Sender<Result<Daemon, DaemonError>>>();
        sandbox::threads::spawn_confined("volfsd-workers", ThreadRole::Worker, move || {
            for reply in asks {
                let _ = reply.send(new_daemon(&backend));
            }
        })
        .map_err(|e| DaemonError::host("starting the thread that starts queue workers", e))?;
        Ok(DaemonFactory::Thread(ask))
    }

    fn next(&mut self) -> Result<Daemon, DaemonError> {
        match self {
            DaemonFactory::Thread(ask) => {
                let (tx, rx) = std::sync::mpsc::channel();
                ask.send(tx).map_err(|_| DaemonError::WorkerStarterGone)?;
                rx.recv().map_err(|_| DaemonError::WorkerStarterGone)?
            }
            DaemonFactory::Once(daemon) => daemon.take().ok_or(DaemonError::WorkerStarterGone),
        }
    }
}

/// Runtime attach relies on mount propagation: a volume the node agent bind-mounts
/// under SharedDir after the daemon started reaches the daemon's own mount namespace
/// only if SharedDir sits on a shared mount.
fn warn_unless_shared(shared_dir: &Path) {
    if sandbox::mounts::is_shared_mount(shared_dir) == Some(false) {
        warn!(
            "--shared-dir {} is not on a shared mount: volumes bind-mounted under it after \
             the daemon starts will not be visible to it (make it shared first: mount --bind \
             DIR DIR && mount --make-shared DIR)",
            shared_dir.display()
        );
    }
}

fn spawn_signal_thread(term: SigSet, files: Arc<Vec<SocketFile>>) {
    sandbox::threads::spawn_confined("volfsd-signals", ThreadRole::Signals, move || {
        // sigwait fails only on a bad set; whatever ends the wait ends the daemon.
        match term.wait() {
            Ok(sig) => info!("received {sig:?}, exiting"),
            Err(e) => warn!("waiting for SIGTERM/SIGINT: {e}; exiting"),
        }
        for f in files.iter() {
            f.remove();
        }
        log::logger().flush();
        std::process::exit(0);
    })
    .expect("spawning the signal thread");
}
