//! Per-thread seccomp allow-lists, built with seccompiler (no libseccomp).
//!
//! Each [`ThreadRole`] has its own list ([`ALLOWED`]: the system call, the roles that
//! may make it, an argument rule, and why; docs/SECCOMP.md has the same table). A
//! thread installs its role's filter on itself only (`seccompiler::apply_filter`, no
//! TSYNC); the threads it then creates inherit it. The programs are compiled once per
//! process and mode, at the first [`apply`], so that confining a per-request thread
//! (a control client, a lock wait) costs two `seccomp(2)` calls.
//!
//! No process can be started by any thread: there is no `fork`, `vfork`, `execve` or
//! `execveat` in any list, `clone` is allowed only with `CLONE_THREAD`, and `clone3`
//! (whose flags live in memory a filter cannot read) fails with ENOSYS from a second,
//! stacked filter, so that glibc falls back to `clone`.
//!
//! The lists were derived by running every suite with `--seccomp log` (see
//! docs/SECCOMP.md, "Updating the lists").

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::{SeccompMode, ThreadRole};

/// Installs `role`'s filter on the calling thread (and on the threads it creates
/// afterwards). `SeccompMode::None` installs nothing.
pub fn apply(role: ThreadRole, mode: SeccompMode) -> Result<(), String> {
    let action = match mode {
        SeccompMode::None => return Ok(()),
        SeccompMode::Kill => Mismatch::Kill,
        SeccompMode::Trap => {
            trap::install()?;
            trap::name_thread(role);
            Mismatch::Trap
        }
        SeccompMode::Log => Mismatch::Log,
    };
    install(role, action)
}

/// What a call outside the list does: the three modes of `--seccomp`, and an errno
/// for the unit tests (which run in the test process, where nothing may be killed).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
enum Mismatch {
    Kill,
    Trap,
    Log,
    #[cfg(test)]
    Errno(u32),
}

impl Mismatch {
    fn action(self) -> SeccompAction {
        match self {
            Mismatch::Kill => SeccompAction::KillProcess,
            Mismatch::Trap => SeccompAction::Trap,
            Mismatch::Log => SeccompAction::Log,
            #[cfg(test)]
            Mismatch::Errno(e) => SeccompAction::Errno(e),
        }
    }
}

/// Installs the compiled programs of `role`: first the clone3 one (it allows the
/// `seccomp` call that installs the next), then the allow-list.
fn install(role: ThreadRole, mismatch: Mismatch) -> Result<(), String> {
    let programs = programs(mismatch)?;
    let p = &programs[role_index(role)];
    if let Some(clone3) = &p.clone3 {
        seccompiler::apply_filter(clone3).map_err(|e| format!("seccomp (clone3 filter): {e}"))?;
    }
    seccompiler::apply_filter(&p.list).map_err(|e| format!("seccomp: {e}"))
}

/// One role's compiled filters.
struct Programs {
    /// The allow-list.
    list: BpfProgram,
    /// clone3 => ENOSYS, for the roles that create threads.
    clone3: Option<BpfProgram>,
}

type Compiled = Result<Vec<Programs>, String>;

/// The programs of every role for `mismatch`, compiled at the first call.
fn programs(mismatch: Mismatch) -> Result<&'static [Programs], String> {
    static KILL: OnceLock<Compiled> = OnceLock::new();
    static TRAP: OnceLock<Compiled> = OnceLock::new();
    static LOG: OnceLock<Compiled> = OnceLock::new();
    let cell = match mismatch {
        Mismatch::Kill => &KILL,
        Mismatch::Trap => &TRAP,
        Mismatch::Log => &LOG,
        #[cfg(test)]
        Mismatch::Errno(_) => {
            // Tests only: leaked, compiled per call.
            let compiled = compile_all(mismatch)?;
            return Ok(Box::leak(compiled.into_boxed_slice()));
        }
    };
    cell.get_or_init(|| compile_all(mismatch))
        .as_deref()
        .map_err(Clone::clone)
}

fn compile_all(mismatch: Mismatch) -> Compiled {
    ThreadRole::ALL
        .iter()
        .map(|&role| {
            Ok(Programs {
                list: compile(role, mismatch)?,
                clone3: if creates_threads(role) {
                    Some(clone3_enosys()?)
                } else {
                    None
                },
            })
        })
        .collect()
}

fn role_index(role: ThreadRole) -> usize {
    ThreadRole::ALL
        .iter()
        .position(|&r| r == role)
        .expect("every role is in ThreadRole::ALL")
}

/// The roles whose threads start threads: the vhost-user thread (Main), lock waits
/// (Worker), client threads (Control), the wait for locks a loaded state names
/// (State).
fn creates_threads(role: ThreadRole) -> bool {
    matches!(
        role,
        ThreadRole::Main | ThreadRole::Worker | ThreadRole::Control | ThreadRole::State
    )
}

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;

#[cfg(not(target_arch = "x86_64"))]
compile_error!("the seccomp allow-lists are only written for x86_64");

// ---------------------------------------------------------------------------------
// The lists.

/// Role bits of [`Allowed::roles`].
const MAIN: u8 = 1 << 0;
const WORKER: u8 = 1 << 1;
const CONTROL: u8 = 1 << 2;
const LOCKW: u8 = 1 << 3;
const SIGNALS: u8 = 1 << 4;
const LOGGER: u8 = 1 << 5;
const SUPER: u8 = 1 << 6;
const STATE: u8 = 1 << 7;
/// Every thread of the sandboxed daemon (not the supervisor).
const DAEMON: u8 = MAIN | WORKER | CONTROL | LOCKW | SIGNALS | LOGGER | STATE;
const ALL: u8 = DAEMON | SUPER;

fn role_bit(role: ThreadRole) -> u8 {
    1 << role_index(role)
}

/// What the arguments of an allowed call must be.
#[derive(Clone, Copy, Debug)]
enum Args {
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
struct Allowed {
    nr: i64,
    name: &'static str,
    roles: u8,
    args: Args,
    why: &'static str,
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
            why: $why,
        }
    };
}

/// `prctl` options: the thread name std sets on a new thread (which runs under its
/// creator's filter until it confines itself), and no_new_privs, which
/// `seccompiler::apply_filter` sets before each filter.
const PRCTL_THREADS: &[i32] = &[libc::PR_SET_NAME, libc::PR_SET_NO_NEW_PRIVS];

/// Every allowed system call: name, roles, arguments, why. Derived by running every
/// suite under `--seccomp log` (and under strace, to drop what no thread calls).
#[rustfmt::skip]
static ALLOWED: &[Allowed] = &[
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
    allow!(SYS_rt_sigprocmask, MAIN | WORKER | CONTROL | LOCKW | STATE, "glibc blocks signals around thread start and exit, pthread_kill; a lock wait unblocks SIGUSR1"),
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
    allow!(SYS_timerfd_settime, WORKER | CONTROL, "QoS: a queue worker arms its wake timer for its next throttled request; the control API fires the timers when a limit changes or a volume is detached"),
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

/// The arguments of `args` as seccompiler rules; empty: any arguments.
fn rules(args: Args) -> Result<Vec<SeccompRule>, String> {
    let cond = |arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, len, op, value).map_err(|e| e.to_string())
    };
    let rule = |conds: Vec<SeccompCondition>| SeccompRule::new(conds).map_err(|e| e.to_string());
    let one_of = |arg: u8, values: &[i32]| -> Result<Vec<SeccompRule>, String> {
        values
            .iter()
            .map(|&v| {
                rule(vec![cond(
                    arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    v as u32 as u64,
                )?])
            })
            .collect()
    };
    match args {
        Args::Any => Ok(Vec::new()),
        Args::Thread => {
            let t = libc::CLONE_THREAD as u64;
            Ok(vec![rule(vec![cond(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(t),
                t,
            )?])?])
        }
        Args::NoExec => Ok(vec![rule(vec![cond(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
            0,
        )?])?]),
        Args::Prctl(options) => one_of(0, options),
        Args::Fcntl(cmds) => one_of(1, cmds),
        Args::SetModeFilter => Ok(vec![rule(vec![
            cond(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::SECCOMP_SET_MODE_FILTER as u64,
            )?,
            cond(1, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, 0)?,
        ])?]),
        Args::OwnThreads(signals) => {
            // SAFETY: getpid cannot fail.
            let pid = unsafe { libc::getpid() } as u32 as u64;
            signals
                .iter()
                .map(|&s| {
                    rule(vec![
                        cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, pid)?,
                        cond(2, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, s as u64)?,
                    ])
                })
                .collect()
        }
    }
}

/// The rules of `role`'s list, by system call number.
fn role_rules(
    role: ThreadRole,
    mismatch: Mismatch,
) -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let bit = role_bit(role);
    let mut map = BTreeMap::new();
    for a in ALLOWED.iter().filter(|a| a.roles & bit != 0) {
        let mut r = rules(a.args)?;
        if mismatch == Mismatch::Trap && a.nr == libc::SYS_prctl {
            // The trap handler names the thread (PR_GET_NAME).
            r.extend(rules(Args::Prctl(&[libc::PR_GET_NAME]))?);
        }
        match map.entry(a.nr) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(r);
            }
            // Two entries with argument rules (e.g. fcntl for two sets of roles):
            // either matches. An unconditional entry cannot be combined.
            std::collections::btree_map::Entry::Occupied(mut e) => {
                if e.get().is_empty() || r.is_empty() {
                    return Err(format!("{} is listed twice for {role:?}", a.name));
                }
                e.get_mut().extend(r);
            }
        }
    }
    if mismatch == Mismatch::Trap {
        map.entry(libc::SYS_prctl)
            .or_insert(rules(Args::Prctl(&[libc::PR_GET_NAME]))?);
    }
    Ok(map)
}

fn compile(role: ThreadRole, mismatch: Mismatch) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(
        role_rules(role, mismatch)?,
        mismatch.action(),
        SeccompAction::Allow,
        ARCH,
    )
    .map_err(|e| format!("{role:?} filter: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("{role:?} filter: {e}"))
}

/// The second filter of the thread-creating roles: clone3 gets ENOSYS (its flags
/// cannot be inspected), everything else is left to the allow-list.
fn clone3_enosys() -> Result<BpfProgram, String> {
    let mut map = BTreeMap::new();
    map.insert(libc::SYS_clone3, Vec::new());
    SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        ARCH,
    )
    .and_then(|f| f.try_into())
    .map_err(|e| format!("clone3 filter: {e}"))
}

/// `--seccomp trap`: the SIGSYS handler, which names the call and the thread and
/// exits 1.
mod trap {
    use std::cell::Cell;
    use std::sync::OnceLock;

    use super::ThreadRole;

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
    pub(super) fn install() -> Result<(), String> {
        static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
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
                        return Err(format!(
                            "installing the SIGSYS handler: {}",
                            std::io::Error::last_os_error()
                        ));
                    }
                }
                Ok(())
            })
            .clone()?;
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
        }
    }
}

/// The table of docs/SECCOMP.md: system call | roles | why.
pub fn markdown_table() -> String {
    let mut out = String::from("| system call | roles | why |\n| --- | --- | --- |\n");
    for a in ALLOWED {
        let roles: Vec<String> = ThreadRole::ALL
            .iter()
            .filter(|&&r| a.roles & role_bit(r) != 0)
            .map(|r| format!("{r:?}"))
            .collect();
        let args = match a.args {
            Args::Any => String::new(),
            Args::Thread => " (CLONE_THREAD only)".to_string(),
            Args::NoExec => " (no PROT_EXEC)".to_string(),
            Args::Prctl(o) => format!(" ({} only)", prctl_names(o)),
            Args::Fcntl(c) => format!(" ({} only)", fcntl_names(c)),
            Args::SetModeFilter => " (SECCOMP_SET_MODE_FILTER, no flags)".to_string(),
            Args::OwnThreads(s) => format!(
                " (own process, {} only)",
                s.iter()
                    .map(|&s| signal_name(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        out.push_str(&format!(
            "| `{}`{args} | {} | {} |\n",
            a.name.trim_start_matches("SYS_"),
            if a.roles == ALL {
                "all".to_string()
            } else if a.roles == DAEMON {
                "all but Supervisor".to_string()
            } else {
                roles.join(", ")
            },
            a.why
        ));
    }
    out
}

fn prctl_names(options: &[i32]) -> String {
    options
        .iter()
        .map(|&o| match o {
            libc::PR_SET_NAME => "PR_SET_NAME".to_string(),
            libc::PR_GET_NAME => "PR_GET_NAME".to_string(),
            libc::PR_SET_NO_NEW_PRIVS => "PR_SET_NO_NEW_PRIVS".to_string(),
            o => o.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn fcntl_names(cmds: &[i32]) -> String {
    cmds.iter()
        .map(|&c| match c {
            libc::F_GETFL => "F_GETFL".to_string(),
            libc::F_SETFL => "F_SETFL".to_string(),
            libc::F_GETFD => "F_GETFD".to_string(),
            libc::F_SETFD => "F_SETFD".to_string(),
            libc::F_DUPFD_CLOEXEC => "F_DUPFD_CLOEXEC".to_string(),
            libc::F_OFD_GETLK => "F_OFD_GETLK".to_string(),
            libc::F_OFD_SETLK => "F_OFD_SETLK".to_string(),
            libc::F_OFD_SETLKW => "F_OFD_SETLKW".to_string(),
            libc::F_GETLK => "F_GETLK".to_string(),
            libc::F_SETLK => "F_SETLK".to_string(),
            libc::F_SETLKW => "F_SETLKW".to_string(),
            c => c.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGABRT => "SIGABRT",
        _ => "?",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "docs/SECCOMP.md";
    const BEGIN: &str = "<!-- BEGIN SYSCALL TABLE (generated by src/sandbox/seccomp.rs) -->\n";
    const END: &str = "<!-- END SYSCALL TABLE -->";

    #[test]
    fn every_role_compiles_for_every_mode() {
        for mismatch in [
            Mismatch::Kill,
            Mismatch::Trap,
            Mismatch::Log,
            Mismatch::Errno(libc::EPERM as u32),
        ] {
            let programs = programs(mismatch).unwrap();
            assert_eq!(programs.len(), ThreadRole::ALL.len());
            for role in ThreadRole::ALL {
                let p = &programs[role_index(role)];
                assert!(!p.list.is_empty(), "{role:?} {mismatch:?}");
                assert_eq!(p.clone3.is_some(), creates_threads(role));
            }
        }
    }

    #[test]
    fn no_role_may_start_a_process() {
        for a in ALLOWED {
            for banned in [
                libc::SYS_fork,
                libc::SYS_vfork,
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_ptrace,
                libc::SYS_process_vm_writev,
            ] {
                assert_ne!(a.nr, banned, "{} must not be allowed", a.name);
            }
            if a.nr == libc::SYS_clone {
                assert!(matches!(a.args, Args::Thread));
            }
        }
    }

    #[test]
    fn a_lock_waiter_may_only_do_what_a_worker_may() {
        // The lock-wait thread runs under the worker's filter too.
        for a in ALLOWED {
            if a.roles & LOCKW != 0 {
                assert!(a.roles & WORKER != 0, "{} is LockWaiter-only", a.name);
            }
        }
    }

    /// Runs `f` on a new thread that installed `role`'s filter with EPERM for calls
    /// outside the list (never a kill, in the test process).
    fn confined<T: Send + 'static>(role: ThreadRole, f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            install(role, Mismatch::Errno(libc::EPERM as u32)).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    fn errno_of(ret: libc::c_long) -> Option<i32> {
        (ret < 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap())
    }

    #[test]
    fn a_worker_is_refused_a_call_outside_its_list() {
        let (ppid, getpid, close) = confined(ThreadRole::Worker, || {
            // SAFETY: system calls without pointer arguments.
            unsafe {
                (
                    errno_of(libc::syscall(libc::SYS_getppid)),
                    errno_of(libc::syscall(libc::SYS_getpid)),
                    errno_of(libc::syscall(libc::SYS_close, -1)),
                )
            }
        });
        assert_eq!(
            ppid,
            Some(libc::EPERM),
            "getppid is not on the worker's list"
        );
        assert_eq!(getpid, None, "getpid is");
        assert_eq!(close, Some(libc::EBADF), "close is, and reaches the kernel");
    }

    #[test]
    fn a_worker_starts_threads_but_no_process() {
        let (clone3, fork, thread) = confined(ThreadRole::Worker, || {
            // SAFETY: clone3 with no arguments fails in the filter (ENOSYS) before the
            // kernel reads them; clone without CLONE_THREAD fails in the filter (EPERM);
            // were it to fork, the child leaves at once.
            unsafe {
                let clone3 = errno_of(libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0));
                let ret = libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                if ret == 0 {
                    libc::_exit(0);
                }
                let fork = errno_of(ret);
                // glibc falls back to clone when clone3 answers ENOSYS.
                let thread = std::thread::spawn(|| 7).join().unwrap();
                (clone3, fork, thread)
            }
        });
        assert_eq!(clone3, Some(libc::ENOSYS));
        assert_eq!(fork, Some(libc::EPERM));
        assert_eq!(thread, 7);
    }

    #[test]
    fn a_lock_waiter_stacks_a_narrower_filter_on_the_worker_one() {
        let (before, after) = confined(ThreadRole::Worker, || {
            // SAFETY: faccessat2 on a static C string (workers check access, lock
            // waits never do).
            let open = || unsafe {
                errno_of(libc::syscall(
                    libc::SYS_faccessat2,
                    libc::AT_FDCWD,
                    c"/".as_ptr(),
                    libc::F_OK,
                    0,
                ))
            };
            let before = open();
            let after = std::thread::spawn(move || {
                install(ThreadRole::LockWaiter, Mismatch::Errno(libc::EPERM as u32)).unwrap();
                open()
            })
            .join()
            .unwrap();
            (before, after)
        });
        assert_eq!(before, None);
        assert_eq!(after, Some(libc::EPERM));
    }

    #[test]
    fn tgkill_only_wakes_threads_of_this_process() {
        let (other, own) = confined(ThreadRole::Worker, || {
            // SAFETY: tgkill of a process that does not exist (were the filter to let
            // it through: ESRCH), and of tid 0 (EINVAL).
            unsafe {
                let me = libc::getpid();
                (
                    errno_of(libc::syscall(
                        libc::SYS_tgkill,
                        0x3fff_fff0,
                        1,
                        libc::SIGUSR1,
                    )),
                    errno_of(libc::syscall(libc::SYS_tgkill, me, 0, libc::SIGUSR1)),
                )
            }
        });
        assert_eq!(other, Some(libc::EPERM));
        assert_eq!(
            own,
            Some(libc::EINVAL),
            "allowed by the filter; the kernel refuses tid 0"
        );
    }

    const HELPER_ENV: &str = "VOLFSD_SECCOMP_TEST_HELPER";
    const HELPER: &str = "sandbox::seccomp::tests::helper_process_worker_calls_getppid";

    /// Run in a child process by the two tests below: a thread named `helper-worker`
    /// installs the Worker filter in the mode named by the environment and calls
    /// getppid, which is not on the list.
    #[test]
    #[ignore = "helper process of the kill and trap tests"]
    fn helper_process_worker_calls_getppid() {
        let mode = match std::env::var(HELPER_ENV).as_deref() {
            Ok("trap") => SeccompMode::Trap,
            Ok("kill") => SeccompMode::Kill,
            _ => return,
        };
        std::thread::Builder::new()
            .name("helper-worker".to_string())
            .spawn(move || {
                apply(ThreadRole::Worker, mode).unwrap();
                // SAFETY: getppid has no arguments; _exit ends the process.
                unsafe {
                    libc::syscall(libc::SYS_getppid);
                    libc::_exit(0);
                }
            })
            .unwrap()
            .join()
            .unwrap();
    }

    fn run_helper(mode: &str) -> std::process::Output {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                HELPER,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_ENV, mode)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    #[test]
    fn kill_mode_kills_the_process_with_sigsys() {
        use std::os::unix::process::ExitStatusExt;
        let out = run_helper("kill");
        assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{out:?}");
    }

    #[test]
    fn trap_mode_names_the_call_and_the_thread_and_exits_1() {
        let out = run_helper("trap");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            stderr.contains(&format!(
                "volfsd: seccomp: system call {} is outside the allow-list of thread helper-worker (role Worker); exiting",
                libc::SYS_getppid
            )),
            "{stderr}"
        );
    }

    #[test]
    fn docs_table_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC);
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        let table = markdown_table();
        let current = doc
            .split_once(BEGIN)
            .and_then(|(_, rest)| rest.split_once(END))
            .map(|(t, _)| t);
        if current == Some(table.as_str()) {
            return;
        }
        if std::env::var_os("VOLFSD_UPDATE_SECCOMP_DOC").is_some() {
            let (head, rest) = doc
                .split_once(BEGIN)
                .expect("docs/SECCOMP.md has the begin marker");
            let (_, tail) = rest.split_once(END).expect("and the end marker");
            std::fs::write(&path, format!("{head}{BEGIN}{table}{END}{tail}")).unwrap();
            return;
        }
        panic!("{DOC} is out of date with the allow-lists: rerun with VOLFSD_UPDATE_SECCOMP_DOC=1");
    }
}
