//! A lean request-queue driver for load generation.
//!
//! [`crate::frontend::FuseQueue`] allocates, zero-fills and copies guest
//! buffers for every request, which is right for tests but makes the client
//! the bottleneck under load. [`SlotQueue`] instead owns a fixed set of
//! request slots with buffers allocated once, like the Linux virtio-fs driver
//! with its per-request argument buffers:
//!
//! - device-readable: `[in header + args]`, then `[payload]` for WRITE data;
//! - device-writable: `[out header]`, then `[small reply]` or `[payload]`
//!   (READ data, READDIRPLUS).
//!
//! Every reply is validated (unique, len, errno range) before a workload sees it.

use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader};
use vm_memory::{ByteValued, GuestAddress};

use crate::frontend::error::{Error, Result};
use crate::frontend::fuse::{opcode_name, Reply, Request, UniqueSource};
use crate::frontend::fuse::{IN_HEADER_SIZE, OUT_HEADER_SIZE};
use crate::frontend::{FuseOps, GuestBuffer, GuestMemory, Segment, SplitQueue};

/// Size of the buffer holding the in header and the request's arguments.
pub const IN_BUF_SIZE: usize = 4096;
/// Size of the buffer holding the out header (at 0) and small replies (at 64).
const OUT_BUF_SIZE: usize = 4096;
const SMALL_REPLY_AT: usize = 64;
/// Largest reply that goes into the small-reply area.
pub const SMALL_REPLY_MAX: usize = OUT_BUF_SIZE - SMALL_REPLY_AT;

/// One request to send from a slot.
#[derive(Debug, Default)]
pub struct Req {
    pub opcode: u32,
    pub nodeid: u64,
    /// Argument bytes after the in header (structs, names), at most
    /// `IN_BUF_SIZE - 40` bytes.
    pub args: Vec<u8>,
    /// WRITE data: this many bytes of the slot's payload, already filled.
    pub data_len: u32,
    /// Reply body capacity (0: header only). Large replies land in the payload.
    pub reply_len: u32,
}

impl Req {
    pub fn new(opcode: u32, nodeid: u64) -> Self {
        Req {
            opcode,
            nodeid,
            ..Default::default()
        }
    }

    pub fn arg<T: ByteValued>(mut self, v: &T) -> Self {
        self.args.extend_from_slice(v.as_slice());
        self
    }

    pub fn name(mut self, name: &[u8]) -> Self {
        self.args.extend_from_slice(name);
        self.args.push(0);
        self
    }

    pub fn data(mut self, len: u32) -> Self {
        self.data_len = len;
        self
    }

    pub fn reply(mut self, len: u32) -> Self {
        self.reply_len = len;
        self
    }
}

/// A validated reply: `error` is 0 or a positive errno; `body` is valid until
/// the slot is reused.
pub struct Done<'a> {
    pub slot: usize,
    pub error: i32,
    pub body: &'a [u8],
    pub latency: Duration,
}

struct Slot {
    in_buf: GuestBuffer,
    out_buf: GuestBuffer,
    payload: GuestBuffer,
    in_ptr: *mut u8,
    out_ptr: *mut u8,
    payload_ptr: *mut u8,
    unique: u64,
    opcode: u32,
    nodeid: u64,
    reply_in_payload: bool,
    busy: bool,
    started: Instant,
}

/// A request queue with `slots` preallocated request slots.
pub struct SlotQueue {
    queue: SplitQueue,
    slots: Vec<Slot>,
    /// Chain head -> slot index.
    by_head: Vec<u32>,
    uniques: UniqueSource,
    timeout: Duration,
    creds: (u32, u32, u32),
}

// SAFETY: the raw pointers point into the shared guest memory mapping, which
// lives as long as the `GuestBuffer`s stored next to them; a slot is only
// touched by the thread owning the queue.
unsafe impl Send for SlotQueue {}

fn ptr_of(memory: &GuestMemory, buf: &GuestBuffer) -> Result<*mut u8> {
    Ok(memory.host_address(buf.addr())? as *mut u8)
}

impl SlotQueue {
    /// `slots` request slots, each with a payload of `payload` bytes.
    pub fn new(
        queue: SplitQueue,
        memory: &std::sync::Arc<GuestMemory>,
        uniques: UniqueSource,
        slots: usize,
        payload: usize,
    ) -> Result<Self> {
        let mut v = Vec::with_capacity(slots);
        for _ in 0..slots {
            let in_buf = memory.alloc(IN_BUF_SIZE as u64)?;
            let out_buf = memory.alloc(OUT_BUF_SIZE as u64)?;
            let payload = memory.alloc(payload.max(4096) as u64)?;
            v.push(Slot {
                in_ptr: ptr_of(memory, &in_buf)?,
                out_ptr: ptr_of(memory, &out_buf)?,
                payload_ptr: ptr_of(memory, &payload)?,
                in_buf,
                out_buf,
                payload,
                unique: 0,
                opcode: 0,
                nodeid: 0,
                reply_in_payload: false,
                busy: false,
                started: Instant::now(),
            });
        }
        let size = queue.size() as usize;
        // SAFETY: geteuid/getegid have no preconditions.
        let creds = unsafe { (libc::geteuid(), libc::getegid(), std::process::id()) };
        Ok(SlotQueue {
            queue,
            slots: v,
            by_head: vec![u32::MAX; size],
            uniques,
            timeout: Duration::from_secs(30),
            creds,
        })
    }

    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    pub fn index(&self) -> u16 {
        self.queue.index()
    }

    /// The payload of `slot`, to fill with WRITE data before `submit`.
    pub fn payload_mut(&mut self, slot: usize) -> &mut [u8] {
        let s = &self.slots[slot];
        assert!(!s.busy, "payload of a slot in flight");
        // SAFETY: the slot is idle, so the device does not own the buffer;
        // the mapping outlives `self`.
        unsafe { std::slice::from_raw_parts_mut(s.payload_ptr, s.payload.len() as usize) }
    }

    pub fn payload_len(&self) -> usize {
        self.slots[0].payload.len() as usize
    }

    /// Places the request of `slot` in the ring (no kick).
    pub fn submit(&mut self, slot: usize, req: &Req) -> Result<u64> {
        let unique = self.uniques.next();
        let (uid, gid, pid) = self.creds;
        let s = &mut self.slots[slot];
        if s.busy {
            return Err(Error::InvalidArgument(format!("slot {slot} is in flight")));
        }
        let in_len = IN_HEADER_SIZE + req.args.len();
        if in_len > IN_BUF_SIZE {
            return Err(Error::InvalidArgument(format!(
                "request arguments of {} bytes",
                req.args.len()
            )));
        }
        let header = InHeader {
            len: (in_len + req.data_len as usize) as u32,
            opcode: req.opcode,
            unique,
            nodeid: req.nodeid,
            uid,
            gid,
            pid,
            padding: 0,
        };
        // SAFETY: the slot is idle and in_buf has IN_BUF_SIZE bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_slice().as_ptr(), s.in_ptr, IN_HEADER_SIZE);
            std::ptr::copy_nonoverlapping(
                req.args.as_ptr(),
                s.in_ptr.add(IN_HEADER_SIZE),
                req.args.len(),
            );
            // Poison the out header so a reply that never wrote it is caught.
            std::ptr::write_bytes(s.out_ptr, 0xa5, OUT_HEADER_SIZE);
        }
        let mut readable = [Segment::new(s.in_buf.addr(), in_len as u32); 2];
        let mut nr = 1;
        if req.data_len > 0 {
            if req.data_len as u64 > s.payload.len() {
                return Err(Error::InvalidArgument("data exceeds payload".into()));
            }
            readable[1] = Segment::new(s.payload.addr(), req.data_len);
            nr = 2;
        }
        let out_addr = s.out_buf.addr();
        let mut writable = [Segment::new(out_addr, OUT_HEADER_SIZE as u32); 2];
        let mut nw = 1;
        s.reply_in_payload = false;
        if req.reply_len > 0 {
            nw = 2;
            if req.reply_len as usize <= SMALL_REPLY_MAX {
                writable[1] = Segment::new(
                    GuestAddress(out_addr.0 + SMALL_REPLY_AT as u64),
                    req.reply_len,
                );
            } else {
                if req.data_len > 0 || req.reply_len as u64 > s.payload.len() {
                    return Err(Error::InvalidArgument("reply exceeds payload".into()));
                }
                s.reply_in_payload = true;
                writable[1] = Segment::new(s.payload.addr(), req.reply_len);
            }
        }
        let head = self.queue.add_chain(&readable[..nr], &writable[..nw])?;
        s.unique = unique;
        s.opcode = req.opcode;
        s.nodeid = req.nodeid;
        s.busy = true;
        s.started = Instant::now();
        self.by_head[head as usize] = slot as u32;
        Ok(unique)
    }

    /// Notifies the backend of everything submitted.
    pub fn kick(&mut self) -> Result<()> {
        self.queue.notify().map(|_| ())
    }

    /// Waits for the next completion (up to the queue timeout) and validates it.
    pub fn next_done(&mut self) -> Result<Done<'_>> {
        let used = match self.queue.pop_used()? {
            Some(u) => u,
            None => self.queue.wait_used(self.timeout)?,
        };
        self.finish(used)
    }

    /// The next completion if one is there now.
    pub fn try_next_done(&mut self) -> Result<Option<Done<'_>>> {
        match self.queue.pop_used()? {
            Some(u) => self.finish(u).map(Some),
            None => Ok(None),
        }
    }

    fn finish(&mut self, used: crate::frontend::UsedElement) -> Result<Done<'_>> {
        let slot = self.by_head[used.head as usize] as usize;
        self.by_head[used.head as usize] = u32::MAX;
        let s = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| Error::bad_reply("used ring", format!("unknown head {}", used.head)))?;
        s.busy = false;
        let latency = s.started.elapsed();
        let context = || {
            format!(
                "queue {}: {} nodeid {} unique {}",
                self.queue.index(),
                opcode_name(s.opcode),
                s.nodeid,
                s.unique
            )
        };
        if (used.len as usize) < OUT_HEADER_SIZE {
            return Err(Error::bad_reply(
                context(),
                format!("used len {} is shorter than the out header", used.len),
            ));
        }
        // SAFETY: the device returned the chain; out_buf holds OUT_BUF_SIZE bytes.
        let header = unsafe { std::ptr::read_unaligned(s.out_ptr as *const OutHeader) };
        if header.unique != s.unique {
            return Err(Error::bad_reply(
                context(),
                format!("reply unique {} does not match", header.unique),
            ));
        }
        if header.len != used.len {
            return Err(Error::bad_reply(
                context(),
                format!("out header len {} but used len {}", header.len, used.len),
            ));
        }
        if header.error > 0 || header.error < -4095 {
            return Err(Error::bad_reply(
                context(),
                format!("error field {}", header.error),
            ));
        }
        let body_len = used.len as usize - OUT_HEADER_SIZE;
        if header.error < 0 && body_len != 0 {
            return Err(Error::bad_reply(
                context(),
                format!("errno {} reply carries {body_len} bytes", -header.error),
            ));
        }
        // SAFETY: the device wrote at most the writable length (checked by
        // pop_used), which lies inside the buffer chosen at submit.
        let body = unsafe {
            if s.reply_in_payload {
                std::slice::from_raw_parts(s.payload_ptr, body_len)
            } else {
                std::slice::from_raw_parts(s.out_ptr.add(SMALL_REPLY_AT), body_len)
            }
        };
        Ok(Done {
            slot,
            error: -header.error,
            body,
            latency,
        })
    }

    fn context_of(&self, slot: usize) -> String {
        let s = &self.slots[slot];
        format!(
            "queue {}: {} nodeid {} unique {}",
            self.queue.index(),
            opcode_name(s.opcode),
            s.nodeid,
            s.unique
        )
    }
}

/// Synchronous calls over the last slot, for setup and teardown: gives the
/// slot queue every typed operation of [`FuseOps`].
impl FuseOps for SlotQueue {
    fn call(&mut self, request: &Request) -> Result<Reply> {
        let slot = self.slots.len() - 1;
        let mut req = Req::new(request.opcode, request.nodeid);
        for part in &request.args {
            req.args.extend_from_slice(part);
        }
        let cap = request.reply_capacity.ok_or_else(|| {
            Error::InvalidArgument("requests without reply go to the hiprio queue".into())
        })?;
        req.reply_len = cap;
        if req.args.len() + IN_HEADER_SIZE > IN_BUF_SIZE {
            // Large inline data (a WRITE from setup code): move it to the payload.
            let fixed = request.args.first().map_or(0, Vec::len);
            let data = req.args.split_off(fixed);
            self.payload_mut(slot)[..data.len()].copy_from_slice(&data);
            req.data_len = data.len() as u32;
        }
        let unique = self.submit(slot, &req)?;
        self.kick()?;
        let context = self.context_of(slot);
        let done = self.next_done()?;
        if done.slot != slot {
            return Err(Error::bad_reply(
                context,
                "another request completed during a synchronous call",
            ));
        }
        if done.error != 0 {
            return Err(Error::Errno {
                context,
                errno: done.error,
            });
        }
        let body = done.body.to_vec();
        Ok(Reply {
            context,
            header: OutHeader {
                len: (body.len() + OUT_HEADER_SIZE) as u32,
                error: 0,
                unique,
            },
            body,
        })
    }

    fn call_no_reply(&mut self, _request: &Request) -> Result<()> {
        Err(Error::InvalidArgument(
            "requests without reply go to the hiprio queue".into(),
        ))
    }
}
