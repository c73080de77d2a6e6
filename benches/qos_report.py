#!/usr/bin/env python3
"""Turns the kept raw results of benches/qos.sh into a markdown section (stdout).

Usage: qos_report.py DATA_DIR          (docs/bench-data/<date>-<commit>-qos)

Everything printed is computed from DATA_DIR (the load generator's JSON with its
per-volume completions per 100 ms, patches.tsv, the /metrics scrapes, env.txt,
quiet.tsv and the command files): re-running it on the same data gives the same
section.

How the figures are made:
- a rate is counted over whole 100 ms intervals of the load generator's per-volume
  series (unix ms); the last, partial interval of a run is never counted. A steady
  rate leaves out the first second of its part (the bucket's start burst, the
  rate settling).
- b's ratio is b's rate in a limited run over b's rate in the unlimited run of the
  same repetition and workload (both with a loaded on the same queue); "b / alone"
  is over b's rate in the run of the same repetition where only b is loaded, at its
  half of the slots (a's slots idle): what the same requests in flight give when a
  is not there at all.
- settle time after a PATCH: the first interval boundary T such that a's rate over
  every window of 5 intervals (500 ms) from T to the next PATCH is within ±5% of
  the new limit; reported as T minus the time the PATCH was sent (an upper bound:
  the series' resolution is one interval). The window is 5 intervals because at
  200 ops/s one interval holds 20 operations and a completion or two falls on
  either side of a boundary (a single interval's count jitters by ±10-20%); a
  late or overshooting first interval still fails every window holding it.
"""
import glob
import json
import os
import re
import statistics
import sys

TOL = 0.05  # ±5% around a limit
B_MIN = 0.90  # b keeps at least this fraction of its unlimited rate
WINDOW = 5  # intervals per window of the settle check
REFILL_MS = 100  # refill period of the ops100 and PATCHed buckets
LIMIT_OPS = 1000.0
PATCHED_OPS = 200.0
LIMIT_MIB = 10.0
WORKLOADS = ["getattr", "randread4k"]
MIB = float(1 << 20)


# ---------------------------------------------------------------- reading
def read_env(data):
    env = {}
    path = os.path.join(data, "env.txt")
    if os.path.exists(path):
        for line in open(path):
            k, _, v = line.rstrip("\n").partition(": ")
            env[k] = v
    return env


def read_tsv(data, name):
    path = os.path.join(data, name)
    if not os.path.exists(path):
        return []
    return [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]


def runs(data):
    """{(kind, workload): {rep: report}}"""
    out = {}
    for path in sorted(glob.glob(os.path.join(data, "*-rep*.json"))):
        m = re.fullmatch(r"([a-z0-9]+)-([a-z0-9]+)-rep(\d+)\.json", os.path.basename(path))
        if not m:
            continue
        report = json.load(open(path))
        out.setdefault((m.group(1), m.group(2)), {})[int(m.group(3))] = report
    return out


def metric(data, run, label, name, volume):
    path = os.path.join(data, f"{run}.metrics-{label}.txt")
    if not os.path.exists(path):
        return None
    pat = re.compile(r"^" + re.escape(name) + r"\{([^}]*)\}\s+(\S+)$")
    for line in open(path):
        m = pat.match(line.strip())
        if m and f'volume="{volume}"' in m.group(1):
            return float(m.group(2))
    return None


# ---------------------------------------------------------------- series
class Vol:
    """One volume's series in one workload result."""

    def __init__(self, result, name):
        self.result = result
        v = next((p for p in result.get("per_volume", []) if p["volume"] == name), None)
        if v is None:
            raise KeyError(f"no volume {name} in {result['workload']}")
        self.v = v
        self.step = v["interval_ms"]
        self.start = result["start_unix_ms"]
        self.end = result["end_unix_ms"]
        # Whole intervals only.
        self.ivs = [i for i in v["series"] if i["start_unix_ms"] + self.step <= self.end]

    def window(self, t_from, t_to):
        return [i for i in self.ivs if i["start_unix_ms"] >= t_from and i["start_unix_ms"] + self.step <= t_to]

    def rate(self, t_from, t_to, what="ops"):
        ivs = self.window(t_from, t_to)
        if not ivs:
            return float("nan")
        total = sum(i[what] for i in ivs)
        secs = len(ivs) * self.step / 1000.0
        return total / secs / (MIB if what == "bytes" else 1.0)

    def steady(self, what="ops"):
        return self.rate(self.start + 1000, self.end, what)

    def settle(self, t_patch, t_end, target):
        """ms from the PATCH to the first boundary after which every WINDOW-interval
        window is within TOL of target (None: never before t_end)."""
        ivs = [i for i in self.ivs if i["start_unix_ms"] + self.step > t_patch and i["start_unix_ms"] + self.step <= t_end]
        n = len(ivs) - WINDOW + 1
        if n <= 0:
            return None
        per_s = 1000.0 / self.step
        ok = [abs(sum(i["ops"] for i in ivs[j:j + WINDOW]) / WINDOW * per_s - target) <= TOL * target for j in range(n)]
        for k in range(n):
            if all(ok[k:]):
                return max(0, ivs[k]["start_unix_ms"] - t_patch)
        return None

    def first_above(self, t_from, rate):
        """ms from t_from to the end of the first interval after it at or above rate."""
        per_s = 1000.0 / self.step
        for i in self.ivs:
            if i["start_unix_ms"] >= t_from - self.step and i["start_unix_ms"] + self.step > t_from and i["ops"] * per_s >= rate:
                return i["start_unix_ms"] + self.step - t_from
        return None

    def around(self, t, before_ms, after_ms):
        """(ms relative to t of each interval start, ops/s) around t."""
        per_s = 1000.0 / self.step
        return [(i["start_unix_ms"] - t, i["ops"] * per_s) for i in self.ivs
                if t - before_ms <= i["start_unix_ms"] <= t + after_ms]


# ---------------------------------------------------------------- formatting
def fmt(x, digits=0):
    if x is None or x != x:
        return "–"
    return f"{x:,.{digits}f}"


def cell(v, digits=0, suffix=""):
    v = [x for x in v if x is not None and x == x]
    if not v:
        return "–"
    if len(v) == 1:
        return fmt(v[0], digits) + suffix
    return f"{fmt(statistics.median(v), digits)}{suffix} ({fmt(min(v), digits)}–{fmt(max(v), digits)})"


def met(flags):
    flags = [f for f in flags if f is not None]
    if not flags:
        return "–"
    n = sum(1 for f in flags if f)
    return f"{'yes' if n == len(flags) else 'NO'} ({n}/{len(flags)})"


def within(x, target, tol=TOL):
    if x is None or x != x:
        return None
    return abs(x - target) <= tol * target


# ---------------------------------------------------------------- the section
def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    lines, _ = render(sys.argv[1])
    print("\n".join(lines))


def render(data):
    """The section's lines, and its checks as (what, target, result)."""
    env = read_env(data)
    R = runs(data)
    patches = {}
    for row in read_tsv(data, "patches.tsv"):
        run, label, t0, t1, code = row[:5]
        patches[(run, label)] = (int(t0), int(t1), code, row[5] if len(row) > 5 else "")
    quiet = read_tsv(data, "quiet.tsv")
    out = []
    P = out.append
    reps = sorted({r for v in R.values() for r in v})

    def res(kind, wl, rep):
        rep_map = R.get((kind, wl), {})
        rep_report = rep_map.get(rep)
        if rep_report is None:
            return None
        return next((x for x in rep_report["results"] if x["workload"] == wl), None)

    def vol(kind, wl, rep, name):
        r = res(kind, wl, rep)
        return Vol(r, name) if r else None

    P("## Per-volume QoS\n")
    P("Measured by `benches/qos.sh`.\n")
    P(f"Two volumes, **a** and **b**, of one daemon are loaded at once over **one request queue** "
      f"(`--num-request-queues 1`; `volfsd-loadgen --queues 1 --qd {env.get('qd', '?')} --volumes a,b`: "
      f"in-flight slot i works on volume i % 2, so half the slots are a's and half b's, all on the same "
      f"virtqueue). Only a is ever limited. {len(reps)} repetition(s); figures are "
      f"median (min–max) over them. Rates are counted over whole 100 ms intervals of the load "
      f"generator's per-volume series, leaving out the first second of each part.\n")
    P(f"- date: {env.get('date', '?')}, commit {env.get('commit', '?')}")
    P(f"- machine: {env.get('cpu', '?')}, {env.get('cores', '?')} cores, {env.get('memory', '?')}, "
      f"kernel {env.get('host_kernel', '?')}; share on {env.get('work_dir', '?')}")
    P(f"- {env.get('quiet', 'quiet: not recorded')}")
    busy = [r for r in quiet if len(r) > 3 and r[3]]
    if busy:
        P(f"- runs that had company: " + ", ".join(f"{r[0]} ({r[3]}, load {r[2]})" for r in busy))
    P(f"- runs of {env.get('duration_s', '?')} s; the runtime-change run {env.get('segment_s', '?')} s per part; "
      f"randread4k file {env.get('file_size', '?')} per volume; {env.get('files', '?')} files for getattr")
    P("")

    # ------------------------------------------------------------ summary rows
    checks = []  # (criterion, target, result)

    # ------------------------------------------------------------ 1. baseline
    P("### 1. No limits (the reference)\n")
    P("`b alone`: only b loaded, at its half of the slots (`--volumes b --qd "
      f"{int(env.get('qd', '16')) // 2}`), a's slots idle.\n")
    P("| workload | a ops/s | b ops/s | a + b ops/s | a p99 µs | b p99 µs | b alone ops/s | b alone p99 µs |")
    P("|---|---:|---:|---:|---:|---:|---:|---:|")
    for wl in WORKLOADS:
        a = [vol("base", wl, r, "a") for r in reps]
        b = [vol("base", wl, r, "b") for r in reps]
        if not any(a):
            continue
        ar = [x.steady() for x in a if x]
        br = [x.steady() for x in b if x]
        alone = [x for x in (vol("alone", wl, r, "b") for r in reps) if x]
        P(f"| {wl} | {cell(ar)} | {cell(br)} | {cell([x + y for x, y in zip(ar, br)])} | "
          f"{cell([x.v['latency']['p99_us'] for x in a if x], 1)} | {cell([x.v['latency']['p99_us'] for x in b if x], 1)} | "
          f"{cell([x.steady() for x in alone])} | {cell([x.v['latency']['p99_us'] for x in alone], 1)} |")
    P("")

    # ------------------------------------------------------------ 2. fixed limit
    P(f"### 2. a limited to {LIMIT_OPS:,.0f} ops/s from the start (`--allowed-dir a,ops_size=...`)\n")
    P("`ops100`: `ops_size=100,ops_refill_time_ms=100` (a start burst of 100); "
      "`ops1000`: `ops_size=1000,ops_refill_time_ms=1000` (burst 1000). "
      f"Targets: a within ±{TOL:.0%} of {LIMIT_OPS:,.0f} ops/s; b at least {B_MIN:.2f}× its unlimited rate.\n")
    P("| workload | bucket | a ops/s | a off target | a within ±5% | b ops/s | b / unlimited | b ≥ 0.90× | "
      "b / alone | b p99 µs (unlimited) | a throttled requests | b throttled requests |")
    P("|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|")
    for wl in WORKLOADS:
        for kind in ("ops100", "ops1000"):
            if (kind, wl) not in R:
                continue
            ar, br, ratio, aratio, bp99, bp99u, ath, bth = [], [], [], [], [], [], [], []
            for r in reps:
                a, b, b0 = vol(kind, wl, r, "a"), vol(kind, wl, r, "b"), vol("base", wl, r, "b")
                b1 = vol("alone", wl, r, "b")
                if not a:
                    continue
                ar.append(a.steady())
                br.append(b.steady())
                ratio.append(b.steady() / b0.steady() if b0 else None)
                aratio.append(b.steady() / b1.steady() if b1 else None)
                bp99.append(b.v["latency"]["p99_us"])
                bp99u.append(b0.v["latency"]["p99_us"] if b0 else None)
                run = f"{kind}-{wl}-rep{r}"
                ath.append(metric(data, run, "end", "volfsd_qos_throttled_requests_total", "a"))
                bth.append(metric(data, run, "end", "volfsd_qos_throttled_requests_total", "b"))
            off = [(x / LIMIT_OPS - 1) * 100 for x in ar]
            a_ok = met([within(x, LIMIT_OPS) for x in ar])
            b_ok = met([x >= B_MIN if x is not None else None for x in ratio])
            checks.append((f"{wl}, {kind}: a's rate", f"{LIMIT_OPS:,.0f} ops/s ±5%", a_ok))
            checks.append((f"{wl}, {kind}: b's rate", f"≥ {B_MIN:.2f}× unlimited", b_ok))
            P(f"| {wl} | {kind} | {cell(ar)} | {cell(off, 1, '%')} | {a_ok} | {cell(br)} | {cell(ratio, 2, '×')} | "
              f"{b_ok} | {cell(aratio, 2, '×')} | {cell(bp99, 1)} ({cell(bp99u, 1)}) | {cell(ath)} | {cell(bth)} |")
    P("")

    # ------------------------------------------------------------ 3. runtime change
    P("### 3. Changing a's limit while the load runs (`PATCH /volumes/a`)\n")
    P(f"a starts at {LIMIT_OPS:,.0f} ops/s (`ops_size=100,ops_refill_time_ms=100`); after one part, "
      f"`PATCH /volumes/a` with `{{\"rate_limiter\": {{\"ops\": {{\"size\": 20, \"one_time_burst\": 0, "
      f"\"refill_time_ms\": 100}}, \"bandwidth\": null}}}}` ({PATCHED_OPS:,.0f} ops/s); after another, "
      f"`{{\"rate_limiter\": null}}`. Settle time: from the PATCH being sent to the first 100 ms boundary "
      f"after which a's rate over every {WINDOW * 100} ms window is within ±5% of {PATCHED_OPS:,.0f} ops/s "
      f"(target: within one refill period, {REFILL_MS} ms; the series' resolution is 100 ms). Lifted: a's "
      f"rate after the second PATCH (leaving out 500 ms) against b's in the same part (both unlimited on "
      f"the same queue) and against a's in the unlimited run.\n")
    P("| workload | before: a ops/s | PATCH answered in ms | settled after ms | within one refill period | "
      "after: a ops/s | a within ±5% | b / unlimited (200 ops/s part) | lifted: a ops/s | lifted: a / b | "
      "lifted / unlimited | above half the unlimited rate after ms |")
    P("|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|")
    examples = []
    for wl in WORKLOADS:
        if ("patch", wl) not in R:
            continue
        before, answer, settle, after, bratio, lifted, lratio, lift_ms, lab = [], [], [], [], [], [], [], [], []
        settle_ok, after_ok = [], []
        for r in reps:
            run = f"patch-{wl}-rep{r}"
            a, b = vol("patch", wl, r, "a"), vol("patch", wl, r, "b")
            a0, b0 = vol("base", wl, r, "a"), vol("base", wl, r, "b")
            p1, p2 = patches.get((run, "to200")), patches.get((run, "unlimited"))
            if not a or not p1 or not p2:
                continue
            t1, t2 = p1[0], p2[0]
            before.append(a.rate(a.start + 1000, t1))
            answer.append(p1[1] - p1[0])
            s = a.settle(t1, t2, PATCHED_OPS)
            settle.append(s)
            settle_ok.append(s is not None and s <= REFILL_MS)
            after.append(a.rate(t1 + 1000, t2))
            after_ok.append(within(after[-1], PATCHED_OPS))
            bratio.append(b.rate(t1 + 1000, t2) / b0.steady() if b0 else None)
            lifted.append(a.rate(t2 + 500, a.end))
            lab.append(lifted[-1] / b.rate(t2 + 500, b.end))
            lratio.append(lifted[-1] / a0.steady() if a0 else None)
            lift_ms.append(a.first_above(t2, 0.5 * a0.steady()) if a0 else None)
            if r == reps[0]:
                examples.append((wl, a, t1, t2, s))
        if not before:
            continue
        s_ok = met(settle_ok)
        checks.append((f"{wl}: settle after PATCH to {PATCHED_OPS:,.0f} ops/s", f"≤ {REFILL_MS} ms", s_ok))
        a_ok = met(after_ok)
        checks.append((f"{wl}: a's rate after the PATCH", f"{PATCHED_OPS:,.0f} ops/s ±5%", a_ok))
        never = sum(1 for x in settle if x is None)
        P(f"| {wl} | {cell(before)} | {cell(answer)} | {cell(settle)}{f' ({never} never)' if never else ''} | {s_ok} | "
          f"{cell(after)} | {a_ok} | {cell(bratio, 2, '×')} | {cell(lifted)} | {cell(lab, 2, '×')} | {cell(lratio, 2, '×')} | "
          f"{cell(lift_ms)} |")
    P("")
    for wl, a, t1, t2, s in examples:
        P(f"a's ops/s per 100 ms around the PATCHes ({wl}, first repetition; ms from the PATCH being sent, "
          f"interval start):\n")
        P("```")
        for label, t, target in (("to 200 ops/s", t1, PATCHED_OPS), ("limit lifted", t2, None)):
            P(f"PATCH {label}:")
            P("  " + "  ".join(f"{dt:+d}:{rate:,.0f}" for dt, rate in a.around(t, 500, 1000)))
        P("```\n")

    # ------------------------------------------------------------ 4. bandwidth
    if ("bw", "randread4k") in R:
        P(f"### 4. a limited to {LIMIT_MIB:.0f} MiB/s (`bw_size=1048576,bw_refill_time_ms=100`), randread4k\n")
        P("| a MiB/s | a off target | a within ±5% | b MiB/s | b / unlimited | b ≥ 0.90× | b / alone | a throttled requests |")
        P("|---:|---:|---|---:|---:|---|---:|---:|")
        ar, br, ratio, aratio, ath = [], [], [], [], []
        for r in reps:
            a, b, b0 = vol("bw", "randread4k", r, "a"), vol("bw", "randread4k", r, "b"), vol("base", "randread4k", r, "b")
            b1 = vol("alone", "randread4k", r, "b")
            if not a:
                continue
            ar.append(a.steady("bytes"))
            br.append(b.steady("bytes"))
            ratio.append(b.steady("bytes") / b0.steady("bytes") if b0 else None)
            aratio.append(b.steady("bytes") / b1.steady("bytes") if b1 else None)
            ath.append(metric(data, f"bw-randread4k-rep{r}", "end", "volfsd_qos_throttled_requests_total", "a"))
        a_ok = met([within(x, LIMIT_MIB) for x in ar])
        b_ok = met([x >= B_MIN if x is not None else None for x in ratio])
        checks.append(("randread4k, bandwidth: a's MiB/s", f"{LIMIT_MIB:.0f} MiB/s ±5%", a_ok))
        checks.append(("randread4k, bandwidth: b's MiB/s", f"≥ {B_MIN:.2f}× unlimited", b_ok))
        P(f"| {cell(ar, 2)} | {cell([(x / LIMIT_MIB - 1) * 100 for x in ar], 1, '%')} | {a_ok} | {cell(br, 1)} | "
          f"{cell(ratio, 2, '×')} | {b_ok} | {cell(aratio, 2, '×')} | {cell(ath)} |\n")

    # ------------------------------------------------------------ summary
    P("### Targets\n")
    P("| what | target | met (repetitions) |")
    P("|---|---|---|")
    for what, target, result in checks:
        P(f"| {what} | {target} | {result} |")
    P("")

    # ------------------------------------------------------------ commands
    P("### Commands\n")
    P("```sh")
    P(env.get("command", "benches/qos.sh"))
    P("```\n")
    P("Each run (first repetition's paths; `a` gets the run's limits):\n")
    P("```sh")
    for path in sorted(glob.glob(os.path.join(data, "*.cmd"))):
        kind_wl = os.path.basename(path)[:-4]
        P(f"# {kind_wl}")
        P(open(path).read().strip())
        lg = os.path.join(data, f"{kind_wl}.loadgen-cmd")
        if os.path.exists(lg):
            P(open(lg).read().strip())
    P("```\n")
    if patches:
        P("The PATCHes: `curl --unix-socket CTL -X PATCH http://localhost/volumes/a -d BODY` with the bodies "
          "above; send and reply times (unix ms) are in `patches.tsv`.\n")
    P(f"Raw data: `{os.path.relpath(data, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))}` "
      f"(load generator JSON with per-volume series, `/metrics` scrapes, `patches.tsv`, `env.txt`, `quiet.tsv`).\n")
    return out, checks


if __name__ == "__main__":
    main()
