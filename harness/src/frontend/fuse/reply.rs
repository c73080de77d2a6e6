//! Validation and parsing of FUSE replies.

use fuse_backend_rs::abi::fuse_abi::{Dirent, Direntplus, EntryOut, OutHeader};
use vm_memory::ByteValued;

use super::request::{opcode_name, OUT_HEADER_SIZE};
use crate::frontend::error::{Error, Result};

/// What came back for one submitted chain.
#[derive(Clone, Debug)]
pub struct Completion {
    /// Token returned by `submit`; equals the FUSE `unique` for FUSE requests.
    pub token: u64,
    /// FUSE opcode, or `None` for a raw chain.
    pub opcode: Option<u32>,
    /// Node id the request was addressed to (0 for raw chains).
    pub nodeid: u64,
    /// Length the device put in the used ring.
    pub used_len: u32,
    /// Contents of the device-writable buffers, concatenated, cut at `used_len`.
    pub written: Vec<u8>,
}

impl Completion {
    /// Checks the reply like a careful driver: out header present, `len`
    /// matching the used length, `unique` matching the request, errno sane.
    /// An errno reply becomes [`Error::Errno`].
    pub fn into_reply(self) -> Result<Reply> {
        let context = self.context();
        if self.used_len == 0 {
            return Err(Error::NoReply { context });
        }
        if self.written.len() < OUT_HEADER_SIZE {
            return Err(Error::bad_reply(
                context,
                format!("used len {} is shorter than the out header", self.used_len),
            ));
        }
        let header = *OutHeader::from_slice(&self.written[..OUT_HEADER_SIZE])
            .expect("slice has the header size");
        if header.unique != self.token {
            return Err(Error::bad_reply(
                context,
                format!("unique {} does not match request", header.unique),
            ));
        }
        if header.len != self.used_len {
            return Err(Error::bad_reply(
                context,
                format!(
                    "out header len {} but device used {} bytes",
                    header.len, self.used_len
                ),
            ));
        }
        if header.error > 0 || header.error < -4095 {
            return Err(Error::bad_reply(
                context,
                format!("error field {} is not 0 or a negative errno", header.error),
            ));
        }
        if header.error < 0 {
            if header.len as usize != OUT_HEADER_SIZE {
                return Err(Error::bad_reply(
                    context,
                    format!("errno {} reply carries {} bytes", -header.error, header.len),
                ));
            }
            return Err(Error::Errno {
                context,
                errno: -header.error,
            });
        }
        let mut body = self.written;
        body.drain(..OUT_HEADER_SIZE);
        Ok(Reply {
            context,
            header,
            body,
        })
    }

    fn context(&self) -> String {
        match self.opcode {
            Some(op) => format!(
                "{} nodeid {} unique {}",
                opcode_name(op),
                self.nodeid,
                self.token
            ),
            None => format!("raw chain {}", self.token),
        }
    }
}

/// A successful FUSE reply.
#[derive(Clone, Debug)]
pub struct Reply {
    /// "OPCODE nodeid N unique U", for error messages.
    pub context: String,
    pub header: OutHeader,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as exactly one `T`.
    pub fn parse<T: ByteValued>(&self) -> Result<T> {
        T::from_slice(&self.body).copied().ok_or_else(|| {
            Error::bad_reply(
                &self.context,
                format!(
                    "body is {} bytes, expected {}",
                    self.body.len(),
                    std::mem::size_of::<T>()
                ),
            )
        })
    }

    /// The body must be empty.
    pub fn expect_empty(&self) -> Result<()> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(Error::bad_reply(
                &self.context,
                format!("expected no body, got {} bytes", self.body.len()),
            ))
        }
    }
}

/// One READDIR entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// Offset to pass to the next READDIR to continue after this entry.
    pub off: u64,
    /// DT_* type.
    pub typ: u32,
    pub name: Vec<u8>,
}

impl DirEntry {
    /// Name as text (lossy), handy in assertions.
    pub fn name_str(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// One READDIRPLUS entry: lookup result plus directory entry.
#[derive(Clone, Debug)]
pub struct DirEntryPlus {
    pub entry: EntryOut,
    pub dirent: DirEntry,
}

/// Parses a READDIR body: `fuse_dirent` records padded to 8 bytes.
pub fn parse_dirents(context: &str, body: &[u8]) -> Result<Vec<DirEntry>> {
    parse_records(context, body, 0).map(|v| v.into_iter().map(|(_, d)| d).collect())
}

/// Parses a READDIRPLUS body: `fuse_direntplus` records padded to 8 bytes.
pub fn parse_direntplus(context: &str, body: &[u8]) -> Result<Vec<DirEntryPlus>> {
    let entries = parse_records(context, body, std::mem::size_of::<EntryOut>())?;
    Ok(entries
        .into_iter()
        .map(|(prefix, dirent)| DirEntryPlus {
            entry: *EntryOut::from_slice(prefix).expect("prefix has EntryOut size"),
            dirent,
        })
        .collect())
}

/// Splits `body` into (prefix bytes, dirent) records, where each record is
/// `prefix_len` bytes, a `fuse_dirent`, the name, and padding to 8 bytes.
fn parse_records<'a>(
    context: &str,
    body: &'a [u8],
    prefix_len: usize,
) -> Result<Vec<(&'a [u8], DirEntry)>> {
    let fixed = prefix_len + std::mem::size_of::<Dirent>();
    debug_assert!(prefix_len == 0 || fixed == std::mem::size_of::<Direntplus>());
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let at = body.len() - rest.len();
        let bad =
            |detail: String| Error::bad_reply(context, format!("entry at byte {at}: {detail}"));
        if rest.len() < fixed {
            return Err(bad(format!(
                "{} bytes left, record needs {fixed}",
                rest.len()
            )));
        }
        let dirent = *Dirent::from_slice(&rest[prefix_len..fixed]).expect("sized slice");
        let name_len = dirent.namelen as usize;
        if name_len == 0 || name_len > 1024 {
            return Err(bad(format!("name length {name_len}")));
        }
        let record_len = (fixed + name_len).div_ceil(8) * 8;
        if record_len > rest.len() {
            return Err(bad(format!(
                "record of {record_len} bytes overruns the {} left",
                rest.len()
            )));
        }
        let name = rest[fixed..fixed + name_len].to_vec();
        if name.contains(&0) || name.contains(&b'/') {
            return Err(bad(format!("name {name:?} contains NUL or '/'")));
        }
        out.push((
            &rest[..prefix_len],
            DirEntry {
                ino: dirent.ino,
                off: dirent.off,
                typ: dirent.type_,
                name,
            },
        ));
        rest = &rest[record_len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(header: OutHeader, body: &[u8], used_len: u32) -> Completion {
        let mut written = header.as_slice().to_vec();
        written.extend_from_slice(body);
        written.truncate(used_len as usize);
        Completion {
            token: 7,
            opcode: Some(3),
            nodeid: 1,
            used_len,
            written,
        }
    }

    #[test]
    fn reply_validation() {
        let ok = OutHeader {
            len: 20,
            error: 0,
            unique: 7,
        };
        let reply = completion(ok, &[1, 2, 3, 4], 20).into_reply().unwrap();
        assert_eq!(reply.body, [1, 2, 3, 4]);
        assert_eq!(reply.parse::<u32>().unwrap(), 0x04030201);
        assert!(reply.parse::<u64>().is_err());

        let wrong_unique = OutHeader { unique: 8, ..ok };
        assert!(matches!(
            completion(wrong_unique, &[0; 4], 20).into_reply(),
            Err(Error::BadReply { .. })
        ));
        let err = completion(ok, &[0; 4], 18).into_reply().unwrap_err();
        assert!(
            err.to_string().contains("GETATTR nodeid 1 unique 7"),
            "{err}"
        );
        assert!(matches!(
            completion(ok, &[], 8).into_reply(),
            Err(Error::BadReply { .. })
        ));
        assert!(matches!(
            completion(ok, &[], 0).into_reply(),
            Err(Error::NoReply { .. })
        ));

        let enoent = OutHeader {
            len: 16,
            error: -2,
            unique: 7,
        };
        assert_eq!(
            completion(enoent, &[], 16)
                .into_reply()
                .unwrap_err()
                .errno(),
            Some(2)
        );
        let positive = OutHeader { error: 5, ..enoent };
        assert!(completion(positive, &[], 16)
            .into_reply()
            .unwrap_err()
            .errno()
            .is_none());
        let errno_with_body = OutHeader { len: 20, ..enoent };
        assert!(completion(errno_with_body, &[0; 4], 20)
            .into_reply()
            .unwrap_err()
            .errno()
            .is_none());
    }

    fn dirent_bytes(ino: u64, off: u64, name: &[u8]) -> Vec<u8> {
        let d = Dirent {
            ino,
            off,
            namelen: name.len() as u32,
            type_: 8,
        };
        let mut v = d.as_slice().to_vec();
        v.extend_from_slice(name);
        v.resize(v.len().div_ceil(8) * 8, 0);
        v
    }

    #[test]
    fn dirent_parsing() {
        let mut body = dirent_bytes(10, 1, b"a");
        body.extend(dirent_bytes(11, 2, b"longer-name"));
        let entries = parse_dirents("t", &body).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].name_str(), "longer-name");
        assert_eq!((entries[1].ino, entries[1].off), (11, 2));
        assert!(parse_dirents("t", &body[..body.len() - 8]).is_err());
        assert!(parse_dirents("t", &dirent_bytes(1, 1, b"a/b")).is_err());

        let mut plus = EntryOut {
            nodeid: 99,
            ..Default::default()
        }
        .as_slice()
        .to_vec();
        plus.extend(dirent_bytes(12, 3, b"f"));
        let entries = parse_direntplus("t", &plus).unwrap();
        assert_eq!(entries[0].entry.nodeid, 99);
        assert_eq!(entries[0].dirent.name, b"f");
    }
}
