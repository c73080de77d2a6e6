//! Target `fuse`: FUSE request decoding and handling by `FsServer` (fuse-backend-rs's
//! server + volfsd's stack) on a SharedDir with a read-write volume `rw` and a
//! read-only volume `ro` (`--allowed-dir rw --allowed-dir ro:ro --xattr`).
//!
//! Input: a sequence of records, each
//! ```text
//! opcode u8 | node u8 | fh u8 | flags u8 | body_len u16 LE | body (body_len bytes)
//! ```
//! sent as one FUSE request (header built by the harness, `unique` = record index).
//! `node`: 0 = the root (1); 1..=0x7f = a node id taken from an earlier reply
//! (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, CREATE, TMPFILE, READDIRPLUS), by index
//! modulo their count (the root if none yet); 0x80.. = that raw value. `fh`: 0xff =
//! body as given, else a handle from an earlier OPEN/OPENDIR/CREATE/TMPFILE reply
//! (by index modulo their count) is written over the body's `fh` field(s) (for
//! COPY_FILE_RANGE also `nodeid_out` = the request's node); for RENAME, RENAME2
//! and LINK it picks an earlier node id for `newdir`/`oldnodeid` instead. `flags`
//! bit 0: the request comes from uid/gid 1000 instead of 0. A fresh stack is
//! built for every input and an INIT is sent first, so requests are served.
//!
//! The harness changes three things a single-threaded caller cannot survive, and
//! says so: SETLKW becomes SETLK (a blocking lock wait; the daemon runs those off
//! its queue threads), OPEN/OPENDIR/CREATE/TMPFILE get O_NONBLOCK (opening a FIFO
//! would block), and MKNOD of a character or block device gets rdev 1:3
//! (/dev/null), so that no input reaches a real device of the machine.
//!
//! Oracle: no panic; every request returns within 2 s (a watchdog aborts the
//! process otherwise); every reply is well-formed (length = bytes written, negative
//! errno, unique echoed); after each input no fd of the process opened since
//! start-up refers to anything outside the scratch SharedDir, and none is a
//! device; the read-only volume (names, kinds, sizes, modes, owners, contents,
//! xattr names) is unchanged.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use fuse_backend_rs::transport::{FuseDevWriter, Writer};
use volfsd::exports::fs::{self, CacheMode, FsServer, PassthroughConfig, ShareSpec};

use crate::common::{
    check_fds, limit_file_size, open_fds, tree_checksum, Cursor, Scratch, Watchdog,
};

pub const IN_HEADER_LEN: usize = 40;
const OUT_HEADER_LEN: usize = 16;
const ENTRY_OUT_LEN: usize = 128;
const MAX_RECORDS: usize = 64;
/// What one request may take before it counts as stuck (the watchdog aborts).
const MAX_REQUEST_TIME: std::time::Duration = std::time::Duration::from_secs(2);
const MAX_BODY: usize = 64 * 1024;
/// Largest reply: a READ of max_pages (256) pages plus the header.
const REPLY_BUF: usize = 1024 * 1024 + 4096;

pub mod op {
    pub const LOOKUP: u8 = 1;
    pub const FORGET: u8 = 2;
    pub const GETATTR: u8 = 3;
    pub const SETATTR: u8 = 4;
    pub const READLINK: u8 = 5;
    pub const SYMLINK: u8 = 6;
    pub const MKNOD: u8 = 8;
    pub const MKDIR: u8 = 9;
    pub const UNLINK: u8 = 10;
    pub const RMDIR: u8 = 11;
    pub const RENAME: u8 = 12;
    pub const LINK: u8 = 13;
    pub const OPEN: u8 = 14;
    pub const READ: u8 = 15;
    pub const WRITE: u8 = 16;
    pub const STATFS: u8 = 17;
    pub const RELEASE: u8 = 18;
    pub const FSYNC: u8 = 20;
    pub const SETXATTR: u8 = 21;
    pub const GETXATTR: u8 = 22;
    pub const LISTXATTR: u8 = 23;
    pub const REMOVEXATTR: u8 = 24;
    pub const FLUSH: u8 = 25;
    pub const INIT: u8 = 26;
    pub const OPENDIR: u8 = 27;
    pub const READDIR: u8 = 28;
    pub const RELEASEDIR: u8 = 29;
    pub const GETLK: u8 = 31;
    pub const SETLK: u8 = 32;
    pub const SETLKW: u8 = 33;
    pub const ACCESS: u8 = 34;
    pub const CREATE: u8 = 35;
    pub const BATCH_FORGET: u8 = 42;
    pub const FALLOCATE: u8 = 43;
    pub const READDIRPLUS: u8 = 44;
    pub const RENAME2: u8 = 45;
    pub const LSEEK: u8 = 46;
    pub const COPY_FILE_RANGE: u8 = 47;
    pub const SYNCFS: u8 = 50;
    pub const TMPFILE: u8 = 51;
    pub const STATX: u8 = 52;
}

/// The INIT body the harness sends first (FUSE 7.38, the flags a Linux guest asks).
pub fn init_body() -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&7u32.to_le_bytes()); // major
    b.extend_from_slice(&38u32.to_le_bytes()); // minor
    b.extend_from_slice(&(128u32 * 1024).to_le_bytes()); // max_readahead
    b.extend_from_slice(&0xffff_ffffu32.to_le_bytes()); // flags: everything
    b.extend_from_slice(&0x0000_03ffu32.to_le_bytes()); // flags2
    b.extend_from_slice(&[0u8; 44]);
    b
}

/// One FUSE request: header + body.
pub fn request(opcode: u32, unique: u64, nodeid: u64, uid: u32, body: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(IN_HEADER_LEN + body.len());
    r.extend_from_slice(&((IN_HEADER_LEN + body.len()) as u32).to_le_bytes());
    r.extend_from_slice(&opcode.to_le_bytes());
    r.extend_from_slice(&unique.to_le_bytes());
    r.extend_from_slice(&nodeid.to_le_bytes());
    r.extend_from_slice(&uid.to_le_bytes()); // uid
    r.extend_from_slice(&uid.to_le_bytes()); // gid
    r.extend_from_slice(&4242u32.to_le_bytes()); // pid
    r.extend_from_slice(&[0u8; 4]); // total_extlen, padding
    r.extend_from_slice(body);
    r
}

/// One input record (see the module doc); used by the seed generator too.
pub fn record(opcode: u8, node: u8, fh: u8, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![opcode, node, fh, flags];
    r.extend_from_slice(&(body.len() as u16).to_le_bytes());
    r.extend_from_slice(body);
    r
}

struct State {
    scratch: Scratch,
    ro_sum: u64,
    specs: Vec<ShareSpec>,
    /// Where replies land: FuseDevWriter write()s each reply to this memfd.
    replies: File,
    reply_buf: Vec<u8>,
}

fn populate_rw(rw: &Path) {
    std::fs::create_dir_all(rw.join("d")).unwrap();
    std::fs::write(rw.join("f"), b"rw-data\n").unwrap();
    std::fs::write(rw.join("d/g"), vec![b'g'; 5000]).unwrap();
    let _ = std::os::unix::fs::symlink("f", rw.join("l"));
}

fn clear_dir(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => {
                    // Give back write permission a request may have removed.
                    let _ = std::fs::set_permissions(
                        &p,
                        std::os::unix::fs::PermissionsExt::from_mode(0o755),
                    );
                    clear_dir(&p);
                    let _ = std::fs::remove_dir(&p);
                }
                _ => {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
    }
}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| {
        let scratch = Scratch::new("fuse", Some(64));
        if !scratch.on_tmpfs() {
            limit_file_size(64 << 20);
        }
        let p = scratch.path().to_path_buf();
        std::fs::create_dir_all(p.join("rw")).unwrap();
        populate_rw(&p.join("rw"));
        let ro = p.join("ro");
        std::fs::create_dir_all(ro.join("d/e")).unwrap();
        std::fs::write(ro.join("f"), b"ro-data\n").unwrap();
        std::fs::write(ro.join("d/g"), vec![b'r'; 9000]).unwrap();
        std::fs::write(ro.join("x"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            ro.join("x"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let _ = std::os::unix::fs::symlink("f", ro.join("l"));
        let _ = xattr_set(&ro.join("f"), "user.tag", b"v");
        std::fs::create_dir_all(p.join("hidden")).unwrap();
        std::fs::write(p.join("hidden/secret"), b"SECRET").unwrap();
        let specs = volfsd::exports::config::parse_allowed_dirs(
            &p,
            &["rw".to_string(), "ro:ro".to_string()],
        )
        .unwrap();
        // SAFETY: memfd_create with a valid name; the fd is owned by the File.
        let replies = unsafe {
            let fd = libc::memfd_create(c"volfsd-fuzz-replies".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create");
            File::from_raw_fd(fd)
        };
        let ro_sum = tree_checksum(&ro);
        Mutex::new(State {
            scratch,
            ro_sum,
            specs,
            replies,
            reply_buf: vec![0u8; REPLY_BUF],
        })
    })
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends one request; returns the reply bytes (empty when none was written).
fn send(server: &FsServer, st: &mut State, mut req: Vec<u8>) -> Vec<u8> {
    let State {
        replies, reply_buf, ..
    } = st;
    let fd = replies.as_raw_fd();
    {
        let writer = match FuseDevWriter::<()>::new(fd, reply_buf) {
            Ok(w) => Writer::FuseDev(w),
            Err(_) => return Vec::new(),
        };
        Watchdog::arm(MAX_REQUEST_TIME, "FsServer::handle_local");
        let _ = server.handle_local(&mut req, writer);
        Watchdog::disarm();
    }
    // SAFETY: plain syscalls on our memfd; the buffer is sized to what we read.
    unsafe {
        let len = libc::lseek(fd, 0, libc::SEEK_CUR);
        let mut out = vec![0u8; len.max(0) as usize];
        let n = libc::pread(fd, out.as_mut_ptr() as *mut libc::c_void, out.len(), 0);
        out.truncate(n.max(0) as usize);
        libc::ftruncate(fd, 0);
        libc::lseek(fd, 0, libc::SEEK_SET);
        out
    }
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    b.get(off..off + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
}

fn check_reply(opcode: u8, unique: u64, reply: &[u8]) {
    if reply.is_empty() {
        return; // FORGET, BATCH_FORGET, INTERRUPT; or a request that failed to decode
    }
    assert!(
        reply.len() >= OUT_HEADER_LEN,
        "opcode {opcode}: reply of {} bytes, shorter than its header",
        reply.len()
    );
    let len = u32_at(reply, 0).unwrap() as usize;
    let error = u32_at(reply, 4).unwrap() as i32;
    let uniq = u64_at(reply, 8).unwrap();
    assert_eq!(
        len,
        reply.len(),
        "opcode {opcode}: header length != bytes written"
    );
    assert_eq!(uniq, unique, "opcode {opcode}: unique not echoed");
    assert!(
        error <= 0 && error > -4096,
        "opcode {opcode}: error {error} is not a negative errno"
    );
    if error < 0 {
        assert_eq!(
            len, OUT_HEADER_LEN,
            "opcode {opcode}: error reply with a body"
        );
    }
}

/// Harvests node ids and handles from a successful reply.
fn harvest(opcode: u8, reply: &[u8], nodes: &mut Vec<u64>, handles: &mut Vec<u64>) {
    if reply.len() < OUT_HEADER_LEN || u32_at(reply, 4) != Some(0) {
        return;
    }
    let body = &reply[OUT_HEADER_LEN..];
    let push = |v: &mut Vec<u64>, x: Option<u64>| {
        if let Some(x) = x {
            if x != 0 && v.len() < 64 {
                v.push(x);
            }
        }
    };
    match opcode {
        op::LOOKUP | op::MKNOD | op::MKDIR | op::SYMLINK | op::LINK => {
            push(nodes, u64_at(body, 0));
        }
        op::CREATE | op::TMPFILE => {
            push(nodes, u64_at(body, 0));
            push(handles, u64_at(body, ENTRY_OUT_LEN));
        }
        op::OPEN | op::OPENDIR => push(handles, u64_at(body, 0)),
        op::READDIRPLUS => {
            let mut off = 0;
            while off + ENTRY_OUT_LEN + 24 <= body.len() {
                push(nodes, u64_at(body, off));
                let namelen = u32_at(body, off + ENTRY_OUT_LEN + 16).unwrap() as usize;
                let rec = ENTRY_OUT_LEN + 24 + namelen;
                off += (rec + 7) & !7;
            }
        }
        _ => {}
    }
}

/// Rewrites what a single-threaded harness cannot survive (see the module doc).
fn sanitize(opcode: &mut u8, body: &mut [u8]) {
    let or_flags = |body: &mut [u8], off: usize, bits: u32| {
        if let Some(s) = body.get_mut(off..off + 4) {
            let v = u32::from_le_bytes((&*s).try_into().unwrap()) | bits;
            s.copy_from_slice(&v.to_le_bytes());
        }
    };
    match *opcode {
        op::SETLKW => *opcode = op::SETLK,
        op::OPEN | op::OPENDIR | op::CREATE | op::TMPFILE => {
            or_flags(body, 0, libc::O_NONBLOCK as u32)
        }
        op::MKNOD => {
            if let Some(mode) = u32_at(body, 0) {
                let fmt = mode & libc::S_IFMT;
                if (fmt == libc::S_IFCHR || fmt == libc::S_IFBLK) && body.len() >= 8 {
                    // rdev = makedev(1, 3): /dev/null.
                    body[4..8].copy_from_slice(&((1u32 << 8) | 3).to_le_bytes());
                }
            }
        }
        _ => {}
    }
}

/// `VOLFSD_FUZZ_TRACE=1` prints each request's outcome (for checking seeds).
pub fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("VOLFSD_FUZZ_TRACE").is_some())
}

/// Writes ids from earlier replies over the body's id fields (see the module doc).
fn patch_ids(opcode: u8, sel: u8, nodeid: u64, nodes: &[u64], handles: &[u64], body: &mut [u8]) {
    let mut put = |off: usize, v: u64| {
        if let Some(s) = body.get_mut(off..off + 8) {
            s.copy_from_slice(&v.to_le_bytes());
        }
    };
    match opcode {
        // newdir / oldnodeid: a node id, not a handle.
        op::RENAME | op::RENAME2 | op::LINK => {
            if !nodes.is_empty() {
                put(0, nodes[sel as usize % nodes.len()]);
            }
        }
        _ => {
            if handles.is_empty() {
                return;
            }
            let fh = handles[sel as usize % handles.len()];
            for off in fh_offsets(opcode) {
                put(*off, fh);
            }
            if opcode == op::COPY_FILE_RANGE {
                put(16, nodeid); // nodeid_out: the same file
            }
        }
    }
}

/// Where the `fh` fields sit in a request body.
fn fh_offsets(opcode: u8) -> &'static [usize] {
    match opcode {
        op::GETATTR | op::SETATTR | op::STATX => &[8],
        op::COPY_FILE_RANGE => &[0, 24],
        _ => &[0],
    }
}

pub fn run_fuse(data: &[u8]) {
    let mut guard = state().lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut *guard;
    let root = st.scratch.path().to_path_buf();
    let rw = root.join("rw");
    clear_dir(&rw);
    populate_rw(&rw);

    let stack = fs::build(
        &root,
        Some(&st.specs),
        false,
        PassthroughConfig::new(CacheMode::None, true),
    )
    .expect("building the file system stack (needs root for open_tree)");
    let server = FsServer::new(&stack);
    drop(stack);
    // The stack's own fds (share roots, SharedDir, /proc/self/fd) are its business;
    // what the requests open is checked.
    let baseline = open_fds();

    let reply = send(&server, st, request(op::INIT as u32, 0, 0, 0, &init_body()));
    check_reply(op::INIT, 0, &reply);
    assert_eq!(u32_at(&reply, 4), Some(0), "INIT failed");

    let mut nodes: Vec<u64> = Vec::new();
    let mut handles: Vec<u64> = Vec::new();
    let mut c = Cursor::new(data);
    for unique in 1..=MAX_RECORDS as u64 {
        if c.is_empty() {
            break;
        }
        let mut opcode = c.u8();
        let node_sel = c.u8();
        let fh_sel = c.u8();
        let flags = c.u8();
        let len = (c.u16() as usize).min(MAX_BODY);
        let mut body = c.take(len).to_vec();
        let nodeid = match node_sel {
            0 => 1,
            1..=0x7f => {
                if nodes.is_empty() {
                    1
                } else {
                    nodes[(node_sel as usize - 1) % nodes.len()]
                }
            }
            raw => raw as u64,
        };
        if fh_sel != 0xff {
            patch_ids(opcode, fh_sel, nodeid, &nodes, &handles, &mut body);
        }
        sanitize(&mut opcode, &mut body);
        let uid = if flags & 1 != 0 { 1000 } else { 0 };
        let req = request(opcode as u32, unique, nodeid, uid, &body);
        let reply = send(&server, st, req);
        check_reply(opcode, unique, &reply);
        if trace() {
            eprintln!(
                "fuse: op {opcode} node {nodeid} -> error {} ({} bytes)",
                u32_at(&reply, 4).map(|e| e as i32).unwrap_or(0),
                reply.len()
            );
        }
        harvest(opcode, &reply, &mut nodes, &mut handles);
    }

    // While the stack still holds its fds: none may lead outside the scratch dir,
    // and none may be a device.
    check_fds(&baseline, &root);
    check_no_device_fds(&baseline);
    drop(server);
    assert_eq!(
        tree_checksum(&root.join("ro")),
        st.ro_sum,
        "the read-only volume changed"
    );
}

/// No fd opened since start-up refers to a character or block device: a guest
/// that reaches a device node through the daemon reaches the host's device.
fn check_no_device_fds(baseline: &BTreeMap<i32, String>) {
    for (fd, link) in open_fds() {
        if baseline.get(&fd) == Some(&link) || !link.starts_with('/') {
            continue;
        }
        // An O_PATH fd (the node's handle kept by LOOKUP) gives no access to a device.
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        let o_path = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .is_some_and(|f| f & libc::O_PATH as u32 != 0);
        if o_path {
            continue;
        }
        if let Ok(m) = std::fs::metadata(format!("/proc/self/fd/{fd}")) {
            let t = m.file_type();
            assert!(
                !(t.is_char_device() || t.is_block_device()),
                "fd {fd} -> {link} is a device opened through the share"
            );
        }
    }
}
