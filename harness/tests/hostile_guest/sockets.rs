//! Socket attacks: a local user who is not the VMM connects to the daemon's sockets
//! (to act as the guest, or to drive the control API), and an operator who needs the
//! control socket while the guest has used up the daemon's file descriptors.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use volfsd_harness::frontend::fuse::{FuseClient, FuseOps};

use volfsd_harness::fixtures::{daemon_binary, is_virtiofsd, Daemon, TestDir, ROOT};

const NOBODY: u32 = 65534;
/// A uid and gid no one is given anything for.
const STRANGER: u32 = 65533;

/// What a process running as `uid`:`gid` (no supplementary groups) gets from
/// connecting to `path` and, if connected, sending `request`: `Err(errno)` of
/// connect, or `Ok(the first bytes of the reply)`.
fn connect_as(uid: u32, gid: u32, path: &Path, request: &[u8]) -> Result<Vec<u8>, i32> {
    use std::os::unix::ffi::OsStrExt;
    // Everything the child needs is prepared before fork: it only makes syscalls.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let mut reply = vec![0u8; 4096];
    let mut fds = [0; 2];
    // SAFETY: pipe fills two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the child calls only async-signal-safe syscalls, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: raw syscalls on memory prepared above; the child never returns.
        unsafe {
            libc::close(rd);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                libc::_exit(2);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let tv = libc::timeval {
                tv_sec: 5,
                tv_usec: 0,
            };
            libc::setsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            let r = libc::connect(
                s,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            let errno: i32 = if r == 0 { 0 } else { *libc::__errno_location() };
            libc::write(wr, &errno as *const i32 as *const libc::c_void, 4);
            if r == 0 && !request.is_empty() {
                libc::write(s, request.as_ptr() as *const libc::c_void, request.len());
                let n = libc::read(s, reply.as_mut_ptr() as *mut libc::c_void, reply.len());
                if n > 0 {
                    libc::write(wr, reply.as_ptr() as *const libc::c_void, n as usize);
                }
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(wr) };
    // SAFETY: rd is ours; File takes it over.
    let mut out = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(rd) };
    let mut all = Vec::new();
    out.read_to_end(&mut all).unwrap();
    let mut status = 0;
    // SAFETY: waits for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "probe as {uid}:{gid} failed (status {status:#x})"
    );
    let errno = i32::from_ne_bytes(all[..4].try_into().unwrap());
    if errno != 0 {
        return Err(errno);
    }
    Ok(all[4..].to_vec())
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn vhost_user_socket_is_not_world_connectable() {
    let mut d = Daemon::start("sock-private", &[]);
    let sock = d.dir.socket();
    let m = std::fs::symlink_metadata(&sock).unwrap();
    assert_eq!(
        m.mode() & 0o777,
        0o700,
        "socket mode {:o}",
        m.mode() & 0o777
    );
    // The test dir is traversable, so only the socket's mode keeps uid 65534 out
    // while the VMM has not connected yet.
    std::fs::set_permissions(&d.dir.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        connect_as(NOBODY, NOBODY, &sock, b""),
        Err(libc::EACCES),
        "uid 65534 connected to the vhost-user socket"
    );
    assert!(d.is_running());
    // The real frontend still gets the daemon.
    let mut c = d.client();
    c.getattr(ROOT)
        .expect("getattr after the refused local user");
}

#[test]
fn socket_group_lets_only_that_group_connect() {
    // virtiofsd's --socket-group: a VMM running as another user (QEMU under libvirt)
    // connects through the group. nogroup (65534) stands in for the VMM's group.
    let Some(group) = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(NOBODY))
        .ok()
        .flatten()
    else {
        eprintln!("skipped: no group with gid {NOBODY}");
        return;
    };
    let arg = format!("--socket-group={}", group.name);
    let mut d = Daemon::start("sock-group", &[&arg]);
    let sock = d.dir.socket();
    std::fs::set_permissions(&d.dir.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = std::fs::symlink_metadata(&sock).unwrap();
    assert_eq!(m.gid(), NOBODY, "socket group");
    assert_eq!(
        m.mode() & 0o777,
        0o770,
        "socket mode {:o}",
        m.mode() & 0o777
    );
    // Neither in the group nor the owner: refused.
    assert_eq!(
        connect_as(STRANGER, STRANGER, &sock, b""),
        Err(libc::EACCES)
    );
    assert!(d.is_running());
    // A member of the group connects (and, being the one frontend, ends the daemon
    // when it closes).
    assert_eq!(connect_as(STRANGER, NOBODY, &sock, b""), Ok(Vec::new()));
    assert!(d.wait_exit(Duration::from_secs(5)).is_some());
}

#[test]
fn socket_paths_that_cannot_be_bound_are_refused_by_name() {
    let dir = TestDir::new("sock-paths");
    let long = dir.root.join("x".repeat(120));
    let missing = dir.root.join("no-such-dir/sock");
    let run = |flag: &str, path: &Path, extra: &[&str]| {
        let out = Command::new(daemon_binary())
            .arg(format!("--shared-dir={}", dir.shared().display()))
            .arg(format!("{flag}={}", path.display()))
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        (out.status.code(), text)
    };
    for path in [&long, &missing] {
        let (code, text) = run("--socket-path", path, &[]);
        assert_eq!(code, Some(1), "--socket-path {}: {text}", path.display());
        if !is_virtiofsd() {
            assert!(text.contains("--socket-path"), "{text}");
        }
        assert!(!path.exists());
    }
    if is_virtiofsd() {
        eprintln!("skipped the --control-socket half: virtiofsd has no control socket");
        return;
    }
    let sock = format!("--socket-path={}", dir.socket().display());
    for path in [&long, &missing] {
        let (code, text) = run("--control-socket", path, &[&sock]);
        assert_eq!(code, Some(1), "--control-socket {}: {text}", path.display());
        assert!(text.contains("--control-socket"), "{text}");
        assert!(!dir.socket().exists(), "vhost-user socket created anyway");
    }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").into_bytes()
}

fn start_with_control(test: &str, extra: &[&str]) -> Option<Daemon> {
    if is_virtiofsd() {
        eprintln!("skipped: the control socket is volfsd's");
        return None;
    }
    let dir = TestDir::new(test);
    std::fs::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ctl = format!("--control-socket={}", dir.control_socket().display());
    let mut args = vec![ctl.as_str()];
    args.extend_from_slice(extra);
    Some(Daemon::start_in(dir, &args))
}

#[test]
fn control_socket_is_not_world_connectable() {
    let Some(d) = start_with_control("ctl-private", &[]) else {
        return;
    };
    let ctl = d.dir.control_socket();
    assert_eq!(
        mode(&ctl) & 0o077,
        0,
        "control socket mode {:o}",
        mode(&ctl)
    );
    assert_eq!(
        connect_as(NOBODY, NOBODY, &ctl, &get("/volumes")),
        Err(libc::EACCES)
    );
}

#[test]
fn control_allow_uid_65534_can_really_connect() {
    let Some(d) = start_with_control("ctl-allow", &["--control-allow-uid=65534"]) else {
        return;
    };
    let ctl = d.dir.control_socket();
    // No chmod by hand: the daemon made the socket connectable for that uid only.
    let reply = connect_as(NOBODY, NOBODY, &ctl, &get("/volumes"))
        .unwrap_or_else(|e| panic!("uid 65534 cannot connect: errno {e}\n{}", d.log()));
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // Any other uid or group is refused by the file's permissions already...
    assert_eq!(
        connect_as(STRANGER, STRANGER, &ctl, &get("/volumes")),
        Err(libc::EACCES)
    );
    assert_eq!(
        connect_as(STRANGER, NOBODY, &ctl, &get("/volumes")),
        Err(libc::EACCES),
        "gid 65534 is not a uid given with --control-allow-uid"
    );
    // ...and nobody else got "other" access.
    assert_eq!(
        mode(&ctl) & 0o007,
        0,
        "control socket mode {:o}",
        mode(&ctl)
    );
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_comm.split(' ').collect();
    // Fields 14 and 15 of the line; the 3rd and later after the command name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn control_request(path: &Path, req: &[u8]) -> std::io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(req)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(String::from_utf8_lossy(&out).to_string())
}

#[test]
fn control_socket_answers_at_the_fd_limit() {
    let Some(d) = start_at_fd_limit("ctl-fdlimit") else {
        return;
    };
    let _c = exhaust_fds_in_volume(&d);
    // The guest's failed lookup may have left an fd free for a moment: an idle
    // client (served, so it holds its fd for the read timeout) takes it.
    let _idle = UnixStream::connect(d.dir.control_socket()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let reply = control_request(&d.dir.control_socket(), &get("/health"))
        .unwrap_or_else(|e| panic!("control socket at the fd limit: {e}\n{}", d.log()));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}\n{}", d.log());
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
fn control_accept_loop_does_not_spin_at_the_fd_limit() {
    let Some(d) = start_at_fd_limit("ctl-spin") else {
        return;
    };
    let _c = exhaust_fds_in_volume(&d);
    // Idle clients: the first may take the daemon's last fd, the others wait in the
    // backlog, where each makes accept fail at once with EMFILE.
    let ctl = d.dir.control_socket();
    let idle: Vec<UnixStream> = (0..3).map(|_| UnixStream::connect(&ctl).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_ticks(d.pid());
    let log_before = d.log().lines().count();
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(d.pid()) - before;
    let log_lines = d.log().lines().count() - log_before;
    drop(idle);
    eprintln!("at the fd limit: {used} ticks of CPU and {log_lines} log lines in 2 s");
    // 2 s of one spinning thread is ~200 ticks; a sleeping loop uses ~0.
    assert!(used < 30, "daemon used {used} ticks in 2 s at the fd limit");
    assert!(log_lines < 10, "{log_lines} log lines in 2 s:\n{}", d.log());
}

/// A daemon with a control socket, one volume `v` and a low fd limit.
fn start_at_fd_limit(test: &str) -> Option<Daemon> {
    if is_virtiofsd() {
        eprintln!("skipped: the control socket is volfsd's");
        return None;
    }
    let dir = TestDir::new(test);
    std::fs::create_dir(dir.shared().join("v")).unwrap();
    let ctl = format!("--control-socket={}", dir.control_socket().display());
    Some(Daemon::start_in(
        dir,
        // Lookups must cost fds here: nodes keep O_PATH fds, not file handles.
        &[
            &ctl,
            "--allowed-dir=v",
            "--rlimit-nofile=64",
            "--inode-file-handles=never",
        ],
    ))
}

/// Puts the daemon at its fd limit: the guest looks up files in volume `v` until the
/// daemon refuses (its fd budget, ENFILE, or the process limit, EMFILE), then the
/// soft RLIMIT_NOFILE is lowered (prlimit) to the fds the daemon has open, so its
/// next fd fails with EMFILE whatever headroom it kept. Returns the client, which
/// must stay connected (the daemon exits when its frontend goes).
fn exhaust_fds_in_volume(d: &Daemon) -> FuseClient {
    for i in 0..200 {
        std::fs::write(d.host(&format!("v/f{i}")), b"").unwrap();
    }
    let mut c = d.client();
    let v = c.lookup(ROOT, "v").expect("lookup v").nodeid;
    let mut refused = false;
    for i in 0..200 {
        match c.lookup(v, &format!("f{i}")) {
            Ok(_) => {}
            Err(e) if matches!(e.errno(), Some(libc::EMFILE | libc::ENFILE)) => {
                refused = true;
                break;
            }
            Err(e) => panic!("lookup f{i}: {e}\n{}", d.log()),
        }
    }
    assert!(refused, "200 lookups were all served at --rlimit-nofile=64");
    let open = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .count() as u64;
    let limit = libc::rlimit64 {
        rlim_cur: open,
        rlim_max: 64,
    };
    // SAFETY: sets the limit of our own child; the result is checked.
    let r = unsafe { libc::prlimit64(d.pid(), libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    c
}
