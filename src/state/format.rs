//! The device state's serialized form: what a guest's FUSE session is, as plain data,
//! written by a source daemon and read by a destination one (another host, another
//! version, a restore from a file). docs/DEVICE-STATE.md describes it for readers
//! outside this code.
//!
//! ```text
//! magic "VOLFSDST" | format version u32 LE | body length u64 LE | body (postcard)
//! ```
//! The body is [`SessionState`] encoded with postcard (serde's compact binary form,
//! the format virtiofsd's device state uses). The header lets a reader refuse what is
//! not a state, a state of another format version, and a truncated or padded one,
//! each with an error naming what is wrong, before decoding anything.
//!
//! The bytes come from wherever the VMM got them: a reader treats them as hostile.
//! [`decode`] bounds the total size and every count, and checks that the body decodes
//! to exactly its length; what the values mean (paths, ids) is checked by the loader.

use serde::{Deserialize, Serialize};

/// The first bytes of every state.
pub const MAGIC: [u8; 8] = *b"VOLFSDST";
/// The format this daemon writes; it reads exactly this one. A new format version
/// comes with a reader for the older ones it accepts.
pub const FORMAT_VERSION: u32 = 1;
/// The largest state accepted (a million held nodes with 100-byte paths take about
/// 150 MB): a bound on what a hostile stream can make the loader allocate.
pub const MAX_STATE_BYTES: u64 = 1 << 30;
/// Bytes of the header before the body.
pub const HEADER_LEN: usize = 8 + 4 + 8;

/// A guest's session: everything a daemon needs to serve the same guest kernel on
/// with the node ids, handles and locks it holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    /// The writer's version string (`volfsd 0.1.0`), for messages only.
    pub written_by: String,
    /// The options the guest's view depends on: a reader with other values refuses.
    pub config: GuestView,
    /// The FUSE session as INIT negotiated it; None before the guest's INIT.
    pub fuse: Option<FuseSession>,
    /// The attached volumes, and the virtual directories above nested ones.
    pub volumes: Vec<Volume>,
    pub virtual_dirs: Vec<VirtualDir>,
    /// Every node id the guest holds (volume roots included), parents before
    /// children where the writer knew the parent.
    pub nodes: Vec<Node>,
    /// The next node id the writer would have handed out.
    pub next_node_id: u64,
    pub handles: Vec<Handle>,
    pub next_handle_id: u64,
    pub locks: Vec<Lock>,
    /// Requests the guest sent that were not answered when the rings stopped (lock
    /// waits, throttled requests): the reader answers them on the same rings.
    pub parked: Vec<ParkedRequest>,
    /// Where a reader on the same host may fetch the writer's open files (lock files
    /// and locked handles), so that the guest's locks are never let go.
    pub handoff: Option<Handoff>,
}

/// The options a guest's view depends on. Compared field by field on load.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestView {
    /// `--cache`: timeouts and direct I/O the guest relies on.
    pub cache: String,
    /// `--xattr`, `--allow-privileged-xattrs`.
    pub xattr: bool,
    pub privileged_xattrs: bool,
    /// `--translate-uid`/`--translate-gid` rules, as given.
    pub translate_uid: Vec<String>,
    pub translate_gid: Vec<String>,
    /// No `--allowed-dir`: the whole SharedDir is the mount root.
    pub whole_share: bool,
}

/// What the guest's FUSE_INIT negotiated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseSession {
    /// The protocol minor the guest spoke.
    pub minor: u32,
    /// The flags the guest offered (flags | flags2 << 32).
    pub offered: u64,
    /// The flags the daemon granted; a reader must grant the same for the same offer.
    pub granted: u64,
}

/// An attached volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Volume {
    /// Where the guest sees it, joined with `/` (empty in the whole-share layout).
    pub name: String,
    pub read_only: bool,
    pub volume_id: Option<String>,
    pub rate_limit: Option<RateLimit>,
    /// Its root's node id.
    pub root: u64,
}

/// A volume's rate limits (the control API's `rate_limiter`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub ops: Option<Bucket>,
    pub bandwidth: Option<Bucket>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub size: u64,
    pub one_time_burst: u64,
    pub refill_time_ms: u64,
}

/// A virtual directory above nested volumes (`rw` of `rw/vol-a`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtualDir {
    /// Its guest path, joined with `/`.
    pub path: String,
    pub nodeid: u64,
}

/// A node id the guest holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: u64,
    /// Lookups the guest holds on it (FUSE's nlookup).
    pub lookups: u64,
    /// Index into [`SessionState::volumes`].
    pub volume: u32,
    /// `S_IFMT` bits of the inode.
    pub file_type: u32,
    pub location: Location,
    /// The inode's file handle, where the writer could make one: what a reader
    /// compares with (`--migration-verify-handles`) or opens (`--migration-mode
    /// file-handles`).
    pub file_handle: Option<FileHandle>,
}

/// Where a node is, relative to its volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Location {
    /// The volume's root.
    Root,
    /// `name` in the directory node `parent` (one path component).
    Child { parent: u64, name: Vec<u8> },
    /// A path below the volume's root, components joined with `/`, where the parent
    /// is no node the guest holds.
    Path(Vec<u8>),
    /// The writer could not tell where it is (unlinked while held, say).
    Unknown,
}

/// A `struct file_handle` as `name_to_handle_at` made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHandle {
    pub handle_type: i32,
    pub bytes: Vec<u8>,
}

/// An open file or directory the guest holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handle {
    pub id: u64,
    pub node: u64,
    /// The host open flags, without O_CREAT, O_EXCL and O_TRUNC.
    pub flags: i32,
    /// A directory stream's position: the offset after the last entry given out.
    pub dir_offset: Option<u64>,
}

/// A lock the guest holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lock {
    /// A POSIX or OFD lock (the guest kernel's lock owner) on a range of a node.
    Posix {
        node: u64,
        owner: u64,
        /// `O_RDONLY`, `O_WRONLY` or `O_RDWR`: the lock file's access mode.
        access: i32,
        start: u64,
        /// Inclusive; `i64::MAX` is "to the end of the file".
        end: u64,
        /// `F_RDLCK` or `F_WRLCK`.
        kind: i32,
    },
    /// A flock on an open handle.
    Flock { handle: u64, kind: i32 },
}

/// A request that was taken off a ring and not answered yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedRequest {
    /// The device's queue index (1..: request queues).
    pub queue: u16,
    /// The head descriptor of its chain.
    pub head: u16,
    /// The request as the guest sent it (header included; a WRITE's data is not kept:
    /// only requests without data are parked).
    pub request: Vec<u8>,
}

/// The writer's offer of its open files to a reader on the same host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    /// `/proc/sys/kernel/random/boot_id` of the writer's host: another boot, another
    /// host, no hand-off.
    pub boot_id: String,
    /// The abstract Unix socket name (without the leading NUL).
    pub socket: String,
    /// What a reader presents before it gets anything (random, 32 bytes).
    pub token: Vec<u8>,
}

/// The first bytes of a preview (same host, an upgrade's only: [`Preview`]).
pub const PREVIEW_MAGIC: [u8; 8] = *b"VOLFSDPV";
/// The first bytes of an upgrade's state written after a preview ([`UpgradeState`]).
pub const UPGRADE_MAGIC: [u8; 8] = *b"VOLFSDUP";
/// The format of both same-host variants; a reader reads exactly this one.
pub const UPGRADE_FORMAT_VERSION: u32 = 1;

/// An upgrade's preview of the nodes the guest holds, taken while the old serving
/// process still serves (`src/keeper/upgrade.rs`): the new process opens each one
/// as a load does and keeps it aside. Never a migration's state: only the keeper
/// moves it, between two processes on one host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Preview {
    /// Which preview (the writer's count): an [`UpgradeState`] names it.
    pub id: u64,
    /// The nodes as a state names them (no handles, locks, requests or INIT).
    pub state: SessionState,
    /// Each node's `(st_dev, st_ino)` at the writer, in the order of
    /// `state.nodes`: the reader keeps a node only if what it opened is that inode.
    pub keys: Vec<(u64, u64)>,
}

/// A node of an [`UpgradeState`] that is the one its preview named (a node id is
/// one inode for its whole life): only what changes with the guest's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previewed {
    pub id: u64,
    pub lookups: u64,
}

/// An upgrade's state after a preview: the nodes of the preview that still live as
/// [`Previewed`] records, everything else as a device state has it (the nodes new
/// since the preview in full, handles, locks, requests, the hand-over's offer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UpgradeState {
    /// The [`Preview::id`] the reader must have loaded.
    pub preview: u64,
    pub previewed: Vec<Previewed>,
    pub state: SessionState,
}

/// Which kind of bytes a reader got, by their magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    State,
    Preview,
    Upgrade,
    Unknown,
}

/// The kind of `bytes`, from their first 8.
pub fn kind(bytes: &[u8]) -> Kind {
    match bytes.get(..8) {
        Some(m) if m == MAGIC => Kind::State,
        Some(m) if m == PREVIEW_MAGIC => Kind::Preview,
        Some(m) if m == UPGRADE_MAGIC => Kind::Upgrade,
        _ => Kind::Unknown,
    }
}

/// Why a state could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Not a device state of volfsd (the first bytes).
    NotAState,
    /// A format version this daemon does not read.
    Version { found: u32, supported: u32 },
    /// The header names a body larger than the daemon accepts.
    Oversized { length: u64, max: u64 },
    /// The bytes end before the body does.
    Truncated { expected: u64, got: u64 },
    /// Bytes follow the body.
    Trailing { length: u64, extra: u64 },
    /// The body does not decode.
    Malformed(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::NotAState => write!(f, "not a volfsd device state (no VOLFSDST magic)"),
            DecodeError::Version { found, supported } => write!(
                f,
                "device state format version {found}; this daemon reads version {supported}"
            ),
            DecodeError::Oversized { length, max } => {
                write!(
                    f,
                    "device state of {length} bytes; at most {max} are accepted"
                )
            }
            DecodeError::Truncated { expected, got } => write!(
                f,
                "device state truncated: its header names {expected} bytes of body, {got} came"
            ),
            DecodeError::Trailing { length, extra } => write!(
                f,
                "device state of {length} bytes followed by {extra} more: refused"
            ),
            DecodeError::Malformed(why) => write!(f, "device state body does not decode: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The state as bytes: header, then the postcard body.
pub fn encode(state: &SessionState) -> Vec<u8> {
    encode_as(&MAGIC, FORMAT_VERSION, state)
}

/// A preview as bytes (same header, its own magic).
pub fn encode_preview(preview: &Preview) -> Vec<u8> {
    encode_as(&PREVIEW_MAGIC, UPGRADE_FORMAT_VERSION, preview)
}

/// An upgrade's state after a preview as bytes.
pub fn encode_upgrade(state: &UpgradeState) -> Vec<u8> {
    encode_as(&UPGRADE_MAGIC, UPGRADE_FORMAT_VERSION, state)
}

fn encode_as<T: Serialize>(magic: &[u8; 8], version: u32, value: &T) -> Vec<u8> {
    // Serializing plain data to a Vec cannot fail.
    let body = postcard::to_stdvec(value).expect("a session state serializes");
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Checks the header of `bytes` (at least [`HEADER_LEN`] of them) and returns the
/// body length it names.
pub fn body_length(header: &[u8]) -> Result<u64, DecodeError> {
    body_length_as(header, &MAGIC, FORMAT_VERSION)
}

/// [`body_length`] for a state or either same-host variant, by its magic.
pub fn body_length_any(header: &[u8]) -> Result<u64, DecodeError> {
    match kind(header) {
        Kind::Preview => body_length_as(header, &PREVIEW_MAGIC, UPGRADE_FORMAT_VERSION),
        Kind::Upgrade => body_length_as(header, &UPGRADE_MAGIC, UPGRADE_FORMAT_VERSION),
        Kind::State | Kind::Unknown => body_length(header),
    }
}

fn body_length_as(header: &[u8], magic: &[u8; 8], supported: u32) -> Result<u64, DecodeError> {
    if header.len() < HEADER_LEN || header[..8] != *magic {
        return Err(DecodeError::NotAState);
    }
    let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if version != supported {
        return Err(DecodeError::Version {
            found: version,
            supported,
        });
    }
    let length = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    if length > MAX_STATE_BYTES {
        return Err(DecodeError::Oversized {
            length,
            max: MAX_STATE_BYTES,
        });
    }
    Ok(length)
}

/// Reads a whole state. Decoding allocates no more than the input's length allows:
/// postcard's sequences grow as elements actually decode.
pub fn decode(bytes: &[u8]) -> Result<SessionState, DecodeError> {
    decode_as(bytes, &MAGIC, FORMAT_VERSION)
}

/// Reads a whole preview, as [`decode`] a state.
pub fn decode_preview(bytes: &[u8]) -> Result<Preview, DecodeError> {
    decode_as(bytes, &PREVIEW_MAGIC, UPGRADE_FORMAT_VERSION)
}

/// Reads a whole upgrade's state after a preview, as [`decode`] a state.
pub fn decode_upgrade(bytes: &[u8]) -> Result<UpgradeState, DecodeError> {
    decode_as(bytes, &UPGRADE_MAGIC, UPGRADE_FORMAT_VERSION)
}

fn decode_as<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    magic: &[u8; 8],
    supported: u32,
) -> Result<T, DecodeError> {
    let length = body_length_as(bytes, magic, supported)?;
    let body = &bytes[HEADER_LEN..];
    let got = body.len() as u64;
    if got < length {
        return Err(DecodeError::Truncated {
            expected: length,
            got,
        });
    }
    if got > length {
        return Err(DecodeError::Trailing {
            length,
            extra: got - length,
        });
    }
    let (value, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed(format!(
            "{} bytes left after the session",
            rest.len()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SessionState {
        SessionState {
            written_by: "volfsd test".into(),
            config: GuestView {
                cache: "none".into(),
                ..Default::default()
            },
            fuse: Some(FuseSession {
                minor: 41,
                offered: 0xffff,
                granted: 0x1234,
            }),
            volumes: vec![Volume {
                name: "data".into(),
                read_only: false,
                volume_id: Some("vol-1".into()),
                rate_limit: Some(RateLimit {
                    ops: Some(Bucket {
                        size: 100,
                        one_time_burst: 0,
                        refill_time_ms: 1000,
                    }),
                    bandwidth: None,
                }),
                root: 2,
            }],
            virtual_dirs: vec![],
            nodes: vec![
                Node {
                    id: 2,
                    lookups: 1,
                    volume: 0,
                    file_type: libc::S_IFDIR,
                    location: Location::Root,
                    file_handle: None,
                },
                Node {
                    id: 5,
                    lookups: 3,
                    volume: 0,
                    file_type: libc::S_IFREG,
                    location: Location::Child {
                        parent: 2,
                        name: b"f".to_vec(),
                    },
                    file_handle: Some(FileHandle {
                        handle_type: 1,
                        bytes: vec![1, 2, 3, 4, 5, 6, 7, 8],
                    }),
                },
            ],
            next_node_id: 6,
            handles: vec![Handle {
                id: 1,
                node: 5,
                flags: libc::O_RDWR | libc::O_APPEND,
                dir_offset: None,
            }],
            next_handle_id: 2,
            locks: vec![Lock::Posix {
                node: 5,
                owner: 77,
                access: libc::O_RDWR,
                start: 0,
                end: i64::MAX as u64,
                kind: libc::F_WRLCK,
            }],
            parked: vec![],
            handoff: None,
        }
    }

    #[test]
    fn a_state_round_trips() {
        let s = sample();
        assert_eq!(decode(&encode(&s)).unwrap(), s);
    }

    #[test]
    fn the_same_host_variants_round_trip_and_are_no_state() {
        let preview = Preview {
            id: 3,
            state: sample(),
            keys: vec![(1, 2), (1, 3)],
        };
        let bytes = encode_preview(&preview);
        assert_eq!(kind(&bytes), Kind::Preview);
        assert_eq!(decode_preview(&bytes).unwrap(), preview);
        assert_eq!(decode(&bytes), Err(DecodeError::NotAState));
        let up = UpgradeState {
            preview: 3,
            previewed: vec![Previewed { id: 5, lookups: 2 }],
            state: sample(),
        };
        let bytes = encode_upgrade(&up);
        assert_eq!(kind(&bytes), Kind::Upgrade);
        assert_eq!(decode_upgrade(&bytes).unwrap(), up);
        assert_eq!(decode(&bytes), Err(DecodeError::NotAState));
        assert_eq!(kind(&encode(&sample())), Kind::State);
        assert_eq!(kind(b"hello"), Kind::Unknown);
    }

    #[test]
    fn what_is_not_a_whole_state_of_this_version_is_named() {
        let bytes = encode(&sample());
        assert_eq!(decode(b"hello"), Err(DecodeError::NotAState));
        let mut other = bytes.clone();
        other[8] = 9;
        assert_eq!(
            decode(&other),
            Err(DecodeError::Version {
                found: 9,
                supported: FORMAT_VERSION
            })
        );
        let cut = &bytes[..bytes.len() - 3];
        assert!(matches!(decode(cut), Err(DecodeError::Truncated { .. })));
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(matches!(
            decode(&padded),
            Err(DecodeError::Trailing { extra: 1, .. })
        ));
        let mut huge = bytes.clone();
        huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode(&huge), Err(DecodeError::Oversized { .. })));
    }

    #[test]
    fn a_body_of_the_right_length_that_lies_about_its_counts_is_malformed() {
        // A node list claiming 2^60 entries in a 20-byte body: refused without a
        // 2^60-entry allocation.
        let mut body = Vec::new();
        body.push(0); // written_by: empty string
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // empty config strings and bools
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&body);
        assert!(matches!(decode(&bytes), Err(DecodeError::Malformed(_))));
    }
}
