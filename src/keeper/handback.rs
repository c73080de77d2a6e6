//! cloud-hypervisor's own route back to a restarted backend:
//! `VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`. The frontend asks the backend for a
//! shared region at activation (`GET_INFLIGHT_FD`), keeps its fd, and when the
//! backend's socket closes it reconnects to a backend started again on the same
//! path and hands the region back (`SET_INFLIGHT_FD`) before it sets the rings up.
//!
//! The keeper answers both itself, with its session region (`src/region/`):
//! the rings' requests in flight and the journal of what the guest holds, kept
//! there as they change. So when the whole daemon died (the keeper killed, the
//! node's launcher restarting it), the region the frontend hands back lets the new
//! daemon's keeper serve the guest's session on, as after the crash of a serving
//! process (`takeover.rs`). Its own region is recognised by its inode and changes
//! nothing; a region that is not one of this layout is ignored (logged).
//!
//! Neither the feature nor the messages reach the serving process:
//! vhost-user-backend 0.22 has no handler for them.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use vhost::vhost_user::message::VhostUserProtocolFeatures;

use super::wire::Message;
use crate::region::REGION_LEN;

const INFLIGHT_SHMFD: u64 = VhostUserProtocolFeatures::INFLIGHT_SHMFD.bits();
/// `VhostUserInflight`: mmap_size u64, mmap_offset u64, num_queues u16,
/// queue_size u16, padded to 24 bytes.
const INFLIGHT_LEN: usize = 24;

/// `GET_PROTOCOL_FEATURES`'s reply: the serving process's features, and
/// `INFLIGHT_SHMFD`, which the keeper provides.
pub fn offer(reply: &mut Message) {
    if let Some(features) = reply.u64() {
        reply.payload = (features | INFLIGHT_SHMFD).to_le_bytes().to_vec();
    }
}

/// `SET_PROTOCOL_FEATURES` as the serving process gets it: without
/// `INFLIGHT_SHMFD`, which it never offered. Returns whether the frontend acked it.
pub fn strip(msg: &mut Message) -> bool {
    let Some(features) = msg.u64() else {
        return false;
    };
    msg.payload = (features & !INFLIGHT_SHMFD).to_le_bytes().to_vec();
    features & INFLIGHT_SHMFD != 0
}

/// `GET_INFLIGHT_FD`'s reply payload (the fd is the region's): the whole region, at
/// offset 0, for the queues the frontend named. Whatever size the frontend asked
/// (cloud-hypervisor asks 0), the region is the keeper's layout.
pub fn get_reply(request: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; INFLIGHT_LEN];
    out[..8].copy_from_slice(&(REGION_LEN as u64).to_le_bytes());
    if let Some(queues) = request.get(16..20) {
        out[16..20].copy_from_slice(queues);
    }
    out
}

/// What a `SET_INFLIGHT_FD` hands the keeper.
#[derive(Debug)]
pub enum Given {
    /// The keeper's own region (cloud-hypervisor sets what it got at activation).
    Ours,
    /// Another region: an earlier daemon's, handed back after a restart.
    Other(OwnedFd),
    /// No fd, or not a memfd of the region's size at offset 0.
    Unusable(String),
}

/// Sorts out the region `msg` hands over (its fd is taken out of `msg`).
pub fn given(ours: &OwnedFd, msg: &mut Message) -> Given {
    let Some(fd) = msg.fds.pop().filter(|_| msg.fds.is_empty()) else {
        return Given::Unusable("not one fd".into());
    };
    let offset = msg
        .payload
        .get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    if offset != Some(0) {
        return Given::Unusable(format!("a region at offset {offset:?}, not 0"));
    }
    let stat = |fd: std::os::fd::BorrowedFd| {
        nix::sys::stat::fstat(fd.as_raw_fd()).map(|s| (s.st_dev, s.st_ino))
    };
    match (stat(ours.as_fd()), stat(fd.as_fd())) {
        (Ok(a), Ok(b)) if a == b => Given::Ours,
        (_, Ok(_)) => Given::Other(fd),
        (_, Err(e)) => Given::Unusable(format!("fstat: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keeper::wire::Message;
    use vhost::vhost_user::message::FrontendReq;

    fn memfd() -> OwnedFd {
        nix::sys::memfd::memfd_create(c"t", nix::sys::memfd::MemFdCreateFlag::empty()).unwrap()
    }

    fn set_inflight(fd: OwnedFd, offset: u64) -> Message {
        let mut payload = 4096u64.to_le_bytes().to_vec();
        payload.extend_from_slice(&offset.to_le_bytes());
        payload.extend_from_slice(&[2, 0, 0, 1, 0, 0, 0, 0]);
        let mut m = Message::new(u32::from(FrontendReq::SET_INFLIGHT_FD), payload);
        m.fds.push(fd);
        m
    }

    #[test]
    fn the_feature_is_offered_to_the_frontend_and_kept_from_the_serving_process() {
        let mut reply = Message::new(1, 0x8u64.to_le_bytes().to_vec());
        offer(&mut reply);
        assert_eq!(reply.u64(), Some(0x8 | INFLIGHT_SHMFD));
        assert!(strip(&mut reply), "the frontend acked it");
        assert_eq!(reply.u64(), Some(0x8));
        assert!(!strip(&mut reply), "not acked twice");
    }

    #[test]
    fn the_reply_names_the_whole_region_for_the_queues_asked() {
        let mut req = vec![0u8; 24];
        req[16..20].copy_from_slice(&[2, 0, 0, 1]);
        let r = get_reply(&req);
        assert_eq!(r.len(), 24);
        assert_eq!(
            u64::from_le_bytes(r[..8].try_into().unwrap()),
            REGION_LEN as u64
        );
        assert_eq!(&r[8..16], &[0; 8]);
        assert_eq!(&r[16..20], &[2, 0, 0, 1]);
    }

    #[test]
    fn its_own_region_another_and_an_unusable_one_are_told_apart() {
        let ours = memfd();
        let again = ours.try_clone().unwrap();
        assert!(matches!(
            given(&ours, &mut set_inflight(again, 0)),
            Given::Ours
        ));
        assert!(matches!(
            given(&ours, &mut set_inflight(memfd(), 0)),
            Given::Other(_)
        ));
        assert!(matches!(
            given(&ours, &mut set_inflight(memfd(), 8)),
            Given::Unusable(_)
        ));
        let mut none = set_inflight(memfd(), 0);
        none.fds.clear();
        assert!(matches!(given(&ours, &mut none), Given::Unusable(_)));
    }
}
