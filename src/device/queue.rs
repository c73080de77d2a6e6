//! Serving one virtqueue: pop descriptor chains, run each FUSE request, return it.
//!
//! Everything here is reached by guest-controlled data, so nothing may panic: a chain
//! that does not decode is returned to the guest with no reply bytes.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::InHeader;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter};
use log::{debug, warn};
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{
    Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap,
};

use crate::fs::extra_ops::reply_error;
use crate::fs::{FsServer, RequestError};

type Mem = GuestMemoryLoadGuard<GuestMemoryMmap>;

/// Drains the queue, re-checking after notifications are re-enabled (EVENT_IDX) so that
/// a request published in between is not missed.
pub fn process(
    server: &Arc<FsServer>,
    mem: &GuestMemoryAtomic<GuestMemoryMmap>,
    vring: &VringRwLock,
    index: usize,
    event_idx: bool,
    served: &AtomicU64,
) -> io::Result<()> {
    let mem = mem.memory();
    loop {
        if event_idx {
            vring.disable_notification().map_err(queue_err(index))?;
        }
        let mut unsignalled = 0;
        let mut unsignalled_bytes = 0;
        loop {
            let chain = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone());
            let Some(chain) = chain else { break };
            let head = chain.head_index();
            if let Some(header) = peek_header(&mem, &chain) {
                if header.opcode == OPCODE_SETLKW
                    && wait_off_thread(server, vring, chain.clone(), header, event_idx, index)
                {
                    served.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let len = serve_one(server, &mem, chain, index);
            vring.add_used(head, len).map_err(queue_err(index))?;
            served.fetch_add(1, Ordering::Relaxed);
            unsignalled += 1;
            unsignalled_bytes += len as usize;
            // One interrupt per batch, not per request: each eventfd write wakes the
            // frontend's thread, and on a loaded host that context switch is the
            // largest cost of a small request. The batch is bounded in requests and
            // in bytes, so large reads are not held back behind each other.
            if unsignalled == SIGNAL_BATCH || unsignalled_bytes >= SIGNAL_BATCH_BYTES {
                notify(vring, event_idx, index)?;
                unsignalled = 0;
                unsignalled_bytes = 0;
            }
        }
        if unsignalled > 0 {
            notify(vring, event_idx, index)?;
        }
        if !event_idx || !vring.enable_notification().map_err(queue_err(index))? {
            return Ok(());
        }
    }
}

const OPCODE_SETLKW: u32 = 33;
/// Lock waits served at once off the queue threads; more get ENOLCK.
const MAX_LOCK_WAITERS: usize = 64;
static LOCK_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Runs a FUSE_SETLKW on a thread of its own: it may block until another guest
/// process (or another sandbox) unlocks, and the unlock must not queue behind it.
/// Returns false (the caller serves it inline) when too many waits are in flight,
/// in which case the request is answered ENOLCK.
fn wait_off_thread(
    server: &Arc<FsServer>,
    vring: &VringRwLock,
    chain: DescriptorChain<Mem>,
    header: InHeader,
    event_idx: bool,
    index: usize,
) -> bool {
    if LOCK_WAITERS.fetch_add(1, Ordering::AcqRel) >= MAX_LOCK_WAITERS {
        LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        warn!("queue {index}: more than {MAX_LOCK_WAITERS} lock waits, refusing one with ENOLCK");
        let head = chain.head_index();
        let len = VirtioFsWriter::new(chain.memory(), chain.clone())
            .ok()
            .and_then(|w| reply_error(&mut w.into(), header.unique, libc::ENOLCK).ok())
            .unwrap_or(0);
        let _ = vring.add_used(head, len as u32);
        let _ = notify(vring, event_idx, index);
        return true;
    }
    let server = server.clone();
    let vring = vring.clone();
    let spawned = std::thread::Builder::new()
        .name("volfsd-lockwait".to_string())
        .spawn(move || {
            let head = chain.head_index();
            let mem = chain.memory();
            let len = match (
                Reader::from_descriptor_chain(mem, chain.clone()),
                VirtioFsWriter::new(mem, chain.clone()),
            ) {
                (Ok(r), Ok(w)) => server
                    .handle_with_header(&header, r, w.into())
                    .map(|n| n as u32)
                    .unwrap_or(0),
                _ => 0,
            };
            if let Err(e) = vring.add_used(head, len) {
                warn!("queue {index}: returning a lock wait: {e}");
            }
            let _ = notify(&vring, event_idx, index);
            LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        LOCK_WAITERS.fetch_sub(1, Ordering::AcqRel);
        warn!("queue {index}: cannot start a lock-wait thread");
        return false;
    }
    true
}

/// Completions returned before the guest is interrupted while more are pending.
const SIGNAL_BATCH: usize = 8;
/// Reply bytes returned before the guest is interrupted while more are pending.
const SIGNAL_BATCH_BYTES: usize = 256 * 1024;

fn notify(vring: &VringRwLock, event_idx: bool, index: usize) -> io::Result<()> {
    if !event_idx || vring.needs_notification().map_err(queue_err(index))? {
        vring.signal_used_queue()?;
    }
    Ok(())
}

fn queue_err(index: usize) -> impl Fn(virtio_queue::Error) -> io::Error {
    move |e| io::Error::other(format!("queue {index}: {e}"))
}

/// Runs one request; returns the number of reply bytes written into the chain.
fn serve_one(server: &FsServer, mem: &Mem, chain: DescriptorChain<Mem>, index: usize) -> u32 {
    let reader = match Reader::from_descriptor_chain(&**mem, chain.clone()) {
        Ok(r) => r,
        Err(e) => {
            warn!("queue {index}: unreadable descriptor chain: {e}");
            return 0;
        }
    };
    let writer = match VirtioFsWriter::new(&**mem, chain.clone()) {
        Ok(w) => w,
        Err(e) => {
            warn!("queue {index}: unwritable descriptor chain: {e}");
            return 0;
        }
    };
    let result = match peek_header(mem, &chain) {
        Some(header) => server.handle_with_header(&header, reader, writer.into()),
        None => server.handle(reader, writer.into()),
    };
    match result {
        Ok(n) => n as u32,
        Err(RequestError::NoHeader) => {
            warn!("queue {index}: request shorter than a FUSE header");
            0
        }
        Err(RequestError::Failed {
            opcode,
            unique,
            why,
        }) => {
            debug!("queue {index}: opcode {opcode} unique {unique}: {why}");
            if !expects_reply(opcode) {
                return 0;
            }
            // The header was readable, so the guest is owed an answer: a completion
            // with no bytes would read as a zeroed header, i.e. success. Rewrite the
            // reply from the start of the chain as EINVAL.
            match VirtioFsWriter::new(&**mem, chain) {
                Ok(w) => reply_error(&mut w.into(), unique, libc::EINVAL)
                    .map(|n| n as u32)
                    .unwrap_or(0),
                Err(_) => 0,
            }
        }
    }
}

/// Reads the FUSE header straight from guest memory when the first descriptor holds
/// all of it (it always does with Linux guests), so routing needs no copy of the reader.
fn peek_header(mem: &Mem, chain: &DescriptorChain<Mem>) -> Option<InHeader> {
    let first = chain.clone().next()?;
    if first.is_write_only() || (first.len() as usize) < std::mem::size_of::<InHeader>() {
        return None;
    }
    mem.read_obj::<InHeader>(first.addr()).ok()
}

/// FORGET, BATCH_FORGET and INTERRUPT get no reply.
fn expects_reply(opcode: u32) -> bool {
    !matches!(opcode, 2 | 42 | 36)
}
