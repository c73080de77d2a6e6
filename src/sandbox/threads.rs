//! Where the daemon's threads start: every one is started by one thread, the
//! launcher, and confines itself for its role before it runs anything
//! ([`spawn`]), whichever thread asked for it.
//!
//! Why a launcher: a thread inherits its creator's seccomp filters and capabilities
//! and can only narrow them. A thread started by a confined thread of another role
//! (a lock waiter started by the state thread) would run under both roles' lists,
//! and die on a call only its own role makes (SIGSYS on `rt_sigreturn`). The
//! launcher is started by the main thread before any other thread, under a filter
//! that allows what any role of the daemon allows (the union of their lists), with
//! every role's capabilities permitted and none effective: each thread it starts
//! narrows both to its role, so it runs under exactly its role's list.
//!
//! Threads that library code starts inside a confined thread (the queue workers that
//! vhost-user-backend starts) inherit that thread's role: [`run`] gives them one.
//! Without a launcher (the file system stack driven in-process by tests, or before
//! [`start_launcher`]), threads start directly and confine themselves the same way.

use std::io;
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

use super::{confine_thread, confine_thread_or_exit, SandboxError, ThreadRole};

/// What a new thread runs once confined.
type Job = Box<dyn FnOnce() + Send>;

/// A request to the launcher: start `name`, confined for `role`, running `job`.
struct Launch {
    name: String,
    role: ThreadRole,
    job: Job,
    started: Sender<io::Result<()>>,
}

static LAUNCHER: OnceLock<Sender<Launch>> = OnceLock::new();

/// The launcher's thread name.
pub const LAUNCHER_NAME: &str = "volfsd-launcher";

/// Starts the launcher (once, from the main thread, after the sandbox's policy is set
/// and before any other thread): every thread started after it is started by it.
pub fn start_launcher() -> Result<(), SandboxError> {
    let (tx, rx) = channel::<Launch>();
    let (ready, confined) = channel::<Result<(), SandboxError>>();
    std::thread::Builder::new()
        .name(LAUNCHER_NAME.to_string())
        .spawn(move || {
            let outcome = confine_thread(ThreadRole::Launcher);
            let ok = outcome.is_ok();
            let _ = ready.send(outcome);
            if !ok {
                return;
            }
            for Launch {
                name,
                role,
                job,
                started,
            } in rx
            {
                let spawned = std::thread::Builder::new().name(name).spawn(move || {
                    confine_thread_or_exit(role);
                    job()
                });
                let _ = started.send(spawned.map(|_| ()));
            }
        })
        .map_err(|e| SandboxError::host("starting the thread launcher", e))?;
    confined.recv().map_err(|_| {
        SandboxError::host(
            "starting the thread launcher",
            io::Error::other("it ended before it was confined"),
        )
    })??;
    let _ = LAUNCHER.set(tx);
    Ok(())
}

/// Starts a thread named `name` that confines itself for `role` (exiting the process
/// if it cannot), then runs `f`. Returns once the thread exists.
pub fn spawn(name: &str, role: ThreadRole, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    let Some(launcher) = LAUNCHER.get() else {
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                confine_thread_or_exit(role);
                f()
            })?;
        return Ok(());
    };
    let (started, wait) = channel();
    launcher
        .send(Launch {
            name: name.to_string(),
            role,
            job: Box::new(f),
            started,
        })
        .map_err(|_| io::Error::other("the thread launcher is gone"))?;
    wait.recv()
        .map_err(|_| io::Error::other("the thread launcher is gone"))?
}

/// [`spawn`], returning once the thread is confined: a thread started during set-up
/// is then never seen running unconfined after it (on a busy host a new thread may
/// not run for a while).
pub fn spawn_confined(
    name: &str,
    role: ThreadRole,
    f: impl FnOnce() + Send + 'static,
) -> io::Result<()> {
    let (confined, wait) = channel::<()>();
    spawn(name, role, move || {
        drop(confined);
        f()
    })?;
    // Disconnected once the thread dropped its end: confined (or the process exits).
    let _ = wait.recv();
    Ok(())
}

/// Runs `f` on a new thread named `name`, confined for `role`, and returns what it
/// returns: the threads `f` creates inherit that confinement. None if the thread
/// could not start or `f` panicked.
pub fn run<T: Send + 'static>(
    name: &str,
    role: ThreadRole,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let (done, result) = channel();
    spawn(name, role, move || {
        let _ = done.send(f());
    })?;
    result
        .recv()
        .map_err(|_| io::Error::other(format!("thread {name} ended without an answer")))
}
