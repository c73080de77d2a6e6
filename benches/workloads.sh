#!/usr/bin/env bash
# The workloads developers run in a sandbox, in a guest, volfsd against virtiofsd
# in one run on the same share: the workloads VM suite (vm-tests/suites/
# workloads.sh: untar, find+stat, git add/commit, git status, an npm-style storm,
# SQLite transactions, rm -rf), run in alternated pairs. Keeps the raw results
# and the exact commands; benches/workloads_report.py turns them into a section
# (benches/report.py --workloads DIR).
#
# Usage: benches/workloads.sh [options]
#   --pairs N          pairs of runs (default 3); pair i runs volfsd first when i
#                      is odd, virtiofsd first when it is even
#   --files N          files of the source tree (default 50000, the full size)
#   --packages K       npm packages of the storm (default 461, the whole lock)
#   --tx T --rows R    SQLite transactions and inserts per transaction (100, 100)
#   --ci-size          the CI suite's sizes (500 files, 15 packages, 5 x 20)
#   --smp N --mem SIZE guest vCPUs and memory, the same for both (default 1, 2G)
#   --timeout S        bound on one guest run (default 14400)
#   --work DIR         host directory holding the share, on the disk, not tmpfs
#                      (default /var/tmp/volfsd-workloads); emptied before each run
#   --data DIR         where the raw results are kept (default
#                      docs/bench-data/<UTC date>-<short commit>-workloads)
#   --volfsd BIN --virtiofsd BIN   daemons (default target/release/volfsd, and
#                      virtiofsd on PATH or ~/.cargo/bin/virtiofsd)
#   --allow-busy       measure even if the machine is not quiet (marked in env.txt)
#
# What differs between the two sides: only the daemon. Both with their defaults
# (volfsd: --cache none, its namespace sandbox and seccomp; virtiofsd: its
# namespace sandbox and seccomp) and guest caching off (volfsd --cache none,
# virtiofsd --cache=never), one request queue each (virtiofsd serves only one),
# the same guest (QEMU, TCG here, --smp/--mem), inputs and share directory.
#
# Kept per run in DATA/runs/: pairI-SIDE.json (the guest's wall time, the
# daemon's and QEMU's CPU time per workload, the checks), .cmd (the exact
# command), .txt (run-vm.sh's output), .samples (the hook's CPU samples),
# .serial (the guest's VMTEST lines). DATA/env.txt: commit, kernels, QEMU and
# daemon versions, the guest's tools, the inputs, load averages; quiet.tsv: the
# load and any other QEMU, cargo or daemon at the start of every run.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)

PAIRS=3
FILES=50000
PACKAGES=461
TX=100
ROWS=100
SMP=1
MEM=2G
TIMEOUT=14400
WORK=/var/tmp/volfsd-workloads
DATA=""
VOLFSD=$REPO/target/release/volfsd
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
# shellcheck disable=SC2034 # ALLOW_BUSY, QUIET_NAME and OUT are quiet-lib.sh's
ALLOW_BUSY=0
# shellcheck disable=SC2034
QUIET_NAME=workloads
ARGS="$*"

say() { echo "workloads: $*"; }
die() { echo "workloads: error: $*" >&2; exit 2; }

# shellcheck disable=SC2034 # ALLOW_BUSY is quiet-lib.sh's
parse_args() {
	while [[ $# -gt 0 ]]; do
		case "$1" in
		--pairs) PAIRS=${2:?}; shift ;;
		--files) FILES=${2:?}; shift ;;
		--packages) PACKAGES=${2:?}; shift ;;
		--tx) TX=${2:?}; shift ;;
		--rows) ROWS=${2:?}; shift ;;
		--ci-size) FILES=500 PACKAGES=15 TX=5 ROWS=20 ;;
		--smp) SMP=${2:?}; shift ;;
		--mem) MEM=${2:?}; shift ;;
		--timeout) TIMEOUT=${2:?}; shift ;;
		--work) WORK=${2:?}; shift ;;
		--data) DATA=${2:?}; shift ;;
		--volfsd) VOLFSD=${2:?}; shift ;;
		--virtiofsd) VIRTIOFSD=${2:?}; shift ;;
		--allow-busy) ALLOW_BUSY=1 ;;
		-h | --help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
		*) die "unknown option: $1 (--help lists them)" ;;
		esac
		shift
	done
	local n
	for n in PAIRS FILES PACKAGES TX ROWS SMP TIMEOUT; do
		[[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "--${n,,} must be a positive number"
	done
	[[ -x $VOLFSD ]] || die "no volfsd binary at $VOLFSD (cargo build --release, or --volfsd)"
	[[ -x $VIRTIOFSD ]] || die "no virtiofsd binary at $VIRTIOFSD (--virtiofsd)"
	VOLFSD=$(readlink -f "$VOLFSD") VIRTIOFSD=$(readlink -f "$VIRTIOFSD")
	[[ $(id -u) == 0 ]] || die "run as root (QEMU, the daemons' sandboxes, apt)"
	if [[ -z $DATA ]]; then
		DATA=$REPO/docs/bench-data/$(date -u +%F)-$(git -C "$REPO" rev-parse --short HEAD)-workloads
	fi
}

# shellcheck source=quiet-lib.sh
. "$HERE/quiet-lib.sh"

pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "?"; }

record_env() {
	{
		echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "command: benches/workloads.sh $ARGS"
		echo "commit: $(git -C "$REPO" rev-parse HEAD)$(git -C "$REPO" diff --quiet HEAD -- vm-tests benches 2>/dev/null || echo " (work tree modified)")"
		echo "host_kernel: $(uname -r)"
		echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
		echo "cores: $(nproc)"
		echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
		if grep -qwE 'vmx|svm' /proc/cpuinfo && [[ -w /dev/kvm ]]; then echo "accel: kvm"; else echo "accel: tcg (no hardware virtualization)"; fi
		echo "work_dir: $WORK ($(df -T "$WORK" | awk 'NR==2 {print $2 " on " $1}'))"
		echo "qemu: $(qemu-system-x86_64 --version | head -n1)"
		echo "volfsd: $VOLFSD, $("$VOLFSD" --version 2>&1 | head -n1)"
		echo "virtiofsd: $VIRTIOFSD, $("$VIRTIOFSD" --version 2>&1 | head -n1)"
		echo "guest_kernel: $(cat "$REPO/build/guest/kernel-version")"
		echo "guest_tools: git $(pkg_version git), sqlite3 $(pkg_version sqlite3), GNU tar $(pkg_version tar), busybox $(pkg_version busybox-static)"
		echo "guest: QEMU q35, $SMP vCPU(s), $MEM, 1 request queue, queue size 1024"
		echo "sizes: files $FILES, packages $PACKAGES, sqlite $TX x $ROWS"
		echo "pairs: $PAIRS"
		echo "load_at_start: $(cut -d' ' -f1-3 /proc/loadavg)"
	} >"$DATA/env.txt"
}

# One run of the suite against DAEMON; its results into DATA/runs/NAME.*.
one_run() { # one_run PAIR SIDE DAEMON
	local pair=$1 side=$2 daemon=$3 name="pair$1-$2" logs="$REPO/build/bench-workloads/pair$1-$2" rc=0
	local -a cmd
	# The share is emptied, not recreated: the same directory on the same disk.
	find "$SHARE" -mindepth 1 -delete
	sync
	echo -e "$pair\t$side\t$(load1)\t$(company)" >>"$DATA/quiet.tsv"
	cmd=(env VMTEST_WORKLOADS_FILES="$FILES" VMTEST_WORKLOADS_PACKAGES="$PACKAGES"
		VMTEST_WORKLOADS_TX="$TX" VMTEST_WORKLOADS_ROWS="$ROWS"
		"$REPO/vm-tests/run-vm.sh" --prebuilt-guest --daemon "$daemon" --suite workloads
		--shared-dir "$SHARE" --queues 1 --smp "$SMP" --mem "$MEM" --timeout "$TIMEOUT"
		--log-dir "$logs")
	printf '%q ' "${cmd[@]}" >"$DATA/runs/$name.cmd"
	echo >>"$DATA/runs/$name.cmd"
	say "pair $pair, $side: $(basename "$daemon")"
	"${cmd[@]}" >"$DATA/runs/$name.txt" 2>&1 || rc=$?
	tail -n 1 "$DATA/runs/$name.txt"
	cp "$logs/workloads-samples.txt" "$DATA/runs/$name.samples" 2>/dev/null || true
	tr -d '\r' <"$logs/serial.log" | grep -a '^VMTEST ' >"$DATA/runs/$name.serial" || true
	[[ -f $logs/workloads-inputs.txt && ! -f $DATA/inputs.txt ]] && cp "$logs/workloads-inputs.txt" "$DATA/inputs.txt"
	python3 "$HERE/workloads_report.py" --collect "$logs" --pair "$pair" --side "$side" \
		--daemon "$daemon" --status "$rc" >"$DATA/runs/$name.json"
}

main() {
	parse_args "$@"
	mkdir -p "$DATA/runs" "$WORK"
	# shellcheck disable=SC2034 # quiet-lib appends its verdict to $OUT/env.txt
	OUT=$DATA
	SHARE=$WORK/share
	mkdir -p "$SHARE"
	# The guest and the inputs first, so that no run pays for them.
	"$REPO/vm-tests/build-guest.sh" --without-pjdfstest --quiet >/dev/null
	python3 "$REPO/vm-tests/workloads-inputs.py" \
		--files "$FILES" --packages "$PACKAGES" --tx "$TX" --rows "$ROWS" >/dev/null
	record_env
	quiet_check
	echo -e "pair\tside\tload1\tcompany" >"$DATA/quiet.tsv"
	local t0=$SECONDS i
	for i in $(seq "$PAIRS"); do
		if ((i % 2 == 1)); then
			one_run "$i" volfsd "$VOLFSD"
			one_run "$i" virtiofsd "$VIRTIOFSD"
		else
			one_run "$i" virtiofsd "$VIRTIOFSD"
			one_run "$i" volfsd "$VOLFSD"
		fi
	done
	find "$SHARE" -mindepth 1 -delete
	{
		echo "total_runtime_s: $((SECONDS - t0))"
		echo "load_at_end: $(cut -d' ' -f1-3 /proc/loadavg)"
	} >>"$DATA/env.txt"
	say "raw results in $DATA"
	python3 "$HERE/workloads_report.py" "$DATA"
}

main "$@"
