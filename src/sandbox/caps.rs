//! Capabilities, per thread.
//!
//! Linux keeps capability sets per thread, and a thread inherits its creator's. So
//! each thread role keeps only what its own work needs (see [`kept`]): the queue
//! workers keep the file-ownership capabilities the guest's requests use, the control
//! thread keeps the two that attaching a volume uses, every other thread keeps none.
//! Process-wide, before any thread is spawned, the bounding, inheritable and ambient
//! sets are cleared and `no_new_privs` is set ([`lock_down_process`]).

use std::io;

use super::{SandboxError, ThreadRole};

/// Capability numbers (linux/capability.h).
pub const CAP_CHOWN: u32 = 0;
pub const CAP_DAC_OVERRIDE: u32 = 1;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_FOWNER: u32 = 3;
pub const CAP_FSETID: u32 = 4;
pub const CAP_SETGID: u32 = 6;
pub const CAP_SETUID: u32 = 7;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_MKNOD: u32 = 27;
pub const CAP_SETFCAP: u32 = 31;

/// A capability set as a bit mask.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct CapSet(pub u64);

impl CapSet {
    pub const EMPTY: CapSet = CapSet(0);

    pub fn of(caps: &[u32]) -> CapSet {
        CapSet(caps.iter().fold(0, |m, c| m | (1u64 << c)))
    }

    pub fn union(self, other: CapSet) -> CapSet {
        CapSet(self.0 | other.0)
    }

    #[cfg(test)]
    pub fn contains(self, cap: u32) -> bool {
        self.0 & (1u64 << cap) != 0
    }
}

/// The capabilities a thread of `role` keeps, and why:
/// - queue workers serve the guest's requests as the guest's user would be served by
///   a root-owned file system: `CHOWN` (SETATTR uid/gid, files created for another
///   user), `DAC_OVERRIDE` (root's access to every file of a volume), `FOWNER` (chmod,
///   utimes and xattrs on files the daemon does not own), `FSETID` (keep set-id bits
///   on write and chmod), `SETUID`/`SETGID` (setfsuid/setfsgid to create files as the
///   guest's caller), `MKNOD` (guest MKNOD of device nodes, which the nodev mounts
///   make unopenable), `SETFCAP` (`security.capability` with --xattr), and
///   `SYS_ADMIN` only with --allow-privileged-xattrs (`trusted.*`), and
///   `DAC_READ_SEARCH` only with --inode-file-handles=prefer|mandatory
///   (`open_by_handle_at` of a node kept by file handle).
/// - the control thread attaches volumes: `SYS_ADMIN` (open_tree clone and
///   mount_setattr of the volume's private nodev,nosuid[,ro] mount) and
///   `DAC_READ_SEARCH` (reach the volume's directory whatever its mode).
/// - lock waiters open the lock file of a node: `DAC_READ_SEARCH` only with
///   --inode-file-handles=prefer|mandatory (`open_by_handle_at`), else none.
/// - the state thread finds a loaded session's files again and reopens them as the
///   guest had them, whatever their modes: `DAC_OVERRIDE`, `DAC_READ_SEARCH` (walk
///   any directory of a volume; `open_by_handle_at` of a state's file handles, each
///   checked to lead inside its volume), `FOWNER` (`O_NOATIME` of a file the daemon
///   does not own).
/// - the vhost-user thread, the signal and log threads need none.
pub fn kept(role: ThreadRole, privileged_xattrs: bool, file_handles: bool) -> CapSet {
    match role {
        ThreadRole::Worker => {
            let mut set = CapSet::of(&[
                CAP_CHOWN,
                CAP_DAC_OVERRIDE,
                CAP_FOWNER,
                CAP_FSETID,
                CAP_SETUID,
                CAP_SETGID,
                CAP_MKNOD,
                CAP_SETFCAP,
            ]);
            if privileged_xattrs {
                set.0 |= 1u64 << CAP_SYS_ADMIN;
            }
            if file_handles {
                set.0 |= 1u64 << CAP_DAC_READ_SEARCH;
            }
            set
        }
        ThreadRole::Control => CapSet::of(&[CAP_SYS_ADMIN, CAP_DAC_READ_SEARCH]),
        ThreadRole::State => CapSet::of(&[CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER]),
        ThreadRole::LockWaiter if file_handles => CapSet::of(&[CAP_DAC_READ_SEARCH]),
        ThreadRole::Main
        | ThreadRole::LockWaiter
        | ThreadRole::Signals
        | ThreadRole::Logger
        | ThreadRole::Supervisor => CapSet::EMPTY,
        // It uses none; it holds every role's permitted (sandbox::confine_thread).
        ThreadRole::Launcher => CapSet::EMPTY,
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// This thread's effective and permitted sets.
pub fn current() -> io::Result<(CapSet, CapSet)> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData structs for version 3.
    let ret = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| CapSet(lo as u64 | (hi as u64) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
    ))
}

/// Reduces this thread's effective and permitted sets to `keep` (intersected with what
/// it has), and clears its inheritable set. Only ever lowers: a thread cannot gain.
pub fn restrict_thread(keep: CapSet) -> io::Result<()> {
    let (_, permitted) = current()?;
    let set = CapSet(keep.0 & permitted.0);
    set_thread(set, set)
}

/// Reduces this thread's permitted set to `permitted` and its effective set to
/// `effective` (each intersected with what it has).
pub fn restrict_thread_to(effective: CapSet, permitted: CapSet) -> io::Result<()> {
    let (_, has) = current()?;
    let permitted = CapSet(permitted.0 & has.0);
    set_thread(CapSet(effective.0 & permitted.0), permitted)
}

/// Sets this thread's effective and permitted sets (capset on the calling thread).
fn set_thread(effective: CapSet, permitted: CapSet) -> io::Result<()> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: effective.0 as u32,
            permitted: permitted.0 as u32,
            inheritable: 0,
        },
        CapData {
            effective: (effective.0 >> 32) as u32,
            permitted: (permitted.0 >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: capset reads two CapData structs for version 3; pid 0 is this thread.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Capabilities taken out of this thread's effective set for as long as it lives,
/// its permitted set untouched: on drop they are raised again. Used around one host
/// call that must be decided without them (a translated caller's xattr change).
pub struct EffectiveLowered {
    dropped: CapSet,
}

impl EffectiveLowered {
    /// Lowers `caps` where the thread has them effective; None when it has none.
    pub fn lower(caps: CapSet) -> io::Result<Option<EffectiveLowered>> {
        let (effective, permitted) = current()?;
        let dropped = CapSet(effective.0 & caps.0);
        if dropped == CapSet::EMPTY {
            return Ok(None);
        }
        set_thread(CapSet(effective.0 & !dropped.0), permitted)?;
        Ok(Some(EffectiveLowered { dropped }))
    }
}

impl Drop for EffectiveLowered {
    fn drop(&mut self) {
        // Only the dropped capabilities are raised again, onto whatever the set is
        // now: an fsuid switched back in between has raised its own set already.
        if let Ok((effective, permitted)) = current() {
            let _ = set_thread(
                CapSet((effective.0 | self.dropped.0) & permitted.0),
                permitted,
            );
        }
    }
}

/// Process-wide lock-down, done in the main thread before it spawns any other (every
/// thread inherits these): clears the ambient set and the bounding set (so no execve
/// could ever regain a capability), and sets `no_new_privs`.
pub fn lock_down_process() -> Result<(), SandboxError> {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) < 0
        {
            let e = io::Error::last_os_error();
            // Kernels before 4.3 have no ambient set: nothing to clear.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(SandboxError::host("clearing the ambient capability set", e));
            }
        }
        let last = last_cap();
        for cap in 0..=last {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) < 0 {
                let e = io::Error::last_os_error();
                // EINVAL: a capability this kernel does not know.
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(SandboxError::host(
                        format!("dropping capability {cap} from the bounding set"),
                        e,
                    ));
                }
            }
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
            return Err(SandboxError::host(
                "prctl(PR_SET_NO_NEW_PRIVS)",
                io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// The highest capability number this kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_keep_what_their_work_needs() {
        let w = kept(ThreadRole::Worker, false, false);
        assert!(w.contains(CAP_CHOWN) && w.contains(CAP_SETUID) && w.contains(CAP_MKNOD));
        assert!(!w.contains(CAP_SYS_ADMIN));
        assert!(kept(ThreadRole::Worker, true, false).contains(CAP_SYS_ADMIN));
        assert!(!w.contains(CAP_DAC_READ_SEARCH), "only with file handles");
        assert!(kept(ThreadRole::Worker, false, true).contains(CAP_DAC_READ_SEARCH));
        let c = kept(ThreadRole::Control, false, false);
        assert_eq!(c, CapSet::of(&[CAP_SYS_ADMIN, CAP_DAC_READ_SEARCH]));
        assert_eq!(kept(ThreadRole::LockWaiter, true, false), CapSet::EMPTY);
        assert_eq!(kept(ThreadRole::Main, true, false), CapSet::EMPTY);
    }

    #[test]
    fn a_thread_restricts_only_itself() {
        let before = current().unwrap();
        let (eff, perm) = std::thread::spawn(|| {
            restrict_thread(CapSet::of(&[CAP_CHOWN])).unwrap();
            current().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(eff.0 & !CapSet::of(&[CAP_CHOWN]).0, 0);
        assert_eq!(perm.0 & !CapSet::of(&[CAP_CHOWN]).0, 0);
        assert_eq!(current().unwrap(), before, "other threads keep their sets");
    }

    #[test]
    fn lowered_capabilities_come_back_and_only_they() {
        std::thread::spawn(|| {
            let (eff, perm) = current().unwrap();
            if !eff.contains(CAP_SYS_ADMIN) || !eff.contains(CAP_CHOWN) {
                return; // not root: nothing to lower
            }
            {
                let _lowered = EffectiveLowered::lower(CapSet::of(&[CAP_SYS_ADMIN])).unwrap();
                let (now, now_perm) = current().unwrap();
                assert!(!now.contains(CAP_SYS_ADMIN) && now.contains(CAP_CHOWN));
                assert_eq!(now_perm, perm, "permitted untouched");
            }
            assert_eq!(current().unwrap(), (eff, perm));
            assert!(EffectiveLowered::lower(CapSet::EMPTY).unwrap().is_none());
        })
        .join()
        .unwrap();
    }
}
