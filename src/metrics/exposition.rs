//! The Prometheus text exposition format (version 0.0.4) of a metrics snapshot:
//! one `# HELP` and `# TYPE` per family, base units (seconds, bytes), `_total` on
//! counters, label values escaped.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::process::ProcessStats;
use super::{Op, VolumeMetrics, DURATION_BUCKETS, ERRNO_CLASSES, OTHER_ERRNO};
use crate::region::Region;

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One attached volume.
pub struct VolumeSnapshot<'a> {
    pub name: &'a str,
    pub metrics: &'a VolumeMetrics,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub nodes: usize,
    pub handles: usize,
    pub lock_files: usize,
    /// QoS: requests that waited for tokens, waiting now, and seconds waited.
    pub throttled: u64,
    pub waiting: u64,
    pub wait_seconds: f64,
    /// The volume's limits as rates (None: that measure is not limited).
    pub ops_limit: Option<f64>,
    pub bytes_limit: Option<f64>,
}

/// Everything one scrape shows.
pub struct Snapshot<'a> {
    pub volumes: Vec<VolumeSnapshot<'a>>,
    /// Per request queue: requests served, and being served now.
    pub queue_requests: Vec<u64>,
    pub queue_in_flight: Vec<u64>,
    pub frontend_connected: bool,
    /// Blocking lock requests (SETLKW) waiting on threads of their own.
    pub lock_waits: usize,
    /// Host fds held for the guest across volumes, and the most it may hold.
    pub fds: (usize, usize),
    pub process: Option<ProcessStats>,
    /// Under a keeper (`--upgradable`): its counters over the daemon's life.
    pub keeper: Option<KeeperStats>,
}

/// The keeper's counters (the session region's), over the daemon's life.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeeperStats {
    pub upgrades: u64,
    pub upgrades_failed: u64,
    pub crashes: u64,
    pub recoveries: u64,
    pub requests_rerun: u64,
    pub requests_failed: u64,
    /// Upgrades', then recoveries' pauses: count, total, longest, last (seconds).
    pub pauses: [(u64, f64, f64, f64); 2],
}

impl KeeperStats {
    /// The keeper's counters in its session `region`.
    pub fn read(region: &Region) -> KeeperStats {
        use crate::region::PauseKind;
        let c = &region.header().counters;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let pauses = [PauseKind::Upgrade, PauseKind::Recovery].map(|k| {
            let p = c.pauses(k);
            let s = |a| load(a) as f64 / 1e6;
            (load(&p.count), s(&p.total_us), s(&p.max_us), s(&p.last_us))
        });
        KeeperStats {
            upgrades: load(&c.upgrades),
            upgrades_failed: load(&c.upgrades_failed),
            crashes: load(&c.crashes),
            recoveries: load(&c.recoveries),
            requests_rerun: load(&c.requests_rerun),
            requests_failed: load(&c.requests_failed),
            pauses,
        }
    }
}

/// The keeper's families.
fn render_keeper(out: &mut String, k: &KeeperStats) {
    let counters: [(&str, &str, u64); 6] = [
        (
            "volfsd_keeper_upgrades_total",
            "Upgrades in place done by the keeper (--upgradable).",
            k.upgrades,
        ),
        (
            "volfsd_keeper_upgrades_failed_total",
            "Upgrades that failed: the old serving process served on (the log says why).",
            k.upgrades_failed,
        ),
        (
            "volfsd_keeper_crashes_total",
            "Serving processes that crashed and were replaced by the keeper.",
            k.crashes,
        ),
        (
            "volfsd_keeper_recoveries_total",
            "Crashes under a guest's session that a new serving process took over, on the same rings.",
            k.recoveries,
        ),
        (
            "volfsd_keeper_requests_rerun_total",
            "Requests a crashed serving process had taken and not answered, run again (idempotent).",
            k.requests_rerun,
        ),
        (
            "volfsd_keeper_requests_failed_total",
            "Requests a crashed serving process had taken and not answered, answered EIO (not idempotent).",
            k.requests_failed,
        ),
    ];
    for (name, help, n) in counters {
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {n}");
    }
    use crate::region::PauseKind;
    let kinds = [PauseKind::Upgrade.label(), PauseKind::Recovery.label()];
    family(
        out,
        "volfsd_keeper_pause_seconds",
        "summary",
        "How long the guest's requests waited in each upgrade and recovery.",
    );
    for (kind, (count, total, _, _)) in kinds.iter().zip(k.pauses) {
        let _ = writeln!(
            out,
            "volfsd_keeper_pause_seconds_sum{{kind=\"{kind}\"}} {total}"
        );
        let _ = writeln!(
            out,
            "volfsd_keeper_pause_seconds_count{{kind=\"{kind}\"}} {count}"
        );
    }
    for (name, help, pick) in [
        (
            "volfsd_keeper_pause_max_seconds",
            "The longest pause of the guest's requests, by kind.",
            2usize,
        ),
        (
            "volfsd_keeper_pause_last_seconds",
            "The last pause of the guest's requests, by kind.",
            3,
        ),
    ] {
        family(out, name, "gauge", help);
        for (kind, p) in kinds.iter().zip(k.pauses) {
            let v = if pick == 2 { p.2 } else { p.3 };
            let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {v}");
        }
    }
}

/// A family with one sample per volume: name, type, help, and its value.
type PerVolumeFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&VolumeSnapshot) -> u64,
);

/// A family of volume limits: name, help, and the rate if the volume has one.
type LimitFamily = (
    &'static str,
    &'static str,
    fn(&VolumeSnapshot) -> Option<f64>,
);

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

pub fn render(s: &Snapshot) -> String {
    let mut out = String::with_capacity(4096 + s.volumes.len() * 8192);

    family(
        &mut out,
        "volfsd_requests_total",
        "counter",
        "FUSE requests served, by volume, operation and result.",
    );
    for v in &s.volumes {
        let vol = escape(v.name);
        for op in Op::ALL {
            let m = v.metrics.op(op);
            let (ok, err) = (m.ok, m.errors);
            if ok + err == 0 {
                continue;
            }
            for (result, n) in [("ok", ok), ("error", err)] {
                let _ = writeln!(
                    out,
                    "volfsd_requests_total{{volume=\"{vol}\",op=\"{}\",result=\"{result}\"}} {n}",
                    op.name()
                );
            }
        }
    }

    family(
        &mut out,
        "volfsd_request_duration_seconds",
        "histogram",
        "How long FUSE requests took in the daemon, by volume and operation, timed on a \
         sample: the first request of each drain of a queue, then one in 16 \
         (volfsd_requests_total counts every request).",
    );
    for v in &s.volumes {
        let vol = escape(v.name);
        for op in Op::ALL {
            let m = v.metrics.op(op);
            let count = m.timed();
            if count == 0 {
                continue;
            }
            let labels = format!("volume=\"{vol}\",op=\"{}\"", op.name());
            let mut cumulative = 0;
            for (i, bound) in DURATION_BUCKETS.iter().enumerate() {
                cumulative += m.buckets[i];
                let _ = writeln!(
                    out,
                    "volfsd_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "volfsd_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {count}"
            );
            let sum = m.duration_nanos as f64 / 1e9;
            let _ = writeln!(out, "volfsd_request_duration_seconds_sum{{{labels}}} {sum}");
            let _ = writeln!(
                out,
                "volfsd_request_duration_seconds_count{{{labels}}} {count}"
            );
        }
    }

    family(
        &mut out,
        "volfsd_request_errors_total",
        "counter",
        "Failed FUSE requests, by volume and errno class.",
    );
    for v in &s.volumes {
        let vol = escape(v.name);
        #[allow(clippy::needless_range_loop)] // `other` is one past ERRNO_CLASSES
        for i in 0..=OTHER_ERRNO {
            let n = v.metrics.errors_of_class(i);
            if n == 0 {
                continue;
            }
            let class = if i == OTHER_ERRNO {
                "other"
            } else {
                ERRNO_CLASSES[i].1
            };
            let _ = writeln!(
                out,
                "volfsd_request_errors_total{{volume=\"{vol}\",errno=\"{class}\"}} {n}"
            );
        }
    }

    let per_volume: [PerVolumeFamily; 7] = [
        (
            "volfsd_read_bytes_total",
            "counter",
            "Bytes the guest read from the volume.",
            |v| v.bytes_read,
        ),
        (
            "volfsd_written_bytes_total",
            "counter",
            "Bytes the guest wrote to the volume.",
            |v| v.bytes_written,
        ),
        (
            "volfsd_volume_nodes",
            "gauge",
            "Node ids the guest holds in the volume.",
            |v| v.nodes as u64,
        ),
        (
            "volfsd_volume_open_handles",
            "gauge",
            "Files and directories the guest holds open in the volume.",
            |v| v.handles as u64,
        ),
        (
            "volfsd_volume_lock_files",
            "gauge",
            "Files carrying a guest process's POSIX locks in the volume.",
            |v| v.lock_files as u64,
        ),
        (
            "volfsd_qos_throttled_requests_total",
            "counter",
            "Requests of the volume that waited for its rate limit's tokens.",
            |v| v.throttled,
        ),
        (
            "volfsd_qos_waiting_requests",
            "gauge",
            "Requests of the volume waiting for tokens now, out of the virtqueues.",
            |v| v.waiting,
        ),
    ];
    for (name, kind, help, get) in per_volume {
        family(&mut out, name, kind, help);
        for v in &s.volumes {
            let _ = writeln!(out, "{name}{{volume=\"{}\"}} {}", escape(v.name), get(v));
        }
    }

    family(
        &mut out,
        "volfsd_qos_wait_seconds_total",
        "counter",
        "Seconds the volume's requests waited for tokens, in all.",
    );
    for v in &s.volumes {
        let _ = writeln!(
            out,
            "volfsd_qos_wait_seconds_total{{volume=\"{}\"}} {}",
            escape(v.name),
            v.wait_seconds
        );
    }
    let limits: [LimitFamily; 2] = [
        (
            "volfsd_qos_limit_requests_per_second",
            "The volume's request rate limit (its ops bucket's size per refill time); absent when unlimited.",
            |v| v.ops_limit,
        ),
        (
            "volfsd_qos_limit_bytes_per_second",
            "The volume's byte rate limit (its bandwidth bucket's size per refill time); absent when unlimited.",
            |v| v.bytes_limit,
        ),
    ];
    for (name, help, get) in limits {
        family(&mut out, name, "gauge", help);
        for v in &s.volumes {
            if let Some(rate) = get(v) {
                let _ = writeln!(out, "{name}{{volume=\"{}\"}} {rate}", escape(v.name));
            }
        }
    }

    family(
        &mut out,
        "volfsd_volumes_attached",
        "gauge",
        "Volumes the guest sees.",
    );
    let _ = writeln!(out, "volfsd_volumes_attached {}", s.volumes.len());
    family(
        &mut out,
        "volfsd_fds_held",
        "gauge",
        "Host file descriptors held for the guest, all volumes.",
    );
    let _ = writeln!(out, "volfsd_fds_held {}", s.fds.0);
    family(
        &mut out,
        "volfsd_fds_max",
        "gauge",
        "The most host file descriptors the guest may hold.",
    );
    let _ = writeln!(out, "volfsd_fds_max {}", s.fds.1);
    family(
        &mut out,
        "volfsd_frontend_connected",
        "gauge",
        "1 while a VMM is connected.",
    );
    let _ = writeln!(
        out,
        "volfsd_frontend_connected {}",
        u8::from(s.frontend_connected)
    );

    family(
        &mut out,
        "volfsd_queue_requests_total",
        "counter",
        "Requests served, by request queue.",
    );
    for (q, n) in s.queue_requests.iter().enumerate() {
        let _ = writeln!(out, "volfsd_queue_requests_total{{queue=\"{q}\"}} {n}");
    }
    family(
        &mut out,
        "volfsd_queue_in_flight_requests",
        "gauge",
        "Requests being served now, by request queue.",
    );
    for (q, n) in s.queue_in_flight.iter().enumerate() {
        let _ = writeln!(out, "volfsd_queue_in_flight_requests{{queue=\"{q}\"}} {n}");
    }

    family(
        &mut out,
        "volfsd_lock_waits",
        "gauge",
        "Blocking lock requests (SETLKW) waiting on threads of their own, off the queues.",
    );
    let _ = writeln!(out, "volfsd_lock_waits {}", s.lock_waits);
    if let Some(k) = &s.keeper {
        render_keeper(&mut out, k);
    }

    if let Some(p) = &s.process {
        family(
            &mut out,
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time of the serving process.",
        );
        let _ = writeln!(out, "process_cpu_seconds_total {}", p.cpu_seconds);
        family(
            &mut out,
            "process_start_time_seconds",
            "gauge",
            "Start time of the serving process, seconds since the Unix epoch.",
        );
        let _ = writeln!(out, "process_start_time_seconds {}", p.start_time_seconds);
        family(
            &mut out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory (VmRSS; includes guest RAM touched through the shared mapping).",
        );
        let _ = writeln!(out, "process_resident_memory_bytes {}", p.resident_bytes);
        family(
            &mut out,
            "volfsd_process_rss_anon_bytes",
            "gauge",
            "Anonymous resident memory (RssAnon): the daemon's own.",
        );
        let _ = writeln!(out, "volfsd_process_rss_anon_bytes {}", p.rss_anon_bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_snapshot_renders_every_family_once_with_cumulative_buckets() {
        let m = VolumeMetrics::default();
        m.record(Op::lookup, Some(Duration::from_micros(20)), None);
        m.record(
            Op::lookup,
            Some(Duration::from_millis(3)),
            Some(libc::ENOENT),
        );
        let s = Snapshot {
            volumes: vec![VolumeSnapshot {
                name: "data",
                metrics: &m,
                bytes_read: 4096,
                bytes_written: 0,
                nodes: 3,
                handles: 1,
                lock_files: 0,
                throttled: 5,
                waiting: 2,
                wait_seconds: 0.25,
                ops_limit: Some(1000.0),
                bytes_limit: None,
            }],
            queue_requests: vec![7, 0],
            queue_in_flight: vec![1, 0],
            frontend_connected: true,
            lock_waits: 0,
            fds: (4, 1000),
            process: None,
            keeper: Some(KeeperStats {
                upgrades: 3,
                crashes: 2,
                requests_failed: 4,
                pauses: [(3, 0.03, 0.02, 0.005), (1, 0.5, 0.5, 0.5)],
                ..Default::default()
            }),
        };
        let text = render(&s);
        assert!(text.contains("volfsd_keeper_crashes_total 2\n"));
        assert!(text.contains("volfsd_keeper_upgrades_total 3\n"));
        assert!(text.contains("volfsd_keeper_requests_failed_total 4\n"));
        assert!(text.contains("volfsd_keeper_pause_seconds_count{kind=\"upgrade\"} 3\n"));
        assert!(text.contains("volfsd_keeper_pause_max_seconds{kind=\"upgrade\"} 0.02\n"));
        assert!(text.contains("volfsd_keeper_pause_last_seconds{kind=\"recovery\"} 0.5\n"));
        assert!(
            text.contains("volfsd_requests_total{volume=\"data\",op=\"lookup\",result=\"ok\"} 1\n")
        );
        assert!(text
            .contains("volfsd_requests_total{volume=\"data\",op=\"lookup\",result=\"error\"} 1\n"));
        assert!(text.contains("volfsd_request_duration_seconds_bucket{volume=\"data\",op=\"lookup\",le=\"0.000025\"} 1\n"));
        assert!(text.contains("volfsd_request_duration_seconds_bucket{volume=\"data\",op=\"lookup\",le=\"0.005\"} 2\n"));
        assert!(text
            .contains("volfsd_request_duration_seconds_count{volume=\"data\",op=\"lookup\"} 2\n"));
        assert!(text.contains("volfsd_request_errors_total{volume=\"data\",errno=\"ENOENT\"} 1\n"));
        assert!(text.contains("volfsd_read_bytes_total{volume=\"data\"} 4096\n"));
        assert!(text.contains("volfsd_qos_throttled_requests_total{volume=\"data\"} 5\n"));
        assert!(text.contains("volfsd_qos_waiting_requests{volume=\"data\"} 2\n"));
        assert!(text.contains("volfsd_qos_wait_seconds_total{volume=\"data\"} 0.25\n"));
        assert!(text.contains("volfsd_qos_limit_requests_per_second{volume=\"data\"} 1000\n"));
        assert!(!text.contains("volfsd_qos_limit_bytes_per_second{"));
        assert!(text.contains("volfsd_queue_in_flight_requests{queue=\"0\"} 1\n"));
        assert!(
            !text.contains("op=\"read\""),
            "unused operations are left out"
        );
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), types, "a family twice");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
