#!/usr/bin/env python3
"""Footprint and startup of vhost-user-fs daemons (used by benches/compare.sh).

For each daemon, alternating:
  - startup: time from exec to the listening socket appearing (polled every
    0.2 ms), median of --startup-runs runs;
  - memory: RssAnon and RssFile summed over the daemon's process tree (every
    thread group's /proc/PID/status), idle after the loadgen connected and
    did INIT, and the peak while the metadata workload runs (sampled every
    50 ms) and right after it; open fds of the tree after the workload.

Usage: footprint.py --loadgen BIN --share DIR --out FILE.json
                    --daemon NAME 'CMD with {sock} and {share}' [--daemon ...]
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def tree(pid):
    """pid and all its descendants."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample(pid):
    procs = tree(pid)
    return {
        "processes": len(procs),
        "rss_anon_kib": sum(status_kib(p, "RssAnon") for p in procs),
        "rss_file_kib": sum(status_kib(p, "RssFile") for p in procs),
        "rss_shmem_kib": sum(status_kib(p, "RssShmem") for p in procs),
    }


def fds(pid):
    n = 0
    for p in tree(pid):
        try:
            n += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    return n


def start(cmd, sock, share, log):
    if os.path.exists(sock):
        os.unlink(sock)
    argv = [a.format(sock=sock, share=share) for a in shlex.split(cmd)]
    return subprocess.Popen(argv, stdout=log, stderr=log)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def startup_once(cmd, share, tmp):
    sock = os.path.join(tmp, "s.sock")
    with open(os.path.join(tmp, "startup.log"), "ab") as log:
        t0 = time.perf_counter()
        p = start(cmd, sock, share, log)
        while not os.path.exists(sock):
            if p.poll() is not None:
                raise RuntimeError(f"daemon exited with {p.returncode} before listening: {cmd}")
            if time.perf_counter() - t0 > 10:
                stop(p)
                raise RuntimeError(f"no socket after 10 s: {cmd}")
            time.sleep(0.0002)
        dt = time.perf_counter() - t0
        stop(p)
    return dt * 1000.0


def memory_run(name, cmd, args, tmp):
    sock = os.path.join(tmp, f"{name}.sock")
    dlog = open(os.path.join(tmp, f"{name}.daemon.log"), "wb")
    llog_path = os.path.join(tmp, f"{name}.loadgen.log")
    d = start(cmd, sock, args.share, dlog)
    for _ in range(10000):
        if os.path.exists(sock):
            break
        time.sleep(0.001)
    idle_before_connect = sample(d.pid)
    with open(llog_path, "wb") as llog:
        lg = subprocess.Popen(
            [args.loadgen, "--socket", sock, "--shared-dir", args.share, "--workload", "metadata",
             "--duration", str(args.duration), "--qd", "32", "--queues", "1",
             "--idle-before", "3", "--hold-after", "2", "--keep-files"],
            stdout=llog, stderr=subprocess.STDOUT)

        def log_has(s):
            with open(llog_path, "rb") as f:
                return s.encode() in f.read()

        while not log_has("loadgen: IDLE") and lg.poll() is None:
            time.sleep(0.05)
        time.sleep(1.5)
        idle = sample(d.pid)
        idle_fds = fds(d.pid)
        peak = dict(idle)
        while not log_has("loadgen: HOLD") and lg.poll() is None:
            s = sample(d.pid)
            for k in ("rss_anon_kib", "rss_file_kib", "rss_shmem_kib"):
                peak[k] = max(peak[k], s[k])
            time.sleep(0.05)
        after = sample(d.pid)
        for k in ("rss_anon_kib", "rss_file_kib", "rss_shmem_kib"):
            peak[k] = max(peak[k], after[k])
        after_fds = fds(d.pid)
        rc = lg.wait()
    try:
        d.wait(10)
    except subprocess.TimeoutExpired:
        stop(d)
    dlog.close()
    if rc != 0:
        with open(llog_path) as f:
            sys.stderr.write(f.read())
        raise RuntimeError(f"loadgen failed against {name} (exit {rc})")
    return {
        "before_connect": idle_before_connect,
        "idle_after_connect": idle,
        "idle_fds": idle_fds,
        "peak_metadata": peak,
        "after_metadata": after,
        "fds_after_metadata": after_fds,
    }


def common_args(ap):
    """The options footprint.py and scale.py share."""
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--share", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--daemon", nargs=2, action="append", metavar=("NAME", "CMD"), required=True)
    ap.add_argument("--startup-runs", type=int, default=20)


def main():
    ap = argparse.ArgumentParser()
    common_args(ap)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="volfsd-footprint.")
    res = {name: {"startup_ms": [], "memory": []} for name, _ in args.daemon}
    for _ in range(args.startup_runs):
        for name, cmd in args.daemon:
            res[name]["startup_ms"].append(startup_once(cmd, args.share, tmp))
    for _ in range(args.reps):
        for name, cmd in args.daemon:
            res[name]["memory"].append(memory_run(name, cmd, args, tmp))
    for name, _ in args.daemon:
        v = res[name]["startup_ms"]
        res[name]["startup_ms_median"] = statistics.median(v)
        print(f"{name}: startup median {statistics.median(v):.2f} ms (min {min(v):.2f}, max {max(v):.2f}); "
              f"idle RssAnon {res[name]['memory'][0]['idle_after_connect']['rss_anon_kib']} KiB, "
              f"peak {res[name]['memory'][0]['peak_metadata']['rss_anon_kib']} KiB, "
              f"fds {res[name]['memory'][0]['fds_after_metadata']}")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
