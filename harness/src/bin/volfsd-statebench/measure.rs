//! What a run measures of a daemon's process tree: CPU time, anonymous memory, open
//! fds, when it became idle; and the units the JSON lines use.

use std::fs;
use std::time::{Duration, Instant};

use serde_json::json;
use volfsd_harness::fixtures::host::{
    clock_ticks_per_second, process_tree, serving_pid, status_kb, tree_cpu_ticks,
};
use volfsd_harness::frontend::StateTransferTimes;

/// The precopy ends when the source was idle (no CPU used, no thread running or
/// waiting for the disk) for this long.
pub(crate) const IDLE_FOR: Duration = Duration::from_millis(500);

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn cpu_ms(ticks: u64) -> f64 {
    ticks as f64 * 1e3 / clock_ticks_per_second()
}

pub(crate) fn rss_anon_kb(pid: i32) -> u64 {
    process_tree(pid)
        .into_iter()
        .map(|p| status_kb(p, "RssAnon"))
        .sum()
}

pub(crate) fn fd_count(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{}/fd", serving_pid(pid)))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

pub(crate) fn times_json(t: &StateTransferTimes) -> serde_json::Value {
    json!({
        "set_fd_ms": ms(t.set_fd),
        "data_ms": ms(t.data),
        "check_ms": ms(t.check),
        "total_ms": ms(t.total()),
        "bytes": t.bytes,
    })
}

/// Threads of the process tree of `pid` running or in an uninterruptible wait (the
/// state field of `/proc/PID/task/TID/stat` is R or D): work in progress that may
/// not show as CPU time yet (a thread waiting for the disk, or for a core).
pub(crate) fn busy_threads(pid: i32) -> usize {
    process_tree(pid)
        .into_iter()
        .flat_map(|p| {
            fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|t| {
            let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            matches!(state, Some("R" | "D"))
        })
        .count()
}

/// Waits until the process tree of `pid` used no CPU and had no thread running or
/// waiting for the disk for `IDLE_FOR` (or `max` passed); returns when it was last
/// busy, the CPU it used meanwhile, and whether it became idle.
pub(crate) fn wait_idle(pid: i32, max: Duration) -> (Duration, u64, bool) {
    let start = Instant::now();
    let first = tree_cpu_ticks(pid);
    let mut last = first;
    let mut last_busy = start;
    let mut busy_seen = Duration::ZERO;
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let now = tree_cpu_ticks(pid);
        if now != last || busy_threads(pid) > 0 {
            last = now;
            last_busy = Instant::now();
            busy_seen = last_busy - start;
        }
        if last_busy.elapsed() >= IDLE_FOR {
            return (busy_seen, last - first, true);
        }
        if start.elapsed() >= max {
            return (busy_seen, last - first, false);
        }
    }
}
