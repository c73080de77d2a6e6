//! A guest whose ids the daemon translates (`--translate-uid/gid map:0:100000:65536`):
//! its root is host uid 100000, an unprivileged user, and must get no more from host
//! files than that user would. The guest kernel's own permission checks are the
//! guest's (its root may do anything), so each attack here is what a guest root
//! sends; the host files keep their mode, owner, content and ctime.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use fuse_backend_rs::abi::fuse_abi::WriteOut;
use fuse_backend_rs::abi::fuse_abi::{Opcode, OpenIn, OpenOut, SetattrIn, SetattrValid, WriteIn};
use volfsd_harness::fixtures::{assert_errno, is_virtiofsd, Daemon, RDONLY, RDWR, ROOT};
use volfsd_harness::frontend::fuse::{FuseClient, FuseOps, Request};

/// The guest's root on the host.
const HOST_ROOT_OF_GUEST: u32 = 100_000;

const TRANSLATED: &[&str] = &[
    "--translate-uid=map:0:100000:65536",
    "--translate-gid=map:0:100000:65536",
    "--xattr",
    "--allow-privileged-xattrs",
];

/// What must not change on a host file the guest was refused.
#[derive(Debug, PartialEq)]
struct HostFile {
    mode: u32,
    uid: u32,
    gid: u32,
    content: Vec<u8>,
    ctime: (i64, i64),
}

fn host_file(path: &Path) -> HostFile {
    let m = std::fs::symlink_metadata(path).unwrap();
    HostFile {
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        content: if m.is_file() {
            std::fs::read(path).unwrap()
        } else {
            Vec::new()
        },
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

/// A file of host root (root:root, `mode`) in the share.
fn plant_root_file(d: &Daemon, name: &str, mode: u32) -> HostFile {
    let path = d.host(name);
    std::fs::write(&path, b"host root's content\n").unwrap();
    std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    host_file(&path)
}

/// A directory the guest's root owns on the host (the share's root is host root's,
/// 0755: the translated guest may not create there).
fn guest_dir(d: &Daemon, name: &str) -> std::path::PathBuf {
    let path = d.host(name);
    std::fs::create_dir(&path).unwrap();
    std::os::unix::fs::chown(&path, Some(HOST_ROOT_OF_GUEST), Some(HOST_ROOT_OF_GUEST)).unwrap();
    path
}

fn start(test: &str) -> Option<(Daemon, FuseClient)> {
    if is_virtiofsd() {
        // virtiofsd 1.14 acts as root whatever the translation: every attack succeeds.
        eprintln!("skipped: volfsd's translated-caller rules");
        return None;
    }
    let d = Daemon::start(test, TRANSLATED);
    let c = d.client();
    Some((d, c))
}

fn setattr_in(valid: SetattrValid) -> SetattrIn {
    SetattrIn {
        valid: valid.bits(),
        ..Default::default()
    }
}

#[test]
fn translated_root_chmod_04755_of_a_host_root_file_is_refused() {
    let Some((d, mut c)) = start("tr-chmod") else {
        return;
    };
    let before = plant_root_file(&d, "f", 0o755);
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    let mut attr = setattr_in(SetattrValid::MODE);
    attr.mode = libc::S_IFREG | 0o4755;
    assert_errno(c.setattr(node, &attr), libc::EPERM);
    assert_eq!(host_file(&d.host("f")), before);
}

#[test]
fn translated_root_write_into_a_host_root_file_is_refused() {
    let Some((d, mut c)) = start("tr-write") else {
        return;
    };
    let before = plant_root_file(&d, "f", 0o644);
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_errno(c.open(node, RDWR), libc::EACCES);
    assert_errno(c.open(node, libc::O_WRONLY as u32), libc::EACCES);
    let trunc = Request::new(Opcode::Open, node)
        .arg(&OpenIn {
            flags: libc::O_WRONLY as u32 | libc::O_TRUNC as u32,
            fuse_flags: 0,
        })
        .reply_of::<OpenOut>();
    assert_errno(c.call(&trunc), libc::EACCES);
    // Reading a world-readable file is what uid 100000 may do.
    let fh = c.open(node, RDONLY).expect("open for reading").fh;
    assert_eq!(c.read(node, fh, 0, 64).unwrap(), before.content);
    assert_eq!(host_file(&d.host("f")), before);
}

#[test]
fn translated_root_chown_of_host_files_is_refused() {
    let Some((d, mut c)) = start("tr-chown") else {
        return;
    };
    // Taking host root's file for itself (guest 0 is host 100000).
    let before = plant_root_file(&d, "f", 0o644);
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    let mut attr = setattr_in(SetattrValid::UID | SetattrValid::GID);
    attr.uid = 0;
    attr.gid = 0;
    assert_errno(c.setattr(node, &attr), libc::EPERM);
    assert_eq!(host_file(&d.host("f")), before);
    // Giving its own file to a host user outside the map (guest 70000 is host 70000).
    let dir = guest_dir(&d, "own");
    std::fs::write(dir.join("mine"), b"m").unwrap();
    std::os::unix::fs::chown(
        dir.join("mine"),
        Some(HOST_ROOT_OF_GUEST),
        Some(HOST_ROOT_OF_GUEST),
    )
    .unwrap();
    let own = c.lookup(ROOT, "own").unwrap().nodeid;
    let mine = c.lookup(own, "mine").unwrap().nodeid;
    let before = host_file(&dir.join("mine"));
    let mut attr = setattr_in(SetattrValid::UID);
    attr.uid = 70_000;
    assert_errno(c.setattr(mine, &attr), libc::EPERM);
    // Nor to a group it is not in.
    let mut attr = setattr_in(SetattrValid::GID);
    attr.gid = 70_000;
    assert_errno(c.setattr(mine, &attr), libc::EPERM);
    assert_eq!(host_file(&dir.join("mine")), before);
}

#[test]
fn translated_root_truncate_of_a_host_root_file_is_refused() {
    let Some((d, mut c)) = start("tr-truncate") else {
        return;
    };
    let before = plant_root_file(&d, "f", 0o644);
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    let attr = setattr_in(SetattrValid::SIZE);
    assert_errno(c.setattr(node, &attr), libc::EACCES);
    // Nor its times set to chosen values (only the owner may).
    let mut attr = setattr_in(SetattrValid::MTIME);
    attr.mtime = 1;
    assert_errno(c.setattr(node, &attr), libc::EPERM);
    assert_eq!(host_file(&d.host("f")), before);
}

#[test]
fn translated_root_create_in_a_host_root_directory_is_refused() {
    let Some((d, mut c)) = start("tr-create") else {
        return;
    };
    let dir = d.host("rootdir");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = host_file(&dir);
    let node = c.lookup(ROOT, "rootdir").unwrap().nodeid;
    assert_errno(c.create(node, "f", RDWR, 0o644), libc::EACCES);
    assert_errno(c.mkdir(node, "d", 0o755), libc::EACCES);
    assert_errno(c.mknod(node, "p", libc::S_IFIFO | 0o644, 0), libc::EACCES);
    assert_errno(c.symlink(node, "l", "f"), libc::EACCES);
    // The share root is host root's 0755 directory too.
    assert_errno(c.mkdir(ROOT, "d", 0o755), libc::EACCES);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    assert_eq!(host_file(&dir), before);
}

#[test]
fn translated_root_hard_link_of_a_host_root_file_is_refused() {
    let Some((d, mut c)) = start("tr-link") else {
        return;
    };
    let before = plant_root_file(&d, "secret", 0o600);
    guest_dir(&d, "own");
    let own = c.lookup(ROOT, "own").unwrap().nodeid;
    let node = c.lookup(ROOT, "secret").unwrap().nodeid;
    // What the host answers uid 100000 linking a file it neither owns nor may read
    // and write: EPERM under fs.protected_hardlinks (the default), else allowed.
    let protected = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
        .map(|s| s.trim() == "1")
        .unwrap_or(true);
    if protected {
        assert_errno(c.link(node, own, "stolen"), libc::EPERM);
        assert!(!d.host("own/stolen").exists());
    } else {
        c.link(node, own, "stolen")
            .expect("allowed without protected_hardlinks");
    }
    assert_eq!(host_file(&d.host("secret")).mode, before.mode);
    assert_eq!(host_file(&d.host("secret")).content, before.content);
}

#[test]
fn translated_root_trusted_and_acl_xattrs_on_a_host_root_file_are_refused() {
    let Some((d, mut c)) = start("tr-xattr") else {
        return;
    };
    let before = plant_root_file(&d, "f", 0o666);
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    // trusted.* needs CAP_SYS_ADMIN, which uid 100000 lacks (the daemon has it
    // here: --allow-privileged-xattrs).
    assert_errno(
        c.setxattr(node, "trusted.overlay.opaque", b"y", 0),
        libc::EPERM,
    );
    assert_errno(c.setxattr(node, "security.evil", b"y", 0), libc::EPERM);
    // An ACL only the owner may set: one granting uid 100000 nothing new is still
    // refused (user::rw-, group::r--, other::r--).
    let acl: Vec<u8> = [
        2u32.to_le_bytes().to_vec(),
        [1u16.to_le_bytes(), 6u16.to_le_bytes()].concat(),
        u32::MAX.to_le_bytes().to_vec(),
        [4u16.to_le_bytes(), 4u16.to_le_bytes()].concat(),
        u32::MAX.to_le_bytes().to_vec(),
        [0x20u16.to_le_bytes(), 4u16.to_le_bytes()].concat(),
        u32::MAX.to_le_bytes().to_vec(),
    ]
    .concat();
    assert_errno(
        c.setxattr(node, "system.posix_acl_access", &acl, 0),
        libc::EPERM,
    );
    // user.* on a file it may write (0666): allowed for any writer on the host.
    c.setxattr(node, "user.note", b"ok", 0)
        .expect("user.* on a writable file");
    // ...but not on host root's 0644 file.
    let ro = plant_root_file(&d, "g", 0o644);
    let g = c.lookup(ROOT, "g").unwrap().nodeid;
    assert_errno(c.setxattr(g, "user.note", b"no", 0), libc::EACCES);
    let after = host_file(&d.host("f"));
    assert_eq!(
        (after.mode, after.uid, after.content),
        (before.mode, before.uid, before.content)
    );
    assert_eq!(host_file(&d.host("g")), ro);
}

#[test]
fn translated_root_unlink_and_rename_in_a_sticky_host_directory_are_refused() {
    let Some((d, mut c)) = start("tr-sticky") else {
        return;
    };
    let dir = d.host("tmp");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(dir.join("theirs"), b"t").unwrap();
    std::os::unix::fs::chown(dir.join("theirs"), Some(70_000), Some(70_000)).unwrap();
    let tmp = c.lookup(ROOT, "tmp").unwrap().nodeid;
    assert_errno(c.unlink(tmp, "theirs"), libc::EPERM);
    assert_errno(c.rename(tmp, "theirs", tmp, "mine"), libc::EPERM);
    assert!(dir.join("theirs").exists());
    // Its own files there are its own to remove.
    let (e, open) = c
        .create(tmp, "own", RDWR, 0o644)
        .expect("create in a 1777 dir");
    c.release(e.nodeid, open.fh, RDWR).unwrap();
    assert_eq!(
        std::fs::metadata(dir.join("own")).unwrap().uid(),
        HOST_ROOT_OF_GUEST
    );
    c.rename(tmp, "own", tmp, "own2")
        .expect("rename its own file");
    c.unlink(tmp, "own2").expect("unlink its own file");
}

#[test]
fn translated_root_may_do_all_of_it_to_its_own_files() {
    let Some((d, mut c)) = start("tr-own") else {
        return;
    };
    let dir = guest_dir(&d, "own");
    let own = c.lookup(ROOT, "own").unwrap().nodeid;
    let (e, open) = c
        .create(own, "f", RDWR, 0o755)
        .expect("create in its own dir");
    let path = dir.join("f");
    assert_eq!(
        std::fs::metadata(&path).unwrap().uid(),
        HOST_ROOT_OF_GUEST,
        "created as the guest's host uid"
    );
    c.write(e.nodeid, open.fh, 0, b"guest data").expect("write");
    let mut attr = setattr_in(SetattrValid::MODE);
    attr.mode = libc::S_IFREG | 0o4755;
    c.setattr(e.nodeid, &attr)
        .expect("chmod 04755 of its own file");
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o4755);
    let mut attr = setattr_in(SetattrValid::SIZE);
    attr.size = 5;
    c.setattr(e.nodeid, &attr).expect("truncate");
    let mut attr = setattr_in(SetattrValid::MTIME);
    attr.mtime = 1_000_000;
    c.setattr(e.nodeid, &attr).expect("utimes");
    let mut attr = setattr_in(SetattrValid::UID | SetattrValid::GID);
    attr.uid = 0;
    attr.gid = 0;
    c.setattr(e.nodeid, &attr).expect("chown to its own ids");
    c.setxattr(e.nodeid, "user.k", b"v", 0).expect("user xattr");
    c.link(e.nodeid, own, "g")
        .expect("hard link of its own file");
    c.mkdir(own, "sub", 0o755).expect("mkdir");
    c.rename(own, "g", own, "h").expect("rename");
    c.unlink(own, "h").expect("unlink");
    c.rmdir(own, "sub").expect("rmdir");
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.len(), 5);
    assert_eq!(m.mtime(), 1_000_000);
    assert_eq!((m.uid(), m.gid()), (HOST_ROOT_OF_GUEST, HOST_ROOT_OF_GUEST));
    // A truncate by the owner, like any write without CAP_FSETID, cleared setuid.
    assert_eq!(m.mode() & 0o7777, 0o755);
}

#[test]
fn translated_non_owner_write_clears_setuid_and_setgid() {
    let Some((d, mut c)) = start("tr-killpriv") else {
        return;
    };
    // A world-writable setuid file of another host user in the guest's range (guest
    // uid 1 is host 100001): guest root may write it, as host uid 100000 may.
    let dir = guest_dir(&d, "own");
    let path = dir.join("suid");
    std::fs::write(&path, b"x").unwrap();
    std::os::unix::fs::chown(&path, Some(100_001), Some(100_001)).unwrap();
    let own = c.lookup(ROOT, "own").unwrap().nodeid;
    let node = c.lookup(own, "suid").unwrap().nodeid;
    for (bits, want) in [(0o6777, 0o0777), (0o4777, 0o0777), (0o2777, 0o0777)] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(bits)).unwrap();
        let fh = c.open(node, RDWR).expect("open a world-writable file").fh;
        // No WRITE_KILL_PRIV: the guest's root has CAP_FSETID in the guest; on the
        // host its uid has not, and Linux clears the bits.
        let req = Request::new(Opcode::Write, node)
            .arg(&WriteIn {
                fh,
                offset: 0,
                size: 1,
                ..Default::default()
            })
            .bytes(b"y".to_vec())
            .reply_of::<WriteOut>();
        c.call(&req).expect("write");
        c.release(node, fh, RDWR).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().mode() & 0o7777,
            want,
            "after a non-owner's write of a {bits:o} file"
        );
    }
}

#[test]
fn forbidden_guest_ids_create_nothing_and_read_as_nobody() {
    if is_virtiofsd() {
        return;
    }
    let d = Daemon::start(
        "tr-forbid",
        &[
            "--translate-uid=map:0:100000:1000",
            "--translate-uid=forbid-guest:1000:64536",
            "--translate-gid=map:0:100000:1000",
            "--translate-gid=forbid-guest:1000:64536",
        ],
    );
    let mut c = d.client();
    guest_dir(&d, "own");
    std::fs::set_permissions(d.host("own"), std::fs::Permissions::from_mode(0o777)).unwrap();
    plant_root_file(&d, "public", 0o644);
    plant_root_file(&d, "private", 0o600);
    let own = c.lookup(ROOT, "own").unwrap().nodeid;
    let as_forbidden = |r: Request| {
        let mut r = r;
        r.uid = 5000;
        r.gid = 5000;
        r
    };
    let mkdir = as_forbidden(
        Request::new(Opcode::Mkdir, own)
            .arg(&fuse_backend_rs::abi::fuse_abi::MkdirIn {
                mode: 0o755,
                umask: 0,
            })
            .bytes(b"d\0".to_vec())
            .reply_of::<fuse_backend_rs::abi::fuse_abi::EntryOut>(),
    );
    assert_errno(c.call(&mkdir), libc::EPERM);
    assert!(!d.host("own/d").exists());
    // Reading acts as nobody: a world-readable file yes, a private one no.
    let public = c.lookup(ROOT, "public").unwrap().nodeid;
    let private = c.lookup(ROOT, "private").unwrap().nodeid;
    let open = |node| {
        as_forbidden(
            Request::new(Opcode::Open, node)
                .arg(&OpenIn {
                    flags: RDONLY,
                    fuse_flags: 0,
                })
                .reply_of::<OpenOut>(),
        )
    };
    c.call(&open(public)).expect("nobody may read a 0644 file");
    assert_errno(c.call(&open(private)), libc::EACCES);
}
