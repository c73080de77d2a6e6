//! vhost-user control plane for a virtio-fs device, done the way a VMM does it:
//! SET_OWNER, feature and protocol-feature negotiation, SET_MEM_TABLE with the
//! guest memfd, then per queue SET_VRING_NUM/BASE/ADDR/KICK/CALL and
//! SET_VRING_ENABLE. Queue 0 is the hiprio queue, 1..=N are request queues.

mod config;
mod setup;
mod state;

use std::os::fd::AsRawFd;
use std::sync::Arc;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostUserHeaderFlag, VhostUserInflight,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::VhostBackend;

use super::dirty_log::DirtyLog;
use super::error::{Error, Result};
use super::memory::GuestMemory;
use super::virtqueue::SplitQueue;

pub use config::{
    DeviceConfig, FsConfig, NegotiatedFeatures, StateTransferTimes, VHOST_F_LOG_ALL,
    VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX,
};
use setup::{connect_with_retry, negotiate, read_fs_config, start_queue, start_queue_at};
use state::transfer_state;

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
        if let Some(preview) = &cfg.preload_state {
            transfer_state(
                &mut frontend,
                VhostTransferStateDirection::LOAD,
                Some(preview),
            )?;
        }
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

    /// A save on a socket pair holding `request` (volfsd's keeper asks so for an
    /// upgrade's preview, or the state after it: docs/UPGRADE.md), read to its end,
    /// CHECK_DEVICE_STATE. The queues are the caller's to stop first, or not.
    pub fn save_state_requesting(&mut self, request: &[u8]) -> Result<Vec<u8>> {
        use std::io::{Read, Write};
        let io = |e| Error::io("SET_DEVICE_STATE_FD SAVE: the socket pair", e);
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(io)?;
        ours.write_all(request).map_err(io)?;
        self.frontend
            .set_device_state_fd(
                VhostTransferStateDirection::SAVE,
                vhost::vhost_user::message::VhostTransferStatePhase::STOPPED,
                std::os::fd::OwnedFd::from(theirs),
            )
            .map_err(|e| Error::vhost("SET_DEVICE_STATE_FD SAVE", e))?;
        let mut out = Vec::new();
        ours.read_to_end(&mut out).map_err(io)?;
        self.frontend
            .check_device_state()
            .map_err(|e| Error::vhost("CHECK_DEVICE_STATE", e))?;
        Ok(out)
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
