#!/usr/bin/env bash
# Host hook of the control suite, run by run-vm.sh alongside the guest:
#   control.hook.sh SHARED_DIR SERIAL_LOG
# Plays the node agent with `volfsd ctl` when the guest prints
# "VMTEST SYNC STEP" on its console. The guest's root is virtual and not
# writable, so the console is the only way from the guest to the host; the
# way back is an ack file written into the data volume's host directory
# (VOL_DATA/.acks/STEP: "ok" or "fail: why"), which the guest sees while data
# is attached, or the effect itself (a volume appearing or disappearing).
# Host-side checks go to $VMTEST_LOG_DIR/control-hook-results.log as
# "VMTEST PASS|FAIL|INFO" lines; control.host.sh reports them.
set -uo pipefail

S=${1:?usage: control.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: control.hook.sh SHARED_DIR SERIAL_LOG}
W=${VMTEST_WORK:?}
VOLFSD=${VMTEST_DAEMON:?}
PID=${VMTEST_DAEMON_PID:?}
SOCK=$W/ctl.sock
DATA=$W/vol-data
MODELS=$W/vol-models
RESULTS=$VMTEST_LOG_DIR/control-hook-results.log
: >"$RESULTS"

HOOK_NAME=control-hook
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"
ctl() { "$VOLFSD" ctl "$@" --control-socket "$SOCK"; }

ack() { ack_in "$DATA" "$1"; } # ack STEP: "ok", or the checks of this step that failed

# field JSON NAME: a numeric field of a volume's JSON
field() { grep -o "\"$2\":[0-9]*" <<<"$1" | head -n 1 | cut -d: -f2; }

# Daemon fds whose file lies in DIR's tree (compared by device and inode, so
# it also counts fds reached through private clones of the bind mount).
fds_into() { # fds_into DIR
	local inodes fd n=0
	inodes=$(find "$1" -xdev -printf '%D:%i\n' 2>/dev/null | sort -u)
	for fd in /proc/"$PID"/fd/*; do
		grep -qxF "$(stat -L -c '%d:%i' "$fd" 2>/dev/null)" <<<"$inodes" && n=$((n + 1))
	done
	echo "$n"
}

is_mounted() { mountpoint -q "$1" 2>/dev/null; }

attach() { # attach NAME HOST_DIR [CHECK-SUFFIX] [--read-only]
	local out check=host-ctl-${3:-attach-$1}
	if out=$(ctl attach "$1" --bind "$2" "${@:4}" 2>&1); then
		pass "$check"
		info "ctl attach $1: $out"
	else
		fail "$check" "$out"
	fi
}

# stats_check NAME WHAT: counters of volume NAME after the guest's I/O
stats_check() { # stats_check LABEL NAME read|write|ro
	local label=$1 name=$2 kind=$3 js r w e
	js=$(ctl stats "$name" --json 2>&1) || { fail "$label" "ctl stats $name: $js"; return; }
	r=$(field "$js" bytes_read) w=$(field "$js" bytes_written) e=$(field "$js" errors)
	info "ctl stats $name --json: $js"
	case "$kind" in
	rw) [[ ${r:-0} -gt 0 && ${w:-0} -gt 0 ]] && pass "$label" ||
		fail "$label" "$name: bytes_read=$r bytes_written=$w, both must be > 0" ;;
	ro) [[ ${r:-0} -gt 0 && ${w:-x} == 0 && ${e:-0} -gt 0 ]] && pass "$label" ||
		fail "$label" "$name: bytes_read=$r (want > 0) bytes_written=$w (want 0) errors=$e (want > 0: EROFS refusals)" ;;
	esac
}

step() {
	local out n before after
	FAILS=""
	log "step: $1"
	case "$1" in
	attach-data)
		attach data "$DATA"
		ack "$1"
		;;
	check-data-write)
		out=$(cat "$DATA/guest-wrote.txt" 2>&1)
		[[ $out == "written by the guest" ]] && pass host-sees-guest-write ||
			fail host-sees-guest-write "host reads '$out' from guest-wrote.txt"
		ack "$1"
		;;
	attach-models)
		attach models "$MODELS" attach-models --read-only
		ack "$1"
		;;
	stats-1)
		stats_check host-stats-data-moved data rw
		stats_check host-stats-models-ro models ro
		info "ctl list: $(ctl list 2>&1 | tr '\n' '|')"
		ack "$1"
		;;
	detach-data)
		out=$(ctl stats data --json 2>&1)
		info "before detach: open_handles=$(field "$out" open_handles) live_inodes=$(field "$out" live_inodes)"
		before=$(fds_into "$DATA")
		if out=$(ctl detach data 2>&1); then
			pass host-ctl-detach-data-while-open
		else
			fail host-ctl-detach-data-while-open "$out"
		fi
		info "ctl detach data: $out"
		if is_mounted "$S/data"; then
			fail host-detach-unmounted "$S/data is still a mount point after ctl detach"
			out=$(umount "$S/data" 2>&1) && info "plain umount $S/data: ok" ||
				fail host-plain-umount-after-detach "umount $S/data: $out"
		else
			pass host-detach-unmounted
			info "$S/data after ctl detach: $([[ -e $S/data ]] && echo 'directory left (not a mount)' || echo removed)"
		fi
		# The daemon must have let go of every fd into the volume.
		for n in $(seq 50); do
			after=$(fds_into "$DATA")
			[[ $after == 0 ]] && break
			sleep 0.1
		done
		info "daemon fds into the data volume: $before before detach, $after after"
		if [[ $before -gt 0 && $after == 0 ]]; then
			pass host-daemon-released-data-fds
		else
			fail host-daemon-released-data-fds "daemon fds into the data volume: $before before detach (want > 0), $after after (want 0): $(ls -l /proc/"$PID"/fd | tail -n +2 | awk '{print $NF}' | tr '\n' ' ')"
		fi
		# A fresh bind + umount cycle on the same path: nothing keeps it busy.
		mkdir -p "$S/data"
		if out=$(mount --bind "$DATA" "$S/data" 2>&1 && umount "$S/data" 2>&1); then
			pass host-bind-umount-cycle-after-detach
		else
			fail host-bind-umount-cycle-after-detach "$out"
			umount -l "$S/data" 2>/dev/null
		fi
		rmdir "$S/data" 2>/dev/null
		out=$(ctl list 2>&1)
		info "ctl list after detach: $(tr '\n' '|' <<<"$out")"
		grep -qw data <<<"$(awk 'NR > 1 {print $1}' <<<"$out")" &&
			fail host-list-after-detach "data still listed" || pass host-list-after-detach
		;;
	reattach-data)
		# New host content before the volume comes back.
		printf 'data-v2\n' >"$DATA/hello.txt"
		printf 'new on the host\n' >"$DATA/v2.txt"
		rm -f "$DATA/guest-wrote.txt"
		attach data "$DATA" reattach-data
		ack "$1"
		;;
	stats-2)
		stats_check host-stats-data-after-reattach data rw
		out=$(cat "$DATA/guest-wrote-2.txt" 2>&1)
		[[ $out == "after reattach" ]] && pass host-sees-write-after-reattach ||
			fail host-sees-write-after-reattach "host reads '$out'"
		info "ctl list: $(ctl list 2>&1 | tr '\n' '|')"
		ack "$1"
		;;
	detach-all)
		for n in data models; do
			if out=$(ctl detach "$n" 2>&1); then pass "host-ctl-detach-$n-final"; else fail "host-ctl-detach-$n-final" "$out"; fi
		done
		out=$(awk -v d="$S" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo)
		[[ -z $out ]] && pass host-no-mounts-after-detach || fail host-no-mounts-after-detach "still mounted: $out"
		;;
	*) log "unknown step '$1'" ;;
	esac
}

trap 'exit 0' TERM INT
follow_sync_steps
