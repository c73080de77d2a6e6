//! The queue workers' wake timers: one timerfd per worker, beside its queues in its
//! event loop, armed for the next throttled request's turn, a loaded state's
//! requests looking for their ring, or at once when a volume's limit changes or it
//! is detached.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A one-shot monotonic timer (a timerfd) a queue worker waits on beside its queues.
pub struct WakeTimer(OwnedFd);

impl WakeTimer {
    pub fn new() -> io::Result<Self> {
        // SAFETY: timerfd_create takes no pointers; the fd it returns is ours alone.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nothing else.
        Ok(WakeTimer(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Fires once, `after` from now (at once for zero).
    pub fn arm(&self, after: Duration) {
        let after = after.max(Duration::from_nanos(1));
        self.set(libc::timespec {
            tv_sec: after.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: after.subsec_nanos() as libc::c_long,
        });
    }

    pub fn disarm(&self) {
        self.set(libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        });
    }

    fn set(&self, value: libc::timespec) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: spec is a valid itimerspec; the old value is not asked for. The
        // call fails only for a bad fd or value, neither of which can happen here.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Reads the expirations, so the fd is quiet until the timer fires again.
    pub fn consume(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `count`. EAGAIN (nothing expired: a wake
        // the worker already saw) is fine.
        unsafe { libc::read(self.0.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
    }
}

impl AsRawFd for WakeTimer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_timer_fires_once_when_armed() {
        let t = WakeTimer::new().unwrap();
        let mut pfd = libc::pollfd {
            fd: t.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let poll = |pfd: &mut libc::pollfd, ms| unsafe { libc::poll(pfd, 1, ms) };
        assert_eq!(poll(&mut pfd, 0), 0, "unarmed");
        t.arm(Duration::ZERO);
        assert_eq!(poll(&mut pfd, 1000), 1, "fired");
        t.consume();
        assert_eq!(poll(&mut pfd, 0), 0, "quiet after consume");
        t.arm(Duration::from_secs(60));
        t.disarm();
        assert_eq!(poll(&mut pfd, 50), 0, "disarmed");
    }
}
