//! The one door between a transport and the file system: what the transport asks
//! of each request, and the replies it gets back.
//!
//! The transport (`device/`) knows rings, not FUSE. Per request it asks one
//! question, [`FsServer::admit`]: is this a request, for which limited volume and at
//! what cost, and may it wait (a SETLKW blocks until the lock is granted, so it is
//! served off the ring). Then it hands the request's local copy and the chain's
//! reply buffers to [`FsServer::serve`], which writes the whole reply, errors
//! included, and returns its length for the used ring. A wait's answer comes back
//! as a [`LateReply`] the transport writes once the ring can take it.

use std::mem::size_of;
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{InHeader, ReadIn, WriteIn};
use fuse_backend_rs::transport::Writer;
use log::debug;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::ByteValued;

use super::buffers::{self, Reply, WriteData};
use super::server::{parse_header, FsServer, RequestError, MAX_PAYLOAD};
use super::share::Share;
use crate::fuse_ops::{self, opcode, Rerun};
use crate::qos::Cost;

/// What a transport must know of a request before it serves it.
pub struct Admission {
    /// The request may block for any time (SETLKW): serve it off the ring, and
    /// write its [`LateReply`] when the ring can take it.
    pub may_wait: bool,
    /// Its volume and cost, when that volume is limited now (None: serve it now).
    pub limited: Option<(Arc<Share>, Cost)>,
}

/// How many readable bytes of a request the transport copies into local memory,
/// given the first bytes copied (at least a header's worth, or fewer when the
/// request is shorter): a WRITE's header and WriteIn only, its data is read in
/// place; any other request whole, up to the largest a guest may send.
pub fn copy_limit(first: &[u8]) -> usize {
    match parse_header(first) {
        Some(h) if h.opcode == opcode::WRITE => WRITE_PREFIX,
        _ => MAX_REQUEST,
    }
}

/// The bytes a chain must start with before [`copy_limit`] can tell.
pub const HEADER_LEN: usize = size_of::<InHeader>();

/// Bytes in local memory that can be a request: a header fits, and no request is
/// longer (a loaded device state's unanswered requests are checked with it).
pub fn is_request(bytes: &[u8]) -> bool {
    bytes.len() <= MAX_REQUEST && parse_header(bytes).is_some()
}

/// Whether a request may wait for any time (SETLKW), as [`Admission::may_wait`]
/// says, for a request whose volume was looked at already.
pub fn may_wait(request: &[u8]) -> bool {
    parse_header(request)
        .and_then(|h| fuse_ops::row(h.opcode))
        .is_some_and(|r| r.admission == fuse_ops::Admission::MayWait)
}

/// Whether a WRITE's data follows its prefix in the chain (then the transport gives
/// [`FsServer::serve`] a reader over it, from [`WRITE_PREFIX`] on).
pub fn has_write_data(request: &[u8]) -> bool {
    parse_header(request).is_some_and(|h| h.opcode == opcode::WRITE)
}

pub use super::server::{MAX_REQUEST, WRITE_PREFIX};

/// What becomes of a request that a serving process killed under the guest had
/// taken off its ring and not answered: it may or may not have been applied.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum AfterCrash {
    /// Idempotent: served again (READ, GETATTR, LOOKUP, READDIR, a WRITE at an
    /// offset, OPEN without O_TRUNC, a lock, a flush or fsync, ...).
    Rerun,
    /// Not idempotent (it creates, removes, renames, changes attributes, appends):
    /// answered EIO, so that it is never applied twice.
    Fail,
    /// Owes no reply (FORGET, BATCH_FORGET, INTERRUPT): returned without one and not
    /// applied again (a node kept a lookup too many at worst).
    Drop,
}

impl FsServer {
    /// The one question a transport asks of a request (its local copy): whether it
    /// may wait, and its volume and cost when that volume is limited now. Without
    /// any limit anywhere (the usual case) no volume is looked up.
    pub fn admit(&self, request: &[u8]) -> Admission {
        let Some(header) = parse_header(request) else {
            return Admission {
                may_wait: false,
                limited: None,
            };
        };
        let limited = if crate::qos::any_limited() {
            self.limited_volume(&header, request)
        } else {
            None
        };
        Admission {
            may_wait: may_wait(request),
            limited,
        }
    }

    fn limited_volume(&self, header: &InHeader, request: &[u8]) -> Option<(Arc<Share>, Cost)> {
        // An opcode without a row is answered ENOSYS: it costs what any request does.
        if fuse_ops::row(header.opcode)
            .is_some_and(|r| r.admission == fuse_ops::Admission::NeverThrottled)
        {
            return None;
        }
        // A request about a virtual directory is for no volume.
        let share = self.fs.inner().share_of(header.nodeid)?;
        if !share.stats.qos.is_limited() {
            return None;
        }
        let args = request.get(size_of::<InHeader>()..).unwrap_or(&[]);
        let bytes = if header.opcode == opcode::READ {
            ReadIn::from_slice(args.get(..size_of::<ReadIn>()).unwrap_or(&[])).map(|r| r.size)
        } else if header.opcode == opcode::WRITE {
            WriteIn::from_slice(args.get(..size_of::<WriteIn>()).unwrap_or(&[])).map(|w| w.size)
        } else {
            None
        };
        // A size above MAX_PAYLOAD is refused with EINVAL when served: it costs no
        // more than the largest payload.
        let cost = Cost {
            ops: 1,
            bytes: u64::from(bytes.unwrap_or(0).min(MAX_PAYLOAD)),
        };
        Some((share, cost))
    }

    /// Serves one request from a ring: `request` is its local copy, `write_data` a
    /// WRITE's data left in guest memory, `reply` the chain's reply buffers (and
    /// `server_writer` a fuse-backend-rs writer over them, for the requests its
    /// server decodes). Returns the reply's length for the used ring (0: no reply is
    /// owed). A request that failed without a reply but whose header was readable is
    /// owed one: it is answered EINVAL, written anew from the start of the buffers.
    pub fn serve<'a, S: BitmapSlice + Default + 'a, R: Reply>(
        &self,
        request: &'a mut [u8],
        write_data: Option<&mut dyn WriteData>,
        reply: &mut R,
        server_writer: impl FnOnce() -> Option<Writer<'a, S>>,
    ) -> u32 {
        match self.handle_request(request, write_data, reply, server_writer) {
            Ok(n) => n as u32,
            Err(RequestError::NoHeader) => 0,
            Err(RequestError::Failed {
                opcode,
                unique,
                why,
            }) => {
                debug!("opcode {opcode} unique {unique}: {why}");
                if !fuse_ops::expects_reply(opcode) {
                    return 0;
                }
                // A completion with no bytes would read as a zeroed header, i.e.
                // success.
                buffers::error(reply, unique, libc::EINVAL).map_or(0, |n| n as u32)
            }
        }
    }

    /// Serves a request that may wait ([`Admission::may_wait`]) up to its answer,
    /// which it does not write: the wait may last any time, and the reply must
    /// reach the guest only when its ring can take it.
    pub fn wait(&self, request: &mut [u8]) -> LateReply {
        match parse_header(request) {
            Some(header) => {
                let answer = self.wait_for_lock(&header, request);
                LateReply {
                    unique: header.unique,
                    error: answer,
                }
            }
            None => LateReply {
                unique: 0,
                error: -libc::EINVAL,
            },
        }
    }

    /// Decides [`AfterCrash`] for a request's local copy. An appending WRITE is told
    /// by its handle's host flags and by the flags the guest sent with it.
    pub fn after_crash(&self, request: &[u8]) -> AfterCrash {
        let Some(h) = parse_header(request) else {
            return AfterCrash::Fail;
        };
        let Some(row) = fuse_ops::row(h.opcode) else {
            return AfterCrash::Fail;
        };
        if !row.reply {
            return AfterCrash::Drop;
        }
        let args = request.get(size_of::<InHeader>()..).unwrap_or(&[]);
        let rerun = match (row.rerun, h.opcode) {
            (Rerun::Yes, _) => true,
            (Rerun::No, _) => false,
            (Rerun::ByArgs, opcode::WRITE) => WriteIn::from_slice(
                args.get(..size_of::<WriteIn>()).unwrap_or(&[]),
            )
            .is_some_and(|w| {
                w.flags as i32 & libc::O_APPEND == 0
                    && !self.volumes.passthrough().appends(w.fh, h.nodeid)
            }),
            // OpenIn: flags first.
            (Rerun::ByArgs, opcode::OPEN) => args
                .get(..4)
                .is_some_and(|b| i32::from_le_bytes(b.try_into().unwrap()) & libc::O_TRUNC == 0),
            (Rerun::ByArgs, _) => false,
        };
        if rerun {
            AfterCrash::Rerun
        } else {
            AfterCrash::Fail
        }
    }
}

/// The answer of a request served off its ring: the reply's header fields (the
/// reply has no body).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct LateReply {
    unique: u64,
    /// 0, or a negative errno.
    error: i32,
}

impl LateReply {
    /// The answer to a wait the transport cannot take now (too many waits, no
    /// thread to wait on): ENOLCK, as the kernel answers a lock it cannot track.
    pub fn busy(request: &[u8]) -> Self {
        LateReply {
            unique: parse_header(request).map_or(0, |h| h.unique),
            error: -libc::ENOLCK,
        }
    }

    /// Writes the reply; returns its length (0 when the buffers cannot take it).
    pub fn write<R: Reply>(&self, reply: &mut R) -> u32 {
        reply.clear_body();
        buffers::finish(reply, self.unique, self.error).map_or(0, |n| n as u32)
    }

    /// The answer to a request failed by a crash ([`AfterCrash::Fail`]): EIO.
    pub fn failed_by_crash(request: &[u8]) -> Self {
        LateReply {
            unique: parse_header(request).map_or(0, |h| h.unique),
            error: -libc::EIO,
        }
    }

    /// 0, or the negative errno the guest gets.
    pub fn error(&self) -> i32 {
        self.error
    }
}
