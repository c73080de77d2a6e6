//! glibc's malloc, made safe to call under the seccomp filters.
//!
//! The first time a thread finds every malloc arena busy, glibc sizes its arena
//! limit from the number of CPUs: `__get_nprocs()` opens
//! `/sys/devices/system/cpu/online`. That happens whenever contention first occurs,
//! long after the filters are on, in threads that may not open files (the
//! vhost-user thread was killed this way under load). With `M_ARENA_MAX` set, glibc
//! takes the limit from it and never asks. The same goes for the first trim of a
//! thread arena's heap (see [`settle_heap_trim`]).
//!
//! The limit is one arena: every thread allocates from the main heap. An arena per
//! thread (glibc's default, 8 per CPU) cost each idle daemon ~60 KiB of RssAnon (a
//! heap of at least two touched pages per thread that ever allocated, ten threads);
//! the request path no longer allocates for GETATTR, READ and WRITE, and each
//! thread's tcache serves the small allocations that are freed again without the
//! arena's lock (docs/PROFILING.md, "Idle density").

use super::SandboxError;

/// Sets glibc's arena limit to [`ARENAS`], before any filter. Call before the first
/// thread starts.
pub fn fix_arena_limit() -> Result<(), SandboxError> {
    let arenas = ARENAS;
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
    if ARENAS == 1 {
        // No thread arena, so no thread heap ever shrinks: nothing to settle.
        return Ok(());
    }
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

/// malloc arenas: the main one only (see the module doc).
const ARENAS: libc::c_int = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_accepted() {
        fix_arena_limit().unwrap();
    }
}
