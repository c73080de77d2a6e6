//! A queue's health across kicks: the ring it serves, stopped or running, set up
//! anew by a new driver, broken.

use super::*;

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

pub(super) fn position(state: &VringState<GuestMem>) -> (u64, u16) {
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
    pub(super) fn set_up_anew(&self, state: &VringState<GuestMem>) -> Option<bool> {
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
    pub(super) fn remember(&self, state: &VringState<GuestMem>) {
        *self.last_seen.lock().unwrap() = Some(position(state));
    }

    /// Stops the queue where its ring broke (the avail index, the rings' memory).
    /// The position is remembered too: a drain can serve requests and then meet the
    /// broken ring in its re-check, and the kick that follows must not read that as a
    /// new setup (it did, and the queue was stopped and logged twice).
    pub(super) fn stop(&self, state: &VringState<GuestMem>, index: usize, why: &str) {
        self.remember(state);
        self.stop_after_chain(index, why);
    }

    /// Stops the queue after a broken chain (its descriptors or buffers). The chain
    /// was popped, so the ring has moved on from the last position remembered: the
    /// next kick serves again, and the broken chain costs the guest that request only.
    pub(super) fn stop_after_chain(&self, index: usize, why: &str) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            warn!(
                "queue {index}: stopped: {why}; it serves again once the frontend sets it up anew"
            );
        }
    }
}
