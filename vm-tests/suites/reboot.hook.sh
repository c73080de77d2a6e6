#!/usr/bin/env bash
# Host hook of the reboot suite, run by run-vm.sh alongside the guest (across
# both boots): reboot.hook.sh SHARED_DIR SERIAL_LOG
# On the guest's "VMTEST SYNC STEP" lines it checks from the host whether the
# lock holder's locks on SHARE/reboot/locked-file are held, with the host
# build of fsops (reboot.setup.sh): a POSIX write lock (fcntl F_SETLK, which
# conflicts with the daemon's OFD locks) and an flock, both non-blocking.
#   locks-held  (boot 1, lock holder running)     both must be refused (EAGAIN)
#   check-free  (boot 2, before the guest locks)  both must be granted
# Answers with SHARE/reboot/.acks/STEP ("ok" or "fail: ..."); its PASS/FAIL
# lines go to $VMTEST_LOG_DIR/reboot-hook-results.log (reboot.host.sh reports).
set -uo pipefail

S=${1:?usage: reboot.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: reboot.hook.sh SHARED_DIR SERIAL_LOG}
FSOPS=${VMTEST_WORK:?}/fsops-host
PID=${VMTEST_DAEMON_PID:?}
F=$S/reboot/locked-file
RESULTS=$VMTEST_LOG_DIR/reboot-hook-results.log
: >"$RESULTS"

HOOK_NAME=reboot-hook
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"

ack() { ack_in "$S/reboot" "$1"; } # ack STEP: "ok", or the checks of this step that failed

# lock_check NAME posix|flock WANT: the host's non-blocking attempt must end in WANT
lock_check() {
	local got
	got=$("$FSOPS" -e trylock "$2" "$F" 2>&1)
	if [[ $got == "$3" ]]; then
		pass "$1"
	elif [[ $3 == OK ]]; then
		fail "$1" "the host cannot take a $2 lock on the file ($got): the lock of the guest's first boot is still held"
	else
		fail "$1" "the host's $2 lock attempt got $got, want $3 (the guest's lock is not held on the host)"
	fi
}

# The host's view of the file's locks and the daemon's fds on it.
lock_info() {
	local ino locks fds=0 fd want
	ino=$(stat -c %i "$F" 2>/dev/null) || return 0
	locks=$(grep -E ":$ino " /proc/locks | awk '{print $2, $3, $4}' | paste -sd';')
	want=$(stat -L -c '%d:%i' "$F")
	for fd in /proc/"$PID"/fd/*; do
		[[ $(stat -L -c '%d:%i' "$fd" 2>/dev/null) == "$want" ]] && fds=$((fds + 1))
	done
	info "$1: /proc/locks for the file: ${locks:-none}; daemon fds on it: $fds"
}

step() {
	FAILS=""
	log "step: $1"
	case "$1" in
	locks-held)
		lock_info "boot 1"
		lock_check host-posix-lock-held-boot1 posix EAGAIN
		lock_check host-flock-held-boot1 flock EAGAIN
		ack "$1"
		;;
	check-free)
		lock_info "boot 2"
		lock_check host-posix-lock-free-after-reboot posix OK
		lock_check host-flock-free-after-reboot flock OK
		ack "$1"
		;;
	*) log "unknown step '$1'" ;;
	esac
}

trap 'exit 0' TERM INT
follow_sync_steps
