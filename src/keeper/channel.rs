//! The channel between the keeper and a serving process it started: a Unix
//! socketpair made by the keeper, one end inherited by the serving process. Through
//! it the control API's `PUT /upgrade` (`volfsd ctl upgrade`) asks the keeper for an
//! upgrade, as SIGHUP does, and learns how it went. Only the two ends exist: no other
//! process can reach it (the peer credentials are the daemon's by construction).
//!
//! ```text
//! serving -> keeper   "upgrade\n" or "upgrade PATH\n" (`ctl upgrade --binary`)
//! keeper -> serving   "ok <pause in ms>\n" or "failed <why>\n"
//! serving -> keeper   "done\n"  (after an "ok", once the control API's reply is
//!                      written to the client ([`reply_sent`]); the keeper lets the
//!                      old process go only then, so the client gets its answer)
//! serving -> keeper   "volumes <json>\n"  (after each attach, detach or limit
//!                      change: the volumes a process it starts must attach first)
//! ```

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How long the serving side waits for the keeper's answer (an upgrade moves the
/// whole session: large ones take seconds).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the keeper waits for "done".
pub const DONE_TIMEOUT: Duration = Duration::from_secs(2);

/// A new channel: the keeper's end, and the serving process's.
pub fn pair() -> io::Result<(UnixStream, OwnedFd)> {
    let (keeper, serving) = UnixStream::pair()?;
    Ok((keeper, serving.into()))
}

/// One line (without its newline), read byte by byte so that nothing after it is
/// taken; None when the stream ended (or failed) first.
fn read_line(stream: &UnixStream, max: usize) -> io::Result<Option<String>> {
    let mut line = String::new();
    let mut byte = [0u8; 1];
    loop {
        match io::Read::read(&mut &*stream, &mut byte) {
            Ok(0) => return Ok(None),
            Ok(_) if byte[0] == b'\n' => return Ok(Some(line)),
            Ok(_) if line.len() < max => line.push(byte[0] as char),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The longest request line: a `volumes` line lists every attached volume.
const MAX_REQUEST_LINE: usize = 1 << 20;

/// The keeper reads one request line; None when the serving process closed its end.
pub fn read_request(keeper: &UnixStream) -> Option<String> {
    read_line(keeper, MAX_REQUEST_LINE).ok().flatten()
}

/// The request line that asks for an upgrade (followed by a binary's path, or not).
pub const UPGRADE: &str = "upgrade";

/// The request line that tells the keeper the attached volumes.
pub const VOLUMES: &str = "volumes ";

/// Tells the keeper the volumes attached now (`json`, one line), for the serving
/// processes it starts after an upgrade or a crash; nothing without a keeper. A
/// failure only means a later process starts with older volumes: logged.
pub fn tell_volumes(json: &str) {
    let Some(channel) = SERVING.get() else {
        return;
    };
    let stream = channel.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = (&*stream).write_all(format!("{VOLUMES}{json}\n").as_bytes()) {
        log::warn!("telling the keeper the attached volumes: {e}");
    }
}

/// The keeper answers an upgrade request (the guest's pause, or why it failed: on
/// one line); after an "ok", waits (a little) for "done".
pub fn answer(keeper: &UnixStream, outcome: Result<Duration, &super::Error>) {
    let line = match outcome {
        Ok(pause) => format!("ok {}\n", pause.as_millis()),
        Err(why) => format!("failed {}\n", why.to_string().replace('\n', " ")),
    };
    if (&*keeper).write_all(line.as_bytes()).is_err() || outcome.is_err() {
        return;
    }
    let _ = keeper.set_read_timeout(Some(DONE_TIMEOUT));
    let _ = read_request(keeper);
    let _ = keeper.set_read_timeout(None);
}

/// The serving process's end, once set.
static SERVING: OnceLock<Mutex<UnixStream>> = OnceLock::new();
/// An "ok" came and its "done" is owed once the client has its reply.
static DONE_OWED: AtomicBool = AtomicBool::new(false);

/// Sets the serving process's end (it runs under a keeper).
pub fn serve_with(fd: OwnedFd) {
    let _ = SERVING.set(Mutex::new(UnixStream::from(fd)));
}

/// Why an upgrade asked for through the channel did not happen.
#[derive(Debug)]
pub enum AskError {
    /// This daemon runs without a keeper (no `--upgradable`).
    NoKeeper,
    /// The channel failed.
    Channel(io::Error),
    /// The keeper tried and failed, and says why; the old process serves on.
    Failed(String),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::NoKeeper => write!(f, "this daemon was not started with --upgradable"),
            AskError::Channel(e) => write!(f, "asking the keeper: {e}"),
            AskError::Failed(why) => write!(f, "the upgrade failed, this process serves on: {why}"),
        }
    }
}

/// Asks the keeper for an upgrade (to `binary`, else the daemon's own) and waits
/// for it; the guest's pause on success.
pub fn ask_upgrade(binary: Option<&str>) -> Result<Duration, AskError> {
    let channel = SERVING.get().ok_or(AskError::NoKeeper)?;
    let line = match binary {
        Some(b) if b.contains('\n') => {
            return Err(AskError::Failed("a binary path with a newline".into()))
        }
        Some(b) => format!("{UPGRADE} {b}\n"),
        None => format!("{UPGRADE}\n"),
    };
    // One at a time; a poisoned lock only means an earlier asker panicked.
    let stream = channel.lock().unwrap_or_else(|p| p.into_inner());
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(AskError::Channel)?;
    (&*stream)
        .write_all(line.as_bytes())
        .map_err(AskError::Channel)?;
    let line = read_line(&stream, 4096)
        .map_err(AskError::Channel)?
        .ok_or_else(|| AskError::Channel(io::ErrorKind::UnexpectedEof.into()))?;
    match line.trim_end().split_once(' ') {
        Some(("ok", ms)) => {
            // "done" once the reply is written: the keeper ends this process then.
            DONE_OWED.store(true, Ordering::Release);
            Ok(Duration::from_millis(ms.parse().unwrap_or(0)))
        }
        Some(("failed", why)) => Err(AskError::Failed(why.to_string())),
        _ => Err(AskError::Channel(io::Error::other(format!(
            "the keeper answered {line:?}"
        )))),
    }
}

/// The control API wrote a reply to its client: if it was an upgrade's "ok", tells
/// the keeper it may end this process now (its reply is in the client's socket).
pub fn reply_sent() {
    if !DONE_OWED.swap(false, Ordering::AcqRel) {
        return;
    }
    if let Some(channel) = SERVING.get() {
        let stream = channel.lock().unwrap_or_else(|p| p.into_inner());
        let _ = (&*stream).write_all(b"done\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the serving end is process-wide (set once).
    #[test]
    fn a_request_its_answers_and_the_done_after_the_reply() {
        let (k, s) = UnixStream::pair().unwrap();
        let keeper = std::thread::spawn(move || {
            assert_eq!(read_request(&k).as_deref(), Some("upgrade"));
            let why = crate::keeper::Error::GaveUp {
                why: Box::new(crate::keeper::Error::io(
                    "loading the state",
                    io::Error::other("refused\nit"),
                )),
                ending: Some(crate::keeper::crash::Ending::Exited(3)),
            };
            answer(&k, Err(&why));
            // An "ok": no "done" until the control API wrote its reply.
            assert_eq!(read_request(&k).as_deref(), Some("upgrade"));
            (&k).write_all(b"ok 42\n").unwrap();
            k.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let before = read_request(&k);
            k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            (before, read_request(&k))
        });
        serve_with(s.into());
        match ask_upgrade(None) {
            Err(AskError::Failed(why)) => assert_eq!(
                why,
                "loading the state: refused it (the new serving process exited with status 3)"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(ask_upgrade(None).unwrap(), Duration::from_millis(42));
        std::thread::sleep(Duration::from_millis(400));
        reply_sent();
        reply_sent(); // owed once
        let (before, after) = keeper.join().unwrap();
        assert_eq!(before, None, "done before the reply was written");
        assert_eq!(after.as_deref(), Some("done"));
    }
}
