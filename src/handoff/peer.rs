//! The hand-over's peer checks: the process at the other end of the socket a state
//! named must run as this daemon's user and, under a keeper, be the very process the
//! keeper started.

pub(super) fn check_peer_uid(s: &UnixStream) -> Result<(), HandoffError> {
    let peer = getsockopt(s, PeerCredentials).map_err(|e| HandoffError::host("SO_PEERCRED", e))?;
    // SAFETY: geteuid cannot fail.
    let own = unsafe { libc::geteuid() };
    if peer.uid() != own {
        let peer = peer.uid();
        return Err(HandoffError::WrongUid { peer, own });
    }
    Ok(())
}

/// `SO_PEERPIDFD` (asm-generic/socket.h): a pidfd of the peer (Linux 6.5 and later).
const SO_PEERPIDFD: libc::c_int = 77;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use super::HandoffError;

/// The peer of `s` must be the process of the pidfd `expected`: both pidfds name the
/// same process when they are the same inode of pidfs (Linux 6.9 and later give each
/// process its own; before, every pidfd is the one anonymous inode and this cannot
/// tell, nor can a kernel without SO_PEERPIDFD: the uid check stands alone there).
pub(super) fn check_peer_process(s: &UnixStream, expected: &OwnedFd) -> Result<(), HandoffError> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one int and its length into our variables.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOPROTOOPT) {
            return Ok(());
        }
        return Err(HandoffError::host("SO_PEERPIDFD", e));
    }
    // SAFETY: the kernel just installed this fd in this process.
    let peer = unsafe { OwnedFd::from_raw_fd(fd) };
    let stat = |f: &OwnedFd| -> Result<(u64, u64), HandoffError> {
        let mut st = std::mem::MaybeUninit::<libc::stat64>::uninit();
        // SAFETY: fstat64 fills `st` for an fd we own.
        if unsafe { libc::fstat64(f.as_raw_fd(), st.as_mut_ptr()) } < 0 {
            return Err(HandoffError::host(
                "fstat of a pidfd",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: fstat64 succeeded.
        let st = unsafe { st.assume_init() };
        Ok((st.st_dev, st.st_ino))
    };
    if stat(&peer)? != stat(expected)? {
        let creds =
            getsockopt(s, PeerCredentials).map_err(|e| HandoffError::host("SO_PEERCRED", e))?;
        return Err(HandoffError::WrongProcess { peer: creds.pid() });
    }
    Ok(())
}
