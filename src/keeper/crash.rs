//! A serving process that dies: what the keeper makes of it. It ended cleanly (exit
//! status 0) and the keeper ends with it; or it crashed (killed by a signal, a
//! panic, the OOM killer, or in namespace mode a supervisor that reports its child's
//! death with status 1). A crash while the keeper waits for a frontend (none has
//! this process's session) is recovered: a new serving process is started in its
//! place; a crash under a frontend's session is recovered by a new process that
//! takes over the same rings and the guest's session from the session region
//! (`process.rs`, `recovery/`). A crash loop is not: [`CRASH_LOOP`] crashes within
//! [`CRASH_WINDOW`] end the daemon.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// So many crashes ...
pub const CRASH_LOOP: usize = 3;
/// ... within this long are a crash loop.
pub const CRASH_WINDOW: Duration = Duration::from_secs(10);

/// How a serving process ended.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Ending {
    Exited(i32),
    Killed(Signal),
}

impl Ending {
    /// Anything but a clean exit.
    pub fn is_crash(self) -> bool {
        self != Ending::Exited(0)
    }
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ending::Exited(code) => write!(f, "exited with status {code}"),
            Ending::Killed(sig) => write!(f, "was killed by {sig}"),
        }
    }
}

/// The recent crashes, to tell a crash loop.
#[derive(Debug, Default)]
pub struct Crashes {
    recent: VecDeque<Instant>,
    total: u64,
}

impl Crashes {
    /// Records a crash at `now`; true when it makes a crash loop.
    pub fn record(&mut self, now: Instant) -> bool {
        self.total += 1;
        self.recent.push_back(now);
        while self
            .recent
            .front()
            .is_some_and(|&t| now.duration_since(t) >= CRASH_WINDOW)
        {
            self.recent.pop_front();
        }
        self.recent.len() >= CRASH_LOOP
    }

    /// Crashes within the window, the last one included.
    pub fn recent(&self) -> usize {
        self.recent.len()
    }

    /// Crashes since the daemon started.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_crashes_within_ten_seconds_are_a_loop() {
        let t = Instant::now();
        let mut c = Crashes::default();
        assert!(!c.record(t));
        assert!(!c.record(t + Duration::from_secs(4)));
        assert!(c.record(t + Duration::from_secs(9)));
        assert_eq!((c.recent(), c.total()), (3, 3));
    }

    #[test]
    fn crashes_spread_out_are_not() {
        let t = Instant::now();
        let mut c = Crashes::default();
        for i in 0..10 {
            assert!(!c.record(t + Duration::from_secs(5 * i)), "crash {i}");
        }
        assert_eq!((c.recent(), c.total()), (2, 10));
        // Exactly ten seconds apart: the first has left the window.
        let mut c = Crashes::default();
        assert!(!c.record(t));
        assert!(!c.record(t + Duration::from_secs(5)));
        assert!(!c.record(t + CRASH_WINDOW));
    }

    #[test]
    fn only_a_clean_exit_is_not_a_crash() {
        assert!(!Ending::Exited(0).is_crash());
        assert!(Ending::Exited(1).is_crash());
        assert!(Ending::Killed(Signal::SIGKILL).is_crash());
        assert_eq!(
            Ending::Killed(Signal::SIGKILL).to_string(),
            "was killed by SIGKILL"
        );
    }
}
