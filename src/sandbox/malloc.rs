//! glibc's malloc, made safe to call under the seccomp filters.
//!
//! The first time a thread finds every malloc arena busy, glibc sizes its arena
//! limit from the number of CPUs: `__get_nprocs()` opens
//! `/sys/devices/system/cpu/online`. That happens whenever contention first occurs,
//! long after the filters are on, in threads that may not open files (the
//! vhost-user thread was killed this way under load). With `M_ARENA_MAX` set, glibc
//! takes the limit from it and never asks. The same goes for the first trim of a
//! thread arena's heap (see [`settle_heap_trim`]).

use super::SandboxError;

/// Sets glibc's arena limit to its own default for this machine (8 per CPU on
/// 64-bit), computed now, before any filter. Call before the first thread starts.
pub fn fix_arena_limit() -> Result<(), SandboxError> {
    // glibc's own count (`__get_nprocs`, the online CPUs): one read of
    // /sys/devices/system/cpu/online, where available_parallelism also reads the
    // cgroup's CPU quota, a dozen system calls on the way to the socket.
    // SAFETY: sysconf only reads system information.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let cpus = usize::try_from(online).map_or(1, |n| n.max(1));
    let arenas = arena_limit(cpus);
    // SAFETY: mallopt only changes malloc's tunables; no thread allocates concurrently
    // (the caller runs before any thread starts).
    if unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) } != 1 {
        return Err(SandboxError::Mallopt { arenas });
    }
    Ok(())
}

/// The first time glibc gives back the top of a thread arena's heap (`shrink_heap`,
/// after a free of 64 KiB or more leaves more than the trim threshold free at the
/// top), it opens `/proc/sys/vm/overcommit_memory` and caches what it read
/// (`check_may_shrink_heap`). That happened at exit, when the main thread dropped the
/// inode table of a guest that held 10,000 nodes the workers had allocated: Main may
/// not open files, and `--seccomp kill` ended the daemon with SIGSYS instead of exit
/// 0. Any thread that frees what another allocated could meet it. This makes glibc
/// ask once now, in a thread of its own (so in an arena of its own), before any
/// filter; the answer is cached for the process and the children it forks.
pub fn settle_heap_trim() -> Result<(), SandboxError> {
    std::thread::Builder::new()
        .name("volfsd-malloc".into())
        .spawn(|| {
            // Each block is below the mmap threshold (128 KiB), so it comes from the
            // arena's heap, and at least 64 KiB, so its free runs heap_trim; 400 KiB
            // leave more than the trim threshold plus glibc's top pad free. The blocks
            // are never written: only malloc's chunk headers touch their pages, so
            // the daemon keeps ~4 pages of them, not 400 KiB (which, with the
            // supervisor's copy, was 230 KiB more RssAnon per daemon).
            let blocks: Vec<Vec<u8>> = (0..4).map(|_| Vec::with_capacity(100 << 10)).collect();
            drop(std::hint::black_box(blocks));
        })
        .map_err(|e| SandboxError::host("starting the malloc set-up thread", e))?
        .join()
        .map_err(|_| SandboxError::Panicked {
            thread: "malloc set-up thread",
        })
}

/// glibc's default: `NARENAS_FROM_NCORES(n)` is 8 × n on 64-bit targets.
fn arena_limit(cpus: usize) -> libc::c_int {
    libc::c_int::try_from(cpus.saturating_mul(8)).unwrap_or(libc::c_int::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_glibcs_default_and_never_overflows() {
        assert_eq!(arena_limit(2), 16);
        assert_eq!(arena_limit(usize::MAX), libc::c_int::MAX);
        fix_arena_limit().unwrap();
    }
}
