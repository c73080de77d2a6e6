//! `--volumes`: several volumes of one daemon loaded at once over the same queues.
//!
//! A volume NAME is the directory `SharedDir/NAME`, which the guest sees as `/NAME`
//! (the daemon is started with `--allowed-dir NAME` for each). Each volume gets its
//! own work dir, `SharedDir/NAME/volfsd-loadgen`, prepared on the host; the guest
//! side looks up `/NAME` (each component of a nested name) and then the work dir.
//! Within each queue, in-flight slot i works on volume `i % n` ([`slot_volume`]),
//! so the requests of different volumes share one virtqueue. What each volume
//! completed is counted per [`SERIES_INTERVAL`] of the wall clock ([`Series`]), so
//! a script that changes a volume's limits while the load runs can see when the
//! rate follows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::driver::SlotQueue;
use super::{Error, Latency, LgResult, Options, WORK_DIR};
use crate::frontend::FuseOps;

/// Width of the intervals of the per-volume time series.
pub const SERIES_INTERVAL: Duration = Duration::from_millis(100);

/// Where one volume's load goes: the host directory and the guest path to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// As given to `--volumes` (empty: the shared dir's root, without `--volumes`).
    pub name: String,
    /// The volume's directory on the host.
    pub host_dir: PathBuf,
    /// The names to look up from the guest's root to reach it (none for the root).
    pub guest_path: Vec<String>,
}

impl Target {
    /// The load generator's work dir in this volume, on the host.
    pub fn work_dir(&self) -> PathBuf {
        self.host_dir.join(WORK_DIR)
    }

    /// `volume NAME: ` for error messages (nothing without `--volumes`).
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            String::new()
        } else {
            format!("volume {}: ", self.name)
        }
    }
}

/// The targets of a run: the shared dir's root without volumes, else one per
/// volume, in the order given. A name is a relative path of plain components
/// (`data`, `rw/vol-a`), each given once.
pub fn targets(shared_dir: &Path, volumes: &[String]) -> LgResult<Vec<Target>> {
    if volumes.is_empty() {
        return Ok(vec![Target {
            name: String::new(),
            host_dir: shared_dir.to_path_buf(),
            guest_path: Vec::new(),
        }]);
    }
    let mut out: Vec<Target> = Vec::with_capacity(volumes.len());
    for name in volumes {
        let parts: Vec<String> = name.split('/').map(str::to_string).collect();
        if name.is_empty()
            || parts
                .iter()
                .any(|p| p.is_empty() || p == "." || p == ".." || p.contains('\0'))
        {
            return Err(Error::BadVolumeName(name.clone()));
        }
        if out.iter().any(|t| t.name == *name) {
            return Err(Error::VolumeTwice(name.clone()));
        }
        out.push(Target {
            name: name.clone(),
            host_dir: shared_dir.join(name),
            guest_path: parts,
        });
    }
    Ok(out)
}

/// Parses `--volumes a,b,c` (empty parts are skipped).
pub fn parse_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// The volume in-flight slot `slot` of a queue works on, of `volumes`.
pub fn slot_volume(slot: usize, volumes: usize) -> usize {
    slot % volumes.max(1)
}

/// Checks that each volume gets at least one slot of QD `qd`.
pub fn check_qd(opts: &Options, volumes: usize) -> LgResult<()> {
    if volumes > opts.qd {
        return Err(Error::QdBelowVolumes {
            qd: opts.qd,
            volumes,
        });
    }
    Ok(())
}

/// Unix time in ms.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Completions (operations and their bytes) per interval since a start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    pub ops: Vec<u64>,
    pub bytes: Vec<u64>,
}

impl Series {
    /// The interval an event `elapsed` after the start falls in.
    pub fn bucket(elapsed: Duration) -> usize {
        (elapsed.as_nanos() / SERIES_INTERVAL.as_nanos()) as usize
    }

    /// One operation of `bytes` completed `elapsed` after the start.
    pub fn record(&mut self, elapsed: Duration, bytes: u64) {
        let k = Self::bucket(elapsed);
        if k >= self.ops.len() {
            self.ops.resize(k + 1, 0);
            self.bytes.resize(k + 1, 0);
        }
        self.ops[k] += 1;
        self.bytes[k] += bytes;
    }

    /// Adds another thread's series (same start).
    pub fn merge(&mut self, other: &Series) {
        if other.ops.len() > self.ops.len() {
            self.ops.resize(other.ops.len(), 0);
            self.bytes.resize(other.ops.len(), 0);
        }
        for (k, (o, b)) in other.ops.iter().zip(&other.bytes).enumerate() {
            self.ops[k] += o;
            self.bytes[k] += b;
        }
    }

    /// The intervals from the start (unix ms) to `end` (the last one may be
    /// partial; empty intervals are listed too).
    pub fn intervals(&self, start_unix_ms: u64, elapsed: Duration) -> Vec<Interval> {
        let step = SERIES_INTERVAL.as_millis() as u64;
        let n = self.ops.len().max(Self::bucket(elapsed) + 1);
        (0..n)
            .map(|k| Interval {
                start_unix_ms: start_unix_ms + step * k as u64,
                ops: self.ops.get(k).copied().unwrap_or(0),
                bytes: self.bytes.get(k).copied().unwrap_or(0),
            })
            .collect()
    }
}

/// One interval of a volume's time series.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Interval {
    /// Unix time (ms) the interval starts at; it lasts `interval_ms`.
    pub start_unix_ms: u64,
    /// Operations completed in it.
    pub ops: u64,
    /// Payload bytes those operations moved.
    pub bytes: u64,
}

/// One volume's share of a workload (`--volumes`).
#[derive(Clone, Debug, Serialize)]
pub struct VolumeResult {
    pub volume: String,
    pub ops: u64,
    pub requests: u64,
    pub bytes: u64,
    /// Over the workload's whole `seconds`.
    pub ops_per_sec: f64,
    pub mib_per_sec: f64,
    /// Of this volume's requests, submit to completion.
    pub latency: Latency,
    /// Width of the series' intervals.
    pub interval_ms: u64,
    /// Completions per interval of the wall clock, from the workload's
    /// `start_unix_ms`; the last interval ends at `end_unix_ms` (partial).
    pub series: Vec<Interval>,
}

/// Looks up the target's volume from the guest's root (each component of its
/// name) and then its work dir; every lookup is counted in `forgets`. Returns the
/// work dir's node id.
pub(super) fn lookup_work_dir(
    q: &mut SlotQueue,
    t: &Target,
    forgets: &mut HashMap<u64, u64>,
) -> LgResult<u64> {
    let mut node = 1;
    for part in &t.guest_path {
        node = q
            .lookup(node, part)
            .map_err(Error::step(format!("LOOKUP volume /{}", t.name)))?
            .nodeid;
        *forgets.entry(node).or_default() += 1;
    }
    node = q
        .lookup(node, WORK_DIR)
        .map_err(Error::step(format!("{}LOOKUP work dir", t.label())))?
        .nodeid;
    *forgets.entry(node).or_default() += 1;
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_round_robin_over_the_volumes() {
        let got: Vec<usize> = (0..7).map(|s| slot_volume(s, 3)).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
        assert!((0..16).all(|s| slot_volume(s, 1) == 0));
        // Without --volumes there is one target.
        assert_eq!(slot_volume(5, 0), 0);
        // QD 16 over 2 volumes: 8 slots each.
        let a = (0..16).filter(|&s| slot_volume(s, 2) == 0).count();
        assert_eq!(a, 8);
    }

    #[test]
    fn targets_are_the_root_or_one_per_volume() {
        let root = targets(Path::new("/s"), &[]).unwrap();
        assert_eq!(root.len(), 1);
        assert_eq!(root[0].work_dir(), Path::new("/s/volfsd-loadgen"));
        assert!(root[0].guest_path.is_empty());
        assert_eq!(root[0].label(), "");

        let v = targets(Path::new("/s"), &parse_list("a, rw/vol-b,")).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].work_dir(), Path::new("/s/a/volfsd-loadgen"));
        assert_eq!(v[0].guest_path, ["a"]);
        assert_eq!(v[1].host_dir, Path::new("/s/rw/vol-b"));
        assert_eq!(v[1].guest_path, ["rw", "vol-b"]);
        assert_eq!(v[1].label(), "volume rw/vol-b: ");

        for bad in ["/a", "a/", "a//b", "..", "a/../b", "."] {
            assert!(targets(Path::new("/s"), &[bad.into()]).is_err(), "{bad}");
        }
        assert!(targets(Path::new("/s"), &["a".into(), "a".into()]).is_err());
    }

    #[test]
    fn completions_fall_in_100ms_intervals() {
        let ms = Duration::from_millis;
        assert_eq!(Series::bucket(ms(0)), 0);
        assert_eq!(Series::bucket(ms(99)), 0);
        assert_eq!(Series::bucket(Duration::from_micros(99_999)), 0);
        assert_eq!(Series::bucket(ms(100)), 1);
        assert_eq!(Series::bucket(ms(1050)), 10);

        let mut a = Series::default();
        a.record(ms(5), 4096);
        a.record(ms(99), 4096);
        a.record(ms(250), 4096);
        assert_eq!(a.ops, [2, 0, 1]);
        assert_eq!(a.bytes, [8192, 0, 4096]);

        let mut b = Series::default();
        b.record(ms(120), 0);
        b.record(ms(430), 0);
        a.merge(&b);
        assert_eq!(a.ops, [2, 1, 1, 0, 1]);
        assert_eq!(a.bytes, [8192, 0, 4096, 0, 0]);

        // Absolute start times; trailing empty intervals up to the end are listed.
        let iv = a.intervals(1_700_000_000_000, ms(720));
        assert_eq!(iv.len(), 8);
        assert_eq!(iv[0].start_unix_ms, 1_700_000_000_000);
        assert_eq!(iv[4].start_unix_ms, 1_700_000_000_400);
        assert_eq!(iv[4].ops, 1);
        assert_eq!(iv[7].start_unix_ms, 1_700_000_000_700);
        assert_eq!(iv[7].ops, 0);
        assert_eq!(iv.iter().map(|i| i.ops).sum::<u64>(), 5);
    }

    #[test]
    fn each_volume_needs_a_slot() {
        let opts = Options {
            socket: "/s".into(),
            shared_dir: "/d".into(),
            queues: 1,
            qd: 2,
            duration: None,
            ops: None,
            file_size: 4096,
            files: 1,
            workloads: Vec::new(),
            keep_files: false,
            quiet: true,
            idle_before: Duration::ZERO,
            hold_after: Duration::ZERO,
            daemon_pid: None,
            hold_inodes: 0,
        };
        assert!(check_qd(&opts, 2).is_ok());
        assert!(check_qd(&opts, 3).is_err());
    }
}
