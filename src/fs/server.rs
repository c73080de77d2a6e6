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
//! Routing:
//! - INIT, DESTROY: session bookkeeping here (a second INIT or a DESTROY starts a new
//!   session); INIT is answered by [`init`], DESTROY here;
//! - WRITE: decoded here, with the data read in place;
//! - IOCTL: ENOTTY here, without decoding its sizes;
//! - COPY_FILE_RANGE, SYNCFS, TMPFILE, SETLKW: [`extra_ops`];
//! - everything else: fuse-backend-rs's `Server`.

use std::io::{self, Read};
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use fuse_backend_rs::abi::fuse_abi::{
    InHeader, Opcode, ReadIn, WriteIn, WriteOut, WRITE_CACHE, WRITE_LOCKOWNER,
};
use fuse_backend_rs::api::filesystem::{Context, FileSystem, ZeroCopyReader};
use fuse_backend_rs::api::server::{Server, MAX_BUFFER_SIZE};
use fuse_backend_rs::common::file_traits::FileReadWriteVolatile;
use fuse_backend_rs::transport::{FuseBuf, Reader, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::ByteValued;

use super::stack::{Stack, VolFs};
use super::volumes::Volumes;
use super::{extra_ops, init, reply};

/// The largest request accepted, WRITE data aside: a FUSE message of at most
/// MAX_BUFFER_SIZE (1 MiB) plus its header page, as fuse-backend-rs bounds it.
pub const MAX_REQUEST: usize = MAX_BUFFER_SIZE as usize + 0x1000;
/// The largest READ, READDIR or WRITE payload: the MAX_PAGES the guest negotiates.
pub const MAX_PAYLOAD: u32 = MAX_BUFFER_SIZE;
/// Bytes of a WRITE request kept in local memory: its header and WriteIn.
pub const WRITE_PREFIX: usize = size_of::<InHeader>() + size_of::<WriteIn>();

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

/// A WRITE's data: a reader over the guest's buffers, consumed straight into the file.
struct WriteData<'a, S: BitmapSlice>(Reader<'a, S>);

impl<S: BitmapSlice> ZeroCopyReader for WriteData<'_, S> {
    fn read_to(
        &mut self,
        f: &mut dyn FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        self.0.read_to_at(f, count, off)
    }
}

impl<S: BitmapSlice> io::Read for WriteData<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
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
        if let Some(j) = super::journal::get() {
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

    /// Serves one request held whole in local memory, header included; returns the
    /// number of reply bytes written.
    pub fn handle_local<S: BitmapSlice + Default>(
        &self,
        request: &mut [u8],
        writer: Writer<'_, S>,
    ) -> Result<usize, RequestError> {
        self.handle_request(request, None, writer)
    }

    /// Serves one request: `request` is its local copy (header included); for a
    /// WRITE, `write_data` is its data left in guest memory (None: the data follows
    /// the WriteIn in `request`).
    pub fn handle_request<'a, S: BitmapSlice + Default>(
        &self,
        request: &'a mut [u8],
        write_data: Option<Reader<'a, S>>,
        writer: Writer<'a, S>,
    ) -> Result<usize, RequestError> {
        let header = parse_header(request).ok_or(RequestError::NoHeader)?;
        let failed = |why: String| RequestError::Failed {
            opcode: header.opcode,
            unique: header.unique,
            why,
        };
        let mut writer = writer;
        let reply_errno = |w: &mut Writer<'a, S>, errno: i32| {
            reply::reply_error(w, header.unique, errno).map_err(|e| failed(e.to_string()))
        };
        if header.opcode == Opcode::Init as u32 {
            // Marked before the reply goes out: the kernel sends its next requests as
            // soon as it reads the reply, possibly to another worker thread.
            let was = self.initialized.swap(true, Ordering::AcqRel);
            if was {
                // A rebooted guest (or a hostile one) starts over on the same
                // connection: nothing of the old session may survive into the new.
                self.volumes.reset_session();
            }
            let body = init::reply_body(&*self.fs, &request[size_of::<InHeader>()..]);
            let answer = match &body {
                Ok((body, _)) => reply::reply(&mut writer, header.unique, 0, body),
                Err(errno) => reply::reply_error(&mut writer, header.unique, *errno),
            };
            if !was && (body.is_err() || answer.is_err()) {
                self.initialized.store(false, Ordering::Release);
            }
            if let Ok((_, session)) = &body {
                self.set_session(*session);
            }
            return answer.map_err(|e| failed(e.to_string()));
        }
        if !self.initialized.load(Ordering::Acquire) {
            return reply_errno(&mut writer, libc::EIO);
        }
        match header.opcode {
            op if op == Opcode::Destroy as u32 => {
                // Answered here: fuse-backend-rs writes the reply but reports no
                // length, so the guest would never see it.
                self.initialized.store(false, Ordering::Release);
                self.set_session(None);
                self.volumes.reset_session();
                return reply::reply(&mut writer, header.unique, 0, &[])
                    .map_err(|e| failed(e.to_string()));
            }
            // The daemon serves no ioctl; its sizes are never looked at.
            op if op == Opcode::Ioctl as u32 => return reply_errno(&mut writer, libc::ENOTTY),
            op if op == Opcode::Read as u32
                || op == Opcode::Readdir as u32
                || op == Opcode::Readdirplus as u32 =>
            {
                let size = ReadIn::from_slice(
                    request
                        .get(size_of::<InHeader>()..size_of::<InHeader>() + size_of::<ReadIn>())
                        .unwrap_or(&[]),
                )
                .map(|r| r.size);
                if size.is_some_and(|s| s > MAX_PAYLOAD) {
                    return reply_errno(&mut writer, libc::EINVAL);
                }
            }
            op if op == Opcode::Write as u32 => {
                return self.write(&header, request, write_data, writer);
            }
            _ => {}
        }
        if extra_ops::handles(header.opcode) {
            let body = &mut request[size_of::<InHeader>()..];
            let mut reader = local_reader(body);
            extra_ops::dispatch(&*self.fs, &header, &mut reader, &mut writer)
                .map_err(|e| failed(e.to_string()))
        } else {
            self.server
                .handle_message(local_reader(request), writer, None, None)
                .map_err(|e| failed(e.to_string()))
        }
    }

    /// Serves a SETLKW (`header` is its header, `request` its local copy) up to its
    /// answer, 0 or a negative errno, which it does not write (see `request.rs`).
    /// Answers as [`Self::handle_request`] would: EIO before INIT, EINVAL for a bad
    /// body.
    pub(super) fn wait_for_lock(&self, header: &InHeader, request: &mut [u8]) -> i32 {
        if !self.initialized.load(Ordering::Acquire) {
            return -libc::EIO;
        }
        let body = request.get_mut(size_of::<InHeader>()..).unwrap_or_default();
        let mut reader = local_reader::<()>(body);
        match extra_ops::setlkw(&*self.fs, header, &mut reader) {
            Ok(()) => 0,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    fn write<'a, S: BitmapSlice + Default>(
        &self,
        header: &InHeader,
        request: &'a mut [u8],
        write_data: Option<Reader<'a, S>>,
        mut writer: Writer<'a, S>,
    ) -> Result<usize, RequestError> {
        let failed = |why: String| RequestError::Failed {
            opcode: header.opcode,
            unique: header.unique,
            why,
        };
        let Some(args) = request
            .get(size_of::<InHeader>()..WRITE_PREFIX)
            .and_then(WriteIn::from_slice)
            .copied()
        else {
            return reply::reply_error(&mut writer, header.unique, libc::EINVAL)
                .map_err(|e| failed(e.to_string()));
        };
        let data = match write_data {
            Some(r) => r,
            None => local_reader(&mut request[WRITE_PREFIX..]),
        };
        if args.size > MAX_PAYLOAD || args.size as usize > data.available_bytes() {
            return reply::reply_error(&mut writer, header.unique, libc::EINVAL)
                .map_err(|e| failed(e.to_string()));
        }
        let owner = (args.fuse_flags & WRITE_LOCKOWNER != 0).then_some(args.lock_owner);
        let delayed = args.fuse_flags & WRITE_CACHE != 0;
        let ctx = Context::from(header);
        let mut data = WriteData(data);
        let result = self.fs.write(
            &ctx,
            header.nodeid,
            args.fh,
            &mut data,
            args.size,
            args.offset,
            owner,
            delayed,
            args.flags,
            args.fuse_flags,
        );
        match result {
            Ok(n) => {
                let out = WriteOut {
                    size: n as u32,
                    padding: 0,
                };
                reply::reply(&mut writer, header.unique, 0, out.as_slice())
            }
            Err(e) => reply::reply_error(
                &mut writer,
                header.unique,
                e.raw_os_error().unwrap_or(libc::EIO),
            ),
        }
        .map_err(|e| failed(e.to_string()))
    }
}
