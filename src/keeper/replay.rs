//! Replaying the frontend's recorded setup into a new serving process, as the frontend set it
//! up, so that it continues where the old one was: the same features, the same guest memory,
//! the same vrings and eventfds. Each vring starts where the old process stopped (its
//! `next_avail`, answered by `GET_VRING_BASE`); the used index the new process takes
//! from the guest's used ring itself when the ring's address is set.
//!
//! The keeper is the frontend here: it negotiates `REPLY_ACK` (vhost-user-backend
//! always offers it) and sends every message that has no reply of its own with
//! `NEED_REPLY`, so it knows each one was applied before the next, and which one a
//! backend refused. The replies are the keeper's, never forwarded.
//!
//! In two parts, with the device state loaded in between: [`setup`] (features,
//! memory, vring sizes, bases and addresses) and [`start`] (eventfds and enables: the
//! rings run from here).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};

use super::setup::{slot_fd, FrontendSetup};
use super::wire::{self, Header, Message, NEED_REPLY, VERSION};
use super::Error;

/// What a replayed message is answered with.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Answer {
    /// A reply of its own (a question, `SET_LOG_BASE`).
    Reply,
    /// The acknowledgement `NEED_REPLY` asks for: a u64, 0 for success.
    Ack,
}

/// One message to replay. Its fds are the recorded setup's: the step must not outlive it.
#[derive(Debug)]
pub struct Step {
    pub request: FrontendReq,
    pub payload: Vec<u8>,
    pub fds: Vec<RawFd>,
    pub answer: Answer,
}

impl Step {
    fn ask(request: FrontendReq) -> Step {
        Step {
            request,
            payload: Vec::new(),
            fds: Vec::new(),
            answer: Answer::Reply,
        }
    }

    fn set(request: FrontendReq, payload: Vec<u8>, fds: Vec<RawFd>) -> Step {
        Step {
            request,
            payload,
            fds,
            answer: Answer::Ack,
        }
    }

    fn header(&self) -> Header {
        let flags = match self.answer {
            Answer::Ack => VERSION | NEED_REPLY,
            Answer::Reply => VERSION,
        };
        Header {
            request: u32::from(self.request),
            flags,
            size: self.payload.len() as u32,
        }
    }
}

/// The handshake, the memory and each vring up to its address; `bases` (from the old
/// process) override the recorded bases.
pub fn setup(recorded: &FrontendSetup, bases: &BTreeMap<u32, u32>) -> Result<Vec<Step>, Error> {
    if let Some(why) = recorded.unreplayable {
        return Err(Error::Unreplayable(why));
    }
    let reply_ack = VhostUserProtocolFeatures::REPLY_ACK.bits();
    let protocol = recorded.protocol_features.unwrap_or(0) | reply_ack;
    let mut steps = vec![
        Step::ask(FrontendReq::GET_FEATURES),
        Step::ask(FrontendReq::GET_PROTOCOL_FEATURES),
        Step::set(
            FrontendReq::SET_PROTOCOL_FEATURES,
            protocol.to_le_bytes().to_vec(),
            vec![],
        ),
    ];
    if recorded.owner {
        steps.push(Step::set(FrontendReq::SET_OWNER, vec![], vec![]));
    }
    if let Some(f) = recorded.features {
        steps.push(Step::set(
            FrontendReq::SET_FEATURES,
            f.to_le_bytes().to_vec(),
            vec![],
        ));
    }
    steps.extend(memory(recorded));
    if let Some(log) = &recorded.log_base {
        steps.push(Step {
            answer: Answer::Reply,
            ..Step::set(FrontendReq::SET_LOG_BASE, log.payload.clone(), fds(&log.fd))
        });
    }
    if let Some(fd) = &recorded.backend_req_fd {
        steps.push(Step::set(
            FrontendReq::SET_BACKEND_REQ_FD,
            vec![],
            vec![fd.as_raw_fd()],
        ));
    }
    if let Some(c) = &recorded.config {
        steps.push(Step::set(FrontendReq::SET_CONFIG, c.clone(), vec![]));
    }
    steps.extend(rings(recorded, bases));
    Ok(steps)
}

fn fds(fd: &Option<std::os::fd::OwnedFd>) -> Vec<RawFd> {
    fd.iter().map(AsRawFd::as_raw_fd).collect()
}

/// The guest memory: region by region where the frontend negotiated memory slots,
/// else one table.
fn memory(recorded: &FrontendSetup) -> Vec<Step> {
    let slots = VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits();
    if recorded.regions.is_empty() {
        return Vec::new();
    }
    if recorded.has_protocol(slots) {
        return recorded
            .regions
            .iter()
            .map(|r| {
                let mut p = 0u64.to_le_bytes().to_vec();
                r.encode(&mut p);
                Step::set(FrontendReq::ADD_MEM_REG, p, vec![r.fd.as_raw_fd()])
            })
            .collect();
    }
    let mut p = (recorded.regions.len() as u64).to_le_bytes().to_vec();
    recorded.regions.iter().for_each(|r| r.encode(&mut p));
    let fds = recorded.regions.iter().map(|r| r.fd.as_raw_fd()).collect();
    vec![Step::set(FrontendReq::SET_MEM_TABLE, p, fds)]
}

/// Each vring's size, base and address.
pub fn rings(recorded: &FrontendSetup, bases: &BTreeMap<u32, u32>) -> Vec<Step> {
    let mut steps = Vec::new();
    for (&i, v) in &recorded.vrings {
        if let Some(num) = v.num {
            steps.push(Step::set(
                FrontendReq::SET_VRING_NUM,
                wire::vring_state(i, num),
                vec![],
            ));
        }
        if let Some(base) = bases.get(&i).copied().or(v.base) {
            steps.push(Step::set(
                FrontendReq::SET_VRING_BASE,
                wire::vring_state(i, base),
                vec![],
            ));
        }
        if let Some(addr) = &v.addr {
            steps.push(Step::set(FrontendReq::SET_VRING_ADDR, addr.clone(), vec![]));
        }
    }
    steps
}

/// Each vring's eventfds, then its enable: the rings run.
pub fn start(recorded: &FrontendSetup) -> Vec<Step> {
    let mut steps = Vec::new();
    for (&i, v) in &recorded.vrings {
        for (req, slot) in [
            (FrontendReq::SET_VRING_CALL, &v.call),
            (FrontendReq::SET_VRING_ERR, &v.err),
            (FrontendReq::SET_VRING_KICK, &v.kick),
        ] {
            if let Some(s) = slot {
                steps.push(Step::set(req, s.value.to_le_bytes().to_vec(), slot_fd(s)));
            }
        }
        if let Some(on) = v.enabled {
            steps.push(Step::set(
                FrontendReq::SET_VRING_ENABLE,
                wire::vring_state(i, u32::from(on)),
                vec![],
            ));
        }
    }
    steps
}

/// A spurious notification on each running vring, once its rings run: a kick the
/// guest sent during the hand-over may have been taken by the old process, and with
/// EVENT_IDX the driver does not kick again for the requests already in the ring.
/// Costs the backend one drain of an empty ring.
pub fn nudge(recorded: &FrontendSetup) {
    for v in recorded.vrings.values() {
        if let Some(fd) = v.kick.as_ref().and_then(|s| s.fd.as_ref()) {
            let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
        }
    }
}

/// The stop of each running vring: `GET_VRING_BASE`, whose replies are the bases.
pub fn stop(recorded: &FrontendSetup) -> Vec<Step> {
    recorded
        .started()
        .map(|i| Step {
            payload: wire::vring_state(i, 0),
            ..Step::ask(FrontendReq::GET_VRING_BASE)
        })
        .collect()
}

/// Sends each step and waits for its answer (at most `timeout` each); returns the
/// replies of the steps answered by a reply of their own, in order.
pub fn run(stream: &UnixStream, steps: &[Step], timeout: Duration) -> Result<Vec<Message>, Error> {
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| Error::io("setting a read timeout", e))?;
    let mut replies = Vec::new();
    for step in steps {
        wire::send(stream, step.header(), &step.payload, &step.fds)?;
        let reply = wire::recv(stream)?.ok_or(Error::Closed {
            during: step.request,
        })?;
        if !reply.header.is_reply() || reply.header.request != u32::from(step.request) {
            return Err(Error::Unexpected {
                during: step.request,
                got: reply.header.request,
            });
        }
        match step.answer {
            Answer::Ack => match reply.u64() {
                Some(0) => {}
                code => {
                    return Err(Error::Refused {
                        request: step.request,
                        code: code.unwrap_or(u64::MAX),
                    })
                }
            },
            Answer::Reply => replies.push(reply),
        }
    }
    stream
        .set_read_timeout(None)
        .map_err(|e| Error::io("clearing the read timeout", e))?;
    Ok(replies)
}

/// [`setup`] run on `stream`: also checks that the new backend offers every feature
/// the frontend negotiated (a backend of another version may not).
pub fn set_up(
    stream: &UnixStream,
    recorded: &FrontendSetup,
    bases: &BTreeMap<u32, u32>,
    timeout: Duration,
) -> Result<(), Error> {
    let steps = setup(recorded, bases)?;
    // The two questions first: a missing feature is named before a SET refuses it.
    let (ask, rest) = steps.split_at(2);
    let replies = run(stream, ask, timeout)?;
    let offered = |i: usize| replies.get(i).and_then(Message::u64).unwrap_or(0);
    for (i, (what, wanted)) in [
        ("features", recorded.features),
        ("protocol features", recorded.protocol_features),
    ]
    .into_iter()
    .enumerate()
    {
        let missing = wanted.unwrap_or(0) & !offered(i);
        if missing != 0 {
            return Err(Error::Missing {
                what,
                bits: missing,
            });
        }
    }
    run(stream, rest, timeout).map(drop)
}

/// Waits until a new serving process answers (`GET_FEATURES`): it has started,
/// confined itself and accepted the keeper.
pub fn ready(stream: &UnixStream, timeout: Duration) -> Result<(), Error> {
    run(stream, &[Step::ask(FrontendReq::GET_FEATURES)], timeout).map(drop)
}

/// The bases the replies to [`stop`] answered, by vring.
pub fn bases(replies: &[Message]) -> BTreeMap<u32, u32> {
    replies.iter().filter_map(Message::vring_state).collect()
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
