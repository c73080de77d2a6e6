//! The vhost-user messages of setting a device up: connecting, feature and
//! protocol-feature negotiation, the config space, starting a ring.

use std::io::ErrorKind;
use std::path::Path;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::VhostBackend;

use crate::frontend::error::{Error, Result};
use crate::frontend::virtqueue::SplitQueue;

use super::config::{
    DeviceConfig, FsConfig, NegotiatedFeatures, VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX,
};

/// Size of the virtio-fs config space: tag[36] + num_request_queues (le32).
const VIRTIO_FS_CONFIG_SIZE: usize = 40;
const VIRTIO_FS_TAG_LEN: usize = 36;

pub(crate) fn connect_with_retry(
    path: &Path,
    timeout: Duration,
    max_queues: u64,
) -> Result<Frontend> {
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

pub(crate) fn negotiate(frontend: &mut Frontend, cfg: &DeviceConfig) -> Result<NegotiatedFeatures> {
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

pub(crate) fn read_fs_config(frontend: &mut Frontend) -> Result<FsConfig> {
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

pub(crate) fn start_queue(frontend: &mut Frontend, queue: &SplitQueue) -> Result<()> {
    start_queue_at(frontend, queue, 0)
}

pub(crate) fn start_queue_at(frontend: &mut Frontend, queue: &SplitQueue, base: u32) -> Result<()> {
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
