//! A serving process that dies: what the keeper makes of it. It ended cleanly (exit
//! status 0) and the keeper ends with it; or it crashed (killed by a signal, a
//! panic, the OOM killer, or in namespace mode a supervisor that reports its child's
//! death with status 1). A crash while the keeper waits for a frontend (none has
//! this process's session) is recovered: a new serving process is started in its
//! place; a crash under a frontend's session is recovered by a new process that
//! takes over the same rings and the guest's session from the session region
//! (`takeover.rs`, `src/region/`). A crash loop is not: [`CRASH_LOOP`] crashes in a
//! row, each within [`QUICK`] of its process's start, end the daemon.

use std::fmt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// So many crashes in a row ...
pub const CRASH_LOOP: usize = 3;
/// ... each of a serving process that died this soon after it started (the first
/// of them excepted) are a crash loop: a binary that cannot run, or a request
/// that kills every process that serves it again. One that served longer made
/// progress: the count starts again from its crash.
pub const QUICK: Duration = Duration::from_secs(1);

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

/// The crashes so far, to tell a crash loop.
#[derive(Debug, Default)]
pub struct Crashes {
    /// Crashes in a row, each but the first within [`QUICK`] of its process's start.
    in_a_row: usize,
    total: u64,
}

impl Crashes {
    /// Records the crash at `now` of a serving process started at `started`; true
    /// when it makes a crash loop.
    pub fn record(&mut self, now: Instant, started: Instant) -> bool {
        self.total += 1;
        if now.saturating_duration_since(started) < QUICK {
            self.in_a_row += 1;
        } else {
            self.in_a_row = 1;
        }
        self.in_a_row >= CRASH_LOOP
    }

    /// Crashes in a row, this one included.
    pub fn in_a_row(&self) -> usize {
        self.in_a_row
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
    fn three_quick_crashes_in_a_row_are_a_loop() {
        let t = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut c = Crashes::default();
        // A process that served for a minute, then two that died at once.
        assert!(!c.record(t + Duration::from_secs(60), t));
        let t = t + Duration::from_secs(60);
        assert!(!c.record(t + ms(300), t + ms(50)));
        assert!(c.record(t + ms(700), t + ms(350)));
        assert_eq!((c.in_a_row(), c.total()), (3, 3));
    }

    #[test]
    fn crashes_of_processes_that_served_a_while_are_not() {
        // Killed every 2 s, twenty times (the VM crash suite): never a loop.
        let mut t = Instant::now();
        let mut c = Crashes::default();
        for i in 0..20 {
            let started = t;
            t += Duration::from_secs(2);
            assert!(!c.record(t, started), "crash {i}");
        }
        assert_eq!((c.in_a_row(), c.total()), (1, 20));
        // A quick one after them counts from the last.
        let started = t;
        assert!(!c.record(t + Duration::from_millis(10), started));
        assert_eq!(c.in_a_row(), 2);
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
