//! FUSE requests and the raw descriptor chains they turn into.

use fuse_backend_rs::abi::fuse_abi::{InHeader, Opcode, OutHeader};
use vm_memory::ByteValued;

use crate::frontend::virtqueue::Segment;

/// Size of `struct fuse_in_header`.
pub const IN_HEADER_SIZE: usize = std::mem::size_of::<InHeader>();
/// Size of `struct fuse_out_header`.
pub const OUT_HEADER_SIZE: usize = std::mem::size_of::<OutHeader>();

/// A FUSE request before it is placed in guest memory. Each argument becomes
/// its own device-readable descriptor, like the Linux driver's scatter list.
#[derive(Clone, Debug)]
pub struct Request {
    pub opcode: u32,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Input arguments after the header (structs, names, data).
    pub args: Vec<Vec<u8>>,
    /// Capacity of the reply body; `None` for requests without a reply (FORGET).
    pub reply_capacity: Option<u32>,
    /// Overrides `in_header.len` (normally the real total length) to test
    /// backends against lying headers.
    pub header_len_override: Option<u32>,
}

impl Request {
    /// A request from the current process's credentials, expecting no reply body.
    pub fn new(opcode: Opcode, nodeid: u64) -> Self {
        Self::with_raw_opcode(opcode as u32, nodeid)
    }

    /// Like [`Request::new`] but with any opcode number, valid or not.
    pub fn with_raw_opcode(opcode: u32, nodeid: u64) -> Self {
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Request {
            opcode,
            nodeid,
            uid,
            gid,
            pid: std::process::id(),
            args: Vec::new(),
            reply_capacity: Some(0),
            header_len_override: None,
        }
    }

    /// Appends a fixed-size argument struct.
    pub fn arg<T: ByteValued>(mut self, value: &T) -> Self {
        self.args.push(value.as_slice().to_vec());
        self
    }

    /// Appends raw argument bytes (data, or deliberately malformed input).
    pub fn bytes(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.args.push(data.into());
        self
    }

    /// Appends a name as a NUL-terminated string.
    pub fn name(self, name: &str) -> Self {
        self.bytes(c_string(name))
    }

    /// Sets the reply body capacity.
    pub fn reply_size(mut self, capacity: u32) -> Self {
        self.reply_capacity = Some(capacity);
        self
    }

    /// Reply body sized for `T`.
    pub fn reply_of<T: ByteValued>(self) -> Self {
        self.reply_size(std::mem::size_of::<T>() as u32)
    }

    /// Marks the request as one the backend must not answer (FORGET, BATCH_FORGET).
    pub fn no_reply(mut self) -> Self {
        self.reply_capacity = None;
        self
    }

    /// Lies about the total length in the header.
    pub fn header_len(mut self, len: u32) -> Self {
        self.header_len_override = Some(len);
        self
    }

    /// Total length of header plus arguments.
    pub fn total_len(&self) -> usize {
        IN_HEADER_SIZE + self.args.iter().map(Vec::len).sum::<usize>()
    }

    /// The descriptor chain for this request with the given `unique`.
    pub fn to_chain(&self, unique: u64) -> RawChain {
        let header = InHeader {
            len: self.header_len_override.unwrap_or(self.total_len() as u32),
            opcode: self.opcode,
            unique,
            nodeid: self.nodeid,
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
            padding: 0,
        };
        let mut readable = vec![ChainPart::Data(header.as_slice().to_vec())];
        readable.extend(self.args.iter().cloned().map(ChainPart::Data));
        let mut writable = Vec::new();
        if let Some(capacity) = self.reply_capacity {
            writable.push(ChainPart::Space(OUT_HEADER_SIZE as u32));
            if capacity > 0 {
                writable.push(ChainPart::Space(capacity));
            }
        }
        RawChain { readable, writable }
    }
}

/// One buffer of a raw chain.
#[derive(Clone, Debug)]
pub enum ChainPart {
    /// Guest buffer holding these bytes.
    Data(Vec<u8>),
    /// Zeroed guest buffer of this many bytes (a zero length makes a 0-length descriptor).
    Space(u32),
    /// A descriptor with exactly this address and length, not backed by an
    /// allocation: can point outside guest memory or overlap the rings.
    Raw(Segment),
}

/// A descriptor chain described part by part: device-readable parts first,
/// then device-writable ones.
#[derive(Clone, Debug, Default)]
pub struct RawChain {
    pub readable: Vec<ChainPart>,
    pub writable: Vec<ChainPart>,
}

impl RawChain {
    /// Re-cuts the device-readable data into descriptors ending at the given
    /// byte offsets (the rest forms a last descriptor). Raw segments are dropped.
    pub fn split_readable(mut self, cut_points: &[usize]) -> RawChain {
        let bytes: Vec<u8> = self
            .readable
            .iter()
            .filter_map(|p| match p {
                ChainPart::Data(d) => Some(d.as_slice()),
                _ => None,
            })
            .flatten()
            .copied()
            .collect();
        let mut start = 0;
        self.readable.clear();
        for &end in cut_points.iter().chain(std::iter::once(&bytes.len())) {
            let end = end.clamp(start, bytes.len());
            if end > start {
                self.readable
                    .push(ChainPart::Data(bytes[start..end].to_vec()));
            }
            start = end;
        }
        self
    }

    /// Re-cuts the device-readable data into descriptors of `size` bytes.
    pub fn split_readable_every(self, size: usize) -> RawChain {
        let total: usize = self
            .readable
            .iter()
            .map(|p| match p {
                ChainPart::Data(d) => d.len(),
                _ => 0,
            })
            .sum();
        let cuts: Vec<usize> = (size..total).step_by(size.max(1)).collect();
        self.split_readable(&cuts)
    }
}

/// `s` followed by a NUL byte.
pub fn c_string(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v
}

/// Readable name of a FUSE opcode, for error messages. Written out because
/// converting an unknown number to `Opcode` is undefined behaviour.
pub fn opcode_name(opcode: u32) -> String {
    const NAMES: [&str; 50] = [
        "0",
        "LOOKUP",
        "FORGET",
        "GETATTR",
        "SETATTR",
        "READLINK",
        "SYMLINK",
        "7",
        "MKNOD",
        "MKDIR",
        "UNLINK",
        "RMDIR",
        "RENAME",
        "LINK",
        "OPEN",
        "READ",
        "WRITE",
        "STATFS",
        "RELEASE",
        "19",
        "FSYNC",
        "SETXATTR",
        "GETXATTR",
        "LISTXATTR",
        "REMOVEXATTR",
        "FLUSH",
        "INIT",
        "OPENDIR",
        "READDIR",
        "RELEASEDIR",
        "FSYNCDIR",
        "GETLK",
        "SETLK",
        "SETLKW",
        "ACCESS",
        "CREATE",
        "INTERRUPT",
        "BMAP",
        "DESTROY",
        "IOCTL",
        "POLL",
        "NOTIFY_REPLY",
        "BATCH_FORGET",
        "FALLOCATE",
        "READDIRPLUS",
        "RENAME2",
        "LSEEK",
        "COPY_FILE_RANGE",
        "SETUPMAPPING",
        "REMOVEMAPPING",
    ];
    match NAMES.get(opcode as usize) {
        Some(name) if !name.starts_with(|c: char| c.is_ascii_digit()) => (*name).to_string(),
        _ => format!("opcode {opcode}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_backend_rs::abi::fuse_abi::MkdirIn;

    #[test]
    fn chain_has_header_args_and_reply_space() {
        let req = Request::new(Opcode::Mkdir, 1)
            .arg(&MkdirIn {
                mode: 0o755,
                umask: 0,
            })
            .name("d")
            .reply_size(128);
        assert_eq!(req.total_len(), 40 + 8 + 2);
        let chain = req.to_chain(42);
        assert_eq!(chain.readable.len(), 3);
        let ChainPart::Data(hdr) = &chain.readable[0] else {
            panic!("header is data")
        };
        let hdr = InHeader::from_slice(hdr).unwrap();
        assert_eq!(
            (hdr.len, hdr.opcode, hdr.unique, hdr.nodeid),
            (50, 9, 42, 1)
        );
        assert!(matches!(
            chain.writable[..],
            [ChainPart::Space(16), ChainPart::Space(128)]
        ));
        let forget = Request::new(Opcode::Forget, 5).no_reply().to_chain(1);
        assert!(forget.writable.is_empty());
        let lying = Request::new(Opcode::Getattr, 1)
            .header_len(9999)
            .to_chain(1);
        let ChainPart::Data(hdr) = &lying.readable[0] else {
            panic!("header is data")
        };
        assert_eq!(InHeader::from_slice(hdr).unwrap().len, 9999);
    }

    #[test]
    fn split_readable_recuts_data() {
        let req = Request::new(Opcode::Lookup, 1).name("abc");
        let chain = req.to_chain(2).split_readable(&[20, 42]);
        let lens: Vec<usize> = chain
            .readable
            .iter()
            .map(|p| match p {
                ChainPart::Data(d) => d.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(lens, vec![20, 22, 2]);
        let every = req.to_chain(2).split_readable_every(1);
        assert_eq!(every.readable.len(), 44);
    }

    #[test]
    fn opcode_names() {
        assert_eq!(opcode_name(1), "LOOKUP");
        assert_eq!(opcode_name(45), "RENAME2");
        assert_eq!(opcode_name(7), "opcode 7");
        assert_eq!(opcode_name(9999), "opcode 9999");
    }
}
