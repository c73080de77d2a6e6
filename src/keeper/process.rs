//! Where the keeper runs: with `--upgradable`, the daemon forks right after it bound
//! its sockets, before the sandbox (in every `--sandbox` mode). The parent is the
//! keeper: it keeps the vhost-user listening socket, accepts the frontend and relays
//! to the child, which serves as it always did, but on a private listening socket
//! whose only client is the keeper. The keeper stays outside the sandbox (a new
//! serving process must be started from there) and lives as long as the daemon: it
//! forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT to the serving process and exits with its
//! status, as the namespace mode's supervisor does (which, in that mode, runs below
//! it, around the serving process). SIGHUP is the keeper's own: an upgrade
//! (`upgrade.rs`).
//!
//! A serving process that crashes while the keeper waits for a frontend is
//! replaced by a new one, unless that makes a crash loop (`crash.rs`).
//!
//! The private socket is bound in a new 0700 directory (`mkdtemp`) under the
//! daemon's temp directory: only the daemon's own user (or root) can reach it, who
//! can already trace the daemon. The keeper removes it when it exits.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use log::{info, warn};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use vhost::vhost_user::Listener;

use super::channel;
use super::crash::{Crashes, Ending, CRASH_LOOP, QUICK};
use super::relay::{Flow, Relay};
use super::replay;
use super::upgrade::{self, Command, STEP_TIMEOUT};
use super::Error;
use crate::recovery::region::{Half, PauseKind, Region};

/// Signals the keeper passes on to the serving process.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

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

/// Forks the keeper off. Returns in the child only, with the listener it serves
/// on and its end of the keeper's channel; the keeper never returns. Call while the
/// process has one thread.
pub fn split(frontend: Listener, keep: Keep) -> Result<(Listener, OwnedFd), Error> {
    // The session region outlives every serving process: the keeper makes it, the
    // first serving process shares it through the fork (recovery/region.rs).
    let region = Region::create().map_err(|e| Error::io("the session region", io_error(e)))?;
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
            let region = crate::recovery::set_region(region);
            crate::fs::journal::start(region, Half::A);
            // Only the keeper accepts the frontend. Not dropped: the Listener would
            // remove the socket file.
            let fd = frontend.as_raw_fd();
            std::mem::forget(frontend);
            // SAFETY: the fd was the listener's, forgotten above; closed once.
            unsafe { libc::close(fd) };
            drop(channel);
            Ok((Listener::from(private.listener), theirs))
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
                    volumes: None,
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

/// The keeper's state.
struct Keeper<'a> {
    /// The serving process.
    child: Pid,
    frontend: Listener,
    /// Its private socket.
    private: PathBuf,
    keep: Keep<'a>,
    /// What starts a new serving process (None: upgrades are not possible).
    command: Option<Command>,
    /// The keeper's end of the serving process's channel.
    channel: Option<UnixStream>,
    /// The volumes the serving process last said it has attached (JSON): a process
    /// started after an upgrade or a crash attaches them first.
    volumes: Option<String>,
    /// The session region: its header says which journal half the serving process
    /// records into, and holds the counters every serving process shows.
    region: Region,
    /// The serving process has (or had, until it ended the connection) a
    /// frontend's session.
    served: bool,
    crashes: Crashes,
    /// When the serving process started (a crash soon after is a quick one).
    started: std::time::Instant,
    /// When the serving process's end of the relay closed with a frontend still
    /// connected: it died (its end comes first, SIGCHLD after), or it ended the
    /// session itself. The frontend's messages wait until SIGCHLD tells.
    backend_gone: Option<std::time::Instant>,
}

/// How long the keeper waits for SIGCHLD after the serving process closed its end
/// of a frontend's session: one that closed it without dying ended the session.
const DEATH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl Keeper<'_> {
    fn run(mut self, mut sigfd: SignalFd, private: Private) -> ! {
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

    /// The serving process ended: the keeper ends too, or starts a new one in its
    /// place: one that takes over the guest's session on the same rings after a
    /// crash under it, or a fresh one while the keeper waits for a frontend.
    fn on_end(&mut self, how: Ending, waiting: bool, relay: &mut Option<Relay>) {
        let code = match how {
            Ending::Exited(code) => code,
            Ending::Killed(_) => 1,
        };
        let died_at = self
            .backend_gone
            .take()
            .unwrap_or_else(std::time::Instant::now);
        if !how.is_crash() {
            self.exit(code);
        }
        if relay.is_none() && !waiting {
            // Its frontend left without --keep-serving: it was ending anyway.
            eprintln!("volfsd: keeper: the serving process {how} after its frontend left");
            self.exit(code);
        }
        let loops = self.crashes.record(std::time::Instant::now(), self.started);
        self.region
            .header()
            .counters
            .crashes
            .store(self.crashes.total(), Ordering::Relaxed);
        if loops {
            eprintln!(
                "volfsd: keeper: the serving process {how}: {CRASH_LOOP} crashes in a row, \
                 each within {} s of its start: a crash loop: ending",
                QUICK.as_secs()
            );
            self.exit(code);
        }
        let old = self.child;
        let with_session = relay.is_some();
        let replaced = match relay.as_mut() {
            Some(r) => self.recover(r, died_at).map(Some),
            None => self.replace().map(|()| None).map_err(|e| e.to_string()),
        };
        let tally = format!(
            "crash {}, {} in a row",
            self.crashes.total(),
            self.crashes.in_a_row()
        );
        match replaced {
            Ok(Some(pause)) => warn!(
                "keeper: the serving process {old} {how} under the guest's session; serving \
                 process {} took over its rings and the guest's session (the guest waited \
                 {} ms; {tally})",
                self.child,
                pause.as_millis()
            ),
            Ok(None) => warn!(
                "keeper: the serving process {old} {how}; serving process {} took its \
                 place ({tally})",
                self.child
            ),
            Err(e) if with_session => {
                self.fail(&format!("the serving process {how}, with the frontend's session: the guest's session could not be taken over: {e}"))
            }
            Err(e) => self.fail(&format!("the serving process {how}; starting another: {e}")),
        }
    }

    /// Starts a new serving process (of `command`, else the daemon's binary) with
    /// the fds it inherits, its journal half cleared first; connects to it for a
    /// session to hand over (`connect`).
    fn spawn(
        &self,
        journal: Half,
        recover: Option<Half>,
        connect: bool,
        command: Option<&Command>,
        source: Option<&OwnedFd>,
    ) -> Result<Spawned, String> {
        let command = command
            .or(self.command.as_ref())
            .ok_or_else(|| Error::NoBinary.to_string())?;
        self.region.clear_half(journal).map_err(|e| e.to_string())?;
        let private = Private::bind().map_err(|e| e.to_string())?;
        let (channel, theirs) = channel::pair().map_err(|e| format!("socketpair: {e}"))?;
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
            format!("starting the new serving process: {e}")
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
    fn adopt(&mut self, new: Spawned) {
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
    fn replace(&mut self) -> Result<(), String> {
        let half = self.region.header().current();
        let new = self.spawn(half, None, false, None, None)?;
        self.adopt(new);
        self.served = false;
        Ok(())
    }

    /// After a crash under the guest's session: a new serving process serves the
    /// guest on from the journal the dead one left, on the same rings, which the
    /// keeper sets up in it as the frontend did; the requests the dead one had
    /// taken are answered there. The frontend sees no disconnect. The guest's pause
    /// counts from `died_at` to the rings running again.
    fn recover(
        &mut self,
        relay: &mut Relay,
        died_at: std::time::Instant,
    ) -> Result<std::time::Duration, String> {
        if let Some(why) = &relay.session().unreplayable {
            return Err(format!("the session cannot be replayed: {why}"));
        }
        let from = self.region.header().current();
        let mut new = self.spawn(from.other(), Some(from), true, None, None)?;
        let stream = new.stream.take().expect("connected");
        let set_up = replay::ready(&stream, STEP_TIMEOUT)
            .and_then(|()| {
                replay::set_up(&stream, relay.session(), &Default::default(), STEP_TIMEOUT)
            })
            .and_then(|()| replay::run(&stream, &replay::start(relay.session()), STEP_TIMEOUT));
        if let Err(e) = set_up {
            let pid = new.pid;
            Private::remove(&new.private);
            drop((new, stream));
            return Err(format!("{e}{}", ended(pid)));
        }
        replay::nudge(relay.session());
        drop(relay.switch(stream));
        self.adopt(new);
        let pause = died_at.elapsed();
        let c = &self.region.header().counters;
        c.recoveries.fetch_add(1, Ordering::Relaxed);
        c.add_pause(PauseKind::Recovery, pause);
        // The frontend's message the dead process did not answer, if one.
        if let Err(e) = relay.resend_unanswered() {
            warn!("keeper: the frontend's message the dead process did not answer: {e}");
        }
        Ok(pause)
    }

    /// The frontend handed back a session region not this keeper's
    /// (`SET_INFLIGHT_FD`, cloud-hypervisor's reconnect after the whole daemon was
    /// restarted: inflight.rs). One with a guest's session in it is served on;
    /// anything else leaves the fresh session as it is. Acked either way: the
    /// frontend goes on setting the rings up.
    fn handed_back(&mut self, relay: &mut Relay) {
        let Some((msg, fd)) = relay.take_handed_back() else {
            return;
        };
        let t0 = std::time::Instant::now();
        match self.resume_region(relay, fd) {
            Ok(true) => {
                relay.nudge_when_enabled();
                warn!(
                    "keeper: the frontend handed back the session region of an earlier daemon \
                 (SET_INFLIGHT_FD): serving process {} took over the guest's session from \
                 it ({} ms; the rings start as the frontend sets them up)",
                    self.child,
                    t0.elapsed().as_millis()
                )
            }
            Ok(false) => info!(
                "keeper: the frontend handed back a session region with no session in it: \
                 a fresh session"
            ),
            Err(e) => warn!(
                "keeper: the frontend handed back a session region (SET_INFLIGHT_FD) that \
                 cannot be served on: {e}; a fresh session (the guest's requests in flight \
                 then are not answered)"
            ),
        }
        if let Err(e) = relay.ack(&msg) {
            warn!("keeper: acking SET_INFLIGHT_FD: {e}");
        }
    }

    /// Adopts the region `fd` if it holds a session: a new serving process loads the
    /// session from its journal, is set up as the frontend has set this one up so
    /// far, and serves in place of the fresh one. Ok(false): no session in it.
    fn resume_region(&mut self, relay: &mut Relay, fd: OwnedFd) -> Result<bool, String> {
        let region = Region::open(fd).map_err(|e| e.to_string())?;
        if !region.header().in_session() {
            return Ok(false);
        }
        if let Some(why) = &relay.session().unreplayable {
            return Err(format!("the session cannot be replayed: {why}"));
        }
        let ours = std::mem::replace(&mut self.region, region);
        // The volumes stay this daemon's own (its command line, and what its control
        // socket attached since it started): the region's list is untrusted, and the
        // new serving process only checks it against them (fs/session_load.rs).
        let from = self.region.header().current();
        let set_up = self
            .spawn(from.other(), Some(from), true, None, None)
            .and_then(|mut new| {
                let stream = new.stream.take().expect("connected");
                let done = replay::ready(&stream, STEP_TIMEOUT).and_then(|()| {
                    replay::set_up(&stream, relay.session(), &Default::default(), STEP_TIMEOUT)
                });
                match done {
                    Ok(()) => Ok((new, stream)),
                    Err(e) => {
                        let pid = new.pid;
                        Private::remove(&new.private);
                        drop((new, stream));
                        Err(format!("{e}{}", ended(pid)))
                    }
                }
            });
        let (new, stream) = match set_up {
            Ok(v) => v,
            Err(e) => {
                self.region = ours;
                return Err(e);
            }
        };
        let fresh = self.child;
        drop(relay.switch(stream));
        match self.region.fd().try_clone_to_owned() {
            Ok(fd) => relay.set_region(fd),
            Err(e) => warn!("keeper: no inflight fd for the frontend: {e}"),
        }
        self.adopt(new);
        // The fresh process served nothing; its region is gone with `ours`. It is
        // reaped before the takeover is told: until then it still accepted on the
        // control socket beside its successor, and answered a client for volumes it
        // did not have (in namespace mode the keeper's child is its supervisor, whose
        // death kills the serving process below it: both are gone once it is reaped).
        let _ = nix::sys::signal::kill(fresh, Signal::SIGKILL);
        reap(fresh);
        drop(ours);
        // From now on the region holds this daemon's own list.
        if let Some(volumes) = &self.volumes {
            if let Err(e) = self.region.set_volumes(volumes) {
                warn!("keeper: keeping the attached volumes in the session region: {e}");
            }
        }
        let c = &self.region.header().counters;
        c.crashes.fetch_add(1, Ordering::Relaxed);
        c.recoveries.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// SIGHUP or the channel: a new serving process takes over (upgrade.rs), or
    /// the old one serves on and the error says why. [`Keeper::finish`] completes it.
    fn upgrade(&self, relay: Option<&mut Relay>, binary: Option<&Path>) -> Result<Pending, String> {
        let Some(relay) = relay else {
            return Err("no frontend is connected (nothing to hand over)".into());
        };
        let command = match (binary, &self.command) {
            (Some(b), Some(c)) => Some(c.with_binary(b)?),
            (Some(_), None) => return Err(Error::NoBinary.to_string()),
            (None, _) => None,
        };
        let half = self.region.header().current().other();
        // The new process takes the guest's lock files only from the one it replaces.
        let source = pidfd_of(self.child)
            .map_err(|e| warn!("keeper: no pidfd of serving process {}: {e}", self.child))
            .ok();
        let mut new = self.spawn(half, None, true, command.as_ref(), source.as_ref())?;
        let stream = new.stream.take().expect("connected");
        match upgrade::hand_over(relay, stream) {
            Ok(done) => Ok(Pending {
                new,
                old: done.old,
                pause: done.pause,
                command,
            }),
            Err((e, stream)) => {
                drop(stream);
                let pid = new.pid;
                Private::remove(&new.private);
                drop(new);
                Err(format!("{e}{}", ended(pid)))
            }
        }
    }

    /// Logs an upgrade's outcome and, when it succeeded, lets the old process go:
    /// its frontend gone, it exits (with --keep-serving it would wait for the next
    /// one: told to go).
    fn finish(&mut self, outcome: Result<Pending, String>) {
        let counters = &self.region.header().counters;
        let done = match outcome {
            Ok(done) => done,
            Err(why) => {
                counters.upgrades_failed.fetch_add(1, Ordering::Relaxed);
                return warn!(
                    "keeper: upgrade failed, serving process {} serves on: {why}",
                    self.child
                );
            }
        };
        info!(
            "keeper: upgraded: serving process {} took over from {} (the guest waited {} ms)",
            done.new.pid,
            self.child,
            done.pause.as_millis()
        );
        counters.upgrades.fetch_add(1, Ordering::Relaxed);
        counters.add_pause(PauseKind::Upgrade, done.pause);
        drop(done.old);
        let _ = nix::sys::signal::kill(self.child, Signal::SIGTERM);
        if let Some(c) = done.command {
            info!(
                "keeper: the daemon's binary is {} from now on",
                c.binary.display()
            );
            self.command = Some(c);
        }
        self.adopt(done.new);
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
                channel::answer(
                    &ch,
                    &outcome.as_ref().map(|p| p.pause).map_err(Clone::clone),
                );
                self.channel = Some(ch);
                self.finish(outcome);
            }
            Some(line) if line.starts_with(channel::VOLUMES) => {
                let volumes = line[channel::VOLUMES.len()..].to_string();
                // Also in the region: a keeper started after this one died gets it
                // back with the region (the frontend's SET_INFLIGHT_FD).
                if let Err(e) = self.region.set_volumes(&volumes) {
                    warn!("keeper: keeping the attached volumes in the session region: {e}");
                }
                self.volumes = Some(volumes);
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

    fn fail(&self, why: &str) -> ! {
        eprintln!("volfsd: keeper: {why}");
        let _ = nix::sys::signal::kill(self.child, Signal::SIGKILL);
        self.exit(1)
    }

    fn exit(&self, code: i32) -> ! {
        Private::remove(&self.private);
        // The serving processes leave the vhost-user socket to the keeper.
        for s in self.keep.sockets {
            crate::sandbox::namespaces::remove_socket(s);
        }
        log::logger().flush();
        std::process::exit(code)
    }
}

/// A serving process the keeper started, connected.
struct Spawned {
    pid: Pid,
    started: std::time::Instant,
    /// Its private socket.
    private: PathBuf,
    /// The keeper's end of its channel.
    channel: UnixStream,
    /// The keeper's connection to it, for a session to hand over.
    stream: Option<UnixStream>,
    /// The journal half it records into.
    journal: Half,
}

/// An upgrade done but for letting the old process go.
struct Pending {
    new: Spawned,
    old: UnixStream,
    pause: std::time::Duration,
    /// The binary named for it (`ctl upgrade --binary`): the daemon's from now on.
    command: Option<Command>,
}

/// Waits (at most 2 s) for the child `pid`, killed, to be gone.
fn reap(pid: Pid) {
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
fn pidfd_of(pid: Pid) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd nobody else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

/// Ends a new serving process an upgrade gave up on, and says how it ended if it
/// ended by itself (it exited at once, it refused the state).
fn ended(pid: Pid) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => {
                return format!(" (the new serving process exited with status {code})")
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return format!(" (the new serving process was killed by {sig})")
            }
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                return String::new();
            }
            _ => return String::new(),
        }
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
