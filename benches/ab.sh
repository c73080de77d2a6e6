#!/usr/bin/env bash
# A/B of two volfsd configurations on the load generator, alternated pair by pair
# on a quiet machine: what a feature costs per request. Each pair runs A then B (B
# then A on every other pair), each on a fresh daemon, with the same workloads.
#
# Usage: benches/ab.sh --name NAME --a "FLAGS" --b "FLAGS" [options]
#   --name NAME        what is measured (the data goes to docs/bench-data/<date>-<commit>-NAME)
#   --a FLAGS, --b FLAGS   volfsd flags of each side (B is the reference: ratios are A/B)
#   --a-bin PATH, --b-bin PATH   each side's volfsd binary (default target/release/volfsd
#                      for both): what a change costs, e.g. B built from its parent commit
#   --workload LIST    loadgen workloads (default randread4k,getattr)
#   --queues N         request queues the load generator uses (default 1)
#   --pairs N          alternated pairs (default 6)
#   --duration S       seconds per workload (default 5)
#   --out DIR          where the raw JSON and summary.md go
#   --allow-busy       measure even if another daemon, QEMU or cargo runs
# Prints, and writes to OUT/summary.md, per workload: each side's median ops/s and
# CPU per request (daemon process tree, utime + stime), and the median of the
# per-pair ratios A/B with their range, so "within the spread" shows.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VOLFSD="$REPO/target/release/volfsd"
LOADGEN="$REPO/target/release/volfsd-loadgen"
A_BIN=$VOLFSD B_BIN=$VOLFSD
NAME="" A="" B="" WORKLOAD=randread4k,getattr PAIRS=6 DURATION=5 OUT="" ALLOW_BUSY=0 QUEUES=1
WORK=/var/tmp/volfsd-ab

die() { echo "ab: error: $*" >&2; exit 2; }
say() { echo "ab: $*" >&2; }

while [[ $# -gt 0 ]]; do
	case "$1" in
	--name) NAME=${2:?}; shift ;;
	--a) A=${2?}; shift ;;
	--b) B=${2?}; shift ;;
	--a-bin) A_BIN=$(realpath "${2:?}"); shift ;;
	--b-bin) B_BIN=$(realpath "${2:?}"); shift ;;
	--workload) WORKLOAD=${2:?}; shift ;;
	--pairs) PAIRS=${2:?}; shift ;;
	--queues) QUEUES=${2:?}; shift ;;
	--duration) DURATION=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--allow-busy) ALLOW_BUSY=1 ;;
	-h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
[[ -n $NAME ]] || die "--name is required"
[[ -x $A_BIN && -x $B_BIN && -x $LOADGEN ]] || die "build first: cargo build --release --workspace"
OUT=${OUT:-$REPO/docs/bench-data/$(date -u +%F)-$(git -C "$REPO" rev-parse --short HEAD)-$NAME}
# The load generator's work directory exists before the daemon starts, so a side
# may serve it as a volume (--allowed-dir volfsd-loadgen[,limits]).
mkdir -p "$OUT" "$WORK/share/volfsd-loadgen"

# pgrep matches at most 15 characters of a process name: QEMU is qemu-system-x86.
company() { pgrep -x 'qemu-system-x86|cargo|rustc|volfsd|virtiofsd' 2>/dev/null | tr '\n' ' ' || true; }
if [[ $ALLOW_BUSY == 0 && -n $(company) ]]; then
	die "the machine is not quiet: $(company)(--allow-busy to measure anyway)"
fi

run_side() { # run_side SIDE BINARY FLAGS PAIR
	local side=$1 bin=$2 flags=$3 pair=$4 sock="$WORK/ab.sock" pid
	rm -f "$sock"
	# shellcheck disable=SC2086
	"$bin" --socket-path "$sock" --shared-dir "$WORK/share" --log-level warn $flags \
		>"$OUT/$side-pair$pair.daemon.log" 2>&1 &
	pid=$!
	"$LOADGEN" --socket "$sock" --shared-dir "$WORK/share" --queues "$QUEUES" --qd 32 \
		--duration "$DURATION" --file-size 256M --files 10000 --workload "$WORKLOAD" \
		--keep-files --quiet --json "$OUT/$side-pair$pair.json" --daemon-pid "$pid" \
		>"$OUT/$side-pair$pair.txt" 2>&1 || { cat "$OUT/$side-pair$pair.txt" >&2; die "loadgen failed ($side, pair $pair)"; }
	wait "$pid" || true
}

{
	echo "a: volfsd $A"
	echo "b: volfsd $B"
	if [[ $A_BIN != "$VOLFSD" || $B_BIN != "$VOLFSD" ]]; then
		echo "a binary: $A_BIN (sha256 $(sha256sum "$A_BIN" | cut -c1-12))"
		echo "b binary: $B_BIN (sha256 $(sha256sum "$B_BIN" | cut -c1-12))"
	fi
	echo "workload: $WORKLOAD, pairs: $PAIRS, duration: $DURATION s, $QUEUES queue(s), QD 32"
	echo "commit: $(git -C "$REPO" rev-parse --short HEAD)"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/env.txt"
for pair in $(seq "$PAIRS"); do
	if ((pair % 2)); then order=(a b); else order=(b a); fi
	for side in "${order[@]}"; do
		if [[ $side == a ]]; then
			run_side a "$A_BIN" "$A" "$pair"
		else
			run_side b "$B_BIN" "$B" "$pair"
		fi
	done
	say "pair $pair of $PAIRS done"
done
rm -rf "$WORK"

python3 "$HERE/ab_report.py" "$OUT" >"$OUT/summary.md"
cat "$OUT/summary.md"
