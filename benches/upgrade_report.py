#!/usr/bin/env python3
"""The section "Upgrade: the guest's pause" of docs/BENCHMARKS.md from a
benches/upgrade-pause.sh run (its raw.jsonl, env.txt, cmd.txt and quiet.tsv).

    python3 benches/upgrade_report.py DIR [DIR...]   # prints the section (upgrade-pause.sh's summary.md)

The first DIR is the main run; each further one (another --config) is a subsection.
benches/report.py calls render() for its `--upgrade-pause DIR` options
(docs/bench-data/sections.txt).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from downtime_report import load, med  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GOAL_NODES = 100000
GOAL_P50_MS = 20.0
GOAL_MAX_MS = 100.0
CONFIGS = {
    "handles": "nodes kept by file handle (`--inode-file-handles prefer`)",
    "fds": "an `O_PATH` fd per node (`--inode-file-handles never`, volfsd's default)",
}


def p50(v):
    """The median as the issue counts it: the middle value (the lower of two)."""
    s = sorted(v)
    return s[(len(s) - 1) // 2] if s else float("nan")


def table(P, runs):
    probe = any(r.get("probe") for r in runs)
    head = ("| held nodes | upgrades | pause p50 (ms) | pause max (ms) | pause min (ms) | "
            "whole upgrade p50 (ms) |")
    P(head + (" slowest GETATTR p50 (ms) | slowest GETATTR max (ms) |" if probe else ""))
    P("|---" * (6 + 2 * probe) + "|")
    for n in sorted({r["nodes"] for r in runs}):
        rs = [r for r in runs if r["nodes"] == n]
        pauses = [r["pause_ms"] for r in rs]
        whole = [r["upgrade_ms"] for r in rs]
        row = (f"| {rs[0]['held_nodes']:,} | {len(rs)} | {p50(pauses):,.0f} | {max(pauses):,.0f} | "
               f"{min(pauses):,.0f} | {med(whole):,.0f} |")
        if probe:
            slow = [r["slowest_getattr_ms"] for r in rs]
            row += f" {p50(slow):,.1f} | {max(slow):,.1f} |"
        P(row)
    P("")


def goal(P, runs, targets, readings, label):
    pauses = [r["pause_ms"] for r in runs if r["nodes"] == GOAL_NODES]
    if not pauses:
        return
    a, b = p50(pauses), max(pauses)
    ok_a, ok_b = a <= GOAL_P50_MS, b <= GOAL_MAX_MS
    P(f"**Goal (issue 26): at {GOAL_NODES:,} held nodes, pause p50 ≤ {GOAL_P50_MS:.0f} ms and "
      f"max ≤ {GOAL_MAX_MS:.0f} ms: {'met' if ok_a and ok_b else 'not met'}** (p50 {a:,.0f} ms, "
      f"max {b:,.0f} ms over {len(pauses)} upgrades). An upgrade moves the session as a "
      "same-host migration's device state (docs/UPGRADE.md), after a pre-copy: the old "
      "process previews the held nodes while it serves and the new one opens and registers "
      "them; inside the pause the old process names each previewed node still held by id "
      "and lookups and the new one gives each its lookups, with no system call per node "
      "(what remains grows with the nodes held as memory work; docs/UPGRADE.md, what is "
      "left).\n")
    targets.append((f"upgrade pause at {GOAL_NODES:,} nodes: p50 / {GOAL_P50_MS:.0f} ms ≤ 1.00×",
                    [a / GOAL_P50_MS], ok_a))
    targets.append((f"upgrade pause at {GOAL_NODES:,} nodes: max / {GOAL_MAX_MS:.0f} ms ≤ 1.00×",
                    [b / GOAL_MAX_MS], ok_b))


def render(dirs):
    """(lines, targets, readings) of the section from one or more upgrade-pause.sh runs,
    the first the main one; targets as (name, values, met) for report.py's table."""
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
        quiet = f" Quiet: {env['quiet']}." if "quiet" in env else ""
        if i == 0:
            P("## Upgrade: the guest's pause\n")
            P(f"`benches/upgrade-pause.sh`, raw results in [`{rel}`](../{rel}) (one JSON line per "
              f"upgrade), commit `{env.get('commit', '?')[:12]}`, {env.get('date', '?')}. One "
              "volfsd with `--upgradable` (a keeper holds the frontend's connection, "
              "[UPGRADE.md](UPGRADE.md)); `volfsd-statebench upgrade` plays the guest through the "
              "harness's frontend: it looks up every directory and file of a tree of N empty files "
              "in directories of 1,000 (it then holds N + N/1,000 nodes and the root), then runs "
              "upgrades it by SIGHUP again and again (the binary upgraded to itself: the "
              "session moves all the same). **Pause**: the keeper's measure (its log line, what "
              "`volfsd ctl upgrade` reports), whole ms, of the "
              "guest's wait (the old process's rings stopped, its state saved, the new process "
              "set up and loaded, its rings started; the new process's start and sandbox come "
              "before and are not in it). **Whole upgrade**: from the SIGHUP to the keeper's log "
              "line (the new process's start included). The guest is idle during each upgrade, "
              "and the upgrades are 1 s apart (`--probe` has the guest send GETATTRs one after "
              "another meanwhile: docs/UPGRADE.md has such a run, whose slowest GETATTRs match "
              "the keeper's pauses). "
              "After each upgrade the new process answered three of the guest's node ids with "
              f"their inodes. Daemon: its defaults (namespace sandbox, seccomp `kill`), `--cache "
              f"none`, {what}. Machine: {env.get('cores', '?')} cores, {env.get('cpu', '?')}." + quiet
              + " The pre-copy (the preview and the preload, before the pause) is in the whole "
              "upgrade, not in the pause.\n")
        else:
            P(f"### With {what}\n")
            P(f"`benches/upgrade-pause.sh --config {config}`, raw results in [`{rel}`](../{rel}), "
              f"commit `{env.get('commit', '?')[:12]}`, {env.get('date', '?')}; otherwise as "
              "above." + quiet + "\n")
        table(P, runs)
        if i == 0:
            goal(P, runs, targets, readings, config)
        for n in sorted({r["nodes"] for r in runs}):
            pauses = [r["pause_ms"] for r in runs if r["nodes"] == n]
            readings.append(f"Upgrade, {config}, {n:,} files held: the guest's pause p50 "
                            f"{p50(pauses):,.0f} ms, max {max(pauses):,.0f} ms over "
                            f"{len(pauses)} upgrades.")
        p = os.path.join(d, "cmd.txt")
        if os.path.exists(p):
            with open(p) as f:
                P("The command:\n")
                P("```")
                P(f.read().strip())
                P("```\n")
    return out, targets, readings


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: upgrade_report.py DIR [DIR...]")
    lines, _, _ = render([d.rstrip("/") for d in sys.argv[1:]])
    print("\n".join(lines))


if __name__ == "__main__":
    main()
