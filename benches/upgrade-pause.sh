#!/usr/bin/env bash
# The guest's pause in an upgrade of volfsd under a running guest (--upgradable,
# docs/UPGRADE.md), at N held nodes. One volfsd started with --upgradable holds N
# empty files in directories of 1,000, each looked up once through the harness's
# frontend (target/release/volfsd-statebench upgrade: the guest then holds
# N + N/1,000 nodes and the root); then K upgrades in a row by SIGHUP to the daemon
# (the binary is upgraded to itself: the state moves all the same; no control
# socket, with which the guest's root would hold only volumes). Each upgrade
# records the keeper's pause from its log line (steps 2-6 of docs/UPGRADE.md: the
# rings stopped, the old process's state saved, the new process set up and loaded,
# its rings started; whole ms, what `ctl upgrade` reports); the guest is idle
# meanwhile, and the upgrades are 1 s apart. After each, the new serving process
# must answer three of the guest's node ids with their inodes. No time is asserted.
# --probe: the guest also sends GETATTRs one after another during each upgrade (its
# own view of the pause: the slowest one; a request unanswered for 2 s counts as
# stalled, and the kick eventfd is written again).
#
# Usage: sudo benches/upgrade-pause.sh [options]
#   --nodes LIST       comma-separated node counts (default 1000,100000)
#   --upgrades K       upgrades per node count (default 20)
#   --probe            GETATTRs from the guest during each upgrade (see above)
#   --config NAME      handles (default): --inode-file-handles prefer (a node costs
#                      no fd, as in benches/downtime.sh); fds: an O_PATH fd per node
#                      (volfsd's default), possible only below the hard RLIMIT_NOFILE
#   --tree DIR         where the trees are made and kept (default /var/tmp/volfsd-downtime/tree)
#   --out DIR          default docs/bench-data/<date>-<commit>-upgrade-pause[-CONFIG]
#   --no-build         use the binaries as they are
#   --allow-busy       measure even if the machine is not quiet (and say so)
# Writes OUT/raw.jsonl (one line per upgrade), OUT/cmd.txt, OUT/env.txt,
# OUT/quiet.tsv, OUT/logs/ (the daemon's logs) and OUT/summary.md
# (benches/upgrade_report.py).
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VOLFSD=$REPO/target/release/volfsd
BENCH=$REPO/target/release/volfsd-statebench
NODES=1000,100000 UPGRADES=20 CONFIG=handles PROBE=()
TREE=/var/tmp/volfsd-downtime/tree OUT="" BUILD=1 ALLOW_BUSY=0
WORK=/var/tmp/volfsd-upgrade-pause/work
ARGS="$*"

die() { echo "upgrade-pause: error: $*" >&2; exit 2; }
say() { echo "upgrade-pause: $*" >&2; }

while [[ $# -gt 0 ]]; do
	case "$1" in
	--nodes) NODES=${2:?}; shift ;;
	--upgrades) UPGRADES=${2:?}; shift ;;
	--probe) PROBE=(--probe) ;;
	--config) CONFIG=${2:?}; shift ;;
	--tree) TREE=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--no-build) BUILD=0 ;;
	--allow-busy) ALLOW_BUSY=1 ;;
	-h | --help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
[[ $(id -u) == 0 ]] || die "run as root (volfsd's namespace sandbox needs it)"
case "$CONFIG" in
handles) DAEMON_ARGS="--inode-file-handles prefer" ;;
fds)
	DAEMON_ARGS="--inode-file-handles never"
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
suffix=upgrade-pause
[[ $CONFIG == handles ]] || suffix=upgrade-pause-$CONFIG
OUT=${OUT:-$REPO/docs/bench-data/$(date -u +%F)-$REV-$suffix}
mkdir -p "$OUT/logs" "$WORK" "$TREE"
rm -f "$WORK"/*.log "$WORK"/*.sock
: >"$OUT/raw.jsonl"
: >"$OUT/env.txt"
: >"$OUT/quiet.tsv"

# The trees first: making 100,000 files is disk work a measurement must not share.
for n in ${NODES//,/ }; do
	"$BENCH" tree --tree "$TREE" --nodes "$n"
done

QUIET_NAME=upgrade-pause
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
	echo "rustc: $(rustc --version 2>/dev/null || echo '?')"
	echo "rlimit_nofile_hard: $(ulimit -Hn)"
	echo "config: $CONFIG"
	echo "nodes: $NODES"
	echo "upgrades: $UPGRADES"
	echo "probe: ${PROBE[*]:-no}"
} >>"$OUT/env.txt"
{
	echo "benches/upgrade-pause.sh $ARGS"
	echo "# each node count:"
	echo "$BENCH upgrade --volfsd $VOLFSD --daemon-args='$DAEMON_ARGS' --tree $TREE --nodes N --upgrades $UPGRADES ${PROBE[*]} --work $WORK --json $OUT/raw.jsonl"
} >"$OUT/cmd.txt"

start=$(date +%s)
for n in ${NODES//,/ }; do
	printf '%s\t%s\t%s\n' "$n" "$(load1)" "$(company)" >>"$OUT/quiet.tsv"
	"$BENCH" upgrade --volfsd "$VOLFSD" --daemon-args="$DAEMON_ARGS" --tree "$TREE" --nodes "$n" \
		--upgrades "$UPGRADES" "${PROBE[@]}" --work "$WORK" --json "$OUT/raw.jsonl" ||
		die "$n nodes failed (logs: $WORK)"
	printf '%s\t%s\t%s\n' "$n" "$(load1)" "$(company)" >>"$OUT/quiet.tsv"
	mv "$WORK"/*.log "$OUT/logs/"
	say "$n nodes: $UPGRADES upgrades done ($(($(date +%s) - start)) s)"
done
echo "total_runtime_s: $(($(date +%s) - start))" >>"$OUT/env.txt"

python3 "$HERE/upgrade_report.py" "$OUT" >"$OUT/summary.md"
cat "$OUT/summary.md"
say "raw results in $OUT"
