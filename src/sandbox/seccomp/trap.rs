//! `--seccomp trap`: the SIGSYS handler, which names the call and the thread and
//! exits 1.

use std::cell::Cell;
use std::sync::OnceLock;

use super::{SandboxError, ThreadRole};

thread_local! {
    /// The role of this thread, set when it installed its filter (threads that
    /// inherited their creator's filter have none).
    static ROLE: Cell<Option<ThreadRole>> = const { Cell::new(None) };
}

pub(super) fn name_thread(role: ThreadRole) {
    ROLE.with(|r| r.set(Some(role)));
}

/// Installs the handler (once per process) and unblocks SIGSYS in the calling
/// thread: a blocked SIGSYS from seccomp kills the process without a word.
pub(super) fn install() -> Result<(), SandboxError> {
    // The errno of a failed sigaction, kept for every thread that asks after.
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            // SAFETY: a handler that only calls async-signal-safe functions.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler
                    as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                    as usize;
                sa.sa_flags = libc::SA_SIGINFO;
                libc::sigfillset(&mut sa.sa_mask);
                if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) < 0 {
                    return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
            }
            Ok(())
        })
        .map_err(|errno| {
            let e = std::io::Error::from_raw_os_error(errno);
            SandboxError::host("installing the SIGSYS handler", e)
        })?;
    // SAFETY: an empty signal set with SIGSYS added, then unblocked.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGSYS);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    Ok(())
}

/// A fixed buffer, filled without allocating.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    fn number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

/// The system call number of a seccomp SIGSYS: `si_syscall` of the `_sigsys`
/// member (after `si_signo`, `si_errno`, `si_code`, padding, and `_call_addr`).
fn si_syscall(info: *const libc::siginfo_t) -> i32 {
    const OFFSET: usize = 3 * 4 + 4 + 8;
    // SAFETY: the kernel passes a whole siginfo_t (128 bytes).
    unsafe { std::ptr::read_unaligned((info as *const u8).add(OFFSET) as *const i32) }
}

/// Async-signal-safe: formats into a stack buffer, calls write(2), prctl(2)
/// (PR_GET_NAME) and _exit(2), which every list allows in trap mode.
extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    line.push(b"volfsd: seccomp: system call ");
    line.number(si_syscall(info) as u32 as u64);
    line.push(b" is outside the allow-list of thread ");
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr(), 0, 0, 0) };
    let n = name.iter().position(|&b| b == 0).unwrap_or(16);
    line.push(&name[..n]);
    // A const-initialised thread local without a destructor: a plain TLS read.
    match ROLE.with(|r| r.get()) {
        Some(role) => {
            line.push(b" (role ");
            line.push(role_name(role));
            line.push(b")");
        }
        None => line.push(b" (its creator's filter)"),
    }
    line.push(b"; exiting\n");
    // SAFETY: write and _exit are async-signal-safe.
    unsafe {
        libc::write(2, line.buf.as_ptr() as *const libc::c_void, line.len);
        libc::_exit(1);
    }
}

fn role_name(role: ThreadRole) -> &'static [u8] {
    match role {
        ThreadRole::Main => b"Main",
        ThreadRole::Worker => b"Worker",
        ThreadRole::Control => b"Control",
        ThreadRole::LockWaiter => b"LockWaiter",
        ThreadRole::Signals => b"Signals",
        ThreadRole::Logger => b"Logger",
        ThreadRole::Supervisor => b"Supervisor",
        ThreadRole::State => b"State",
        ThreadRole::Launcher => b"Launcher",
    }
}
