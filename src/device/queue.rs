//! Serving one virtqueue: pop descriptor chains, run each FUSE request, return it.
//!
//! Everything here is reached by guest-controlled data, so nothing may panic: a chain
//! that does not decode is returned to the guest with no reply bytes.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::InHeader;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter};
use log::{debug, warn};
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap};

use crate::fs::{extra_ops, VolFs};

type Mem = GuestMemoryLoadGuard<GuestMemoryMmap>;

/// Drains the queue, re-checking after notifications are re-enabled (EVENT_IDX) so that
/// a request published in between is not missed.
pub fn process(
    server: &Server<Arc<VolFs>>,
    fs: &Arc<VolFs>,
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
        loop {
            let chain = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone());
            let Some(chain) = chain else { break };
            let head = chain.head_index();
            let len = serve_one(server, fs, &mem, chain, index);
            vring.add_used(head, len).map_err(queue_err(index))?;
            served.fetch_add(1, Ordering::Relaxed);
            if !event_idx || vring.needs_notification().map_err(queue_err(index))? {
                vring.signal_used_queue()?;
            }
        }
        if !event_idx || !vring.enable_notification().map_err(queue_err(index))? {
            return Ok(());
        }
    }
}

fn queue_err(index: usize) -> impl Fn(virtio_queue::Error) -> io::Error {
    move |e| io::Error::other(format!("queue {index}: {e}"))
}

/// Runs one request; returns the number of reply bytes written into the chain.
fn serve_one(
    server: &Server<Arc<VolFs>>,
    fs: &Arc<VolFs>,
    mem: &Mem,
    chain: DescriptorChain<Mem>,
    index: usize,
) -> u32 {
    let reader = match Reader::from_descriptor_chain(&**mem, chain.clone()) {
        Ok(r) => r,
        Err(e) => {
            warn!("queue {index}: unreadable descriptor chain: {e}");
            return 0;
        }
    };
    let writer = match VirtioFsWriter::new(&**mem, chain) {
        Ok(w) => w,
        Err(e) => {
            warn!("queue {index}: unwritable descriptor chain: {e}");
            return 0;
        }
    };
    // Peek at the header to route the opcodes fuse-backend-rs does not decode.
    let mut peek = reader.clone();
    let header: InHeader = match peek.read_obj() {
        Ok(h) => h,
        Err(e) => {
            warn!("queue {index}: request shorter than a FUSE header: {e}");
            return 0;
        }
    };
    let result = if extra_ops::handles(header.opcode) {
        let mut writer = writer;
        extra_ops::dispatch(&**fs, &header, &mut peek, &mut writer).map_err(|e| e.to_string())
    } else {
        server
            .handle_message(reader, writer.into(), None, None)
            .map_err(|e| e.to_string())
    };
    match result {
        Ok(n) => n as u32,
        Err(e) => {
            debug!(
                "queue {index}: opcode {} unique {}: {e}",
                header.opcode, header.unique
            );
            0
        }
    }
}
