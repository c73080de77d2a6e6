//! Logging to stderr (env_logger) or to syslog (`--syslog`).
//!
//! The syslog writer is a few lines over `/dev/log` (RFC 3164 framing), which is all a
//! daemon needs; it avoids a dependency for one datagram send.

use std::os::unix::net::UnixDatagram;
use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};

pub fn init(level: LevelFilter, syslog: bool) -> Result<(), String> {
    if syslog {
        let sock = UnixDatagram::unbound().map_err(|e| format!("syslog socket: {e}"))?;
        sock.connect("/dev/log")
            .map_err(|e| format!("--syslog: connect /dev/log: {e}"))?;
        log::set_boxed_logger(Box::new(SyslogLogger {
            sock: Mutex::new(sock),
            pid: std::process::id(),
        }))
        .map_err(|e| e.to_string())?;
        log::set_max_level(level);
    } else {
        env_logger::Builder::new()
            .filter_level(level)
            .format_timestamp_millis()
            .try_init()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

struct SyslogLogger {
    sock: Mutex<UnixDatagram>,
    pid: u32,
}

impl Log for SyslogLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // facility daemon (3) * 8 + severity
        let severity = match record.level() {
            Level::Error => 3,
            Level::Warn => 4,
            Level::Info => 6,
            Level::Debug | Level::Trace => 7,
        };
        let msg = format!(
            "<{}>volfsd[{}]: {}",
            3 * 8 + severity,
            self.pid,
            record.args()
        );
        let _ = self.sock.lock().unwrap().send(msg.as_bytes());
    }

    fn flush(&self) {}
}
