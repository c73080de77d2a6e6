//! Guest memory and vrings as the daemon maps them, every region with its
//! dirty-page log.

use vhost_user_backend::VringRwLock;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use super::dirty_log::LogBitmap;

/// Guest memory as the daemon maps it. Every region carries a dirty-page log
/// ([`LogBitmap`]): empty until the frontend sends SET_LOG_BASE for a migration,
/// then every write through vm-memory (a READ's data and every reply through
/// fuse-backend-rs's `VirtioFsWriter`, the used ring through `add_used`) sets the
/// bits of the pages it touched, so the frontend copies them again.
///
/// vhost-user-backend 0.22 gives a log only to the regions that exist at
/// SET_LOG_BASE: a region added or replaced later (SET_MEM_TABLE, ADD_MEM_REG)
/// gets an empty one until the next SET_LOG_BASE, and the daemon's writes to it are
/// not logged. cloud-hypervisor sends SET_LOG_BASE again at every dirty-log round,
/// which covers them. QEMU sends it on a memory map change only when the log has to
/// grow, but it refuses memory hot-plug while a migration runs (`device_add` fails,
/// virtio-mem answers plug requests busy), so as far as its sources read, no region
/// appears mid-migration there. A frontend that did add one would get replies
/// written there unlogged: fixing that needs vhost-user-backend to re-apply the
/// last log to new regions. With CONFIGURE_MEM_SLOTS (offered) a change adds or
/// removes only its own region; a whole new SET_MEM_TABLE would drop every log.
pub type GuestMmap = GuestMemoryMmap<LogBitmap>;
pub type GuestMem = GuestMemoryAtomic<GuestMmap>;
/// A queue's vring as vhost-user-backend keeps it, over [`GuestMem`].
pub type Vring = VringRwLock<GuestMem>;

/// A queue's vring, locked: taken with `vring.get_mut()` and held while the ring and
/// the buffers of its chains are written.
pub type Locked<'a> = std::sync::RwLockWriteGuard<'a, vhost_user_backend::VringState<GuestMem>>;

/// A vring over 4 MiB of guest memory, queue of 256 at 0x1000/0x2000 (tests).
#[cfg(test)]
pub(crate) fn test_vring() -> Vring {
    use vhost_user_backend::VringT;
    use vm_memory::GuestAddress;
    let mem = GuestMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
    let vring = Vring::new(GuestMemoryAtomic::new(mem), 256).unwrap();
    vring.set_queue_size(256);
    vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
    vring
}
