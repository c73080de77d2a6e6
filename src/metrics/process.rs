//! The daemon process's own gauges: its anonymous memory (RssAnon: what the daemon
//! itself uses; VmRSS also counts the guest RAM it touched through the shared
//! mapping), its CPU seconds and its start time. `/proc/self/status` and
//! `/proc/self/stat` are opened before the sandbox changes the root (there is no
//! /proc inside it) and read again from offset 0 at each scrape.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The open files, and what does not change.
pub struct ProcessFiles {
    status: File,
    stat: File,
    /// Seconds since the Unix epoch.
    start_time: f64,
    ticks_per_second: f64,
}

/// One reading.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub rss_anon_bytes: u64,
    pub resident_bytes: u64,
    pub cpu_seconds: f64,
    pub start_time_seconds: f64,
}

impl ProcessFiles {
    /// Opens them for the calling process (the serving one: after any fork).
    pub fn open() -> std::io::Result<ProcessFiles> {
        let status = File::open("/proc/self/status")?;
        let stat = File::open("/proc/self/stat")?;
        // SAFETY: sysconf only reads a system value.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let ticks_per_second = if ticks > 0 { ticks as f64 } else { 100.0 };
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| field_after(&s, "btime"))
            .unwrap_or(0.0);
        let started_ticks = stat_field(&read_all(&stat), 22).unwrap_or(0.0);
        Ok(ProcessFiles {
            status,
            stat,
            start_time: boot_time + started_ticks / ticks_per_second,
            ticks_per_second,
        })
    }

    pub fn read(&self) -> ProcessStats {
        let status = read_all(&self.status);
        let stat = read_all(&self.stat);
        let kib = |name| field_after(&status, name).unwrap_or(0.0) as u64 * 1024;
        let ticks = stat_field(&stat, 14).unwrap_or(0.0) + stat_field(&stat, 15).unwrap_or(0.0);
        ProcessStats {
            rss_anon_bytes: kib("RssAnon:"),
            resident_bytes: kib("VmRSS:"),
            cpu_seconds: ticks / self.ticks_per_second,
            start_time_seconds: self.start_time,
        }
    }
}

fn read_all(f: &File) -> String {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        match f.read_at(&mut buf[len..], len as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                len += n;
                if len == buf.len() {
                    buf.resize(len * 2, 0);
                }
            }
        }
    }
    buf.truncate(len);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The number after `name` at the start of a line ("VmRSS:   123 kB", "btime 17").
fn field_after(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Field `n` (1-based, as proc(5) numbers them) of /proc/PID/stat; the command
/// name (field 2) may hold spaces, so fields are counted after its closing paren.
fn stat_field(stat: &str, n: usize) -> Option<f64> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(n - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields() {
        let stat = "42 (a (weird) name) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 0 0 20 0 1 0 500 0";
        assert_eq!(stat_field(stat, 3), None, "the state is not a number");
        assert_eq!(stat_field(stat, 14), Some(7.0));
        assert_eq!(stat_field(stat, 15), Some(3.0));
        assert_eq!(stat_field(stat, 22), Some(500.0));
        assert_eq!(
            field_after("VmRSS:\t  1234 kB\nRssAnon:\t 56 kB\n", "RssAnon:"),
            Some(56.0)
        );
    }

    #[test]
    fn this_process_reads_sensibly() {
        let p = ProcessFiles::open().unwrap().read();
        assert!(
            p.rss_anon_bytes > 0 && p.resident_bytes >= p.rss_anon_bytes,
            "{p:?}"
        );
        assert!(p.start_time_seconds > 1.6e9, "{p:?}");
        assert!(p.cpu_seconds >= 0.0);
    }
}
