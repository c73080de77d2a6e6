//! FUSE_INIT: the protocol version and the features both sides use.
//!
//! Answered here rather than by fuse-backend-rs's `Server`, whose reply is otherwise
//! the same: its `FsOptions` (0.14) stops at the flags of FUSE 7.33 and drops every
//! bit it does not know, so a feature newer than that can be neither seen nor
//! granted through it. The one volfsd needs is `FUSE_DIRECT_IO_ALLOW_MMAP` (Linux
//! 6.6): with `cache=none` every file is opened with `FOPEN_DIRECT_IO`, and without
//! this flag the guest refuses `mmap(MAP_SHARED)` of such a file with ENODEV.
//!
//! fuse-backend-rs's `Server` then keeps its default protocol version (7.33) for its
//! own compatibility choices; the only one, a LOOKUP reply for minors before 4, no
//! guest that speaks virtio-fs (7.31 and later) can meet.

use std::io;
use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{
    FsOptions, InitIn, InitIn2, InitOut, KERNEL_MINOR_VERSION, KERNEL_VERSION,
};
use fuse_backend_rs::api::filesystem::FileSystem;
use log::info;
use vm_memory::ByteValued;

/// The guest may map a direct-I/O file shared; its page cache then holds the mapped
/// pages, written back with WRITE requests (`include/uapi/linux/fuse.h`, 7.39).
pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;

/// Features volfsd grants beyond what `FsOptions` can name, when the guest offers
/// them.
const GRANTED_BEYOND_FS_OPTIONS: u64 = DIRECT_IO_ALLOW_MMAP;

/// Replies of protocol minors before 5 and before 23 are shorter (fuse.h's
/// FUSE_COMPAT_INIT_OUT_SIZE and FUSE_COMPAT_22_INIT_OUT_SIZE).
const COMPAT_OUT_SIZE: usize = 8;
const COMPAT_22_OUT_SIZE: usize = 24;
/// fuse-backend-rs's limits, kept so that the reply matches its own.
const MAX_PAGES: u16 = 256;
const MIN_MAX_WRITE: u32 = 8192 - 0x1000;

/// What an INIT negotiated, as the device state keeps it.
pub use crate::state::format::FuseSession;

/// The body of the reply to an INIT whose body (after the header) is `body`, and the
/// session it negotiated (None for a reply that only asks the guest to retry with our
/// major version), or the errno to answer with.
pub fn reply_body<F: FileSystem>(
    fs: &F,
    body: &[u8],
) -> Result<(Vec<u8>, Option<FuseSession>), i32> {
    let init = body
        .get(..size_of::<InitIn>())
        .and_then(InitIn::from_slice)
        .copied()
        .ok_or(libc::EINVAL)?;
    if init.major < KERNEL_VERSION {
        return Err(libc::EPROTO);
    }
    if init.major > KERNEL_VERSION {
        // The guest retries with our major version.
        let out = InitOut {
            major: KERNEL_VERSION,
            minor: KERNEL_MINOR_VERSION,
            ..Default::default()
        };
        return Ok((out.as_slice().to_vec(), None));
    }
    let mut offered = u64::from(init.flags);
    if offered & FsOptions::INIT_EXT.bits() != 0 {
        let ext = body
            .get(size_of::<InitIn>()..size_of::<InitIn>() + size_of::<InitIn2>())
            .and_then(InitIn2::from_slice)
            .ok_or(libc::EINVAL)?;
        offered |= u64::from(ext.flags2) << 32;
    }
    let enabled = negotiate(fs, offered)?;
    let mut out = InitOut {
        major: KERNEL_VERSION,
        minor: KERNEL_MINOR_VERSION,
        max_readahead: init.max_readahead,
        flags: enabled as u32,
        max_background: u16::MAX,
        congestion_threshold: (u16::MAX / 4) * 3,
        max_write: MIN_MAX_WRITE,
        time_gran: 1,
        flags2: (enabled >> 32) as u32,
        ..Default::default()
    };
    if enabled & (FsOptions::BIG_WRITES | FsOptions::MAX_PAGES).bits() != 0 {
        out.max_write = u32::from(MAX_PAGES) * page_size();
    }
    if enabled & FsOptions::MAX_PAGES.bits() != 0 {
        out.max_pages = MAX_PAGES;
    }
    info!(
        "FUSE INIT {}.{}: offered {offered:#x}, enabled {enabled:#x}",
        init.major, init.minor
    );
    let len = match init.minor {
        m if m < 5 => COMPAT_OUT_SIZE,
        m if m < 23 => COMPAT_22_OUT_SIZE,
        _ => size_of::<InitOut>(),
    };
    let session = FuseSession {
        minor: init.minor,
        offered,
        granted: enabled,
    };
    Ok((out.as_slice()[..len].to_vec(), Some(session)))
}

/// The flags granted for the guest's `offered` ones: what `fs` wants of them, and
/// the features beyond `FsOptions`. Also what a loaded device state replays, so that
/// the stack is set up (POSIX ACLs, say) as the guest's INIT left it.
pub fn negotiate<F: FileSystem>(fs: &F, offered: u64) -> Result<u64, i32> {
    let capable = FsOptions::from_bits_truncate(offered);
    let wanted = fs.init(capable).map_err(|e| errno_of(&e))?;
    let mut enabled = (capable & wanted).bits();
    // Beyond FsOptions: only with the extended flags, where the guest reads them.
    if enabled & FsOptions::INIT_EXT.bits() != 0 {
        enabled |= offered & GRANTED_BEYOND_FS_OPTIONS;
    }
    Ok(enabled)
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn page_size() -> u32 {
    // SAFETY: sysconf only reads system information.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file system that wants what a passthrough share wants of these.
    struct Wants(FsOptions);

    impl FileSystem for Wants {
        type Inode = u64;
        type Handle = u64;

        fn init(&self, _capable: FsOptions) -> io::Result<FsOptions> {
            Ok(self.0)
        }
    }

    fn wants() -> Wants {
        Wants(FsOptions::INIT_EXT | FsOptions::MAX_PAGES | FsOptions::ASYNC_READ)
    }

    fn request(minor: u32, flags: u64) -> Vec<u8> {
        let mut body = InitIn {
            major: 7,
            minor,
            max_readahead: 1 << 17,
            flags: flags as u32,
        }
        .as_slice()
        .to_vec();
        let ext = InitIn2 {
            flags2: (flags >> 32) as u32,
            unused: [0; 11],
        };
        body.extend_from_slice(ext.as_slice());
        body
    }

    fn reply(fs: &Wants, body: &[u8]) -> InitOut {
        let (bytes, _) = reply_body(fs, body).unwrap();
        let mut out = InitOut::default();
        out.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
        out
    }

    fn flags_of(out: &InitOut) -> u64 {
        u64::from(out.flags) | u64::from(out.flags2) << 32
    }

    #[test]
    fn shared_mmap_of_direct_io_files_is_granted_when_the_guest_offers_it() {
        let offered = FsOptions::INIT_EXT.bits()
            | FsOptions::MAX_PAGES.bits()
            | FsOptions::ASYNC_READ.bits()
            | DIRECT_IO_ALLOW_MMAP;
        let out = reply(&wants(), &request(41, offered));
        assert_eq!(flags_of(&out), offered);
        assert_eq!(out.max_pages, MAX_PAGES);
        assert_eq!(out.max_write, u32::from(MAX_PAGES) * page_size());
        assert_eq!((out.major, out.minor), (7, KERNEL_MINOR_VERSION));
    }

    #[test]
    fn nothing_is_granted_that_the_guest_did_not_offer() {
        let offered = FsOptions::INIT_EXT.bits() | FsOptions::ASYNC_READ.bits();
        let out = reply(&wants(), &request(41, offered));
        assert_eq!(flags_of(&out), offered);
        assert_eq!(out.max_pages, 0);
        // Without the extended flags the guest never reads flags2: nothing there.
        let out = reply(&wants(), &request(41, DIRECT_IO_ALLOW_MMAP | 1));
        assert_eq!(flags_of(&out), 1);
    }

    #[test]
    fn old_and_new_protocol_versions_get_the_replies_they_expect() {
        assert_eq!(reply_body(&wants(), &request(4, 0)).unwrap().0.len(), 8);
        assert_eq!(reply_body(&wants(), &request(22, 0)).unwrap().0.len(), 24);
        assert_eq!(
            reply_body(&wants(), &request(33, 0)).unwrap().0.len(),
            size_of::<InitOut>()
        );
        let mut newer = request(0, 0);
        newer[..4].copy_from_slice(&8u32.to_ne_bytes());
        let out = reply(&wants(), &newer);
        assert_eq!(
            (out.major, out.minor, out.flags),
            (7, KERNEL_MINOR_VERSION, 0)
        );
        let mut older = request(0, 0);
        older[..4].copy_from_slice(&6u32.to_ne_bytes());
        assert_eq!(reply_body(&wants(), &older), Err(libc::EPROTO));
    }

    #[test]
    fn a_short_init_is_refused() {
        assert_eq!(reply_body(&wants(), &[0; 8]), Err(libc::EINVAL));
        let ext_missing = &request(41, FsOptions::INIT_EXT.bits())[..size_of::<InitIn>()];
        assert_eq!(reply_body(&wants(), ext_missing), Err(libc::EINVAL));
    }
}
