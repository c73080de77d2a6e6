//! Test helpers of the keeper: a scripted vhost-user backend on a socketpair,
//! eventfds to pass around, and a keeper with no frontend whose new serving
//! processes are shell scripts.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread::JoinHandle;

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use vhost::vhost_user::message::FrontendReq;
use vhost::vhost_user::Listener;

use super::crash::Crashes;
use super::event_loop::Keep;
use super::event_loop::Keeper;
use super::private_socket::Private;
use super::setup::FrontendSetup;
use super::upgrade::Command;
use super::wire::Message;
use crate::region::Region;

use super::wire::{self, Header, REPLY};

pub fn eventfd() -> OwnedFd {
    // SAFETY: eventfd returns a new fd, owned here once, or -1 (checked).
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: as above.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// What the scripted backend saw: request, flags, payload, number of fds.
pub type Seen = Vec<(FrontendReq, u32, Vec<u8>, usize)>;

/// A backend that answers as vhost-user-backend does, offering `offer` protocol
/// features, and acks every request with 0 but `refuse` (acked 1).
pub fn backend(offer: u64, refuse: Option<FrontendReq>) -> (UnixStream, JoinHandle<Seen>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let mut seen = Seen::new();
        while let Ok(Some(m)) = wire::recv(&theirs) {
            let req = FrontendReq::try_from(m.header.request).unwrap();
            seen.push((req, m.header.flags, m.payload.clone(), m.fds.len()));
            let reply = match req {
                FrontendReq::GET_FEATURES => Some(u64::MAX.to_le_bytes().to_vec()),
                FrontendReq::GET_PROTOCOL_FEATURES => Some(offer.to_le_bytes().to_vec()),
                FrontendReq::GET_VRING_BASE => {
                    let (i, _) = m.vring_state().unwrap();
                    Some(wire::vring_state(i, 100 + i))
                }
                FrontendReq::SET_LOG_BASE => Some(m.payload.clone()),
                FrontendReq::GET_QUEUE_NUM => Some(1u64.to_le_bytes().to_vec()),
                _ if m.header.needs_reply() => {
                    let code = u64::from(refuse == Some(req));
                    Some(code.to_le_bytes().to_vec())
                }
                _ => None,
            };
            if let Some(p) = reply {
                let h = Header {
                    flags: wire::VERSION | REPLY,
                    ..m.header
                };
                wire::send(&theirs, h, &p, &[]).unwrap();
            }
        }
        seen
    });
    (ours, h)
}

pub fn msg(req: FrontendReq, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Message {
    Message {
        header: Header::request(u32::from(req), payload.len()),
        payload,
        fds,
    }
}

/// A session as QEMU sets up a vhost-user-fs device with two queues running.
pub fn recorded(protocol: u64) -> FrontendSetup {
    let mut s = FrontendSetup::new();
    s.record(msg(FrontendReq::SET_OWNER, vec![], vec![]));
    s.record(msg(
        FrontendReq::SET_PROTOCOL_FEATURES,
        protocol.to_le_bytes().to_vec(),
        vec![],
    ));
    s.record(msg(
        FrontendReq::SET_FEATURES,
        (1u64 << 32).to_le_bytes().to_vec(),
        vec![],
    ));
    let mut table = 1u64.to_le_bytes().to_vec();
    table.extend(
        [0u64, 0x4000_0000, 0x7f00_0000_0000, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes()),
    );
    s.record(msg(FrontendReq::SET_MEM_TABLE, table, vec![eventfd()]));
    s.record(msg(
        FrontendReq::SET_BACKEND_REQ_FD,
        vec![],
        vec![eventfd()],
    ));
    for i in 0..2u32 {
        s.record(msg(
            FrontendReq::SET_VRING_NUM,
            wire::vring_state(i, 256),
            vec![],
        ));
        s.record(msg(
            FrontendReq::SET_VRING_BASE,
            wire::vring_state(i, 0),
            vec![],
        ));
        let mut addr = i.to_le_bytes().to_vec();
        addr.extend([0u8; 36]);
        s.record(msg(FrontendReq::SET_VRING_ADDR, addr, vec![]));
        let kick = u64::from(i).to_le_bytes().to_vec();
        s.record(msg(
            FrontendReq::SET_VRING_KICK,
            kick.clone(),
            vec![eventfd()],
        ));
        s.record(msg(FrontendReq::SET_VRING_CALL, kick, vec![eventfd()]));
        s.record(msg(
            FrontendReq::SET_VRING_ENABLE,
            wire::vring_state(i, 1),
            vec![],
        ));
    }
    s
}

/// A keeper as `process::split` leaves it, before any frontend: its serving process
/// a `sleep`, a fresh session region, and new serving processes started as
/// `sh -c SCRIPT` (the keeper's hidden flags become the script's `$0`, `$1`...).
/// Dropped: every child it had is killed and reaped, its files removed.
pub struct Kept {
    pub keeper: Keeper<'static>,
    /// The serving processes it had, the first one included.
    pub children: Vec<Pid>,
    dir: PathBuf,
}

/// A [`Kept`] whose new serving processes run `script` (None: no binary).
// Its `sleep` is reaped by its pid when the Kept is dropped, as the keeper reaps.
#[allow(clippy::zombie_processes)]
pub fn keeper(script: Option<&str>) -> Kept {
    let template = std::env::temp_dir().join("volfsd-keeper-test.XXXXXX");
    let dir = nix::unistd::mkdtemp(&template).unwrap();
    let frontend = Listener::new(dir.join("fs.sock"), true).unwrap();
    let private = Private::bind().unwrap();
    let sleep = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let child = Pid::from_raw(sleep.id() as i32);
    let keeper = Keeper {
        child,
        frontend,
        private: private.path,
        keep: Keep {
            control: None,
            close: &[],
            sockets: &[],
            keep_serving: false,
        },
        command: script.map(|s| Command {
            binary: "/bin/sh".into(),
            args: vec!["-c".into(), s.into()],
        }),
        channel: None,
        region: Region::create().unwrap(),
        served: false,
        crashes: Crashes::default(),
        started: std::time::Instant::now(),
        backend_gone: None,
    };
    Kept {
        keeper,
        children: vec![child],
        dir,
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.children.push(self.keeper.child);
        for &pid in &self.children {
            // Killed only while still this process's child (a reaped pid may be
            // someone else's by now).
            if let Ok(WaitStatus::StillAlive) = waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
            }
        }
        Private::remove(&self.keeper.private);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A relay between two socketpairs, and the frontend's and the backend's far ends
/// (kept open: the relay's peers).
pub fn relay() -> (super::relay::Relay, UnixStream, UnixStream) {
    let (frontend, vmm) = UnixStream::pair().unwrap();
    let (backend, serving) = UnixStream::pair().unwrap();
    (super::relay::Relay::new(frontend, backend), vmm, serving)
}
