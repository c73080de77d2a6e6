//! The serving processes the keeper starts. Each serves on a private listening
//! socket (`private_socket.rs`). A new one is forked and
//! exec'd with the fds it inherits (`upgrade.rs`'s `start`), connected to, then
//! adopted as the serving process, or given up on: ended and reaped.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use log::warn;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::channel;
use super::crash::Ending;
use super::event_loop::Keeper;
use super::private_socket::Private;
use super::upgrade::{self, Command};
use super::Error;
use crate::region::Half;

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
            volumes: self.region.volumes(),
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use nix::errno::Errno;

    use super::*;
    use crate::keeper::testing::keeper;

    /// A child, reaped by its pid (what `ended` and `reap` do), not by `Child::wait`.
    #[allow(clippy::zombie_processes)]
    fn child(program: &str, args: &[&str]) -> Pid {
        let c = std::process::Command::new(program)
            .args(args)
            .spawn()
            .unwrap();
        Pid::from_raw(c.id() as i32)
    }

    /// True once `pid` is no longer this process's child (reaped).
    fn reaped(pid: Pid) -> bool {
        waitpid(pid, Some(WaitPidFlag::WNOHANG)) == Err(Errno::ECHILD)
    }

    #[test]
    fn ended_says_how_a_child_ended() {
        let pid = child("sh", &["-c", "exit 3"]);
        assert_eq!(ended(pid), Some(Ending::Exited(3)));
        assert!(reaped(pid));
        let pid = child("sleep", &["30"]);
        nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
        assert_eq!(ended(pid), Some(Ending::Killed(Signal::SIGTERM)));
        // Not a child (any more): nothing to say.
        assert_eq!(ended(pid), None);
    }

    #[test]
    fn ended_kills_a_child_still_running_after_200_ms() {
        let pid = child("sleep", &["30"]);
        let t0 = Instant::now();
        assert_eq!(ended(pid), None);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(reaped(pid));
    }

    #[test]
    fn reap_waits_for_a_killed_child() {
        let pid = child("sleep", &["30"]);
        nix::sys::signal::kill(pid, Signal::SIGKILL).unwrap();
        reap(pid);
        assert!(reaped(pid));
        // One already reaped: returns at once.
        let t0 = Instant::now();
        reap(pid);
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_pidfd_of_a_child_is_readable_once_it_ended() {
        let pid = child("sleep", &["30"]);
        let fd = pidfd_of(pid).unwrap();
        // SAFETY: fcntl on an fd we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let readable = |ms| {
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, ms) == 1 }
        };
        assert!(!readable(0));
        nix::sys::signal::kill(pid, Signal::SIGKILL).unwrap();
        assert!(readable(5000));
        reap(pid);
        // Gone: no pidfd.
        let e = pidfd_of(pid).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }

    #[test]
    fn without_a_binary_nothing_is_started() {
        let k = keeper(None);
        let private = k.keeper.private.clone();
        let e = k
            .keeper
            .spawn(Half::B, None, true, None, None)
            .err()
            .unwrap();
        assert!(matches!(e, Error::NoBinary), "{e}");
        assert_eq!(
            e.to_string(),
            "the daemon's binary was not found when it started"
        );
        assert!(private.exists(), "the serving process's socket stays");
    }

    #[test]
    fn a_new_serving_process_is_started_adopted_and_given_up_on() {
        let mut k = keeper(Some("exit 3"));
        let first = k.keeper.child;
        let old_private = k.keeper.private.clone();
        assert_eq!(k.keeper.region.header().current(), Half::A);
        // Started and connected (its private socket accepts before it runs).
        let mut new = k.keeper.spawn(Half::B, None, true, None, None).unwrap();
        k.children.push(new.pid);
        assert!(new.private.exists());
        let stream = new.stream.take().expect("connected");
        let e = new.give_up(stream, Error::Timeout);
        assert!(
            matches!(
                e,
                Error::GaveUp {
                    ending: Some(Ending::Exited(3)),
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "no answer in time (the new serving process exited with status 3)"
        );
        // Nothing changed for the serving process.
        assert_eq!(k.keeper.child, first);
        assert!(old_private.exists());
        assert_eq!(k.keeper.region.header().current(), Half::A);
        // One adopted: its half is the journal of record, its socket the keeper's.
        let new = k.keeper.spawn(Half::B, None, false, None, None).unwrap();
        assert!(new.stream.is_none());
        let (pid, private) = (new.pid, new.private.clone());
        k.keeper.adopt(new);
        assert_eq!(k.keeper.child, pid);
        assert_eq!(k.keeper.private, private);
        assert_eq!(k.keeper.region.header().current(), Half::B);
        assert!(!old_private.exists(), "the old one's socket is removed");
        assert!(k.keeper.channel.is_some());
    }

    #[test]
    fn a_dead_serving_process_is_replaced_on_the_same_half() {
        let mut k = keeper(Some("exit 0"));
        let first = k.keeper.child;
        k.keeper.served = true;
        k.keeper.replace().unwrap();
        assert_ne!(k.keeper.child, first);
        assert!(!k.keeper.served);
        assert_eq!(k.keeper.region.header().current(), Half::A);
        reap(k.keeper.child);
    }
}
