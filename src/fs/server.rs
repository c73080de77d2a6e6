//! Routing one request through the stack, for every transport: the virtio queues
//! reach it through `request.rs` (the transport's one door), `/dev/fuse` (tests)
//! through [`FsServer::handle`].
//!
//! A request reaches this file as bytes in the daemon's own memory: the transport has
//! copied it out of guest memory once (`device/request.rs`). Routing, the size checks
//! and fuse-backend-rs's decoder all read that one copy, so a guest that rewrites the
//! request while it is served changes nothing. Only a WRITE's data stays in guest
//! memory: it goes from there straight into the file.
//!
//! Routing follows each operation's row of the table (`fuse_ops.rs`): INIT and
//! DESTROY are the session's bookkeeping, here (a second INIT or a DESTROY starts a
//! new session); IOCTL is refused without decoding its sizes; what volfsd decodes
//! goes to [`dispatch`], replies written straight into their buffers (a WRITE's
//! data read in place); the rest to fuse-backend-rs's `Server`, through a writer of
//! its own.
//!
//! [`FsServer`]'s methods, one block per concern: routing here; what a transport
//! asks of a request (its admission, what to do with it after a crash) in
//! `request.rs`; the guest's session saved in `snapshot.rs`, loaded in
//! `session_load.rs`.

use std::io::{self, Read};
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use fuse_backend_rs::abi::fuse_abi::InHeader;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseBuf, Reader, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::ByteValued;

use super::buffers::{self, LocalReply, Reply, WriteData};
use super::stack::{Stack, VolFs};
use super::volumes::Volumes;
use super::{dispatch, extra_ops, init};
use crate::fuse_ops::{self, opcode, Decoder};

pub use super::buffers::{MAX_PAYLOAD, MAX_REQUEST, WRITE_PREFIX};

pub struct FsServer {
    server: Server<Arc<VolFs>>,
    pub(super) fs: Arc<VolFs>,
    /// Where a new guest session resets what the old one held.
    pub(super) volumes: Arc<Volumes>,
    /// Set by a successful INIT: until then every other request gets EIO, as in libfuse.
    pub(super) initialized: AtomicBool,
    /// What the guest's INIT negotiated, for the device state.
    pub(super) session: Mutex<Option<init::FuseSession>>,
}

/// Why a request produced no reply.
#[derive(Debug)]
pub enum RequestError {
    /// Shorter than a FUSE header: nothing to reply to.
    NoHeader,
    /// The request failed in a way that left no reply (logged by the caller).
    Failed {
        opcode: u32,
        unique: u64,
        why: String,
    },
}

/// The header of a request held in local memory.
pub fn parse_header(request: &[u8]) -> Option<InHeader> {
    InHeader::from_slice(request.get(..size_of::<InHeader>())?).copied()
}

fn local_reader<S: BitmapSlice + Default>(bytes: &mut [u8]) -> Reader<'_, S> {
    // from_fuse_buffer cannot fail: it wraps the slice as one buffer.
    Reader::from_fuse_buffer(FuseBuf::new(bytes)).unwrap_or_default()
}

impl FsServer {
    pub fn new(stack: &Stack) -> Self {
        FsServer {
            server: Server::new(stack.fs.clone()),
            fs: stack.fs.clone(),
            volumes: stack.volumes.clone(),
            initialized: AtomicBool::new(false),
            session: Mutex::new(None),
        }
    }

    /// The device was reset, or a new driver started its queues (a guest reboot):
    /// the session ends as with DESTROY, and the next request must be an INIT.
    pub fn start_over(&self) {
        self.initialized.store(false, Ordering::Release);
        self.set_session(None);
        self.volumes.reset_session();
    }

    /// The FUSE session INIT negotiated (None: none yet), kept for the device state
    /// and recorded in the journal.
    pub(super) fn set_session(&self, session: Option<crate::state::format::FuseSession>) {
        *self.session.lock().unwrap() = session;
        if let Some(j) = self.volumes.passthrough().journal() {
            j.set_init(session);
        }
    }

    /// Serves one request from a transport that hands over a reader of local memory
    /// (`/dev/fuse`): the bytes are taken out once, then as [`Self::handle_local`].
    pub fn handle<S: BitmapSlice + Default>(
        &self,
        mut reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, RequestError> {
        let mut bytes = vec![
            0u8;
            reader
                .available_bytes()
                .min(MAX_REQUEST + MAX_PAYLOAD as usize)
        ];
        reader
            .read_exact(&mut bytes)
            .map_err(|_| RequestError::NoHeader)?;
        self.handle_local(&mut bytes, writer)
    }

    /// Serves one request held whole in local memory, header included, with its
    /// reply written to a fuse-backend-rs writer in one piece; returns the number of
    /// reply bytes written.
    pub fn handle_local<S: BitmapSlice + Default>(
        &self,
        request: &mut [u8],
        writer: Writer<'_, S>,
    ) -> Result<usize, RequestError> {
        let mut reply = LocalReply::new(writer.available_bytes());
        let mut writer = Some(writer);
        let n = self.handle_request(request, None, &mut reply, || writer.take())?;
        match (reply.bytes(), writer.as_mut()) {
            (Some(_), Some(w)) => reply.send(w).map_err(|e| RequestError::Failed {
                opcode: parse_header(request).map_or(0, |h| h.opcode),
                unique: parse_header(request).map_or(0, |h| h.unique),
                why: e.to_string(),
            }),
            // Answered through the writer itself (fuse-backend-rs's server), or no
            // reply is owed.
            _ => Ok(n),
        }
    }

    /// Serves one request held whole in local memory with fuse-backend-rs's own
    /// server, also for the requests volfsd decodes itself ([`dispatch`]): the
    /// reference `harness/tests/dispatch.rs` compares those replies with.
    pub fn handle_with_library<S: BitmapSlice + Default>(
        &self,
        request: &mut [u8],
        writer: Writer<'_, S>,
    ) -> Result<usize, RequestError> {
        let header = parse_header(request).ok_or(RequestError::NoHeader)?;
        self.server
            .handle_message(local_reader(request), writer, None, None)
            .map_err(|e| RequestError::Failed {
                opcode: header.opcode,
                unique: header.unique,
                why: e.to_string(),
            })
    }

    /// Serves one request: `request` is its local copy (header included); for a
    /// WRITE, `write_data` is its data left in guest memory (None: the data follows
    /// the WriteIn in `request`). The reply goes into `reply`, or, for the requests
    /// fuse-backend-rs's server decodes, into the writer `server_writer` makes over
    /// the same buffers.
    pub fn handle_request<'a, S: BitmapSlice + Default + 'a, R: Reply>(
        &self,
        request: &'a mut [u8],
        write_data: Option<&mut dyn WriteData>,
        reply: &mut R,
        server_writer: impl FnOnce() -> Option<Writer<'a, S>>,
    ) -> Result<usize, RequestError> {
        let header = parse_header(request).ok_or(RequestError::NoHeader)?;
        let failed = |why: String| RequestError::Failed {
            opcode: header.opcode,
            unique: header.unique,
            why,
        };
        let answered = |r: io::Result<usize>| r.map_err(|e| failed(e.to_string()));
        if header.opcode == opcode::INIT {
            return answered(self.init(&header, request, reply));
        }
        if !self.initialized.load(Ordering::Acquire) {
            return answered(buffers::error(reply, header.unique, libc::EIO));
        }
        // The operation's row decides who decodes it (an opcode without one: the
        // library's server, which answers ENOSYS).
        match fuse_ops::row(header.opcode).map(|r| r.decoder) {
            Some(Decoder::Session) => answered(self.destroy(&header, reply)),
            Some(Decoder::Refused(errno)) => answered(buffers::error(reply, header.unique, errno)),
            Some(Decoder::Volfsd) => dispatch::serve(&self.fs, &header, request, write_data, reply)
                .map_err(|e| failed(e.0)),
            Some(Decoder::Library) | None => {
                let writer = server_writer().ok_or_else(|| failed("no reply buffers".into()))?;
                self.server
                    .handle_message(local_reader(request), writer, None, None)
                    .map_err(|e| failed(e.to_string()))
            }
        }
    }

    /// INIT: a new session, answered by `init.rs`. A second one on the same
    /// connection (a rebooted guest, or a hostile one) starts over: nothing of the old
    /// session survives into the new.
    fn init<R: Reply>(
        &self,
        header: &InHeader,
        request: &[u8],
        reply: &mut R,
    ) -> io::Result<usize> {
        // Marked before the reply goes out: the kernel sends its next requests as soon
        // as it reads the reply, possibly to another worker thread.
        let was = self.initialized.swap(true, Ordering::AcqRel);
        if was {
            self.volumes.reset_session();
        }
        let body = init::reply_body(&*self.fs, &request[size_of::<InHeader>()..]);
        let answer = match &body {
            Ok((body, _)) => buffers::ok(reply, header.unique, body),
            Err(errno) => buffers::error(reply, header.unique, *errno),
        };
        if !was && (body.is_err() || answer.is_err()) {
            self.initialized.store(false, Ordering::Release);
        }
        if let Ok((_, session)) = &body {
            self.set_session(*session);
        }
        answer
    }

    /// DESTROY ends the session as a second INIT does. Answered here: fuse-backend-rs
    /// writes the reply but reports no length, so the guest would never see it.
    fn destroy<R: Reply>(&self, header: &InHeader, reply: &mut R) -> io::Result<usize> {
        self.initialized.store(false, Ordering::Release);
        self.set_session(None);
        self.volumes.reset_session();
        buffers::ok(reply, header.unique, &[])
    }

    /// Serves a SETLKW (`header` is its header, `request` its local copy) up to its
    /// answer, 0 or a negative errno, which it does not write (see `request.rs`).
    /// Answers as [`Self::handle_request`] would: EIO before INIT, EINVAL for a bad
    /// body.
    pub(super) fn wait_for_lock(&self, header: &InHeader, request: &mut [u8]) -> i32 {
        if !self.initialized.load(Ordering::Acquire) {
            return -libc::EIO;
        }
        match extra_ops::setlkw(&*self.fs, header, request) {
            Ok(()) => 0,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}
