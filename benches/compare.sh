#!/usr/bin/env bash
# volfsd vs virtiofsd: one command that measures both and writes docs/BENCHMARKS.md.
#
# Usage: benches/compare.sh [--quick] [--reps N] [options]
#   --quick            small sizes, 1 repetition (a few minutes)
#   --reps N           repetitions of every run (default 3), alternated A B A B
#   --confinement-reps N  extra alternated runs of volfsd with and without its
#                      confinement on the 4 KiB and metadata workloads (default 8)
#   --duration S       seconds per loadgen workload (default 5)
#   --file-size SIZE   loadgen data file (default 1G)
#   --fio-runtime S    seconds per fio run in the guest (default 5)
#   --fio-size SIZE    fio data file (default 128M)
#   --meta-files N     files of the guest metadata loop (default 10000)
#   --work DIR         host directory shared with the daemons (default
#                      /var/tmp/volfsd-bench, on the disk, not tmpfs)
#   --out DIR          raw results (default build/bench)
#   --doc FILE         report to write (default docs/BENCHMARKS.md)
#   --no-build         use the binaries as they are (target/release)
#   --volfsd BIN / --loadgen BIN / --virtiofsd BIN   binaries to use
#   --skip-loadgen / --skip-fio / --skip-footprint   leave parts out
#
# volfsd runs with its defaults (--sandbox namespace --seccomp kill), and on the
# load generator also with --sandbox none --seccomp none (volfsd-open-q1), to
# measure what confinement costs. virtiofsd runs with its defaults (its own
# namespace sandbox and seccomp filter).
#
# Page cache: the loadgen read file is read once on the host before every
# run (warm for both daemons); fio lays its file out inside the guest before
# its read jobs. Both daemons run without caching in the guest (volfsd
# --cache none, virtiofsd --cache=never). Run as root.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)

REPS=3
CONF_REPS=8
DURATION=5
FILE_SIZE=1G
FIO_RUNTIME=5
FIO_SIZE=128M
META_FILES=10000
WORK=/var/tmp/volfsd-bench
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
	--confinement-reps) CONF_REPS=${2:?}; shift ;;
	--duration) DURATION=${2:?}; shift ;;
	--file-size) FILE_SIZE=${2:?}; shift ;;
	--fio-runtime) FIO_RUNTIME=${2:?}; shift ;;
	--fio-size) FIO_SIZE=${2:?}; shift ;;
	--meta-files) META_FILES=${2:?}; shift ;;
	--work) WORK=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--doc) DOC=${2:?}; shift ;;
	--no-build) BUILD=0 ;;
	--volfsd) VOLFSD=${2:?}; shift ;;
	--loadgen) LOADGEN=${2:?}; shift ;;
	--virtiofsd) VIRTIOFSD=${2:?}; shift ;;
	--skip-loadgen) DO_LOADGEN=0 ;;
	--skip-fio) DO_FIO=0 ;;
	--skip-footprint) DO_FOOTPRINT=0 ;;
	-h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
if [[ $QUICK == 1 ]]; then
	REPS=1 CONF_REPS=2 DURATION=2 FILE_SIZE=64M FIO_RUNTIME=2 FIO_SIZE=32M META_FILES=1000
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
	echo "reps: $REPS"
	echo "loadgen_duration_s: $DURATION"
	echo "loadgen_file_size: $FILE_SIZE"
	echo "fio_runtime_s: $FIO_RUNTIME"
	echo "fio_size: $FIO_SIZE"
	echo "meta_files: $META_FILES"
} >"$OUT/env.txt"

volfsd_cmd() { echo "$VOLFSD --socket-path $1 --shared-dir $2 --cache none --log-level warn $3"; }
virtiofsd_cmd() { echo "$VIRTIOFSD --socket-path=$1 --shared-dir=$2 --cache=never --log-level=warn"; }

# ---------------------------------------------------------------- loadgen
# loadgen_run NAME QUEUES REP [WORKLOADS]: one daemon on a fresh socket, every
# workload (or the listed ones).
loadgen_run() {
	local name=$1 queues=$2 rep=$3 workloads=${4:-all} sock="$WORK/$1.sock" pid rc=0 cmd
	rm -f "$sock"
	case "$name" in
	# volfsd without its confinement: what the sandbox and the filters cost.
	volfsd-open* | confinement-off*) cmd=$(volfsd_cmd "$sock" "$SHARE" "--num-request-queues $queues --sandbox none --seccomp none") ;;
	volfsd* | confinement-on*) cmd=$(volfsd_cmd "$sock" "$SHARE" "--num-request-queues $queues") ;;
	virtiofsd*) cmd=$(virtiofsd_cmd "$sock" "$SHARE") ;;
	esac
	echo "$cmd" >"$OUT/loadgen/$name.cmd"
	# shellcheck disable=SC2086
	$cmd >"$OUT/loadgen/$name-rep$rep.daemon.log" 2>&1 &
	pid=$!
	local lg=("$LOADGEN" --socket "$sock" --shared-dir "$SHARE" --queues "$queues" --qd 32
		--duration "$DURATION" --file-size "$FILE_SIZE" --files 10000 --workload "$workloads" --keep-files
		--json "$OUT/loadgen/$name-rep$rep.json" --daemon-pid "$pid")
	echo "${lg[*]}" >"$OUT/loadgen/$name.loadgen-cmd"
	"${lg[@]}" >"$OUT/loadgen/$name-rep$rep.txt" 2>&1 || rc=$?
	wait "$pid" || true
	if [[ $rc != 0 ]]; then
		tail -n 5 "$OUT/loadgen/$name-rep$rep.txt" >&2
		die "loadgen failed against $name (rep $rep)"
	fi
	say "loadgen $name rep $rep: $(awk 'NR>1 {printf "%s %s  ", $1, $2}' <(grep -v '^loadgen:' "$OUT/loadgen/$name-rep$rep.txt"))"
}

if [[ $DO_LOADGEN == 1 ]]; then
	for rep in $(seq "$REPS"); do
		# The confined and unconfined volfsd swap places every repetition, so
		# that neither always runs right after the same neighbour.
		if ((rep % 2)); then first=volfsd-q1 second=volfsd-open-q1; else first=volfsd-open-q1 second=volfsd-q1; fi
		loadgen_run "$first" 1 "$rep"
		loadgen_run virtiofsd-q1 1 "$rep"
		loadgen_run "$second" 1 "$rep"
		loadgen_run volfsd-q2 2 "$rep"
	done
	# What confinement costs, with more repetitions than the rest: the difference
	# sought (a few %) is smaller than one run's noise on two shared cores.
	for rep in $(seq "$CONF_REPS"); do
		if ((rep % 2)); then pair=(confinement-on confinement-off); else pair=(confinement-off confinement-on); fi
		for name in "${pair[@]}"; do
			loadgen_run "$name" 1 "$rep" randread4k,randwrite4k,lookup,getattr,metadata
		done
	done
fi

# ---------------------------------------------------------------- seccomp per call
if [[ $DO_LOADGEN == 1 ]]; then
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
rm -rf "$SHARE/volfsd-loadgen"

# ---------------------------------------------------------------- fio
fio_params() { # fio_params DIR
	printf 'FIO_SIZE=%s\nFIO_RUNTIME=%s\nMETA_FILES=%s\n' "$FIO_SIZE" "$FIO_RUNTIME" "$META_FILES" >"$1/.fio-params"
}

fio_vm() { # fio_vm NAME DAEMON QUEUES SMP REP
	local name=$1 daemon=$2 queues=$3 smp=$4 rep=$5 log="$OUT/fio/$1-rep$5"
	fio_params "$SHARE"
	local cmd=("$REPO/vm-tests/run-vm.sh" --daemon "$daemon" --suite fio --shared-dir "$SHARE"
		--queues "$queues" --smp "$smp" --mem 1G --host-hook none --timeout 1200 --log-dir "$log")
	echo "${cmd[*]}" >"$OUT/fio/$name.cmd"
	if ! "${cmd[@]}" >"$log.out" 2>&1; then
		tail -n 20 "$log.out" >&2
		die "fio guest run $name (rep $rep) failed"
	fi
	say "fio $name rep $rep: $(tail -n 1 "$log.out")"
}

if [[ $DO_FIO == 1 ]]; then
	say "fio natively on the host directory (ceiling)"
	mkdir -p "$OUT/fio/bin" "$WORK/native"
	gcc -O2 -o "$OUT/fio/bin/fsops" "$REPO/vm-tests/guest/fsops.c"
	fio_params "$WORK/native"
	PATH="$OUT/fio/bin:$PATH" FIO_HOST_DIR="$WORK/native" sh "$REPO/vm-tests/suites/fio.sh" >"$OUT/fio/host-rep1.out" 2>&1 ||
		die "native fio run failed"
	echo "FIO_HOST_DIR=$WORK/native sh vm-tests/suites/fio.sh" >"$OUT/fio/host.cmd"
	for rep in $(seq "$REPS"); do
		fio_vm volfsd-q1 "$VOLFSD" 1 1 "$rep"
		fio_vm virtiofsd-q1 "$VIRTIOFSD" 1 1 "$rep"
		fio_vm volfsd-q2-smp2 "$VOLFSD" 2 2 "$rep"
		fio_vm virtiofsd-q1-smp2 "$VIRTIOFSD" 1 2 "$rep"
	done
	rm -f "$SHARE/.fio-params"
fi

echo "total_runtime_s: $((SECONDS - T0))" >>"$OUT/env.txt"
echo "guest_kernel_used: $(cat "$REPO/build/guest/kernel-version" 2>/dev/null)" >>"$OUT/env.txt"
python3 "$HERE/report.py" "$OUT" --notes "$HERE/profile-notes.md" --criterion "$REPO/target/criterion" >"$DOC"
say "wrote $DOC in $((SECONDS - T0)) s (raw results in $OUT)"
