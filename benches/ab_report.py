#!/usr/bin/env python3
"""Summary of one benches/ab.sh run, from its raw JSON alone.

    python3 benches/ab_report.py DIR     # the markdown table (ab.sh writes it to DIR/summary.md)

report.py imports `table` to put A/B runs into docs/BENCHMARKS.md.
"""
import glob
import json
import os
import re
import statistics
import sys


def pairs_of(out):
    """The pair numbers that have both sides' JSON."""
    nums = set()
    for path in glob.glob(os.path.join(out, "a-pair*.json")):
        m = re.search(r"a-pair(\d+)\.json$", path)
        if m and os.path.exists(os.path.join(out, f"b-pair{m.group(1)}.json")):
            nums.add(int(m.group(1)))
    return sorted(nums)


def env_of(out):
    with open(os.path.join(out, "env.txt")) as f:
        return f.read().splitlines()


def rows(out):
    """Per workload: (workload, A ops/s, B ops/s, ops ratios, A cpu, B cpu, cpu ratios,
    A p50, B p50, p50 ratios), the ratios A/B taken per pair."""
    pairs = pairs_of(out)

    def load(side, pair):
        with open(os.path.join(out, f"{side}-pair{pair}.json")) as f:
            return {r["workload"]: r for r in json.load(f)["results"]}

    data = {s: [load(s, p) for p in pairs] for s in "ab"}
    result = []
    for w in data["a"][0]:
        ops = {s: [d[w]["ops_per_sec"] for d in data[s]] for s in "ab"}
        cpu = {s: [d[w]["daemon_cpu_us_per_request"] for d in data[s]] for s in "ab"}
        p50 = {s: [d[w]["latency"]["p50_us"] for d in data[s]] for s in "ab"}
        result.append((
            w,
            ops["a"], ops["b"], [x / y for x, y in zip(ops["a"], ops["b"])],
            cpu["a"], cpu["b"], [x / y for x, y in zip(cpu["a"], cpu["b"])],
            p50["a"], p50["b"], [x / y for x, y in zip(p50["a"], p50["b"]) if y],
        ))
    return result


def table(out):
    """The markdown table and the run's environment as a list."""
    med = statistics.median
    lines = [
        "| workload | A ops/s | B ops/s | ops/s A/B (range) | A CPU µs/req | B CPU µs/req | CPU A/B (range) "
        "| A p50 µs | B p50 µs | p50 A/B (range) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w, oa, ob, ro, ca, cb, rc, la, lb, rl in rows(out):
        lat = (f"{med(rl):.3f} ({min(rl):.3f}–{max(rl):.3f})" if rl else "–")
        lines.append(
            f"| {w} | {med(oa):,.0f} | {med(ob):,.0f} | {med(ro):.3f} ({min(ro):.3f}–{max(ro):.3f}) "
            f"| {med(ca):.3f} | {med(cb):.3f} | {med(rc):.3f} ({min(rc):.3f}–{max(rc):.3f}) "
            f"| {med(la):.1f} | {med(lb):.1f} | {lat} |")
    lines.append("")
    lines.extend(f"- {line}" for line in env_of(out))
    lines.append(f"- pairs with both sides: {len(pairs_of(out))}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.stdout.write(table(sys.argv[1]))
