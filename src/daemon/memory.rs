//! Memory that set-up leaves behind and serving never touches again, given back
//! before the daemon serves: an idle daemon's RssAnon is what a platform running
//! hundreds of them pays for.

/// Below this much under the caller's frame the main thread's stack is kept: the
/// calls that follow set-up (confinement, accepting the frontend, the join) fault
/// their pages back in anyway; this only spares the next few.
const STACK_MARGIN: usize = 8 << 10;

/// Gives back the main thread's stack pages below the current frame and the pages
/// malloc holds free. The command line's parsing and the file-system stack's build
/// went ~100 KiB deep into the main stack, and the kernel keeps a stack's pages
/// resident once touched; the heap keeps pages of what set-up freed. Call on the
/// main thread, at the end of set-up, before its seccomp filter (mincore).
pub fn give_back_setup_memory() {
    release_stack_below_here(STACK_MARGIN);
    // SAFETY: malloc_trim only returns free pages to the kernel (madvise, brk).
    unsafe { libc::malloc_trim(0) };
}

/// MADV_DONTNEED of the calling thread's stack pages from the lowest one mapped up to
/// `margin` below this function's frame: everything there is dead (the stack grows
/// down and the callers' frames are above), and reads as zeros if ever used again.
/// The lowest page is found with mincore, which fails on the unmapped guard gap
/// below the stack: no other mapping is ever touched.
#[inline(never)]
fn release_stack_below_here(margin: usize) {
    let here = 0u8;
    let here = std::hint::black_box(&here) as *const u8 as usize;
    // SAFETY: sysconf only reads system information.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let Some(top) = here.checked_sub(margin).map(|a| a & !(page - 1)) else {
        return;
    };
    let mut low = top;
    let mut resident = 0u8;
    // SAFETY: mincore only reports on the page at `low - page` (ENOMEM once it is not
    // mapped); it writes one byte into `resident`.
    while low > page
        && unsafe { libc::mincore((low - page) as *mut libc::c_void, page, &mut resident) } == 0
    {
        low -= page;
    }
    if low < top {
        // SAFETY: [low, top) lies below the calling frame in this thread's stack
        // mapping (found page by page above), holding no live data.
        unsafe { libc::madvise(low as *mut libc::c_void, top - low, libc::MADV_DONTNEED) };
    }
}
