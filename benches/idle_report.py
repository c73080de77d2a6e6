#!/usr/bin/env python3
"""The idle-daemons section of docs/BENCHMARKS.md, from a benches/idle.py run.

Usage: idle_report.py DIR   (prints the section; benches/report.py --idle DIR
                             calls render() for the page)
"""
import json
import os
import statistics
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# The density target: RssAnon of idle volfsd against virtiofsd, sandboxes on.
DENSITY_TARGET = 0.6


def med(v):
    return statistics.median(v) if v else float("nan")


def span(v, digits):
    """median (min–max) of one figure over the rounds"""
    if len(v) == 1:
        return f"{v[0]:,.{digits}f}"
    return f"{med(v):,.{digits}f} ({min(v):,.{digits}f}–{max(v):,.{digits}f})"


def load(d):
    with open(os.path.join(d, "idle.json")) as f:
        doc = json.load(f)
    env = {}
    with open(os.path.join(d, "env.txt")) as f:
        for line in f:
            k, _, v = line.partition(": ")
            env[k.strip()] = v.strip()
    kinds = {}
    for r in doc["runs"]:
        kinds.setdefault(r["kind"], []).append(r)
    return doc, env, kinds


def figures(doc, runs):
    """Per kind, one value per round of each figure shown."""
    tck = doc["clk_tck"]
    per = lambda r: r["daemons"]  # noqa: E731
    return {
        "cpu_s": [sum(r["cpu_ticks"]) / tck for r in runs],
        "oncpu_ms": [sum(r["sched_ns"]) / 1e6 for r in runs],
        "oncpu_us_per_daemon_s": [sum(r["sched_ns"]) / 1e3 / per(r) / r["idle_s"] for r in runs],
        "switches_per_daemon_s": [sum(r["switches"]) / per(r) / r["idle_s"] for r in runs],
        "rss_kib": [sum(r["rss_anon_kib"]) / per(r) for r in runs],
        "rss_total_mib": [sum(r["rss_anon_kib"]) / 1024 for r in runs],
        "threads": [r["threads"] / per(r) for r in runs],
        "processes": [r["processes"] / per(r) for r in runs],
        "frontend_cpu_s": [r["frontend_cpu_ticks"] / tck for r in runs],
    }


def render(d):
    """(lines, targets, readings) of the section."""
    doc, env, kinds = load(d)
    rel = os.path.relpath(d, REPO)
    names = list(kinds)
    fig = {k: figures(doc, kinds[k]) for k in names}
    n, idle_s = doc["daemons"], doc["idle_s"]
    L = []
    L.append(f"## Idle daemons: CPU over {idle_s:.0f} s and memory, {n} of each\n")
    L.append(
        f"`benches/idle.py`, raw results in [`{rel}`](../{rel}), {env.get('date', '?')}, daemons of "
        f"commit `{env.get('volfsd_rev', env.get('commit', '?'))}`. For each kind in turn, {n} daemons "
        "side by side (`benches/scale.py`'s density start), each with its own load generator that "
        f"connects, sends {doc['ops_per_frontend']:,} GETATTRs at QD 1 (so a polling daemon has polled) "
        f"and then keeps its session open, idle (`{doc.get('frontend', '?')}`). After {doc['settle_s']:.0f} s, "
        f"the CPU of every daemon's process tree is read, and again {idle_s:.0f} s later: utime + "
        f"stime (/proc/PID/stat, in ticks of {1000 / doc['clk_tck']:.0f} ms per process, exited "
        "threads included), and, finer, the on-CPU time and context switches of every live thread "
        "(/proc/PID/task/*/schedstat and status). Sums over the daemons. The sandbox is on in every "
        "kind (each daemon's defaults). Not a quiet machine unless the load column says so: another "
        "session's QEMU guests may run beside it.\n")
    if env.get("command"):
        L.append(f"Command (paths as on the measuring machine): `{env['command']}`\n")
    L.append("| | " + " | ".join(names) + " |")
    L.append("|---|" + "---|" * len(names))
    L.append("| options beyond the socket and share | " + " | ".join(f"`{options(kinds[k][0]['cmd'])}`"
                                                                    for k in names) + " |")
    rows = [
        (f"CPU over {idle_s:.0f} s, utime + stime, all {n} (s)", "cpu_s", 2),
        (f"on-CPU time over {idle_s:.0f} s, all {n} (ms)", "oncpu_ms", 1),
        ("on-CPU per daemon (µs per second)", "oncpu_us_per_daemon_s", 1),
        ("context switches per daemon per second", "switches_per_daemon_s", 2),
        ("RssAnon per daemon (KiB)", "rss_kib", 0),
        (f"RssAnon, all {n} (MiB)", "rss_total_mib", 1),
        ("threads per daemon", "threads", 0),
        ("processes per daemon", "processes", 0),
        (f"the load generators' CPU over {idle_s:.0f} s, all {n} (s)", "frontend_cpu_s", 2),
    ]
    for label, key, digits in rows:
        L.append(f"| {label} | " + " | ".join(span(fig[k][key], digits) for k in names) + " |")
    L.append("| threads that woke (context switches, all daemons) | "
             + " | ".join(", ".join(f"{t} {c:,}" for t, c in merged_threads(kinds[k]).items()) or "none"
                          for k in names) + " |")
    L.append("| load average (1 min) before → after, this fleet's own start included | " + " | ".join(
        "; ".join(f"{r['load_before'][0]:.2f} → {r['load_after'][0]:.2f}" for r in kinds[k]) for k in names) + " |")
    L.append("| other QEMU, builds or daemons | " + " | ".join(
        "; ".join(sorted({c or "none" for r in kinds[k] for c in (r["company_before"], r["company_after"])}))
        for k in names) + " |")
    L.append("")
    targets, readings = [], []
    base = "virtiofsd" if "virtiofsd" in fig else None
    if base:
        L.append("Against virtiofsd (its defaults, sandbox on), RssAnon per daemon: " + "; ".join(
            f"{k} {med(fig[k]['rss_kib']) / med(fig[base]['rss_kib']):.2f}×" for k in names if k != base) + ".\n")
        if "volfsd" in fig:
            r = med(fig["volfsd"]["rss_kib"]) / med(fig[base]["rss_kib"])
            targets.append((f"{n} idle daemons, sandbox on (idle run): RssAnon ≤ {DENSITY_TARGET}× virtiofsd",
                            [r], r <= DENSITY_TARGET))
            readings.append(
                f"Density, idle run: {n} idle volfsd after serving requests take "
                f"{med(fig['volfsd']['rss_kib']):.0f} KiB of RssAnon each against virtiofsd's "
                f"{med(fig[base]['rss_kib']):.0f} KiB ({r:.2f}×; the target is ≤ {DENSITY_TARGET}×).")
    if "volfsd" in fig:
        poll0 = next((k for k in names if "poll0" in k or "poll-us 0" in kinds[k][0]["cmd"]), None)
        woke = merged_threads(kinds["volfsd"])
        text = (f"Idle CPU: {n} volfsd with their defaults (polling on) used "
                f"{med(fig['volfsd']['cpu_s']):.2f} s of utime + stime in {idle_s:.0f} s idle, "
                f"{med(fig['volfsd']['oncpu_ms']):.1f} ms on-CPU "
                f"({med(fig['volfsd']['oncpu_us_per_daemon_s']):.1f} µs per daemon per second)")
        if poll0:
            text += (f"; with `--poll-us 0` {med(fig[poll0]['cpu_s']):.2f} s and "
                     f"{med(fig[poll0]['oncpu_ms']):.1f} ms")
        if base:
            text += f"; virtiofsd {med(fig[base]['cpu_s']):.2f} s and {med(fig[base]['oncpu_ms']):.1f} ms"
        text += "."
        if woke:
            text += (" What woke in volfsd: " + ", ".join(f"{t} {c / n / idle_s:.2f} times per daemon "
                                                          "per second" for t, c in woke.items()) + ".")
        readings.append(text)
    return L, targets, readings


def options(cmd):
    """A daemon's command line without its binary, socket and shared directory."""
    words = cmd.split()[1:]
    out = []
    for i, w in enumerate(words):
        if "{sock}" in w or "{share}" in w:
            continue
        if i + 1 < len(words) and words[i + 1] in ("{sock}", "{share}"):
            continue
        out.append(w)
    return " ".join(out)


def merged_threads(runs):
    out = {}
    for r in runs:
        for t, c in r.get("switches_by_thread", {}).items():
            out[t] = out.get(t, 0) + c
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    lines, targets, readings = render(sys.argv[1].rstrip("/"))
    print("\n".join(lines))
    for name, v, ok in targets:
        print(f"- target: {name}: {v[0]:.2f}× ({'met' if ok else 'not met'})")
    for r in readings:
        print(f"- {r}")
