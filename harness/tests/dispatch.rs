//! The requests volfsd decodes itself (`src/fs/dispatch.rs`) against fuse-backend-rs's
//! own server, the reference: the same sequence of requests, well formed and not,
//! served by two stacks over two identical directories, one through the queue
//! worker's path (`serve_popped`: the request copied and its buffers found in one
//! walk, the reply written in place), the other through fuse-backend-rs's `Server`
//! and its `VirtioFsWriter`. Every reply must be the same bytes, but for what two
//! directories differ in: inode numbers and times.

#[path = "dispatch/pair.rs"]
mod pair;
#[path = "dispatch/side.rs"]
mod side;
#[path = "dispatch/wire.rs"]
mod wire;

use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{
    AccessIn, BatchForgetIn, CreateIn, Dirent, FlushIn, ForgetIn, ForgetOne, FsyncIn, GetattrIn,
    InHeader, MkdirIn, Opcode, OpenIn, ReadIn, ReleaseIn, Rename2In, RenameIn, SetattrIn, FATTR_FH,
    GETATTR_FH, RELEASE_FLUSH,
};
use vm_memory::ByteValued;

use crate::pair::Pair;
use crate::side::side;
use crate::wire::{cat, entry, fh, FATTR_MODE, FATTR_SIZE, HDR};

#[test]
fn every_request_decoded_here_is_answered_as_fuse_backend_rs_answers_it() {
    let mut p = Pair {
        a: side("ours"),
        b: side("reference"),
        unique: 10,
    };
    let root = 1;

    // LOOKUP: found, not found, a name without its NUL, lengths that lie.
    let f = entry(&p.ok("lookup f", Opcode::Lookup, root, b"f\0")).nodeid;
    let d = entry(&p.ok("lookup d", Opcode::Lookup, root, b"d\0")).nodeid;
    p.same(
        "lookup missing",
        Opcode::Lookup,
        root,
        b"nope\0",
        None,
        4096,
    );
    p.same("lookup without NUL", Opcode::Lookup, root, b"f", None, 4096);
    p.same(
        "lookup cut by its length",
        Opcode::Lookup,
        root,
        b"f\0",
        Some(HDR as u32 + 1),
        4096,
    );
    p.same(
        "lookup longer than sent",
        Opcode::Lookup,
        root,
        b"f\0",
        Some(HDR as u32 + 9),
        4096,
    );
    p.same(
        "lookup shorter than a header",
        Opcode::Lookup,
        root,
        b"f\0",
        Some(3),
        4096,
    );
    p.same(
        "lookup of a huge message",
        Opcode::Lookup,
        root,
        b"f\0",
        Some(2 << 20),
        4096,
    );
    p.same("lookup in a file", Opcode::Lookup, f, b"x\0", None, 4096);
    p.same(
        "lookup of an unknown node",
        Opcode::Lookup,
        999_999,
        b"x\0",
        None,
        4096,
    );
    p.same(
        "lookup with no room for the entry",
        Opcode::Lookup,
        root,
        b"f\0",
        None,
        40,
    );
    p.same(
        "lookup with no room at all",
        Opcode::Lookup,
        root,
        b"f\0",
        None,
        8,
    );

    // GETATTR, with and without a handle; short arguments.
    p.ok(
        "getattr",
        Opcode::Getattr,
        f,
        GetattrIn::default().as_slice(),
    );
    p.same("getattr short", Opcode::Getattr, f, &[0; 4], None, 4096);
    p.same(
        "getattr of an unknown node",
        Opcode::Getattr,
        777,
        GetattrIn::default().as_slice(),
        None,
        4096,
    );

    // OPEN, READ (whole, past the end, too big for its buffers, a bad handle), FLUSH,
    // FSYNC, RELEASE.
    let open = OpenIn {
        flags: libc::O_RDWR as u32,
        fuse_flags: 0,
    };
    let fh_f = fh(&p.ok("open", Opcode::Open, f, open.as_slice()), 16);
    let with_fh = GetattrIn {
        flags: GETATTR_FH,
        dummy: 0,
        fh: fh_f,
    };
    p.ok("getattr by handle", Opcode::Getattr, f, with_fh.as_slice());
    let read = |offset: u64, size: u32, fh: u64| ReadIn {
        fh,
        offset,
        size,
        ..Default::default()
    };
    p.ok("read", Opcode::Read, f, read(0, 4096, fh_f).as_slice());
    p.ok(
        "read at the end",
        Opcode::Read,
        f,
        read(8000, 4096, fh_f).as_slice(),
    );
    p.ok(
        "read past the end",
        Opcode::Read,
        f,
        read(20000, 4096, fh_f).as_slice(),
    );
    for (what, body, room) in [
        (
            "read larger than its buffers",
            read(0, 8192, fh_f).as_slice().to_vec(),
            4096,
        ),
        (
            "read of a bad handle",
            read(0, 10, 4242).as_slice().to_vec(),
            4096,
        ),
        ("read short", vec![1; 8], 4096),
        (
            "read with no room for a header",
            read(0, 1, fh_f).as_slice().to_vec(),
            12,
        ),
    ] {
        p.same(what, Opcode::Read, f, &body, None, room);
    }
    let flush = FlushIn {
        fh: fh_f,
        unused: 0,
        padding: 0,
        lock_owner: 3,
    };
    p.ok("flush", Opcode::Flush, f, flush.as_slice());
    let fsync = FsyncIn {
        fh: fh_f,
        fsync_flags: 1,
        padding: 0,
    };
    p.ok("fsync", Opcode::Fsync, f, fsync.as_slice());

    // SETATTR: mode, then size through the handle.
    let mode = SetattrIn {
        valid: FATTR_MODE,
        mode: 0o640,
        ..Default::default()
    };
    p.ok("setattr mode", Opcode::Setattr, f, mode.as_slice());
    let size = SetattrIn {
        valid: FATTR_SIZE | FATTR_FH,
        size: 100,
        fh: fh_f,
        ..Default::default()
    };
    p.ok(
        "setattr size by handle",
        Opcode::Setattr,
        f,
        size.as_slice(),
    );
    p.same("setattr short", Opcode::Setattr, f, &[0; 20], None, 4096);
    let release = ReleaseIn {
        fh: fh_f,
        flags: libc::O_RDWR as u32,
        release_flags: RELEASE_FLUSH,
        lock_owner: 3,
    };
    p.ok("release", Opcode::Release, f, release.as_slice());
    p.same(
        "release again",
        Opcode::Release,
        f,
        release.as_slice(),
        None,
        4096,
    );

    // STATFS, ACCESS.
    p.ok("statfs", Opcode::Statfs, root, &[]);
    let access = AccessIn {
        mask: libc::R_OK as u32,
        padding: 0,
    };
    p.ok("access", Opcode::Access, f, access.as_slice());

    // OPENDIR, FSYNCDIR, RELEASEDIR.
    let fh_d = fh(
        &p.ok("opendir", Opcode::Opendir, d, OpenIn::default().as_slice()),
        16,
    );
    let fsyncdir = FsyncIn {
        fh: fh_d,
        ..Default::default()
    };
    p.ok("fsyncdir", Opcode::Fsyncdir, d, fsyncdir.as_slice());
    // READDIR and READDIRPLUS: whole, one entry's room, from an offset, more than
    // the buffers take, a bad handle.
    let list = |offset: u64, size: u32, fh: u64| ReadIn {
        fh,
        offset,
        size,
        ..Default::default()
    };
    let whole = p.ok(
        "readdir",
        Opcode::Readdir,
        d,
        list(0, 4096, fh_d).as_slice(),
    );
    assert!(
        whole.len() > 16 + 3 * size_of::<Dirent>(),
        "., .., sub and x listed"
    );
    p.ok(
        "readdir of one entry's room",
        Opcode::Readdir,
        d,
        list(0, 32, fh_d).as_slice(),
    );
    p.ok(
        "readdir too small for any",
        Opcode::Readdir,
        d,
        list(0, 8, fh_d).as_slice(),
    );
    let second = Dirent::from_slice(&whole[16..16 + size_of::<Dirent>()])
        .unwrap()
        .off;
    p.ok(
        "readdir from an offset",
        Opcode::Readdir,
        d,
        list(second, 4096, fh_d).as_slice(),
    );
    for (what, body, room) in [
        (
            "readdir larger than its buffers",
            list(0, 8192, fh_d).as_slice().to_vec(),
            4096,
        ),
        (
            "readdir of a bad handle",
            list(0, 4096, 999).as_slice().to_vec(),
            8192,
        ),
        ("readdir short", vec![0; 8], 8192),
    ] {
        p.same(what, Opcode::Readdir, d, &body, None, room);
    }
    p.ok(
        "readdirplus",
        Opcode::Readdirplus,
        d,
        list(0, 4096, fh_d).as_slice(),
    );
    p.ok(
        "readdirplus of one entry's room",
        Opcode::Readdirplus,
        d,
        list(0, 160, fh_d).as_slice(),
    );
    p.ok(
        "readdirplus from an offset",
        Opcode::Readdirplus,
        d,
        list(second, 4096, fh_d).as_slice(),
    );
    p.same(
        "readdirplus larger than its buffers",
        Opcode::Readdirplus,
        d,
        list(0, 8192, fh_d).as_slice(),
        None,
        4096,
    );
    let releasedir = ReleaseIn {
        fh: fh_d,
        ..Default::default()
    };
    p.ok("releasedir", Opcode::Releasedir, d, releasedir.as_slice());

    // CREATE, MKDIR, RENAME, RENAME2, UNLINK, RMDIR.
    let create = CreateIn {
        flags: (libc::O_RDWR | libc::O_CREAT) as u32,
        mode: 0o100644,
        umask: 0o022,
        fuse_flags: 0,
    };
    let created = p.ok(
        "create",
        Opcode::Create,
        d,
        &cat(&[create.as_slice(), b"new\0"]),
    );
    let n = entry(&created).nodeid;
    p.same(
        "create again, exclusive",
        Opcode::Create,
        d,
        &cat(&[
            CreateIn {
                flags: create.flags | libc::O_EXCL as u32,
                ..create
            }
            .as_slice(),
            b"new\0",
        ]),
        None,
        4096,
    );
    p.same(
        "create without NUL",
        Opcode::Create,
        d,
        &cat(&[create.as_slice(), b"zz"]),
        None,
        4096,
    );
    let mkdir = MkdirIn {
        mode: 0o755,
        umask: 0o022,
    };
    p.ok("mkdir", Opcode::Mkdir, d, &cat(&[mkdir.as_slice(), b"m\0"]));
    p.same(
        "mkdir existing",
        Opcode::Mkdir,
        d,
        &cat(&[mkdir.as_slice(), b"m\0"]),
        None,
        4096,
    );
    let rename = RenameIn { newdir: d };
    p.ok(
        "rename",
        Opcode::Rename,
        d,
        &cat(&[rename.as_slice(), b"new\0renamed\0"]),
    );
    p.same(
        "rename with one name",
        Opcode::Rename,
        d,
        &cat(&[rename.as_slice(), b"renamed\0"]),
        None,
        4096,
    );
    let noreplace = Rename2In {
        newdir: d,
        flags: libc::RENAME_NOREPLACE,
        padding: 0,
    };
    p.same(
        "rename2 onto an existing name",
        Opcode::Rename2,
        d,
        &cat(&[noreplace.as_slice(), b"renamed\0x\0"]),
        None,
        4096,
    );
    let strange = Rename2In {
        flags: 0x8000_0000 | libc::RENAME_NOREPLACE,
        ..noreplace
    };
    p.ok(
        "rename2 with unknown flags",
        Opcode::Rename2,
        d,
        &cat(&[strange.as_slice(), b"renamed\0again\0"]),
    );
    p.ok("unlink", Opcode::Unlink, d, b"again\0");
    p.same("unlink missing", Opcode::Unlink, d, b"again\0", None, 4096);
    p.same("rmdir not empty", Opcode::Rmdir, root, b"d\0", None, 4096);
    p.ok("rmdir", Opcode::Rmdir, d, b"m\0");

    // FORGET and BATCH_FORGET owe no reply; a batch longer than its bytes, or than a
    // message, neither.
    p.same(
        "forget",
        Opcode::Forget,
        n,
        ForgetIn { nlookup: 1 }.as_slice(),
        None,
        4096,
    );
    p.same("forget short", Opcode::Forget, n, &[0; 3], None, 4096);
    let batch = |count: u32, ones: &[(u64, u64)]| {
        let mut b = BatchForgetIn { count, dummy: 0 }.as_slice().to_vec();
        for &(nodeid, nlookup) in ones {
            b.extend_from_slice(ForgetOne { nodeid, nlookup }.as_slice());
        }
        b
    };
    p.same(
        "batch forget",
        Opcode::BatchForget,
        0,
        &batch(2, &[(f, 1), (d, 1)]),
        None,
        4096,
    );
    p.same(
        "batch forget short",
        Opcode::BatchForget,
        0,
        &batch(3, &[(f, 1)]),
        None,
        4096,
    );
    p.same(
        "batch forget too long",
        Opcode::BatchForget,
        0,
        &batch(u32::MAX, &[]),
        None,
        4096,
    );
    // The forgotten nodes are gone on both sides alike.
    p.same(
        "getattr of a forgotten node",
        Opcode::Getattr,
        n,
        GetattrIn::default().as_slice(),
        None,
        4096,
    );
}

#[test]
fn every_operation_the_table_says_volfsd_decodes_has_its_handler() {
    use std::os::fd::{AsRawFd, FromRawFd};
    use volfsd::exports::fuse_ops::{Decoder, ROWS};
    let s = side("rows");
    // SAFETY: memfd_create with a valid name; the fd is owned by the File.
    let replies = unsafe {
        let fd = libc::memfd_create(c"volfsd-dispatch-rows".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        std::fs::File::from_raw_fd(fd)
    };
    let mut buf = vec![0u8; 64 * 1024];
    for row in ROWS.iter().filter(|r| r.decoder == Decoder::Volfsd) {
        // A well-formed header and zeroed arguments: answered (maybe with an error),
        // never "no handler".
        let body = [0u8; 128];
        let mut request = InHeader {
            len: (HDR + body.len()) as u32,
            opcode: row.opcode,
            unique: 9,
            nodeid: 1,
            ..Default::default()
        }
        .as_slice()
        .to_vec();
        request.extend_from_slice(&body);
        let writer = fuse_backend_rs::transport::Writer::FuseDev(
            fuse_backend_rs::transport::FuseDevWriter::<()>::new(replies.as_raw_fd(), &mut buf)
                .unwrap(),
        );
        if let Err(e) = s.server.handle_local(&mut request, writer) {
            let e = format!("{e:?}");
            assert!(!e.contains("no handler"), "{}: {e}", row.name);
        }
    }
}
