//! The keeper's loop: it waits on its signals, the serving process's channel
//! (`channel.rs`), and the two ends of the relay (`relay.rs`), or the frontend's
//! listener while no frontend is connected. It forwards SIGTERM/SIGINT/SIGQUIT to
//! the serving process and exits with its status, as the namespace mode's
//! supervisor does (which, in that mode, runs below it, around the serving
//! process). SIGHUP is the keeper's own: an upgrade, as `PUT /upgrade` on the
//! channel asks for (`takeover.rs`). A child that ended is reaped here; a serving
//! process that ended is replaced or ends the keeper (`takeover.rs`, `crash.rs`).

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use log::{info, warn};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use vhost::vhost_user::Listener;

use super::channel;
use super::crash::{Crashes, Ending};
use super::private_socket::Private;
use super::relay::{Flow, Relay};
use super::upgrade::Command;
use crate::region::Region;

/// What the keeper needs besides the frontend's listener.
pub struct Keep<'a> {
    /// The control socket's listener: the keeper keeps it for a new serving process.
    pub control: Option<RawFd>,
    /// Fds the keeper closes at once: the child's alone.
    pub close: &'a [RawFd],
    /// Socket files removed if the serving process is killed before it could.
    pub sockets: &'a [PathBuf],
    /// `--keep-serving`: after a frontend leaves, wait for the next.
    pub keep_serving: bool,
}

/// The keeper's state.
pub(super) struct Keeper<'a> {
    /// The serving process.
    pub(super) child: Pid,
    pub(super) frontend: Listener,
    /// Its private socket.
    pub(super) private: PathBuf,
    pub(super) keep: Keep<'a>,
    /// What starts a new serving process (None: upgrades are not possible).
    pub(super) command: Option<Command>,
    /// The keeper's end of the serving process's channel.
    pub(super) channel: Option<UnixStream>,
    /// The session region: its header says which journal half the serving process
    /// records into, and holds the counters every serving process shows; its
    /// volumes slot is the one place the keeper keeps the volumes the serving
    /// process last said it has attached (a process started after an upgrade or a
    /// crash attaches them first).
    pub(super) region: Region,
    /// The serving process has (or had, until it ended the connection) a
    /// frontend's session.
    pub(super) served: bool,
    pub(super) crashes: Crashes,
    /// When the serving process started (a crash soon after is a quick one).
    pub(super) started: std::time::Instant,
    /// When the serving process's end of the relay closed with a frontend still
    /// connected: it died (its end comes first, SIGCHLD after), or it ended the
    /// session itself. The frontend's messages wait until SIGCHLD tells.
    pub(super) backend_gone: Option<std::time::Instant>,
}

/// How long the keeper waits for SIGCHLD after the serving process closed its end
/// of a frontend's session: one that closed it without dying ended the session.
const DEATH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Keeper<'_> {
    pub(super) fn run(mut self, mut sigfd: SignalFd, private: Private) -> ! {
        // The keeper connects; the child accepts.
        drop(private.listener);
        let mut relay: Option<Relay> = None;
        let mut accepting = true;
        loop {
            let mut fds = vec![sigfd.as_raw_fd()];
            let asked = self.channel.as_ref().map(|c| {
                fds.push(c.as_raw_fd());
                fds.len() - 1
            });
            let at = fds.len();
            match &relay {
                // The serving process's end closed: nothing is relayed until SIGCHLD
                // says whether it died.
                Some(_) if self.backend_gone.is_some() => {}
                Some(r) => fds.extend([r.frontend().as_raw_fd(), r.backend().as_raw_fd()]),
                None if accepting => fds.push(self.frontend.as_raw_fd()),
                None => {}
            }
            let timeout = self
                .backend_gone
                .map(|t| DEATH_WAIT.saturating_sub(t.elapsed()));
            let ready = match poll(&fds, timeout) {
                Ok(r) => r,
                Err(e) => self.fail(&format!("poll: {e}")),
            };
            let waiting = relay.is_none() && accepting;
            // Polled again after any signal: a serving process replaced after a
            // crash has a new channel (the old one's hang-up is stale).
            if ready[0] {
                if self.on_signal(&mut sigfd, waiting, &mut relay) {
                    let outcome = self.upgrade(relay.as_mut(), None);
                    self.finish(outcome);
                }
                continue;
            }
            if asked.is_some_and(|i| ready[i]) {
                self.on_channel(relay.as_mut());
                continue;
            }
            if self.backend_gone.is_some_and(|t| t.elapsed() >= DEATH_WAIT) {
                // It closed the session and lives on (it ended the session itself).
                self.backend_gone = None;
                info!("keeper: the serving process ended the connection");
                self.session_over(&mut relay);
                accepting = self.keep.keep_serving;
                continue;
            }
            let flow = match (&mut relay, ready.get(at), ready.get(at + 1)) {
                (Some(_), _, _) if self.backend_gone.is_some() => continue,
                (Some(r), Some(true), _) => r.relay_frontend(),
                (Some(r), _, Some(true)) => r.relay_backend(),
                (None, Some(true), _) => {
                    relay = self.accept();
                    self.served |= relay.is_some();
                    continue;
                }
                _ => continue,
            };
            let why = match flow {
                Ok(Flow::Relayed) => continue,
                Ok(Flow::FrontendClosed) => {
                    self.served = false;
                    "the frontend disconnected".to_string()
                }
                Ok(Flow::HandedBack) => {
                    if let Some(r) = relay.as_mut() {
                        self.handed_back(r);
                    }
                    continue;
                }
                Ok(Flow::BackendClosed) => {
                    // Died, most likely: SIGCHLD decides (on_end).
                    self.backend_gone = Some(std::time::Instant::now());
                    continue;
                }
                Err(e) => format!("relaying: {e}"),
            };
            info!("keeper: {why}");
            // Both connections close: the serving process sees its frontend leave.
            self.session_over(&mut relay);
            accepting = self.keep.keep_serving;
        }
    }

    /// The frontend's session ended: both connections close, and what the region
    /// kept of the rings goes (the serving process forgets its journal itself).
    fn session_over(&mut self, relay: &mut Option<Relay>) {
        *relay = None;
        self.backend_gone = None;
        self.region.header().set_in_session(false);
        if let Err(e) = self.region.clear_queues() {
            warn!("keeper: {e}");
        }
    }

    /// Accepts the frontend and connects to the serving process for it.
    fn accept(&self) -> Option<Relay> {
        let frontend = match self.frontend.accept() {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(e) => self.fail(&format!("accepting the frontend: {e}")),
        };
        match UnixStream::connect(&self.private) {
            Ok(backend) => {
                let _ = self.region.clear_queues();
                self.region.header().set_in_session(true);
                let mut relay = Relay::new(frontend, backend);
                match self.region.fd().try_clone_to_owned() {
                    Ok(fd) => relay.set_region(fd),
                    Err(e) => warn!("keeper: no inflight fd for the frontend: {e}"),
                }
                Some(relay)
            }
            Err(e) => {
                warn!("keeper: connecting to the serving process: {e}");
                None
            }
        }
    }

    /// Handles a signal; true for SIGHUP, which asks for an upgrade. `waiting`: the
    /// keeper waits for a frontend (a crash then is recovered).
    fn on_signal(
        &mut self,
        sigfd: &mut SignalFd,
        waiting: bool,
        relay: &mut Option<Relay>,
    ) -> bool {
        let Ok(Some(info)) = sigfd.read_signal() else {
            return false;
        };
        let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
            return false;
        };
        match sig {
            Signal::SIGHUP => return true,
            Signal::SIGCHLD => {}
            _ => {
                let _ = nix::sys::signal::kill(self.child, sig);
                return false;
            }
        }
        // Any child: the serving process, or one an upgrade replaced or gave up on.
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            let (pid, how) = match status {
                WaitStatus::Exited(pid, code) => (pid, Ending::Exited(code)),
                WaitStatus::Signaled(pid, sig, _) => (pid, Ending::Killed(sig)),
                _ => break,
            };
            if pid != self.child {
                info!("keeper: former serving process {pid} ended ({how})");
                continue;
            }
            self.on_end(how, waiting, relay);
        }
        false
    }

    /// A request on the serving process's channel (`PUT /upgrade`).
    fn on_channel(&mut self, relay: Option<&mut Relay>) {
        let Some(ch) = self.channel.take() else {
            return;
        };
        match channel::read_request(&ch).as_deref() {
            Some(line)
                if line == channel::UPGRADE
                    || line.starts_with(&format!("{} ", channel::UPGRADE)) =>
            {
                let binary = line
                    .strip_prefix(channel::UPGRADE)
                    .map(str::trim_start)
                    .filter(|b| !b.is_empty())
                    .map(Path::new);
                let outcome = self.upgrade(relay, binary);
                channel::answer(&ch, outcome.as_ref().map(|p| p.pause));
                self.channel = Some(ch);
                self.finish(outcome);
            }
            Some(line) if line.starts_with(channel::VOLUMES) => {
                let volumes = &line[channel::VOLUMES.len()..];
                if let Err(e) = self.region.set_volumes(volumes) {
                    warn!("keeper: keeping the attached volumes in the session region: {e}");
                }
                self.channel = Some(ch);
            }
            Some(other) => {
                warn!("keeper: unknown request on the channel: {other:?}");
                self.channel = Some(ch);
            }
            // The serving process closed it (it is exiting): nothing more from it.
            None => {}
        }
    }

    pub(super) fn fail(&self, why: &str) -> ! {
        eprintln!("volfsd: keeper: {why}");
        let _ = nix::sys::signal::kill(self.child, Signal::SIGKILL);
        self.exit(1)
    }

    pub(super) fn exit(&self, code: i32) -> ! {
        Private::remove(&self.private);
        // The serving processes leave the vhost-user socket to the keeper.
        for s in self.keep.sockets {
            crate::sandbox::socket_path::remove_socket(s);
        }
        log::logger().flush();
        std::process::exit(code)
    }
}

/// Waits until one of `fds` is readable or hung up (or `timeout` passed); says
/// which.
fn poll(fds: &[RawFd], timeout: Option<std::time::Duration>) -> Result<Vec<bool>, std::io::Error> {
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `p` is a valid array of pollfds of the given length.
        let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        if n >= 0 {
            return Ok(p.iter().map(|p| p.revents != 0).collect());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn poll_says_which_fds_are_readable_or_hung_up() {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, d) = UnixStream::pair().unwrap();
        let fds = [a.as_raw_fd(), c.as_raw_fd()];
        // Nothing yet: the timeout passes.
        let t0 = Instant::now();
        let ready = poll(&fds, Some(Duration::from_millis(20))).unwrap();
        assert_eq!(ready, vec![false, false]);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        // Readable.
        (&d).write_all(b"x").unwrap();
        assert_eq!(poll(&fds, None).unwrap(), vec![false, true]);
        // Hung up counts too (the peer closed: the relay's end of a dead process).
        drop(b);
        assert_eq!(poll(&fds, Some(Duration::ZERO)).unwrap(), vec![true, true]);
    }

    #[test]
    fn poll_reports_an_fd_that_is_not_open_rather_than_waiting_on_it() {
        // POLLNVAL: set in revents, so the caller sees it at once.
        let ready = poll(&[-1, 1_000_000], Some(Duration::from_millis(10))).unwrap();
        assert_eq!(ready, vec![false, true]);
    }

    #[test]
    fn a_long_timeout_is_capped_not_wrapped() {
        let (a, b) = UnixStream::pair().unwrap();
        (&b).write_all(b"x").unwrap();
        let ready = poll(&[a.as_raw_fd()], Some(Duration::from_secs(u64::MAX))).unwrap();
        assert_eq!(ready, vec![true]);
    }
}
