#!/usr/bin/env python3
"""How a daemon's cost grows with the work (used by benches/compare.sh).

Three measurements, each daemon in turn (alternated where repeated):
  - startup to the first INIT reply: the daemon and a load generator are started
    at the same instant; the load generator connects as soon as the socket
    answers (1 ms retries) and prints the CLOCK_MONOTONIC time of the INIT
    reply. Also exec to the listening socket in the same runs.
  - held inodes: a load generator looks up --inodes empty files and never
    forgets them; RssAnon and open fds of the daemon's process tree are sampled
    after INIT and while they are held: bytes and fds per held inode. A daemon
    that runs out of fds stops the lookups with an errno; the count held is kept.
    On the way, the same are sampled as the count passes each tenth of --inodes
    (and 100, 200, 500, 1000, ... below it): the curve of memory against nodes.
  - density: --density daemons, each with its own connected load generator
    idle after INIT; total RssAnon, threads and fds over every daemon's tree.

Usage: scale.py --loadgen BIN --share DIR --out FILE.json
                --daemon NAME 'CMD with {sock} and {share}' [--daemon ...]
                [--startup-runs N] [--inodes N] [--density N]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from footprint import common_args, fds, start, status_kib, stop, tree  # noqa: E402


def threads(pid):
    return sum(status_kib(p, "Threads") for p in tree(pid))


def rss_anon(pid):
    return sum(status_kib(p, "RssAnon") for p in tree(pid))


def loadgen(args, sock, extra, log):
    return subprocess.Popen([args.loadgen, "--socket", sock, "--shared-dir", args.share, "--queues", "1",
                             "--qd", "1", "--keep-files", "--quiet"] + extra,
                            stdout=log, stderr=subprocess.STDOUT)


def log_has(path, text):
    with open(path, "rb") as f:
        return text.encode() in f.read()


def wait_for(path, text, proc, timeout):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with open(path, "rb") as f:
            if text.encode() in f.read():
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def startup_once(name, cmd, args, tmp):
    sock = os.path.join(tmp, f"{name}-start.sock")
    llog = os.path.join(tmp, f"{name}-start.loadgen.log")
    with open(os.path.join(tmp, f"{name}-start.daemon.log"), "ab") as dlog, open(llog, "wb") as lf:
        t0 = time.monotonic()
        d = start(cmd, sock, args.share, dlog)
        lg = loadgen(args, sock, ["--workload", "none"], lf)
        listening = None
        while lg.poll() is None:
            if listening is None and os.path.exists(sock):
                listening = time.monotonic()
            time.sleep(0.0002)
        rc = lg.wait()
        stop(d)
    with open(llog) as f:
        text = f.read()
    m = re.search(r"INIT-DONE monotonic_ns=(\d+)", text)
    if rc != 0 or not m:
        raise RuntimeError(f"startup run of {name} failed (loadgen exit {rc}): {text[-500:]}")
    init = int(m.group(1)) / 1e9
    return (listening - t0) * 1000.0 if listening else None, (init - t0) * 1000.0


def syscw(pids):
    """write(2)-family calls made so far by these processes (/proc/PID/io)."""
    n = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/io") as f:
                for line in f:
                    if line.startswith("syscw:"):
                        n += int(line.split()[1])
        except OSError:
            pass
    return n


def curve_steps(n, tenths=10):
    """Where the curve is sampled: every tenth of n, and 100, 200, 500, 1000, ...
    below n (the fd-bound daemons stop at a few tens of thousands)."""
    steps = {n * k // tenths for k in range(1, tenths)}
    m = 100
    while m < n:
        steps.update(x for x in (m, 2 * m, 5 * m) if x < n)
        m *= 10
    return sorted(x for x in steps if x > 0)


def sample_curve(d, lg, llog, base_writes, steps):
    """Samples RssAnon and fds each time the lookups served pass a step, until
    the load generator holds them all. The count served is the daemon tree's
    write calls since INIT: at QD 1 the load generator asks for an interrupt on
    every completion, so the daemon writes its call eventfd once per request and
    writes nothing else at --log-level warn (the caller checks that against the
    final count). fds are read last: listing thousands takes a few ms, in which
    the lookups go on, so they run a little ahead of the count."""
    pids = tree(d.pid)
    points, todo = [], list(steps)
    while not log_has(llog, "loadgen: HOLD") and lg.poll() is None:
        served = syscw(pids) - base_writes
        if todo and served >= todo[0]:
            points.append({"requests": served, "rss_anon_kib": rss_anon(d.pid), "fds": fds(d.pid)})
            while todo and todo[0] <= served:
                todo.pop(0)
        time.sleep(0.01)
    return points


def held_inodes(name, cmd, args, tmp):
    sock = os.path.join(tmp, f"{name}-inodes.sock")
    llog = os.path.join(tmp, f"{name}-inodes.loadgen.log")
    with open(os.path.join(tmp, f"{name}-inodes.daemon.log"), "wb") as dlog, open(llog, "wb") as lf:
        d = start(cmd, sock, args.share, dlog)
        lg = loadgen(args, sock, ["--workload", "none", "--idle-before", "2", "--hold-inodes", str(args.inodes),
                                  "--hold-after", "3", "--json", os.path.join(tmp, f"{name}-inodes.json")], lf)
        if not wait_for(llog, "loadgen: IDLE", lg, 60):
            raise RuntimeError(f"{name}: no INIT: {open(llog).read()[-500:]}")
        time.sleep(1)
        before = {"rss_anon_kib": rss_anon(d.pid), "fds": fds(d.pid)}
        base_writes = syscw(tree(d.pid))
        points = sample_curve(d, lg, llog, base_writes, curve_steps(args.inodes))
        if not wait_for(llog, "loadgen: HOLD", lg, 3600):
            raise RuntimeError(f"{name}: lookups did not finish: {open(llog).read()[-500:]}")
        time.sleep(0.5)
        held = {"rss_anon_kib": rss_anon(d.pid), "fds": fds(d.pid)}
        served = syscw(tree(d.pid)) - base_writes
        rc = lg.wait()
        stop(d)
    if rc != 0:
        raise RuntimeError(f"{name}: loadgen exit {rc}: {open(llog).read()[-500:]}")
    with open(os.path.join(tmp, f"{name}-inodes.json")) as f:
        h = json.load(f)["held_inodes"]
    n = max(h["held"], 1)
    # The requests beyond the held lookups (the work directory's own lookups):
    # a handful; many more would mean the write count is no request count.
    extra = served - h["held"]
    curve = [{"inodes": 0, "requests": 0, **before}]
    curve += [{"inodes": min(max(p["requests"] - extra, 0), h["held"]), **p} for p in points]
    curve.append({"inodes": h["held"], "requests": served, **held})
    return {"requested": h["requested"], "held": h["held"], "stopped_by_errno": h["stopped_by_errno"],
            "lookups_per_s": h["held"] / h["lookup_seconds"] if h["lookup_seconds"] else None,
            "before": before, "holding": held,
            "rss_anon_bytes_per_inode": (held["rss_anon_kib"] - before["rss_anon_kib"]) * 1024.0 / n,
            "fds_per_inode": (held["fds"] - before["fds"]) / n,
            "curve": curve, "curve_extra_requests": extra}


class Fleet:
    """n daemons side by side, each with its own load generator connected (the
    same in every density measurement: scale.py's and benches/idle.py's).
    `share(i)` is daemon i's shared directory; `lg_extra` the load generator's
    options; `ready` what its log says once it is where the caller samples."""

    def __init__(self, name, cmd, n, args, tmp, share, lg_extra, ready):
        self.procs, self.lgs, self.logs = [], [], []
        self.spec = (name, cmd, n, args, tmp, share, lg_extra, ready)

    def __enter__(self):
        name, cmd, n, args, tmp, share, lg_extra, ready = self.spec
        try:
            for i in range(n):
                sock = os.path.join(tmp, f"{name}-dens{i}.sock")
                dlog = open(os.path.join(tmp, f"{name}-dens{i}.daemon.log"), "wb")
                llog = os.path.join(tmp, f"{name}-dens{i}.loadgen.log")
                lf = open(llog, "wb")
                self.logs += [dlog, lf]
                self.procs.append(start(cmd, sock, share(i), dlog))
                a = argparse.Namespace(loadgen=args.loadgen, share=share(i))
                self.lgs.append((loadgen(a, sock, lg_extra, lf), llog))
            for lg, llog in self.lgs:
                if not wait_for(llog, ready, lg, 300):
                    raise RuntimeError(f"{name}: a density client did not get to {ready!r}: "
                                       f"{open(llog).read()[-300:]}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for lg, _ in self.lgs:
            lg.send_signal(signal.SIGKILL)
            lg.wait()
        for p in self.procs:
            stop(p)
        for f in self.logs:
            f.close()
        return False


def density(name, cmd, args, tmp):
    with Fleet(name, cmd, args.density, args, tmp, lambda i: args.share,
               ["--workload", "none", "--idle-before", "600"], "loadgen: IDLE") as fl:
        time.sleep(2)
        return {"daemons": args.density,
                "rss_anon_kib": sum(rss_anon(p.pid) for p in fl.procs),
                "threads": sum(threads(p.pid) for p in fl.procs),
                "fds": sum(fds(p.pid) for p in fl.procs),
                "processes": sum(len(tree(p.pid)) for p in fl.procs)}


def main():
    ap = argparse.ArgumentParser()
    common_args(ap)
    ap.add_argument("--inodes", type=int, default=1_000_000)
    ap.add_argument("--density", type=int, default=100)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="volfsd-scale.")
    res = {name: {"startup_socket_ms": [], "startup_init_ms": []} for name, _ in args.daemon}
    for _ in range(args.startup_runs):
        for name, cmd in args.daemon:
            s, i = startup_once(name, cmd, args, tmp)
            if s is not None:
                res[name]["startup_socket_ms"].append(s)
            res[name]["startup_init_ms"].append(i)
    if args.inodes:
        for name, cmd in args.daemon:
            res[name]["inodes"] = held_inodes(name, cmd, args, tmp)
    if args.density:
        for name, cmd in args.daemon:
            res[name]["density"] = density(name, cmd, args, tmp)
    for name, _ in args.daemon:
        r = res[name]
        line = f"{name}: startup to INIT median {statistics.median(r['startup_init_ms']):.2f} ms"
        if "inodes" in r:
            i = r["inodes"]
            line += (f"; held {i['held']} of {i['requested']} inodes: {i['rss_anon_bytes_per_inode']:.0f} B "
                     f"RssAnon and {i['fds_per_inode']:.3f} fds per inode")
        if "density" in r:
            dd = r["density"]
            line += f"; {dd['daemons']} daemons: {dd['rss_anon_kib']} KiB RssAnon, {dd['threads']} threads, {dd['fds']} fds"
        print(line)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
