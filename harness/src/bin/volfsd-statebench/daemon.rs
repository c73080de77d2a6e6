//! The daemons a run starts (stopped when dropped) and the vhost-user device it
//! connects to them as.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use volfsd_harness::frontend::DeviceConfig;

use crate::error::{Error, Res};

/// A daemon this run started; stopped (and waited for) when dropped.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) log: PathBuf,
}

impl Daemon {
    pub(crate) fn spawn(template: &str, sock: &Path, share: &Path, log: PathBuf) -> Res<Daemon> {
        let line = template
            .replace("{sock}", &sock.display().to_string())
            .replace("{share}", &share.display().to_string());
        let mut words = line.split_whitespace();
        let program = words.next().ok_or(Error::EmptyDaemon)?;
        let _ = fs::remove_file(sock);
        let out = File::create(&log).map_err(Error::file(None, &log))?;
        let err = out
            .try_clone()
            .map_err(Error::file(Some("duplicating the fd of"), &log))?;
        let child = Command::new(program)
            .args(words)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Spawn {
                program: program.to_string(),
                source,
            })?;
        Ok(Daemon { child, log })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the daemon to exit by itself (its frontend went away), else kills it.
    pub(crate) fn finish(mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// `e`, with the end of this daemon's log, for `map_err`.
    pub(crate) fn failed(&self) -> impl FnOnce(Error) -> Error + '_ {
        move |e| Error::Daemon {
            source: Box::new(e),
            log_tail: self.log_tail(),
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(crate) fn device_config(sock: &Path) -> DeviceConfig {
    let mut cfg = DeviceConfig::new(sock);
    cfg.memory_size = 64 << 20;
    cfg.queue_size = 1024;
    cfg.event_idx = true;
    cfg.dirty_log = true;
    cfg.connect_timeout = Duration::from_secs(60);
    cfg
}
