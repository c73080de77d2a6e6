#!/usr/bin/env python3
"""The workloads bench (benches/workloads.sh): one run's results as JSON, and a
kept data directory as a markdown section.

Usage: workloads_report.py DATA_DIR          (docs/bench-data/<date>-<commit>-workloads)
       workloads_report.py --collect LOG_DIR --pair I --side S --daemon BIN --status RC

Everything printed is computed from DATA_DIR (runs/*.json, env.txt, quiet.tsv,
inputs.txt): re-running it on the same data gives the same section.

How the figures are made:
- guest wall: the guest's own clock (CLOCK_MONOTONIC) around the workload, from
  the host hook's start ack to the workload's end (VMTEST INFO workload NAME
  wall S);
- daemon CPU: utime + stime of the daemon's whole process tree (the launched
  process and its sandboxed child, all threads), sampled by the host hook
  (vm-tests/suites/workloads.hook.sh) at the workload's start and end, in clock
  ticks (10 ms); QEMU CPU likewise for the QEMU process (its TCG vCPU threads);
- a ratio is volfsd / virtiofsd within one pair (the two runs of a pair follow
  each other, in an order alternated pair by pair); its median and min–max over
  the pairs are shown; other figures are the median over the pairs with min–max;
- TCG's share: guest wall minus daemon CPU (time the guest spent anywhere but in
  the daemon: its emulated CPU, mostly) and daemon CPU as a percentage of guest
  wall.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

WORKLOADS = ["untar", "find", "git-commit", "git-status", "npm", "sqlite", "rm"]
METADATA_HEAVY = ["untar", "find", "git-status", "npm", "rm"]  # the CPU target's set
CPU_TARGET = 0.6
SIDES = ("volfsd", "virtiofsd")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- one run
def collect(log_dir, pair, side, daemon, status):
    """One run-vm.sh log directory as the JSON the bench keeps."""
    serial = open(os.path.join(log_dir, "serial.log"), errors="replace").read().replace("\r", "")
    walls = {m.group(1): float(m.group(2))
             for m in re.finditer(r"^VMTEST INFO workload (\S+) wall ([0-9.]+)s$", serial, re.M)}
    irqs = {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^VMTEST INFO workload (\S+) interrupts (\d+) (\d+)$", serial, re.M)}
    samples = {}
    try:
        with open(os.path.join(log_dir, "workloads-samples.txt")) as f:
            for line in f:
                what, name, t, d, q, tck = line.split()
                samples.setdefault(name, {})[what] = (float(t), int(d), int(q), int(tck))
    except OSError:
        pass
    workloads = {}
    for name in WORKLOADS:
        s = samples.get(name, {})
        w = {"wall_s": walls.get(name)}
        if name in irqs:  # completions on the request queue and on hiprio: ~ requests
            w.update(request_irqs=irqs[name][0], hiprio_irqs=irqs[name][1])
        if "start" in s and "end" in s:
            (t0, d0, q0, tck), (t1, d1, q1, _) = s["start"], s["end"]
            w.update(daemon_cpu_s=(d1 - d0) / tck, qemu_cpu_s=(q1 - q0) / tck, host_s=round(t1 - t0, 2))
        workloads[name] = w
    checks = re.findall(r"^VMTEST (PASS|FAIL) (\S+?)(?::|$)", serial, re.M)
    params = {}
    try:
        with open(os.path.join(log_dir, "workloads-inputs.txt")) as f:
            params = dict(l.strip().split("=", 1) for l in f if "=" in l)
    except OSError:
        pass
    return {
        "pair": pair, "side": side, "daemon": daemon, "run_vm_status": status,
        "workloads": workloads,
        "passed": [n for r, n in checks if r == "PASS"],
        "failed": [n for r, n in checks if r == "FAIL"],
        "params": params,
    }


# ---------------------------------------------------------------- the section
def med(v):
    return statistics.median(v) if v else float("nan")


def cell(v, digits=1):
    if not v:
        return "–"
    if len(v) == 1:
        return f"{v[0]:,.{digits}f}"
    return f"{med(v):,.{digits}f} ({min(v):,.{digits}f}–{max(v):,.{digits}f})"


def rcell(v):
    if not v:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.2f}×"
    return f"{med(v):.2f}× ({min(v):.2f}–{max(v):.2f})"


def load_runs(d):
    runs = {}
    for p in sorted(glob.glob(os.path.join(d, "runs", "pair*-*.json"))):
        with open(p) as f:
            r = json.load(f)
        runs[(r["pair"], r["side"])] = r
    return runs


def read_kv(path):
    try:
        with open(path) as f:
            return dict(l.rstrip("\n").split(": ", 1) for l in f if ": " in l)
    except OSError:
        return {}


def good(r, name):
    """The run's figures for a workload, if the run's check of it passed."""
    w = r["workloads"].get(name, {})
    if name in r["failed"] or w.get("wall_s") is None or w.get("daemon_cpu_s") is None:
        return None
    return w


def render(d, with_targets=True):
    """The section's lines, and the targets as (name, per-pair ratios, met).
    with_targets=False leaves the targets table out (report.py shows them in its
    own Targets table)."""
    runs = load_runs(d)
    env = read_kv(os.path.join(d, "env.txt"))
    inputs = {}
    try:
        with open(os.path.join(d, "inputs.txt")) as f:
            inputs = dict(l.strip().split("=", 1) for l in f if "=" in l)
    except OSError:
        pass
    pairs = sorted({p for p, _ in runs if (p, "volfsd") in runs and (p, "virtiofsd") in runs})
    rel = os.path.relpath(d, REPO)
    L = []
    L.append("## Workloads developers run, in a guest: volfsd against virtiofsd\n")
    L.append(f"`{env.get('command', 'benches/workloads.sh')}`, raw results in [`{rel}`](../{rel}), "
             f"commit `{env.get('commit', '?')[:12]}`, {env.get('date', '?')}; {len(pairs)} alternated "
             f"pairs (pair i runs volfsd first when i is odd). {env.get('guest', '')}, "
             f"{env.get('accel', '')}; {env.get('qemu', '')}; guest kernel {env.get('guest_kernel', '?')}; "
             f"{env.get('guest_tools', '')}. {env.get('quiet', '')}.\n")
    L.append("The vm-tests `workloads` suite, in order, on the share (a directory on the host's disk, "
             "emptied before every run): **untar** (GNU tar extracts the source tree from a read-only "
             "virtio-blk disk), **find** (busybox `find` over the tree, then `find -exec stat` of every "
             "entry), **git-commit** (`git init`, `git add -A -f`, `git commit`), **git-status** "
             "(`git status --porcelain` on the clean tree), **npm** (an npm-style storm: each package of "
             "a real dependency tree extracted into its nested `node_modules` place, then the `stat` and "
             "read calls of Node's CommonJS resolution of every dependency of every package), **sqlite** "
             "(transactions of inserts, `sqlite3`, default rollback journal: `journal_mode=delete`, "
             "`synchronous=full`) and **rm** (`rm -rf` of the tree with its `.git`). Each is checked after "
             "it ran (counts, byte sums, `git status` empty, the storm's files' sha256, row counts, the "
             "tree gone); a workload whose check failed is left out of the figures.\n")
    if inputs:
        L.append(f"Inputs: `{inputs.get('TREE_PACKAGE')}` {inputs.get('TREE_VERSION')} (Debian), its first "
                 f"{int(inputs.get('TREE_FILES', 0)):,} regular files of at most 16 KiB in the tarball's order "
                 f"({int(inputs.get('TREE_DIRS', 0)):,} directories, {inputs.get('TREE_SYMLINKS')} symlinks, "
                 f"{int(inputs.get('TREE_BYTES', 0)) / 1e6:.0f} MB); the storm: {inputs.get('STORM_PACKAGES')} "
                 f"packages of `vm-tests/workloads/package-lock.json` (eslint 8.57.1, express 4.21.2, jest "
                 f"29.7.0, webpack 5.97.1 and their dependencies), {int(inputs.get('STORM_FILES', 0)):,} files, "
                 f"then {int(inputs.get('STORM_PROBE_OPS', 0)):,} resolution calls "
                 f"({int(inputs.get('STORM_PROBE_ENOENT', 0)):,} of them ENOENT); SQLite: "
                 f"{inputs.get('SQL_TX')} transactions of {inputs.get('SQL_ROWS')} inserts.\n")
    L.append("What differs between the two sides: only the daemon, each with its defaults (both in their "
             "namespace sandbox with seccomp; volfsd `--cache none`, virtiofsd `--cache=never`: no caching "
             "in the guest), one request queue each (virtiofsd serves only one). Two of those defaults "
             "differ in what reaches the daemon: volfsd offers READDIRPLUS under `--cache none` too, "
             "while virtiofsd turns it off with `--cache=never` (a listing then costs volfsd a lookup "
             "per entry that the guest cannot keep, and a FORGET later); and volfsd serves POSIX and "
             "flock locks itself, visible on the host, so SQLite's `fcntl` locks become requests, "
             "while virtiofsd 1.14 never offers them and the guest kernel keeps locks to itself. "
             "Daemon CPU is the "
             "whole process tree's utime + stime (10 ms ticks) between the hook's samples at the "
             "workload's start and end. Under TCG the guest's own CPU dominates the wall time: the "
             "\"TCG and guest\" column is guest wall minus daemon CPU, and \"daemon share\" is daemon CPU "
             "over guest wall.\n")
    if not pairs:
        L.append("(no complete pair: nothing to show)\n")
        return L, []
    L.append("| workload | guest wall s, volfsd | guest wall s, virtiofsd | wall ratio | daemon CPU s, volfsd "
             "| daemon CPU s, virtiofsd | CPU ratio | TCG and guest s, volfsd / virtiofsd "
             "| daemon share, volfsd / virtiofsd |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    targets = []
    for name in WORKLOADS:
        wall = {s: [] for s in SIDES}
        cpu = {s: [] for s in SIDES}
        rest = {s: [] for s in SIDES}
        share = {s: [] for s in SIDES}
        wr, cr = [], []
        for p in pairs:
            a, b = good(runs[(p, "volfsd")], name), good(runs[(p, "virtiofsd")], name)
            for s, w in (("volfsd", a), ("virtiofsd", b)):
                if w:
                    wall[s].append(w["wall_s"])
                    cpu[s].append(w["daemon_cpu_s"])
                    rest[s].append(w["wall_s"] - w["daemon_cpu_s"])
                    if w["wall_s"] > 0:
                        share[s].append(100 * w["daemon_cpu_s"] / w["wall_s"])
            if a and b:
                if b["wall_s"] > 0:
                    wr.append(a["wall_s"] / b["wall_s"])
                if b["daemon_cpu_s"] > 0:
                    cr.append(a["daemon_cpu_s"] / b["daemon_cpu_s"])
        L.append(f"| {name} | {cell(wall['volfsd'])} | {cell(wall['virtiofsd'])} | {rcell(wr)} "
                 f"| {cell(cpu['volfsd'], 2)} | {cell(cpu['virtiofsd'], 2)} | {rcell(cr)} "
                 f"| {cell(rest['volfsd'])} / {cell(rest['virtiofsd'])} "
                 f"| {cell(share['volfsd'], 0)}% / {cell(share['virtiofsd'], 0)}% |")
        if wr:
            targets.append((f"{name}: guest wall time, volfsd / virtiofsd ≤ 1.0", wr, med(wr) <= 1.0))
        if name in METADATA_HEAVY and cr:
            targets.append((f"{name}: daemon CPU, volfsd / virtiofsd ≤ {CPU_TARGET}", cr, med(cr) <= CPU_TARGET))
    L.append("")
    per_request_table(L, runs, pairs)
    failed = [(p, s, r["failed"]) for (p, s), r in sorted(runs.items()) if r["failed"]]
    if failed:
        L.append("Failed checks (those workloads are left out of that run's figures): "
                 + "; ".join(f"pair {p} {s}: {', '.join(f)}" for p, s, f in failed) + ".\n")
    if with_targets:
        L.append("| target | measured (median, min–max) | met |")
        L.append("|---|---|---|")
        for t, v, ok in targets:
            L.append(f"| {t} | {rcell(v)} | {'yes' if ok else '**no**'} |")
        L.append("")
    return L, targets


def per_request_table(L, runs, pairs):
    """Requests per workload (the guest's interrupt counts on the request queue:
    with one request in flight each gets its own) and the daemon's CPU per
    request; only for runs whose guest counted them."""
    if not any("request_irqs" in w for r in runs.values() for w in r["workloads"].values()):
        return
    L.append("Requests per workload, as the guest counts them (completion interrupts of the request "
             "queue: with one request in flight at a time nearly every request raises one; FORGETs on "
             "the hiprio queue not included), and the daemon's CPU per request:\n")
    L.append("| workload | requests, volfsd | requests, virtiofsd | daemon CPU µs/request, volfsd "
             "| daemon CPU µs/request, virtiofsd | ratio |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for name in WORKLOADS:
        req = {s: [] for s in SIDES}
        us = {s: [] for s in SIDES}
        ratio = []
        for p in pairs:
            got = {}
            for s in SIDES:
                w = good(runs[(p, s)], name)
                if w and w.get("request_irqs"):
                    req[s].append(w["request_irqs"])
                    got[s] = 1e6 * w["daemon_cpu_s"] / w["request_irqs"]
                    us[s].append(got[s])
            if len(got) == 2 and got["virtiofsd"] > 0:
                ratio.append(got["volfsd"] / got["virtiofsd"])
        L.append(f"| {name} | {cell(req['volfsd'], 0)} | {cell(req['virtiofsd'], 0)} | {cell(us['volfsd'], 0)} "
                 f"| {cell(us['virtiofsd'], 0)} | {rcell(ratio)} |")
    L.append("")


def section(P, d, targets, readings):
    """benches/report.py --workloads DIR: the section, its targets and a reading."""
    lines, t = render(d, with_targets=False)
    for line in lines:
        P(line)
    targets.extend(t)
    met = [x for x in t if x[2]]
    if t:
        readings.append(f"Guest workloads (untar, find, git, npm-style, SQLite, rm): {len(met)} of {len(t)} "
                        "targets met (workloads section).")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="?")
    ap.add_argument("--collect", metavar="LOG_DIR")
    ap.add_argument("--pair", type=int)
    ap.add_argument("--side", choices=SIDES)
    ap.add_argument("--daemon", default="")
    ap.add_argument("--status", type=int, default=0)
    args = ap.parse_args()
    if args.collect:
        if args.pair is None or not args.side:
            ap.error("--collect needs --pair and --side")
        json.dump(collect(args.collect, args.pair, args.side, args.daemon, args.status), sys.stdout, indent=1)
        print()
        return
    if not args.data:
        ap.error("DATA_DIR is required")
    lines, _ = render(args.data.rstrip("/"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
