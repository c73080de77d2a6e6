#!/usr/bin/env bash
# volfsd vs virtiofsd: one command that measures both sides in one run, keeps
# the raw results and writes docs/BENCHMARKS.md from them.
#
# Usage: benches/compare.sh [--quick] [--reps N] [options]
#   --quick            small sizes, 2 repetitions (a few minutes)
#   --reps N           repetitions of every load-generator configuration (default 5);
#                      each repetition runs every configuration once, in an order
#                      rotated (and reversed every other time) from the last
#   --fio-reps N       repetitions of every guest fio configuration (default 5)
#   --inodes N         inodes a frontend looks up and holds (default 1000000)
#   --density N        daemons started side by side, each with a connected
#                      frontend (default 100)
#   --duration S       seconds per loadgen workload (default 5)
#   --file-size SIZE   loadgen data file (default 1G)
#   --fio-runtime S    seconds per fio run in the guest (default 5)
#   --fio-size SIZE    fio data file (default 128M)
#   --meta-files N     files of the guest metadata loop (default 10000)
#   --work DIR         host directory shared with the daemons (default
#                      /var/tmp/volfsd-bench, on the disk, not tmpfs)
#   --out DIR          raw results (default build/bench)
#   --data DIR         where the small raw JSON is kept for the report (default
#                      docs/bench-data/<UTC date>-<commit>)
#   --doc FILE         report to write (default docs/BENCHMARKS.md)
#   --allow-busy       measure even if the machine is not quiet (the report says so)
#   --no-build         use the binaries as they are (target/release)
#   --volfsd BIN / --loadgen BIN / --virtiofsd BIN   binaries to use
#   --workloads LIST   loadgen workloads, comma-separated (default all); the floor
#                      runs the same ones
#   --configs LIST     loadgen configurations, comma-separated (default all six
#                      below)
#   --skip-loadgen / --skip-fio / --skip-footprint   leave parts out (footprint
#                      includes scale: start-up to INIT, held inodes, density)
#
# The matrix (load generator, 1 queue, QD 32, and the QD 1 workloads):
#   volfsd             its defaults: --sandbox namespace --seccomp kill
#   volfsd-open        --sandbox none --seccomp none
#   virtiofsd          its defaults: namespace sandbox, seccomp kill
#   virtiofsd-matched  --sandbox=none --seccomp=none --inode-file-handles=never
#   volfsd-q2          volfsd's defaults with 2 queues (its own row, never a ratio
#                      against a 1-queue daemon)
#   volfsd-fh          volfsd's defaults with --inode-file-handles prefer (nodes
#                      kept by file handle, as in virtiofsd's defaults)
# Guest fio: 1 queue against 1 queue at 1 and 2 vCPUs, and volfsd with 2 queues
# at 2 vCPUs as a separate row.
#
# Quiet machine: before it starts, the script waits (up to 2 minutes) for the
# 1-minute load average to fall under 1 and for no other QEMU, cargo, rustc or
# vhost-user daemon to run, and refuses to measure otherwise (exit 3) unless
# --allow-busy; before every run it records the load and any such process in
# quiet.tsv, and the report marks the runs that had company.
#
# Page cache: the loadgen read file is read once on the host before every
# run (warm for both daemons); fio lays its file out inside the guest before
# its read jobs. Both daemons run without caching in the guest (volfsd
# --cache none, virtiofsd --cache=never). Run as root.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)

REPS=5
FIO_REPS=5
INODES=1000000
DENSITY=100
ALLOW_BUSY=0
DATA=""
DURATION=5
FILE_SIZE=1G
FIO_RUNTIME=5
FIO_SIZE=128M
META_FILES=10000
WORK=/var/tmp/volfsd-bench
LG_WORKLOADS=all
LG_CONFIG_LIST=""
OUT=$REPO/build/bench
DOC=$REPO/docs/BENCHMARKS.md
BUILD=1
QUICK=0
VOLFSD=$REPO/target/release/volfsd
LOADGEN=$REPO/target/release/volfsd-loadgen
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
DO_LOADGEN=1
DO_FIO=1
DO_FOOTPRINT=1
ARGS="$*"

say() { echo "compare: $*" >&2; }
die() { echo "compare: error: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
	case "$1" in
	--quick) QUICK=1 ;;
	--reps) REPS=${2:?}; shift ;;
	--fio-reps) FIO_REPS=${2:?}; shift ;;
	--inodes) INODES=${2:?}; shift ;;
	--density) DENSITY=${2:?}; shift ;;
	--data) DATA=${2:?}; shift ;;
	--allow-busy) ALLOW_BUSY=1 ;;
	--duration) DURATION=${2:?}; shift ;;
	--file-size) FILE_SIZE=${2:?}; shift ;;
	--fio-runtime) FIO_RUNTIME=${2:?}; shift ;;
	--fio-size) FIO_SIZE=${2:?}; shift ;;
	--meta-files) META_FILES=${2:?}; shift ;;
	--work) WORK=${2:?}; shift ;;
	--workloads) LG_WORKLOADS=${2:?}; shift ;;
	--configs) LG_CONFIG_LIST=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--doc) DOC=${2:?}; shift ;;
	--no-build) BUILD=0 ;;
	--volfsd) VOLFSD=${2:?}; shift ;;
	--loadgen) LOADGEN=${2:?}; shift ;;
	--virtiofsd) VIRTIOFSD=${2:?}; shift ;;
	--skip-loadgen) DO_LOADGEN=0 ;;
	--skip-fio) DO_FIO=0 ;;
	--skip-footprint) DO_FOOTPRINT=0 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
if [[ $QUICK == 1 ]]; then
	REPS=2 FIO_REPS=1 INODES=20000 DENSITY=10 DURATION=2 FILE_SIZE=64M FIO_RUNTIME=2 FIO_SIZE=32M META_FILES=1000
fi
[[ $(id -u) == 0 ]] || die "run as root (the daemons and QEMU need it)"

if [[ $BUILD == 1 ]]; then
	say "building release binaries"
	(cd "$REPO" && cargo build --release --workspace --bins --quiet)
fi
for b in "$VOLFSD" "$LOADGEN" "$VIRTIOFSD"; do
	[[ -x $b ]] || die "$b is not an executable (virtiofsd: cargo install virtiofsd --locked)"
done
VOLFSD=$(readlink -f "$VOLFSD") LOADGEN=$(readlink -f "$LOADGEN") VIRTIOFSD=$(readlink -f "$VIRTIOFSD")

rm -rf "$OUT"
mkdir -p "$OUT"/{loadgen,fio} "$WORK"
SHARE=$WORK/share
mkdir -p "$SHARE"
T0=$SECONDS

# ---------------------------------------------------------------- environment
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "command: benches/compare.sh $ARGS"
	echo "host_kernel: $(uname -r)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
	echo "cores: $(nproc)"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	if grep -qwE 'vmx|svm' /proc/cpuinfo && [[ -w /dev/kvm ]]; then echo "accel: kvm"; else echo "accel: tcg (no hardware virtualization)"; fi
	echo "work_dir: $WORK ($(df -T "$WORK" | awk 'NR==2 {print $2 " on " $1}'))"
	echo "qemu: $(qemu-system-x86_64 --version | head -n1)"
	echo "virtiofsd: $("$VIRTIOFSD" --version 2>&1 | head -n1)"
	echo "volfsd: $("$VOLFSD" --version 2>&1 | head -n1) (git ${VOLFSD_REV:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet HEAD -- src Cargo.toml 2>/dev/null || echo ", work tree modified")})"
	echo "fio: $(fio --version)"
	echo "guest_kernel: $(cat "$REPO/build/guest/kernel-version" 2>/dev/null || echo "built on first VM run")"
	echo "rustc: $(rustc --version 2>/dev/null)"
	echo "commit: $(git -C "$REPO" rev-parse HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet HEAD -- src harness Cargo.toml 2>/dev/null || echo " (work tree modified)")"
	echo "reps: $REPS"
	echo "fio_reps: $FIO_REPS"
	echo "loadgen_duration_s: $DURATION"
	echo "loadgen_file_size: $FILE_SIZE"
	echo "fio_runtime_s: $FIO_RUNTIME"
	echo "fio_size: $FIO_SIZE"
	echo "meta_files: $META_FILES"
	echo "loadgen_workloads: $LG_WORKLOADS"
} >"$OUT/env.txt"

# ---------------------------------------------------------------- quiet machine
QUIET_NAME=compare
# shellcheck source=quiet-lib.sh
. "$HERE/quiet-lib.sh"
# note_run KIND NAME REP: the load and the company at the start of one run
note_run() {
	printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(load1)" "$(company)" >>"$OUT/quiet.tsv"
}

volfsd_cmd() { echo "$VOLFSD --socket-path $1 --shared-dir $2 --cache none --log-level warn $3"; }
virtiofsd_cmd() { echo "$VIRTIOFSD --socket-path=$1 --shared-dir=$2 --cache=never --log-level=warn $3"; }

# ---------------------------------------------------------------- loadgen
LOADGEN_CONFIGS=(volfsd volfsd-open virtiofsd virtiofsd-matched volfsd-q2 volfsd-fh)
if [[ -n $LG_CONFIG_LIST ]]; then
	IFS=, read -r -a LOADGEN_CONFIGS <<<"$LG_CONFIG_LIST"
fi

# loadgen_run NAME REP: one daemon on a fresh socket, every workload.
loadgen_run() {
	local name=$1 rep=$2 queues=1 sock="$WORK/$1.sock" pid rc=0 cmd
	rm -f "$sock"
	case "$name" in
	volfsd) cmd=$(volfsd_cmd "$sock" "$SHARE" "") ;;
	volfsd-open) cmd=$(volfsd_cmd "$sock" "$SHARE" "--sandbox none --seccomp none") ;;
	volfsd-q2) queues=2 cmd=$(volfsd_cmd "$sock" "$SHARE" "--num-request-queues 2") ;;
	volfsd-fh) cmd=$(volfsd_cmd "$sock" "$SHARE" "--inode-file-handles prefer") ;;
	virtiofsd) cmd=$(virtiofsd_cmd "$sock" "$SHARE" "") ;;
	virtiofsd-matched) cmd=$(virtiofsd_cmd "$sock" "$SHARE" "--sandbox=none --seccomp=none --inode-file-handles=never") ;;
	*) die "unknown configuration $name" ;;
	esac
	echo "$cmd" >"$OUT/loadgen/$name.cmd"
	note_run loadgen "$name" "$rep"
	# shellcheck disable=SC2086
	$cmd >"$OUT/loadgen/$name-rep$rep.daemon.log" 2>&1 &
	pid=$!
	local lg=("$LOADGEN" --socket "$sock" --shared-dir "$SHARE" --queues "$queues" --qd 32
		--duration "$DURATION" --file-size "$FILE_SIZE" --files 10000 --workload "$LG_WORKLOADS" --keep-files
		--json "$OUT/loadgen/$name-rep$rep.json" --daemon-pid "$pid")
	echo "${lg[*]}" | sed "s/--daemon-pid $pid/--daemon-pid PID/" >"$OUT/loadgen/$name.loadgen-cmd"
	"${lg[@]}" >"$OUT/loadgen/$name-rep$rep.txt" 2>&1 || rc=$?
	wait "$pid" || true
	if [[ $rc != 0 ]]; then
		tail -n 5 "$OUT/loadgen/$name-rep$rep.txt" >&2
		die "loadgen failed against $name (rep $rep)"
	fi
	say "loadgen $name rep $rep: $(awk 'NR>1 {printf "%s %s  ", $1, $2}' <(grep -v '^loadgen:' "$OUT/loadgen/$name-rep$rep.txt"))"
}

# rotated_order REP NAME...: the names rotated by REP, reversed on even REPs, so
# that no configuration always runs first or after the same neighbour.
rotated_order() {
	local rep=$1 n i out=()
	shift
	n=$#
	local names=("$@")
	for ((i = 0; i < n; i++)); do out+=("${names[$(((i + rep) % n))]}"); done
	if ((rep % 2 == 0)); then
		for ((i = n - 1; i >= 0; i--)); do echo "${out[$i]}"; done
	else
		printf '%s\n' "${out[@]}"
	fi
}

# floor_run REP: no daemon: each workload's host system calls in a tight loop on
# the same files (volfsd-loadgen --floor), once per repetition, in the rotation.
floor_run() {
	local rep=$1
	mkdir -p "$OUT/floor"
	local lg=("$LOADGEN" --floor --shared-dir "$SHARE" --duration "$DURATION" --file-size "$FILE_SIZE"
		--files 10000 --workload "$LG_WORKLOADS" --keep-files --json "$OUT/floor/floor-rep$rep.json")
	echo "${lg[*]}" >"$OUT/floor/floor.cmd"
	note_run loadgen floor "$rep"
	"${lg[@]}" >"$OUT/floor/floor-rep$rep.txt" 2>&1 || die "the floor failed (rep $rep): $(tail -n 2 "$OUT/floor/floor-rep$rep.txt")"
	say "floor rep $rep: $(awk 'NR>1 && !/^loadgen:/ {printf "%s %s  ", $1, $2}' "$OUT/floor/floor-rep$rep.txt")"
}

quiet_check
if [[ $DO_LOADGEN == 1 ]]; then
	for rep in $(seq "$REPS"); do
		for name in $(rotated_order "$rep" "${LOADGEN_CONFIGS[@]}" floor); do
			if [[ $name == floor ]]; then floor_run "$rep"; else loadgen_run "$name" "$rep"; fi
		done
	done
fi

# ---------------------------------------------------------------- seccomp per call
# (a full run's: a run of some workloads leaves it out)
if [[ $DO_LOADGEN == 1 && $LG_WORKLOADS == all ]]; then
	say "seccomp filter cost per system call (harness/benches/seccomp_cost.rs)"
	(cd "$REPO" && cargo bench --quiet -p volfsd-harness --bench seccomp_cost -- --json "$OUT/seccomp_cost.json") >&2
fi

# ---------------------------------------------------------------- footprint
if [[ $DO_FOOTPRINT == 1 ]]; then
	say "footprint and startup"
	python3 "$HERE/footprint.py" --loadgen "$LOADGEN" --share "$SHARE" --out "$OUT/footprint.json" \
		--startup-runs $((QUICK == 1 ? 5 : 30)) --reps "$REPS" --duration "$DURATION" \
		--daemon volfsd "$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --log-level warn" \
		--daemon virtiofsd "$VIRTIOFSD --socket-path={sock} --shared-dir={share} --cache=never --log-level=warn" >&2
fi
if [[ $DO_FOOTPRINT == 1 ]]; then
	say "scale: start-up to the first INIT reply, held inodes, density"
	python3 "$HERE/scale.py" --loadgen "$LOADGEN" --share "$SHARE" --out "$OUT/scale.json" \
		--startup-runs $((QUICK == 1 ? 5 : 20)) --inodes "$INODES" --density "$DENSITY" \
		--daemon volfsd "$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --log-level warn" \
		--daemon volfsd-fh "$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --log-level warn --inode-file-handles prefer" \
		--daemon virtiofsd "$VIRTIOFSD --socket-path={sock} --shared-dir={share} --cache=never --log-level=warn" \
		--daemon virtiofsd-matched "$VIRTIOFSD --socket-path={sock} --shared-dir={share} --cache=never --log-level=warn --sandbox=none --seccomp=none --inode-file-handles=never" >&2
fi
rm -rf "$SHARE/volfsd-loadgen"

# ---------------------------------------------------------------- fio
fio_params() { # fio_params DIR [MORE-ASSIGNMENTS]
	printf 'FIO_SIZE=%s\nFIO_RUNTIME=%s\nMETA_FILES=%s\n%s\n' "$FIO_SIZE" "$FIO_RUNTIME" "$META_FILES" "${2:-}" >"$1/.fio-params"
}

fio_vm() { # fio_vm NAME DAEMON QUEUES SMP REP [FIO-CPU]
	local name=$1 daemon=$2 queues=$3 smp=$4 rep=$5 cpu=${6:-} log="$OUT/fio/$1-rep$5"
	if [[ -n $cpu ]]; then
		# Queue locality: 4 KiB random reads, one job, pinned to one vCPU.
		log="$OUT/fio-locality/$name-rep$rep"
		fio_params "$SHARE" "FIO_JOBS=randread
FIO_NUMJOBS=1
META_FILES=20
FIO_EXTRA=--cpus_allowed=$cpu"
	else
		fio_params "$SHARE"
	fi
	local cmd=("$REPO/vm-tests/run-vm.sh" --daemon "$daemon" --suite fio --shared-dir "$SHARE"
		--queues "$queues" --smp "$smp" --mem 1G --host-hook none --timeout 1200 --log-dir "$log")
	echo "${cmd[*]}" >"$(dirname "$log")/$name.cmd"
	note_run fio "$name" "$rep"
	if ! "${cmd[@]}" >"$log.out" 2>&1; then
		tail -n 20 "$log.out" >&2
		die "fio guest run $name (rep $rep) failed"
	fi
	python3 "$HERE/report.py" --extract-fio "$log/serial.log" "$log.json"
	say "fio $name rep $rep: $(tail -n 1 "$log.out")"
}

# name daemon queues smp: 1 queue against 1 at 1 and 2 vCPUs; volfsd's 2 queues apart.
FIO_CONFIGS=("volfsd-q1-smp1 $VOLFSD 1 1" "virtiofsd-q1-smp1 $VIRTIOFSD 1 1"
	"volfsd-q1-smp2 $VOLFSD 1 2" "virtiofsd-q1-smp2 $VIRTIOFSD 1 2" "volfsd-q2-smp2 $VOLFSD 2 2")

if [[ $DO_FIO == 1 ]]; then
	say "fio natively on the host directory (ceiling)"
	mkdir -p "$OUT/fio/bin" "$WORK/native"
	gcc -O2 -o "$OUT/fio/bin/fsops" "$REPO/vm-tests/guest/fsops.c"
	fio_params "$WORK/native"
	PATH="$OUT/fio/bin:$PATH" FIO_HOST_DIR="$WORK/native" sh "$REPO/vm-tests/suites/fio.sh" >"$OUT/fio/host-rep1.out" 2>&1 ||
		die "native fio run failed"
	python3 "$HERE/report.py" --extract-fio "$OUT/fio/host-rep1.out" "$OUT/fio/host-rep1.json"
	echo "FIO_HOST_DIR=$WORK/native sh vm-tests/suites/fio.sh" >"$OUT/fio/host.cmd"
	n=${#FIO_CONFIGS[@]}
	for rep in $(seq "$FIO_REPS"); do
		for ((i = 0; i < n; i++)); do
			# rotated like the loadgen runs
			# shellcheck disable=SC2086
			fio_vm ${FIO_CONFIGS[$(((i + rep) % n))]} "$rep"
		done
	done
	# Why a second queue costs random reads at 2 vCPUs: the same 1-job randread
	# with fio pinned to the vCPU that takes the queue's interrupts or to the other.
	mkdir -p "$OUT/fio-locality"
	LOC_CONFIGS=("volfsd-q1-fio-cpu0 $VOLFSD 1 2 0" "volfsd-q1-fio-cpu1 $VOLFSD 1 2 1"
		"virtiofsd-q1-fio-cpu0 $VIRTIOFSD 1 2 0" "virtiofsd-q1-fio-cpu1 $VIRTIOFSD 1 2 1"
		"volfsd-q2-fio-cpu0 $VOLFSD 2 2 0")
	n=${#LOC_CONFIGS[@]}
	for rep in $(seq "$FIO_REPS"); do
		for ((i = 0; i < n; i++)); do
			# shellcheck disable=SC2086
			set -- ${LOC_CONFIGS[$(((i + rep) % n))]}
			fio_vm "$1" "$2" "$3" "$4" "$rep" "$5"
		done
	done
	rm -f "$SHARE/.fio-params"
fi

echo "total_runtime_s: $((SECONDS - T0))" >>"$OUT/env.txt"
echo "guest_kernel_used: $(cat "$REPO/build/guest/kernel-version" 2>/dev/null)" >>"$OUT/env.txt"
# The small raw results, kept in the repository: the report is generated from them.
REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
DATA=${DATA:-$REPO/docs/bench-data/$(date -u +%Y-%m-%d)-$REV}
# Absolute: the copy below runs from inside $OUT.
[[ $DATA == /* ]] || DATA=$PWD/$DATA
rm -rf "$DATA"
mkdir -p "$DATA"
(cd "$OUT" && find . \( -name '*.json' -o -name '*.cmd' -o -name '*.loadgen-cmd' -o -name env.txt -o -name quiet.tsv \) \
	-not -path './fio*/*-rep*/*' -print0 | xargs -0 cp --parents -t "$DATA")
# The separate measurements the page also shows (what a feature costs, per-volume
# QoS, idle daemons): the kept runs named in docs/bench-data/sections.txt, one
# "--ab DIR", "--qos DIR", "--idle DIR", ... per line (paths from the repository root).
SECTIONS=()
if [[ -f $REPO/docs/bench-data/sections.txt ]]; then
	while read -r opt dir; do
		[[ -z $opt || $opt == \#* ]] && continue
		SECTIONS+=("$opt" "$REPO/$dir")
	done <"$REPO/docs/bench-data/sections.txt"
fi
# The figures (benches/plots.py) go to docs/images; without matplotlib
# (tests/install-deps.sh installs it) the page keeps its tables only.
IMAGES=()
if python3 -c 'import matplotlib' 2>/dev/null; then
	IMAGES=(--images "$REPO/docs/images")
else
	say "matplotlib missing: the page without its figures (tests/install-deps.sh installs it)"
fi
python3 "$HERE/report.py" "$DATA" "${SECTIONS[@]}" "${IMAGES[@]}" >"$DOC"
say "wrote $DOC in $((SECONDS - T0)) s (raw results in $OUT, kept ones in ${DATA#"$REPO"/})"
