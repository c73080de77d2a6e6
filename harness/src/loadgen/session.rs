//! A connected session: the device, the hiprio queue and the request queues with
//! their slots, after FUSE_INIT.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::driver::SlotQueue;
use super::{Error, LgResult, Options, LARGE_BLOCK};
use crate::frontend::fuse::UniqueSource;
use crate::frontend::{DeviceConfig, FuseOps, FuseQueue, InitParams, VhostUserFsDevice};

/// A connected session: hiprio queue + request queues with slots.
pub(super) struct Session {
    pub(super) _device: VhostUserFsDevice,
    pub(super) hiprio: Mutex<FuseQueue>,
    pub(super) queues: Vec<SlotQueue>,
    pub(super) max_write: u32,
}

impl Session {
    pub(super) fn connect(opts: &Options) -> LgResult<Self> {
        let payload = LARGE_BLOCK;
        let slots = opts.qd + 1;
        let per_queue = slots as u64 * (payload as u64 + 2 * 4096 + 256);
        let memory_size =
            (u64::from(opts.queues) * per_queue + (16 << 20)).div_ceil(2 << 20) * (2 << 20);
        let cfg = DeviceConfig {
            socket_path: opts.socket.clone(),
            memory_size,
            request_queues: opts.queues,
            queue_size: 1024,
            event_idx: true,
            dirty_log: false,
            inflight: false,
            connect_timeout: Duration::from_secs(10),
            load_state: None,
            preload_state: None,
        };
        let mut device = VhostUserFsDevice::connect(&cfg).map_err(Error::step("connecting"))?;
        let memory = device.memory().clone();
        let uniques = UniqueSource::default();
        let mut qs = device.take_queues().into_iter();
        let hiprio = FuseQueue::new(
            qs.next().ok_or(Error::NoQueue)?,
            memory.clone(),
            uniques.clone(),
        );
        let mut queues = Vec::new();
        for q in qs {
            queues.push(
                SlotQueue::new(q, &memory, uniques.clone(), slots, payload)
                    .map_err(Error::step("setting up request queue"))?,
            );
        }
        let init = queues[0]
            .init(&InitParams::default())
            .map_err(Error::step("FUSE_INIT"))?;
        // 1 MiB workloads use min(1 MiB, max_write), as the guest would split.
        let max_write = init.max_write.max(4096);
        Ok(Session {
            _device: device,
            hiprio: Mutex::new(hiprio),
            queues,
            max_write,
        })
    }

    pub(super) fn forget_all(&self, forgets: HashMap<u64, u64>) -> LgResult<()> {
        forget_batch(&self.hiprio, forgets)
    }
}

pub(super) fn forget_batch(hiprio: &Mutex<FuseQueue>, forgets: HashMap<u64, u64>) -> LgResult<()> {
    let list: Vec<(u64, u64)> = forgets.into_iter().collect();
    let mut q = hiprio.lock().expect("hiprio lock");
    for chunk in list.chunks(256) {
        q.batch_forget(chunk).map_err(Error::step("BATCH_FORGET"))?;
    }
    Ok(())
}
