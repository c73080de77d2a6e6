//! [`ReaddirJob`]: OPENDIR, READDIRPLUS to the end of the prepared directory (every
//! entry checked), RELEASEDIR.

use fuse_backend_rs::abi::fuse_abi::{OpenIn, OpenOut, ReadIn, ReleaseIn};

use crate::frontend::fuse::parse_direntplus;
use crate::loadgen::driver::Req;

use super::reply::{check_errno, check_regular, parse, Problem, ReplyError};
use super::{
    entry_name, entry_size, parse_entry_index, Ctx, Fill, Job, JobResult, Step, OP_OPENDIR,
    OP_READDIRPLUS, OP_RELEASEDIR,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DirState {
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
