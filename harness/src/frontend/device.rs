//! vhost-user control plane for a virtio-fs device, done the way a VMM does it:
//! SET_OWNER, feature and protocol-feature negotiation, SET_MEM_TABLE with the
//! guest memfd, then per queue SET_VRING_NUM/BASE/ADDR/KICK/CALL and
//! SET_VRING_ENABLE. Queue 0 is the hiprio queue, 1..=N are request queues.

use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags,
    VhostUserHeaderFlag, VhostUserInflight,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::VhostBackend;

use super::dirty_log::DirtyLog;
use super::error::{Error, Result};
use super::memory::GuestMemory;
use super::virtqueue::SplitQueue;

/// VIRTIO_F_VERSION_1: the device is a modern (virtio 1.x) device.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// VIRTIO_RING_F_EVENT_IDX: used_event/avail_event notification suppression.
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
/// VHOST_USER_F_PROTOCOL_FEATURES: protocol features can be negotiated.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// VHOST_F_LOG_ALL: the backend logs every page it writes (a live migration runs).
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;
/// Size of the virtio-fs config space: tag[36] + num_request_queues (le32).
const VIRTIO_FS_CONFIG_SIZE: usize = 40;
const VIRTIO_FS_TAG_LEN: usize = 36;

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

/// A connected, started vhost-user-fs device.
pub struct VhostUserFsDevice {
    frontend: Frontend,
    memory: Arc<GuestMemory>,
    queues: Vec<SplitQueue>,
    features: NegotiatedFeatures,
    config: Option<FsConfig>,
    last_transfer: Option<StateTransferTimes>,
    /// The inflight region the backend gave (`DeviceConfig::inflight`).
    inflight: Option<(VhostUserInflight, std::fs::File)>,
}

impl VhostUserFsDevice {
    /// Connects to the backend and brings up hiprio + `request_queues` queues.
    pub fn connect(cfg: &DeviceConfig) -> Result<Self> {
        let mut frontend = connect_with_retry(&cfg.socket_path, cfg.connect_timeout, 1)?;
        let memory = GuestMemory::new(cfg.memory_size)?;
        frontend
            .set_owner()
            .map_err(|e| Error::vhost("SET_OWNER", e))?;
        let features = negotiate(&mut frontend, cfg)?;
        let wanted_queues = u64::from(cfg.request_queues) + 1;
        if wanted_queues > features.max_queues {
            return Err(Error::InvalidArgument(format!(
                "asked for {} request queues but backend supports {} queues in total",
                cfg.request_queues, features.max_queues
            )));
        }
        let config =
            if features.acked_protocol_features & VhostUserProtocolFeatures::CONFIG.bits() != 0 {
                Some(read_fs_config(&mut frontend)?)
            } else {
                None
            };

        let mut last_transfer = None;
        if let Some(state) = &cfg.load_state {
            let (_, times) = transfer_state(
                &mut frontend,
                VhostTransferStateDirection::LOAD,
                Some(state),
            )?;
            last_transfer = Some(times);
        }
        let region = memory.region_info()?;
        frontend
            .set_mem_table(&[region])
            .map_err(|e| Error::vhost("SET_MEM_TABLE", e))?;

        let inflight = if features.acked_protocol_features
            & VhostUserProtocolFeatures::INFLIGHT_SHMFD.bits()
            != 0
        {
            let ask = VhostUserInflight::new(0, 0, wanted_queues as u16, cfg.queue_size);
            let (info, file) = frontend
                .get_inflight_fd(&ask)
                .map_err(|e| Error::vhost("GET_INFLIGHT_FD", e))?;
            frontend
                .set_inflight_fd(&info, file.as_raw_fd())
                .map_err(|e| Error::vhost("SET_INFLIGHT_FD", e))?;
            Some((info, file))
        } else {
            None
        };
        let event_idx = features.acked_features & VIRTIO_RING_F_EVENT_IDX != 0;
        let mut queues = Vec::new();
        for index in 0..wanted_queues as u16 {
            let mut queue = SplitQueue::new(&memory, index, cfg.queue_size)?;
            queue.set_event_idx(event_idx);
            start_queue(&mut frontend, &queue)?;
            queues.push(queue);
        }
        Ok(VhostUserFsDevice {
            frontend,
            memory,
            queues,
            features,
            config,
            last_transfer,
            inflight,
        })
    }

    /// cloud-hypervisor's reconnect to a backend started again on the same socket
    /// (its old connection closed), message for message as v52's
    /// `reinitialize_vhost_user` (virtio-devices/src/vhost_user/vu_common_ctrl.rs):
    /// SET_OWNER, GET_FEATURES, SET_PROTOCOL_FEATURES with the bits acked before
    /// (no GET_PROTOCOL_FEATURES), SET_FEATURES, SET_MEM_TABLE, SET_VRING_NUM of
    /// each ring, SET_INFLIGHT_FD with the region the earlier backend gave, then
    /// each ring's SET_VRING_ADDR, SET_VRING_BASE (the guest's avail index),
    /// SET_VRING_CALL and SET_VRING_KICK, then SET_VRING_ENABLE of each.
    /// `features` and `inflight` are the old device's ([`Self::features`],
    /// [`Self::take_inflight`]).
    pub fn reconnect(
        cfg: &DeviceConfig,
        memory: Arc<GuestMemory>,
        queues: &[&SplitQueue],
        features: NegotiatedFeatures,
        inflight: (VhostUserInflight, std::fs::File),
    ) -> Result<Self> {
        let mut frontend =
            connect_with_retry(&cfg.socket_path, cfg.connect_timeout, queues.len() as u64)?;
        frontend
            .set_owner()
            .map_err(|e| Error::vhost("SET_OWNER", e))?;
        frontend
            .get_features()
            .map_err(|e| Error::vhost("GET_FEATURES", e))?;
        let protocol =
            VhostUserProtocolFeatures::from_bits_truncate(features.acked_protocol_features);
        frontend
            .set_protocol_features(protocol)
            .map_err(|e| Error::vhost("SET_PROTOCOL_FEATURES", e))?;
        if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        frontend
            .set_features(features.acked_features)
            .map_err(|e| Error::vhost("SET_FEATURES", e))?;
        let region = memory.region_info()?;
        frontend
            .set_mem_table(&[region])
            .map_err(|e| Error::vhost("SET_MEM_TABLE", e))?;
        for q in queues {
            frontend
                .set_vring_num(usize::from(q.index()), q.size())
                .map_err(|e| Error::vhost("SET_VRING_NUM", e))?;
        }
        frontend
            .set_inflight_fd(&inflight.0, inflight.1.as_raw_fd())
            .map_err(|e| Error::vhost("SET_INFLIGHT_FD", e))?;
        for q in queues {
            let i = usize::from(q.index());
            let ctx = |msg: &str| format!("queue {i}: {msg}");
            frontend
                .set_vring_addr(i, &q.config_data()?)
                .map_err(|e| Error::vhost(ctx("SET_VRING_ADDR"), e))?;
            frontend
                .set_vring_base(i, q.avail_idx()?)
                .map_err(|e| Error::vhost(ctx("SET_VRING_BASE"), e))?;
            frontend
                .set_vring_call(i, q.call_eventfd())
                .map_err(|e| Error::vhost(ctx("SET_VRING_CALL"), e))?;
            frontend
                .set_vring_kick(i, q.kick_eventfd())
                .map_err(|e| Error::vhost(ctx("SET_VRING_KICK"), e))?;
        }
        for q in queues {
            frontend
                .set_vring_enable(usize::from(q.index()), true)
                .map_err(|e| Error::vhost("SET_VRING_ENABLE 1", e))?;
        }
        Ok(VhostUserFsDevice {
            frontend,
            memory,
            queues: Vec::new(),
            features,
            config: None,
            last_transfer: None,
            inflight: Some(inflight),
        })
    }

    /// The inflight region the backend gave at connect (`DeviceConfig::inflight`).
    pub fn take_inflight(&mut self) -> Option<(VhostUserInflight, std::fs::File)> {
        self.inflight.take()
    }

    /// Gives the device back an inflight region taken with [`Self::take_inflight`]
    /// (a test that looked at or changed it).
    pub fn put_inflight(&mut self, inflight: (VhostUserInflight, std::fs::File)) {
        self.inflight = Some(inflight);
    }

    /// A migration's destination VMM: connects to the backend of `cfg` (its socket,
    /// its negotiation), loads `state`, and hands it the same guest memory and the
    /// same rings, each started at its index in `bases` (what the source's
    /// GET_VRING_BASE returned), as QEMU does after a live migration. The guest's
    /// requests in flight stay where they are, in its memory and on its rings.
    pub fn resume_elsewhere(
        cfg: &DeviceConfig,
        memory: Arc<GuestMemory>,
        queues: &[&SplitQueue],
        bases: &[u32],
        state: &[u8],
    ) -> Result<Self> {
        let mut frontend = connect_with_retry(&cfg.socket_path, cfg.connect_timeout, 1)?;
        frontend
            .set_owner()
            .map_err(|e| Error::vhost("SET_OWNER", e))?;
        let features = negotiate(&mut frontend, cfg)?;
        let (_, times) = transfer_state(
            &mut frontend,
            VhostTransferStateDirection::LOAD,
            Some(state),
        )?;
        let region = memory.region_info()?;
        frontend
            .set_mem_table(&[region])
            .map_err(|e| Error::vhost("SET_MEM_TABLE", e))?;
        for (queue, base) in queues.iter().zip(bases) {
            start_queue_at(&mut frontend, queue, *base)?;
        }
        Ok(VhostUserFsDevice {
            frontend,
            memory,
            queues: Vec::new(),
            features,
            config: None,
            last_transfer: Some(times),
            inflight: None,
        })
    }

    /// The guest memory shared with the backend.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.memory
    }

    /// Negotiation results.
    pub fn features(&self) -> NegotiatedFeatures {
        self.features
    }

    /// virtio-fs config space, when the backend offers VHOST_USER_PROTOCOL_F_CONFIG.
    pub fn fs_config(&self) -> Option<&FsConfig> {
        self.config.as_ref()
    }

    /// VHOST_USER_SET_LOG_BASE with `log`'s memfd, as a VMM starting a live
    /// migration does before it turns logging on (needs `DeviceConfig::dirty_log`).
    pub fn set_log_base(&mut self, log: &DirtyLog) -> Result<()> {
        self.frontend
            .set_log_base(0, Some(log.region()))
            .map_err(|e| Error::vhost("SET_LOG_BASE", e))
    }

    /// SET_FEATURES with VHOST_F_LOG_ALL set (a migration starts) or cleared (it
    /// ended or was cancelled), the other acked features unchanged.
    pub fn set_log_all(&mut self, on: bool) -> Result<()> {
        let features = if on {
            self.features.acked_features | VHOST_F_LOG_ALL
        } else {
            self.features.acked_features & !VHOST_F_LOG_ALL
        };
        self.frontend
            .set_features(features)
            .map_err(|e| Error::vhost(format!("SET_FEATURES {features:#x}"), e))
    }

    /// Hands the queues (hiprio first) to the caller, e.g. one per worker
    /// thread. The device keeps the control connection.
    pub fn take_queues(&mut self) -> Vec<SplitQueue> {
        std::mem::take(&mut self.queues)
    }

    /// Stops a queue like a VMM does on shutdown (SET_VRING_ENABLE 0, then
    /// GET_VRING_BASE); returns the backend's next avail index.
    pub fn stop_queue(&mut self, index: u16) -> Result<u32> {
        let i = usize::from(index);
        self.frontend
            .set_vring_enable(i, false)
            .map_err(|e| Error::vhost(format!("queue {index}: SET_VRING_ENABLE 0"), e))?;
        self.frontend
            .get_vring_base(i)
            .map_err(|e| Error::vhost(format!("queue {index}: GET_VRING_BASE"), e))
    }

    /// The backend's device state (SET_DEVICE_STATE_FD SAVE over a pipe, read to its
    /// end, CHECK_DEVICE_STATE), as a VMM saves it after stopping the queues.
    pub fn save_state(&mut self) -> Result<Vec<u8>> {
        let (bytes, times) =
            transfer_state(&mut self.frontend, VhostTransferStateDirection::SAVE, None)?;
        self.last_transfer = Some(times);
        Ok(bytes)
    }

    /// Loads `state` into the backend (SET_DEVICE_STATE_FD LOAD over a pipe, then
    /// CHECK_DEVICE_STATE) on this very connection, as a VMM restoring a snapshot into
    /// a running device does (`loadvm`); the caller stopped the queues first.
    pub fn load_state(&mut self, state: &[u8]) -> Result<()> {
        let (_, times) = transfer_state(
            &mut self.frontend,
            VhostTransferStateDirection::LOAD,
            Some(state),
        )?;
        self.last_transfer = Some(times);
        Ok(())
    }

    /// How long the last successful device-state transfer took: the last
    /// [`save_state`](Self::save_state), or the load of [`DeviceConfig::load_state`]
    /// at connect.
    pub fn last_transfer(&self) -> Option<StateTransferTimes> {
        self.last_transfer
    }

    /// VHOST_USER_RESET_DEVICE, as a VMM resets the device (needs the protocol
    /// feature, acked when the backend offers it).
    pub fn reset_device(&mut self) -> Result<()> {
        self.frontend
            .reset_device()
            .map_err(|e| Error::vhost("RESET_DEVICE", e))
    }

    /// Stops queue `index` and sets it up again on fresh rings from avail index 0,
    /// as a rebooted guest's new driver does; returns the new queue.
    pub fn restart_queue(&mut self, index: u16, size: u16) -> Result<SplitQueue> {
        self.stop_queue(index)?;
        let mut queue = SplitQueue::new(&self.memory, index, size)?;
        queue.set_event_idx(self.features.acked_features & VIRTIO_RING_F_EVENT_IDX != 0);
        start_queue(&mut self.frontend, &queue)?;
        Ok(queue)
    }

    /// SET_FEATURES with the acked features again: a VMM's device start, a resume
    /// after a pause included, begins with it.
    pub fn start_device_again(&mut self) -> Result<()> {
        let features = self.features.acked_features;
        self.frontend
            .set_features(features)
            .map_err(|e| Error::vhost(format!("SET_FEATURES {features:#x}"), e))
    }

    /// Starts a stopped queue again on its own rings from avail index `base`, as a
    /// VMM resuming a paused VM does.
    pub fn resume_queue(&mut self, queue: &SplitQueue, base: u32) -> Result<()> {
        start_queue_at(&mut self.frontend, queue, base)
    }

    /// Closes the vhost-user connection (same as dropping the device).
    pub fn disconnect(self) {
        drop(self);
    }
}

/// `max_queues`: the rings the frontend may name before GET_QUEUE_NUM tells it.
fn connect_with_retry(path: &Path, timeout: Duration, max_queues: u64) -> Result<Frontend> {
    let deadline = Instant::now() + timeout;
    loop {
        // max_queue_num is only an upper bound for index checks until
        // GET_QUEUE_NUM replaces it.
        match Frontend::connect(path, max_queues) {
            Ok(frontend) => return Ok(frontend),
            Err(vhost::Error::VhostUserProtocol(vhost::vhost_user::Error::SocketConnect(e)))
                if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(Error::vhost(format!("connecting to {}", path.display()), e)),
        }
    }
}

fn negotiate(frontend: &mut Frontend, cfg: &DeviceConfig) -> Result<NegotiatedFeatures> {
    let offered = frontend
        .get_features()
        .map_err(|e| Error::vhost("GET_FEATURES", e))?;
    for (bit, name) in [
        (VIRTIO_F_VERSION_1, "VIRTIO_F_VERSION_1"),
        (
            VHOST_USER_F_PROTOCOL_FEATURES,
            "VHOST_USER_F_PROTOCOL_FEATURES",
        ),
    ] {
        if offered & bit == 0 {
            return Err(Error::bad_reply(
                "GET_FEATURES",
                format!("backend does not offer {name} (features {offered:#x})"),
            ));
        }
    }
    let offered_protocol = frontend
        .get_protocol_features()
        .map_err(|e| Error::vhost("GET_PROTOCOL_FEATURES", e))?;
    let mut wanted = VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::RESET_DEVICE
        | VhostUserProtocolFeatures::DEVICE_STATE;
    if cfg.dirty_log {
        wanted |= VhostUserProtocolFeatures::LOG_SHMFD;
    }
    if cfg.inflight {
        wanted |= VhostUserProtocolFeatures::INFLIGHT_SHMFD;
    }
    let acked_protocol = offered_protocol & wanted;
    frontend
        .set_protocol_features(acked_protocol)
        .map_err(|e| Error::vhost("SET_PROTOCOL_FEATURES", e))?;
    if acked_protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
        // From now on every control message is acknowledged, so a backend
        // that rejects one is reported at the failing message.
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    }
    let max_queues = if acked_protocol.contains(VhostUserProtocolFeatures::MQ) {
        frontend
            .get_queue_num()
            .map_err(|e| Error::vhost("GET_QUEUE_NUM", e))?
    } else {
        1
    };
    let mut acked = VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES;
    if cfg.event_idx {
        acked |= offered & VIRTIO_RING_F_EVENT_IDX;
    }
    frontend
        .set_features(acked)
        .map_err(|e| Error::vhost(format!("SET_FEATURES {acked:#x}"), e))?;
    Ok(NegotiatedFeatures {
        offered_features: offered,
        acked_features: acked,
        offered_protocol_features: offered_protocol.bits(),
        acked_protocol_features: acked_protocol.bits(),
        max_queues,
    })
}

/// One device-state transfer over a pipe: a save returns the bytes read, a load
/// writes `state`. The outcome is CHECK_DEVICE_STATE's; the times are its parts'.
fn transfer_state(
    frontend: &mut Frontend,
    direction: VhostTransferStateDirection,
    state: Option<&[u8]>,
) -> Result<(Vec<u8>, StateTransferTimes)> {
    use std::io::{Read, Write};
    let name = format!("SET_DEVICE_STATE_FD {direction:?}");
    let io = |e| Error::io(format!("{name}: the pipe"), e);
    let (mut reader, mut writer) = std::io::pipe().map_err(io)?;
    let theirs = match direction {
        VhostTransferStateDirection::SAVE => {
            std::os::fd::OwnedFd::from(writer.try_clone().map_err(io)?)
        }
        VhostTransferStateDirection::LOAD => {
            std::os::fd::OwnedFd::from(reader.try_clone().map_err(io)?)
        }
    };
    // The frontend sends our copy of the pipe's end and closes it.
    let start = Instant::now();
    let replaced = frontend
        .set_device_state_fd(direction, VhostTransferStatePhase::STOPPED, theirs)
        .map_err(|e| Error::vhost(name.clone(), e))?;
    let set_fd = start.elapsed();
    let mut out = Vec::new();
    match direction {
        VhostTransferStateDirection::SAVE => {
            drop(writer);
            match replaced {
                Some(mut f) => f.read_to_end(&mut out).map_err(io)?,
                None => reader.read_to_end(&mut out).map_err(io)?,
            };
        }
        VhostTransferStateDirection::LOAD => {
            drop(reader);
            let bytes = state.unwrap_or_default();
            match replaced {
                Some(mut f) => f.write_all(bytes).map_err(io)?,
                None => writer.write_all(bytes).map_err(io)?,
            }
            drop(writer);
        }
    }
    let data = start.elapsed() - set_fd;
    frontend
        .check_device_state()
        .map_err(|e| Error::vhost("CHECK_DEVICE_STATE", e))?;
    let times = StateTransferTimes {
        set_fd,
        data,
        check: start.elapsed() - set_fd - data,
        bytes: match direction {
            VhostTransferStateDirection::SAVE => out.len(),
            VhostTransferStateDirection::LOAD => state.map_or(0, <[u8]>::len),
        },
    };
    Ok((out, times))
}

fn read_fs_config(frontend: &mut Frontend) -> Result<FsConfig> {
    let (_, payload) = frontend
        .get_config(
            0,
            VIRTIO_FS_CONFIG_SIZE as u32,
            VhostUserConfigFlags::WRITABLE,
            &[0u8; VIRTIO_FS_CONFIG_SIZE],
        )
        .map_err(|e| Error::vhost("GET_CONFIG", e))?;
    if payload.len() != VIRTIO_FS_CONFIG_SIZE {
        return Err(Error::bad_reply(
            "GET_CONFIG",
            format!("{} bytes of config space, expected 40", payload.len()),
        ));
    }
    let tag_bytes = &payload[..VIRTIO_FS_TAG_LEN];
    let tag_end = tag_bytes
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(VIRTIO_FS_TAG_LEN);
    let mut num = [0u8; 4];
    num.copy_from_slice(&payload[VIRTIO_FS_TAG_LEN..]);
    Ok(FsConfig {
        tag: String::from_utf8_lossy(&tag_bytes[..tag_end]).into_owned(),
        num_request_queues: u32::from_le_bytes(num),
    })
}

fn start_queue(frontend: &mut Frontend, queue: &SplitQueue) -> Result<()> {
    start_queue_at(frontend, queue, 0)
}

fn start_queue_at(frontend: &mut Frontend, queue: &SplitQueue, base: u32) -> Result<()> {
    let i = usize::from(queue.index());
    let ctx = |msg: &str| format!("queue {i}: {msg}");
    frontend
        .set_vring_num(i, queue.size())
        .map_err(|e| Error::vhost(ctx("SET_VRING_NUM"), e))?;
    frontend
        .set_vring_base(i, base as u16)
        .map_err(|e| Error::vhost(ctx("SET_VRING_BASE"), e))?;
    frontend
        .set_vring_addr(i, &queue.config_data()?)
        .map_err(|e| Error::vhost(ctx("SET_VRING_ADDR"), e))?;
    frontend
        .set_vring_call(i, queue.call_eventfd())
        .map_err(|e| Error::vhost(ctx("SET_VRING_CALL"), e))?;
    frontend
        .set_vring_kick(i, queue.kick_eventfd())
        .map_err(|e| Error::vhost(ctx("SET_VRING_KICK"), e))?;
    frontend
        .set_vring_enable(i, true)
        .map_err(|e| Error::vhost(ctx("SET_VRING_ENABLE 1"), e))
}
