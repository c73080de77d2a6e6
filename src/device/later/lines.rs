//! Where a throttled request waits: out of its virtqueue, in its volume's own line.
//!
//! A queue worker that pops a request whose volume has no tokens left keeps the
//! request's chain and its local copy here, and goes on popping: the requests of
//! other volumes behind it on the same queue are served at once. Each volume's line
//! is served in order when its buckets refill; the worker's [`WakeTimer`] fires at
//! the earliest such moment (`timer.rs`).
//!
//! A waiting request is answered whatever happens to its volume: lifting or changing
//! the limit, or detaching the volume, fires the timers at once (the control API
//! does), and a detached volume's line is served there and then (each request fails
//! as any request to a detached volume does). Only a new driver on the queue (a
//! reboot, a device reset) drops the lines unanswered: their ring is gone.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use virtio_queue::DescriptorChain;

use crate::fs::share::Share;
use crate::qos::Cost;

use super::timer::WakeTimer;
use crate::device::ring::{Mem, RingId};

/// The largest local copy a waiting request may keep: a request larger than this (a
/// SETXATTR value, a SYMLINK of a long target) is served at once and charged, so a
/// guest cannot make the daemon hold a full queue of megabyte copies.
pub const MAX_WAITING_REQUEST: usize = 8 * 1024;

/// One request waiting for its volume's tokens.
pub struct Waiting {
    pub chain: DescriptorChain<Mem>,
    /// The request's local copy, made when it was popped (served from it later, as
    /// any request is).
    pub request: Vec<u8>,
    cost: Cost,
    since: Instant,
}

struct Line {
    /// Weak: a waiting request does not hold its volume attached (a detach does not
    /// wait for the line, it serves it).
    share: Weak<Share>,
    requests: VecDeque<Waiting>,
}

impl Line {
    /// Compared by address: no reference count is touched on the request path.
    fn is_for(&self, share: &Arc<Share>) -> bool {
        std::ptr::eq(self.share.as_ptr(), Arc::as_ptr(share))
    }
}

/// One request queue's waiting lines, one per volume with requests waiting.
#[derive(Default)]
pub struct WaitRoom {
    /// The ring the waiting chains belong to.
    ring: Option<RingId>,
    lines: Vec<Line>,
    /// When the worker's timer is set to fire (None: not set, or it fired).
    armed: Option<Instant>,
    /// A volume's line was started since the lines were last looked at: its first
    /// request may be due before the timer.
    new_line: bool,
}

impl WaitRoom {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Requests waiting, over every volume.
    pub fn len(&self) -> usize {
        self.lines.iter().map(|l| l.requests.len()).sum()
    }

    /// Whether `share` has requests waiting here: a new one then waits behind them.
    pub fn has_line(&self, share: &Arc<Share>) -> bool {
        self.lines.iter().any(|l| l.is_for(share))
    }

    /// The ring the waiting chains came from (None: nothing waits).
    pub fn ring(&self) -> Option<RingId> {
        self.ring
    }

    /// Puts a request at the end of its volume's line.
    pub fn push(
        &mut self,
        share: &Arc<Share>,
        ring: RingId,
        chain: DescriptorChain<Mem>,
        request: &[u8],
        cost: Cost,
        now: Instant,
    ) {
        self.ring = Some(ring);
        share.stats.qos.throttled.fetch_add(1, Ordering::Relaxed);
        share.stats.qos.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting {
            chain,
            request: request.to_vec(),
            cost,
            since: now,
        };
        match self.lines.iter_mut().find(|l| l.is_for(share)) {
            Some(line) => line.requests.push_back(waiting),
            None => {
                self.new_line = true;
                self.lines.push(Line {
                    share: Arc::downgrade(share),
                    requests: VecDeque::from([waiting]),
                })
            }
        }
    }

    /// Whether the queue's worker must look at the lines after a drain: only when a
    /// line was started. The requests that joined an existing line wait behind its
    /// first, for which the timer is set already; looking at every drain cost the
    /// other volumes' requests a clock read and a timer system call each time.
    pub fn needs_look(&self) -> bool {
        self.new_line
    }

    /// The timer fired: it is set no more.
    pub fn timer_fired(&mut self) {
        self.armed = None;
    }

    /// Sets `timer` for the next request due `wait` after `now`, unless it is set to
    /// fire no later already (an early wake is harmless: the lines are looked at and
    /// the timer set again); None stops it.
    pub fn set_timer(&mut self, timer: &WakeTimer, now: Instant, wait: Option<Duration>) {
        self.new_line = false;
        match wait {
            Some(wait) => {
                let due = now + wait;
                if self.armed.is_none_or(|armed| due < armed) {
                    timer.arm(wait);
                    self.armed = Some(due);
                }
            }
            None => {
                if self.armed.take().is_some() {
                    timer.disarm();
                }
            }
        }
    }

    /// Moves into `ready` the requests that may go now, in order within each volume:
    /// those whose volume's buckets admit them, and every request of a volume that is
    /// detached or no longer limited. Returns how long until the next may go (None:
    /// nothing waits).
    pub fn take_ready(&mut self, now: Instant, ready: &mut Vec<Waiting>) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        self.lines.retain_mut(|line| {
            let share = line.share.upgrade().filter(|s| !s.is_revoked());
            while let Some(front) = line.requests.front() {
                if let Some(s) = &share {
                    if let Err(wait) = s.stats.qos.admit(front.cost, now) {
                        next = Some(next.map_or(wait, |n| n.min(wait)));
                        break;
                    }
                }
                let w = line.requests.pop_front().expect("front was Some");
                if let Some(s) = line.share.upgrade() {
                    s.stats.qos.waiting.fetch_sub(1, Ordering::Relaxed);
                    s.stats.qos.waited(now.saturating_duration_since(w.since));
                }
                ready.push(w);
            }
            !line.requests.is_empty()
        });
        next
    }

    /// Every waiting request, as (head descriptor, local copy), in each line's order
    /// (for the device state: they are answered by the next daemon).
    pub fn unanswered(&self) -> Vec<(u16, Vec<u8>)> {
        self.lines
            .iter()
            .flat_map(|l| l.requests.iter())
            .map(|w| (w.chain.head_index(), w.request.clone()))
            .collect()
    }

    /// Drops every waiting request unanswered (their ring belongs to a driver that is
    /// gone); returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.len();
        for line in self.lines.drain(..) {
            if let Some(s) = line.share.upgrade() {
                s.stats
                    .qos
                    .waiting
                    .fetch_sub(line.requests.len() as u64, Ordering::Relaxed);
            }
        }
        self.ring = None;
        self.armed = None;
        self.new_line = false;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GuestMmap;
    use crate::qos::{BucketConfig, RateLimit};
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::QueueT;
    use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic};

    fn limited(name: &str, per_second: u64) -> Arc<Share> {
        let s = Arc::new(Share::for_test(name, false));
        s.stats.qos.set(Some(RateLimit {
            ops: Some(BucketConfig {
                size: per_second,
                one_time_burst: 0,
                refill_time_ms: 1000,
            }),
            bandwidth: None,
        }));
        s
    }

    const ONE: Cost = Cost { ops: 1, bytes: 0 };
    const RING: RingId = RingId {
        table: 0x1000,
        generation: 0,
    };

    #[test]
    fn lines_go_in_order_as_their_volumes_refill_and_a_detached_one_goes_at_once() {
        let mem =
            GuestMemoryAtomic::new(GuestMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
        let m = mem.memory();
        let q = MockSplitQueue::new(&*m, 16);
        let a = limited("a", 10);
        let b = limited("b", 10);
        let mut room = WaitRoom::default();
        let t0 = Instant::now();
        // Both volumes' buckets are empty.
        for s in [&a, &b] {
            for _ in 0..10 {
                s.stats.qos.admit(ONE, t0).unwrap();
            }
        }
        let mut queue = q.create_queue::<virtio_queue::Queue>().unwrap();
        let mut chains = Vec::new();
        for i in 0..3u8 {
            q.build_desc_chain(&[RawDescriptor::from(Descriptor::new(
                0x8000 + 0x100 * u64::from(i),
                64,
                0,
                0,
            ))])
            .unwrap();
            chains.push(queue.pop_descriptor_chain(m.clone()).unwrap());
        }
        let mut chains = chains.into_iter();
        room.push(&a, RING, chains.next().unwrap(), b"a1", ONE, t0);
        room.push(&b, RING, chains.next().unwrap(), b"b1", ONE, t0);
        room.push(&a, RING, chains.next().unwrap(), b"a2", ONE, t0);
        assert!(room.has_line(&a) && room.has_line(&b));
        assert_eq!(a.stats.qos.waiting.load(Ordering::Relaxed), 2);
        let mut ready = Vec::new();
        // Nothing refilled yet: the next token is 100 ms away.
        assert_eq!(
            room.take_ready(t0, &mut ready),
            Some(Duration::from_millis(100))
        );
        assert!(ready.is_empty());
        // One token each after 100 ms: a1 and b1 go, a2 waits.
        let next = room.take_ready(t0 + Duration::from_millis(100), &mut ready);
        let names: Vec<&[u8]> = ready.iter().map(|w| &w.request[..]).collect();
        assert_eq!(names, [&b"a1"[..], b"b1"]);
        assert_eq!(next, Some(Duration::from_millis(100)));
        assert!(!room.has_line(&b));
        // a is detached: its line goes at once, without tokens.
        a.revoke();
        ready.clear();
        assert_eq!(
            room.take_ready(t0 + Duration::from_millis(100), &mut ready),
            None
        );
        assert_eq!(ready.len(), 1);
        assert!(room.is_empty());
        assert_eq!(a.stats.qos.waiting.load(Ordering::Relaxed), 0);
        assert_eq!(a.stats.qos.throttled.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_new_driver_drops_the_lines_and_a_lifted_limit_lets_them_go() {
        let mem =
            GuestMemoryAtomic::new(GuestMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
        let m = mem.memory();
        let q = MockSplitQueue::new(&*m, 16);
        let mut queue = q.create_queue::<virtio_queue::Queue>().unwrap();
        let a = limited("a", 1);
        let t0 = Instant::now();
        a.stats.qos.admit(ONE, t0).unwrap();
        let mut room = WaitRoom::default();
        for i in 0..2u64 {
            q.build_desc_chain(&[RawDescriptor::from(Descriptor::new(
                0x8000 + i * 64,
                64,
                0,
                0,
            ))])
            .unwrap();
            let c = queue.pop_descriptor_chain(m.clone()).unwrap();
            room.push(&a, RING, c, b"r", ONE, t0);
        }
        assert_eq!(room.ring(), Some(RING));
        assert_eq!(room.clear(), 2);
        assert_eq!(a.stats.qos.waiting.load(Ordering::Relaxed), 0);
        assert_eq!(room.ring(), None);

        let c = {
            q.build_desc_chain(&[RawDescriptor::from(Descriptor::new(0x9000, 64, 0, 0))])
                .unwrap();
            queue.pop_descriptor_chain(m.clone()).unwrap()
        };
        room.push(&a, RING, c, b"r", ONE, t0);
        a.stats.qos.set(None);
        let mut ready = Vec::new();
        assert_eq!(room.take_ready(t0, &mut ready), None);
        assert_eq!(ready.len(), 1);
    }

    #[test]
    fn the_timer_is_set_again_only_for_an_earlier_request_and_a_new_line_asks_for_a_look() {
        let t = WakeTimer::new().unwrap();
        let mut room = WaitRoom::default();
        let now = Instant::now();
        let ms = Duration::from_millis;
        room.set_timer(&t, now, Some(ms(100)));
        assert_eq!(room.armed, Some(now + ms(100)));
        room.set_timer(&t, now, Some(ms(200)));
        assert_eq!(room.armed, Some(now + ms(100)), "a later request keeps it");
        room.set_timer(&t, now, Some(ms(50)));
        assert_eq!(room.armed, Some(now + ms(50)));
        room.timer_fired();
        room.set_timer(&t, now, Some(ms(200)));
        assert_eq!(room.armed, Some(now + ms(200)), "set anew once it fired");
        room.set_timer(&t, now, None);
        assert_eq!(room.armed, None);

        let mem =
            GuestMemoryAtomic::new(GuestMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
        let m = mem.memory();
        let q = MockSplitQueue::new(&*m, 16);
        let mut queue = q.create_queue::<virtio_queue::Queue>().unwrap();
        let mut pop = || {
            q.build_desc_chain(&[RawDescriptor::from(Descriptor::new(0x8000, 64, 0, 0))])
                .unwrap();
            queue.pop_descriptor_chain(m.clone()).unwrap()
        };
        let a = limited("a", 1);
        assert!(!room.needs_look());
        room.push(&a, RING, pop(), b"1", ONE, now);
        assert!(room.needs_look(), "a new line");
        room.set_timer(&t, now, Some(ms(1000)));
        assert!(!room.needs_look());
        room.push(&a, RING, pop(), b"2", ONE, now);
        assert!(!room.needs_look(), "behind the first of its line");
    }
}
