//! Error type for the frontend: every variant carries enough context (operation,
//! queue, request) to diagnose a failure from the message alone.

use std::fmt;
use std::io;

/// Errors returned by the vhost-user-fs frontend.
#[derive(Debug)]
pub enum Error {
    /// A system call failed (memfd, mmap, eventfd, poll, ...).
    Io { context: String, source: io::Error },
    /// A vhost-user control-plane message failed.
    Vhost {
        context: String,
        source: vhost::Error,
    },
    /// Reading or writing guest memory failed.
    GuestMemory {
        context: String,
        source: vm_memory::GuestMemoryError,
    },
    /// The guest-memory allocator has no free range of the requested size.
    OutOfGuestMemory { requested: u64 },
    /// Not enough free descriptors in the virtqueue for the chain.
    QueueFull {
        queue: u16,
        needed: usize,
        free: usize,
    },
    /// An argument was rejected before anything was sent.
    InvalidArgument(String),
    /// The backend did not complete a request in time.
    Timeout { context: String },
    /// The backend returned a malformed reply (wrong unique, bad length, ...).
    BadReply { context: String, detail: String },
    /// The backend handed a request's chain back without writing any reply
    /// (used len 0), i.e. it dropped the request.
    NoReply { context: String },
    /// The backend answered a FUSE request with a negative errno.
    Errno { context: String, errno: i32 },
}

/// Result alias for the frontend.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno of a FUSE error reply, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Errno { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// True if the error is a timeout waiting for the backend.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn vhost(context: impl Into<String>, source: vhost::Error) -> Self {
        Error::Vhost {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn memory(context: impl Into<String>, source: vm_memory::GuestMemoryError) -> Self {
        Error::GuestMemory {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn bad_reply(context: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::BadReply {
            context: context.into(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Vhost { context, source } => write!(f, "{context}: vhost-user: {source}"),
            Error::GuestMemory { context, source } => {
                write!(f, "{context}: guest memory: {source}")
            }
            Error::OutOfGuestMemory { requested } => {
                write!(f, "guest memory exhausted allocating {requested} bytes")
            }
            Error::QueueFull {
                queue,
                needed,
                free,
            } => write!(
                f,
                "queue {queue} full: chain needs {needed} descriptors, {free} free"
            ),
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
            Error::Timeout { context } => write!(f, "{context}: timed out waiting for backend"),
            Error::NoReply { context } => {
                write!(f, "{context}: chain returned without a reply (used len 0)")
            }
            Error::BadReply { context, detail } => write!(f, "{context}: bad reply: {detail}"),
            Error::Errno { context, errno } => write!(
                f,
                "{context}: backend returned errno {errno} ({})",
                io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Vhost { source, .. } => Some(source),
            Error::GuestMemory { source, .. } => Some(source),
            _ => None,
        }
    }
}
