//! What lets a serving process be replaced under a running guest after it was
//! killed: the session region it shares with its keeper and its successors
//! (`region.rs`). The transport records in it the requests in flight
//! (`device/inflight.rs`), the file system what the guest holds (`fs/journal/`).
//! See docs/UPGRADE.md.

pub mod region;

use std::sync::OnceLock;

use region::Region;

static REGION: OnceLock<Region> = OnceLock::new();

/// This process's session region, if it has a keeper.
pub fn region() -> Option<&'static Region> {
    REGION.get()
}

/// Sets this process's session region, once, at start; returns it.
pub fn set_region(region: Region) -> &'static Region {
    let _ = REGION.set(region);
    REGION.get().expect("just set")
}
