//! The namespace mode's supervisor as a tiny program: `tiny_supervisor.c`, compiled
//! by build.rs into a static, freestanding x86_64 executable that is embedded here
//! and executed from a sealed memfd. It holds a few pages of memory where the Rust
//! supervisor, a fresh image of volfsd, holds ~200 KiB (the floor of a dynamically
//! linked Rust process): 100 daemons, 100 supervisors.
//!
//! The forked parent confines itself before the exec, as the Rust supervisor does
//! after its own: pidfd of the child, the process-wide lock-down, no capability,
//! then the supervisor's seccomp list plus what the exec and the program's first
//! two calls need ([`seccomp::apply_for_tiny_supervisor`]). The program then stacks
//! an allow-list of its own calls and only then tells the child it may serve.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use nix::unistd::Pid;

use super::supervisor::{command_line, give_up};
use super::{caps, seccomp, SandboxError, SeccompMode};

/// The program, as build.rs compiled it.
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tiny_supervisor"));

/// Why [`exec`] returned.
pub(super) enum NotExecuted {
    /// Before any confinement (the memfd, the pidfd, the command line): the caller
    /// may supervise another way.
    Unconfined(SandboxError),
    /// Confined already, the exec itself failed: the caller may only supervise in
    /// this process, under the filter it has (which allows the loop's calls).
    Confined { error: io::Error, pidfd: OwnedFd },
}

/// Replaces the forked parent with the tiny supervisor of `child`. Returns only if
/// that failed; exits (killing the child) if confining itself failed.
///
/// Kept across the exec, as by the Rust supervisor's: the pid (parenthood of the
/// child), the blocked and pending signals, the working directory (socket paths may
/// be relative); and the two fds named on the command line (pidfd, `confined`).
/// The environment is not passed: the program reads none.
pub(super) fn exec(
    child: Pid,
    mode: SeccompMode,
    sockets: &[PathBuf],
    confined: &OwnedFd,
) -> NotExecuted {
    let unconfined = |step: &str, e: io::Error| {
        NotExecuted::Unconfined(SandboxError::host(format!("tiny supervisor: {step}"), e))
    };
    let memfd = match program_memfd() {
        Ok(fd) => fd,
        Err(e) => return unconfined("writing the program into a memfd", e),
    };
    // SAFETY: pidfd_open of our own child; the fd is owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0) };
    if pidfd < 0 {
        return unconfined("pidfd_open", io::Error::last_os_error());
    }
    // SAFETY: a new fd, owned here only.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    for fd in [&pidfd, confined] {
        if let Err(e) = nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        ) {
            return unconfined("keeping its fds open across the exec", e.into());
        }
    }
    // Everything that allocates, before the filter (which has no brk or mmap).
    let argv = match command_line(mode, Some(&pidfd), child, sockets, confined) {
        Ok(a) => a,
        Err(e) => return unconfined("its command line", e),
    };
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // From here on a failure ends the supervisor, as the Rust one's confining does.
    // The bounding, inheritable and ambient sets emptied and no_new_privs set: the
    // exec cannot give root its capabilities back.
    let confined_now = caps::lock_down_process()
        .and_then(|()| {
            caps::restrict_thread(caps::CapSet::EMPTY)
                .map_err(|e| SandboxError::host("dropping capabilities", e))
        })
        .and_then(|()| seccomp::apply_for_tiny_supervisor(mode, memfd.as_raw_fd()));
    if let Err(e) = confined_now {
        give_up(child, e)
    }
    // SAFETY: execveat of the sealed memfd with NUL-terminated argv and envp arrays
    // that outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            memfd.as_raw_fd(),
            c"".as_ptr(),
            argv_ptrs.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    NotExecuted::Confined {
        error: io::Error::last_os_error(),
        pidfd,
    }
}

/// A memfd holding the program, sealed so that nothing can change it before or
/// after the exec.
fn program_memfd() -> io::Result<OwnedFd> {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    let create = |flags| {
        // SAFETY: memfd_create with a NUL-terminated name; the fd is owned below.
        let fd = unsafe { libc::memfd_create(c"volfsd-supervisor".as_ptr(), flags) };
        if fd < 0 {
            Err(io::Error::last_os_error())
        } else {
            // SAFETY: a new fd, owned here only.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
    };
    // MFD_EXEC: executable even where vm.memfd_noexec makes memfds non-executable by
    // default; kernels before 6.3 do not know the flag (EINVAL) and make them
    // executable anyway.
    let fd = match create(flags | libc::MFD_EXEC) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => create(flags)?,
        other => other?,
    };
    let mut file = std::fs::File::from(fd);
    file.write_all(PROGRAM)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl with integer arguments on an fd we own.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file.into())
}
