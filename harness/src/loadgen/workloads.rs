//! The workloads: each slot of a queue runs one [`Job`], a small state machine
//! that issues the requests of one operation and validates every reply.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{
    AttrOut, CreateIn, EntryOut, GetattrIn, OpenIn, OpenOut, ReadIn, ReleaseIn, WriteIn, WriteOut,
};
use vm_memory::ByteValued;

use super::driver::Req;
use super::pattern;
use crate::frontend::fuse::parse_direntplus;

pub const SEED_READ: u64 = 0x5eed_0001;
pub const SEED_WRITE: u64 = 0x5eed_0002;
pub const SEED_META: u64 = 0x5eed_0003;

const OP_LOOKUP: u32 = 1;
const OP_GETATTR: u32 = 3;
const OP_UNLINK: u32 = 10;
const OP_READ: u32 = 15;
const OP_WRITE: u32 = 16;
const OP_RELEASE: u32 = 18;
const OP_OPENDIR: u32 = 27;
const OP_RELEASEDIR: u32 = 29;
const OP_CREATE: u32 = 35;
const OP_READDIRPLUS: u32 = 44;

/// Size of file number `i` of the 10,000-entry directory (so LOOKUP, GETATTR
/// and READDIRPLUS replies can be checked against it).
pub fn entry_size(i: usize) -> u64 {
    (i % 509) as u64
}

pub fn entry_name(i: usize) -> String {
    format!("f{i:06}")
}

fn parse_entry_index(name: &[u8], files: usize) -> Option<usize> {
    let s = std::str::from_utf8(name).ok()?;
    let n: usize = s.strip_prefix('f')?.parse().ok()?;
    (n < files && s.len() == 7).then_some(n)
}

/// Pattern data to put in the slot's payload before submitting.
pub struct Fill {
    pub seed: u64,
    pub off: u64,
    pub len: usize,
}

pub enum Step {
    /// Another request of the same operation.
    More(Req, Option<Fill>),
    /// The operation is complete; it moved this many payload bytes.
    Done(u64),
}

/// State shared by the jobs of one queue thread.
pub struct Ctx {
    pub rng: u64,
    /// Sequential cursor (in blocks) of this thread, one per volume (see
    /// [`DataJob::stream`]).
    pub cursors: Vec<u64>,
    /// nodeid -> lookups to FORGET.
    pub forgets: HashMap<u64, u64>,
    /// Send FORGETs (BATCH_FORGET on hiprio) once this many node ids are owed.
    /// The metadata workload uses a small batch: the guest kernel forgets an
    /// unlinked file's inode right away, and a daemon that holds an fd per
    /// inode keeps the host inode alive until then.
    pub forget_batch: usize,
}

impl Ctx {
    pub fn new(seed: u64) -> Self {
        Ctx {
            rng: seed | 1,
            cursors: vec![0],
            forgets: HashMap::new(),
            forget_batch: 4096,
        }
    }

    pub fn rand(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn forget(&mut self, nodeid: u64) {
        *self.forgets.entry(nodeid).or_insert(0) += 1;
    }
}

pub type JobResult = Result<Step, ReplyError>;

pub trait Job: Send {
    fn begin(&mut self, ctx: &mut Ctx) -> (Req, Option<Fill>);
    fn reply(&mut self, ctx: &mut Ctx, error: i32, body: &[u8]) -> JobResult;
}

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
    fn new(op: impl Into<String>, problem: Problem) -> ReplyError {
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
fn check_errno(op: &str, error: i32) -> Result<(), ReplyError> {
    match error {
        0 => Ok(()),
        errno => Err(ReplyError::new(op, Problem::Errno(errno))),
    }
}

fn parse<T: ByteValued>(op: &str, body: &[u8]) -> Result<T, ReplyError> {
    T::from_slice(body).copied().ok_or_else(|| {
        let problem = Problem::BodySize {
            got: body.len(),
            expected: std::mem::size_of::<T>(),
        };
        ReplyError::new(op, problem)
    })
}

fn check_regular(op: &str, mode: u32, size: u64, want_size: u64) -> Result<(), ReplyError> {
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
fn check_empty(op: &str, body: &[u8]) -> Result<(), ReplyError> {
    match body.len() {
        0 => Ok(()),
        n => Err(ReplyError::new(op, Problem::UnexpectedBytes(n))),
    }
}

// ------------------------------------------------------------- data I/O

/// READ or WRITE of `block` bytes at random or sequential block offsets.
pub struct DataJob {
    pub nodeid: u64,
    pub fh: u64,
    pub blocks: u64,
    pub block: u32,
    pub random: bool,
    pub write: bool,
    /// Which of the thread's sequential cursors it advances (its volume's).
    pub stream: usize,
    /// 4 KiB blocks written (write workloads), for the host-side check.
    pub written: Option<Arc<Vec<AtomicU64>>>,
    off: u64,
}

impl DataJob {
    pub fn new(
        nodeid: u64,
        fh: u64,
        file_size: u64,
        block: u32,
        random: bool,
        write: bool,
    ) -> Self {
        DataJob {
            nodeid,
            fh,
            blocks: file_size / u64::from(block),
            block,
            random,
            write,
            stream: 0,
            written: None,
            off: 0,
        }
    }

    /// Works on the file of the volume with this cursor, and marks the 4 KiB
    /// blocks it writes in `written`.
    pub fn for_volume(mut self, stream: usize, written: Option<Arc<Vec<AtomicU64>>>) -> Self {
        self.stream = stream;
        self.written = written;
        self
    }

    fn mark_written(&self, off: u64, len: u64) {
        if let Some(w) = &self.written {
            for blk in off / 4096..(off + len).div_ceil(4096) {
                w[(blk / 64) as usize].fetch_or(1 << (blk % 64), Ordering::Relaxed);
            }
        }
    }
}

impl Job for DataJob {
    fn begin(&mut self, ctx: &mut Ctx) -> (Req, Option<Fill>) {
        let blk = if self.random {
            ctx.rand() % self.blocks
        } else {
            if ctx.cursors.len() <= self.stream {
                ctx.cursors.resize(self.stream + 1, 0);
            }
            let cursor = &mut ctx.cursors[self.stream];
            let c = *cursor % self.blocks;
            *cursor = c + 1;
            c
        };
        self.off = blk * u64::from(self.block);
        if self.write {
            let req = Req::new(OP_WRITE, self.nodeid)
                .arg(&WriteIn {
                    fh: self.fh,
                    offset: self.off,
                    size: self.block,
                    flags: libc::O_RDWR as u32,
                    ..Default::default()
                })
                .data(self.block)
                .reply(std::mem::size_of::<WriteOut>() as u32);
            let fill = Fill {
                seed: SEED_WRITE,
                off: self.off,
                len: self.block as usize,
            };
            (req, Some(fill))
        } else {
            let req = Req::new(OP_READ, self.nodeid)
                .arg(&ReadIn {
                    fh: self.fh,
                    offset: self.off,
                    size: self.block,
                    flags: libc::O_RDONLY as u32,
                    ..Default::default()
                })
                .reply(self.block);
            (req, None)
        }
    }

    fn reply(&mut self, _ctx: &mut Ctx, error: i32, body: &[u8]) -> JobResult {
        if self.write {
            let op = format!("WRITE at {}", self.off);
            check_errno(&op, error)?;
            let out: WriteOut = parse(&op, body)?;
            if out.size != self.block {
                let problem = Problem::ShortWrite {
                    wrote: out.size,
                    of: self.block,
                };
                return Err(ReplyError::new(op, problem));
            }
            self.mark_written(self.off, u64::from(self.block));
        } else {
            let op = format!("READ at {}", self.off);
            check_errno(&op, error)?;
            if body.len() != self.block as usize {
                let problem = Problem::ShortRead {
                    got: body.len(),
                    expected: self.block,
                };
                return Err(ReplyError::new(op, problem));
            }
            if let Err(at) = pattern::verify(SEED_READ, self.off, body) {
                return Err(ReplyError::new(op, Problem::DataMismatch { at }));
            }
        }
        Ok(Step::Done(u64::from(self.block)))
    }
}

// ------------------------------------------------------------- LOOKUP / GETATTR

/// LOOKUP of random names of the prepared directory.
pub struct LookupJob {
    pub dir: u64,
    pub files: usize,
    index: usize,
}

impl LookupJob {
    pub fn new(dir: u64, files: usize) -> Self {
        LookupJob {
            dir,
            files,
            index: 0,
        }
    }
}

impl Job for LookupJob {
    fn begin(&mut self, ctx: &mut Ctx) -> (Req, Option<Fill>) {
        self.index = (ctx.rand() % self.files as u64) as usize;
        let req = Req::new(OP_LOOKUP, self.dir)
            .name(entry_name(self.index).as_bytes())
            .reply(std::mem::size_of::<EntryOut>() as u32);
        (req, None)
    }

    fn reply(&mut self, ctx: &mut Ctx, error: i32, body: &[u8]) -> JobResult {
        let op = format!("LOOKUP {}", entry_name(self.index));
        check_errno(&op, error)?;
        let e: EntryOut = parse(&op, body)?;
        if e.nodeid == 0 {
            return Err(ReplyError::new(op, Problem::NodeIdZero));
        }
        check_regular(&op, e.attr.mode, e.attr.size, entry_size(self.index))?;
        ctx.forget(e.nodeid);
        Ok(Step::Done(0))
    }
}

/// GETATTR of random node ids of the prepared directory.
pub struct GetattrJob {
    pub nodes: Arc<Vec<u64>>,
    index: usize,
}

impl GetattrJob {
    pub fn new(nodes: Arc<Vec<u64>>) -> Self {
        GetattrJob { nodes, index: 0 }
    }
}

impl Job for GetattrJob {
    fn begin(&mut self, ctx: &mut Ctx) -> (Req, Option<Fill>) {
        self.index = (ctx.rand() % self.nodes.len() as u64) as usize;
        let req = Req::new(OP_GETATTR, self.nodes[self.index])
            .arg(&GetattrIn::default())
            .reply(std::mem::size_of::<AttrOut>() as u32);
        (req, None)
    }

    fn reply(&mut self, _ctx: &mut Ctx, error: i32, body: &[u8]) -> JobResult {
        let op = format!("GETATTR {}", entry_name(self.index));
        check_errno(&op, error)?;
        let a: AttrOut = parse(&op, body)?;
        check_regular(&op, a.attr.mode, a.attr.size, entry_size(self.index))?;
        Ok(Step::Done(0))
    }
}

// ------------------------------------------------------------- metadata mix

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MetaState {
    Create,
    Write,
    Release,
    Unlink,
}

/// CREATE + WRITE 4 KiB + RELEASE, then UNLINK (and FORGET, like the guest
/// kernel once the inode goes) of a fresh file in the job's directory.
pub struct MetaJob {
    dir: u64,
    prefix: String,
    counter: u64,
    name: String,
    nodeid: u64,
    fh: u64,
    state: MetaState,
}

impl MetaJob {
    pub fn new(dir: u64, thread: usize, slot: usize) -> Self {
        MetaJob {
            dir,
            prefix: format!("m{thread}-{slot}-"),
            counter: 0,
            name: String::new(),
            nodeid: 0,
            fh: 0,
            state: MetaState::Create,
        }
    }
}

impl Job for MetaJob {
    fn begin(&mut self, _ctx: &mut Ctx) -> (Req, Option<Fill>) {
        self.counter += 1;
        self.name = format!("{}{}", self.prefix, self.counter);
        self.state = MetaState::Create;
        let req = Req::new(OP_CREATE, self.dir)
            .arg(&CreateIn {
                flags: (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u32,
                mode: libc::S_IFREG | 0o644,
                umask: 0o022,
                fuse_flags: 0,
            })
            .name(self.name.as_bytes())
            .reply((std::mem::size_of::<EntryOut>() + std::mem::size_of::<OpenOut>()) as u32);
        (req, None)
    }

    fn reply(&mut self, ctx: &mut Ctx, error: i32, body: &[u8]) -> JobResult {
        let op = format!("{:?} {}", self.state, self.name);
        check_errno(&op, error)?;
        match self.state {
            MetaState::Create => {
                let n = std::mem::size_of::<EntryOut>();
                let expected = n + std::mem::size_of::<OpenOut>();
                if body.len() != expected {
                    let problem = Problem::BodySize {
                        got: body.len(),
                        expected,
                    };
                    return Err(ReplyError::new(op, problem));
                }
                let e: EntryOut = parse(&op, &body[..n])?;
                let o: OpenOut = parse(&op, &body[n..])?;
                if e.nodeid == 0 {
                    return Err(ReplyError::new(op, Problem::NodeIdZero));
                }
                check_regular(&op, e.attr.mode, e.attr.size, 0)?;
                self.nodeid = e.nodeid;
                self.fh = o.fh;
                self.state = MetaState::Write;
                let req = Req::new(OP_WRITE, self.nodeid)
                    .arg(&WriteIn {
                        fh: self.fh,
                        offset: 0,
                        size: 4096,
                        flags: libc::O_RDWR as u32,
                        ..Default::default()
                    })
                    .data(4096)
                    .reply(std::mem::size_of::<WriteOut>() as u32);
                let fill = Fill {
                    seed: SEED_META,
                    off: 0,
                    len: 4096,
                };
                Ok(Step::More(req, Some(fill)))
            }
            MetaState::Write => {
                let out: WriteOut = parse(&op, body)?;
                if out.size != 4096 {
                    let problem = Problem::ShortWrite {
                        wrote: out.size,
                        of: 4096,
                    };
                    return Err(ReplyError::new(op, problem));
                }
                self.state = MetaState::Release;
                let req = Req::new(OP_RELEASE, self.nodeid).arg(&ReleaseIn {
                    fh: self.fh,
                    flags: libc::O_RDWR as u32,
                    ..Default::default()
                });
                Ok(Step::More(req, None))
            }
            MetaState::Release => {
                check_empty(&op, body)?;
                self.state = MetaState::Unlink;
                let req = Req::new(OP_UNLINK, self.dir).name(self.name.as_bytes());
                Ok(Step::More(req, None))
            }
            MetaState::Unlink => {
                check_empty(&op, body)?;
                ctx.forget(self.nodeid);
                Ok(Step::Done(4096))
            }
        }
    }
}

// ------------------------------------------------------------- READDIRPLUS

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum DirState {
    Open,
    Read,
    Release,
}

/// One operation = a whole listing of the prepared directory: OPENDIR,
/// READDIRPLUS (4 KiB, like the guest) until empty, RELEASEDIR. Every entry
/// must appear exactly once with the right size.
pub struct ReaddirJob {
    dir: u64,
    files: usize,
    state: DirState,
    fh: u64,
    offset: u64,
    seen: Vec<u64>,
    count: usize,
    bytes: u64,
}

pub const READDIR_BUF: u32 = 4096;

impl ReaddirJob {
    pub fn new(dir: u64, files: usize) -> Self {
        ReaddirJob {
            dir,
            files,
            state: DirState::Open,
            fh: 0,
            offset: 0,
            seen: vec![0; files.div_ceil(64)],
            count: 0,
            bytes: 0,
        }
    }

    fn readdirplus(&self) -> Req {
        Req::new(OP_READDIRPLUS, self.dir)
            .arg(&ReadIn {
                fh: self.fh,
                offset: self.offset,
                size: READDIR_BUF,
                ..Default::default()
            })
            .reply(READDIR_BUF)
    }
}

impl Job for ReaddirJob {
    fn begin(&mut self, _ctx: &mut Ctx) -> (Req, Option<Fill>) {
        self.state = DirState::Open;
        self.offset = 0;
        self.count = 0;
        self.bytes = 0;
        self.seen.iter_mut().for_each(|w| *w = 0);
        let req = Req::new(OP_OPENDIR, self.dir)
            .arg(&OpenIn {
                flags: (libc::O_RDONLY | libc::O_DIRECTORY) as u32,
                fuse_flags: 0,
            })
            .reply(std::mem::size_of::<OpenOut>() as u32);
        (req, None)
    }

    fn reply(&mut self, ctx: &mut Ctx, error: i32, body: &[u8]) -> JobResult {
        let op = format!("{:?} at offset {}", self.state, self.offset);
        check_errno(&op, error)?;
        match self.state {
            DirState::Open => {
                let o: OpenOut = parse(&op, body)?;
                self.fh = o.fh;
                self.state = DirState::Read;
                Ok(Step::More(self.readdirplus(), None))
            }
            DirState::Read => {
                if body.is_empty() {
                    self.state = DirState::Release;
                    let req = Req::new(OP_RELEASEDIR, self.dir).arg(&ReleaseIn {
                        fh: self.fh,
                        flags: (libc::O_RDONLY | libc::O_DIRECTORY) as u32,
                        ..Default::default()
                    });
                    return Ok(Step::More(req, None));
                }
                self.bytes += body.len() as u64;
                let entries = parse_direntplus("READDIRPLUS reply", body)
                    .map_err(|e| ReplyError::new(&op, Problem::Dirents(e)))?;
                for e in &entries {
                    let name = &e.dirent.name;
                    if name == b"." || name == b".." {
                        continue;
                    }
                    let idx = parse_entry_index(name, self.files).ok_or_else(|| {
                        ReplyError::new(&op, Problem::UnexpectedEntry(e.dirent.name_str()))
                    })?;
                    let (w, bit) = (idx / 64, 1u64 << (idx % 64));
                    if self.seen[w] & bit != 0 {
                        return Err(ReplyError::new(op, Problem::ListedTwice(entry_name(idx))));
                    }
                    self.seen[w] |= bit;
                    self.count += 1;
                    if e.entry.nodeid == 0 {
                        let problem = Problem::EntryWithoutNode(entry_name(idx));
                        return Err(ReplyError::new(op, problem));
                    }
                    check_regular(&op, e.entry.attr.mode, e.entry.attr.size, entry_size(idx))?;
                    ctx.forget(e.entry.nodeid);
                }
                let last = entries.last().expect("non-empty body has entries");
                self.offset = last.dirent.off;
                Ok(Step::More(self.readdirplus(), None))
            }
            DirState::Release => {
                if self.count != self.files {
                    let problem = Problem::Listed {
                        got: self.count,
                        expected: self.files,
                    };
                    return Err(ReplyError::new(op, problem));
                }
                Ok(Step::Done(self.bytes))
            }
        }
    }
}
