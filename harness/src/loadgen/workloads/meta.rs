//! [`MetaJob`]: the metadata mix, CREATE + WRITE + RELEASE then UNLINK and FORGET of
//! a fresh file.

use fuse_backend_rs::abi::fuse_abi::{CreateIn, EntryOut, OpenOut, ReleaseIn, WriteIn, WriteOut};

use crate::loadgen::driver::Req;

use super::reply::{check_empty, check_errno, check_regular, parse, Problem, ReplyError};
use super::{
    Ctx, Fill, Job, JobResult, Step, OP_CREATE, OP_RELEASE, OP_UNLINK, OP_WRITE, SEED_META,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MetaState {
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
