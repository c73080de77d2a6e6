//! A FUSE session over a vhost-user-fs device: the hiprio queue plus N
//! request queues, like a mounted virtio-fs in a guest.

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::InitOut;

use super::ops::{FuseOps, InitParams};
use super::queue::{FuseQueue, UniqueSource};
use super::reply::Reply;
use super::request::Request;
use crate::frontend::device::{DeviceConfig, VhostUserFsDevice};
use crate::frontend::error::{Error, Result};
use crate::frontend::virtqueue::SplitQueue;

/// FUSE client: typed operations go to the current request queue, requests
/// without a reply (FORGET) go to the hiprio queue as Linux does.
pub struct FuseClient {
    hiprio: FuseQueue,
    request_queues: Vec<FuseQueue>,
    current: usize,
    init_out: Option<InitOut>,
    // Declared last so the queues (and their eventfds) go before the connection.
    device: VhostUserFsDevice,
}

impl FuseClient {
    /// Connects and sets up the device; does not send FUSE_INIT.
    pub fn connect(cfg: &DeviceConfig) -> Result<Self> {
        Self::from_device(VhostUserFsDevice::connect(cfg)?)
    }

    /// Wraps an already started device.
    pub fn from_device(mut device: VhostUserFsDevice) -> Result<Self> {
        let memory = device.memory().clone();
        let uniques = UniqueSource::default();
        let mut queues = device
            .take_queues()
            .into_iter()
            .map(|q| FuseQueue::new(q, memory.clone(), uniques.clone()));
        let hiprio = queues
            .next()
            .ok_or_else(|| Error::InvalidArgument("device has no queues".into()))?;
        let request_queues: Vec<FuseQueue> = queues.collect();
        if request_queues.is_empty() {
            return Err(Error::InvalidArgument("device has no request queue".into()));
        }
        Ok(FuseClient {
            hiprio,
            request_queues,
            current: 0,
            init_out: None,
            device,
        })
    }

    /// Connects and performs FUSE_INIT with Linux-like parameters.
    pub fn connect_and_init(cfg: &DeviceConfig) -> Result<Self> {
        let mut client = Self::connect(cfg)?;
        client.init_session(&InitParams::default())?;
        Ok(client)
    }

    /// FUSE_INIT, remembering the negotiated parameters.
    pub fn init_session(&mut self, params: &InitParams) -> Result<InitOut> {
        let out = self.init(params)?;
        self.init_out = Some(out);
        Ok(out)
    }

    /// INIT reply of this session, if INIT was done through `init_session`.
    pub fn init_out(&self) -> Option<&InitOut> {
        self.init_out.as_ref()
    }

    /// Number of request queues.
    pub fn request_queue_count(&self) -> usize {
        self.request_queues.len()
    }

    /// Request queue `i` (0-based; vhost-user queue index `i + 1`).
    pub fn request_queue(&mut self, i: usize) -> Result<&mut FuseQueue> {
        let count = self.request_queues.len();
        self.request_queues
            .get_mut(i)
            .ok_or_else(|| Error::InvalidArgument(format!("request queue {i} of {count}")))
    }

    /// The hiprio queue (vhost-user queue 0).
    pub fn hiprio_queue(&mut self) -> &mut FuseQueue {
        &mut self.hiprio
    }

    /// Sets request queue `i` up again on fresh rings, as a rebooted guest's new
    /// driver does (the old queue's requests in flight are lost).
    pub fn restart_request_queue(&mut self, i: usize, size: u16) -> Result<()> {
        let old = self.request_queue(i)?;
        let (index, uniques, timeout) = (old.index(), old.uniques(), old.timeout());
        let ring = self.device.restart_queue(index, size)?;
        let mut queue = FuseQueue::new(ring, self.device.memory().clone(), uniques);
        queue.set_timeout(timeout);
        self.request_queues[i] = queue;
        Ok(())
    }

    /// Pauses request queue `i` as a VMM pausing the VM does (SET_VRING_ENABLE 0,
    /// GET_VRING_BASE), runs `paused` meanwhile, then starts the queue again on the
    /// same rings where the backend stopped.
    pub fn pause_request_queue(&mut self, i: usize, paused: impl FnOnce()) -> Result<()> {
        let index = self.request_queue(i)?.index();
        let base = self.device.stop_queue(index)?;
        paused();
        let ring = self.request_queues[i].ring_mut();
        self.device.resume_queue(ring, base)
    }

    /// Stops every queue as a VMM stopping the VM does (SET_VRING_ENABLE 0,
    /// GET_VRING_BASE), then saves the backend's device state, as for a migration or
    /// a snapshot. The queues stay stopped.
    pub fn stop_and_save_state(&mut self) -> Result<Vec<u8>> {
        let mut indexes = vec![self.hiprio.index()];
        indexes.extend(self.request_queues.iter().map(|q| q.index()));
        for index in indexes {
            self.device.stop_queue(index)?;
        }
        self.device.save_state()
    }

    /// Live-migrates this guest to the backend of `cfg`: stops every queue at the
    /// source, saves its state, and resumes the same memory and rings on the
    /// destination, which loads the state first. The source's connection is closed
    /// (its daemon exits, as after QEMU quits). Requests in flight carry on: a
    /// completion the destination returns reaches the same queue.
    pub fn migrate_to(&mut self, cfg: &DeviceConfig) -> Result<Vec<u8>> {
        let mut bases = Vec::new();
        let mut indexes = vec![self.hiprio.index()];
        indexes.extend(self.request_queues.iter().map(|q| q.index()));
        for index in &indexes {
            bases.push(self.device.stop_queue(*index)?);
        }
        let state = self.device.save_state()?;
        let memory = self.device.memory().clone();
        let mut rings: Vec<&SplitQueue> = vec![self.hiprio.ring()];
        rings.extend(self.request_queues.iter().map(|q| q.ring()));
        let device = VhostUserFsDevice::resume_elsewhere(cfg, memory, &rings, &bases, &state)?;
        self.device = device;
        Ok(state)
    }

    /// cloud-hypervisor's reconnect after the backend was restarted on the same
    /// socket (the old connection is dropped): the same memory and rings, each from
    /// the guest's avail index, and the inflight region the old backend gave
    /// (needs `DeviceConfig::inflight` at connect).
    pub fn reconnect(&mut self, cfg: &DeviceConfig) -> Result<()> {
        let inflight = self.device.take_inflight().ok_or_else(|| {
            Error::InvalidArgument("the backend gave no inflight region at connect".into())
        })?;
        let memory = self.device.memory().clone();
        let mut rings: Vec<&SplitQueue> = vec![self.hiprio.ring()];
        rings.extend(self.request_queues.iter().map(|q| q.ring()));
        let features = self.device.features();
        self.device = VhostUserFsDevice::reconnect(cfg, memory, &rings, features, inflight)?;
        Ok(())
    }

    /// Saves the device state with request queue 0 paused, then resumes it where it
    /// stopped, as a VMM whose migration failed resumes the source.
    pub fn save_state_paused(&mut self) -> Result<Vec<u8>> {
        let index = self.request_queue(0)?.index();
        let base = self.device.stop_queue(index)?;
        let state = self.device.save_state();
        self.device.start_device_again()?;
        let ring = self.request_queues[0].ring_mut();
        self.device.resume_queue(ring, base)?;
        state
    }

    /// Loads `state` into the backend with every queue stopped, then starts them
    /// again where the backend stopped them, as a VMM restoring a snapshot into a
    /// running VM does. The queues run again whether or not the load succeeded: a
    /// refused load leaves the backend serving what it served.
    pub fn load_state_paused(&mut self, state: &[u8]) -> Result<()> {
        let mut indexes = vec![self.hiprio.index()];
        indexes.extend(self.request_queues.iter().map(|q| q.index()));
        let mut bases = Vec::new();
        for index in &indexes {
            bases.push(self.device.stop_queue(*index)?);
        }
        let loaded = self.device.load_state(state);
        self.device.start_device_again()?;
        self.device.resume_queue(self.hiprio.ring_mut(), bases[0])?;
        for (q, base) in self.request_queues.iter_mut().zip(&bases[1..]) {
            self.device.resume_queue(q.ring_mut(), *base)?;
        }
        loaded
    }

    /// Routes subsequent typed calls to request queue `i`.
    pub fn use_request_queue(&mut self, i: usize) -> Result<()> {
        self.request_queue(i)?;
        self.current = i;
        Ok(())
    }

    /// Sets the reply timeout of every queue.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.hiprio.set_timeout(timeout);
        for q in &mut self.request_queues {
            q.set_timeout(timeout);
        }
    }

    /// The control-plane connection.
    pub fn device(&mut self) -> &mut VhostUserFsDevice {
        &mut self.device
    }

    /// Splits the session so queues can be driven from different threads.
    /// Returns (device, hiprio queue, request queues).
    pub fn into_parts(self) -> (VhostUserFsDevice, FuseQueue, Vec<FuseQueue>) {
        (self.device, self.hiprio, self.request_queues)
    }

    /// Closes the vhost-user connection, like a VMM going away.
    pub fn disconnect(self) {
        drop(self);
    }
}

impl FuseOps for FuseClient {
    fn call(&mut self, request: &Request) -> Result<Reply> {
        self.request_queues[self.current].call(request)
    }

    fn call_no_reply(&mut self, request: &Request) -> Result<()> {
        self.hiprio.call_no_reply(request)
    }
}
