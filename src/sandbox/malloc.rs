//! glibc's malloc, made safe to call under the seccomp filters.
//!
//! The first time a thread finds every malloc arena busy, glibc sizes its arena
//! limit from the number of CPUs: `__get_nprocs()` opens
//! `/sys/devices/system/cpu/online`. That happens whenever contention first occurs,
//! long after the filters are on, in threads that may not open files (the
//! vhost-user thread was killed this way under load). With `M_ARENA_MAX` set, glibc
//! takes the limit from it and never asks.

/// Sets glibc's arena limit to its own default for this machine (8 per CPU on
/// 64-bit), computed now, before any filter. Call before the first thread starts.
pub fn fix_arena_limit() -> Result<(), String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let arenas = arena_limit(cpus);
    // SAFETY: mallopt only changes malloc's tunables; no thread allocates concurrently
    // (the caller runs before any thread starts).
    if unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) } != 1 {
        return Err(format!("mallopt(M_ARENA_MAX, {arenas}) failed"));
    }
    Ok(())
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
