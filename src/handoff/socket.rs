//! The hand-over's socket calls: connecting to an abstract name, messages with fds
//! (SCM_RIGHTS), and the random token.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::{HandoffError, BATCH, ENTRY_LEN};

pub(super) fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the buffer is valid for the remaining length.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(())
}

pub(super) fn connect(fd: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    let name = addr
        .as_abstract_name()
        .ok_or_else(|| io::Error::other("not an abstract address"))?;
    // SAFETY: sockaddr_un is plain data; zero is valid.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > sun.sun_path.len() {
        return Err(io::Error::other("abstract name too long"));
    }
    // The leading NUL makes the name abstract.
    for (i, b) in name.iter().enumerate() {
        sun.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: a valid sockaddr_un of `len` bytes for a socket we own.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sun as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn send_with_fds(
    s: &UnixStream,
    payload: &[u8],
    fds: &[RawFd],
) -> Result<(), HandoffError> {
    let iov = [IoSlice::new(payload)];
    let cmsgs = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(fds)]
    };
    // One message per batch: the receiver reads it whole (a stream socket keeps the
    // fds with the first byte of their message).
    let sent = sendmsg::<()>(s.as_raw_fd(), &iov, &cmsgs, MsgFlags::empty(), None)
        .map_err(|e| HandoffError::host("sendmsg", e))?;
    if sent != payload.len() {
        let len = payload.len();
        return Err(HandoffError::ShortSend { sent, len });
    }
    Ok(())
}

pub(super) fn recv_with_fds(s: &UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>), HandoffError> {
    let mut buf = vec![0u8; 4 + BATCH * ENTRY_LEN];
    let mut cmsg = nix::cmsg_space!([RawFd; BATCH]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| HandoffError::host("recvmsg", e))?;
        let mut fds = Vec::new();
        for c in msg
            .cmsgs()
            .map_err(|e| HandoffError::host("control messages", e))?
        {
            if let ControlMessageOwned::ScmRights(received) = c {
                // SAFETY: the kernel just installed these fds in this process.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(HandoffError::BadBatch(
                "more fds than a batch may carry".into(),
            ));
        }
        (msg.bytes, fds)
    };
    if n == 0 {
        return Err(HandoffError::ClosedEarly);
    }
    buf.truncate(n);
    Ok((buf, fds))
}
