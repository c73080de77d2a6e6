//! The allow-lists: every system call a thread role may make, with its argument
//! rule and why (docs/SECCOMP.md is generated from it).

use super::{role_index, ThreadRole};

/// Role bits of [`Allowed::roles`].
pub(super) const MAIN: u8 = 1 << 0;
pub(super) const WORKER: u8 = 1 << 1;
pub(super) const CONTROL: u8 = 1 << 2;
pub(super) const LOCKW: u8 = 1 << 3;
pub(super) const SIGNALS: u8 = 1 << 4;
pub(super) const LOGGER: u8 = 1 << 5;
pub(super) const SUPER: u8 = 1 << 6;
pub(super) const STATE: u8 = 1 << 7;
/// Every thread of the sandboxed daemon (not the supervisor).
pub(super) const DAEMON: u8 = MAIN | WORKER | CONTROL | LOCKW | SIGNALS | LOGGER | STATE;
pub(super) const ALL: u8 = DAEMON | SUPER;

/// The entries a role's list is made of: its own bit's; the launcher's are every
/// daemon role's (the union of their lists).
pub(super) fn role_bit(role: ThreadRole) -> u8 {
    match role {
        ThreadRole::Launcher => DAEMON,
        _ => 1 << role_index(role),
    }
}

/// What the arguments of an allowed call must be.
#[derive(Clone, Copy, Debug)]
pub(super) enum Args {
    /// Anything.
    Any,
    /// `clone`: a thread (CLONE_THREAD set in the flags), never a process.
    Thread,
    /// `prctl`: only these options (first argument).
    Prctl(&'static [i32]),
    /// `fcntl`: only these commands (second argument).
    Fcntl(&'static [i32]),
    /// `seccomp`: SECCOMP_SET_MODE_FILTER with no flags (no TSYNC).
    SetModeFilter,
    /// `mmap`, `mprotect`: never PROT_EXEC (third argument).
    NoExec,
    /// `tgkill`: only this process (filled in at compile time), and only these
    /// signals.
    OwnThreads(&'static [i32]),
}

/// One allowed system call.
pub(super) struct Allowed {
    pub nr: i64,
    pub name: &'static str,
    pub roles: u8,
    pub args: Args,
    /// Why it is allowed: read by the docs table (SECCOMP.md) and its test only.
    #[cfg(test)]
    pub why: &'static str,
}

macro_rules! allow {
    ($sys:ident, $roles:expr, $why:literal) => {
        allow!($sys, $roles, Args::Any, $why)
    };
    ($sys:ident, $roles:expr, $args:expr, $why:literal) => {
        Allowed {
            nr: libc::$sys,
            name: stringify!($sys),
            roles: $roles,
            args: $args,
            #[cfg(test)]
            why: $why,
        }
    };
}

/// `prctl` options: the thread name std sets on a new thread (which runs under its
/// creator's filter until it confines itself), and no_new_privs, which
/// `seccompiler::apply_filter` sets before each filter.
pub(super) const PRCTL_THREADS: &[i32] = &[libc::PR_SET_NAME, libc::PR_SET_NO_NEW_PRIVS];

/// Every allowed system call: name, roles, arguments, why. Derived by running every
/// suite under `--seccomp log` (and under strace, to drop what no thread calls).
#[rustfmt::skip]
pub(super) static ALLOWED: &[Allowed] = &[
    // Memory: the allocator may need any of these in any thread that allocates
    // (glibc shares arenas, the main one included, once threads outnumber them).
    allow!(SYS_brk, DAEMON, "allocator: the main arena grows"),
    allow!(SYS_mmap, DAEMON, Args::NoExec, "allocator, thread stacks, guest memory regions (Main); never executable"),
    allow!(SYS_mprotect, DAEMON, Args::NoExec, "allocator arenas grow; a new thread's guard page; never executable"),
    allow!(SYS_munmap, DAEMON | SUPER, "allocator, thread stacks, old guest memory tables; std's signal stack at exit"),
    allow!(SYS_mremap, MAIN | WORKER | CONTROL | STATE, "realloc of a large (mmapped) buffer"),
    allow!(SYS_madvise, DAEMON, "glibc frees an exiting thread's stack (MADV_DONTNEED), allocator trims"),
    // Threads (std, glibc).
    allow!(SYS_futex, DAEMON, "mutexes, condition variables, once cells, thread parking and join"),
    allow!(SYS_clone, MAIN | WORKER | CONTROL | STATE, Args::Thread, "start a thread (glibc falls back to clone after clone3's ENOSYS); threads only"),
    allow!(SYS_clone3, MAIN | WORKER | CONTROL | STATE, "glibc tries clone3 first; the stacked filter answers ENOSYS"),
    allow!(SYS_set_robust_list, MAIN | WORKER | CONTROL | STATE, "glibc, in a new thread (under its creator's filter)"),
    allow!(SYS_rseq, MAIN | WORKER | CONTROL | STATE, "glibc registers restartable sequences in a new thread"),
    allow!(SYS_gettid, MAIN | WORKER | CONTROL | STATE, "std, in a new thread"),
    allow!(SYS_sched_getaffinity, MAIN | WORKER | CONTROL | STATE, "std, in a new thread"),
    allow!(SYS_prctl, MAIN | WORKER | CONTROL | STATE, Args::Prctl(PRCTL_THREADS), "std names a new thread; apply_filter sets no_new_privs before a stacked filter"),
    allow!(SYS_seccomp, WORKER | CONTROL | STATE, Args::SetModeFilter, "lock-wait and client threads stack their own filter"),
    allow!(SYS_capget, WORKER | CONTROL | STATE, "lock-wait and client threads read their capabilities before dropping them"),
    allow!(SYS_capset, WORKER | CONTROL | STATE, "lock-wait and client threads drop capabilities; a worker lowers CAP_SYS_ADMIN/CAP_SETFCAP around a translated caller's xattr change and raises them again (never above its permitted set)"),
    allow!(SYS_sigaltstack, DAEMON | SUPER, "std's stack-overflow signal stack, set up in a new thread, removed at its exit"),
    allow!(SYS_rt_sigprocmask, MAIN | WORKER | CONTROL | LOCKW | LOGGER | STATE, "glibc blocks signals around thread start and exit, pthread_kill; a lock wait unblocks SIGUSR1; the log thread blocks every signal at its start"),
    allow!(SYS_exit, MAIN | WORKER | CONTROL | LOCKW | STATE, "a thread ends (client, lock wait, start thread, workers and frontend thread at disconnect)"),
    allow!(SYS_exit_group, ALL, "the process ends (also the trap handler's _exit)"),
    allow!(SYS_restart_syscall, ALL, "a sleep or wait restarted after the thread was stopped (SIGSTOP, ptrace)"),
    allow!(SYS_getrandom, MAIN | WORKER | STATE, "HashMap seeds"),
    // Signals.
    allow!(SYS_rt_sigtimedwait, SIGNALS | SUPER, "sigwait for SIGTERM/SIGINT (the supervisor's: the forwarded signals and SIGCHLD)"),
    allow!(SYS_rt_sigaction, WORKER | LOCKW, "the lock-wait wake-up handler, installed at the first wait"),
    allow!(SYS_rt_sigreturn, WORKER | LOCKW, "return from the lock-wait wake-up handler"),
    allow!(SYS_getpid, MAIN | WORKER | CONTROL, "pthread_kill (glibc asks for its pid)"),
    allow!(SYS_tgkill, MAIN | WORKER | CONTROL, Args::OwnThreads(&[libc::SIGUSR1, libc::SIGABRT]), "wake lock waits (session reset, detach); abort"),
    allow!(SYS_pidfd_send_signal, SUPER, "forward a signal to the daemon, through the pidfd opened before the filter (no call here can name another process)"),
    allow!(SYS_wait4, SUPER, "reap the daemon"),
    allow!(SYS_clock_nanosleep, MAIN | WORKER | CONTROL | LOCKW | LOGGER, "thread::sleep: the log summary period, lock-wake retries, accept back-off; a lock wait's answer waits for its stopped ring to run again"),
    // Descriptors, sockets, logging.
    allow!(SYS_write, ALL, "log lines on stderr; eventfd kicks and exit events; HTTP replies"),
    allow!(SYS_sendto, DAEMON, "log lines to /dev/log (--syslog); HTTP replies"),
    allow!(SYS_read, WORKER | CONTROL | STATE, "eventfds (queue kicks, exit event); control requests (std reads a UnixStream with read(2))"),
    allow!(SYS_close, MAIN | WORKER | CONTROL | LOCKW | STATE, "descriptors (a lock wait closes its lock file's fds)"),
    allow!(SYS_epoll_create1, WORKER, "the queue workers' event loops (created in VhostUserDaemon::new)"),
    allow!(SYS_epoll_ctl, MAIN | WORKER, "register queue kick fds (frontend thread), the worker loops"),
    allow!(SYS_epoll_wait, WORKER, "the queue workers' event loops"),
    allow!(SYS_eventfd2, WORKER, "the queue workers' exit events"),
    allow!(SYS_timerfd_settime, WORKER | CONTROL | STATE, "QoS: a queue worker arms its wake timer for its next throttled request; the control API fires the timers when a limit changes or a volume is detached; a loaded state's unanswered requests make the workers look for their rings"),
    allow!(SYS_accept4, MAIN | CONTROL | STATE, "the frontend's connection; control clients; a migration's destination fetching the open files of the guest's locks"),
    allow!(SYS_recvmsg, MAIN | STATE, "vhost-user messages with their fds; open files handed over by a migration's source on this host"),
    allow!(SYS_sendmsg, MAIN | STATE, "vhost-user replies; open files handed to a migration's destination on this host"),
    allow!(SYS_recvfrom, CONTROL | STATE, "control requests; a hand-over's token (std reads a UnixStream with recv)"),
    allow!(SYS_getsockopt, CONTROL | STATE, "SO_PEERCRED of a control client, and of a hand-over peer"),
    allow!(SYS_setsockopt, CONTROL | STATE, "a control client's read and write timeouts; a hand-over's"),
    allow!(SYS_dup, WORKER, "FLUSH: close(dup(fd)) for the host's close-time semantics"),
    allow!(SYS_fcntl, MAIN | WORKER | CONTROL | STATE, Args::Fcntl(&[libc::F_DUPFD_CLOEXEC]), "try_clone of a file or socket"),
    allow!(SYS_fcntl, WORKER | LOCKW | STATE, Args::Fcntl(&[libc::F_GETFL, libc::F_OFD_GETLK, libc::F_OFD_SETLK, libc::F_OFD_SETLKW, libc::F_GETFD]), "POSIX locks as OFD locks (F_GETFL: the lock file's access mode); F_GETFD: std checks an fd is open before closing it (builds with debug assertions, as the host tests run)"),
    allow!(SYS_fcntl, MAIN | CONTROL, Args::Fcntl(&[libc::F_GETFD]), "std checks an fd is open before closing it (builds with debug assertions)"),
    allow!(SYS_umask, MAIN, "umask(0) once the workers exist"),
    // Files.
    allow!(SYS_openat, WORKER | CONTROL | LOCKW | STATE, "open relative to a node's fd (lock files too)"),
    allow!(SYS_openat2, CONTROL, "attach: RESOLVE_BENEATH open of a volume"),
    allow!(SYS_name_to_handle_at, WORKER | CONTROL | STATE, "--inode-file-handles: a new node's file handle; attach checks a volume makes them"),
    allow!(SYS_open_by_handle_at, WORKER | CONTROL | LOCKW | STATE, "--inode-file-handles: reach a node kept by file handle (a lock wait opens its lock file); attach checks it opens"),
    allow!(SYS_newfstatat, MAIN | WORKER | CONTROL | SIGNALS | STATE, "stat, fstat; a socket file checked before it is removed"),
    allow!(SYS_statx, WORKER | CONTROL | SUPER | STATE, "stat (std)"),
    allow!(SYS_readlink, CONTROL, "attach: a volume's path through /proc/self/fd"),
    allow!(SYS_unlinkat, MAIN | WORKER | SIGNALS, "unlink, rmdir; the sockets at exit"),
    allow!(SYS_unlink, MAIN | SUPER, "the vhost-user listener removes its socket; the supervisor, sockets a dead daemon left"),
    allow!(SYS_mkdirat, WORKER, "mkdir"),
    allow!(SYS_mknodat, WORKER, "mknod, create"),
    allow!(SYS_symlinkat, WORKER, "symlink"),
    allow!(SYS_linkat, WORKER, "link"),
    allow!(SYS_renameat2, WORKER, "rename"),
    allow!(SYS_readlinkat, WORKER | STATE, "readlink"),
    allow!(SYS_getdents64, WORKER, "readdir"),
    allow!(SYS_lseek, WORKER | STATE, "readdir offsets, lseek (SEEK_DATA/SEEK_HOLE)"),
    allow!(SYS_preadv, WORKER, "read into guest buffers"),
    allow!(SYS_pread64, CONTROL, "GET /metrics reads /proc/self/status and stat again from offset 0"),
    allow!(SYS_pwritev, WORKER, "write from guest buffers"),
    allow!(SYS_ftruncate, WORKER, "setattr size"),
    allow!(SYS_fallocate, WORKER, "fallocate"),
    allow!(SYS_fsync, WORKER, "fsync"),
    allow!(SYS_fdatasync, WORKER, "fsync (datasync)"),
    allow!(SYS_syncfs, WORKER, "syncfs"),
    allow!(SYS_fchmod, WORKER, "setattr mode"),
    allow!(SYS_fchmodat, WORKER, "setattr mode (by path through /proc/self/fd)"),
    allow!(SYS_fchownat, WORKER, "setattr owner"),
    allow!(SYS_utimensat, WORKER, "setattr times"),
    allow!(SYS_fstatfs, WORKER, "statfs"),
    allow!(SYS_faccessat2, WORKER, "access"),
    allow!(SYS_flock, WORKER | LOCKW | STATE, "flock"),
    allow!(SYS_copy_file_range, WORKER, "copy_file_range"),
    allow!(SYS_fgetxattr, WORKER, "getxattr; with --posix-acl, whether a directory has a default ACL before a create in it"),
    allow!(SYS_fsetxattr, WORKER, "setxattr"),
    allow!(SYS_flistxattr, WORKER, "listxattr"),
    allow!(SYS_fremovexattr, WORKER, "removexattr"),
    allow!(SYS_lsetxattr, WORKER, "setxattr on a symlink or special file (by path through /proc/self/fd)"),
    allow!(SYS_setfsuid, WORKER, "create as the guest's uid; with --translate-uid, every identity-dependent call as the caller's host uid"),
    allow!(SYS_setfsgid, WORKER, "create as the guest's gid; with --translate-gid, every identity-dependent call as the caller's host gid"),
    allow!(SYS_setgroups, WORKER, "with --translate-uid/gid, a worker holds no supplementary groups (per thread, once)"),
    allow!(SYS_geteuid, WORKER | STATE, "credentials of a request; the uid a hand-over peer must have"),
    allow!(SYS_getegid, WORKER, "credentials of a request"),
    allow!(SYS_connect, STATE, "a migration's destination connects, with the socket made at start in the host's network namespace, to its source on this host to take over the guest's locks"),
    // Control: volumes.
    allow!(SYS_open_tree, CONTROL, "attach: a detached copy of a volume's mount"),
    allow!(SYS_mount_setattr, CONTROL, "attach: make a read-only volume's mount read-only"),
];
