//! A vhost-user-fs frontend: plays the VMM and the guest kernel's virtio-fs driver.
//! Used by the integration tests and the load generator.
//!
//! Layers, bottom up:
//! - [`memory`]: memfd-backed guest RAM shared with the backend, with an allocator.
//! - [`virtqueue`]: the driver side of a split virtqueue in that memory.
//! - [`device`]: the vhost-user control plane (features, mem table, vrings).
//! - [`dirty_log`]: the dirty-page log of a live migration.
//! - [`fuse`]: FUSE requests/replies over the request queues.

pub mod device;
pub mod dirty_log;
pub mod error;
pub mod fuse;
pub mod memory;
pub mod virtqueue;

pub use device::{
    DeviceConfig, FsConfig, NegotiatedFeatures, StateTransferTimes, VhostUserFsDevice,
};
pub use dirty_log::DirtyLog;
pub use error::{Error, Result};
pub use fuse::{FuseClient, FuseOps, FuseQueue, InitParams, RawChain, Request};
pub use memory::{GuestBuffer, GuestMemory};
pub use virtqueue::{Segment, SplitQueue, UsedElement};
