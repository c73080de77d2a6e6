//! The error of a statebench run: the step it failed at, what it concerned, and the
//! underlying error; `main` prints it after `FAILED:`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use volfsd_harness::frontend;

/// What a run failed at: the step, the file, request or upgrade it concerned, and
/// the error of the call that failed. `main` prints it as
/// `volfsd-statebench: FAILED: {error}` (benches/smoke.sh greps FAILED).
#[derive(Debug)]
pub(crate) enum Error {
    /// A host call on a file or directory failed (`step`: "creating", "removing",
    /// ...; None where the path says enough: opening it, its metadata).
    File {
        step: Option<&'static str>,
        path: PathBuf,
        source: io::Error,
    },
    /// The daemon's command line has no program.
    EmptyDaemon,
    /// The daemon could not be started.
    Spawn { program: String, source: io::Error },
    /// A host call on no file failed (SIGHUP to the keeper, the kick eventfd).
    Host {
        step: &'static str,
        source: io::Error,
    },
    /// A step through the frontend failed (`step`: None where the frontend's
    /// error names the message or request itself).
    Frontend {
        step: Option<String>,
        source: frontend::Error,
    },
    /// `--precopy`: neither `idle` nor seconds.
    BadPrecopy(String),
    /// No LOOKUP was answered in 60 s (how many had been).
    NoLookupReply { done: usize },
    /// A completion of no LOOKUP submitted.
    StrayReply { token: u64 },
    /// LOOKUP answered another inode than the host's file has.
    HostInode {
        path: PathBuf,
        answered: u64,
        host: u64,
    },
    /// A held file's node answered another inode than before (`when`: "after the
    /// load", "after upgrade 3").
    NodeInode {
        file: usize,
        node: u64,
        got: u64,
        when: String,
        before: u64,
    },
    /// The root answered another inode than the share's during an upgrade.
    RootInode {
        upgrade: u32,
        answered: u64,
        share: u64,
    },
    /// A GETATTR the guest sent during an upgrade failed (after this many).
    Probe {
        upgrade: u32,
        after: u64,
        source: Box<Error>,
    },
    /// The keeper logged no outcome of the upgrade in 120 s.
    NoOutcome { upgrade: u32 },
    /// The keeper's line on the upgrade has no pause: the upgrade failed, and the
    /// line says why.
    NoPause { upgrade: u32, line: String },
    /// An error while a daemon served, with the last lines of its log.
    Daemon {
        source: Box<Error>,
        log_tail: String,
    },
}

impl Error {
    /// A failed host call on `path`, for `map_err`.
    pub(crate) fn file<'a>(
        step: Option<&'static str>,
        path: &'a Path,
    ) -> impl FnOnce(io::Error) -> Error + 'a {
        move |source| Error::File {
            step,
            path: path.to_path_buf(),
            source,
        }
    }

    /// A failed step through the frontend, for `map_err`.
    pub(crate) fn step(step: impl Into<String>) -> impl FnOnce(frontend::Error) -> Error {
        let step = Some(step.into());
        move |source| Error::Frontend { step, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::File {
                step: Some(step),
                path,
                source,
            } => write!(f, "{step} {}: {source}", path.display()),
            Error::File {
                step: None,
                path,
                source,
            } => write!(f, "{}: {source}", path.display()),
            Error::EmptyDaemon => write!(f, "--daemon is empty"),
            Error::Spawn { program, source } => write!(f, "starting {program}: {source}"),
            Error::Host { step, source } => write!(f, "{step}: {source}"),
            Error::Frontend {
                step: Some(step),
                source,
            } => write!(f, "{step}: {source}"),
            Error::Frontend { step: None, source } => write!(f, "{source}"),
            Error::BadPrecopy(v) => write!(f, "--precopy {v}: idle or seconds"),
            Error::NoLookupReply { done } => write!(f, "no LOOKUP reply in 60 s ({done} done)"),
            Error::StrayReply { token } => write!(f, "a reply to no LOOKUP: {token}"),
            Error::HostInode {
                path,
                answered,
                host,
            } => write!(
                f,
                "LOOKUP of {} answered inode {answered}, the host has {host}",
                path.display()
            ),
            Error::NodeInode {
                file,
                node,
                got,
                when,
                before,
            } => write!(
                f,
                "file {file} (node {node}): inode {got} {when}, {before} before"
            ),
            Error::RootInode {
                upgrade,
                answered,
                share,
            } => write!(
                f,
                "upgrade {upgrade}: the root answered inode {answered}, the share's is {share}"
            ),
            Error::Probe {
                upgrade,
                after,
                source,
            } => write!(
                f,
                "GETATTR during upgrade {upgrade} (after {after}): {source}"
            ),
            Error::NoOutcome { upgrade } => write!(f, "upgrade {upgrade}: no outcome in 120 s"),
            Error::NoPause { upgrade, line } => write!(f, "upgrade {upgrade}: {line}"),
            Error::Daemon { source, log_tail } => {
                write!(f, "{source} (daemon log: {log_tail})")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<frontend::Error> for Error {
    fn from(source: frontend::Error) -> Self {
        Error::Frontend { step: None, source }
    }
}

pub(crate) type Res<T> = Result<T, Error>;
