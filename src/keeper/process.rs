//! Where the keeper runs: with `--upgradable`, the daemon forks right after it bound
//! its sockets, before the sandbox (in every `--sandbox` mode). The parent is the
//! keeper (`event_loop.rs`): it keeps the vhost-user listening socket, accepts the
//! frontend and relays to the child, which serves as it always did, but on a
//! private listening socket whose only client is the keeper (`serving.rs`). The
//! keeper stays outside the sandbox (a new serving process must be started from
//! there) and lives as long as the daemon.
//!
//! The session region is made here, before the fork: the first serving process
//! shares it through the fork, every later one inherits its fd (`serving.rs`).

use std::os::fd::{AsRawFd, OwnedFd};

use log::warn;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{fork, ForkResult};
use vhost::vhost_user::Listener;

use super::channel;
use super::crash::Crashes;
use super::event_loop::Keeper;
use super::private_socket::Private;
use super::upgrade::Command;
use super::Error;
use crate::region::Region;

/// Signals the keeper passes on to the serving process.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

pub use super::event_loop::Keep;

/// What the first serving process gets from the fork.
pub struct Child {
    /// The private listener it serves the keeper on.
    pub listener: Listener,
    /// Its end of the keeper's channel.
    pub channel: OwnedFd,
    /// The session region it shares with the keeper (it records into half A).
    pub region: Region,
}

/// Forks the keeper off. Returns in the child only; the keeper never returns. Call
/// while the process has one thread.
pub fn split(frontend: Listener, keep: Keep) -> Result<Child, Error> {
    // The session region outlives every serving process: the keeper makes it, the
    // first serving process shares it through the fork (src/region/).
    let region = Region::create().map_err(|source| Error::Region {
        step: "at the keeper's start",
        source,
    })?;
    let private = Private::bind()?;
    let (channel, theirs) = channel::pair().map_err(|e| Error::io("socketpair", e))?;
    // Blocked before the fork so that none is lost; the child restores its mask.
    let mut signals = SigSet::empty();
    FORWARDED.iter().for_each(|&s| signals.add(s));
    signals.add(Signal::SIGCHLD);
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), Some(&mut old))
        .map_err(|e| Error::io("blocking signals", e.into()))?;
    let keeper = nix::unistd::getpid();
    // Found now: an upgrade starts the binary at this path, as it is then.
    let command = Command::current()
        .map_err(|e| warn!("keeper: upgrades are not possible: {e}"))
        .ok();
    // SAFETY: the caller guarantees one thread, so the child may run any code.
    match unsafe { fork() }.map_err(|e| Error::io("fork", e.into()))? {
        ForkResult::Child => {
            // SAFETY: prctl with integer arguments. If the keeper dies, the
            // frontend's connection is gone with it: nothing left to serve.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
            if nix::unistd::getppid() != keeper {
                std::process::exit(1);
            }
            nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None)
                .map_err(|e| Error::io("restoring the signal mask", e.into()))?;
            // Only the keeper accepts the frontend. Not dropped: the Listener would
            // remove the socket file.
            let fd = frontend.as_raw_fd();
            std::mem::forget(frontend);
            // SAFETY: the fd was the listener's, forgotten above; closed once.
            unsafe { libc::close(fd) };
            drop(channel);
            Ok(Child {
                listener: Listener::from(private.listener),
                channel: theirs,
                region,
            })
        }
        ForkResult::Parent { child } => {
            drop(theirs);
            for &fd in keep.close {
                // SAFETY: the keeper never uses these fds: they are the child's.
                unsafe { libc::close(fd) };
            }
            let sigfd = SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC);
            match sigfd {
                Ok(sigfd) => Keeper {
                    child,
                    frontend,
                    private: private.path.clone(),
                    keep,
                    command,
                    channel: Some(channel),
                    region,
                    served: false,
                    crashes: Crashes::default(),
                    started: std::time::Instant::now(),
                    backend_gone: None,
                }
                .run(sigfd, private),
                Err(e) => {
                    eprintln!("volfsd: keeper: signalfd: {e}");
                    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                    std::process::exit(1);
                }
            }
        }
    }
}
