//! The serving processes the keeper starts. Each serves on a private listening
//! socket, bound in a new 0700 directory (`mkdtemp`) under the daemon's temp
//! directory: only the daemon's own user (or root) can reach it, who can already
//! trace the daemon; the keeper removes it when it exits. A new one is forked and
//! exec'd with the fds it inherits (`upgrade.rs`'s `start`), connected to, then
//! adopted as the serving process, or given up on: ended and reaped.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use log::warn;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::channel;
use super::crash::Ending;
use super::event_loop::Keeper;
use super::upgrade::{self, Command};
use super::Error;
use crate::recovery::region::Half;

/// The private listening socket a serving process accepts the keeper on.
pub(super) struct Private {
    pub listener: UnixListener,
    pub path: PathBuf,
}

impl Private {
    pub fn bind() -> Result<Private, Error> {
        let template = std::env::temp_dir().join("volfsd-keeper.XXXXXX");
        let dir = nix::unistd::mkdtemp(&template)
            .map_err(|e| Error::io("making the keeper's directory", e.into()))?;
        let path = dir.join("serve.sock");
        let listener = UnixListener::bind(&path).map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            Error::io("binding the keeper's socket", e)
        })?;
        Ok(Private { listener, path })
    }

    pub fn remove(path: &Path) {
        let _ = std::fs::remove_file(path);
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Keeper<'_> {
    /// Starts a new serving process (of `command`, else the daemon's binary) with
    /// the fds it inherits, its journal half cleared first; connects to it for a
    /// session to hand over (`connect`).
    pub(super) fn spawn(
        &self,
        journal: Half,
        recover: Option<Half>,
        connect: bool,
        command: Option<&Command>,
        source: Option<&OwnedFd>,
    ) -> Result<Spawned, Error> {
        let command = command.or(self.command.as_ref()).ok_or(Error::NoBinary)?;
        self.region
            .clear_half(journal)
            .map_err(|source| Error::Region {
                step: "clearing the new serving process's journal half",
                source,
            })?;
        let private = Private::bind()?;
        let (channel, theirs) = channel::pair().map_err(|e| Error::io("socketpair", e))?;
        let inherited = upgrade::Inherited {
            listener: private.listener.as_raw_fd(),
            control: self.keep.control,
            channel: theirs.as_raw_fd(),
            region: self.region.fd().as_raw_fd(),
            journal,
            recover,
            volumes: self.volumes.clone(),
            source: source.map(|fd| fd.as_raw_fd()),
        };
        let started = upgrade::start(command, &inherited).and_then(|pid| {
            if !connect {
                return Ok((pid, None));
            }
            let new = UnixStream::connect(&private.path).map_err(|e| {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                Error::io("connecting to the new serving process", e)
            })?;
            Ok((pid, Some(new)))
        });
        drop((private.listener, theirs));
        let (pid, stream) = started.map_err(|e| {
            Private::remove(&private.path);
            Error::Start(Box::new(e))
        })?;
        Ok(Spawned {
            pid,
            started: std::time::Instant::now(),
            private: private.path,
            channel,
            stream,
            journal,
        })
    }

    /// From now on `new` is the serving process: its half is the journal of record.
    pub(super) fn adopt(&mut self, new: Spawned) {
        Private::remove(&self.private);
        let old_half = self.region.header().current();
        self.region.header().set_current(new.journal);
        if old_half != new.journal {
            // The old process's records: its successor has its own now.
            let _ = self.region.clear_half(old_half);
        }
        (self.child, self.private) = (new.pid, new.private);
        self.channel = Some(new.channel);
        self.started = new.started;
    }

    /// Starts a new serving process, with no session, in place of a dead one.
    pub(super) fn replace(&mut self) -> Result<(), Error> {
        let half = self.region.header().current();
        let new = self.spawn(half, None, false, None, None)?;
        self.adopt(new);
        self.served = false;
        Ok(())
    }
}

/// A serving process the keeper started, connected.
pub(super) struct Spawned {
    pub(super) pid: Pid,
    pub(super) started: std::time::Instant,
    /// Its private socket.
    pub(super) private: PathBuf,
    /// The keeper's end of its channel.
    pub(super) channel: UnixStream,
    /// The keeper's connection to it, for a session to hand over.
    pub(super) stream: Option<UnixStream>,
    /// The journal half it records into.
    pub(super) journal: Half,
}

impl Spawned {
    /// Gives up on this new serving process: its connection (`stream`) closed, its
    /// private socket removed; `why`, with how it ended if it ended by itself.
    pub(super) fn give_up(self, stream: UnixStream, why: Error) -> Error {
        drop(stream);
        Private::remove(&self.private);
        let pid = self.pid;
        drop(self);
        Error::GaveUp {
            why: Box::new(why),
            ending: ended(pid),
        }
    }
}

/// Waits (at most 2 s) for the child `pid`, killed, to be gone.
pub(super) fn reap(pid: Pid) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while let Ok(WaitStatus::StillAlive) = waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        if std::time::Instant::now() >= deadline {
            warn!("keeper: process {pid}, killed, is still there after 2 s");
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A pidfd of `pid` (pidfd_open), close-on-exec.
pub(super) fn pidfd_of(pid: Pid) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd nobody else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

/// Ends a new serving process the keeper gave up on, and says how it ended if it
/// ended by itself (it exited at once, it refused the state) within 200 ms; one
/// still running then is killed (None).
fn ended(pid: Pid) -> Option<Ending> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return Some(Ending::Exited(code)),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Some(Ending::Killed(sig)),
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                return None;
            }
            _ => return None,
        }
    }
}
