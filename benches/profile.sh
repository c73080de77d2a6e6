#!/usr/bin/env bash
# Profile a daemon under one loadgen workload (no perf needed).
#
# Usage: benches/profile.sh strace|callgrind|perf WORKLOAD [--daemon volfsd|virtiofsd]
#                           [--ops N] [--queues N] [--out DIR]
#   strace     strace -c -f on the daemon: syscalls per request, time per syscall
#   perf       perf record -g on the daemon (user and kernel stacks), if perf works
#   callgrind  valgrind --tool=callgrind on the daemon; prints the top functions
#              by inclusive and self cost (callgrind_annotate)
# The daemon serves a fresh directory under /var/tmp; the loadgen runs
# --ops N requests (default 20000; callgrind is ~50x slower, use fewer).
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
TOOL=${1:?usage: profile.sh strace|callgrind WORKLOAD [options]}
WORKLOAD=${2:?usage: profile.sh strace|callgrind WORKLOAD [options]}
shift 2
DAEMON=volfsd
OPS=20000
QUEUES=1
OUT=$REPO/build/profile
while [[ $# -gt 0 ]]; do
	case "$1" in
	--daemon) DAEMON=${2:?}; shift ;;
	--ops) OPS=${2:?}; shift ;;
	--queues) QUEUES=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	*) echo "profile: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
LOADGEN=$REPO/target/release/volfsd-loadgen
case "$DAEMON" in
volfsd) BIN=$REPO/target/release/volfsd ;;
virtiofsd) BIN=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd") ;;
*) echo "profile: --daemon volfsd|virtiofsd" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
SHARE=/var/tmp/volfsd-profile/share
SOCK=/var/tmp/volfsd-profile/s.sock
mkdir -p "$SHARE"
rm -f "$SOCK"
TAG=$DAEMON-$WORKLOAD-$TOOL

# Prepare the files first without the tool, so only the workload is profiled.
dargs=(--socket-path="$SOCK" --shared-dir="$SHARE")
if [[ $DAEMON == volfsd ]]; then
	dargs+=(--cache=none --log-level=warn --num-request-queues="$QUEUES")
else
	dargs+=(--cache=never --log-level=warn)
fi
lg=("$LOADGEN" --socket "$SOCK" --shared-dir "$SHARE" --queues "$QUEUES" --qd 32
	--file-size 256M --files 10000 --workload "$WORKLOAD" --keep-files)
"$BIN" "${dargs[@]}" >/dev/null 2>&1 &
"${lg[@]}" --ops 1000 --quiet >/dev/null
wait
rm -f "$SOCK"

case "$TOOL" in
strace)
	strace -c -f -o "$OUT/$TAG.txt" "$BIN" "${dargs[@]}" >/dev/null 2>&1 &
	;;
callgrind)
	valgrind --tool=callgrind --callgrind-out-file="$OUT/$TAG.out" "$BIN" "${dargs[@]}" \
		>"$OUT/$TAG.valgrind.log" 2>&1 &
	;;
perf)
	"$BIN" "${dargs[@]}" >/dev/null 2>&1 &
	DPID=$!
	for _ in $(seq 500); do [[ -S $SOCK ]] && break; sleep 0.02; done
	perf record -g -o "$OUT/$TAG.data" -p "$DPID" >"$OUT/$TAG.perf.log" 2>&1 &
	sleep 0.5
	;;
*) echo "profile: tool must be strace, perf or callgrind" >&2; exit 2 ;;
esac
PID=$!
for _ in $(seq 3000); do [[ -S $SOCK ]] && break; sleep 0.02; done
"${lg[@]}" --ops "$OPS" --json "$OUT/$TAG.loadgen.json" | tee "$OUT/$TAG.loadgen.txt"
wait "$PID" || true
REQ=$(python3 -c 'import json,sys; print(sum(r["requests"] for r in json.load(open(sys.argv[1]))["results"]))' "$OUT/$TAG.loadgen.json")
echo "requests: $REQ"
if [[ $TOOL == perf ]]; then
	wait "$DPID" 2>/dev/null || true
	sleep 1
	perf report -i "$OUT/$TAG.data" --no-children --percent-limit 1.5 --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' >"$OUT/$TAG.report.txt"
	echo "top self cost (perf, user + kernel):"
	head -n 30 "$OUT/$TAG.report.txt"
elif [[ $TOOL == strace ]]; then
	echo "syscalls per request (workload requests only; setup adds a few):"
	awk -v n="$REQ" '$1 ~ /^[0-9.]+$/ && NF >= 5 {calls = $4; name = $NF; printf "  %-20s %10d calls  %6.2f per request  %s%% time\n", name, calls, calls / n, $1}' "$OUT/$TAG.txt" | sort -k2 -nr | head -n 15
else
	callgrind_annotate --inclusive=yes "$OUT/$TAG.out" 2>/dev/null | head -n 60 >"$OUT/$TAG.inclusive.txt"
	callgrind_annotate "$OUT/$TAG.out" 2>/dev/null | head -n 60 >"$OUT/$TAG.self.txt"
	echo "top self cost:"
	sed -n '1,45p' "$OUT/$TAG.self.txt"
fi
