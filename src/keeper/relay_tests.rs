//! Tests of the relay: a scripted frontend on one socketpair, the scripted backend
//! on another.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures};

use super::*;
use crate::keeper::testing::{backend, eventfd};
use crate::keeper::wire::{self, Header, NEED_REPLY, VERSION};

const T: Duration = Duration::from_secs(5);

/// The frontend's end and a relay to a scripted backend.
fn relay() -> (
    UnixStream,
    Relay,
    std::thread::JoinHandle<crate::keeper::testing::Seen>,
) {
    let (front, keeper_side) = UnixStream::pair().unwrap();
    let (back, seen) = backend(u64::MAX, None);
    (front, Relay::new(keeper_side, back), seen)
}

fn ask(
    front: &UnixStream,
    relay: &mut Relay,
    req: FrontendReq,
    flags: u32,
    payload: &[u8],
    fds: &[i32],
) {
    let h = Header {
        request: u32::from(req),
        flags,
        size: 0,
    };
    wire::send(front, h, payload, fds).unwrap();
    assert_eq!(relay.relay_frontend().unwrap(), Flow::Relayed);
}

#[test]
fn relays_messages_and_their_replies_and_records_them() {
    let (front, mut relay, seen) = relay();
    front.set_read_timeout(Some(T)).unwrap();
    ask(
        &front,
        &mut relay,
        FrontendReq::GET_FEATURES,
        VERSION,
        &[],
        &[],
    );
    let r = wire::recv(&front).unwrap().unwrap();
    assert!(r.header.is_reply());
    assert_eq!(r.u64(), Some(u64::MAX));
    // REPLY_ACK on: SET_PROTOCOL_FEATURES's own ack comes back.
    let p = (VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::MQ).bits();
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_PROTOCOL_FEATURES,
        VERSION | NEED_REPLY,
        &p.to_le_bytes(),
        &[],
    );
    assert_eq!(wire::recv(&front).unwrap().unwrap().u64(), Some(0));
    // Without NEED_REPLY nothing comes back, and the relay does not wait for it.
    let f = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_FEATURES,
        VERSION,
        &f.to_le_bytes(),
        &[],
    );
    // A kick fd goes through and stays recorded.
    let kick = eventfd();
    use std::os::fd::AsRawFd;
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_VRING_KICK,
        VERSION | NEED_REPLY,
        &0u64.to_le_bytes(),
        &[kick.as_raw_fd()],
    );
    assert_eq!(wire::recv(&front).unwrap().unwrap().u64(), Some(0));
    let s = relay.setup();
    assert_eq!(s.protocol_features, Some(p));
    assert_eq!(s.features, Some(f));
    assert!(s.vrings[&0].started());
    // The frontend leaves.
    drop(front);
    assert_eq!(relay.relay_frontend().unwrap(), Flow::FrontendClosed);
    drop(relay);
    let seen = seen.join().unwrap();
    let got: Vec<(FrontendReq, usize)> = seen.iter().map(|(r, _, _, n)| (*r, *n)).collect();
    assert_eq!(
        got,
        [
            (FrontendReq::GET_FEATURES, 0),
            (FrontendReq::SET_PROTOCOL_FEATURES, 0),
            (FrontendReq::SET_FEATURES, 0),
            (FrontendReq::SET_VRING_KICK, 1),
        ]
    );
}

#[test]
fn a_backend_that_goes_away_is_seen() {
    let (front, keeper_side) = UnixStream::pair().unwrap();
    let (back, gone) = UnixStream::pair().unwrap();
    let mut relay = Relay::new(keeper_side, back);
    drop(gone);
    assert_eq!(relay.relay_backend().unwrap(), Flow::BackendClosed);
    wire::send(
        &front,
        Header::request(u32::from(FrontendReq::GET_FEATURES), 0),
        &[],
        &[],
    )
    .unwrap();
    assert_eq!(relay.relay_frontend().unwrap(), Flow::BackendClosed);
}

#[test]
fn switching_backends_keeps_the_frontend_connected() {
    let (front, mut relay, old_seen) = relay();
    front.set_read_timeout(Some(T)).unwrap();
    let p = VhostUserProtocolFeatures::REPLY_ACK.bits();
    ask(
        &front,
        &mut relay,
        FrontendReq::GET_FEATURES,
        VERSION,
        &[],
        &[],
    );
    wire::recv(&front).unwrap().unwrap();
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_PROTOCOL_FEATURES,
        VERSION,
        &p.to_le_bytes(),
        &[],
    );
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_OWNER,
        VERSION,
        &[],
        &[],
    );
    let kick = eventfd();
    use std::os::fd::AsRawFd;
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_VRING_NUM,
        VERSION,
        &wire::vring_state(0, 64),
        &[],
    );
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_VRING_KICK,
        VERSION,
        &0u64.to_le_bytes(),
        &[kick.as_raw_fd()],
    );
    // The hand-over: the old process's ring stops, the new one is set up from there.
    let bases = relay.stop_rings(T).unwrap();
    assert_eq!(bases, std::collections::BTreeMap::from([(0, 100)]));
    let (new, new_seen) = backend(u64::MAX, None);
    replay::set_up(&new, relay.setup(), &bases, T).unwrap();
    replay::run(&new, &replay::start(relay.setup()), T).unwrap();
    drop(relay.switch(new));
    // The frontend goes on, now served by the new backend.
    ask(
        &front,
        &mut relay,
        FrontendReq::GET_QUEUE_NUM,
        VERSION,
        &[],
        &[],
    );
    assert_eq!(wire::recv(&front).unwrap().unwrap().u64(), Some(1));
    drop(front);
    assert_eq!(relay.relay_frontend().unwrap(), Flow::FrontendClosed);
    drop(relay);
    let old: Vec<FrontendReq> = old_seen.join().unwrap().iter().map(|s| s.0).collect();
    assert_eq!(old.last(), Some(&FrontendReq::GET_VRING_BASE));
    let new = new_seen.join().unwrap();
    let base = new
        .iter()
        .find(|s| s.0 == FrontendReq::SET_VRING_BASE)
        .unwrap();
    assert_eq!(
        base.2,
        wire::vring_state(0, 100),
        "the new process starts where the old stopped"
    );
    assert_eq!(new.last().unwrap().0, FrontendReq::GET_QUEUE_NUM);
}

/// After a session taken back from a handed-back region (cloud-hypervisor's
/// reconnect), each ring the frontend enables gets a spurious kick: the dead daemon
/// may have read the guest's last kick without popping its requests. Before that,
/// an enable kicks nothing.
#[test]
fn rings_enabled_after_a_handed_back_region_are_kicked() {
    use std::os::fd::AsRawFd;
    let kicked = |fd: &std::os::fd::OwnedFd| {
        let mut n = [0u8; 8];
        // SAFETY: a nonblocking read of 8 bytes into `n` from an eventfd we own.
        let r = unsafe {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
            libc::read(fd.as_raw_fd(), n.as_mut_ptr().cast(), 8)
        };
        r == 8 && u64::from_ne_bytes(n) > 0
    };
    let (front, mut relay, _seen) = relay();
    front.set_read_timeout(Some(T)).unwrap();
    let kick = eventfd();
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_VRING_KICK,
        VERSION,
        &0u64.to_le_bytes(),
        &[kick.as_raw_fd()],
    );
    let enable = |relay: &mut Relay| {
        ask(
            &front,
            relay,
            FrontendReq::SET_VRING_ENABLE,
            VERSION,
            &wire::vring_state(0, 1),
            &[],
        )
    };
    enable(&mut relay);
    assert!(!kicked(&kick), "no kick without a handed-back region");
    relay.nudge_when_enabled();
    // A disable kicks nothing either.
    ask(
        &front,
        &mut relay,
        FrontendReq::SET_VRING_ENABLE,
        VERSION,
        &wire::vring_state(0, 0),
        &[],
    );
    assert!(!kicked(&kick), "no kick for a disable");
    enable(&mut relay);
    assert!(kicked(&kick), "the enabled ring was kicked");
}
