//! Open files handed from a migration's source daemon to its destination on the same
//! host, so that the guest's locks are never let go.
//!
//! A POSIX (OFD) lock or a flock belongs to an open file description: a second
//! daemon cannot take the guest's lock while the first holds it, and if the first let
//! go before the second took it, another process could take it in between, and two
//! would believe they hold it. So the source offers its lock files and locked
//! handles; a destination on the same host (same boot id) takes the very same open
//! file descriptions (SCM_RIGHTS), and the locks stay held throughout, whichever
//! daemon ends first. Across hosts nothing is handed over: the destination takes the
//! locks again (`fs/passthrough/state/`).
//!
//! The channel is an abstract Unix socket in the host's network namespace, bound
//! when the daemon starts, before its sandbox gives it a network namespace of its
//! own; the destination connects with a socket also made at start. The device state
//! names the socket and a random token; the source answers only a peer with its own
//! uid (SO_PEERCRED) that presents the token. The state is untrusted, so the
//! destination checks its peer as well: its uid must be this daemon's, and, under a
//! keeper (an upgrade), it must be the very process the keeper started (the serving
//! process it replaces: a pidfd from the keeper, compared with SO_PEERPIDFD where the
//! kernel has both, Linux 6.9 and later). The whole exchange has a deadline: a peer
//! that trickles entries cannot hold a load open. Both run on the state thread's role.
//!
//! ```text
//! destination -> source   token (32 bytes)
//! source -> destination   batches: count u32 LE, count x (kind u8, a u64 LE, b u64 LE),
//!                          with count fds (SCM_RIGHTS); a batch of 0 ends it
//! ```

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{info, warn};

use crate::error::HostError;
use crate::state::format;
use peer::{check_peer_process, check_peer_uid};
use socket::{connect, getrandom, recv_with_fds, send_with_fds};

/// Why the open files were not handed over: the step of the exchange that failed, or
/// what the peer or the offer got wrong. Logged, never fatal: the locks are then
/// taken again.
#[derive(Debug)]
pub enum HandoffError {
    /// A call on the hand-over socket failed (`step`: "reading the token",
    /// "sendmsg", ...).
    Host {
        step: &'static str,
        source: HostError,
    },
    /// The peer runs as another user than this daemon.
    WrongUid {
        peer: u32,
        own: u32,
    },
    /// The peer is not the process the keeper started (pid as the kernel reports it
    /// here: 0 when outside this daemon's pid namespace).
    WrongProcess {
        peer: i32,
    },
    /// The exchange took longer than [`DEADLINE`].
    TooSlow,
    NothingOffered,
    WrongToken,
    /// The offer names a source on another host (or boot).
    OtherHost,
    MalformedOffer,
    /// The destination's socket was used by an earlier load.
    SocketUsed,
    /// A batch the source sent breaks the protocol (`why` says how).
    BadBatch(String),
    /// sendmsg took fewer bytes than the batch.
    ShortSend {
        sent: usize,
        len: usize,
    },
    ClosedEarly,
}

impl HandoffError {
    fn host(step: &'static str, source: impl Into<HostError>) -> HandoffError {
        HandoffError::Host {
            step,
            source: source.into(),
        }
    }
}

impl std::fmt::Display for HandoffError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandoffError::Host { step, source } => write!(f, "{step}: {source}"),
            HandoffError::WrongUid { peer, own } => {
                write!(f, "a peer with uid {peer} (this daemon runs as {own})")
            }
            HandoffError::WrongProcess { peer } => write!(
                f,
                "a peer (pid {peer} here) that is not the serving process the keeper started"
            ),
            HandoffError::TooSlow => {
                write!(f, "the hand-over took more than {} s", DEADLINE.as_secs())
            }
            HandoffError::NothingOffered => write!(f, "nothing is offered"),
            HandoffError::WrongToken => write!(f, "a wrong token"),
            HandoffError::OtherHost => write!(f, "the source ran on another host (or boot)"),
            HandoffError::MalformedOffer => write!(f, "a malformed hand-over offer"),
            HandoffError::SocketUsed => {
                write!(f, "this daemon already used its hand-over socket")
            }
            HandoffError::BadBatch(why) => write!(f, "{why}"),
            HandoffError::ShortSend { sent, len } => write!(f, "sent {sent} of {len} bytes"),
            HandoffError::ClosedEarly => write!(f, "the source closed the hand-over early"),
        }
    }
}

impl std::error::Error for HandoffError {}

/// The token's length.
const TOKEN_LEN: usize = 32;
/// Fds per message (the kernel's SCM_MAX_FD is 253).
const BATCH: usize = 200;
/// Bytes of one entry of a batch.
const ENTRY_LEN: usize = 17;
/// How long either side waits for the other before giving up.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole hand-over may take, either side (a million open files take well
/// under a second on one host).
const DEADLINE: Duration = Duration::from_secs(10);
/// The most entries a destination takes (a bound against a source gone wrong).
const MAX_ENTRIES: usize = 1 << 20;

/// What an offered open file is.
#[derive(Clone, Copy, Debug, Eq, Hash, PartialEq)]
pub enum Entry {
    /// The lock file of (node, lock owner).
    LockFile { node: u64, owner: u64 },
    /// A handle that holds a flock.
    FlockHandle { handle: u64 },
}

impl Entry {
    fn encode(self, out: &mut Vec<u8>) {
        let (kind, a, b) = match self {
            Entry::LockFile { node, owner } => (1u8, node, owner),
            Entry::FlockHandle { handle } => (2u8, handle, 0),
        };
        out.push(kind);
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }

    fn decode(bytes: &[u8]) -> Option<Entry> {
        let a = u64::from_le_bytes(bytes.get(1..9)?.try_into().ok()?);
        let b = u64::from_le_bytes(bytes.get(9..17)?.try_into().ok()?);
        match bytes.first()? {
            1 => Some(Entry::LockFile { node: a, owner: b }),
            2 => Some(Entry::FlockHandle { handle: a }),
            _ => None,
        }
    }
}

/// The sockets made at start, and the offer a save publishes.
pub struct Handoff {
    listener: UnixListener,
    /// The socket a load connects with (made in the host's network namespace; one
    /// load per daemon can use it).
    client: Mutex<Option<OwnedFd>>,
    name: String,
    boot_id: String,
    offer: Mutex<Option<Offer>>,
    /// Under a keeper: the process a source must be (a pidfd the keeper gave).
    expected_source: Mutex<Option<OwnedFd>>,
    /// `offer` holds one (read without its lock on every kick).
    offering: AtomicBool,
    serving: std::sync::Once,
}

struct Offer {
    token: [u8; TOKEN_LEN],
    files: Vec<(Entry, OwnedFd)>,
}

impl Handoff {
    /// Binds the abstract socket and makes the client socket. Called before the
    /// sandbox: both then live in the host's network namespace.
    pub fn prepare() -> io::Result<Arc<Handoff>> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("reading the boot id: {e}")))?;
        let mut random = [0u8; 8];
        getrandom(&mut random)?;
        let name = format!(
            "volfsd-handoff-{}-{}",
            std::process::id(),
            random
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        // SAFETY: socket(2) with constant arguments; the result is checked and owned.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new fd nobody else owns.
        let client = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Arc::new(Handoff {
            listener,
            client: Mutex::new(Some(client)),
            name,
            boot_id,
            offer: Mutex::new(None),
            expected_source: Mutex::new(None),
            offering: AtomicBool::new(false),
            serving: std::sync::Once::new(),
        }))
    }

    /// Under a keeper: a source is taken only from the process of `pidfd` (the
    /// serving process the keeper started this one to replace).
    pub fn expect_source(&self, pidfd: OwnedFd) {
        *self.expected_source.lock().unwrap() = Some(pidfd);
    }

    /// The fds a process other than the serving one must close (the namespace
    /// mode's supervisor).
    pub fn fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.listener.as_raw_fd()];
        if let Some(c) = self.client.lock().unwrap().as_ref() {
            fds.push(c.as_raw_fd());
        }
        fds
    }

    /// Offers `files` to a destination on this host, in place of any earlier offer,
    /// and says in the device state where to fetch them. Nothing is offered (None)
    /// when there is nothing to hand over.
    pub fn offer(
        self: &Arc<Self>,
        files: Vec<(Entry, OwnedFd)>,
    ) -> io::Result<Option<format::Handoff>> {
        if files.is_empty() {
            *self.offer.lock().unwrap() = None;
            return Ok(None);
        }
        let mut token = [0u8; TOKEN_LEN];
        getrandom(&mut token)?;
        *self.offer.lock().unwrap() = Some(Offer { token, files });
        self.offering.store(true, Ordering::Release);
        let me = self.clone();
        let mut started = Ok(());
        self.serving.call_once(|| {
            started = crate::sandbox::threads::spawn(
                "volfsd-handoff",
                crate::sandbox::ThreadRole::State,
                move || me.serve(),
            );
        });
        started?;
        Ok(Some(format::Handoff {
            boot_id: self.boot_id.clone(),
            socket: self.name.clone(),
            token: token.to_vec(),
        }))
    }

    /// Withdraws the offer, if any, closing its copies of the open files. Cheap when
    /// there is none (called on every kick).
    pub fn withdraw(&self) {
        if !self.offering.load(Ordering::Relaxed) || !self.offering.swap(false, Ordering::AcqRel) {
            return;
        }
        if let Some(offer) = self.offer.lock().unwrap().take() {
            info!(
                "the device runs here again: {} open files offered to a destination are no longer offered",
                offer.files.len()
            );
        }
    }

    /// Answers destinations for the life of the daemon.
    fn serve(&self) {
        for stream in self.listener.incoming() {
            match stream {
                Ok(s) => {
                    if let Err(e) = self.answer(s) {
                        warn!("open-file hand-over refused: {e}");
                    }
                }
                Err(e) => {
                    warn!("open-file hand-over: accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn answer(&self, mut s: UnixStream) -> Result<(), HandoffError> {
        check_peer_uid(&s)?;
        let deadline = Instant::now() + DEADLINE;
        s.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| HandoffError::host("setting the read timeout", e))?;
        s.set_write_timeout(Some(TIMEOUT))
            .map_err(|e| HandoffError::host("setting the write timeout", e))?;
        let mut token = [0u8; TOKEN_LEN];
        s.read_exact(&mut token)
            .map_err(|e| HandoffError::host("reading the token", e))?;
        let offer = self.offer.lock().unwrap();
        let Some(offer) = offer.as_ref() else {
            return Err(HandoffError::NothingOffered);
        };
        if !same_token(&token, &offer.token) {
            return Err(HandoffError::WrongToken);
        }
        for batch in offer.files.chunks(BATCH) {
            if Instant::now() >= deadline {
                return Err(HandoffError::TooSlow);
            }
            let mut payload = (batch.len() as u32).to_le_bytes().to_vec();
            let fds: Vec<RawFd> = batch.iter().map(|(_, f)| f.as_raw_fd()).collect();
            for (entry, _) in batch {
                entry.encode(&mut payload);
            }
            send_with_fds(&s, &payload, &fds)?;
        }
        send_with_fds(&s, &0u32.to_le_bytes(), &[])?;
        s.flush()
            .map_err(|e| HandoffError::host("flushing the hand-over", e))?;
        info!(
            "handed {} open files (locks) to a destination on this host",
            offer.files.len()
        );
        Ok(())
    }

    /// Fetches what the source named in `h` offers, if it runs on this host.
    pub fn fetch(&self, h: &format::Handoff) -> Result<Vec<(Entry, OwnedFd)>, HandoffError> {
        if h.boot_id != self.boot_id {
            return Err(HandoffError::OtherHost);
        }
        if h.token.len() != TOKEN_LEN || h.socket.is_empty() || h.socket.len() > 100 {
            return Err(HandoffError::MalformedOffer);
        }
        if h.socket == self.name {
            return self.own_offer(&h.token);
        }
        let Some(fd) = self.client.lock().unwrap().take() else {
            return Err(HandoffError::SocketUsed);
        };
        let addr = SocketAddr::from_abstract_name(h.socket.as_bytes())
            .map_err(|e| HandoffError::host("naming the source's socket", e))?;
        connect(&fd, &addr).map_err(|e| HandoffError::host("connecting to the source", e))?;
        let mut s = UnixStream::from(fd);
        // The state named the socket: whoever serves it is checked before anything
        // is sent to it or taken from it.
        check_peer_uid(&s)?;
        if let Some(expected) = self.expected_source.lock().unwrap().as_ref() {
            check_peer_process(&s, expected)?;
        }
        let deadline = Instant::now() + DEADLINE;
        s.set_write_timeout(Some(TIMEOUT))
            .map_err(|e| HandoffError::host("setting the write timeout", e))?;
        s.write_all(&h.token)
            .map_err(|e| HandoffError::host("sending the token", e))?;
        let mut files = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(HandoffError::TooSlow);
            }
            s.set_read_timeout(Some(left))
                .map_err(|e| HandoffError::host("setting the read timeout", e))?;
            let (payload, fds) = recv_with_fds(&s).map_err(|e| match e {
                HandoffError::Host { .. } if Instant::now() >= deadline => HandoffError::TooSlow,
                e => e,
            })?;
            let count = payload
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                .ok_or_else(|| HandoffError::BadBatch("a short batch".into()))?;
            if count == 0 {
                return Ok(files);
            }
            if payload.len() != 4 + count * ENTRY_LEN || fds.len() != count {
                return Err(HandoffError::BadBatch(format!(
                    "a batch of {count} entries with {} bytes and {} fds",
                    payload.len(),
                    fds.len()
                )));
            }
            if files.len() + count > MAX_ENTRIES {
                let why = "more open files than a state can hold";
                return Err(HandoffError::BadBatch(why.into()));
            }
            for (i, fd) in fds.into_iter().enumerate() {
                let at = 4 + i * ENTRY_LEN;
                let entry = Entry::decode(&payload[at..at + ENTRY_LEN])
                    .ok_or_else(|| HandoffError::BadBatch("an unknown entry".into()))?;
                files.push((entry, fd));
            }
        }
    }
}

impl Handoff {
    /// A state this daemon saved and now loads itself (`--keep-serving`: the same
    /// daemon serves a local migration's destination, as cloud-hypervisor's
    /// `local=on` does, maybe again and again): its own offer, duplicated (the same
    /// open file descriptions, so the locks are never let go), without the client
    /// socket, which serves one load per daemon. The offer stays until the device
    /// runs here again, as for a destination elsewhere on the host.
    fn own_offer(&self, token: &[u8]) -> Result<Vec<(Entry, OwnedFd)>, HandoffError> {
        let offer = self.offer.lock().unwrap();
        let Some(offer) = offer.as_ref() else {
            return Err(HandoffError::NothingOffered);
        };
        if !same_token(token, &offer.token) {
            return Err(HandoffError::WrongToken);
        }
        let files = offer
            .files
            .iter()
            .map(|(e, f)| {
                f.try_clone()
                    .map(|f| (*e, f))
                    .map_err(|e| HandoffError::host("duplicating an offered file", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        info!(
            "took over its own {} open files (locks) offered at the save: the next frontend's session in this daemon",
            files.len()
        );
        Ok(files)
    }
}

/// Whether `token` is the offer's, compared in constant time (the comparison tells
/// nothing of the token) and of the same length.
fn same_token(token: &[u8], offered: &[u8]) -> bool {
    token.len() == offered.len()
        && token.iter().zip(offered).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

mod peer;
mod socket;
#[cfg(test)]
mod tests;
