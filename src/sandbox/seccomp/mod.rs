//! Per-thread seccomp allow-lists, built with seccompiler (no libseccomp).
//!
//! Each [`ThreadRole`] has its own list ([`ALLOWED`]: the system call, the roles that
//! may make it, an argument rule, and why; docs/SECCOMP.md has the same table). A
//! thread installs its role's filter on itself only (`seccompiler::apply_filter`, no
//! TSYNC); the threads it then creates inherit it. The programs are compiled once per
//! process and mode, by the daemon's main thread before any thread confines itself
//! ([`compile_for`]; else at the first [`apply`]), so that confining a per-request
//! thread (a control client, a lock wait) costs two `seccomp(2)` calls. The
//! supervisor compiles its own role's alone ([`apply_alone`]).
//!
//! No process can be started by any thread: there is no `fork`, `vfork`, `execve` or
//! `execveat` in any list (the one `execveat` allowed, of the tiny supervisor's
//! memfd, is in the supervisor's filter for its exec only:
//! [`apply_for_tiny_supervisor`]), `clone` is allowed only with `CLONE_THREAD`, and `clone3`
//! (whose flags live in memory a filter cannot read) fails with ENOSYS from a second,
//! stacked filter, so that glibc falls back to `clone`.
//!
//! The lists were derived by running every suite with `--seccomp log` (see
//! docs/SECCOMP.md, "Updating the lists").

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

use super::{FilterError, SandboxError, SeccompMode, ThreadRole};

#[cfg(test)]
mod docs_table;
mod table;
#[cfg(test)]
mod tests;
mod trap;

use table::*;

/// Installs `role`'s filter on the calling thread (and on the threads it creates
/// afterwards). `SeccompMode::None` installs nothing.
pub fn apply(role: ThreadRole, mode: SeccompMode) -> Result<(), SandboxError> {
    match mismatch_for(role, mode)? {
        Some(mismatch) => install(role, mismatch),
        None => Ok(()),
    }
}

/// [`apply`] for a process with one role and one thread (the supervisor): only
/// that role's programs are compiled, and not kept. Compiling every role's list, as
/// the daemon's first [`apply`] does, touched ~40 KiB of heap the supervisor then
/// held for its whole life.
pub fn apply_alone(role: ThreadRole, mode: SeccompMode) -> Result<(), SandboxError> {
    let Some(mismatch) = mismatch_for(role, mode)? else {
        return Ok(());
    };
    let programs = compile_role(role, mismatch, own_pid())?;
    install_programs(&programs)
}

/// The supervisor's list plus what the forked parent needs to become the tiny
/// supervisor (`tiny_supervisor.rs`): `execveat` of that one memfd only (its fd,
/// AT_EMPTY_PATH), and the program's first two calls, `prctl(PR_SET_NAME)` and
/// `seccomp(SECCOMP_SET_MODE_FILTER)` of the allow-list it stacks on this one,
/// which has neither of the three.
pub fn apply_for_tiny_supervisor(
    mode: SeccompMode,
    program: std::os::fd::RawFd,
) -> Result<(), SandboxError> {
    let Some(mismatch) = mismatch_for(ThreadRole::Supervisor, mode)? else {
        return Ok(());
    };
    let list = tiny_supervisor_exec_filter(mismatch, program, own_pid())?;
    install_programs(&Programs { list, clone3: None })
}

fn tiny_supervisor_exec_filter(
    mismatch: Mismatch,
    program: std::os::fd::RawFd,
    pid: u32,
) -> Result<BpfProgram, FilterError> {
    let mut map = role_rules(ThreadRole::Supervisor, mismatch, pid)?;
    let compiled = (|| -> Result<BpfProgram, BackendError> {
        let dword = |arg, value: i32| {
            SeccompCondition::new(
                arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                value as u32 as u64,
            )
        };
        let execveat = SeccompRule::new(vec![dword(0, program)?, dword(4, libc::AT_EMPTY_PATH)?])?;
        map.insert(libc::SYS_execveat, vec![execveat]);
        map.entry(libc::SYS_prctl)
            .or_default()
            .extend(rules(Args::Prctl(&[libc::PR_SET_NAME]), pid)?);
        map.insert(libc::SYS_seccomp, rules(Args::SetModeFilter, pid)?);
        SeccompFilter::new(map, mismatch.action(), SeccompAction::Allow, ARCH)?.try_into()
    })();
    compiled.map_err(|e| FilterError {
        filter: "tiny supervisor's exec filter".to_string(),
        why: e.to_string(),
    })
}

/// Compiles every role's programs for `mode` now, on the calling thread, rather than
/// at the first [`apply`]: the daemon's main thread, before any other thread starts,
/// so that the work is done in the main heap and not in the malloc arena of
/// whichever thread confines itself first (where ~50 KiB it touched stayed).
pub fn compile_for(mode: SeccompMode) -> Result<(), SandboxError> {
    if let Some(mismatch) = Mismatch::of(mode) {
        programs(mismatch)?;
    }
    Ok(())
}

/// What a mismatch does in `mode` (None: no filter), with the trap handler set up
/// for `role` in trap mode.
fn mismatch_for(role: ThreadRole, mode: SeccompMode) -> Result<Option<Mismatch>, SandboxError> {
    let mismatch = Mismatch::of(mode);
    if mismatch == Some(Mismatch::Trap) {
        trap::install()?;
        trap::name_thread(role);
    }
    Ok(mismatch)
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
    /// `--seccomp`'s mode as what a mismatch does (None: no filter).
    fn of(mode: SeccompMode) -> Option<Mismatch> {
        match mode {
            SeccompMode::None => None,
            SeccompMode::Kill => Some(Mismatch::Kill),
            SeccompMode::Trap => Some(Mismatch::Trap),
            SeccompMode::Log => Some(Mismatch::Log),
        }
    }

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
fn install(role: ThreadRole, mismatch: Mismatch) -> Result<(), SandboxError> {
    let programs = programs(mismatch)?;
    install_programs(&programs[role_index(role)])
}

fn install_programs(p: &Programs) -> Result<(), SandboxError> {
    let installing = |step| move |source| SandboxError::Seccomp { step, source };
    if let Some(clone3) = &p.clone3 {
        seccompiler::apply_filter(clone3).map_err(installing("seccomp (clone3 filter)"))?;
    }
    seccompiler::apply_filter(&p.list).map_err(installing("seccomp"))
}

/// One role's compiled filters.
struct Programs {
    /// The allow-list.
    list: BpfProgram,
    /// clone3 => ENOSYS, for the roles that create threads.
    clone3: Option<BpfProgram>,
}

type Compiled = Result<Vec<Programs>, FilterError>;

/// The programs of every role for `mismatch`, compiled at the first call.
fn programs(mismatch: Mismatch) -> Result<&'static [Programs], FilterError> {
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
        .map(|&role| compile_role(role, mismatch, own_pid()))
        .collect()
}

/// This process's pid, as its filters name it (`tgkill` only to its own threads).
fn own_pid() -> u32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The filters [`apply`] installs for `role` in `mode` in a process whose pid is
/// `pid` (as that process sees it), in the order it installs them: what a test
/// compares the filters the kernel holds for a thread of the daemon with.
/// Each instruction is (code, jt, jf, k).
pub fn role_programs(
    role: ThreadRole,
    mode: SeccompMode,
    pid: u32,
) -> Vec<Vec<(u16, u8, u8, u32)>> {
    let Some(mismatch) = Mismatch::of(mode) else {
        return Vec::new();
    };
    let p = compile_role(role, mismatch, pid).expect("the allow-lists compile");
    p.clone3
        .into_iter()
        .chain([p.list])
        .map(|prog| prog.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
        .collect()
}

fn compile_role(role: ThreadRole, mismatch: Mismatch, pid: u32) -> Result<Programs, FilterError> {
    Ok(Programs {
        list: compile(role, mismatch, pid)?,
        clone3: if creates_threads(role) {
            Some(clone3_enosys()?)
        } else {
            None
        },
    })
}

fn role_index(role: ThreadRole) -> usize {
    ThreadRole::ALL
        .iter()
        .position(|&r| r == role)
        .expect("every role is in ThreadRole::ALL")
}

/// The roles whose threads start threads: the launcher (every thread of the
/// daemon), and those in which library code starts threads that inherit their role
/// (the queue workers in a Worker thread), or that could (Main, Control, State).
fn creates_threads(role: ThreadRole) -> bool {
    matches!(
        role,
        ThreadRole::Main
            | ThreadRole::Worker
            | ThreadRole::Control
            | ThreadRole::State
            | ThreadRole::Launcher
    )
}

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;

#[cfg(not(target_arch = "x86_64"))]
compile_error!("the seccomp allow-lists are only written for x86_64");

/// The arguments of `args` as seccompiler rules; empty: any arguments.
fn rules(args: Args, pid: u32) -> Result<Vec<SeccompRule>, BackendError> {
    let cond = |arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, len, op, value)
    };
    let rule = SeccompRule::new;
    let one_of = |arg: u8, values: &[i32]| -> Result<Vec<SeccompRule>, BackendError> {
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
            let pid = u64::from(pid);
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
    pid: u32,
) -> Result<BTreeMap<i64, Vec<SeccompRule>>, FilterError> {
    let bit = role_bit(role);
    let filter_error = |why: String| FilterError {
        filter: format!("{role:?} filter"),
        why,
    };
    let rules = |args| rules(args, pid).map_err(|e| filter_error(e.to_string()));
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
                    if role != ThreadRole::Launcher {
                        return Err(filter_error(format!("{} is listed twice", a.name)));
                    }
                    // The union: any arguments for one role are any arguments.
                    e.get_mut().clear();
                } else {
                    e.get_mut().extend(r);
                }
            }
        }
    }
    if mismatch == Mismatch::Trap {
        map.entry(libc::SYS_prctl)
            .or_insert(rules(Args::Prctl(&[libc::PR_GET_NAME]))?);
    }
    Ok(map)
}

fn compile(role: ThreadRole, mismatch: Mismatch, pid: u32) -> Result<BpfProgram, FilterError> {
    let rules = role_rules(role, mismatch, pid)?;
    SeccompFilter::new(rules, mismatch.action(), SeccompAction::Allow, ARCH)
        .and_then(|f| f.try_into())
        .map_err(|e: BackendError| FilterError {
            filter: format!("{role:?} filter"),
            why: e.to_string(),
        })
}

/// The second filter of the thread-creating roles: clone3 gets ENOSYS (its flags
/// cannot be inspected), everything else is left to the allow-list.
fn clone3_enosys() -> Result<BpfProgram, FilterError> {
    let mut map = BTreeMap::new();
    map.insert(libc::SYS_clone3, Vec::new());
    SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        ARCH,
    )
    .and_then(|f| f.try_into())
    .map_err(|e| FilterError {
        filter: "clone3 filter".to_string(),
        why: e.to_string(),
    })
}
