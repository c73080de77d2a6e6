#!/usr/bin/env bash
# A/B of two volfsd configurations on the load generator, alternated pair by pair
# on a quiet machine: what a feature costs per request. Each pair runs A then B (B
# then A on every other pair), each on a fresh daemon, with the same workloads.
#
# Usage: benches/ab.sh --name NAME --a "FLAGS" --b "FLAGS" [options]
#   --name NAME        what is measured (the data goes to docs/bench-data/<date>-<commit>-NAME)
#   --a FLAGS, --b FLAGS   volfsd flags of each side (B is the reference: ratios are A/B)
#   --workload LIST    loadgen workloads (default randread4k,getattr)
#   --pairs N          alternated pairs (default 6)
#   --duration S       seconds per workload (default 5)
#   --out DIR          where the raw JSON and summary.md go
#   --allow-busy       measure even if another daemon, QEMU or cargo runs
# Prints, and writes to OUT/summary.md, per workload: each side's median ops/s and
# CPU per request (daemon process tree, utime + stime), and the median of the
# per-pair ratios A/B with their range, so "within the spread" shows.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VOLFSD="$REPO/target/release/volfsd"
LOADGEN="$REPO/target/release/volfsd-loadgen"
NAME="" A="" B="" WORKLOAD=randread4k,getattr PAIRS=6 DURATION=5 OUT="" ALLOW_BUSY=0
WORK=/var/tmp/volfsd-ab

die() { echo "ab: error: $*" >&2; exit 2; }
say() { echo "ab: $*" >&2; }

while [[ $# -gt 0 ]]; do
	case "$1" in
	--name) NAME=${2:?}; shift ;;
	--a) A=${2?}; shift ;;
	--b) B=${2?}; shift ;;
	--workload) WORKLOAD=${2:?}; shift ;;
	--pairs) PAIRS=${2:?}; shift ;;
	--duration) DURATION=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--allow-busy) ALLOW_BUSY=1 ;;
	-h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
[[ -n $NAME ]] || die "--name is required"
[[ -x $VOLFSD && -x $LOADGEN ]] || die "build first: cargo build --release --workspace"
OUT=${OUT:-$REPO/docs/bench-data/$(date -u +%F)-$(git -C "$REPO" rev-parse --short HEAD)-$NAME}
mkdir -p "$OUT" "$WORK/share"

company() { pgrep -x 'qemu-system-x86|cargo|rustc|volfsd|virtiofsd' | tr '\n' ' ' || true; }
if [[ $ALLOW_BUSY == 0 && -n $(company) ]]; then
	die "the machine is not quiet: $(company)(--allow-busy to measure anyway)"
fi

run_side() { # run_side SIDE FLAGS PAIR
	local side=$1 flags=$2 pair=$3 sock="$WORK/ab.sock" pid
	rm -f "$sock"
	# shellcheck disable=SC2086
	"$VOLFSD" --socket-path "$sock" --shared-dir "$WORK/share" --log-level warn $flags \
		>"$OUT/$side-pair$pair.daemon.log" 2>&1 &
	pid=$!
	"$LOADGEN" --socket "$sock" --shared-dir "$WORK/share" --queues 1 --qd 32 \
		--duration "$DURATION" --file-size 256M --files 10000 --workload "$WORKLOAD" \
		--keep-files --quiet --json "$OUT/$side-pair$pair.json" --daemon-pid "$pid" \
		>"$OUT/$side-pair$pair.txt" 2>&1 || { cat "$OUT/$side-pair$pair.txt" >&2; die "loadgen failed ($side, pair $pair)"; }
	wait "$pid" || true
}

{
	echo "a: volfsd $A"
	echo "b: volfsd $B"
	echo "workload: $WORKLOAD, pairs: $PAIRS, duration: $DURATION s, 1 queue, QD 32"
	echo "commit: $(git -C "$REPO" rev-parse --short HEAD)"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/env.txt"
for pair in $(seq "$PAIRS"); do
	if ((pair % 2)); then order=(a b); else order=(b a); fi
	for side in "${order[@]}"; do
		if [[ $side == a ]]; then flags=$A; else flags=$B; fi
		run_side "$side" "$flags" "$pair"
	done
	say "pair $pair of $PAIRS done"
done
rm -rf "$WORK"

python3 - "$OUT" "$PAIRS" >"$OUT/summary.md" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
env = open(f"{out}/env.txt").read().splitlines()
def load(side, pair):
    return {r["workload"]: r for r in json.load(open(f"{out}/{side}-pair{pair}.json"))["results"]}
data = {s: [load(s, p) for p in range(1, pairs + 1)] for s in "ab"}
print("| workload | A ops/s | B ops/s | ops/s A/B (range) | A CPU µs/req | B CPU µs/req | CPU A/B (range) |")
print("|---|---|---|---|---|---|---|")
for w in data["a"][0]:
    ops = {s: [d[w]["ops_per_sec"] for d in data[s]] for s in "ab"}
    cpu = {s: [d[w]["daemon_cpu_us_per_request"] for d in data[s]] for s in "ab"}
    r_ops = [x / y for x, y in zip(ops["a"], ops["b"])]
    r_cpu = [x / y for x, y in zip(cpu["a"], cpu["b"])]
    med = statistics.median
    print(f"| {w} | {med(ops['a']):,.0f} | {med(ops['b']):,.0f} | {med(r_ops):.3f} ({min(r_ops):.3f}–{max(r_ops):.3f}) "
          f"| {med(cpu['a']):.3f} | {med(cpu['b']):.3f} | {med(r_cpu):.3f} ({min(r_cpu):.3f}–{max(r_cpu):.3f}) |")
print()
for l in env:
    print(f"- {l}")
PY
cat "$OUT/summary.md"
