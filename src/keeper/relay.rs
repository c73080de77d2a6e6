//! The relay between the frontend's connection and the serving process's: each
//! frontend message is forwarded with its fds, then its reply (if it has one) is
//! forwarded back, and both are recorded in the frontend's setup (`setup.rs`).
//! vhost-user's main channel is the frontend's: the backend only answers, and one
//! message at a time, so
//! between two messages the relay is at a point where the serving process can be
//! replaced (see `replay.rs`).
//!
//! Which messages are answered is the backend's rule (vhost's backend request
//! handler): the questions and a few others always; any other only when it asks
//! (`NEED_REPLY`) and `REPLY_ACK` is on, that is, the backend offered
//! `VHOST_USER_F_PROTOCOL_FEATURES` and the frontend acked `REPLY_ACK`.
//!
//! The inflight-fd messages are the keeper's own (`handback.rs`): it offers
//! `INFLIGHT_SHMFD`, answers `GET_INFLIGHT_FD` and `SET_INFLIGHT_FD` itself, and
//! never passes the feature or the messages on (vhost-user-backend 0.22 has no
//! handler for them).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures};

use super::handback::{self, Given};
use super::replay;
use super::setup::FrontendSetup;
use super::wire::{self, Message};
use super::Error;

/// How a step of the relay ended.
#[derive(Debug, Eq, PartialEq)]
pub enum Flow {
    /// A message was relayed; the relay goes on.
    Relayed,
    /// The frontend closed its connection between messages.
    FrontendClosed,
    /// The serving process closed its end (it exited, or refused a message).
    BackendClosed,
    /// The frontend handed back a session region that is not this keeper's
    /// (`SET_INFLIGHT_FD` after the whole daemon restarted): the keeper decides
    /// ([`Relay::take_handed_back`]), then acks it ([`Relay::ack`]).
    HandedBack,
}

/// The two connections and the frontend's setup recorded from them.
pub struct Relay {
    frontend: UnixStream,
    backend: UnixStream,
    setup: FrontendSetup,
    /// The features the backend offered (GET_FEATURES), for the REPLY_ACK rule.
    offered: u64,
    /// A frontend message whose reply the backend never sent (it died meanwhile):
    /// sent again to the process that takes over, whose reply the frontend gets.
    unanswered: Option<Message>,
    /// The keeper's session region, handed to a frontend that asks for an inflight
    /// fd (None: the inflight-fd messages are passed on, as without a keeper).
    region: Option<OwnedFd>,
    /// A `SET_INFLIGHT_FD` with a region not the keeper's, and that region.
    handed_back: Option<(Message, OwnedFd)>,
    /// A session taken back from a handed-back region: each ring the frontend
    /// enables from then on gets a spurious kick ([`Relay::nudge_when_enabled`]).
    nudge_on_enable: bool,
}

impl Relay {
    pub fn new(frontend: UnixStream, backend: UnixStream) -> Relay {
        Relay {
            frontend,
            backend,
            setup: FrontendSetup::new(),
            offered: 0,
            unanswered: None,
            region: None,
            handed_back: None,
            nudge_on_enable: false,
        }
    }

    /// The session was taken back from a region an earlier daemon left (the whole
    /// daemon died; cloud-hypervisor's reconnect): the frontend sets the rings up
    /// anew, and each one it enables then gets a spurious kick, as after an
    /// upgrade or a crash ([`replay::nudge`]). The guest kicked the dead daemon for
    /// the requests in its rings, and the dead daemon may have read the kick without
    /// popping them; with EVENT_IDX the driver does not kick again for requests
    /// already in the ring, so without it the ring stalls. Costs the backend one
    /// drain of an empty ring per later enable (a pause and resume).
    pub fn nudge_when_enabled(&mut self) {
        self.nudge_on_enable = true;
    }

    /// The keeper's session region (a copy of its fd), given to a frontend on
    /// `GET_INFLIGHT_FD`, and recognised when one hands it back.
    pub fn set_region(&mut self, region: OwnedFd) {
        self.region = Some(region);
    }

    /// The region a frontend handed back and its message ([`Flow::HandedBack`]).
    pub fn take_handed_back(&mut self) -> Option<(Message, OwnedFd)> {
        self.handed_back.take()
    }

    /// Acks a message the keeper answered itself, if the frontend asked for it.
    pub fn ack(&self, msg: &Message) -> Result<(), Error> {
        if self.answered(msg) {
            wire::send(
                &self.frontend,
                wire::Header::reply_to(msg.header),
                &0u64.to_le_bytes(),
                &[],
            )?;
        }
        Ok(())
    }

    pub fn frontend(&self) -> &UnixStream {
        &self.frontend
    }

    pub fn backend(&self) -> &UnixStream {
        &self.backend
    }

    pub fn setup(&self) -> &FrontendSetup {
        &self.setup
    }

    /// Relays one message from the frontend (which has one ready, or the step
    /// blocks until it has) and its reply.
    pub fn relay_frontend(&mut self) -> Result<Flow, Error> {
        let Some(msg) = wire::recv(&self.frontend)? else {
            return Ok(Flow::FrontendClosed);
        };
        self.pass_on(msg)
    }

    /// Forwards `msg` from the frontend, then its reply if it has one, and records
    /// both. A backend that is gone keeps the message unanswered.
    fn pass_on(&mut self, mut msg: Message) -> Result<Flow, Error> {
        if let Some(region) = &self.region {
            use FrontendReq::*;
            match FrontendReq::try_from(msg.header.request) {
                Ok(GET_INFLIGHT_FD) => {
                    log::info!(
                        "keeper: the frontend asked for an inflight region (GET_INFLIGHT_FD): \
                         given the session region; a daemon started again after this one died \
                         gets the guest's session back when the frontend hands it over"
                    );
                    let payload = handback::get_reply(&msg.payload);
                    let fd = std::os::fd::AsRawFd::as_raw_fd(region);
                    wire::send(
                        &self.frontend,
                        wire::Header::reply_to(msg.header),
                        &payload,
                        &[fd],
                    )?;
                    return Ok(Flow::Relayed);
                }
                Ok(SET_INFLIGHT_FD) => {
                    return match handback::given(region, &mut msg) {
                        Given::Ours => self.ack(&msg).map(|()| Flow::Relayed),
                        Given::Other(fd) => {
                            self.handed_back = Some((msg, fd));
                            Ok(Flow::HandedBack)
                        }
                        Given::Unusable(why) => {
                            log::warn!("keeper: SET_INFLIGHT_FD: {why}: ignored");
                            self.ack(&msg).map(|()| Flow::Relayed)
                        }
                    };
                }
                // Acked by the frontend for the keeper, not the serving process.
                Ok(SET_PROTOCOL_FEATURES) => {
                    let acked = msg.u64().unwrap_or(0);
                    let inflight = handback::strip(&mut msg);
                    log::debug!(
                        "keeper: the frontend acked protocol features {acked:#x} (INFLIGHT_SHMFD: {})",
                        if inflight { "yes" } else { "no" }
                    );
                }
                _ => {}
            }
        }
        match wire::forward(&self.backend, &msg) {
            Ok(()) => {}
            Err(Error::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) =>
            {
                self.unanswered = Some(msg);
                return Ok(Flow::BackendClosed);
            }
            Err(e) => return Err(e),
        }
        if self.answered(&msg) {
            let reply = match wire::recv(&self.backend) {
                Ok(Some(reply)) => reply,
                Ok(None) => {
                    self.unanswered = Some(msg);
                    return Ok(Flow::BackendClosed);
                }
                Err(Error::Io { source, .. })
                    if source.raw_os_error() == Some(libc::ECONNRESET) =>
                {
                    self.unanswered = Some(msg);
                    return Ok(Flow::BackendClosed);
                }
                Err(e) => return Err(e),
            };
            if msg.header.request == u32::from(FrontendReq::GET_FEATURES) {
                self.offered = reply.u64().unwrap_or(0);
            }
            self.setup.record_reply(msg.header.request, &reply);
            let mut reply = reply;
            if self.region.is_some()
                && msg.header.request == u32::from(FrontendReq::GET_PROTOCOL_FEATURES)
            {
                handback::offer(&mut reply);
            }
            wire::forward(&self.frontend, &reply)?;
        }
        let enabled = (self.nudge_on_enable
            && msg.header.request == u32::from(FrontendReq::SET_VRING_ENABLE))
        .then(|| msg.vring_state())
        .flatten()
        .filter(|&(_, enable)| enable == 1);
        self.setup.record(msg);
        if let Some((index, _)) = enabled {
            self.setup.nudge(index);
        }
        Ok(Flow::Relayed)
    }

    /// The backend has something to read while no request is outstanding: its end
    /// closed (or, against the protocol, it sent a message, which is passed on).
    pub fn relay_backend(&mut self) -> Result<Flow, Error> {
        match wire::recv(&self.backend)? {
            None => Ok(Flow::BackendClosed),
            Some(msg) => {
                log::warn!(
                    "keeper: the serving process sent request {} unasked; passed on",
                    msg.header.request
                );
                wire::forward(&self.frontend, &msg)?;
                Ok(Flow::Relayed)
            }
        }
    }

    /// Whether the backend answers `msg` (see the module doc).
    fn answered(&self, msg: &Message) -> bool {
        let Ok(req) = FrontendReq::try_from(msg.header.request) else {
            return false;
        };
        use FrontendReq::*;
        match req {
            GET_FEATURES
            | GET_PROTOCOL_FEATURES
            | GET_QUEUE_NUM
            | GET_VRING_BASE
            | GET_CONFIG
            | GET_INFLIGHT_FD
            | GET_MAX_MEM_SLOTS
            | GET_SHARED_OBJECT
            | GET_SHMEM_CONFIG
            | SET_LOG_BASE
            | SET_DEVICE_STATE_FD
            | CHECK_DEVICE_STATE
            | POSTCOPY_ADVISE => true,
            _ => {
                // SET_PROTOCOL_FEATURES turns REPLY_ACK on for its own ack.
                let protocol = match req {
                    SET_PROTOCOL_FEATURES => msg.u64().unwrap_or(0),
                    _ => self.setup.protocol_features.unwrap_or(0),
                };
                let reply_ack = self.offered & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
                    != 0
                    && protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0;
                reply_ack && msg.header.needs_reply()
            }
        }
    }

    /// Stops the serving process's running rings (as a frontend stops a device) and
    /// returns where each stopped: the bases a new process continues from. Not
    /// recorded: the frontend still believes them running.
    pub fn stop_rings(&self, timeout: Duration) -> Result<BTreeMap<u32, u32>, Error> {
        let replies = replay::run(&self.backend, &replay::stop(&self.setup), timeout)?;
        Ok(replay::bases(&replies))
    }

    /// Starts the rings again on the serving process, from `bases`: after a
    /// hand-over that failed, the old process serves on.
    pub fn restart_rings(
        &self,
        bases: &BTreeMap<u32, u32>,
        timeout: Duration,
    ) -> Result<(), Error> {
        let mut steps = replay::rings(&self.setup, bases);
        steps.extend(replay::start(&self.setup));
        replay::run(&self.backend, &steps, timeout)?;
        replay::nudge(&self.setup);
        Ok(())
    }

    /// From here on the relay talks to `backend`, already set up by the replay;
    /// returns the old one.
    pub fn switch(&mut self, backend: UnixStream) -> UnixStream {
        std::mem::replace(&mut self.backend, backend)
    }

    /// Sends the frontend's message the dead backend did not answer to the one that
    /// took over (after [`Self::switch`]); its reply goes to the frontend.
    pub fn resend_unanswered(&mut self) -> Result<Flow, Error> {
        match self.unanswered.take() {
            Some(msg) => self.pass_on(msg),
            None => Ok(Flow::Relayed),
        }
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
