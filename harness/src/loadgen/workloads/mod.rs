//! The workloads: each slot of a queue runs one [`Job`], a small state machine
//! that issues the requests of one operation and validates every reply.

mod data;
mod lookup;
mod meta;
mod readdir;
mod reply;

use std::collections::HashMap;

use super::driver::Req;

pub use data::DataJob;
pub use lookup::{GetattrJob, LookupJob};
pub use meta::MetaJob;
pub use readdir::{ReaddirJob, READDIR_BUF};
pub use reply::{Problem, ReplyError};

pub const SEED_READ: u64 = 0x5eed_0001;
pub const SEED_WRITE: u64 = 0x5eed_0002;
pub const SEED_META: u64 = 0x5eed_0003;

pub(crate) const OP_LOOKUP: u32 = 1;
pub(crate) const OP_GETATTR: u32 = 3;
pub(crate) const OP_UNLINK: u32 = 10;
pub(crate) const OP_READ: u32 = 15;
pub(crate) const OP_WRITE: u32 = 16;
pub(crate) const OP_RELEASE: u32 = 18;
pub(crate) const OP_OPENDIR: u32 = 27;
pub(crate) const OP_RELEASEDIR: u32 = 29;
pub(crate) const OP_CREATE: u32 = 35;
pub(crate) const OP_READDIRPLUS: u32 = 44;

/// Size of file number `i` of the 10,000-entry directory (so LOOKUP, GETATTR
/// and READDIRPLUS replies can be checked against it).
pub fn entry_size(i: usize) -> u64 {
    (i % 509) as u64
}

pub fn entry_name(i: usize) -> String {
    format!("f{i:06}")
}

pub(crate) fn parse_entry_index(name: &[u8], files: usize) -> Option<usize> {
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
