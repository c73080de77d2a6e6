//! [`LookupJob`] and [`GetattrJob`]: LOOKUP of random names of the prepared directory,
//! GETATTR of the nodes held; each reply checked against the entry's size.

use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{AttrOut, EntryOut, GetattrIn};

use crate::loadgen::driver::Req;

use super::reply::{check_errno, check_regular, parse, Problem, ReplyError};
use super::{entry_name, entry_size, Ctx, Fill, Job, JobResult, Step, OP_GETATTR, OP_LOOKUP};

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
