//! The launcher suite: every command line of `launchers/cases.txt` (Kata, libvirt,
//! Incus, LXD, podman machine, KubeVirt and the docs, each taken from the launcher's
//! source with a reference to it), started exactly as that launcher starts the
//! daemon, against volfsd and against virtiofsd side by side.
//!
//! A line *serves* when the daemon answers a vhost-user handshake, FUSE INIT (offered
//! what a Linux 6.12 guest offers) and a lookup, open and read of a file of the
//! share with its content. Where the launcher passes an inherited socket (`--fd=N`)
//! the suite binds it and hands it over as fd N.
//!
//! The assertions: every line virtiofsd serves, volfsd serves too; volfsd refuses
//! no line by hanging, only by a fast exit 1 that names the flag. The table of both
//! daemons is printed and written to `target/launchers-report.md`.
//!
//! virtiofsd is `VOLFSD_TEST_VIRTIOFSD`, else `virtiofsd` in `~/.cargo/bin` or on
//! PATH (tests/install-deps.sh installs it). It is required: no side-by-side, no pass.

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::FsOptions;
use volfsd_harness::fixtures::{volfsd_binary, TestDir, RDONLY, ROOT};
use volfsd_harness::frontend::{DeviceConfig, FuseClient, FuseOps, InitParams};

const CASES: &str = include_str!("launchers/cases.txt");

/// The inherited fd number for `{FD}` (libvirt keeps whatever number the socket had
/// in libvirtd: not 3, to show the number is honoured).
const LIBVIRT_FD: i32 = 23;

/// How long a daemon gets to create its socket or to answer.
const START_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Case {
    name: String,
    launcher: String,
    source: String,
    socket_fd: bool,
    argv: String,
    cwd: Option<String>,
    env: Vec<(String, String)>,
    /// Run by a non-root user (libvirt's session mode).
    unprivileged: bool,
}

/// The non-root user of the session-mode cases, made by
/// `vm-tests/run-unprivileged.sh --setup-user-only` (as for the unprivileged VM
/// suite): uid, gid and the first subordinate uid and gid ranges.
#[derive(Clone, Copy, Debug)]
struct SessionUser {
    uid: u32,
    gid: u32,
    subuid: (u32, u32),
    subgid: (u32, u32),
}

fn session_user() -> SessionUser {
    static USER: std::sync::OnceLock<SessionUser> = std::sync::OnceLock::new();
    *USER.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vm-tests/run-unprivileged.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("--setup-user-only")
            .stderr(Stdio::inherit())
            .output()
            .expect("run-unprivileged.sh --setup-user-only");
        assert!(
            out.status.success(),
            "run-unprivileged.sh --setup-user-only failed"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let n: Vec<u32> = text
            .lines()
            .last()
            .unwrap_or("")
            .split_whitespace()
            .map(|v| v.parse().expect("a number"))
            .collect();
        assert_eq!(
            n.len(),
            6,
            "run-unprivileged.sh --setup-user-only printed: {text}"
        );
        SessionUser {
            uid: n[0],
            gid: n[1],
            subuid: (n[2], n[3]),
            subgid: (n[4], n[5]),
        }
    })
}

fn parse_cases(text: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut cur: Option<Case> = None;
    for line in text.lines() {
        let line = line.trim_end();
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            cases.extend(cur.take());
            continue;
        }
        let (key, value) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("cases.txt: a line without 'key:': {line}"));
        let value = value.trim().to_string();
        let case = cur.get_or_insert_with(Case::default);
        match key {
            "case" => case.name = value,
            "launcher" => case.launcher = value,
            "source" => case.source = value,
            "socket" => case.socket_fd = value == "fd",
            "argv" => case.argv = value,
            "cwd" => case.cwd = Some(value),
            "user" => {
                assert_eq!(
                    value, "unprivileged",
                    "case {}: user: unprivileged",
                    case.name
                );
                case.unprivileged = true;
            }
            "env" => {
                let (k, v) = value.split_once('=').expect("env: NAME=VALUE");
                case.env.push((k.to_string(), v.to_string()));
            }
            "note" => {}
            other => panic!("cases.txt: unknown key '{other}' in case {}", case.name),
        }
    }
    cases.extend(cur);
    for c in &cases {
        assert!(
            !c.name.is_empty() && !c.argv.is_empty() && !c.source.is_empty(),
            "cases.txt: case {:?} lacks case:, source: or argv:",
            c.name
        );
    }
    cases
}

#[derive(Clone, Debug, Eq, PartialEq)]
enum Outcome {
    Serves,
    /// Exited during start-up: the status and the first error line.
    Refused(Option<i32>, String),
    /// Started but did not serve: what failed.
    Failed(String),
    /// Neither a socket nor an exit within the limit.
    Hangs,
}

impl Outcome {
    fn cell(&self) -> String {
        match self {
            Outcome::Serves => "serves".to_string(),
            Outcome::Refused(code, msg) => format!(
                "exit {}: {}",
                code.map_or("by signal".to_string(), |c| c.to_string()),
                msg.replace('|', "\\|")
            ),
            Outcome::Failed(why) => format!("fails: {}", why.replace('|', "\\|")),
            Outcome::Hangs => "hangs (no socket, no exit)".to_string(),
        }
    }
}

fn virtiofsd_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("VOLFSD_TEST_VIRTIOFSD") {
        return p.into();
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cargo = home.join(".cargo/bin/virtiofsd");
    if cargo.is_file() {
        return cargo;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("virtiofsd"))
        .find(|p| p.is_file())
        .expect(
            "virtiofsd is needed for the side-by-side launcher suite: \
             tests/install-deps.sh installs it (cargo install virtiofsd --locked), \
             or name it in VOLFSD_TEST_VIRTIOFSD",
        )
}

/// The first line of the log that says why the daemon stopped.
fn first_error(log: &str) -> String {
    log.lines()
        .find(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("error") || l.contains("volfsd:") || l.contains("invalid")
        })
        .or_else(|| log.lines().last())
        .unwrap_or("")
        .trim()
        .chars()
        .take(160)
        .collect()
}

struct Run {
    child: Child,
    log: PathBuf,
}

impl Run {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn exited(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().ok().flatten().map(|s| s.code())
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // SIGTERM first: the supervisor of volfsd's sandbox takes the daemon with it.
        // SAFETY: kill with the pid of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `binary` as the case's launcher would and checks that it serves.
fn run_case(binary: &Path, daemon: &str, case: &Case) -> (Outcome, String) {
    let dir = TestDir::new(&format!("launcher-{daemon}-{}", case.name));
    let share = dir.shared();
    let content = format!("served to {} by {daemon}\n", case.name);
    fs::write(share.join("hello.txt"), &content).unwrap();
    let sockdir = dir.socket().parent().unwrap().join("sockdir");
    fs::create_dir_all(&sockdir).unwrap();
    // Session-mode cases run as the non-root user, on a test dir it owns and with
    // its own copy of the binary (the user may not reach the original).
    let user = case.unprivileged.then(session_user);
    let binary = match user {
        Some(u) => {
            let copy = dir.shared().parent().unwrap().join(daemon);
            fs::copy(binary, &copy).unwrap();
            for p in [
                dir.shared().parent().unwrap(),
                &share,
                &share.join("hello.txt"),
                &copy,
            ] {
                std::os::unix::fs::chown(p, Some(u.uid), Some(u.gid)).unwrap();
            }
            copy
        }
        None => binary.to_path_buf(),
    };
    let (uid, gid) = match user {
        Some(u) => (u.uid, u.gid),
        None => (unsafe { libc::getuid() }, unsafe { libc::getgid() }),
    };
    let sub = user.map_or(((0, 0), (0, 0)), |u| (u.subuid, u.subgid));
    let fill = |s: &str| {
        s.replace("{SHARE}", &share.display().to_string())
            .replace("{SOCK}", &dir.socket().display().to_string())
            .replace("{SOCKDIR}", &sockdir.display().to_string())
            .replace("{FD}", &LIBVIRT_FD.to_string())
            .replace("{UID}", &uid.to_string())
            .replace("{GID}", &gid.to_string())
            .replace("{SUBUID_COUNT}", &sub.0 .1.to_string())
            .replace("{SUBUID}", &sub.0 .0.to_string())
            .replace("{SUBGID_COUNT}", &sub.1 .1.to_string())
            .replace("{SUBGID}", &sub.1 .0.to_string())
    };
    let args: Vec<String> = fill(&case.argv)
        .split_whitespace()
        .map(String::from)
        .collect();
    let cwd = case.cwd.as_deref().map(|c| PathBuf::from(fill(c)));
    let log = dir.log_path();
    let mut cmd = match user {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={}", u.uid))
                .arg(format!("--regid={}", u.gid))
                .arg("--init-groups")
                .arg(&binary);
            c
        }
        None => Command::new(&binary),
    };
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log).unwrap())
        .stderr(fs::File::options().append(true).open(&log).unwrap());
    if let Some(c) = &cwd {
        cmd.current_dir(c);
    }
    for (k, v) in &case.env {
        cmd.env(k, v);
    }
    // The socket the frontend connects to.
    let socket = if case.socket_fd {
        dir.socket()
    } else {
        let given = args
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                a.strip_prefix("--socket-path=")
                    .map(String::from)
                    .or_else(|| (a == "--socket-path").then(|| args[i + 1].clone()))
            })
            .expect("a path case names --socket-path");
        match &cwd {
            Some(c) if Path::new(&given).is_relative() => c.join(given),
            _ => PathBuf::from(given),
        }
    };
    let listener = if case.socket_fd {
        let fd_number = args
            .iter()
            .find_map(|a| a.strip_prefix("--fd="))
            .and_then(|n| n.parse::<i32>().ok())
            .expect("an fd case passes --fd=N");
        let l = UnixListener::bind(&socket).unwrap();
        let raw = l.as_raw_fd();
        // SAFETY: between fork and exec only dup2/fcntl, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if raw == fd_number {
                    let flags = libc::fcntl(raw, libc::F_GETFD);
                    libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                } else if libc::dup2(raw, fd_number) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Some(l)
    } else {
        None
    };
    let command = format!("{} {}", binary.display(), args.join(" "));
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return (Outcome::Failed(format!("spawn: {e}")), command),
    };
    drop(listener);
    let mut run = Run { child, log };
    // Wait for the socket (or an exit).
    let deadline = Instant::now() + START_LIMIT;
    loop {
        if let Some(code) = run.exited() {
            return (Outcome::Refused(code, first_error(&run.log())), command);
        }
        if socket.exists() {
            break;
        }
        if Instant::now() > deadline {
            return (Outcome::Hangs, command);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let outcome = match serve_one_read(&socket, &content) {
        Ok(()) => Outcome::Serves,
        Err(why) => {
            // With an inherited socket the connection is accepted by the kernel before
            // a refusing daemon exits: give it a moment to be seen exiting.
            let deadline = Instant::now() + Duration::from_secs(2);
            while run.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            match run.exited() {
                Some(code) => Outcome::Refused(code, first_error(&run.log())),
                None => Outcome::Failed(why.to_string()),
            }
        }
    };
    // Kata runtime-rs waits for virtiofsd's start-up line on stderr.
    if outcome == Outcome::Serves
        && case.name.starts_with("kata-rs")
        && !run
            .log()
            .contains("Waiting for vhost-user socket connection")
    {
        return (
            Outcome::Failed("no 'Waiting for vhost-user socket connection' line".into()),
            command,
        );
    }
    (outcome, command)
}

/// Why a launcher line's daemon did not serve the read: the step, with the
/// frontend's error, or the bytes it read instead of the file's.
#[derive(Debug)]
enum ServeError {
    Step(&'static str, volfsd_harness::frontend::Error),
    WrongData(Vec<u8>),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Step(step, e) => write!(f, "{step}: {e}"),
            ServeError::WrongData(d) => write!(f, "READ: {:?}", String::from_utf8_lossy(d)),
        }
    }
}

/// A vhost-user handshake, FUSE INIT as a Linux 6.12 guest offers it, and one read.
fn serve_one_read(socket: &Path, content: &str) -> Result<(), ServeError> {
    let at = |step| move |e| ServeError::Step(step, e);
    let mut cfg = DeviceConfig::new(socket);
    cfg.connect_timeout = START_LIMIT;
    let mut fc = FuseClient::connect(&cfg).map_err(at("vhost-user"))?;
    let mut params = InitParams::default();
    params.flags |= (FsOptions::POSIX_ACL
        | FsOptions::DONT_MASK
        | FsOptions::POSIX_LOCKS
        | FsOptions::FLOCK_LOCKS
        | FsOptions::ASYNC_DIO)
        .bits()
        // FUSE_SETXATTR_EXT (7.33), which fuse-backend-rs 0.14 does not name.
        | (1 << 29);
    fc.init_session(&params).map_err(at("FUSE INIT"))?;
    let node = fc.lookup(ROOT, "hello.txt").map_err(at("LOOKUP"))?.nodeid;
    let fh = fc.open(node, RDONLY).map_err(at("OPEN"))?.fh;
    let data = fc.read(node, fh, 0, 4096).map_err(at("READ"))?;
    if data != content.as_bytes() {
        return Err(ServeError::WrongData(data));
    }
    Ok(())
}

#[test]
fn the_case_file_parses_and_names_each_source() {
    let cases = parse_cases(CASES);
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let mut seen = BTreeMap::new();
    for c in &cases {
        assert!(
            seen.insert(c.name.clone(), ()).is_none(),
            "case {} twice",
            c.name
        );
        assert_eq!(
            c.socket_fd,
            c.argv.contains("--fd="),
            "case {}: socket: disagrees with its argv",
            c.name
        );
    }
}

#[test]
fn volfsd_serves_every_launcher_line_virtiofsd_serves() {
    let cases = parse_cases(CASES);
    let volfsd = volfsd_binary();
    let virtiofsd = virtiofsd_binary();
    let mut rows = Vec::new();
    for case in &cases {
        let (ours, command) = run_case(&volfsd, "volfsd", case);
        let (theirs, _) = run_case(&virtiofsd, "virtiofsd", case);
        eprintln!(
            "{:<34} volfsd: {:<10} virtiofsd: {}",
            case.name,
            ours.cell(),
            theirs.cell()
        );
        rows.push((case, ours, theirs, command));
    }
    let ours = rows.iter().filter(|r| r.1 == Outcome::Serves).count();
    let theirs = rows.iter().filter(|r| r.2 == Outcome::Serves).count();
    let mut report = format!(
        "# Launcher lines: volfsd against virtiofsd\n\n\
         Generated by `cargo test -p volfsd-harness --test launchers` from \
         harness/tests/launchers/cases.txt. volfsd serves {ours} of {n}, virtiofsd {theirs} of {n}.\n\n\
         | case | launcher | volfsd | virtiofsd | source |\n|---|---|---|---|---|\n",
        n = rows.len()
    );
    for (case, o, t, _) in &rows {
        report += &format!(
            "| {} | {} | {} | {} | {} |\n",
            case.name,
            case.launcher.replace('|', "\\|"),
            o.cell(),
            t.cell(),
            case.source.replace('|', "\\|")
        );
    }
    let out = volfsd
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("launchers-report.md");
    fs::write(&out, &report).unwrap();
    eprintln!("{report}\n(written to {})", out.display());

    let mut failures = Vec::new();
    for (case, o, t, command) in &rows {
        if *t == Outcome::Serves && *o != Outcome::Serves {
            failures.push(format!(
                "{}: virtiofsd serves, volfsd {}\n  {command}",
                case.name,
                o.cell()
            ));
        }
        match o {
            Outcome::Serves => {}
            Outcome::Refused(Some(1), msg) if !msg.is_empty() => {}
            other => failures.push(format!(
                "{}: volfsd must serve or exit 1 with a reason, not {}\n  {command}",
                case.name,
                other.cell()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
