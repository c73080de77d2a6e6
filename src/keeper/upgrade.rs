//! An upgrade through the keeper: a new serving process (the binary the daemon was
//! started from, as it is on disk now) takes over the frontend's session from the
//! old one, on the same rings, with the guest's session moved as a device state.
//!
//! The keeper plays the frontend of a same-host migration between the two:
//! 1. the new process is started with a private listener and connected to;
//! 2. the old process's rings stop (`GET_VRING_BASE`: where each stopped);
//! 3. the old process saves its state (`SET_DEVICE_STATE_FD` SAVE into a pipe, then
//!    `CHECK_DEVICE_STATE`): node ids, handles, parked requests, and where its lock
//!    files are offered (`handoff/`);
//! 4. the new process is set up by the replay, with the old bases;
//! 5. it loads the state (LOAD, `CHECK_DEVICE_STATE`), taking the very lock files
//!    from the old process (same host: the locks are held throughout);
//! 6. its rings start, the relay switches to it, and the old process, its frontend
//!    gone, exits.
//!
//! Anything that fails from 2 on kills the new process and starts the old rings
//! again where they stopped: the old process serves on (a saved state does not end
//! its session). The frontend's messages wait in its socket meanwhile.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::{fork, ForkResult, Pid};
use vhost::vhost_user::message::FrontendReq;

use super::relay::Relay;
use super::replay::{self, Step};
use super::Error;
use crate::region::Half;

/// How long each message of the hand-over may take (the first waits for the new
/// process to start and confine itself).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// The flag a serving process started by the keeper gets: the fd of its private
/// listener (hidden from `--help`).
pub const LISTEN_FD_FLAG: &str = "--keeper-listen-fd";
/// And the fd of the control socket's listener.
pub const CONTROL_FD_FLAG: &str = "--keeper-control-fd";
/// And the fd of its end of the keeper's channel (`channel.rs`).
pub const CHANNEL_FD_FLAG: &str = "--keeper-channel-fd";
/// And the fd of the session region (`src/region/`).
pub const REGION_FD_FLAG: &str = "--keeper-region-fd";
/// And the journal half it records into (0 or 1; the keeper cleared it).
pub const JOURNAL_FLAG: &str = "--keeper-journal";
/// And, after a crash under a guest's session, the half the dead process recorded
/// into: the new process serves the guest on from it.
pub const RECOVER_FLAG: &str = "--keeper-recover";
/// The volumes to attach first (the control API's bodies), as the old process had.
pub const VOLUMES_FLAG: &str = "--keeper-volumes";
/// And, for an upgrade, a pidfd of the serving process it replaces: the only peer
/// its load takes the guest's lock files from (`handoff/`).
pub const SOURCE_PIDFD_FLAG: &str = "--keeper-source-pidfd";

/// What the daemon was started as, kept to start its successor.
#[derive(Clone, Debug)]
pub struct Command {
    pub binary: PathBuf,
    pub args: Vec<OsString>,
}

impl Command {
    /// This process's binary and arguments, as started.
    pub fn current() -> Result<Command, Error> {
        let binary = std::env::current_exe().map_err(|e| Error::io("finding the binary", e))?;
        Ok(Command {
            binary,
            args: std::env::args_os().skip(1).collect(),
        })
    }
}

impl Command {
    /// The same arguments with `binary`, an operator's choice (`ctl upgrade
    /// --binary`), checked first: the keeper runs it as the daemon's user, outside
    /// the sandbox, so as sudo checks what it runs: an absolute path to a regular,
    /// executable file owned by root or the daemon's user, writable by no one else,
    /// in a directory alike.
    pub fn with_binary(&self, binary: &Path) -> Result<Command, Refusal> {
        if !binary.is_absolute() {
            return Err(Refusal::Relative(binary.to_path_buf()));
        }
        let path = std::fs::canonicalize(binary).map_err(|source| Refusal::Unreadable {
            path: binary.to_path_buf(),
            source,
        })?;
        // SAFETY: geteuid cannot fail.
        let own = unsafe { libc::geteuid() };
        let m = safe(&path, "the binary", own)?;
        if !m.is_file() || m.mode() & 0o111 == 0 {
            return Err(Refusal::NotExecutable(path));
        }
        if let Some(dir) = path.parent() {
            safe(dir, "its directory", own)?;
        }
        Ok(Command {
            binary: path,
            args: self.args.clone(),
        })
    }
}

/// `p` (`what`: the binary or its directory), if owned by root or `own` and
/// writable by no one else.
fn safe(p: &Path, what: &'static str, own: u32) -> Result<std::fs::Metadata, Refusal> {
    let m = std::fs::metadata(p).map_err(|source| Refusal::Unreadable {
        path: p.to_path_buf(),
        source,
    })?;
    if m.uid() != 0 && m.uid() != own {
        return Err(Refusal::Owner {
            what,
            path: p.to_path_buf(),
            uid: m.uid(),
        });
    }
    if m.mode() & 0o022 != 0 {
        return Err(Refusal::Writable {
            what,
            path: p.to_path_buf(),
            mode: m.mode() & 0o7777,
        });
    }
    Ok(m)
}

/// Why the keeper does not run a binary named by `ctl upgrade --binary`.
#[derive(Debug)]
pub enum Refusal {
    /// Not an absolute path.
    Relative(PathBuf),
    /// The path (the binary, or its directory) cannot be resolved or looked at.
    Unreadable { path: PathBuf, source: io::Error },
    /// `what` (the binary or its directory) is owned by another user than root or
    /// the daemon's.
    Owner {
        what: &'static str,
        path: PathBuf,
        uid: u32,
    },
    /// `what` is writable by its group or others.
    Writable {
        what: &'static str,
        path: PathBuf,
        mode: u32,
    },
    /// Not a regular file with an execute bit.
    NotExecutable(PathBuf),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Relative(p) => write!(f, "--binary {}: not an absolute path", p.display()),
            Refusal::Unreadable { path, source } => {
                write!(f, "--binary {}: {source}", path.display())
            }
            Refusal::Owner { what, path, uid } => write!(
                f,
                "--binary: {what} {} is owned by uid {uid}, not root or the daemon's user",
                path.display()
            ),
            Refusal::Writable { what, path, mode } => write!(
                f,
                "--binary: {what} {} is writable by its group or others (mode {mode:o})",
                path.display()
            ),
            Refusal::NotExecutable(p) => {
                write!(
                    f,
                    "--binary {}: not an executable regular file",
                    p.display()
                )
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// A successful upgrade: the old process's connection (closing it ends that
/// process) and how long the guest's requests waited.
pub struct Upgraded {
    pub old: UnixStream,
    pub pause: Duration,
}

/// Runs steps 2–6 with the new process connected on `new`, once it answers; before
/// them, the pre-copy of the nodes ([`precopy`]).
pub fn hand_over(relay: &mut Relay, new: UnixStream) -> Result<Upgraded, (Error, UnixStream)> {
    if let Some(why) = relay.setup().unreplayable {
        return Err((Error::Unreplayable(why), new));
    }
    // The new process's start-up (exec, sandbox) outside the guest's pause.
    if let Err(e) = replay::ready(&new, STEP_TIMEOUT) {
        return Err((e, new));
    }
    // And the nodes' system calls: the old process serves on meanwhile.
    let before = Instant::now();
    let precopied = match precopy(relay.backend(), &new) {
        Ok(()) => true,
        Err(e) => {
            log::warn!(
                "keeper: no pre-copy for this upgrade ({e}): the state moves whole in the pause"
            );
            false
        }
    };
    let precopy_took = before.elapsed();
    let start = Instant::now();
    let mut steps = Steps::default();
    let bases = match relay.stop_rings(STEP_TIMEOUT) {
        Ok(b) => b,
        Err(e) => return Err((e, new)),
    };
    steps.mark("stop", start);
    let moved = save(relay.backend(), precopied).and_then(|state| {
        steps.mark("save", start);
        replay::set_up(&new, relay.setup(), &bases, STEP_TIMEOUT)?;
        steps.mark("set up", start);
        let state = match load(&new, &state) {
            // A node of the preview the new process could not preload (renamed
            // while it was taken, where the file system gives no handles): the
            // state moves whole after all, in a longer pause.
            Err(e) if precopied => {
                log::warn!(
                    "keeper: the state after the preview was refused ({e}): moving it whole"
                );
                steps.mark("refused load", start);
                let state = save(relay.backend(), false)?;
                steps.mark("whole save", start);
                load(&new, &state)?;
                state
            }
            other => other.map(|()| state)?,
        };
        steps.mark("load", start);
        replay::run(&new, &replay::start(relay.setup()), STEP_TIMEOUT)?;
        replay::nudge(relay.setup());
        steps.mark("start", start);
        Ok(state.len())
    });
    match moved {
        Ok(bytes) => {
            let old = relay.switch(new);
            let pause = start.elapsed();
            log::info!(
                "keeper: upgrade steps: pre-copy {:.1} ms before the pause; in it {} ({bytes} \
                 bytes of state)",
                precopy_took.as_secs_f64() * 1e3,
                steps.describe()
            );
            Ok(Upgraded { old, pause })
        }
        Err(e) => {
            if let Err(again) = relay.restart_rings(&bases, STEP_TIMEOUT) {
                log::error!("keeper: the old serving process's rings did not start again: {again}");
            }
            Err((e, new))
        }
    }
}

/// When each step of the pause ended, from its start.
#[derive(Default)]
struct Steps {
    ends: Vec<(&'static str, Duration)>,
}

impl Steps {
    fn mark(&mut self, what: &'static str, start: Instant) {
        self.ends.push((what, start.elapsed()));
    }

    /// "stop 0.2 ms, save 1.0 ms, ...": each step's own time.
    fn describe(&self) -> String {
        let mut last = Duration::ZERO;
        let mut out = Vec::new();
        for (what, end) in &self.ends {
            out.push(format!(
                "{what} {:.1} ms",
                (*end - last).as_secs_f64() * 1e3
            ));
            last = *end;
        }
        out.join(", ")
    }
}

/// The pre-copy (same host, docs/UPGRADE.md): the old process writes a preview of the
/// nodes the guest holds while it serves (`SET_DEVICE_STATE_FD` SAVE on a socket
/// holding the preview's request), and the new process preloads it (LOAD: it opens
/// each node and keeps it aside). An error only means the state moves whole.
fn precopy(old: &UnixStream, new: &UnixStream) -> Result<(), Error> {
    let preview = save_on_socket(old, crate::device::state_transfer::PREVIEW_REQUEST)?;
    if crate::state::format::kind(&preview) != crate::state::format::Kind::Preview {
        // An old process of a version before previews wrote a state: not used.
        return Err(Error::io(
            "the preview",
            io::Error::other("the old serving process does not write previews"),
        ));
    }
    load(new, &preview)
}

/// `SET_DEVICE_STATE_FD`'s payload: direction (0 save, 1 load), phase (0 stopped).
fn transfer(direction: u32) -> Vec<u8> {
    let mut p = direction.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p
}

/// Sends `SET_DEVICE_STATE_FD` with `fd` and checks its answer (0x100: accepted, no
/// fd back).
fn begin(stream: &UnixStream, direction: u32, fd: &OwnedFd) -> Result<(), Error> {
    let step = Step {
        request: FrontendReq::SET_DEVICE_STATE_FD,
        payload: transfer(direction),
        fds: vec![fd.as_raw_fd()],
        answer: replay::Answer::Reply,
    };
    let replies = replay::run(stream, &[step], STEP_TIMEOUT)?;
    match replies.first().and_then(|r| r.u64()) {
        Some(v) if v & 0xff == 0 => Ok(()),
        v => Err(Error::Refused {
            request: FrontendReq::SET_DEVICE_STATE_FD,
            code: v.unwrap_or(u64::MAX),
        }),
    }
}

/// `CHECK_DEVICE_STATE`: 0 when the transfer succeeded.
fn check(stream: &UnixStream) -> Result<(), Error> {
    let step = Step {
        request: FrontendReq::CHECK_DEVICE_STATE,
        payload: Vec::new(),
        fds: Vec::new(),
        answer: replay::Answer::Reply,
    };
    let replies = replay::run(stream, &[step], STEP_TIMEOUT)?;
    match replies.first().and_then(|r| r.u64()) {
        Some(0) => Ok(()),
        v => Err(Error::Refused {
            request: FrontendReq::CHECK_DEVICE_STATE,
            code: v.unwrap_or(u64::MAX),
        }),
    }
}

/// The old process's state, read whole from the pipe it writes; after a pre-copy,
/// its state after the preview (read from a socket holding that request).
fn save(old: &UnixStream, precopied: bool) -> Result<Vec<u8>, Error> {
    if precopied {
        return save_on_socket(old, crate::device::state_transfer::AFTER_PREVIEW_REQUEST);
    }
    let (read, write) = nix::unistd::pipe().map_err(|e| Error::io("pipe", e.into()))?;
    begin(old, 0, &write)?;
    drop(write);
    let mut state = Vec::new();
    std::fs::File::from(read)
        .read_to_end(&mut state)
        .map_err(|e| Error::io("reading the old process's state", e))?;
    check(old)?;
    Ok(state)
}

/// A save into one end of a socket pair holding `request` (what the keeper asks of
/// the old process beyond a migration's save), read whole from the other.
fn save_on_socket(old: &UnixStream, request: &[u8]) -> Result<Vec<u8>, Error> {
    let (mut ours, theirs) = UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
    ours.write_all(request)
        .map_err(|e| Error::io("writing the save's request", e))?;
    let theirs = OwnedFd::from(theirs);
    begin(old, 0, &theirs)?;
    drop(theirs);
    let mut state = Vec::new();
    ours.read_to_end(&mut state)
        .map_err(|e| Error::io("reading the old process's state", e))?;
    check(old)?;
    Ok(state)
}

/// The state written into the pipe the new process reads, then checked.
fn load(new: &UnixStream, state: &[u8]) -> Result<(), Error> {
    let (read, write) = nix::unistd::pipe().map_err(|e| Error::io("pipe", e.into()))?;
    begin(new, 1, &read)?;
    drop(read);
    let mut w = std::fs::File::from(write);
    // The new process reads as it loads; a process that stopped reading (it
    // refused the state) closes its end: EPIPE, and CHECK says why.
    let written = w.write_all(state);
    drop(w);
    check(new)?;
    written.map_err(|e| Error::io("writing the state to the new process", e))
}

/// The fds a new serving process inherits, each named by its hidden flag.
pub struct Inherited {
    pub listener: RawFd,
    pub control: Option<RawFd>,
    pub channel: RawFd,
    pub region: RawFd,
    /// Not an fd: the journal half it records into.
    pub journal: Half,
    /// Not an fd: the half it recovers a killed process's session from.
    pub recover: Option<Half>,
    /// The volumes the old process had attached (JSON), when it said.
    pub volumes: Option<String>,
    /// For an upgrade: a pidfd of the serving process it replaces.
    pub source: Option<RawFd>,
}

/// Forks and execs `cmd` with the `inherited` fds. The child dies with the keeper.
pub fn start(cmd: &Command, inherited: &Inherited) -> Result<Pid, Error> {
    let fds: Vec<(&str, RawFd)> = [
        (LISTEN_FD_FLAG, Some(inherited.listener)),
        (CONTROL_FD_FLAG, inherited.control),
        (CHANNEL_FD_FLAG, Some(inherited.channel)),
        (REGION_FD_FLAG, Some(inherited.region)),
        (SOURCE_PIDFD_FLAG, inherited.source),
    ]
    .into_iter()
    .filter_map(|(flag, fd)| Some((flag, fd?)))
    .collect();
    let mut args = cmd.args.clone();
    args.extend(fds.iter().map(|(flag, fd)| format!("{flag}={fd}").into()));
    args.push(format!("{JOURNAL_FLAG}={}", inherited.journal.index()).into());
    if let Some(half) = inherited.recover {
        args.push(format!("{RECOVER_FLAG}={}", half.index()).into());
    }
    if let Some(volumes) = &inherited.volumes {
        args.push(format!("{VOLUMES_FLAG}={volumes}").into());
    }
    let binary =
        std::ffi::CString::new(cmd.binary.as_os_str().as_encoded_bytes()).map_err(|_| {
            Error::Nul {
                what: "the binary's path",
            }
        })?;
    let argv: Vec<std::ffi::CString> = std::iter::once(Ok(binary.clone()))
        .chain(
            args.iter()
                .map(|a| std::ffi::CString::new(a.as_encoded_bytes())),
        )
        .collect::<Result<_, _>>()
        .map_err(|_| Error::Nul {
            what: "an argument",
        })?;
    // SAFETY: the keeper is single-threaded; the child only calls async-signal-safe
    // functions (fcntl, prctl, sigprocmask, execv, _exit) before it execs.
    match unsafe { fork() }.map_err(|e| Error::io("fork", e.into()))? {
        ForkResult::Child => {
            // SAFETY: as above; plain system calls on our own fds and mask.
            unsafe {
                for (_, fd) in &fds {
                    libc::fcntl(*fd, libc::F_SETFD, 0);
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            }
            let _ = nix::unistd::execv(&binary, &argv);
            // SAFETY: _exit in a forked child that could not exec.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => Ok(child),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A new 0755 directory holding an executable `volfsd` (mode 0755).
    fn binary_dir() -> PathBuf {
        let dir = nix::unistd::mkdtemp(&std::env::temp_dir().join("volfsd-binary.XXXXXX")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let binary = dir.join("volfsd");
        std::fs::write(&binary, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn mode(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    fn current() -> Command {
        Command {
            binary: "/usr/bin/volfsd".into(),
            args: vec!["--socket-path".into(), "/run/vm1/fs.sock".into()],
        }
    }

    #[test]
    fn a_safe_binary_keeps_the_arguments() {
        let dir = binary_dir();
        let c = current().with_binary(&dir.join("volfsd")).unwrap();
        assert_eq!(c.binary, dir.join("volfsd").canonicalize().unwrap());
        assert_eq!(c.args, current().args);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unsafe_binary_is_refused_with_the_reason() {
        let dir = binary_dir();
        let binary = dir.join("volfsd");
        let refused = |p: &Path| current().with_binary(p).unwrap_err();

        let why = refused(Path::new("v2/volfsd"));
        assert!(matches!(why, Refusal::Relative(_)), "{why:?}");
        assert_eq!(why.to_string(), "--binary v2/volfsd: not an absolute path");

        let why = refused(&dir.join("missing"));
        assert!(matches!(why, Refusal::Unreadable { .. }), "{why:?}");
        assert!(why.to_string().starts_with("--binary /"), "{why}");

        mode(&binary, 0o777);
        let why = refused(&binary);
        assert_eq!(
            why.to_string(),
            format!(
                "--binary: the binary {} is writable by its group or others (mode 777)",
                binary.display()
            )
        );
        mode(&binary, 0o644);
        let why = refused(&binary);
        assert!(matches!(why, Refusal::NotExecutable(_)), "{why:?}");
        assert!(why
            .to_string()
            .ends_with(": not an executable regular file"));
        mode(&binary, 0o755);

        mode(&dir, 0o775);
        let why = refused(&binary);
        assert!(
            matches!(
                why,
                Refusal::Writable {
                    what: "its directory",
                    mode: 0o775,
                    ..
                }
            ),
            "{why:?}"
        );
        assert!(why.to_string().contains("its directory"), "{why}");
        mode(&dir, 0o755);

        // Another user's binary (only root can give it away).
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&binary, Some(4321), None).unwrap();
            let why = refused(&binary);
            assert_eq!(
                why.to_string(),
                format!(
                    "--binary: the binary {} is owned by uid 4321, not root or the daemon's user",
                    binary.display()
                )
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_nul_in_what_would_be_execd_is_refused_before_the_fork() {
        let inherited = Inherited {
            listener: -1,
            control: None,
            channel: -1,
            region: -1,
            journal: Half::A,
            recover: None,
            volumes: None,
            source: None,
        };
        let mut cmd = current();
        cmd.args.push("a\0b".into());
        let e = start(&cmd, &inherited).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Nul {
                    what: "an argument"
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "a NUL in an argument");
        cmd.binary = "/usr/bin/vol\0fsd".into();
        assert!(matches!(
            start(&cmd, &inherited),
            Err(Error::Nul {
                what: "the binary's path"
            })
        ));
    }
}
