//! A ring as the transport answers on it: which ring a chain came from, whether it
//! runs, is stopped or set up anew by a new driver, or broke the ring's rules; and
//! the completions returned to it, one interrupt per batch.
//!
//! Every write to a ring and its buffers happens under the vring's lock, after
//! [`QueueHealth::answer_to`] said the ring runs and is still the one the chain came
//! from (see `queue.rs` for why).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use log::warn;
use vhost_user_backend::VringState;
use virtio_queue::QueueT;
use vm_memory::GuestMemoryLoadGuard;

use super::inflight::InFlight;
use super::memory::{GuestMem, GuestMmap, Vring};
use super::poll::Poller;
use super::split_ring::SplitRing;

/// Descriptors per queue we accept; QEMU defaults to 128, cloud-hypervisor to 1024.
pub const MAX_QUEUE_SIZE: usize = 1024;

/// Guest memory as a popped chain holds it.
pub(crate) type Mem = GuestMemoryLoadGuard<GuestMmap>;

use super::memory::Locked;

/// One queue's counters, read by the control API.
#[derive(Debug)]
pub struct QueueCounters {
    /// Requests served.
    pub served: AtomicU64,
    /// Requests its worker is serving now, 0 or 1: a queue has one worker thread (a
    /// lock wait handed to a thread of its own is not one).
    pub in_flight: AtomicU64,
    /// The used index from which completions returned through [`SplitRing`] have not
    /// been looked at for an interrupt yet (none: [`NONE_UNSIGNALLED`]). Kept across
    /// drains, so that one that ended early (a broken ring) leaves them to the next
    /// look, as virtio-queue's own count of unsignalled completions does.
    pub unsignalled_from: AtomicU32,
    /// Whether this process looked at the ring for an interrupt yet. The first look
    /// interrupts whatever the guest asked for, as virtio-queue's does: completions a
    /// killed process returned without the interrupt lie before the ones this one
    /// counts from, and the guest's `used_event` may point at them.
    pub looked_once: AtomicBool,
}

/// [`QueueCounters::unsignalled_from`] when every completion was looked at.
const NONE_UNSIGNALLED: u32 = u32::MAX;

impl Default for QueueCounters {
    fn default() -> Self {
        QueueCounters {
            served: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            unsignalled_from: AtomicU32::new(NONE_UNSIGNALLED),
            looked_once: AtomicBool::new(false),
        }
    }
}

/// One queue's ring as its worker and the requests answered later reach it.
#[derive(Clone, Copy)]
pub struct RingRef<'a> {
    pub vring: &'a Vring,
    /// The queue's index on the device (0: hiprio).
    pub index: usize,
    pub event_idx: bool,
    pub counters: &'a QueueCounters,
    /// The queue's health, shared with the lock waits on threads of their own.
    pub health: &'a Arc<QueueHealth>,
    /// Its requests taken and not answered, under a keeper.
    pub inflight: InFlight,
    /// Whether and how long it watches the ring after it ran dry (`poll.rs`).
    pub poller: &'a Poller,
}

/// The state a queue keeps across kicks.
#[derive(Default)]
pub struct QueueHealth {
    /// The frontend broke the ring's rules: nothing more is served on this queue
    /// until the frontend sets it up again.
    stopped: AtomicBool,
    /// (descriptor table address, next avail index) when the queue was last drained:
    /// anything else at the next kick means the frontend set the queue up again.
    last_seen: Mutex<Option<(u64, u16)>>,
    /// Bumped when the queue's ring is gone for good (a new driver set it up anew, a
    /// device reset): a chain popped before belongs to no ring any more.
    generation: AtomicU64,
}

fn position(state: &VringState<GuestMem>) -> (u64, u16) {
    let q = state.get_queue();
    (q.desc_table(), q.next_avail())
}

/// The ring a popped chain came from: it may be answered only on that ring.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct RingId {
    /// The descriptor table's guest address.
    pub(crate) table: u64,
    /// [`QueueHealth`]'s generation when the chain was popped.
    pub(crate) generation: u64,
}

/// Whether a chain popped earlier may be answered now.
#[derive(Debug, Eq, PartialEq)]
pub enum Answer {
    /// Its ring runs: answer it now, under the same lock.
    Now,
    /// Its ring is stopped (a paused VM): keep the answer until it runs again.
    Later,
    /// Its ring is gone (a new driver, a device reset): drop the answer.
    Never,
}

/// What the first look at a kicked queue found.
#[derive(Debug, Eq, PartialEq)]
pub enum QueueStart {
    /// Serving as before.
    Same,
    /// The frontend set up the queue again and a new driver starts it from index 0:
    /// a guest reboot or a driver reset.
    NewDriver,
}

impl QueueHealth {
    /// Compares the queue with how it was left, clears a stop if the frontend set it
    /// up again, and tells whether a new driver started it (then the chains popped
    /// from the old ring are answered no more).
    pub fn check_restart(&self, state: &VringState<GuestMem>) -> QueueStart {
        match self.set_up_anew(state) {
            None => QueueStart::Same,
            Some(new_driver) => {
                self.stopped.store(false, Ordering::Release);
                if new_driver {
                    self.ring_gone();
                    QueueStart::NewDriver
                } else {
                    QueueStart::Same
                }
            }
        }
    }

    /// Whether the frontend set the queue up again since the last drain (Some), and
    /// if so whether from index 0, as a new driver does (Some(true)).
    fn set_up_anew(&self, state: &VringState<GuestMem>) -> Option<bool> {
        let now = position(state);
        let last = *self.last_seen.lock().unwrap();
        match last {
            Some(seen) if seen != now => Some(now.1 == 0),
            _ => None,
        }
    }

    /// The queue's ring is gone (a new driver, a device reset): nothing popped from
    /// it is answered any more.
    pub fn ring_gone(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The ring a chain popped now comes from.
    pub fn ring(&self, state: &VringState<GuestMem>) -> RingId {
        RingId {
            table: state.get_queue().desc_table(),
            generation: self.generation.load(Ordering::Acquire),
        }
    }

    /// Whether a chain popped from `ring` may be answered now. Called under the
    /// vring's lock, which the answer then keeps until it is in the used ring: the
    /// frontend cannot stop the ring in between.
    pub fn answer_to(&self, state: &VringState<GuestMem>, ring: RingId) -> Answer {
        let q = state.get_queue();
        if self.generation.load(Ordering::Acquire) != ring.generation
            || q.desc_table() != ring.table
            || self.is_stopped()
        {
            return Answer::Never;
        }
        if !q.ready() || !state.is_enabled() {
            // GET_VRING_BASE or SET_VRING_ENABLE 0: a paused VM, or the switch-over
            // of a live migration (then the daemon exits before it runs again).
            return Answer::Later;
        }
        if self.set_up_anew(state) == Some(true) {
            // A new driver on the same addresses, not kicked yet (the kick would
            // bump the generation): not the ring the chain came from.
            return Answer::Never;
        }
        Answer::Now
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Forgets the rings (a new frontend sets up its own).
    pub fn reset(&self) {
        self.stopped.store(false, Ordering::Release);
        *self.last_seen.lock().unwrap() = None;
    }

    /// Remembers where the queue stands after a drain. The drain held the vring's
    /// lock since `check_restart`, so the frontend cannot have set the queue up anew
    /// meanwhile (it could before the lock was held across the drain: then a rebooted
    /// guest's first request was served in the old session, a CI flake in
    /// a_queue_restarted_by_a_new_driver_ends_the_session).
    pub(crate) fn remember(&self, state: &VringState<GuestMem>) {
        *self.last_seen.lock().unwrap() = Some(position(state));
    }

    /// Stops the queue where its ring broke (the avail index, the rings' memory).
    /// The position is remembered too: a drain can serve requests and then meet the
    /// broken ring in its re-check, and the kick that follows must not read that as a
    /// new setup (it did, and the queue was stopped and logged twice).
    pub(crate) fn stop(&self, state: &VringState<GuestMem>, index: usize, why: &str) {
        self.remember(state);
        self.stop_after_chain(index, why);
    }

    /// Stops the queue after a broken chain (its descriptors or buffers). The chain
    /// was popped, so the ring has moved on from the last position remembered: the
    /// next kick serves again, and the broken chain costs the guest that request only.
    pub(crate) fn stop_after_chain(&self, index: usize, why: &str) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            warn!(
                "queue {index}: stopped: {why}; it serves again once the frontend sets it up anew"
            );
        }
    }
}

/// Completions put in the used ring and not yet signalled to the guest.
///
/// One interrupt per batch, not per request: each eventfd write wakes the frontend's
/// thread, and on a loaded host that context switch is the largest cost of a small
/// request. The batch is bounded in requests and in bytes, so large reads are not
/// held back behind each other.
pub(crate) struct Completions<'r, 'm> {
    index: usize,
    event_idx: bool,
    inflight: InFlight,
    unsignalled: usize,
    bytes: usize,
    /// The rings mapped for the drain (None: through virtio-queue's accessors), and
    /// where their completions not looked at yet start.
    split: Option<&'r SplitRing<'m>>,
    unsignalled_from: &'r AtomicU32,
    looked_once: &'r AtomicBool,
}

/// Completions returned before the guest is interrupted while more are pending.
const SIGNAL_BATCH: usize = 8;
/// Reply bytes returned before the guest is interrupted while more are pending.
const SIGNAL_BATCH_BYTES: usize = 256 * 1024;

impl<'r, 'm> Completions<'r, 'm> {
    pub(crate) fn new(ring: &RingRef<'r>) -> Self {
        Completions {
            index: ring.index,
            event_idx: ring.event_idx,
            inflight: ring.inflight,
            unsignalled: 0,
            bytes: 0,
            split: None,
            unsignalled_from: &ring.counters.unsignalled_from,
            looked_once: &ring.counters.looked_once,
        }
    }

    /// Completions written through the drain's mapped rings.
    pub(crate) fn on(ring: &RingRef<'r>, split: Option<&'r SplitRing<'m>>) -> Self {
        Completions {
            split,
            ..Completions::new(ring)
        }
    }

    /// Returns the chain `head` with a reply of `len` bytes.
    pub(crate) fn add(&mut self, state: &mut Locked, head: u16, len: u32) -> io::Result<()> {
        match self.split {
            Some(split) => {
                let next = state.get_queue().next_used();
                let _ = self.unsignalled_from.compare_exchange(
                    NONE_UNSIGNALLED,
                    u32::from(next),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                if !split.add_used(state, head, len) {
                    return Err(io::Error::other(format!(
                        "queue {}: descriptor {head} is not in the queue, or the used ring cannot be written",
                        self.index
                    )));
                }
            }
            None => state.add_used(head, len).map_err(queue_err(self.index))?,
        }
        self.inflight.answered(head, state.get_queue().next_used());
        self.unsignalled += 1;
        self.bytes += len as usize;
        if self.unsignalled == SIGNAL_BATCH || self.bytes >= SIGNAL_BATCH_BYTES {
            self.flush(state)?;
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self, state: &mut Locked) -> io::Result<()> {
        if self.unsignalled > 0 {
            let from = self
                .unsignalled_from
                .swap(NONE_UNSIGNALLED, Ordering::Relaxed);
            match (self.split, u16::try_from(from)) {
                (Some(split), Ok(from)) => {
                    let first = !self.looked_once.load(Ordering::Relaxed);
                    if first {
                        self.looked_once.store(true, Ordering::Relaxed);
                    }
                    if split.needs_notification(state.get_queue().next_used(), from) || first {
                        state.signal_used_queue()?;
                    }
                }
                _ => notify(state, self.event_idx, self.index)?,
            }
            self.unsignalled = 0;
            self.bytes = 0;
        }
        Ok(())
    }
}

/// Interrupts the guest for the used ring, unless EVENT_IDX says it need not be.
pub(crate) fn notify(state: &mut Locked, event_idx: bool, index: usize) -> io::Result<()> {
    if !event_idx || state.needs_notification().map_err(queue_err(index))? {
        state.signal_used_queue()?;
    }
    Ok(())
}

pub(crate) fn queue_err(index: usize) -> impl Fn(virtio_queue::Error) -> io::Error {
    move |e| io::Error::other(format!("queue {index}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::memory::test_vring as vring;
    use vhost_user_backend::VringT;

    #[test]
    fn a_queue_stopped_after_serving_stays_stopped_until_set_up_anew() {
        let vring = vring();
        let health = QueueHealth::default();
        vring.set_queue_next_avail(1);
        health.remember(&vring.get_ref());
        // A drain serves one more request, then finds the ring broken.
        vring.set_queue_next_avail(2);
        health.stop(&vring.get_ref(), 1, "test");
        assert_eq!(health.check_restart(&vring.get_ref()), QueueStart::Same);
        assert!(health.is_stopped(), "the next kick keeps it stopped");
        // The frontend sets the queue up again: it serves again.
        vring.set_queue_info(0x4000, 0x5000, 0x6000).unwrap();
        vring.set_queue_next_avail(0);
        assert_eq!(
            health.check_restart(&vring.get_ref()),
            QueueStart::NewDriver
        );
        assert!(!health.is_stopped());
    }

    #[test]
    fn a_chain_is_answered_only_while_its_own_ring_runs() {
        let vring = vring();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        vring.set_queue_next_avail(5);
        let health = QueueHealth::default();
        // A drain popped a chain from the ring at 0 and remembered where it ended.
        health.remember(&vring.get_ref());
        let ring = health.ring(&vring.get_ref());
        let answer = || health.answer_to(&vring.get_ref(), ring);
        assert_eq!(answer(), Answer::Now);
        // Stopped by GET_VRING_BASE (or disabled): kept for later.
        vring.set_queue_ready(false);
        assert_eq!(answer(), Answer::Later);
        vring.set_queue_ready(true);
        vring.set_enabled(false);
        assert_eq!(answer(), Answer::Later);
        // Started again on the same rings where it stopped: answered.
        vring.set_enabled(true);
        assert_eq!(answer(), Answer::Now);
        // A new driver on the same addresses from index 0, before its first kick:
        // not the chain's ring.
        vring.set_queue_next_avail(0);
        assert_eq!(answer(), Answer::Never);
        // Its first kick sees the new driver; the old ring's chains stay unanswered
        // even once the new ring has moved on.
        assert_eq!(
            health.check_restart(&vring.get_ref()),
            QueueStart::NewDriver
        );
        health.remember(&vring.get_ref());
        vring.set_queue_next_avail(5);
        health.remember(&vring.get_ref());
        assert_eq!(answer(), Answer::Never);
        // A chain of the new ring is answered there, but not once the ring is set
        // up on other addresses, nor after a device reset.
        let ring = health.ring(&vring.get_ref());
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Now);
        vring.set_queue_info(0x4000, 0x5000, 0x6000).unwrap();
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Never);
        vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Now);
        health.ring_gone();
        assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Never);
    }

    #[test]
    fn the_first_look_of_a_process_interrupts_whatever_used_event_says() {
        use std::fs::File;
        use std::os::fd::{FromRawFd, IntoRawFd};
        use vm_memory::{Bytes, GuestAddress};
        use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

        let vring = vring();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        // SAFETY: a fresh fd of our own, handed over whole.
        let file = unsafe { File::from_raw_fd(call.try_clone().unwrap().into_raw_fd()) };
        vring.set_call(Some(file));
        let guest = GuestMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let (counters, health) = (QueueCounters::default(), Arc::new(QueueHealth::default()));
        let poller = Poller::new(std::time::Duration::ZERO);
        let ring = RingRef {
            vring: &vring,
            index: 1,
            event_idx: true,
            counters: &counters,
            health: &health,
            inflight: InFlight::default(),
            poller: &poller,
        };
        let mut state = vring.get_mut();
        state.get_queue_mut().set_event_idx(true);
        // A killed process returned 0..5 and died before their interrupt; the guest
        // still waits for one from 0 on (used_event 0).
        state.get_queue_mut().set_next_used(5);
        let split = SplitRing::map(&guest, &state).expect("rings in one region");
        let mut done = Completions::on(&ring, Some(&split));
        done.add(&mut state, 1, 0).unwrap();
        done.flush(&mut state).unwrap();
        assert_eq!(call.read().unwrap(), 1, "the first look interrupts");
        // From then on used_event decides: 0 lies behind, so no interrupt...
        done.add(&mut state, 2, 0).unwrap();
        done.flush(&mut state).unwrap();
        assert!(call.read().is_err(), "used_event behind: no interrupt");
        // ...until the guest asks for the next one.
        guest
            .write_obj(7u16, GuestAddress(0x1000 + 4 + 2 * 256))
            .unwrap();
        done.add(&mut state, 3, 0).unwrap();
        done.flush(&mut state).unwrap();
        assert_eq!(call.read().unwrap(), 1);
    }
}
