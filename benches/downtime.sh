#!/usr/bin/env bash
# The device state's share of a migration's downtime, volfsd against virtiofsd 1.14:
# the state's size, and how long the source takes to save it and a fresh destination
# to load it, with the guest holding N nodes (N empty files in directories of 1,000,
# each looked up once). Each run is one migration of one daemon kind
# (target/release/volfsd-statebench run: QEMU's message sequence, SET_LOG_BASE and
# LOG_ALL, a precopy until the source is idle, the rings stopped, SAVE, LOAD); the
# two daemons alternate run by run (volfsd, virtiofsd, volfsd, ...), each repetition
# is a pair, and the ratio volfsd/virtiofsd is taken per pair. No speed is asserted.
#
# Usage: sudo benches/downtime.sh [options]
#   --nodes LIST       comma-separated node counts (default 1000,100000,1000000)
#   --reps N           pairs per node count (default 5)
#   --reps-large N     pairs at 1,000,000 nodes and more (default 3)
#   --config NAME      handles (default): both daemons keep nodes by file handle
#                      (--inode-file-handles prefer; virtiofsd's default), so a node
#                      costs no fd; fds: both keep an O_PATH fd per node (volfsd's
#                      default, virtiofsd --inode-file-handles=never), possible only
#                      below the hard RLIMIT_NOFILE
#   --precopy P        idle (default): the precopy lasts until the source has been idle
#                      (no CPU used, no thread running or waiting for the disk) for
#                      500 ms; or seconds (0: the save follows LOG_ALL at once)
#   --tree DIR         where the trees are made and kept (default /var/tmp/volfsd-downtime/tree)
#   --out DIR          default docs/bench-data/<date>-<commit>-downtime[-CONFIG]
#   --no-build         use the binaries as they are
#   --allow-busy       measure even if the machine is not quiet (and say so)
# Writes OUT/raw.jsonl (one line per run), OUT/cmd.txt, OUT/env.txt, OUT/logs/ (the
# daemons' logs) and OUT/summary.md (benches/downtime_report.py).
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VOLFSD=$REPO/target/release/volfsd
BENCH=$REPO/target/release/volfsd-statebench
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
NODES=1000,100000,1000000 REPS=5 REPS_LARGE=3 CONFIG=handles PRECOPY=idle
TREE=/var/tmp/volfsd-downtime/tree OUT="" BUILD=1 ALLOW_BUSY=0
WORK=/var/tmp/volfsd-downtime/work
ARGS="$*"

die() { echo "downtime: error: $*" >&2; exit 2; }
say() { echo "downtime: $*" >&2; }

while [[ $# -gt 0 ]]; do
	case "$1" in
	--nodes) NODES=${2:?}; shift ;;
	--reps) REPS=${2:?}; shift ;;
	--reps-large) REPS_LARGE=${2:?}; shift ;;
	--config) CONFIG=${2:?}; shift ;;
	--precopy) PRECOPY=${2:?}; shift ;;
	--tree) TREE=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--no-build) BUILD=0 ;;
	--allow-busy) ALLOW_BUSY=1 ;;
	-h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
[[ $(id -u) == 0 ]] || die "run as root (both daemons' namespace sandboxes need it)"
[[ -x $VIRTIOFSD ]] || die "virtiofsd not found (cargo install virtiofsd --version 1.14.0)"

case "$CONFIG" in
handles)
	VOLFSD_LINE="$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --migration-mode find-paths --inode-file-handles prefer"
	VIRTIOFSD_LINE="$VIRTIOFSD --socket-path {sock} --shared-dir {share} --cache never --migration-mode find-paths --inode-file-handles=prefer"
	;;
fds)
	VOLFSD_LINE="$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --migration-mode find-paths --inode-file-handles never"
	VIRTIOFSD_LINE="$VIRTIOFSD --socket-path {sock} --shared-dir {share} --cache never --migration-mode find-paths --inode-file-handles=never"
	hard=$(ulimit -Hn)
	for n in ${NODES//,/ }; do
		((n + n / 1000 + 600 < hard)) ||
			die "--config fds: $n nodes need an fd each, the hard RLIMIT_NOFILE is $hard (raising it needs CAP_SYS_RESOURCE)"
	done
	;;
*) die "--config handles|fds" ;;
esac

if [[ $BUILD == 1 ]]; then
	say "building"
	(cd "$REPO" && cargo build --release --workspace --bins --quiet) || die "cargo build failed"
fi
[[ -x $VOLFSD && -x $BENCH ]] || die "build first: cargo build --release --workspace --bins"

REV=$(git -C "$REPO" rev-parse --short HEAD)
suffix=downtime
[[ $CONFIG == handles ]] || suffix=downtime-$CONFIG
OUT=${OUT:-$REPO/docs/bench-data/$(date -u +%F)-$REV-$suffix}
mkdir -p "$OUT/logs" "$WORK" "$TREE"
rm -f "$WORK"/*.log "$WORK"/*.sock
: >"$OUT/raw.jsonl"
: >"$OUT/env.txt"
: >"$OUT/quiet.tsv"

# The trees first: making 1,000,000 files is disk work a measurement must not share.
for n in ${NODES//,/ }; do
	"$BENCH" tree --tree "$TREE" --nodes "$n"
done

QUIET_NAME=downtime
# shellcheck source=quiet-lib.sh
. "$HERE/quiet-lib.sh"
quiet_check

git_state=""
if git -C "$REPO" status --porcelain --untracked-files=no | grep -q .; then git_state=" (with uncommitted changes)"; fi
{
	echo "date: $(date -u +%FT%TZ)"
	echo "commit: $(git -C "$REPO" rev-parse HEAD)$git_state"
	echo "host_kernel: $(uname -r)"
	echo "cpu: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "cores: $(nproc)"
	echo "memory: $(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
	echo "tree: $TREE ($(df -T "$TREE" | awk 'NR == 2 {print $2 " on " $1}'))"
	echo "volfsd: $("$VOLFSD" --version 2>&1 | head -n 1)"
	echo "virtiofsd: $("$VIRTIOFSD" --version 2>&1 | head -n 1)"
	echo "rustc: $(rustc --version 2>/dev/null || echo '?')"
	echo "rlimit_nofile_hard: $(ulimit -Hn)"
	echo "fs.nr_open: $(cat /proc/sys/fs/nr_open)"
	echo "config: $CONFIG"
	echo "precopy: $PRECOPY"
	echo "nodes: $NODES"
	echo "reps: $REPS (at 1,000,000 nodes and more: $REPS_LARGE)"
} >>"$OUT/env.txt"
{
	echo "benches/downtime.sh $ARGS"
	echo "# each run:"
	echo "$BENCH run --name NAME --daemon LINE --tree $TREE --nodes N --rep R --precopy $PRECOPY --work $WORK --json $OUT/raw.jsonl"
	echo "# volfsd LINE:"
	echo "$VOLFSD_LINE"
	echo "# virtiofsd LINE:"
	echo "$VIRTIOFSD_LINE"
} >"$OUT/cmd.txt"

start=$(date +%s)
for n in ${NODES//,/ }; do
	reps=$REPS
	((n < 1000000)) || reps=$REPS_LARGE
	for rep in $(seq "$reps"); do
		for name in volfsd virtiofsd; do
			if [[ $name == volfsd ]]; then line=$VOLFSD_LINE; else line=$VIRTIOFSD_LINE; fi
			printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$name" "$rep" "$(load1)" "$(company)" >>"$OUT/quiet.tsv"
			"$BENCH" run --name "$name" --daemon "$line" --tree "$TREE" --nodes "$n" --rep "$rep" \
				--precopy "$PRECOPY" --work "$WORK" --json "$OUT/raw.jsonl" ||
				die "$name, $n nodes, rep $rep failed (logs: $WORK)"
			mv "$WORK"/*.log "$OUT/logs/"
		done
		say "$n nodes: pair $rep of $reps done ($(($(date +%s) - start)) s)"
	done
done
echo "total_runtime_s: $(($(date +%s) - start))" >>"$OUT/env.txt"

python3 "$HERE/downtime_report.py" "$OUT" >"$OUT/summary.md"
cat "$OUT/summary.md"
say "raw results in $OUT"
