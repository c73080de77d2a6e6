#!/usr/bin/env bash
# Two sandboxes on one volume, as a platform shares a volume between sandboxes:
# two QEMU guests boot at once, each with its own volfsd, on one volume. Sandbox
# A has it read-write (--allowed-dir vol), sandbox B read-only (vol:ro). Guest
# suites pair-a.sh and pair-b.sh: B sees A's writes at once, renames are never
# torn, B's writes fail with EROFS, locks conflict across the two daemons, a
# blocked F_SETLKW in B wakes when A unlocks, A's msynced shared-map writes
# reach B, and A's locks go when A's QEMU is killed.
#
# Each side runs in its own mount namespace and mounts the volume there, at
# SHARE/vol, as each node's volume plugin would:
#   --backend local    a host directory, bind-mounted into both (default)
#   --backend juicefs  one JuiceFS volume (Redis metadata on a unix socket,
#                      local object storage), mounted twice: two clients, as
#                      two nodes would mount it. Each client mounts with
#                      --juicefs-opts (default "--attr-cache 0 --entry-cache 0
#                      --dir-entry-cache 0": JuiceFS's default 1 s metadata
#                      caches let a client open a name another client has just
#                      renamed over, see docs/BACKENDS.md)
#
# Usage: vm-tests/run-pair.sh [--backend local|juicefs] [--juicefs-opts "..."]
#          [--daemon PATH] [--daemon-args "..."] [--log-dir DIR]
#          [--timeout SECS] [--keep]
# Needs root (mount namespaces and mounts). Ends with "N passed, N failed" over
# both sides; exit 0 only if nothing failed.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)

log() { echo "run-pair: $*" >&2; }
die() { log "error: $*"; exit 2; }

# ---------------------------------------------------------------- one side
# Re-invoked by the pair in a private mount namespace, with PAIR_SIDE=a|b.
run_side() {
	local s=$PAIR_SIDE ro="" share=$PAIR_WORK/share-$PAIR_SIDE rc=0
	[[ $s == b ]] && ro=:ro
	mkdir -p "$share/vol"
	if [[ $PAIR_BACKEND == juicefs ]]; then
		WORK=$PAIR_WORK
		# shellcheck source=backend-lib.sh
		. "$HERE/backend-lib.sh"
		JUICEFS_META=$PAIR_JUICEFS_META JUICEFS_MOUNT_OPTS=$PAIR_JUICEFS_OPTS
		juicefs_mount "$share/vol" "$PAIR_WORK/juicefs-$s.log"
		log "side $s: JuiceFS client mounted on $share/vol in mount namespace $(readlink /proc/self/ns/mnt)"
	else
		mount --bind "$PAIR_WORK/volume" "$share/vol"
	fi
	mkdir -p "$share/vol/.pair"
	# In the background, so that a TERM to this side reaches run-vm.sh (which
	# then stops its QEMU and volfsd) before the volume is unmounted.
	"$HERE/run-vm.sh" --vmm qemu --suite "pair-$s" --prebuilt-guest --host-hook none \
		--shared-dir "$share" --daemon "$PAIR_DAEMON" \
		--daemon-args "--allowed-dir vol$ro $PAIR_DAEMON_ARGS" \
		--log-dir "$PAIR_LOG_DIR/$s" --timeout "$PAIR_TIMEOUT" &
	local vm=$!
	trap 'kill -TERM $vm 2>/dev/null' TERM INT
	wait $vm || rc=$?
	# A TERM interrupts the first wait; wait again for run-vm.sh's own cleanup.
	while kill -0 $vm 2>/dev/null; do wait $vm || rc=$?; done
	if [[ $PAIR_BACKEND == juicefs ]]; then
		juicefs_umount "$share/vol"
	else
		umount "$share/vol" 2>/dev/null || umount -l "$share/vol"
	fi
	exit $rc
}
[[ -z ${PAIR_SIDE:-} ]] || run_side

# ---------------------------------------------------------------- the pair
BACKEND=local
DAEMON=$REPO/target/release/volfsd
DAEMON_ARGS=""
LOG_DIR=$REPO/build/vm-logs/pair
TIMEOUT=900
KEEP=0
JUICEFS_OPTS="--attr-cache 0 --entry-cache 0 --dir-entry-cache 0"
while [[ $# -gt 0 ]]; do
	case "$1" in
	--backend) BACKEND=${2:?}; shift ;;
	--daemon) DAEMON=${2:?}; shift ;;
	--daemon-args) DAEMON_ARGS=${2?}; shift ;;
	--juicefs-opts) JUICEFS_OPTS=${2?}; shift ;;
	--log-dir) LOG_DIR=${2:?}; shift ;;
	--timeout) TIMEOUT=${2:?}; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option: $1" ;;
	esac
	shift
done
case $BACKEND in local | juicefs) ;; *) die "--backend must be local or juicefs" ;; esac
[[ $EUID == 0 ]] || die "needs root: each side mounts the volume in its own mount namespace"
[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not an executable (cargo build --release)"
DAEMON=$(readlink -f "$DAEMON")
mkdir -p "$LOG_DIR"
LOG_DIR=$(readlink -f "$LOG_DIR")

WORK=$(mktemp -d /var/tmp/volfsd-pair.XXXXXX)
SIDE_PIDS=()
cleanup() {
	local p
	for p in "${SIDE_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[[ $BACKEND != juicefs ]] || juicefs_stop
	if [[ $KEEP == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=backend-lib.sh
. "$HERE/backend-lib.sh"
"$HERE/build-guest.sh" --quiet >/dev/null
mkdir -p "$WORK/volume"
JUICEFS_META=""
if [[ $BACKEND == juicefs ]]; then
	juicefs_volume
	log "JuiceFS $(juicefs --version | awk '{print $3}') volume on Redis $WORK/redis.sock; each side mounts its own client (options: ${JUICEFS_OPTS:-none})"
fi

# The guests learn the backend from their kernel command line (run-vm.sh).
[[ $BACKEND == local ]] || export VMTEST_BACKEND=$BACKEND
export PAIR_WORK=$WORK PAIR_BACKEND=$BACKEND PAIR_JUICEFS_META=$JUICEFS_META PAIR_JUICEFS_OPTS=$JUICEFS_OPTS PAIR_DAEMON=$DAEMON \
	PAIR_DAEMON_ARGS=$DAEMON_ARGS PAIR_LOG_DIR=$LOG_DIR PAIR_TIMEOUT=$TIMEOUT
t0=$SECONDS
for s in a b; do
	# stdout kept per side (for the counts) and shown live with the side's name.
	PAIR_SIDE=$s unshare --mount --propagation private -- "$0" \
		> >(tee "$LOG_DIR/$s.out" | sed -u "s/^/[$s] /") 2>&1 &
	SIDE_PIDS+=($!)
done
rc_a=0 rc_b=0
wait "${SIDE_PIDS[0]}" || rc_a=$?
wait "${SIDE_PIDS[1]}" || rc_b=$?
SIDE_PIDS=()
sleep 0.5 # let the tee of each side finish its file

passed=0 failed=0
for s in a b; do
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$LOG_DIR/$s.out" | tail -n 1 || true)
	if [[ -z $line ]]; then
		echo "VMTEST FAIL side-$s: run-vm.sh gave no result line (see $LOG_DIR/$s.out)"
		failed=$((failed + 1))
		continue
	fi
	passed=$((passed + ${line%% passed*}))
	f=${line#*passed, }
	failed=$((failed + ${f%% failed}))
done
[[ $rc_a == 0 && $rc_b == 0 ]] || log "side exit statuses: a=$rc_a b=$rc_b"
log "backend $BACKEND: both sandboxes done in $((SECONDS - t0))s; logs in $LOG_DIR"
echo "$passed passed, $failed failed"
[[ $failed == 0 && $rc_a == 0 && $rc_b == 0 ]]
