//! What a device is set up with ([`DeviceConfig`]) and what it got: the negotiated
//! features, the virtio-fs config space, a state transfer's times.

use std::path::PathBuf;
use std::time::Duration;

/// VIRTIO_F_VERSION_1: the device is a modern (virtio 1.x) device.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// VIRTIO_RING_F_EVENT_IDX: used_event/avail_event notification suppression.
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
/// VHOST_USER_F_PROTOCOL_FEATURES: protocol features can be negotiated.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// VHOST_F_LOG_ALL: the backend logs every page it writes (a live migration runs).
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;

/// How to set up the device.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Path of the backend's listening vhost-user socket.
    pub socket_path: PathBuf,
    /// Guest memory size in bytes (multiple of 4096).
    pub memory_size: u64,
    /// Number of request queues to set up (the hiprio queue is always set up).
    pub request_queues: u16,
    /// Entries per virtqueue (power of two).
    pub queue_size: u16,
    /// Negotiate VIRTIO_RING_F_EVENT_IDX if the backend offers it.
    pub event_idx: bool,
    /// Ack VHOST_USER_PROTOCOL_F_LOG_SHMFD if the backend offers it, as a VMM that
    /// may migrate does (then [`VhostUserFsDevice::set_log_base`] works).
    pub dirty_log: bool,
    /// Ack VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD if the backend offers it, and at
    /// connect ask for the inflight region (GET_INFLIGHT_FD with size 0) and set it
    /// (SET_INFLIGHT_FD), as cloud-hypervisor does; then
    /// [`VhostUserFsDevice::reconnect`] hands it back to a restarted backend.
    pub inflight: bool,
    /// How long to keep retrying while the socket does not exist or refuses.
    pub connect_timeout: Duration,
    /// A device state to load before the memory table and the queues are set up, as
    /// a migration's destination VMM does (SET_DEVICE_STATE_FD LOAD, then
    /// CHECK_DEVICE_STATE).
    pub load_state: Option<Vec<u8>>,
    /// Loaded before [`Self::load_state`] the same way: an upgrade's preview, as
    /// volfsd's keeper has the new serving process preload it (docs/UPGRADE.md).
    pub preload_state: Option<Vec<u8>>,
}

impl DeviceConfig {
    /// Defaults: 128 MiB of memory, one request queue of 256 entries.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        DeviceConfig {
            socket_path: socket_path.into(),
            memory_size: 128 << 20,
            request_queues: 1,
            queue_size: 256,
            event_idx: false,
            dirty_log: false,
            inflight: false,
            connect_timeout: Duration::from_secs(10),
            load_state: None,
            preload_state: None,
        }
    }
}

/// What the backend offered and what was acked.
#[derive(Clone, Copy, Debug)]
pub struct NegotiatedFeatures {
    pub offered_features: u64,
    pub acked_features: u64,
    pub offered_protocol_features: u64,
    pub acked_protocol_features: u64,
    /// GET_QUEUE_NUM result (1 if the backend lacks MQ).
    pub max_queues: u64,
}

/// The virtio-fs config space, if the backend supports GET_CONFIG.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsConfig {
    pub tag: String,
    pub num_request_queues: u32,
}

/// How long the parts of one device-state transfer took, as the frontend saw them.
#[derive(Clone, Copy, Debug, Default)]
pub struct StateTransferTimes {
    /// SET_DEVICE_STATE_FD sent until its reply.
    pub set_fd: Duration,
    /// The reply until the pipe was read to its end (save) or written whole (load).
    pub data: Duration,
    /// CHECK_DEVICE_STATE sent until its reply (the backend's outcome).
    pub check: Duration,
    /// Bytes moved through the pipe.
    pub bytes: usize,
}

impl StateTransferTimes {
    /// SET_DEVICE_STATE_FD sent until CHECK_DEVICE_STATE answered.
    pub fn total(&self) -> Duration {
        self.set_fd + self.data + self.check
    }
}
