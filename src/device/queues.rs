//! The device's queues: one struct per virtqueue, owning everything the backend
//! keeps of it between kicks (vhost-user-backend keeps the ring itself, in the
//! worker's `Vring`): its counters, its health, its throttled requests and its
//! worker's wake timer, its requests in flight under a keeper, its poller, and
//! whether a killed process left it requests to answer.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::inflight::InFlight;
use super::later::{Later, Parked, WaitRoom, WakeTimer};
use super::poll::Poller;
use super::ring::{QueueCounters, QueueHealth, RingRef};
use super::{queue::QueueRef, Vring};
use crate::region::Region;

/// The hiprio queue's index: it is never throttled, and its worker is request
/// queue 1's.
pub const HIPRIO_QUEUE: usize = 0;

/// One virtqueue of the device.
pub struct DeviceQueue {
    pub index: usize,
    /// Kicked at least once since the frontend connected.
    started: AtomicBool,
    /// Requests served and being served (shared with the control API's view).
    pub counters: Arc<QueueCounters>,
    /// Running, stopped, set up anew (shared with the lock waits on threads).
    pub health: Arc<QueueHealth>,
    /// Its throttled requests, and the wake timer of the worker that serves it
    /// (None for the hiprio queue: never throttled).
    throttling: Option<(Mutex<WaitRoom>, WakeTimer)>,
    /// Its requests taken and not answered, in the session region (a keeper's).
    pub inflight: InFlight,
    /// `--poll-us`: the ring watched for a while after it ran dry.
    pub poller: Poller,
    /// A serving process killed under this session left it requests unanswered.
    recovering: AtomicBool,
}

impl DeviceQueue {
    fn new(index: usize, poll: Duration, region: Option<&'static Region>) -> io::Result<Self> {
        let throttling = if index == HIPRIO_QUEUE {
            None
        } else {
            Some((Mutex::default(), WakeTimer::new()?))
        };
        Ok(DeviceQueue {
            index,
            started: AtomicBool::new(false),
            counters: Arc::default(),
            health: Arc::default(),
            throttling,
            inflight: InFlight::of(region, index),
            poller: Poller::new(poll),
            recovering: AtomicBool::new(false),
        })
    }

    /// Marks it kicked; true the first time since the frontend connected.
    pub fn start(&self) -> bool {
        !self.started.swap(true, Ordering::Relaxed)
    }

    /// Its throttled requests (None: the hiprio queue).
    pub fn room(&self) -> Option<&Mutex<WaitRoom>> {
        self.throttling.as_ref().map(|(room, _)| room)
    }

    /// Its worker's wake timer (None: the hiprio queue).
    pub fn timer(&self) -> Option<&WakeTimer> {
        self.throttling.as_ref().map(|(_, timer)| timer)
    }

    /// The rings it gives the drain, on `vring` (the worker's).
    pub fn queue_ref<'a>(
        &'a self,
        vring: &'a Vring,
        event_idx: bool,
        parked: &'a Arc<Parked>,
    ) -> QueueRef<'a> {
        QueueRef {
            ring: RingRef {
                vring,
                index: self.index,
                event_idx,
                counters: &self.counters,
                health: &self.health,
                inflight: self.inflight,
                poller: &self.poller,
            },
            later: Later {
                room: self.room(),
                timer: self.timer(),
                parked,
            },
        }
    }

    /// Whether a killed process left it requests to answer (marked at a takeover).
    pub fn set_recovering(&self, on: bool) {
        self.recovering.store(on, Ordering::Release);
    }

    /// Takes the mark: true once after a takeover.
    pub fn take_recovering(&self) -> bool {
        self.recovering.swap(false, Ordering::AcqRel)
    }

    /// The frontend went away: it starts afresh with the next one.
    pub fn connection_ended(&self) {
        self.started.store(false, Ordering::Relaxed);
        self.health.reset();
    }

    /// The session's rings are gone: its throttled requests are dropped unanswered.
    pub fn drop_waiting(&self) {
        if let Some(room) = self.room() {
            room.lock().unwrap().clear();
        }
        self.health.ring_gone();
    }

    /// A new driver set it up from index 0 (a reboot): what it held belongs to the
    /// old ring.
    pub fn new_driver(&self) {
        if let Some(room) = self.room() {
            room.lock().unwrap().clear();
        }
        self.inflight.clear();
        self.set_recovering(false);
    }
}

/// Every queue of the device, by index (0: hiprio, 1..: request queues).
pub struct Queues(Vec<DeviceQueue>);

impl Queues {
    /// The hiprio queue and `request_queues` request queues, each recording its
    /// requests in flight in `region` under a keeper; fails only when a wake timer
    /// cannot be made (out of fds).
    pub fn new(
        request_queues: usize,
        poll: Duration,
        region: Option<&'static Region>,
    ) -> io::Result<Self> {
        (0..=request_queues)
            .map(|i| DeviceQueue::new(i, poll, region))
            .collect::<io::Result<_>>()
            .map(Queues)
    }

    pub fn get(&self, index: usize) -> Option<&DeviceQueue> {
        self.0.get(index)
    }

    pub fn iter(&self) -> impl Iterator<Item = &DeviceQueue> {
        self.0.iter()
    }

    /// Every worker looks at its waiting requests in `after` (now: a limit changed
    /// or a volume was detached).
    pub fn wake_all(&self, after: Duration) {
        for timer in self.iter().filter_map(DeviceQueue::timer) {
            timer.arm(after);
        }
    }

    /// Each queue's throttled requests, by queue index (for a saved device state).
    pub fn rooms(&self) -> impl Iterator<Item = (u16, &Mutex<WaitRoom>)> {
        self.iter()
            .filter_map(|q| Some((q.index as u16, q.room()?)))
    }
}

impl std::ops::Index<usize> for Queues {
    type Output = DeviceQueue;

    fn index(&self, index: usize) -> &DeviceQueue {
        &self.0[index]
    }
}

/// Worker thread masks: thread 0 serves the hiprio queue and request queue 1;
/// thread i serves request queue i+1.
pub fn queue_masks(num_request_queues: usize) -> Vec<u64> {
    let mut map = vec![(1u64 << HIPRIO_QUEUE) | (1 << 1)];
    map.extend((2..=num_request_queues).map(|q| 1u64 << q));
    map
}

/// The device queue index of the `event`-th queue of worker `thread`.
/// Runs on every queue kick, so it computes the layout of [`queue_masks`] instead
/// of building it.
pub fn global_queue_index(num_request_queues: usize, thread: usize, event: u16) -> Option<usize> {
    let event = event as usize;
    match thread {
        0 if event <= 1 => Some(event),
        t if t >= 1 && t < num_request_queues && event == 0 => Some(t + 1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_map_to_device_queues() {
        assert_eq!(queue_masks(1), vec![0b11]);
        assert_eq!(queue_masks(3), vec![0b11, 0b100, 0b1000]);
        assert_eq!(global_queue_index(3, 0, 0), Some(0));
        assert_eq!(global_queue_index(3, 0, 1), Some(1));
        assert_eq!(global_queue_index(3, 1, 0), Some(2));
        assert_eq!(global_queue_index(3, 2, 0), Some(3));
        assert_eq!(global_queue_index(3, 2, 1), None);
        assert_eq!(global_queue_index(3, 3, 0), None);
        // The computed mapping agrees with the masks given to vhost-user-backend.
        for n in 1..=8 {
            for (t, mask) in queue_masks(n).iter().enumerate() {
                let from_mask: Vec<usize> = (0..64).filter(|b| mask & (1u64 << b) != 0).collect();
                let computed: Vec<usize> =
                    (0..4).filter_map(|e| global_queue_index(n, t, e)).collect();
                assert_eq!(from_mask, computed, "{n} queues, thread {t}");
            }
        }
    }
}
