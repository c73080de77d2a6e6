#!/usr/bin/env bash
# Per-volume QoS: two volumes a and b of one daemon loaded at once over ONE
# request queue (volfsd --num-request-queues 1, volfsd-loadgen --queues 1 --qd 16
# --volumes a,b: in-flight slot i works on volume i % 2, so a's and b's requests
# share the virtqueue), volume a limited, b never. Keeps the raw results and
# writes a markdown section from them (benches/qos_report.py).
#
# Usage: benches/qos.sh [--quick] [options]
#   --quick            2-second runs, 1 repetition, a 64M read file (a smoke run)
#   --reps N           repetitions of the whole matrix (default 3)
#   --duration S       seconds of each fixed-limit run (default 10; whole seconds)
#   --segment S        seconds of each part of the runtime-change run (default 3;
#                      whole seconds):
#                      1000 ops/s, PATCH to 200 ops/s, PATCH to no limit
#   --file-size SIZE   the randread4k file of each volume (default 256M)
#   --qd N             requests in flight on the queue, half per volume (default 16)
#   --work DIR         host directory shared with the daemon (default
#                      /var/tmp/volfsd-qos, on the disk, not tmpfs)
#   --out DIR          raw results (default build/qos)
#   --data DIR         where the raw results are kept for the report (default
#                      docs/bench-data/<UTC date>-<short commit>-qos)
#   --doc FILE         also write the markdown section to FILE (it is always
#                      written to DATA/qos.md and printed)
#   --allow-busy       measure even if the machine is not quiet (the report says so)
#   --no-build         use the binaries as they are
#   --volfsd BIN / --loadgen BIN   binaries to use (default: the release build)
#   --daemon-arg ARG   one more daemon argument (repeatable)
#
# The runs (each one daemon and one load generator; workloads getattr and
# randread4k, each in its own run):
#   base      no limits: each volume's rate, the reference for the ratios
#   alone     no limits, b only, at its half of the slots (--volumes b --qd QD/2):
#             b's rate with the same requests in flight and a's slots idle (with
#             a's requests waiting in the daemon, b's slots are all that is on the
#             queue, and a closed loop's rate depends on how many share a kick)
#   ops100    a: --allowed-dir a,ops_size=100,ops_refill_time_ms=100 (1000 ops/s,
#             a start burst of 100)
#   ops1000   a: ops_size=1000,ops_refill_time_ms=1000 (1000 ops/s, burst 1000)
#   patch     starts as ops100; after SEGMENT s, PATCH /volumes/a to
#             {"ops": {"size": 20, "refill_time_ms": 100}} (200 ops/s), after
#             2*SEGMENT s, PATCH {"rate_limiter": null}; each PATCH's send and reply
#             time (unix ms) is in patches.tsv, next to the load generator's
#             completions per 100 ms (unix ms)
#   bw        randread4k only, a: bw_size=1048576,bw_refill_time_ms=100 (10 MiB/s)
# /metrics (volfsd_qos_*) and GET /volumes/a are scraped at the start, around
# each PATCH and just before the end of every run; DATA keeps the /metrics scrapes
# at the end (whole) and around the PATCHes (without the latency histograms).
#
# Quiet machine: as benches/compare.sh, the script waits (up to 2 minutes) for the
# 1-minute load average to fall under 1 and for no other QEMU, cargo, rustc or
# vhost-user daemon to run, and refuses to measure otherwise (exit 3) unless
# --allow-busy; the load and any such process at the start of every run are in
# quiet.tsv, and the report marks the runs that had company.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}

REPS=3
DURATION=10
SEGMENT=3
FILE_SIZE=256M
FILES=1000
QD=16
WORK=/var/tmp/volfsd-qos
OUT=$REPO/build/qos
DATA=""
DOC=""
ALLOW_BUSY=0
BUILD=1
QUICK=0
VOLFSD=""
LOADGEN=""
DAEMON_ARGS=()
ARGS="$*"

say() { echo "qos: $*" >&2; }
die() {
	echo "qos: error: $*" >&2
	exit 2
}

while [[ $# -gt 0 ]]; do
	case "$1" in
	--quick) QUICK=1 ;;
	--reps) REPS=${2:?}; shift ;;
	--duration) DURATION=${2:?}; shift ;;
	--segment) SEGMENT=${2:?}; shift ;;
	--file-size) FILE_SIZE=${2:?}; shift ;;
	--qd) QD=${2:?}; shift ;;
	--work) WORK=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--data) DATA=${2:?}; shift ;;
	--doc) DOC=${2:?}; shift ;;
	--allow-busy) ALLOW_BUSY=1 ;;
	--no-build) BUILD=0 ;;
	--volfsd) VOLFSD=${2:?}; shift ;;
	--loadgen) LOADGEN=${2:?}; shift ;;
	--daemon-arg) DAEMON_ARGS+=("${2:?}"); shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
if [[ $QUICK == 1 ]]; then
	REPS=1 DURATION=2 SEGMENT=2 FILE_SIZE=64M
fi
for n in "$REPS" "$DURATION" "$SEGMENT" "$QD"; do
	[[ $n =~ ^[1-9][0-9]*$ ]] || die "--reps, --duration, --segment and --qd take whole numbers above 0 (got $n)"
done
((QD >= 2 && QD % 2 == 0)) || die "--qd must be even (half the slots per volume)"
((DURATION >= 2 && SEGMENT >= 2)) || die "--duration and --segment must be at least 2 s (the first second of a part is not counted)"
command -v curl >/dev/null || die "curl is needed (the control socket)"

if [[ $BUILD == 1 && ( -z $VOLFSD || -z $LOADGEN ) ]]; then
	say "building release binaries"
	(cd "$REPO" && cargo build --release --bin volfsd -p volfsd-harness --bins --quiet)
fi
VOLFSD=${VOLFSD:-$TARGET/release/volfsd}
LOADGEN=${LOADGEN:-$TARGET/release/volfsd-loadgen}
for b in "$VOLFSD" "$LOADGEN"; do
	[[ -x $b ]] || die "$b is not an executable"
done
VOLFSD=$(readlink -f "$VOLFSD") LOADGEN=$(readlink -f "$LOADGEN")
"$VOLFSD" --help | grep -q ops_refill_time_ms || die "$VOLFSD has no per-volume QoS (--allowed-dir ...,ops_size=N)"

rm -rf "$OUT"
mkdir -p "$OUT" "$WORK"
SHARE=$WORK/share
mkdir -p "$SHARE/a" "$SHARE/b"
T0=$SECONDS

# ---------------------------------------------------------------- environment
REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "command: benches/qos.sh $ARGS"
	echo "host_kernel: $(uname -r)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
	echo "cores: $(nproc)"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "work_dir: $WORK ($(df -T "$WORK" | awk 'NR==2 {print $2 " on " $1}'))"
	echo "volfsd: $("$VOLFSD" --version 2>&1 | head -n1) ($VOLFSD)"
	echo "commit: $(git -C "$REPO" rev-parse HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet HEAD -- src harness Cargo.toml 2>/dev/null || echo " (work tree modified)")"
	echo "rustc: $(rustc --version 2>/dev/null)"
	echo "reps: $REPS"
	echo "duration_s: $DURATION"
	echo "segment_s: $SEGMENT"
	echo "file_size: $FILE_SIZE"
	echo "files: $FILES"
	echo "qd: $QD"
	echo "daemon_args: ${DAEMON_ARGS[*]:-}"
} >"$OUT/env.txt"

# ---------------------------------------------------------------- quiet machine
QUIET_NAME=qos
# shellcheck source=quiet-lib.sh
. "$HERE/quiet-lib.sh"
note_run() { # note_run NAME REP
	printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$(load1)" "$(company)" >>"$OUT/quiet.tsv"
}

# ---------------------------------------------------------------- one run
now_ms() { date +%s%3N; }
sleep_until_ms() { # sleep_until_ms T
	local left=$(($1 - $(now_ms)))
	if ((left > 0)); then sleep "$(awk -v l="$left" 'BEGIN {printf "%.3f", l / 1000}')"; fi
}
ctl() { # ctl CURL-ARGS...: a request on the control socket
	curl -sS --max-time 5 --unix-socket "$CTL" "$@"
}
scrape() { # scrape RUN LABEL: /metrics and GET /volumes/a
	ctl -o "$OUT/$1.metrics-$2.txt" http://localhost/metrics || echo "qos: scrape $1 $2 failed" >&2
	ctl -o "$OUT/$1.volume-a-$2.json" http://localhost/volumes/a || true
}
patch_a() { # patch_a RUN LABEL BODY: PATCH /volumes/a, its times in patches.tsv
	local t0 t1 code
	scrape "$1" "before-$2"
	t0=$(now_ms)
	code=$(ctl -o "$OUT/$1.patch-$2.json" -w '%{http_code}' -X PATCH http://localhost/volumes/a -d "$3") || code=000
	t1=$(now_ms)
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$t0" "$t1" "$code" "$3" >>"$OUT/patches.tsv"
	[[ $code == 200 ]] || die "$1: PATCH $2 answered $code: $(cat "$OUT/$1.patch-$2.json" 2>/dev/null)"
	scrape "$1" "after-$2"
}

# A run that fails leaves no daemon or load generator behind (only these pids).
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

PATCH_200='{"rate_limiter": {"ops": {"size": 20, "one_time_burst": 0, "refill_time_ms": 100}, "bandwidth": null}}'
PATCH_NONE='{"rate_limiter": null}'

# run_one KIND WORKLOAD REP SECONDS A-LIMITS [VOLUMES QD]: one daemon (a with
# A-LIMITS, "" for none), the load generator on VOLUMES (default a,b at --qd QD);
# the patch kind PATCHes while it runs.
run_one() {
	local kind=$1 wl=$2 rep=$3 secs=$4 alim=$5 vols=${6:-a,b} qd=${7:-$QD}
	local run="$kind-$wl-rep$rep" sock="$WORK/fs.sock" lg_pid d_pid start rc=0 line
	CTL="$WORK/ctl.sock"
	rm -f "$sock" "$CTL"
	local d=("$VOLFSD" --socket-path "$sock" --shared-dir "$SHARE" --allowed-dir "a$alim" --allowed-dir b
		--num-request-queues 1 --control-socket "$CTL" --cache none --log-level warn "${DAEMON_ARGS[@]}")
	echo "${d[*]}" >"$OUT/$kind-$wl.cmd"
	note_run "$run" "$rep"
	"${d[@]}" >"$OUT/$run.daemon.log" 2>&1 &
	d_pid=$!
	PIDS=("$d_pid")
	for _ in $(seq 200); do
		[[ -S $sock && -S $CTL ]] && break
		kill -0 "$d_pid" 2>/dev/null || die "$run: the daemon exited: $(tail -n 3 "$OUT/$run.daemon.log")"
		sleep 0.05
	done
	[[ -S $sock && -S $CTL ]] || die "$run: no sockets after 10 s"
	local lg=("$LOADGEN" --socket "$sock" --shared-dir "$SHARE" --volumes "$vols" --queues 1 --qd "$qd"
		--workload "$wl" --duration "$secs" --file-size "$FILE_SIZE" --files "$FILES" --keep-files
		--json "$OUT/$run.json")
	echo "${lg[*]}" >"$OUT/$kind-$wl.loadgen-cmd"
	"${lg[@]}" >"$OUT/$run.txt" 2>"$OUT/$run.loadgen.log" &
	lg_pid=$!
	PIDS=("$lg_pid" "$d_pid")
	# The timed part's start, as the load generator's series count it.
	start=""
	for _ in $(seq 2400); do
		line=$(grep -m1 -o 'START [a-z0-9]* unix_ms=[0-9]*' "$OUT/$run.loadgen.log" || true)
		if [[ -n $line ]]; then
			start=${line##*=}
			break
		fi
		kill -0 "$lg_pid" 2>/dev/null || break
		sleep 0.05
	done
	if [[ -z $start ]]; then
		die "$run: the load generator did not start its workload: $(tail -n 3 "$OUT/$run.loadgen.log")"
	fi
	scrape "$run" start
	if [[ $kind == patch ]]; then
		sleep_until_ms $((start + SEGMENT * 1000))
		patch_a "$run" to200 "$PATCH_200"
		sleep_until_ms $((start + 2 * SEGMENT * 1000))
		patch_a "$run" unlimited "$PATCH_NONE"
	fi
	sleep_until_ms $((start + secs * 1000 - 400))
	scrape "$run" end
	wait "$lg_pid" || rc=$?
	wait "$d_pid" || true
	PIDS=()
	if [[ $rc != 0 ]]; then
		tail -n 5 "$OUT/$run.loadgen.log" >&2
		die "$run: the load generator failed (exit $rc)"
	fi
	say "$run: $(awk '$2 == "a" || $2 == "b" {printf "%s %s ops/s %s MiB/s  ", $2, $4, $5}' "$OUT/$run.txt")"
}

quiet_check
for rep in $(seq "$REPS"); do
	for wl in getattr randread4k; do
		run_one base "$wl" "$rep" "$DURATION" ""
		run_one alone "$wl" "$rep" "$DURATION" "" b $((QD / 2))
		run_one ops100 "$wl" "$rep" "$DURATION" ",ops_size=100,ops_refill_time_ms=100"
		run_one ops1000 "$wl" "$rep" "$DURATION" ",ops_size=1000,ops_refill_time_ms=1000"
		run_one patch "$wl" "$rep" $((3 * SEGMENT)) ",ops_size=100,ops_refill_time_ms=100"
	done
	run_one bw randread4k "$rep" "$DURATION" ",bw_size=1048576,bw_refill_time_ms=100"
done
rm -rf "$SHARE/a/volfsd-loadgen" "$SHARE/b/volfsd-loadgen"
echo "total_runtime_s: $((SECONDS - T0))" >>"$OUT/env.txt"

# ---------------------------------------------------------------- keep and report
DATA=${DATA:-$REPO/docs/bench-data/$(date -u +%Y-%m-%d)-$REV-qos}
rm -rf "$DATA"
mkdir -p "$DATA"
(cd "$OUT" && cp -t "$DATA" env.txt quiet.tsv patches.tsv ./*.cmd ./*.loadgen-cmd ./*.metrics-end.txt ./*.patch-*.json)
# The scrapes around each PATCH without the latency histograms (those at the
# start stay in OUT).
for f in "$OUT"/*.metrics-*.txt; do
	case "$f" in *.metrics-end.txt | *.metrics-start.txt) continue ;; esac
	grep -v '^volfsd_request_duration_seconds_bucket' "$f" >"$DATA/$(basename "$f")" || true
done
# The load generator's reports, one line each (the same JSON, without the indentation).
for f in "$OUT"/*-rep*.json; do
	case "$f" in *.volume-a-*.json | *.patch-*.json) continue ;; esac
	python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1])), open(sys.argv[2], "w"), separators=(",", ":"))' "$f" "$DATA/$(basename "$f")"
done
python3 "$HERE/qos_report.py" "$DATA" >"$DATA/qos.md"
if [[ -n $DOC ]]; then cp "$DATA/qos.md" "$DOC"; fi
cat "$DATA/qos.md"
say "wrote ${DATA#"$REPO"/}/qos.md in $((SECONDS - T0)) s (raw results in $OUT)"
