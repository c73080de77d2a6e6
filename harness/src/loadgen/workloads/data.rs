//! [`DataJob`]: READ or WRITE of a block at random or sequential offsets, every byte
//! checked against the pattern.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{ReadIn, WriteIn, WriteOut};

use crate::loadgen::driver::Req;
use crate::loadgen::pattern;

use super::reply::{check_errno, parse, Problem, ReplyError};
use super::{Ctx, Fill, Job, JobResult, Step, OP_READ, OP_WRITE, SEED_READ, SEED_WRITE};

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
