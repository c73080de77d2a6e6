//! A reply a job does not accept ([`ReplyError`], [`Problem`]) and the checks every
//! job makes of its replies: errno, size, file type.

use std::fmt;

use vm_memory::ByteValued;

/// A reply a job does not accept: the operation (`WRITE at 4096`, `LOOKUP f000012`,
/// `Create m0-1-3`, `Read at offset 0`) and what was wrong with it.
#[derive(Debug)]
pub struct ReplyError {
    pub op: String,
    pub problem: Problem,
}

/// What was wrong with a reply.
#[derive(Debug)]
pub enum Problem {
    /// The backend answered with an errno.
    Errno(i32),
    /// A body of another size than the reply's struct(s).
    BodySize { got: usize, expected: usize },
    /// A node that is not a regular file (the mode).
    NotRegular(u32),
    /// A file of another size than the one prepared.
    FileSize { got: u64, expected: u64 },
    /// WRITE wrote less than it was given.
    ShortWrite { wrote: u32, of: u32 },
    /// READ answered another number of bytes than asked for.
    ShortRead { got: usize, expected: u32 },
    /// READ's data is not the pattern, from this file offset on.
    DataMismatch { at: u64 },
    /// An entry with node id 0.
    NodeIdZero,
    /// A body where none is expected.
    UnexpectedBytes(usize),
    /// READDIRPLUS's body does not split into entries.
    Dirents(crate::frontend::Error),
    /// A listed name that is not one of the prepared directory's.
    UnexpectedEntry(String),
    /// A prepared entry listed a second time.
    ListedTwice(String),
    /// A listed entry without a node id.
    EntryWithoutNode(String),
    /// The listing's count of entries.
    Listed { got: usize, expected: usize },
}

impl ReplyError {
    pub(crate) fn new(op: impl Into<String>, problem: Problem) -> ReplyError {
        ReplyError {
            op: op.into(),
            problem,
        }
    }
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.problem)
    }
}

impl std::error::Error for ReplyError {}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Errno(errno) => write!(
                f,
                "errno {errno} ({})",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Problem::BodySize { got, expected } => {
                write!(f, "reply body of {got} bytes, expected {expected}")
            }
            Problem::NotRegular(mode) => write!(f, "mode {mode:o} is not a regular file"),
            Problem::FileSize { got, expected } => write!(f, "size {got}, expected {expected}"),
            Problem::ShortWrite { wrote, of } => write!(f, "wrote {wrote} of {of} bytes"),
            Problem::ShortRead { got, expected } => write!(f, "{got} bytes, expected {expected}"),
            Problem::DataMismatch { at } => write!(f, "data mismatch at file offset {at}"),
            Problem::NodeIdZero => write!(f, "node id 0"),
            Problem::UnexpectedBytes(n) => write!(f, "{n} unexpected reply bytes"),
            Problem::Dirents(e) => write!(f, "{e}"),
            Problem::UnexpectedEntry(name) => write!(f, "unexpected entry {name:?}"),
            Problem::ListedTwice(name) => write!(f, "entry {name} listed twice"),
            Problem::EntryWithoutNode(name) => write!(f, "entry {name} without node id"),
            Problem::Listed { got, expected } => {
                write!(f, "listing had {got} entries, expected {expected}")
            }
        }
    }
}

/// The reply's errno as an error of `op`, if it is one.
pub(crate) fn check_errno(op: &str, error: i32) -> Result<(), ReplyError> {
    match error {
        0 => Ok(()),
        errno => Err(ReplyError::new(op, Problem::Errno(errno))),
    }
}

pub(crate) fn parse<T: ByteValued>(op: &str, body: &[u8]) -> Result<T, ReplyError> {
    T::from_slice(body).copied().ok_or_else(|| {
        let problem = Problem::BodySize {
            got: body.len(),
            expected: std::mem::size_of::<T>(),
        };
        ReplyError::new(op, problem)
    })
}

pub(crate) fn check_regular(
    op: &str,
    mode: u32,
    size: u64,
    want_size: u64,
) -> Result<(), ReplyError> {
    if mode & libc::S_IFMT != libc::S_IFREG {
        return Err(ReplyError::new(op, Problem::NotRegular(mode)));
    }
    if size != want_size {
        let problem = Problem::FileSize {
            got: size,
            expected: want_size,
        };
        return Err(ReplyError::new(op, problem));
    }
    Ok(())
}

/// An error of `op` unless the body is empty.
pub(crate) fn check_empty(op: &str, body: &[u8]) -> Result<(), ReplyError> {
    match body.len() {
        0 => Ok(()),
        n => Err(ReplyError::new(op, Problem::UnexpectedBytes(n))),
    }
}
