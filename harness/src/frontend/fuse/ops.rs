//! Typed FUSE operations, shared by anything that can carry a request: a
//! single [`super::FuseQueue`] or a whole [`super::FuseClient`].

use fuse_backend_rs::abi::fuse_abi::{
    AccessIn, AttrOut, BatchForgetIn, CreateIn, EntryOut, FallocateIn, FlushIn, ForgetIn,
    ForgetOne, FsOptions, FsyncIn, GetattrIn, GetxattrIn, GetxattrOut, InitIn, InitIn2, InitOut,
    Kstatfs, LinkIn, LseekIn, LseekOut, MkdirIn, MknodIn, Opcode, OpenIn, OpenOut, ReadIn,
    ReleaseIn, Rename2In, RenameIn, SetattrIn, SetxattrIn, WriteIn, WriteOut,
};
use vm_memory::ByteValued;

use super::queue::FuseQueue;
use super::reply::{parse_direntplus, parse_dirents, DirEntry, DirEntryPlus, Reply};
use super::request::Request;
use crate::frontend::error::{Error, Result};

/// FUSE_INIT parameters.
#[derive(Clone, Copy, Debug)]
pub struct InitParams {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// 64-bit flags; the upper half goes in `flags2` (needs INIT_EXT).
    pub flags: u64,
}

impl Default for InitParams {
    /// What a Linux 6.x virtio-fs mount asks for.
    fn default() -> Self {
        let flags = FsOptions::ASYNC_READ
            | FsOptions::BIG_WRITES
            | FsOptions::DO_READDIRPLUS
            | FsOptions::READDIRPLUS_AUTO
            | FsOptions::PARALLEL_DIROPS
            | FsOptions::ATOMIC_O_TRUNC
            | FsOptions::HANDLE_KILLPRIV_V2
            | FsOptions::SUBMOUNTS
            | FsOptions::MAX_PAGES
            | FsOptions::INIT_EXT;
        InitParams {
            major: 7,
            minor: 38,
            max_readahead: 128 * 1024,
            flags: flags.bits(),
        }
    }
}

/// Result of GETXATTR / LISTXATTR: the size when asked with size 0, else data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

/// FUSE operations over some request channel.
pub trait FuseOps {
    /// Sends one request and returns its validated reply (errno → `Error::Errno`).
    fn call(&mut self, request: &Request) -> Result<Reply>;

    /// Sends a request the backend must not answer (FORGET, BATCH_FORGET).
    fn call_no_reply(&mut self, request: &Request) -> Result<()>;

    /// Raw request: any opcode, node id and body bytes, with a reply body of
    /// up to `reply_size` bytes. For malformed-message tests.
    fn send(&mut self, opcode: u32, nodeid: u64, body: &[u8], reply_size: u32) -> Result<Reply> {
        let mut req = Request::with_raw_opcode(opcode, nodeid).reply_size(reply_size);
        if !body.is_empty() {
            req = req.bytes(body);
        }
        self.call(&req)
    }

    fn init(&mut self, params: &InitParams) -> Result<InitOut> {
        let init_in = InitIn {
            major: params.major,
            minor: params.minor,
            max_readahead: params.max_readahead,
            flags: params.flags as u32,
        };
        let mut req = Request::new(Opcode::Init, 0)
            .arg(&init_in)
            .reply_of::<InitOut>();
        if params.flags & FsOptions::INIT_EXT.bits() != 0 {
            req = req.arg(&InitIn2 {
                flags2: (params.flags >> 32) as u32,
                unused: [0; 11],
            });
        }
        let reply = self.call(&req)?;
        // Older protocol minors get a shorter fuse_init_out; zero-fill the rest.
        if reply.body.len() < 24 || reply.body.len() > std::mem::size_of::<InitOut>() {
            return Err(Error::bad_reply(
                &reply.context,
                format!("fuse_init_out of {} bytes", reply.body.len()),
            ));
        }
        let mut out = InitOut::default();
        out.as_mut_slice()[..reply.body.len()].copy_from_slice(&reply.body);
        if out.major != 7 {
            return Err(Error::bad_reply(
                &reply.context,
                format!("protocol major {}", out.major),
            ));
        }
        Ok(out)
    }

    fn lookup(&mut self, parent: u64, name: &str) -> Result<EntryOut> {
        let req = Request::new(Opcode::Lookup, parent)
            .name(name)
            .reply_of::<EntryOut>();
        self.call(&req)?.parse()
    }

    fn forget(&mut self, nodeid: u64, nlookup: u64) -> Result<()> {
        let req = Request::new(Opcode::Forget, nodeid)
            .arg(&ForgetIn { nlookup })
            .no_reply();
        self.call_no_reply(&req)
    }

    /// `(nodeid, nlookup)` pairs.
    fn batch_forget(&mut self, nodes: &[(u64, u64)]) -> Result<()> {
        let mut entries = Vec::with_capacity(nodes.len() * 16);
        for &(nodeid, nlookup) in nodes {
            entries.extend_from_slice(ForgetOne { nodeid, nlookup }.as_slice());
        }
        let req = Request::new(Opcode::BatchForget, 0)
            .arg(&BatchForgetIn {
                count: nodes.len() as u32,
                dummy: 0,
            })
            .bytes(entries)
            .no_reply();
        self.call_no_reply(&req)
    }

    fn getattr(&mut self, nodeid: u64) -> Result<AttrOut> {
        let req = Request::new(Opcode::Getattr, nodeid)
            .arg(&GetattrIn::default())
            .reply_of::<AttrOut>();
        self.call(&req)?.parse()
    }

    fn setattr(&mut self, nodeid: u64, attr: &SetattrIn) -> Result<AttrOut> {
        let req = Request::new(Opcode::Setattr, nodeid)
            .arg(attr)
            .reply_of::<AttrOut>();
        self.call(&req)?.parse()
    }

    fn mkdir(&mut self, parent: u64, name: &str, mode: u32) -> Result<EntryOut> {
        let req = Request::new(Opcode::Mkdir, parent)
            .arg(&MkdirIn { mode, umask: 0 })
            .name(name)
            .reply_of::<EntryOut>();
        self.call(&req)?.parse()
    }

    fn mknod(&mut self, parent: u64, name: &str, mode: u32, rdev: u32) -> Result<EntryOut> {
        let req = Request::new(Opcode::Mknod, parent)
            .arg(&MknodIn {
                mode,
                rdev,
                umask: 0,
                padding: 0,
            })
            .name(name)
            .reply_of::<EntryOut>();
        self.call(&req)?.parse()
    }

    /// CREATE: returns the new entry and the open file handle.
    fn create(
        &mut self,
        parent: u64,
        name: &str,
        flags: u32,
        mode: u32,
    ) -> Result<(EntryOut, OpenOut)> {
        let entry_size = std::mem::size_of::<EntryOut>();
        let req = Request::new(Opcode::Create, parent)
            .arg(&CreateIn {
                flags,
                mode,
                umask: 0,
                fuse_flags: 0,
            })
            .name(name)
            .reply_size((entry_size + std::mem::size_of::<OpenOut>()) as u32);
        let reply = self.call(&req)?;
        let entry = EntryOut::from_slice(reply.body.get(..entry_size).unwrap_or_default());
        let open = OpenOut::from_slice(reply.body.get(entry_size..).unwrap_or_default());
        match (entry, open) {
            (Some(entry), Some(open)) => Ok((*entry, *open)),
            _ => Err(Error::bad_reply(
                &reply.context,
                format!("body is {} bytes, expected 144", reply.body.len()),
            )),
        }
    }

    fn open(&mut self, nodeid: u64, flags: u32) -> Result<OpenOut> {
        let req = Request::new(Opcode::Open, nodeid)
            .arg(&OpenIn {
                flags,
                fuse_flags: 0,
            })
            .reply_of::<OpenOut>();
        self.call(&req)?.parse()
    }

    fn read(&mut self, nodeid: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let req = Request::new(Opcode::Read, nodeid)
            .arg(&ReadIn {
                fh,
                offset,
                size,
                ..Default::default()
            })
            .reply_size(size);
        Ok(self.call(&req)?.body)
    }

    /// Returns the number of bytes the backend says it wrote.
    fn write(&mut self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let req = Request::new(Opcode::Write, nodeid)
            .arg(&WriteIn {
                fh,
                offset,
                size: data.len() as u32,
                ..Default::default()
            })
            .bytes(data)
            .reply_of::<WriteOut>();
        Ok(self.call(&req)?.parse::<WriteOut>()?.size)
    }

    fn release(&mut self, nodeid: u64, fh: u64, flags: u32) -> Result<()> {
        let req = Request::new(Opcode::Release, nodeid).arg(&ReleaseIn {
            fh,
            flags,
            ..Default::default()
        });
        self.call(&req)?.expect_empty()
    }

    fn flush(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> Result<()> {
        let req = Request::new(Opcode::Flush, nodeid).arg(&FlushIn {
            fh,
            lock_owner,
            ..Default::default()
        });
        self.call(&req)?.expect_empty()
    }

    fn unlink(&mut self, parent: u64, name: &str) -> Result<()> {
        self.call(&Request::new(Opcode::Unlink, parent).name(name))?
            .expect_empty()
    }

    fn rmdir(&mut self, parent: u64, name: &str) -> Result<()> {
        self.call(&Request::new(Opcode::Rmdir, parent).name(name))?
            .expect_empty()
    }

    fn rename(&mut self, olddir: u64, oldname: &str, newdir: u64, newname: &str) -> Result<()> {
        let req = Request::new(Opcode::Rename, olddir)
            .arg(&RenameIn { newdir })
            .name(oldname)
            .name(newname);
        self.call(&req)?.expect_empty()
    }

    /// `flags`: RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT.
    fn rename2(
        &mut self,
        olddir: u64,
        oldname: &str,
        newdir: u64,
        newname: &str,
        flags: u32,
    ) -> Result<()> {
        let req = Request::new(Opcode::Rename2, olddir)
            .arg(&Rename2In {
                newdir,
                flags,
                padding: 0,
            })
            .name(oldname)
            .name(newname);
        self.call(&req)?.expect_empty()
    }

    fn link(&mut self, oldnode: u64, newparent: u64, newname: &str) -> Result<EntryOut> {
        let req = Request::new(Opcode::Link, newparent)
            .arg(&LinkIn { oldnodeid: oldnode })
            .name(newname)
            .reply_of::<EntryOut>();
        self.call(&req)?.parse()
    }

    fn symlink(&mut self, parent: u64, name: &str, target: &str) -> Result<EntryOut> {
        let req = Request::new(Opcode::Symlink, parent)
            .name(name)
            .name(target)
            .reply_of::<EntryOut>();
        self.call(&req)?.parse()
    }

    fn readlink(&mut self, nodeid: u64) -> Result<Vec<u8>> {
        let req = Request::new(Opcode::Readlink, nodeid).reply_size(4096);
        Ok(self.call(&req)?.body)
    }

    fn statfs(&mut self, nodeid: u64) -> Result<Kstatfs> {
        let req = Request::new(Opcode::Statfs, nodeid).reply_of::<Kstatfs>();
        self.call(&req)?.parse()
    }

    fn opendir(&mut self, nodeid: u64, flags: u32) -> Result<OpenOut> {
        let req = Request::new(Opcode::Opendir, nodeid)
            .arg(&OpenIn {
                flags,
                fuse_flags: 0,
            })
            .reply_of::<OpenOut>();
        self.call(&req)?.parse()
    }

    fn readdir(&mut self, nodeid: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<DirEntry>> {
        let reply = self.call(&readdir_request(Opcode::Readdir, nodeid, fh, offset, size))?;
        parse_dirents(&reply.context, &reply.body)
    }

    /// Each returned entry other than "." and ".." counts as a lookup.
    fn readdirplus(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Vec<DirEntryPlus>> {
        let reply = self.call(&readdir_request(
            Opcode::Readdirplus,
            nodeid,
            fh,
            offset,
            size,
        ))?;
        parse_direntplus(&reply.context, &reply.body)
    }

    /// Reads a whole directory with READDIRPLUS, following entry offsets.
    fn readdirplus_all(&mut self, nodeid: u64, fh: u64) -> Result<Vec<DirEntryPlus>> {
        let mut all = Vec::new();
        let mut offset = 0;
        loop {
            let batch = self.readdirplus(nodeid, fh, offset, 4096)?;
            match batch.last() {
                None => return Ok(all),
                Some(last) => offset = last.dirent.off,
            }
            all.extend(batch);
        }
    }

    fn releasedir(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        let req = Request::new(Opcode::Releasedir, nodeid).arg(&ReleaseIn {
            fh,
            ..Default::default()
        });
        self.call(&req)?.expect_empty()
    }

    fn fsync(&mut self, nodeid: u64, fh: u64, datasync: bool) -> Result<()> {
        let req = Request::new(Opcode::Fsync, nodeid).arg(&FsyncIn {
            fh,
            fsync_flags: u32::from(datasync),
            padding: 0,
        });
        self.call(&req)?.expect_empty()
    }

    fn fallocate(
        &mut self,
        nodeid: u64,
        fh: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> Result<()> {
        let req = Request::new(Opcode::Fallocate, nodeid).arg(&FallocateIn {
            fh,
            offset,
            length,
            mode,
            padding: 0,
        });
        self.call(&req)?.expect_empty()
    }

    /// `whence`: SEEK_SET/CUR/END/DATA/HOLE. Returns the resulting offset.
    fn lseek(&mut self, nodeid: u64, fh: u64, offset: u64, whence: u32) -> Result<u64> {
        let req = Request::new(Opcode::Lseek, nodeid)
            .arg(&LseekIn {
                fh,
                offset,
                whence,
                padding: 0,
            })
            .reply_of::<LseekOut>();
        Ok(self.call(&req)?.parse::<LseekOut>()?.offset)
    }

    fn access(&mut self, nodeid: u64, mask: u32) -> Result<()> {
        let req = Request::new(Opcode::Access, nodeid).arg(&AccessIn { mask, padding: 0 });
        self.call(&req)?.expect_empty()
    }

    fn setxattr(&mut self, nodeid: u64, name: &str, value: &[u8], flags: u32) -> Result<()> {
        let req = Request::new(Opcode::Setxattr, nodeid)
            .arg(&SetxattrIn {
                size: value.len() as u32,
                flags,
            })
            .name(name)
            .bytes(value);
        self.call(&req)?.expect_empty()
    }

    /// `size` 0 asks for the value's size.
    fn getxattr(&mut self, nodeid: u64, name: &str, size: u32) -> Result<XattrReply> {
        let req = Request::new(Opcode::Getxattr, nodeid)
            .arg(&GetxattrIn { size, padding: 0 })
            .name(name);
        xattr_reply(self, req, size)
    }

    /// `size` 0 asks for the list's size.
    fn listxattr(&mut self, nodeid: u64, size: u32) -> Result<XattrReply> {
        let req = Request::new(Opcode::Listxattr, nodeid).arg(&GetxattrIn { size, padding: 0 });
        xattr_reply(self, req, size)
    }

    fn removexattr(&mut self, nodeid: u64, name: &str) -> Result<()> {
        self.call(&Request::new(Opcode::Removexattr, nodeid).name(name))?
            .expect_empty()
    }
}

fn readdir_request(opcode: Opcode, nodeid: u64, fh: u64, offset: u64, size: u32) -> Request {
    Request::new(opcode, nodeid)
        .arg(&ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        })
        .reply_size(size)
}

fn xattr_reply<O: FuseOps + ?Sized>(ops: &mut O, req: Request, size: u32) -> Result<XattrReply> {
    if size == 0 {
        let reply = ops.call(&req.reply_of::<GetxattrOut>())?;
        Ok(XattrReply::Size(reply.parse::<GetxattrOut>()?.size))
    } else {
        Ok(XattrReply::Data(ops.call(&req.reply_size(size))?.body))
    }
}

impl FuseOps for FuseQueue {
    fn call(&mut self, request: &Request) -> Result<Reply> {
        FuseQueue::call(self, request)
    }

    fn call_no_reply(&mut self, request: &Request) -> Result<()> {
        FuseQueue::call_no_reply(self, request)
    }
}
