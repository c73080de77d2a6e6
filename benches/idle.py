#!/usr/bin/env python3
"""What idle daemons cost: CPU over a minute of idleness, and memory (issue 27:
"an idle daemon's CPU does not rise measurably (100 idle daemons over 60 s)";
"density: 100 idle daemons in <= 0.6x the RssAnon of 100 virtiofsd, with the
sandbox on").

For each kind of daemon in turn (in an order rotated every round): --daemons of
them side by side (scale.py's Fleet), each with its own load generator that
connects, sends --ops GETATTRs at QD 1 (so a polling daemon did poll) and then
holds the session open, idle. After --settle-s, each daemon tree's CPU time is
read, again --idle-s later, and the difference summed:
  - utime + stime of every process of the tree (/proc/PID/stat; clock ticks,
    dead threads included): the figure asked for;
  - the on-CPU nanoseconds of every live thread (/proc/PID/task/*/schedstat),
    finer than a tick;
  - context switches of every live thread: whether a thread woke at all.
Also RssAnon, threads and processes summed over the trees, the load generators'
own CPU over the same minute, and the load average and company before and after
(another VM or build on the machine shows there).

Usage: idle.py --loadgen BIN --share DIR --out DIR [--daemons 100] [--idle-s 60]
               [--settle-s 5] [--ops 2000] [--rounds 1]
               --daemon NAME 'CMD with {sock} and {share}' [--daemon ...]
Writes OUT/idle.json and OUT/env.txt. A benchmark: it asserts nothing.
"""
import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from footprint import status_kib  # noqa: E402
from scale import Fleet  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
# What shares the cores with a measurement, by program name (as benches/quiet-lib.sh's
# company()); the measured daemons themselves are left out by pid.
COMPANY = {"cargo", "rustc", "cc1", "cc1plus", "ld", "fio", "stress-ng", "afl-fuzz", "volfsd",
           "virtiofsd", "volfsd-loadgen"}
COMPANY_PREFIXES = ("qemu-system-", "cloud-hyperviso")


def children_map():
    """{ppid: [pid]} of every process, from one pass over /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            out.setdefault(int(st[st.rindex(")") + 2:].split()[1]), []).append(int(d))
        except (OSError, ValueError):
            pass
    return out


def tree_of(pid, kids):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def cpu(pids):
    """{ticks, sched_ns, switches, threads, by_thread} summed over these processes;
    by_thread: context switches per thread name (which thread woke)."""
    ticks = sched = switches = threads = 0
    by_thread = {}
    for p in pids:
        st = read(f"/proc/{p}/stat")
        if st:
            f = st[st.rindex(")") + 2:].split()
            ticks += int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            tids = []
        for t in tids:
            threads += 1
            ss = read(f"/proc/{p}/task/{t}/schedstat").split()
            if ss:
                sched += int(ss[0])
            status = read(f"/proc/{p}/task/{t}/status").splitlines()
            comm = status[0].split(None, 1)[1] if status and status[0].startswith("Name:") else "?"
            for line in status:
                if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                    switches += int(line.split()[1])
                    by_thread[comm] = by_thread.get(comm, 0) + int(line.split()[1])
    return {"ticks": ticks, "sched_ns": sched, "switches": switches, "threads": threads,
            "by_thread": by_thread}


def switches_by_thread(c0, c1):
    """Context switches over the idle time per thread name, summed over the daemons."""
    out = {}
    for a, b in zip(c0, c1):
        for comm, n in b["by_thread"].items():
            out[comm] = out.get(comm, 0) + n - a["by_thread"].get(comm, 0)
    return {k: v for k, v in sorted(out.items()) if v}


def company(ours=frozenset()):
    names = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) not in ours:
            c = read(f"/proc/{d}/comm").strip()
            if c in COMPANY or c.startswith(COMPANY_PREFIXES):
                names[c] = names.get(c, 0) + 1
    return ",".join(f"{k}×{v}" for k, v in sorted(names.items()))


def loadavg():
    return [float(x) for x in read("/proc/loadavg").split()[:3]]


def frontend_args(args):
    """Each frontend: GETATTRs at QD 1 (scale.loadgen's queue and depth), then idle."""
    return ["--workload", "getattr", "--ops", str(args.ops), "--files", "100", "--hold-after", "36000"]


def idle_run(name, cmd, args, tmp, shares):
    """One kind: its fleet, a settle, then the idle minute measured."""
    lg_extra = frontend_args(args)
    with Fleet(name, cmd, args.daemons, args, tmp, lambda i: shares[i], lg_extra, "loadgen: HOLD") as fl:
        time.sleep(args.settle_s)
        kids = children_map()
        trees = [tree_of(p.pid, kids) for p in fl.procs]
        lg_trees = [tree_of(lg.pid, kids) for lg, _ in fl.lgs]
        ours = frozenset(p for t in trees + lg_trees for p in t)
        load0, comp0 = loadavg(), company(ours)
        t0 = time.monotonic()
        c0 = [cpu(t) for t in trees]
        l0 = [cpu(t) for t in lg_trees]
        time.sleep(args.idle_s)
        c1 = [cpu(t) for t in trees]
        l1 = [cpu(t) for t in lg_trees]
        elapsed = time.monotonic() - t0
        load1, comp1 = loadavg(), company(ours)
        rss = [sum(status_kib(p, "RssAnon") for p in t) for t in trees]
        alive = sum(1 for p in fl.procs if p.poll() is None)
    d = lambda k, a, b: [y[k] - x[k] for x, y in zip(a, b)]  # noqa: E731
    return {
        "kind": name, "cmd": cmd, "daemons": args.daemons, "alive_at_end": alive,
        "idle_s": elapsed, "load_before": load0, "load_after": load1,
        "company_before": comp0, "company_after": comp1,
        "cpu_ticks": d("ticks", c0, c1), "sched_ns": d("sched_ns", c0, c1),
        "switches": d("switches", c0, c1), "frontend_cpu_ticks": sum(d("ticks", l0, l1)),
        "switches_by_thread": switches_by_thread(c0, c1),
        "rss_anon_kib": rss, "threads": sum(c["threads"] for c in c1),
        "processes": sum(len(t) for t in trees),
    }


def sha(cmd):
    import hashlib
    try:
        with open(shlex.split(cmd)[0], "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError:
        return "?"


def env_lines(args):
    def ver(cmd):
        try:
            return subprocess.run(shlex.split(cmd)[:1] + ["--version"], capture_output=True, text=True,
                                  timeout=10).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    lines = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
             "command: benches/idle.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
             f"commit: {rev}",
             # The daemons' own commit when they were built elsewhere (as compare.sh).
             f"volfsd_rev: {os.environ.get('VOLFSD_REV', rev)}",
             f"host_kernel: {platform.release()}",
             f"cores: {os.cpu_count()}",
             f"load_before: {' '.join(map(str, loadavg()))}",
             f"company_before: {company() or 'none'}"]
    lines += [f"{name}: {ver(cmd)} (sha256 {sha(cmd)})" for name, cmd in args.daemon]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--share", required=True, help="a directory under which each daemon gets its own")
    ap.add_argument("--out", required=True, help="directory for idle.json and env.txt")
    ap.add_argument("--daemon", nargs=2, action="append", metavar=("NAME", "CMD"), required=True)
    ap.add_argument("--daemons", type=int, default=100)
    ap.add_argument("--idle-s", type=float, default=60)
    ap.add_argument("--settle-s", type=float, default=5)
    ap.add_argument("--ops", type=int, default=2000, help="GETATTRs each frontend sends before idling")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = env_lines(args)
    tmp = tempfile.mkdtemp(prefix="volfsd-idle.")
    # One shared directory per daemon: the load generators prepare theirs at once.
    shares = [os.path.join(args.share, f"idle-{i}") for i in range(args.daemons)]
    for s in shares:
        os.makedirs(s, exist_ok=True)
    runs = []
    try:
        for rnd in range(args.rounds):
            kinds = args.daemon[rnd % len(args.daemon):] + args.daemon[:rnd % len(args.daemon)]
            for name, cmd in kinds:
                r = idle_run(name, cmd, args, tmp, shares)
                r["round"] = rnd + 1
                runs.append(r)
                print(f"idle: {name} round {rnd + 1}: {sum(r['cpu_ticks']) / CLK_TCK:.2f} s CPU "
                      f"({sum(r['sched_ns']) / 1e9:.4f} s on-CPU, {sum(r['switches'])} switches) over "
                      f"{r['idle_s']:.1f} s, {sum(r['rss_anon_kib']) / r['daemons']:.0f} KiB RssAnon "
                      f"each; load {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}", file=sys.stderr)
    finally:
        for s in shares:
            shutil.rmtree(s, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    env.append(f"load_after: {' '.join(map(str, loadavg()))}")
    with open(os.path.join(args.out, "env.txt"), "w") as f:
        f.write("\n".join(env) + "\n")
    with open(os.path.join(args.out, "idle.json"), "w") as f:
        json.dump({"clk_tck": CLK_TCK, "daemons": args.daemons, "idle_s": args.idle_s,
                   "settle_s": args.settle_s, "ops_per_frontend": args.ops,
                   "frontend": "volfsd-loadgen --queues 1 --qd 1 " + " ".join(frontend_args(args)),
                   "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
