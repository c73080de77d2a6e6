#!/usr/bin/env python3
"""The section "Device state: save and load" of docs/BENCHMARKS.md from a
benches/downtime.sh run (its raw.jsonl, env.txt, cmd.txt and quiet.tsv).

    python3 benches/downtime_report.py DIR [DIR...]   # prints the section (downtime.sh's summary.md)

The first DIR is the main run; each further one (another --config) is a subsection.
benches/report.py calls render() for its `--downtime DIR` options (docs/bench-data/sections.txt).
"""

import json
import os
import statistics
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DAEMONS = ("volfsd", "virtiofsd")
GOAL_NODES = 100000
GOAL_MS = 500.0
# Issue 36: at most half of virtiofsd's save + load (issue 24 asked for no slower).
GOAL_RATIO = 0.5


def med(v):
    return statistics.median(v) if v else float("nan")


def cell(v, digits=1):
    """median (min–max)"""
    if not v:
        return "–"
    f = f"{{:,.{digits}f}}"
    if len(v) == 1:
        return f.format(v[0])
    return f"{f.format(med(v))} ({f.format(min(v))}–{f.format(max(v))})"


def rcell(v):
    if not v:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.2f}×"
    return f"{med(v):.2f}× ({min(v):.2f}–{max(v):.2f})"


def load(d):
    runs = []
    with open(os.path.join(d, "raw.jsonl")) as f:
        for line in f:
            if line.strip():
                runs.append(json.loads(line))
    env = {}
    p = os.path.join(d, "env.txt")
    if os.path.exists(p):
        with open(p) as f:
            for line in f:
                k, _, v = line.partition(": ")
                if v:
                    env[k.strip()] = v.strip()
    return runs, env


def by(runs, n, daemon):
    """{rep: run} of one node count and daemon"""
    return {r["rep"]: r for r in runs if r["nodes"] == n and r["daemon"] == daemon}


def vals(runs, n, daemon, key):
    return [r[key] for _, r in sorted(by(runs, n, daemon).items())]


def ratios(runs, n, key):
    a, b = by(runs, n, "volfsd"), by(runs, n, "virtiofsd")
    return [a[k][key] / b[k][key] for k in sorted(set(a) & set(b)) if b[k][key]]


CONFIGS = {
    "handles": "their nodes kept by file handle (`--inode-file-handles prefer`: virtiofsd's "
               "default, and volfsd's option for large trees)",
    "fds": "an `O_PATH` fd kept per node (`--inode-file-handles never`: volfsd's default, "
           "virtiofsd's `--inode-file-handles=never`)",
}


def tables(P, runs):
    nodes = sorted({r["nodes"] for r in runs})
    P("| nodes held | daemon | pairs | state bytes | save ms | load ms | save + load ms | "
      "volfsd/virtiofsd save | load | save + load |")
    P("|---|---|---|---|---|---|---|---|---|---|")
    for n in nodes:
        for dmn in DAEMONS:
            rs = by(runs, n, dmn)
            if not rs:
                continue
            held = next(iter(rs.values()))["held_nodes"]
            rat = ["", "", ""]
            if dmn == "volfsd":
                rat = [rcell(ratios(runs, n, k)) for k in ("save_ms", "load_ms", "sum_ms")]
            P(f"| {held:,} | {dmn} | {len(rs)} | {cell(vals(runs, n, dmn, 'state_bytes'), 0)} | "
              f"{cell(vals(runs, n, dmn, 'save_ms'))} | {cell(vals(runs, n, dmn, 'load_ms'))} | "
              f"**{cell(vals(runs, n, dmn, 'sum_ms'))}** | {rat[0]} | {rat[1]} | {rat[2]} |")
    P("")
    P("Around the downtime, and what each daemon holds (RssAnon of the whole process tree, the "
      "sandbox's supervisor included; CPU is the daemon's utime + stime, in 10 ms ticks):\n")
    P("| nodes held | daemon | LOG_ALL answered ms | prepared after LOG_ALL ms (CPU ms) | rings "
      "stopped ms | save CPU ms | load CPU ms | source RssAnon KiB | destination RssAnon KiB after "
      "the load | LOOKUPs s |")
    P("|---|---|---|---|---|---|---|---|---|---|")
    for n in nodes:
        for dmn in DAEMONS:
            rs = by(runs, n, dmn)
            if not rs:
                continue
            held = next(iter(rs.values()))["held_nodes"]
            v = lambda k: vals(runs, n, dmn, k)  # noqa: E731
            P(f"| {held:,} | {dmn} | {cell(v('log_all_ms'), 2)} | {cell(v('prep_ms'), 0)} "
              f"({cell(v('prep_cpu_ms'), 0)}) | {cell(v('stop_ms'), 2)} | {cell(v('save_cpu_ms'), 0)} | "
              f"{cell(v('load_cpu_ms'), 0)} | {cell(v('src_rss_anon_kb'), 0)} | "
              f"{cell(v('dst_rss_anon_kb'), 0)} | {cell(v('lookup_s'), 1)} |")
    P("")


def command(P, d):
    p = os.path.join(d, "cmd.txt")
    if os.path.exists(p):
        with open(p) as f:
            cmd = f.read().strip()
        P("The command, and each run's daemon lines (`{sock}` and `{share}` filled in per run):\n")
        P("```")
        P(cmd)
        P("```\n")


def render(dirs):
    """(lines, targets, readings) of the section from one or more downtime.sh runs, the
    first the main one; targets as (name, values, met) for report.py's table."""
    if isinstance(dirs, str):
        dirs = [dirs]
    out = []
    P = out.append
    targets, readings = [], []
    for i, d in enumerate(dirs):
        runs, env = load(d)
        rel = os.path.relpath(d, REPO)
        config = env.get("config", "handles")
        what = CONFIGS.get(config, config)
        if i == 0:
            P("## Device state: save and load\n")
            P(f"`benches/downtime.sh`, raw results in [`{rel}`](../{rel}) (one JSON line per run), "
              f"commit `{env.get('commit', '?')[:12]}`, {env.get('date', '?')}. What the device "
              "state adds to a migration's downtime: the guest is stopped while the source daemon "
              "writes its state and the destination daemon loads it. `volfsd-statebench` plays QEMU "
              "against two fresh daemons of one kind on the same tree (N empty files in directories "
              "of 1,000; the guest looks up every directory and file once, so it holds N + N/1,000 "
              "nodes and the root) with QEMU's message sequence: SET_LOG_BASE and SET_FEATURES with "
              "`VHOST_F_LOG_ALL` (the migration starts; virtiofsd begins collecting its nodes' paths "
              "here, on a thread of its own), a precopy that lasts until the source has been idle "
              "(no CPU used, no thread running or waiting for the disk) for 500 ms (as when "
              "copying the guest's RAM outlasts that preparation), every ring stopped, then "
              "**save**: SET_DEVICE_STATE_FD SAVE, the pipe read to its end, "
              "CHECK_DEVICE_STATE; and **load** into the destination, started with the source and "
              "connected now, before its memory and rings as a destination QEMU does: "
              "SET_DEVICE_STATE_FD LOAD, every byte written, CHECK_DEVICE_STATE. A GETATTR of three "
              "of the guest's node ids at the destination must then answer their files' inodes. The "
              "daemons alternate run by run (volfsd, virtiofsd, volfsd, ...); a ratio is taken per "
              "pair of one repetition. "
              + (f"Machine: {env.get('cores', '?')} cores, {env.get('cpu', '?')}, tree on "
                 f"{env.get('tree', '?')}; " if env else "")
              + (f"quiet: {env['quiet']}." if "quiet" in env else "") + "\n")
            P("Both sides run their defaults (namespace sandbox, seccomp `kill`, log level info) "
              "with `--migration-mode find-paths`, no guest cache (volfsd `--cache none`, virtiofsd "
              f"`--cache never`) and {what}. Both save each node's path; volfsd reads it from "
              "`/proc/self/fd` when the state is saved, virtiofsd when the migration starts (and "
              "checks it again then), so its save only writes what it collected. Figures in ms, "
              "median of the repetitions with min–max; the ratio volfsd/virtiofsd is the median of "
              "the per-pair ratios (below 1.00× volfsd is faster).\n")
            if config == "handles":
                P("File handles, not fds: here the hard RLIMIT_NOFILE is "
                  f"{env.get('rlimit_nofile_hard', '?')} and cannot be raised without "
                  "CAP_SYS_RESOURCE, so neither daemon could hold 100,000 nodes as `O_PATH` fds "
                  "(each would answer ENFILE, or EMFILE, past about 19,500); the fd configuration "
                  "follows below at the sizes that fit.\n")
        else:
            precopy = env.get("precopy", "idle")
            title = what if config != "handles" or precopy == "idle" else "file handles"
            if precopy != "idle":
                title += (", and the save at once after LOG_ALL (no precopy: a daemon's "
                          "preparation falls into the downtime)" if float(precopy) == 0 else
                          f", and the save {precopy} s after LOG_ALL")
            P(f"### With {title}\n")
            P(f"`benches/downtime.sh --config {config} --precopy {precopy}`, raw results in [`{rel}`](../{rel}), commit "
              f"`{env.get('commit', '?')[:12]}`, {env.get('date', '?')}; otherwise as above. "
              + (f"Quiet: {env['quiet']}." if "quiet" in env else "") + "\n")
        tables(P, runs)
        if i == 0:
            goal(P, runs, targets)
            P("Where the time goes (strace of both daemons, per node): [PROFILING.md]"
              "(PROFILING.md#the-device-state-2026-12-03-daemon-at-commit-f6295a0).\n")
        label = config if env.get("precopy", "idle") == "idle" else \
            f"{config}, the save {env['precopy']} s after LOG_ALL"
        nodes = sorted({r["nodes"] for r in runs})
        for n in nodes:
            rs = ratios(runs, n, "sum_ms")
            a, b = vals(runs, n, "volfsd", "sum_ms"), vals(runs, n, "virtiofsd", "sum_ms")
            if a and b:
                readings.append(
                    f"Device state, {label}, {n:,} files held: save + load {med(a):,.0f} ms for "
                    f"volfsd, {med(b):,.0f} ms for virtiofsd ({rcell(rs)} per pair); state "
                    f"{med(vals(runs, n, 'volfsd', 'state_bytes')):,.0f} against "
                    f"{med(vals(runs, n, 'virtiofsd', 'state_bytes')):,.0f} bytes.")
        command(P, d)
    return out, targets, readings


def goal(P, runs, targets):
    """The goal of issue 24, judged on the medians."""
    sums = vals(runs, GOAL_NODES, "volfsd", "sum_ms")
    rs = ratios(runs, GOAL_NODES, "sum_ms")
    if not sums:
        return
    within = med(sums) <= GOAL_MS
    not_slower = bool(rs) and med(rs) <= GOAL_RATIO
    P(f"**Goal (issue 36): {GOAL_NODES:,} nodes saved and loaded in at most {GOAL_MS / 1000:g} s, "
      f"and in at most {GOAL_RATIO}× virtiofsd's time: "
      f"{'met' if within and not_slower else 'not met'}.** volfsd's save + load at "
      f"{GOAL_NODES:,} nodes: {cell(sums)} ms ({sum(1 for s in sums if s <= GOAL_MS)} of "
      f"{len(sums)} runs within {GOAL_MS:.0f} ms: {'met' if within else 'not met'}); against "
      f"virtiofsd {rcell(rs)} ({sum(1 for r in rs if r <= GOAL_RATIO)} of {len(rs)} pairs at "
      f"most {GOAL_RATIO}×: {'met' if not_slower else 'not met'}).\n")
    targets.append((f"device state at {GOAL_NODES:,} nodes: (save + load) / {GOAL_MS:.0f} ms ≤ 1.00×",
                    [s / GOAL_MS for s in sums], within))
    targets.append((f"device state at {GOAL_NODES:,} nodes: save + load volfsd ≤ {GOAL_RATIO}× virtiofsd",
                    rs, not_slower))


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: downtime_report.py DIR [DIR...]")
    lines, _, _ = render([d.rstrip("/") for d in sys.argv[1:]])
    print("\n".join(lines))


if __name__ == "__main__":
    main()
