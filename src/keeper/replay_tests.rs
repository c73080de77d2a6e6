//! Tests of the replay against a scripted backend on a socketpair.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};

use super::*;
use crate::keeper::testing::{backend, eventfd, msg, recorded, Seen};
use crate::keeper::wire::{self, Message};

const T: Duration = Duration::from_secs(5);

fn requests(seen: &Seen) -> Vec<FrontendReq> {
    seen.iter().map(|(r, ..)| *r).collect()
}

#[test]
fn setup_then_start_replays_the_session_in_order() {
    use FrontendReq::*;
    let protocol = VhostUserProtocolFeatures::MQ.bits();
    let s = recorded(protocol);
    let (stream, b) = backend(u64::MAX, None);
    // The old process stopped queue 1 at 57; queue 0 keeps its recorded base.
    let bases = BTreeMap::from([(1, 57)]);
    set_up(&stream, &s, &bases, T).unwrap();
    run(&stream, &start(&s), T).unwrap();
    drop(stream);
    let seen = b.join().unwrap();
    assert_eq!(
        requests(&seen),
        [
            GET_FEATURES,
            GET_PROTOCOL_FEATURES,
            SET_PROTOCOL_FEATURES,
            SET_OWNER,
            SET_FEATURES,
            SET_MEM_TABLE,
            SET_BACKEND_REQ_FD,
            SET_VRING_NUM,
            SET_VRING_BASE,
            SET_VRING_ADDR,
            SET_VRING_NUM,
            SET_VRING_BASE,
            SET_VRING_ADDR,
            SET_VRING_CALL,
            SET_VRING_KICK,
            SET_VRING_ENABLE,
            SET_VRING_CALL,
            SET_VRING_KICK,
            SET_VRING_ENABLE,
        ]
    );
    // REPLY_ACK added to what the frontend negotiated.
    let reply_ack = VhostUserProtocolFeatures::REPLY_ACK.bits();
    assert_eq!(seen[2].2, (protocol | reply_ack).to_le_bytes());
    // Every SET asks for an ack; the questions do not.
    for (req, flags, _, _) in &seen {
        let asks = matches!(req, GET_FEATURES | GET_PROTOCOL_FEATURES);
        assert_eq!(flags & wire::NEED_REPLY == 0, asks, "{req:?}");
    }
    let bases_sent: Vec<&[u8]> = seen
        .iter()
        .filter(|(r, ..)| *r == SET_VRING_BASE)
        .map(|(_, _, p, _)| p.as_slice())
        .collect();
    assert_eq!(
        bases_sent,
        [wire::vring_state(0, 0), wire::vring_state(1, 57)]
    );
    // The fds go with their messages.
    let fds: Vec<usize> = seen.iter().map(|(.., n)| *n).collect();
    assert_eq!(fds[5..7], [1, 1], "mem table, backend req fd");
    assert_eq!(fds[13..15], [1, 1], "call, kick");
}

#[test]
fn memory_slots_replay_region_by_region() {
    let slots = VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits();
    let mut s = recorded(slots);
    let mut add = 0u64.to_le_bytes().to_vec();
    add.extend(
        [0x1_0000_0000u64, 0x1000, 0x7f10_0000_0000, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes()),
    );
    s.record(msg(FrontendReq::ADD_MEM_REG, add, vec![eventfd()]));
    let steps = setup(&s, &BTreeMap::new()).unwrap();
    let adds: Vec<&Step> = steps
        .iter()
        .filter(|st| st.request == FrontendReq::ADD_MEM_REG)
        .collect();
    assert_eq!(adds.len(), 2);
    assert!(adds
        .iter()
        .all(|st| st.fds.len() == 1 && st.payload.len() == 40));
    assert!(!steps
        .iter()
        .any(|st| st.request == FrontendReq::SET_MEM_TABLE));
}

#[test]
fn stop_asks_each_running_ring_for_its_base() {
    let s = recorded(0);
    let (stream, b) = backend(u64::MAX, None);
    let replies = run(&stream, &stop(&s), T).unwrap();
    assert_eq!(bases(&replies), BTreeMap::from([(0, 100), (1, 101)]));
    drop(stream);
    assert_eq!(
        requests(&b.join().unwrap()),
        [FrontendReq::GET_VRING_BASE; 2]
    );
}

#[test]
fn a_backend_that_refuses_fails_the_replay_naming_the_message() {
    let s = recorded(0);
    let (stream, _b) = backend(u64::MAX, Some(FrontendReq::SET_MEM_TABLE));
    let e = set_up(&stream, &s, &BTreeMap::new(), T).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Refused {
                request: FrontendReq::SET_MEM_TABLE,
                code: 1
            }
        ),
        "{e}"
    );
    // Missing a protocol feature the frontend negotiated.
    let s = recorded(VhostUserProtocolFeatures::MQ.bits());
    let (stream, _b) = backend(0, None);
    let e = set_up(&stream, &s, &BTreeMap::new(), T).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Missing {
                what: "protocol features",
                ..
            }
        ),
        "{e}"
    );
    // A backend that dies.
    let (stream, theirs) = UnixStream::pair().unwrap();
    drop(theirs);
    let e = set_up(&stream, &s, &BTreeMap::new(), T).unwrap_err();
    assert!(matches!(e, Error::Closed { .. } | Error::Io { .. }), "{e}");
    // A backend that hangs.
    let (stream, _theirs) = UnixStream::pair().unwrap();
    let e = set_up(&stream, &s, &BTreeMap::new(), Duration::from_millis(20)).unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e}");
}

#[test]
fn an_unreplayable_session_is_refused_before_anything_is_sent() {
    let mut s = recorded(0);
    s.record(Message::new(0xffff, vec![]));
    assert!(matches!(
        setup(&s, &BTreeMap::new()),
        Err(Error::Unreplayable(_))
    ));
}

#[test]
fn nudge_notifies_each_running_ring_once() {
    let s = recorded(0);
    nudge(&s);
    let mut kicked = 0;
    for v in s.vrings.values() {
        let fd = v
            .kick
            .as_ref()
            .and_then(|k| k.fd.as_ref())
            .expect("a kick fd");
        let mut count = [0u8; 8];
        nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(fd), &mut count).unwrap();
        assert_eq!(u64::from_ne_bytes(count), 1);
        kicked += 1;
    }
    assert_eq!(kicked, 2);
}
