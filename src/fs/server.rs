//! The request entry point shared by every transport (virtio queues, `/dev/fuse` in
//! tests): routes the opcodes fuse-backend-rs does not decode to [`extra_ops`], and
//! everything else to fuse-backend-rs's `Server`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::InHeader;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, Writer};
use vm_memory::bitmap::BitmapSlice;

use super::{extra_ops, VolFs};

pub struct FsServer {
    server: Server<Arc<VolFs>>,
    fs: Arc<VolFs>,
    /// Set by a successful INIT: until then every other request gets EIO, as in libfuse.
    initialized: AtomicBool,
}

const OPCODE_INIT: u32 = 26;
const OPCODE_DESTROY: u32 = 38;

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

impl FsServer {
    pub fn new(fs: Arc<VolFs>) -> Self {
        FsServer {
            server: Server::new(fs.clone()),
            fs,
            initialized: AtomicBool::new(false),
        }
    }

    pub fn fs(&self) -> &Arc<VolFs> {
        &self.fs
    }

    /// Serves one request; returns the number of reply bytes written.
    pub fn handle<S: BitmapSlice>(
        &self,
        reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, RequestError> {
        // Peek at the header (on a copy of the reader) to route the request.
        let mut peek = reader.clone();
        let header: InHeader = peek.read_obj().map_err(|_| RequestError::NoHeader)?;
        self.handle_with_header(&header, reader, writer)
    }

    /// Serves one request whose header the transport already read from guest memory,
    /// sparing the copy of the reader that [`Self::handle`] needs to peek.
    pub fn handle_with_header<S: BitmapSlice>(
        &self,
        header: &InHeader,
        reader: Reader<'_, S>,
        writer: Writer<'_, S>,
    ) -> Result<usize, RequestError> {
        let failed = |why: String| RequestError::Failed {
            opcode: header.opcode,
            unique: header.unique,
            why,
        };
        if header.opcode == OPCODE_INIT {
            // Marked before the reply goes out: the kernel sends its next requests as
            // soon as it reads the reply, possibly to another worker thread.
            let was = self.initialized.swap(true, Ordering::AcqRel);
            return self
                .server
                .handle_message(reader, writer, None, None)
                .map_err(|e| {
                    // A bad INIT does not end a session that an earlier one began.
                    self.initialized.store(was, Ordering::Release);
                    failed(e.to_string())
                });
        }
        if !self.initialized.load(Ordering::Acquire) {
            let mut writer = writer;
            return extra_ops::reply_error(&mut writer, header.unique, libc::EIO)
                .map_err(|e| failed(e.to_string()));
        }
        if header.opcode == OPCODE_DESTROY {
            self.initialized.store(false, Ordering::Release);
        }
        if extra_ops::handles(header.opcode) {
            let (mut reader, mut writer) = (reader, writer);
            // Step over the header: the decoder reads the body.
            reader
                .read_obj::<InHeader>()
                .map_err(|_| RequestError::NoHeader)?;
            extra_ops::dispatch(&*self.fs, header, &mut reader, &mut writer)
                .map_err(|e| failed(e.to_string()))
        } else {
            self.server
                .handle_message(reader, writer, None, None)
                .map_err(|e| failed(e.to_string()))
        }
    }
}
