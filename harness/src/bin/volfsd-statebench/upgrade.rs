//! `upgrade`: one `--upgradable` volfsd upgraded K times by SIGHUP while the guest
//! sends GETATTRs; one JSON line per upgrade.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use serde_json::json;
use volfsd_harness::frontend::FuseClient;

use crate::daemon::{device_config, Daemon};
use crate::error::{Error, Res};
use crate::guest::{check_samples, getattr_root, hold};
use crate::measure::{ms, rss_anon_kb};
use crate::tree::make_tree;
use crate::UpgradeArgs;

pub(crate) fn upgrade(a: &UpgradeArgs) -> Res<()> {
    let share = make_tree(&a.tree, a.nodes)?;
    fs::create_dir_all(&a.work).map_err(Error::file(Some("creating"), &a.work))?;
    let sock = a.work.join("upgrade.sock");
    // No control socket: with one the guest's root would hold only volumes. The
    // upgrades go by SIGHUP to the keeper (the launched process), and the pause is
    // read from its log line, as `ctl upgrade` reports it.
    let template = format!(
        "{} --upgradable --socket-path {{sock}} --shared-dir {{share}} --cache none {}",
        a.volfsd.display(),
        a.daemon_args
    );
    let tag = format!("upgrade-n{}", a.nodes);
    let d = Daemon::spawn(&template, &sock, &share, a.work.join(format!("{tag}.log")))?;
    let mut c = FuseClient::connect(&device_config(&sock))
        .map_err(Error::from)
        .map_err(d.failed())?;
    c.init_session(&Default::default())
        .map_err(Error::step("INIT"))
        .map_err(d.failed())?;
    let (lookup_s, held, samples) = hold(&mut c, &share, a.nodes).map_err(d.failed())?;
    eprintln!("statebench: {tag}: {held} nodes held (lookups {lookup_s:.1} s)");
    let root_ino = fs::metadata(&share)
        .map_err(Error::file(None, &share))?
        .ino();
    let outcomes = |d: &Daemon| -> Vec<String> {
        fs::read_to_string(&d.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("keeper: upgraded:") || l.contains("keeper: upgrade failed"))
            .map(str::to_string)
            .collect()
    };
    for k in 1..=a.upgrades {
        if k > 1 {
            std::thread::sleep(Duration::from_millis(a.interval_ms));
        }
        let rss_kb = rss_anon_kb(d.pid());
        let before = outcomes(&d).len();
        let start = Instant::now();
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        if unsafe { libc::kill(d.pid(), libc::SIGHUP) } != 0 {
            return Err(Error::Host {
                step: "SIGHUP",
                source: io::Error::last_os_error(),
            });
        }
        // The guest meanwhile: one GETATTR after another until the keeper logs the
        // outcome.
        let (mut getattrs, mut slowest, mut stalls) = (0u64, Duration::ZERO, 0u32);
        let line = loop {
            if !a.probe {
                if let Some(l) = outcomes(&d).into_iter().nth(before) {
                    break l;
                }
                if start.elapsed() > Duration::from_secs(120) {
                    return Err(d.failed()(Error::NoOutcome { upgrade: k }));
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let t = Instant::now();
            let (ino, stalled) = getattr_root(&mut c)
                .map_err(|e| Error::Probe {
                    upgrade: k,
                    after: getattrs,
                    source: Box::new(e),
                })
                .map_err(d.failed())?;
            if stalled {
                stalls += 1;
            } else {
                slowest = slowest.max(t.elapsed());
            }
            getattrs += 1;
            if ino != root_ino {
                return Err(Error::RootInode {
                    upgrade: k,
                    answered: ino,
                    share: root_ino,
                });
            }
            if getattrs % 16 == 0 || stalled {
                if let Some(l) = outcomes(&d).into_iter().nth(before) {
                    break l;
                }
                if start.elapsed() > Duration::from_secs(120) {
                    return Err(d.failed()(Error::NoOutcome { upgrade: k }));
                }
            }
        };
        let upgrade_ms = ms(start.elapsed());
        let pause_ms: u64 = line
            .split("the guest waited ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                d.failed()(Error::NoPause {
                    upgrade: k,
                    line: line.clone(),
                })
            })?;
        check_samples(&mut c, &samples, &format!("after upgrade {k}")).map_err(d.failed())?;
        let result = json!({
            "nodes": a.nodes,
            "held_nodes": held,
            "daemon_args": a.daemon_args,
            "upgrade": k,
            "pause_ms": pause_ms,
            "upgrade_ms": upgrade_ms,
            "getattrs_during": getattrs,
            "slowest_getattr_ms": ms(slowest),
            "stalled_getattrs": stalls,
            "probe": a.probe,
            "interval_ms": a.interval_ms,
            "rss_anon_kb_before": rss_kb,
            "lookup_s": lookup_s,
            "verified_nodes": samples.len(),
        });
        eprintln!(
            "statebench: {tag}: upgrade {k}: the keeper's pause {pause_ms} ms; slowest of \
             {getattrs} GETATTRs {:.1} ms ({stalls} stalled); the whole upgrade {upgrade_ms:.0} ms",
            ms(slowest)
        );
        if let Some(path) = &a.json {
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(Error::file(None, path))?;
            writeln!(f, "{result}").map_err(Error::file(Some("appending to"), path))?;
        }
    }
    drop(c);
    if d.finish(Duration::from_secs(120)).is_none() {
        eprintln!(
            "statebench: {tag}: the daemon did not exit within 120 s of its disconnect; killed"
        );
    }
    Ok(())
}
