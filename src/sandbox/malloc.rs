//! glibc's malloc, made safe to call under the seccomp filters.
//!
//! The first time a thread finds every malloc arena busy, glibc sizes its arena
//! limit from the number of CPUs: `__get_nprocs()` opens
//! `/sys/devices/system/cpu/online`. That happens whenever contention first occurs,
//! long after the filters are on, in threads that may not open files (the
//! vhost-user thread was killed this way under load). With `M_ARENA_MAX` set, glibc
//! takes the limit from it and never asks. With one arena there is no thread arena
//! heap either, so glibc never shrinks one: its first shrink opened
//! `/proc/sys/vm/overcommit_memory` (`check_may_shrink_heap`), which once ended the
//! daemon with SIGSYS at exit, when Main freed the inode table the workers had
//! allocated.
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
