//! The connection keeper (`--upgradable`): a relay that holds the frontend's
//! vhost-user connection and sits between it and the serving process, so that the
//! serving process can be replaced under a running VM without the frontend seeing a
//! disconnect. See docs/UPGRADE.md.
//!
//! - `wire.rs`: vhost-user message framing with fds;
//! - `setup.rs`: what the frontend set up, recorded as it is relayed;
//! - `replay.rs`: that setup replayed into a new serving process;
//! - `relay.rs`: the relay between the two streams;
//! - `process.rs`: where the keeper runs: the fork (the serving process's parent);
//! - `event_loop.rs`: the keeper's loop: signals, the channel, the relay;
//! - `serving.rs`: the serving processes it starts, adopts and reaps;
//! - `private_socket.rs`: the socket each of them accepts the keeper on;
//! - `takeover.rs`: a new serving process takes over: after a crash, for an
//!   upgrade, from a session region the frontend handed back;
//! - `upgrade.rs`: an upgrade's hand-over, the device state moved as in a
//!   migration (SIGHUP to the keeper), and the binary it runs;
//! - `channel.rs`: the serving process asks the keeper for one (`PUT /upgrade`);
//! - `crash.rs`: a serving process that crashed: replaced, or a crash loop;
//! - `handback.rs`: the session region handed to the frontend and back
//!   (`INFLIGHT_SHMFD`);
//! - `testing.rs`, `replay_tests.rs`, `relay_tests.rs`: tests and their helpers.

pub mod channel;
pub mod crash;
mod event_loop;
pub mod handback;
mod private_socket;
pub mod process;
pub mod relay;
pub mod replay;
mod serving;
pub mod setup;
mod takeover;
#[cfg(test)]
mod testing;
pub mod upgrade;
pub mod wire;

use std::fmt;
use std::io;

use vhost::vhost_user::message::FrontendReq;

use crate::region::RegionError;
use crash::Ending;
use setup::Unrecorded;
use upgrade::Refusal;

/// What went wrong in the keeper, with what it was doing.
#[derive(Debug)]
pub enum Error {
    /// A system call failed.
    Io {
        what: &'static str,
        source: io::Error,
    },
    /// A stream ended inside a message.
    Truncated { what: &'static str },
    /// A message larger than vhost-user allows.
    TooLarge { request: u32, size: u32 },
    /// More fds than one message may carry.
    TooManyFds,
    /// The peer did not answer in time.
    Timeout,
    /// The peer closed the stream while an answer to `during` was awaited.
    Closed { during: FrontendReq },
    /// The peer answered something else than the reply to `during`.
    Unexpected { during: FrontendReq, got: u32 },
    /// The backend refused a replayed message (its ack was not 0).
    Refused { request: FrontendReq, code: u64 },
    /// The new backend does not offer feature bits the frontend negotiated.
    Missing { what: &'static str, bits: u64 },
    /// The frontend's recorded setup cannot be replayed: the message it could not follow.
    Unreplayable(Unrecorded),
    /// No binary to start a new serving process from (not found at start).
    NoBinary,
    /// A NUL byte in what a new serving process would be exec'd with.
    Nul { what: &'static str },
    /// An upgrade asked for while no frontend is connected.
    NoFrontend,
    /// `ctl upgrade --binary PATH`: a binary the keeper does not run, and why.
    Binary(Refusal),
    /// The session region: a step on it failed.
    Region {
        step: &'static str,
        source: RegionError,
    },
    /// A new serving process could not be started (or connected to).
    Start(Box<Error>),
    /// A new serving process the keeper gave up on: why, and how it ended if it
    /// ended by itself (it exited at once, it refused the state).
    GaveUp {
        why: Box<Error>,
        ending: Option<Ending>,
    },
}

impl Error {
    pub fn io(what: &'static str, source: io::Error) -> Error {
        Error::Io { what, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { what, source } => write!(f, "{what}: {source}"),
            Error::Truncated { what } => write!(f, "the stream ended inside a message's {what}"),
            Error::TooLarge { request, size } => {
                write!(
                    f,
                    "request {request}: a payload of {size} bytes is too large"
                )
            }
            Error::TooManyFds => write!(f, "a message with too many fds"),
            Error::Timeout => write!(f, "no answer in time"),
            Error::Closed { during } => {
                write!(f, "the backend closed the connection at {during:?}")
            }
            Error::Unexpected { during, got } => {
                write!(f, "waiting for the reply to {during:?}, got request {got}")
            }
            Error::Refused { request, code } => {
                write!(f, "the backend refused {request:?} (answer {code})")
            }
            Error::Missing { what, bits } => {
                write!(
                    f,
                    "the new backend lacks {what} the frontend negotiated: {bits:#x}"
                )
            }
            Error::Unreplayable(why) => write!(f, "the frontend's setup cannot be replayed: {why}"),
            Error::NoBinary => write!(f, "the daemon's binary was not found when it started"),
            Error::Nul { what } => write!(f, "a NUL in {what}"),
            Error::NoFrontend => write!(f, "no frontend is connected (nothing to hand over)"),
            Error::Binary(why) => write!(f, "{why}"),
            Error::Region { step, source } => write!(f, "{step}: {source}"),
            Error::Start(e) => write!(f, "starting the new serving process: {e}"),
            Error::GaveUp { why, ending: None } => write!(f, "{why}"),
            Error::GaveUp {
                why,
                ending: Some(how),
            } => write!(f, "{why} (the new serving process {how})"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    // The words users see: `ctl upgrade`'s reply and the keeper's log lines, which
    // harness/tests/upgradable.rs, crash_recovery.rs and docs/UPGRADE.md quote.
    #[test]
    fn what_each_error_says() {
        let io = || io::Error::from_raw_os_error(libc::ENOENT);
        let cases: Vec<(Error, &str)> =
            vec![
            (Error::NoFrontend, "no frontend is connected (nothing to hand over)"),
            (
                Error::NoBinary,
                "the daemon's binary was not found when it started",
            ),
            (
                Error::Nul {
                    what: "an argument",
                },
                "a NUL in an argument",
            ),
            (
                Error::Unreplayable(Unrecorded::NotRecorded(FrontendReq::POSTCOPY_ADVISE)),
                "the frontend's setup cannot be replayed: POSTCOPY_ADVISE is not recorded",
            ),
            (
                Error::Start(Box::new(Error::io("fork", io()))),
                "starting the new serving process: fork: No such file or directory (os error 2)",
            ),
            (
                Error::GaveUp {
                    why: Box::new(Error::Closed {
                        during: FrontendReq::GET_FEATURES,
                    }),
                    ending: Some(Ending::Killed(Signal::SIGSEGV)),
                },
                "the backend closed the connection at GET_FEATURES \
                 (the new serving process was killed by SIGSEGV)",
            ),
            (
                Error::GaveUp {
                    why: Box::new(Error::Timeout),
                    ending: None,
                },
                "no answer in time",
            ),
            (
                Error::Region {
                    step: "mapping it",
                    source: RegionError::Layout("4096 bytes, 8192 expected".into()),
                },
                "mapping it: session region: 4096 bytes, 8192 expected",
            ),
            (
                Error::Binary(Refusal::NotExecutable("/opt/v2/volfsd".into())),
                "--binary /opt/v2/volfsd: not an executable regular file",
            ),
        ];
        for (e, says) in cases {
            assert_eq!(e.to_string(), says, "{e:?}");
        }
    }
}
