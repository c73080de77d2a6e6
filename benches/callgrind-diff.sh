#!/usr/bin/env bash
# Instructions per request of the daemon, per function: callgrind under two runs of
# the load generator (N1 and N2 requests of one workload, 1 queue, QD 32), their
# difference divided by N2 - N1, so start-up and preparation cancel out. Counted
# instructions are the same on a busy or a quiet machine (docs/PROFILING.md).
#
# valgrind 3.19 has no open_tree, which the daemon's private mount of each volume
# needs: the daemon profiled is built from COMMIT (default HEAD) in a temporary
# worktree with benches/callgrind-no-mount.patch applied (the private mount falls
# back to the share itself when VOLFSD_PROFILING_NO_MOUNT is set). That build is for
# profiling only; the patch is never applied to the daemon that ships.
#
# Usage: benches/callgrind-diff.sh WORKLOAD [--commit REV] [--n1 5000] [--n2 25000]
#                                  [--out DIR] [--inclusive]
# Prints the total and the functions of more than 15 instructions per request.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
WORKLOAD=${1:?usage: callgrind-diff.sh WORKLOAD [--commit REV] [--n1 N] [--n2 N]}
shift
COMMIT=HEAD N1=5000 N2=25000 OUT=$REPO/build/callgrind INCL=""
while [[ $# -gt 0 ]]; do
	case "$1" in
	--commit) COMMIT=${2:?}; shift ;;
	--n1) N1=${2:?}; shift ;;
	--n2) N2=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--inclusive) INCL=incl ;;
	*) echo "callgrind-diff: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
command -v valgrind >/dev/null || { echo "callgrind-diff: needs valgrind (apt install valgrind)" >&2; exit 2; }
rev=$(git -C "$REPO" rev-parse --short "$COMMIT")
WT=/var/tmp/volfsd-callgrind-$rev
BIN=$WT/target/release/volfsd
if [[ ! -x $BIN ]]; then
	rm -rf "$WT"
	git -C "$REPO" worktree add --detach "$WT" "$rev" >/dev/null
	git -C "$WT" apply "$HERE/callgrind-no-mount.patch"
	(cd "$WT" && cargo build --release -q -p volfsd --bin volfsd)
fi
LOADGEN=$REPO/target/release/volfsd-loadgen
[[ -x $LOADGEN ]] || (cd "$REPO" && cargo build --release -q -p volfsd-harness --bin volfsd-loadgen)
mkdir -p "$OUT"
D=/var/tmp/volfsd-callgrind-run
SHARE=$D/share SOCK=$D/s.sock
mkdir -p "$SHARE"
dargs=(--socket-path="$SOCK" --shared-dir="$SHARE" --cache=none --log-level=warn
	--num-request-queues=1 --sandbox none --seccomp none)
lg=("$LOADGEN" --socket "$SOCK" --shared-dir "$SHARE" --queues 1 --qd 32 --file-size 256M
	--files 10000 --workload "$WORKLOAD" --keep-files --quiet)
wait_socket() { for _ in $(seq 3000); do [[ -S $SOCK ]] && return 0; sleep 0.02; done; return 1; }
# The files, prepared once without valgrind.
rm -f "$SOCK"
VOLFSD_PROFILING_NO_MOUNT=1 "$BIN" "${dargs[@]}" >/dev/null 2>&1 &
wait_socket
"${lg[@]}" --ops 1000 >/dev/null 2>&1
wait
for n in "$N1" "$N2"; do
	rm -f "$SOCK"
	VOLFSD_PROFILING_NO_MOUNT=1 valgrind --tool=callgrind \
		--callgrind-out-file="$OUT/$rev-$WORKLOAD-$n.out" "$BIN" "${dargs[@]}" \
		>"$OUT/$rev-$WORKLOAD-$n.log" 2>&1 &
	wait_socket
	"${lg[@]}" --ops "$n" >/dev/null 2>&1
	wait || true
done
echo "callgrind-diff: $WORKLOAD, commit $rev, ($N2 - $N1) requests; instructions per request:"
python3 "$HERE/callgrind_diff.py" "$OUT/$rev-$WORKLOAD-$N1.out" "$OUT/$rev-$WORKLOAD-$N2.out" \
	$((N2 - N1)) $INCL | sed "s#$BIN#volfsd#"
