//! `run`: a migrating VMM against a source and a destination daemon; one JSON line
//! with the save's and the load's times.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;
use volfsd_harness::fixtures::host::tree_cpu_ticks;
use volfsd_harness::frontend::{DirtyLog, FuseClient, FuseOps};

use crate::daemon::{device_config, Daemon};
use crate::error::{Error, Res};
use crate::guest::hold;
use crate::measure::{cpu_ms, fd_count, ms, rss_anon_kb, times_json, wait_idle};
use crate::tree::make_tree;
use crate::RunArgs;

pub(crate) fn run(a: &RunArgs) -> Res<()> {
    let share = make_tree(&a.tree, a.nodes)?;
    fs::create_dir_all(&a.work).map_err(Error::file(Some("creating"), &a.work))?;
    let tag = format!("{}-n{}-rep{}", a.name, a.nodes, a.rep);
    let src_sock = a.work.join(format!("{}-src.sock", a.name));
    let dst_sock = a.work.join(format!("{}-dst.sock", a.name));
    let src = Daemon::spawn(
        &a.daemon,
        &src_sock,
        &share,
        a.work.join(format!("{tag}-src.log")),
    )?;
    let dst = Daemon::spawn(
        &a.daemon,
        &dst_sock,
        &share,
        a.work.join(format!("{tag}-dst.log")),
    )?;

    // The guest: INIT, then every directory and file looked up once.
    let mut c = FuseClient::connect(&device_config(&src_sock))
        .map_err(Error::step("source"))
        .map_err(src.failed())?;
    c.init_session(&Default::default())
        .map_err(Error::step("source INIT"))
        .map_err(src.failed())?;
    let (lookup_s, held, samples) = hold(&mut c, &share, a.nodes).map_err(src.failed())?;
    let src_rss_kb = rss_anon_kb(src.pid());
    let src_fds = fd_count(src.pid());

    // The migration starts: the dirty log, then LOG_ALL.
    let log = DirtyLog::new(c.device().memory().size())?;
    let t = Instant::now();
    c.device()
        .set_log_base(&log)
        .map_err(Error::from)
        .map_err(src.failed())?;
    let log_base = t.elapsed();
    let t = Instant::now();
    c.device()
        .set_log_all(true)
        .map_err(Error::from)
        .map_err(src.failed())?;
    let log_all = t.elapsed();

    // The precopy.
    let (prep, prep_ticks, prep_idle) = if a.precopy == "idle" {
        wait_idle(src.pid(), Duration::from_secs_f64(a.precopy_max))
    } else {
        let s: f64 = a
            .precopy
            .parse()
            .map_err(|_| Error::BadPrecopy(a.precopy.clone()))?;
        let before = tree_cpu_ticks(src.pid());
        std::thread::sleep(Duration::from_secs_f64(s));
        (Duration::ZERO, tree_cpu_ticks(src.pid()) - before, false)
    };

    // The downtime: rings stopped, the state saved, then loaded at the destination.
    let queues = c.request_queue_count() as u16 + 1;
    let t = Instant::now();
    for index in 0..queues {
        c.device()
            .stop_queue(index)
            .map_err(Error::from)
            .map_err(src.failed())?;
    }
    let stop = t.elapsed();
    let ticks = tree_cpu_ticks(src.pid());
    let state = c
        .device()
        .save_state()
        .map_err(Error::step("save"))
        .map_err(src.failed())?;
    let save = c.device().last_transfer().expect("a save was made");
    let save_cpu = tree_cpu_ticks(src.pid()) - ticks;

    let mut cfg = device_config(&dst_sock);
    cfg.load_state = Some(state);
    let ticks = tree_cpu_ticks(dst.pid());
    let mut g = FuseClient::connect(&cfg)
        .map_err(Error::step("load"))
        .map_err(dst.failed())?;
    let load = g.device().last_transfer().expect("a load was made");
    let load_cpu = tree_cpu_ticks(dst.pid()) - ticks;
    let state_bytes = cfg.load_state.take().map_or(0, |s| s.len());

    // The destination serves the guest's node ids.
    for &(i, nodeid, ino) in &samples {
        let got = g
            .getattr(nodeid)
            .map_err(Error::step(format!(
                "GETATTR of file {i} (node {nodeid}) after the load"
            )))
            .map_err(dst.failed())?
            .attr
            .ino;
        if got != ino {
            return Err(Error::NodeInode {
                file: i,
                node: nodeid,
                got,
                when: "after the load".into(),
                before: ino,
            });
        }
    }
    let dst_rss_kb = rss_anon_kb(dst.pid());
    let dst_fds = fd_count(dst.pid());

    let result = json!({
        "daemon": a.name,
        "command": a.daemon,
        "nodes": a.nodes,
        "held_nodes": held,
        "rep": a.rep,
        "precopy": a.precopy,
        "lookup_s": lookup_s,
        "src_rss_anon_kb": src_rss_kb,
        "src_fds": src_fds,
        "log_base_ms": ms(log_base),
        "log_all_ms": ms(log_all),
        "prep_ms": ms(prep),
        "prep_cpu_ms": cpu_ms(prep_ticks),
        "prep_idle": prep_idle,
        "stop_ms": ms(stop),
        "save": times_json(&save),
        "save_cpu_ms": cpu_ms(save_cpu),
        "load": times_json(&load),
        "load_cpu_ms": cpu_ms(load_cpu),
        "state_bytes": state_bytes,
        "save_ms": ms(save.total()),
        "load_ms": ms(load.total()),
        "sum_ms": ms(save.total() + load.total()),
        "dst_rss_anon_kb": dst_rss_kb,
        "dst_fds": dst_fds,
        "verified_nodes": samples.len(),
    });
    eprintln!(
        "statebench: {tag}: {held} nodes held (lookups {lookup_s:.1} s); LOG_ALL {:.2} ms, \
         prepared {:.0} ms; stop {:.2} ms; save {:.1} ms, {state_bytes} bytes; load {:.1} ms; \
         sum {:.1} ms; destination RssAnon {dst_rss_kb} kB",
        ms(log_all),
        ms(prep),
        ms(stop),
        ms(save.total()),
        ms(load.total()),
        ms(save.total() + load.total()),
    );
    if let Some(path) = &a.json {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(Error::file(None, path))?;
        writeln!(f, "{result}").map_err(Error::file(Some("appending to"), path))?;
    }

    // The source goes as after a migration, then the destination as its VM ends;
    // each exits by itself when its frontend disconnects.
    drop(c);
    drop(log);
    let src_exit = src.finish(Duration::from_secs(120));
    drop(g);
    let dst_exit = dst.finish(Duration::from_secs(120));
    if src_exit.is_none() || dst_exit.is_none() {
        eprintln!(
            "statebench: {tag}: a daemon did not exit within 120 s of its disconnect; killed"
        );
    }
    Ok(())
}
