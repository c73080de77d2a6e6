//! vhost-user messages as the keeper relays them: the 12-byte header (request,
//! flags, payload size, each u32 little-endian), the payload, and the fds sent with
//! them (SCM_RIGHTS). A sender sends a message with one `sendmsg`, its fds with its
//! first byte; a stream socket keeps them there, so a reader that never reads past a
//! message's end gets each message's fds with it.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::Error;

/// The header's length.
pub const HEADER_LEN: usize = 12;
/// The largest payload vhost-user allows (vhost's `MAX_MSG_SIZE`).
pub const MAX_PAYLOAD: u32 = 0x1000;
/// The most fds one message carries (vhost's `MAX_ATTACHED_FD_ENTRIES`).
pub const MAX_FDS: usize = 32;

/// Header flags: the protocol version (always 1), a reply, and a request that asks
/// for an acknowledgement (with `VHOST_USER_PROTOCOL_F_REPLY_ACK`).
pub const VERSION: u32 = 0x1;
pub const REPLY: u32 = 0x4;
pub const NEED_REPLY: u32 = 0x8;

/// A message header.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct Header {
    pub request: u32,
    pub flags: u32,
    pub size: u32,
}

impl Header {
    /// A request of `request` with `size` payload bytes, version 1, no other flag
    /// (tests: the replay builds its messages with their flags).
    #[cfg(test)]
    pub fn request(request: u32, size: usize) -> Header {
        Header {
            request,
            flags: VERSION,
            size: size as u32,
        }
    }

    /// The header of the reply to a message with header `request`.
    pub fn reply_to(request: Header) -> Header {
        Header {
            request: request.request,
            flags: VERSION | REPLY,
            size: 0,
        }
    }

    pub fn is_reply(self) -> bool {
        self.flags & REPLY != 0
    }

    pub fn needs_reply(self) -> bool {
        self.flags & NEED_REPLY != 0
    }

    fn encode(self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.request.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Header {
            request: word(0),
            flags: word(4),
            size: word(8),
        }
    }
}

/// One message with the fds that came with it (owned: closed when dropped).
#[derive(Debug)]
pub struct Message {
    pub header: Header,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Message {
    /// A request without fds (tests).
    #[cfg(test)]
    pub fn new(request: u32, payload: Vec<u8>) -> Message {
        Message {
            header: Header::request(request, payload.len()),
            payload,
            fds: Vec::new(),
        }
    }

    /// The payload as one u64 (VhostUserU64), if it is one.
    pub fn u64(&self) -> Option<u64> {
        Some(u64::from_le_bytes(self.payload.get(..8)?.try_into().ok()?)).filter(|_| {
            // Exactly 8 bytes: anything else is another message's layout.
            self.payload.len() == 8
        })
    }

    /// The payload as (index, num) (VhostUserVringState), if it is one.
    pub fn vring_state(&self) -> Option<(u32, u32)> {
        if self.payload.len() != 8 {
            return None;
        }
        let w = |i: usize| u32::from_le_bytes(self.payload[i..i + 4].try_into().unwrap());
        Some((w(0), w(4)))
    }

    pub fn raw_fds(&self) -> Vec<RawFd> {
        self.fds.iter().map(AsRawFd::as_raw_fd).collect()
    }
}

/// Encodes (index, num) as VhostUserVringState.
pub fn vring_state(index: u32, num: u32) -> Vec<u8> {
    let mut p = index.to_le_bytes().to_vec();
    p.extend_from_slice(&num.to_le_bytes());
    p
}

/// Reads one message. `Ok(None)`: the peer closed the stream between messages.
/// With a read timeout set on `stream`, a peer silent that long is `Error::Timeout`.
pub fn recv(stream: &UnixStream) -> Result<Option<Message>, Error> {
    let mut fds = Vec::new();
    let mut head = [0u8; HEADER_LEN];
    let got = read_full(stream, &mut head, &mut fds)?;
    if got == 0 {
        return Ok(None);
    }
    if got < HEADER_LEN {
        return Err(Error::Truncated { what: "header" });
    }
    let header = Header::decode(&head);
    if header.size > MAX_PAYLOAD {
        return Err(Error::TooLarge {
            request: header.request,
            size: header.size,
        });
    }
    let mut payload = vec![0u8; header.size as usize];
    if read_full(stream, &mut payload, &mut fds)? < payload.len() {
        return Err(Error::Truncated { what: "payload" });
    }
    Ok(Some(Message {
        header,
        payload,
        fds,
    }))
}

/// Fills `buf` unless the stream ends first; returns the bytes read. Fds that come
/// with them are added to `fds`.
fn read_full(stream: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, Error> {
    let mut got = 0;
    while got < buf.len() {
        let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let msg = match recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Err(Error::Timeout),
            // A peer that closed with our last message unread: closed all the same.
            Err(Errno::ECONNRESET) => break,
            Err(e) => return Err(Error::io("recvmsg", e.into())),
        };
        let n = msg.bytes;
        let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        for c in msg
            .cmsgs()
            .map_err(|e| Error::io("control messages", e.into()))?
        {
            if let ControlMessageOwned::ScmRights(received) = c {
                // SAFETY: the kernel just installed these fds in this process; each
                // is owned once, here.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if truncated || fds.len() > MAX_FDS {
            return Err(Error::TooManyFds);
        }
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// Sends one message: header and payload in one `sendmsg` with the fds, the rest (if
/// the socket took only part) after it.
pub fn send(
    stream: &UnixStream,
    header: Header,
    payload: &[u8],
    fds: &[RawFd],
) -> Result<(), Error> {
    if fds.len() > MAX_FDS {
        return Err(Error::TooManyFds);
    }
    let header = Header {
        size: payload.len() as u32,
        ..header
    };
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(payload);
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if sent == 0 && !fds.is_empty() {
            &rights
        } else {
            &[]
        };
        match sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => sent += n,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Err(Error::Timeout),
            Err(e) => return Err(Error::io("sendmsg", e.into())),
        }
    }
    Ok(())
}

/// Sends `msg` as it is, with its fds.
pub fn forward(stream: &UnixStream, msg: &Message) -> Result<(), Error> {
    send(stream, msg.header, &msg.payload, &msg.raw_fds())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    fn memfd(content: &[u8]) -> std::fs::File {
        let fd = nix::sys::memfd::memfd_create(
            c"keeper-test",
            nix::sys::memfd::MemFdCreateFlag::empty(),
        )
        .unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(content).unwrap();
        f
    }

    #[test]
    fn a_message_with_fds_arrives_whole() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = memfd(b"guest memory");
        let h = Header {
            request: 5,
            flags: VERSION | NEED_REPLY,
            size: 0,
        };
        send(&a, h, &[7u8; 40], &[f.as_raw_fd()]).unwrap();
        // A second message right behind it keeps its own (no) fds.
        send(&a, Header::request(3, 0), &[], &[]).unwrap();
        let m = recv(&b).unwrap().unwrap();
        assert_eq!(m.header.request, 5);
        assert!(m.header.needs_reply() && !m.header.is_reply());
        assert_eq!(m.header.size, 40);
        assert_eq!(m.payload, vec![7u8; 40]);
        assert_eq!(m.fds.len(), 1);
        let mut got = std::fs::File::from(m.fds.into_iter().next().unwrap());
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "guest memory", "the very same file");
        let m = recv(&b).unwrap().unwrap();
        assert_eq!((m.header.request, m.payload.len(), m.fds.len()), (3, 0, 0));
        drop(a);
        assert!(recv(&b).unwrap().is_none(), "closed between messages");
    }

    #[test]
    fn bad_framing_is_an_error_not_a_panic() {
        // A header cut short.
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[1, 0, 0, 0, 1]).unwrap();
        drop(a);
        assert!(matches!(recv(&b), Err(Error::Truncated { what: "header" })));
        // A payload larger than vhost-user allows.
        let (a, b) = UnixStream::pair().unwrap();
        let h = Header {
            request: 1,
            flags: VERSION,
            size: MAX_PAYLOAD + 1,
        };
        (&a).write_all(&h.encode()).unwrap();
        assert!(matches!(recv(&b), Err(Error::TooLarge { .. })));
        // A payload cut short.
        let (a, b) = UnixStream::pair().unwrap();
        let h = Header {
            request: 2,
            flags: VERSION,
            size: 8,
        };
        (&a).write_all(&h.encode()).unwrap();
        (&a).write_all(&[1, 2]).unwrap();
        drop(a);
        assert!(matches!(
            recv(&b),
            Err(Error::Truncated { what: "payload" })
        ));
        // A silent peer, with a timeout.
        let (_a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        assert!(matches!(recv(&b), Err(Error::Timeout)));
    }

    #[test]
    fn payload_views() {
        let m = Message::new(2, 0x1234u64.to_le_bytes().to_vec());
        assert_eq!(m.u64(), Some(0x1234));
        assert_eq!(m.vring_state(), Some((0x1234, 0)));
        let m = Message::new(8, vring_state(1, 256));
        assert_eq!(m.vring_state(), Some((1, 256)));
        assert_eq!(Message::new(2, vec![0; 9]).u64(), None);
        assert_eq!(Message::new(2, vec![0; 4]).vring_state(), None);
    }
}
