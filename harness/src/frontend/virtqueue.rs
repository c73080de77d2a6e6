//! Driver side of a split virtqueue (virtio 1.x, section 2.7), living in guest
//! memory that the backend maps: descriptor table, available ring, used ring.
//!
//! The driver writes descriptors and the avail ring, the device writes the used
//! ring; the two sides run in different processes, so index updates use
//! release/acquire atomics on the shared mapping.

use std::num::Wrapping;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::VringConfigData;
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::error::{Error, Result};
use super::memory::{GuestBuffer, GuestMemory};

const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const DESC_SIZE: u64 = 16;
const USED_ELEM_SIZE: u64 = 8;
/// Largest queue size allowed by the split-ring format.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// One buffer of a descriptor chain, as guest address + length. The address is
/// not checked against guest memory so tests can hand the backend bogus ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

impl Segment {
    pub fn new(addr: GuestAddress, len: u32) -> Self {
        Segment { addr, len }
    }

    /// The whole of `buf` as one segment.
    pub fn of(buf: &GuestBuffer) -> Self {
        Segment {
            addr: buf.addr(),
            len: buf.len() as u32,
        }
    }
}

/// An entry the device put in the used ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedElement {
    /// Head descriptor index returned by `add_chain`.
    pub head: u16,
    /// Bytes the device wrote into the device-writable buffers.
    pub len: u32,
}

/// Bookkeeping for a chain the device currently owns.
struct InFlightChain {
    descriptors: Vec<u16>,
    writable_len: u64,
}

/// Driver state of one split virtqueue.
pub struct SplitQueue {
    queue_index: u16,
    size: u16,
    _rings: GuestBuffer,
    memory: Arc<GuestMemory>,
    desc_table: GuestAddress,
    avail_ring: GuestAddress,
    used_ring: GuestAddress,
    free_descriptors: Vec<u16>,
    in_flight: Vec<Option<InFlightChain>>,
    next_avail: Wrapping<u16>,
    last_used: Wrapping<u16>,
    /// avail idx at the last notification, for VIRTIO_RING_F_EVENT_IDX.
    last_notified_avail: Wrapping<u16>,
    event_idx: bool,
    kick: EventFd,
    call: EventFd,
}

/// Offsets of the three ring parts inside one allocation.
struct RingLayout {
    avail_offset: u64,
    used_offset: u64,
    total: u64,
}

impl RingLayout {
    fn for_size(size: u16) -> Self {
        let size = u64::from(size);
        let desc_bytes = DESC_SIZE * size;
        // flags, idx, ring[size], used_event
        let avail_bytes = 4 + 2 * size + 2;
        // Used ring must be 4-byte aligned.
        let used_offset = (desc_bytes + avail_bytes).div_ceil(4) * 4;
        // flags, idx, ring[size], avail_event
        let used_bytes = 4 + USED_ELEM_SIZE * size + 2;
        RingLayout {
            avail_offset: desc_bytes,
            used_offset,
            total: used_offset + used_bytes,
        }
    }
}

impl SplitQueue {
    /// Allocates the rings for queue `queue_index` with `size` entries (power of two).
    pub fn new(memory: &Arc<GuestMemory>, queue_index: u16, size: u16) -> Result<Self> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(Error::InvalidArgument(format!(
                "queue {queue_index}: size {size} is not a power of two in 1..=32768"
            )));
        }
        let layout = RingLayout::for_size(size);
        let rings = memory.alloc(layout.total)?;
        let base = rings.addr();
        let new_eventfd = |what: &str| {
            EventFd::new(EFD_NONBLOCK)
                .map_err(|e| Error::io(format!("queue {queue_index}: creating {what} eventfd"), e))
        };
        Ok(SplitQueue {
            queue_index,
            size,
            memory: Arc::clone(memory),
            desc_table: base,
            avail_ring: base.unchecked_add(layout.avail_offset),
            used_ring: base.unchecked_add(layout.used_offset),
            _rings: rings,
            // Pop from the end, so hand out 0, 1, 2... first.
            free_descriptors: (0..size).rev().collect(),
            in_flight: (0..size).map(|_| None).collect(),
            next_avail: Wrapping(0),
            last_used: Wrapping(0),
            last_notified_avail: Wrapping(0),
            event_idx: false,
            kick: new_eventfd("kick")?,
            call: new_eventfd("call")?,
        })
    }

    /// vhost-user queue index (0 = hiprio, 1.. = request queues for virtio-fs).
    pub fn index(&self) -> u16 {
        self.queue_index
    }

    /// Number of entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Use VIRTIO_RING_F_EVENT_IDX notification suppression (only if negotiated).
    pub fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    /// Eventfd the driver writes to notify the device (SET_VRING_KICK).
    pub fn kick_eventfd(&self) -> &EventFd {
        &self.kick
    }

    /// Eventfd the device writes to interrupt the driver (SET_VRING_CALL).
    pub fn call_eventfd(&self) -> &EventFd {
        &self.call
    }

    /// Guest address of the used ring (flags, idx, ring of 8-byte elements,
    /// avail_event), the part the device writes.
    pub fn used_ring_addr(&self) -> GuestAddress {
        self.used_ring
    }

    /// The used index the device last published, read from guest memory (not
    /// consumed: `pop_used` still returns the entries).
    pub fn used_idx(&self) -> Result<u16> {
        self.load(self.used_ring.unchecked_add(2), "used idx")
    }

    /// The avail index the driver published, read from guest memory (what
    /// cloud-hypervisor sends as the base when it reconnects).
    pub fn avail_idx(&self) -> Result<u16> {
        self.load(self.avail_ring.unchecked_add(2), "avail idx")
    }

    /// Free descriptors left for new chains.
    pub fn free_descriptor_count(&self) -> usize {
        self.free_descriptors.len()
    }

    /// Chains submitted and not yet returned through the used ring.
    pub fn in_flight_count(&self) -> usize {
        self.size as usize - self.free_descriptors.len()
    }

    /// Ring addresses for SET_VRING_ADDR, in the frontend's virtual address space.
    pub fn config_data(&self) -> Result<VringConfigData> {
        Ok(VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: 0,
            desc_table_addr: self.memory.host_address(self.desc_table)?,
            used_ring_addr: self.memory.host_address(self.used_ring)?,
            avail_ring_addr: self.memory.host_address(self.avail_ring)?,
            log_addr: None,
        })
    }

    /// Writes a chain (device-readable segments first, then device-writable ones)
    /// and publishes it in the avail ring. Does not notify: call [`Self::notify`]
    /// once after adding a batch.
    pub fn add_chain(&mut self, readable: &[Segment], writable: &[Segment]) -> Result<u16> {
        let count = readable.len() + writable.len();
        if count == 0 {
            return Err(Error::InvalidArgument(format!(
                "queue {}: empty descriptor chain",
                self.queue_index
            )));
        }
        if count > self.free_descriptors.len() {
            return Err(Error::QueueFull {
                queue: self.queue_index,
                needed: count,
                free: self.free_descriptors.len(),
            });
        }
        let split_at = self.free_descriptors.len() - count;
        let mut descriptors = self.free_descriptors.split_off(split_at);
        descriptors.reverse();

        let segments = readable
            .iter()
            .map(|s| (s, 0))
            .chain(writable.iter().map(|s| (s, VIRTQ_DESC_F_WRITE)));
        for (i, (segment, write_flag)) in segments.enumerate() {
            let (flags, next) = match descriptors.get(i + 1) {
                Some(&next) => (write_flag | VIRTQ_DESC_F_NEXT, next),
                None => (write_flag, 0),
            };
            self.write_descriptor(descriptors[i], segment, flags, next)?;
        }

        let head = descriptors[0];
        let writable_len = writable.iter().map(|s| u64::from(s.len)).sum();
        self.in_flight[head as usize] = Some(InFlightChain {
            descriptors,
            writable_len,
        });

        self.publish(head)?;
        Ok(head)
    }

    /// Puts the chain at `head` in the next avail ring slot and publishes the new
    /// avail index.
    fn publish(&mut self, head: u16) -> Result<()> {
        let slot = u64::from(self.next_avail.0 % self.size);
        let slot_addr = self.avail_ring.unchecked_add(4 + 2 * slot);
        self.write(head, slot_addr, "avail ring entry")?;
        self.next_avail += 1;
        // Release: descriptors and ring entry must be visible before the new idx.
        self.memory
            .mmap()
            .store(
                self.next_avail.0,
                self.avail_ring.unchecked_add(2),
                Ordering::Release,
            )
            .map_err(|e| Error::memory(self.context("publishing avail idx"), e))
    }

    /// Hostile driver: publishes an avail index `ahead` entries past the last real
    /// one (further than the queue is long, for a broken ring) and kicks.
    pub fn publish_bogus_avail_idx(&mut self, ahead: u16) -> Result<()> {
        let bogus = self.next_avail + Wrapping(ahead);
        self.memory
            .mmap()
            .store(bogus.0, self.avail_ring.unchecked_add(2), Ordering::Release)
            .map_err(|e| Error::memory(self.context("publishing a bogus avail idx"), e))?;
        self.kick_eventfd()
            .write(1)
            .map_err(|e| Error::io(self.context("kick"), e))
    }

    /// Hostile driver: publishes a chain of two descriptors that point at each other
    /// (a loop), the first one holding `readable`, and kicks.
    pub fn add_looping_chain(&mut self, readable: &Segment) -> Result<u16> {
        if self.free_descriptors.len() < 2 {
            return Err(Error::QueueFull {
                queue: self.queue_index,
                needed: 2,
                free: self.free_descriptors.len(),
            });
        }
        let a = self.free_descriptors.pop().expect("two free");
        let b = self.free_descriptors.pop().expect("two free");
        self.write_descriptor(a, readable, VIRTQ_DESC_F_NEXT, b)?;
        self.write_descriptor(b, readable, VIRTQ_DESC_F_NEXT, a)?;
        self.publish(a)?;
        self.kick_eventfd()
            .write(1)
            .map_err(|e| Error::io(self.context("kick"), e))?;
        Ok(a)
    }

    /// Kicks the device if it asked for it (always, unless EVENT_IDX is on).
    /// Returns whether a kick was sent.
    pub fn notify(&mut self) -> Result<bool> {
        let new = self.next_avail;
        let old = self.last_notified_avail;
        if new == old {
            return Ok(false);
        }
        // The avail idx store must be ordered before reading avail_event.
        fence(Ordering::SeqCst);
        let needed = if self.event_idx {
            let avail_event: u16 = self.load(self.avail_event_addr(), "avail_event")?;
            need_event(avail_event, new.0, old.0)
        } else {
            let flags: u16 = self.load(self.used_ring, "used flags")?;
            // VIRTQ_USED_F_NO_NOTIFY
            flags & 1 == 0
        };
        self.last_notified_avail = new;
        if needed {
            self.kick
                .write(1)
                .map_err(|e| Error::io(self.context("writing kick eventfd"), e))?;
        }
        Ok(needed)
    }

    /// Takes the next used entry, if the device has returned one, and frees its
    /// descriptors. A used entry naming a chain we did not submit, or claiming
    /// more bytes than the chain could hold, is an error (after it is consumed).
    pub fn pop_used(&mut self) -> Result<Option<UsedElement>> {
        let used_idx: u16 = self.load(self.used_ring.unchecked_add(2), "used idx")?;
        if Wrapping(used_idx) == self.last_used {
            return Ok(None);
        }
        if (Wrapping(used_idx) - self.last_used).0 > self.size {
            return Err(Error::bad_reply(
                self.context("used ring"),
                format!(
                    "used idx {used_idx} is more than {} ahead of {}",
                    self.size, self.last_used
                ),
            ));
        }
        let slot = u64::from(self.last_used.0 % self.size);
        let elem_addr = self.used_ring.unchecked_add(4 + USED_ELEM_SIZE * slot);
        let id: u32 = self.read(elem_addr, "used element id")?;
        let len: u32 = self.read(elem_addr.unchecked_add(4), "used element len")?;
        self.last_used += 1;
        if self.event_idx {
            // Ask for an interrupt as soon as the next entry is used.
            self.write(self.last_used.0, self.used_event_addr(), "used_event")?;
        }

        let chain = usize::try_from(id)
            .ok()
            .and_then(|i| self.in_flight.get_mut(i))
            .and_then(Option::take)
            .ok_or_else(|| {
                Error::bad_reply(
                    self.context("used ring"),
                    format!("used id {id} is not an in-flight chain head"),
                )
            })?;
        self.free_descriptors
            .extend(chain.descriptors.iter().rev().copied());
        if u64::from(len) > chain.writable_len {
            return Err(Error::bad_reply(
                self.context("used ring"),
                format!(
                    "used len {len} for head {id} exceeds its {} writable bytes",
                    chain.writable_len
                ),
            ));
        }
        Ok(Some(UsedElement {
            head: id as u16,
            len,
        }))
    }

    /// Waits until a used entry is available (or `timeout` passes) and pops it.
    pub fn wait_used(&mut self, timeout: Duration) -> Result<UsedElement> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(elem) = self.pop_used()? {
                return Ok(elem);
            }
            if self.event_idx {
                self.write(self.last_used.0, self.used_event_addr(), "used_event")?;
                fence(Ordering::SeqCst);
                if let Some(elem) = self.pop_used()? {
                    return Ok(elem);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    context: self.context("waiting for used buffer"),
                });
            }
            self.wait_for_call(deadline - now)?;
        }
    }

    /// Blocks until the call eventfd fires or `timeout` passes; clears it.
    /// Returns whether it fired.
    pub fn wait_for_call(&self, timeout: Duration) -> Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.call.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
        let ret = unsafe { libc::poll(&mut pfd, 1, millis) };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::io(self.context("polling call eventfd"), err));
        }
        if ret == 0 {
            return Ok(false);
        }
        match self.call.read() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(Error::io(self.context("reading call eventfd"), e)),
        }
    }

    fn write_descriptor(&self, index: u16, segment: &Segment, flags: u16, next: u16) -> Result<()> {
        let addr = self.desc_table.unchecked_add(DESC_SIZE * u64::from(index));
        self.write(segment.addr.0, addr, "descriptor addr")?;
        self.write(segment.len, addr.unchecked_add(8), "descriptor len")?;
        self.write(flags, addr.unchecked_add(12), "descriptor flags")?;
        self.write(next, addr.unchecked_add(14), "descriptor next")
    }

    fn used_event_addr(&self) -> GuestAddress {
        self.avail_ring.unchecked_add(4 + 2 * u64::from(self.size))
    }

    fn avail_event_addr(&self) -> GuestAddress {
        self.used_ring
            .unchecked_add(4 + USED_ELEM_SIZE * u64::from(self.size))
    }

    fn write<T: vm_memory::ByteValued>(
        &self,
        val: T,
        addr: GuestAddress,
        what: &str,
    ) -> Result<()> {
        self.memory
            .mmap()
            .write_obj(val, addr)
            .map_err(|e| Error::memory(self.context(&format!("writing {what}")), e))
    }

    fn read<T: vm_memory::ByteValued>(&self, addr: GuestAddress, what: &str) -> Result<T> {
        self.memory
            .mmap()
            .read_obj(addr)
            .map_err(|e| Error::memory(self.context(&format!("reading {what}")), e))
    }

    fn load(&self, addr: GuestAddress, what: &str) -> Result<u16> {
        self.memory
            .mmap()
            .load(addr, Ordering::Acquire)
            .map_err(|e| Error::memory(self.context(&format!("loading {what}")), e))
    }

    fn context(&self, what: &str) -> String {
        format!("queue {}: {what}", self.queue_index)
    }
}

/// virtio spec `vring_need_event`: did the index move past `event` when going
/// from `old` to `new`?
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
#[path = "virtqueue_tests.rs"]
mod tests;
