//! Test harness: a temp share, the daemon under test, and a connected client.
//!
//! The daemon binary is `volfsd` unless `VOLFSD_TEST_DAEMON` names another
//! (e.g. `~/.cargo/bin/virtiofsd`) so the suite can be checked against the
//! reference implementation.

#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use volfsd::frontend::fuse::FuseClient;
use volfsd::frontend::{DeviceConfig, Error};

/// Root node id.
pub const ROOT: u64 = 1;

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// The daemon binary under test.
pub fn daemon_binary() -> PathBuf {
    std::env::var_os("VOLFSD_TEST_DAEMON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_volfsd")))
}

/// True when running against the reference virtiofsd.
pub fn is_virtiofsd() -> bool {
    daemon_binary()
        .file_name()
        .is_some_and(|n| n.to_string_lossy().contains("virtiofsd"))
}

/// A unique directory holding the shared dir, the socket and the daemon log.
pub struct TestDir {
    pub root: PathBuf,
}

impl TestDir {
    pub fn new(test: &str) -> Self {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("volfsd-test-{}-{n}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("shared")).expect("create test dir");
        TestDir { root }
    }

    pub fn shared(&self) -> PathBuf {
        self.root.join("shared")
    }

    pub fn socket(&self) -> PathBuf {
        self.root.join("sock")
    }

    pub fn log_path(&self) -> PathBuf {
        self.root.join("daemon.log")
    }

    /// Where tests put the daemon's `--control-socket`.
    pub fn control_socket(&self) -> PathBuf {
        self.root.join("ctl.sock")
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A running daemon serving `dir.shared()` on `dir.socket()`.
pub struct Daemon {
    pub dir: TestDir,
    child: Child,
    status: Option<ExitStatus>,
}

impl Daemon {
    /// Starts the daemon with `--cache=never` plus `extra` arguments.
    pub fn start(test: &str, extra: &[&str]) -> Self {
        Self::start_in(TestDir::new(test), extra)
    }

    pub fn start_in(dir: TestDir, extra: &[&str]) -> Self {
        Self::start_wrapped(dir, &[], extra)
    }

    /// Starts the daemon under `wrapper` (e.g. `["unshare", "-m", "--"]`), which must
    /// exec the daemon in place so that [`Daemon::pid`] is the daemon's pid.
    pub fn start_wrapped(dir: TestDir, wrapper: &[&str], extra: &[&str]) -> Self {
        let log = File::create(dir.log_path()).expect("create daemon log");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(daemon_binary());
                c
            }
            None => Command::new(daemon_binary()),
        };
        let child = cmd
            .arg(format!("--socket-path={}", dir.socket().display()))
            .arg(format!("--shared-dir={}", dir.shared().display()))
            .arg("--cache=never")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", daemon_binary().display()));
        let mut daemon = Daemon {
            dir,
            child,
            status: None,
        };
        daemon.wait_for_socket();
        daemon
    }

    fn wait_for_socket(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.dir.socket().exists() {
            assert!(self.is_running(), "daemon exited early:\n{}", self.log());
            assert!(
                Instant::now() < deadline,
                "no socket after 10s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn config(&self) -> DeviceConfig {
        DeviceConfig::new(self.dir.socket())
    }

    /// Connects with one request queue and does FUSE_INIT.
    pub fn client(&self) -> FuseClient {
        self.client_with(&self.config())
    }

    pub fn client_with(&self, cfg: &DeviceConfig) -> FuseClient {
        FuseClient::connect_and_init(cfg)
            .unwrap_or_else(|e| panic!("connect/init failed: {e}\n{}", self.log()))
    }

    /// Path inside the shared directory.
    pub fn host(&self, rel: &str) -> PathBuf {
        self.dir.shared().join(rel)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn is_running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait().expect("try_wait on daemon") {
            Some(status) => {
                self.status = Some(status);
                false
            }
            None => true,
        }
    }

    /// Waits up to `timeout` for the daemon to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.status
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.log_path()).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.is_running() {
            // Only the child we spawned, by its pid.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Asserts `result` is an errno reply with `errno`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(result: Result<T, Error>, errno: i32) {
    match result {
        Err(e) if e.errno() == Some(errno) => {}
        other => panic!(
            "expected errno {errno} ({}), got {other:?}",
            std::io::Error::from_raw_os_error(errno)
        ),
    }
}

/// Reads a host file, with the path in the panic message.
#[track_caller]
pub fn host_read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}
