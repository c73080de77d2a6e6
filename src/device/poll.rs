//! Adaptive polling (`--poll-us`): after a drain runs its ring dry, the worker
//! watches the avail index for a short window before it sleeps on the kick
//! eventfd, with the guest's notifications still off, but only while requests
//! keep coming: the drain's first request came within the window of the ring
//! running dry, or the drain found a second one before it slept (in the same pass
//! or by the re-check after notifications were re-enabled). A request that comes
//! during the window is served without the guest's kick (a VM exit in a real VM)
//! and without the worker's wake-up; one that comes after it costs what it costs
//! without polling, and the next drain does not poll unless it finds two.
//!
//! An idle queue never polls (no drain, no window), and a queue whose requests
//! come one at a time further apart than the window polls at most once per
//! request, then stops.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One queue's polling: the window, and when its ring last ran dry.
#[derive(Debug)]
pub struct Poller {
    window_ns: u64,
    /// When the poller was made: every time it is given comes after it (a drain
    /// runs on a made poller), so none is cut to 0.
    epoch: Instant,
    /// Nanoseconds since `epoch` when the ring last ran dry (0: never).
    last_dry_ns: AtomicU64,
}

impl Default for Poller {
    /// Never polls.
    fn default() -> Poller {
        Poller::new(Duration::ZERO)
    }
}

impl Poller {
    pub fn new(window: Duration) -> Poller {
        Poller {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            epoch: Instant::now(),
            last_dry_ns: AtomicU64::new(0),
        }
    }

    /// `at` as nanoseconds since `epoch`, at least 1 (0 means never).
    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    pub fn is_on(&self) -> bool {
        self.window_ns > 0
    }

    /// At a drain's start (`now`): whether this drain polls, that is, whether
    /// this request came within the window of the ring running dry.
    pub fn keeps_coming(&self, now: Instant) -> bool {
        let dry = self.last_dry_ns.load(Ordering::Relaxed);
        self.is_on() && dry != 0 && self.ns(now).saturating_sub(dry) <= self.window_ns
    }

    /// The ring ran dry `at` (a recent clock: the last request's end). One worker
    /// per queue: a plain store.
    pub fn ran_dry(&self, at: Instant) {
        if self.is_on() {
            self.last_dry_ns.store(self.ns(at), Ordering::Relaxed);
        }
    }

    /// Watches `pending` until it is true (Ok(true)) or the window since the ring
    /// ran dry has passed (Ok(false)). An error of `pending` ends the watch.
    pub fn watch<E>(&self, mut pending: impl FnMut() -> Result<bool, E>) -> Result<bool, E> {
        let dry = self.last_dry_ns.load(Ordering::Relaxed);
        loop {
            if pending()? {
                return Ok(true);
            }
            if self.ns(Instant::now()).saturating_sub(dry) > self.window_ns {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_never_polls() {
        let p = Poller::default();
        p.ran_dry(Instant::now());
        assert!(!p.keeps_coming(Instant::now()));
    }

    #[test]
    fn a_request_within_the_window_polls_and_one_after_it_does_not() {
        let p = Poller::new(Duration::from_millis(200));
        assert!(
            !p.keeps_coming(Instant::now()),
            "never dry yet: the first drain does not poll"
        );
        p.ran_dry(Instant::now());
        assert!(p.keeps_coming(Instant::now()));
        let p = Poller::new(Duration::from_micros(1));
        p.ran_dry(Instant::now());
        std::thread::sleep(Duration::from_millis(2));
        assert!(!p.keeps_coming(Instant::now()), "came after the window");
    }

    #[test]
    fn a_dry_time_read_before_the_first_drain_counts_from_the_poller_not_from_zero() {
        // The window's clock starts when the poller is made: a dry time read after
        // that (the first drain's last request's end) keeps its age. An epoch set
        // lazily at the first use came after it and read it as 0, so a drain long
        // after the ring ran dry still polled.
        let p = Poller::new(Duration::from_millis(1));
        let dry = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        p.ran_dry(dry);
        assert!(!p.keeps_coming(Instant::now()), "5 ms after a 1 ms window");
    }

    #[test]
    fn the_watch_ends_at_a_request_or_at_the_window() {
        let p = Poller::new(Duration::from_millis(5));
        p.ran_dry(Instant::now());
        let mut n = 0;
        assert_eq!(
            p.watch(|| -> Result<bool, ()> {
                n += 1;
                Ok(n == 3)
            }),
            Ok(true)
        );
        assert_eq!(p.watch(|| -> Result<bool, ()> { Ok(false) }), Ok(false));
        assert_eq!(
            p.watch(|| -> Result<bool, &str> { Err("broken") }),
            Err("broken")
        );
    }
}
