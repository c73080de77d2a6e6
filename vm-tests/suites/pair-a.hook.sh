#!/usr/bin/env bash
# Host hook of sandbox A in the two-sandbox suite (pair-a.sh), run by run-vm.sh
# alongside A's guest: pair-a.hook.sh SHARED_DIR SERIAL_LOG
# On "VMTEST SYNC kill-vmm" it kills A's QEMU with SIGKILL, as a crashed or
# OOM-killed VMM would go, and writes the marker vol/.pair/a-killed that B waits
# for (B then checks that A's locks are released).
set -uo pipefail

S=${1:?usage: pair-a.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: pair-a.hook.sh SHARED_DIR SERIAL_LOG}
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"

HOOK_NAME=pair-a-hook

step() {
	local pid
	case "$1" in
	kill-vmm)
		pid=$(cat "${VMTEST_WORK:?}/vmm.pid" 2>/dev/null) || { log "no vmm.pid"; return; }
		log "killing A's QEMU (pid $pid) with SIGKILL"
		kill -KILL "$pid" 2>/dev/null || { log "kill $pid failed"; return; }
		# Marked at once: run-vm.sh stops this hook as soon as it sees the VM
		# gone, which may be before a wait here would end. A SIGKILL is not
		# refused, and B gives the lock release 30 s to arrive.
		printf 'killed\n' >"$S/vol/.pair/.a-killed.tmp" && mv "$S/vol/.pair/.a-killed.tmp" "$S/vol/.pair/a-killed"
		log "SIGKILL sent; wrote a-killed"
		;;
	*) log "unknown step: $1" ;;
	esac
}

follow_sync_steps
