#!/usr/bin/env bash
# Host hook of sandbox A in the two-sandbox suite (pair-a.sh), run by run-vm.sh
# alongside A's guest: pair-a.hook.sh SHARED_DIR SERIAL_LOG
# On "VMTEST SYNC kill-vmm" it kills A's QEMU with SIGKILL, as a crashed or
# OOM-killed VMM would go, waits until it is gone, and then writes the marker
# vol/.pair/a-killed that B waits for (B then checks A's locks were released).
set -uo pipefail

S=${1:?usage: pair-a.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: pair-a.hook.sh SHARED_DIR SERIAL_LOG}
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"

log() { echo "pair-a-hook: $*"; }

step() {
	local pid i
	case "$1" in
	kill-vmm)
		pid=$(cat "${VMTEST_WORK:?}/vmm.pid" 2>/dev/null) || { log "no vmm.pid"; return; }
		log "killing A's QEMU (pid $pid) with SIGKILL"
		kill -KILL "$pid" 2>/dev/null
		for i in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && { log "QEMU $pid still alive 10 s after SIGKILL"; return; }
		printf 'killed\n' >"$S/vol/.pair/.a-killed.tmp" && mv "$S/vol/.pair/.a-killed.tmp" "$S/vol/.pair/a-killed"
		log "QEMU gone; wrote a-killed"
		;;
	*) log "unknown step: $1" ;;
	esac
}

follow_sync_steps
