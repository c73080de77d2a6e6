#!/usr/bin/env bash
# The neighbour of a throttled volume, alternated run by run on one daemon
# configuration: b alone (QD 8 on one queue) against a limited + b (QD 16, half
# the slots a's, so b has the same 8 requests in flight and a's wait in the
# daemon). benches/qos.sh measures the same in sequence, where this machine's
# speed drifts between runs more than the effect; alternating pairs takes that out.
#
# Usage: benches/qos-neighbour.sh [--pairs N] [--workload W] [--limit OPTS] [--out DIR]
#   defaults: 6 pairs, getattr, a at ops_size=100,ops_refill_time_ms=100 (1,000/s),
#   out docs/bench-data/<date>-<commit>-qos-neighbour
# Prints one line per run (b ops/s, a ops/s, daemon CPU µs per request) and the
# per-pair ratios; keeps the loadgen JSON and summary.txt in the out directory.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
R=$REPO/target/release
PAIRS=6 WL=getattr LIMIT=ops_size=100,ops_refill_time_ms=100 OUT=""
while [[ $# -gt 0 ]]; do
	case "$1" in
	--pairs) PAIRS=${2:?}; shift ;;
	--workload) WL=${2:?}; shift ;;
	--limit) LIMIT=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	-h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
[[ -x $R/volfsd && -x $R/volfsd-loadgen ]] || { echo "build first: cargo build --release --workspace" >&2; exit 2; }
OUT=${OUT:-$REPO/docs/bench-data/$(date -u +%F)-$(git -C "$REPO" rev-parse --short HEAD)-qos-neighbour}
W=/var/tmp/volfsd-qos-neighbour
rm -rf "$W" && mkdir -p "$W/share/a" "$W/share/b" "$OUT"

run() { # run NAME ALLOWED_A VOLUMES QD
	rm -f "$W/fs.sock"
	"$R/volfsd" --socket-path "$W/fs.sock" --shared-dir "$W/share" --allowed-dir "$2" \
		--allowed-dir b --num-request-queues 1 --log-level warn &
	local pid=$!
	"$R/volfsd-loadgen" --socket "$W/fs.sock" --shared-dir "$W/share" --volumes "$3" --queues 1 \
		--qd "$4" --workload "$WL" --duration 5 --file-size 64M --files 1000 --keep-files --quiet \
		--json "$OUT/$1.json" --daemon-pid "$pid" >/dev/null
	wait "$pid" || true
}

{
	echo "workload $WL, a limited with $LIMIT, $PAIRS alternated pairs, 5 s each, commit $(git -C "$REPO" rev-parse --short HEAD)"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/env.txt"
for i in $(seq "$PAIRS"); do
	run "alone-$i" a b 8
	run "throttled-$i" "a,$LIMIT" a,b 16
done
rm -rf "$W"
python3 - "$OUT" "$PAIRS" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def get(name):
    r = json.load(open(f"{out}/{name}.json"))["results"][0]
    pv = {v["volume"]: v["ops_per_sec"] for v in r.get("per_volume", [])}
    return pv.get("b", 0.0), pv.get("a", 0.0), r["daemon_cpu_us_per_request"]
print(open(f"{out}/env.txt").read().strip())
print("run            b ops/s   a ops/s   CPU µs/req")
ratios, cpu = [], []
for i in range(1, pairs + 1):
    alone, thr = get(f"alone-{i}"), get(f"throttled-{i}")
    print(f"alone-{i:<8} {alone[0]:>9,.0f} {alone[1]:>9,.0f} {alone[2]:>10.3f}")
    print(f"throttled-{i:<4} {thr[0]:>9,.0f} {thr[1]:>9,.0f} {thr[2]:>10.3f}")
    ratios.append(thr[0] / alone[0])
    cpu.append(thr[2] / alone[2])
med = statistics.median
print(f"b with a throttled / b alone: {med(ratios):.3f} (per-pair range {min(ratios):.3f}–{max(ratios):.3f})")
print(f"daemon CPU per request, same ratio: {med(cpu):.3f} ({min(cpu):.3f}–{max(cpu):.3f})")
PY
