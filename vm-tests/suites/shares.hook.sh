#!/usr/bin/env bash
# Host hook of the shares suite, run by run-vm.sh alongside the guest:
#   shares.hook.sh SHARED_DIR SERIAL_LOG
# Follows the guest's "VMTEST SYNC STEP" console lines:
#   rename-start  rename a/d1 -> a/d2 -> a/d1 ... on the host, every 0.1 s
#   rename-stop   stop, leave the directory as a/d1, write a/.renames-done
#                 (the guest waits for it) holding the number of renames
set -uo pipefail

S=${1:?usage: shares.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: shares.hook.sh SHARED_DIR SERIAL_LOG}
A=$S/a
STOP=${VMTEST_WORK:-/tmp}/shares-stop-renames
LOOP_PID=""

HOOK_NAME=shares-hook # log() comes from hook-lib.sh

rename_loop() {
	local n=0
	while [[ ! -e $STOP ]]; do
		if [[ -d $A/d1 ]]; then
			mv -T "$A/d1" "$A/d2" || log "mv d1 d2 failed"
		else
			mv -T "$A/d2" "$A/d1" || log "mv d2 d1 failed"
		fi
		n=$((n + 1))
		sleep 0.1
	done
	echo "$n" >"$STOP.count"
}

stop_loop() {
	[[ -n $LOOP_PID ]] || return 0
	touch "$STOP"
	wait "$LOOP_PID" 2>/dev/null
	LOOP_PID=""
	[[ -d $A/d2 && ! -e $A/d1 ]] && mv -T "$A/d2" "$A/d1"
}

step() {
	log "step: $1"
	case "$1" in
	rename-start)
		rm -f "$STOP" "$STOP.count" "$A/.renames-done"
		rename_loop &
		LOOP_PID=$!
		;;
	rename-stop)
		stop_loop
		local n
		n=$(cat "$STOP.count" 2>/dev/null || echo "?")
		log "renamed $n times; now: $(ls "$A" | tr '\n' ' ')"
		echo "$n" >"$A/.renames-done.tmp" && mv "$A/.renames-done.tmp" "$A/.renames-done"
		;;
	*) log "unknown step '$1'" ;;
	esac
}

trap 'stop_loop; exit 0' TERM INT
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"
follow_sync_steps
