//! What the load generator failed at: a flag it could not parse ([`ParseError`]), or
//! a run's step with what it concerned (the host path, the FUSE request, the
//! workload, the volume) and the error of the call that failed ([`Error`]).
//! `volfsd-loadgen` prints it as `volfsd-loadgen: FAILED: {error}`.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::workloads::ReplyError;
use super::Workload;
use crate::frontend;

/// A value of a flag that does not parse.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    /// `--file-size`: not a number with an optional K, M or G.
    BadSize(String),
    /// `--workload`: a name that is no workload.
    UnknownWorkload(String),
    /// `--workload`: an empty list.
    NoWorkload,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::BadSize(s) => write!(f, "bad size '{s}'"),
            ParseError::UnknownWorkload(name) => write!(
                f,
                "unknown workload '{name}' (have: all, {})",
                Workload::ALL.map(|w| w.name()).join(", ")
            ),
            ParseError::NoWorkload => write!(f, "no workload given"),
        }
    }
}

impl std::error::Error for ParseError {}

/// An error that ends a run (or a floor measurement).
#[derive(Debug)]
pub enum Error {
    /// `--queues` or `--qd` is 0.
    NoQueueOrSlot,
    /// `--file-size` is not a positive multiple of 4096.
    FileSizeNotBlocks(u64),
    /// `--file-size` is smaller than a workload's block.
    FileSizeBelowBlock { file_size: u64, block: u32 },
    /// `--qd` gives some volume no slot.
    QdBelowVolumes { qd: usize, volumes: usize },
    /// `--volumes`: a name that is not a relative path of plain components.
    BadVolumeName(String),
    /// `--volumes`: a name given twice.
    VolumeTwice(String),
    /// `--shared-dir` is not a directory.
    SharedDirNotDir(PathBuf),
    /// A volume's directory (under the shared dir) is not a directory.
    VolumeNotDir { volume: String, path: PathBuf },
    /// A host call on a file or directory of the share failed (preparing,
    /// checking, cleaning up).
    Host { path: PathBuf, source: io::Error },
    /// The floor's loop: a system call failed.
    Syscall {
        call: &'static str,
        source: io::Error,
    },
    /// A path with a NUL byte (the floor opens paths with libc).
    NulInPath(PathBuf),
    /// The workload has no floor (`--floor`).
    NoFloor(Workload),
    /// The device has no queue at all (not even hiprio).
    NoQueue,
    /// A step through the frontend failed (`connecting`, `FUSE_INIT`,
    /// `volume a: LOOKUP work dir`, `queue 2`, ...).
    Frontend {
        step: String,
        source: frontend::Error,
    },
    /// A reply a workload's job does not accept.
    Reply(ReplyError),
    /// A queue's worker thread panicked.
    WorkerPanicked { queue: usize },
    /// A workload failed; what failed.
    Workload {
        workload: Workload,
        source: Box<Error>,
    },
    /// A written block of the write file does not hold the pattern, from the
    /// word at `at` on.
    WrongData { path: PathBuf, block: u64, at: u64 },
    /// A block of the write file no WRITE went to is not zeros.
    NotZero { path: PathBuf, block: u64 },
    /// A write workload ran, and no block of the file was written (`volume`: the
    /// target's label, `volume NAME: ` or empty).
    NothingWritten { workload: Workload, volume: String },
    /// The metadata workload left files behind (their number and one of them).
    FilesLeft {
        dir: PathBuf,
        count: usize,
        example: OsString,
    },
}

impl Error {
    /// A failed host call on `path`, for `map_err`.
    pub(super) fn at(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
        move |source| Error::Host {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A failed step through the frontend, for `map_err`.
    pub(super) fn step(step: impl Into<String>) -> impl FnOnce(frontend::Error) -> Error {
        let step = step.into();
        move |source| Error::Frontend { step, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoQueueOrSlot => write!(f, "--queues and --qd must be at least 1"),
            Error::FileSizeNotBlocks(size) => write!(
                f,
                "--file-size must be a positive multiple of 4096 (is {size})"
            ),
            Error::FileSizeBelowBlock { file_size, block } => write!(
                f,
                "--file-size must be at least {block} (is {file_size})"
            ),
            Error::QdBelowVolumes { qd, volumes } => write!(
                f,
                "--qd {qd} is less than the {volumes} volumes: each volume needs a slot"
            ),
            Error::BadVolumeName(name) => write!(
                f,
                "bad volume name '{name}' (a relative path under the shared dir, e.g. data or rw/vol-a)"
            ),
            Error::VolumeTwice(name) => write!(f, "volume '{name}' given twice"),
            Error::SharedDirNotDir(path) => {
                write!(f, "shared dir {} is not a directory", path.display())
            }
            Error::VolumeNotDir { volume, path } => {
                write!(f, "volume {volume}: {} is not a directory", path.display())
            }
            Error::Host { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Syscall { call, source } => write!(f, "floor: {call}: {source}"),
            Error::NulInPath(path) => write!(f, "NUL in a path: {}", path.display()),
            Error::NoFloor(w) => write!(f, "no floor for {}", w.name()),
            Error::NoQueue => write!(f, "device has no queue"),
            Error::Frontend { step, source } => write!(f, "{step}: {source}"),
            Error::Reply(e) => write!(f, "{e}"),
            Error::WorkerPanicked { queue } => {
                write!(f, "worker thread of queue {queue} panicked")
            }
            Error::Workload { workload, source } => write!(f, "{}: {source}", workload.name()),
            Error::WrongData { path, block, at } => write!(
                f,
                "{}: written block at {block} holds wrong data (first bad word at {at})",
                path.display()
            ),
            Error::NotZero { path, block } => write!(
                f,
                "{}: block at {block} was never written but is not zero",
                path.display()
            ),
            Error::NothingWritten { workload, volume } => write!(
                f,
                "{}: {volume}no block of the write file was written",
                workload.name()
            ),
            Error::FilesLeft {
                dir,
                count,
                example,
            } => write!(
                f,
                "metadata: {count} files left in {} after UNLINK (e.g. {example:?})",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<ReplyError> for Error {
    fn from(e: ReplyError) -> Self {
        Error::Reply(e)
    }
}

#[cfg(test)]
mod tests {
    use super::super::workloads::Problem;
    use super::*;

    // benches/smoke.sh greps a failed run's log for "data mismatch"; the rest is
    // what a failed run says, as `volfsd-loadgen: FAILED: {error}`.
    #[test]
    fn what_each_error_says() {
        let io = || io::Error::from_raw_os_error(libc::ENOENT);
        let cases: Vec<(Error, &str)> = vec![
            (
                Error::Workload {
                    workload: Workload::RandRead4k,
                    source: Box::new(Error::Reply(ReplyError {
                        op: "READ at 8192".into(),
                        problem: Problem::DataMismatch { at: 8200 },
                    })),
                },
                "randread4k: READ at 8192: data mismatch at file offset 8200",
            ),
            (
                Error::Reply(ReplyError {
                    op: "LOOKUP f000012".into(),
                    problem: Problem::Errno(libc::ENOENT),
                }),
                "LOOKUP f000012: errno 2 (No such file or directory (os error 2))",
            ),
            (
                Error::Host {
                    path: "/s/volfsd-loadgen/read.dat".into(),
                    source: io(),
                },
                "/s/volfsd-loadgen/read.dat: No such file or directory (os error 2)",
            ),
            (
                Error::Syscall {
                    call: "pread",
                    source: io(),
                },
                "floor: pread: No such file or directory (os error 2)",
            ),
            (
                Error::QdBelowVolumes { qd: 2, volumes: 3 },
                "--qd 2 is less than the 3 volumes: each volume needs a slot",
            ),
            (
                Error::NothingWritten {
                    workload: Workload::SeqWrite1m,
                    volume: "volume a: ".into(),
                },
                "seqwrite1m: volume a: no block of the write file was written",
            ),
            (
                Error::Frontend {
                    step: "FUSE_INIT".into(),
                    source: frontend::Error::Timeout {
                        context: "INIT nodeid 0 unique 1".into(),
                    },
                },
                "FUSE_INIT: INIT nodeid 0 unique 1: timed out waiting for backend",
            ),
        ];
        for (e, says) in cases {
            assert_eq!(e.to_string(), says, "{e:?}");
        }
        assert_eq!(
            ParseError::BadSize("3X".into()).to_string(),
            "bad size '3X'"
        );
        assert!(ParseError::UnknownWorkload("x".into())
            .to_string()
            .starts_with("unknown workload 'x' (have: all, randread4k, "));
    }
}
