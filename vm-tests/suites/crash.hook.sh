#!/usr/bin/env bash
# Host hook of the crash suite, run by run-vm.sh alongside the guest:
#   crash.hook.sh SHARED_DIR SERIAL_LOG
# On the guest's "VMTEST SYNC workload-running" (fio with verify, a metadata loop,
# fsynced records: suites/crash.sh):
#   volfsd: VMTEST_CRASHES (default 20) times, every VMTEST_CRASH_INTERVAL
#     seconds (default 2): SIGKILL to the serving process (the sandboxed one, below
#     the keeper and the namespace supervisor). Each must be taken over (the
#     keeper's "took over its rings" line, within 10 s), by a new process, and the
#     guest's metadata loop must go on. Then /metrics (the daemon's count of the
#     requests it failed with EIO) into the log dir, and the stop file.
#   virtiofsd (observe mode, vm-tests/run-crash-compare.sh): one SIGKILL, then 60 s
#     of watching what the guest does (its progress file, QEMU, its console);
#     the observations go to crash-observed.txt, and the VM is ended.
# PASS/FAIL lines go to $VMTEST_LOG_DIR/crash-hook-results.log (crash.host.sh
# reports them); each recovery's pause to $VMTEST_LOG_DIR/crash-pauses.txt.
set -uo pipefail

S=${1:?usage: crash.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: crash.hook.sh SHARED_DIR SERIAL_LOG}
WORK=${VMTEST_WORK:?}
CTL=$WORK/ctl.sock
LAUNCHED=${VMTEST_DAEMON_LAUNCHED_PID:?}
DLOG=$VMTEST_LOG_DIR/daemon.log
C=$S/crash
N=${VMTEST_CRASHES:-20}
INTERVAL=${VMTEST_CRASH_INTERVAL:-2}
RESULTS=$VMTEST_LOG_DIR/crash-hook-results.log
PAUSES=$VMTEST_LOG_DIR/crash-pauses.txt
OBSERVED=$VMTEST_LOG_DIR/crash-observed.txt
: >"$RESULTS"
: >"$PAUSES"
FAILS=""

HOOK_NAME=crash-hook
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"

# The serving process: down the line of only children from the launched process
# (keeper -> namespace supervisor -> serving process).
serving() {
	local pid=$LAUNCHED kids
	while :; do
		kids=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null || true)
		[[ $(wc -w <<<"$kids") == 1 ]] || break
		pid=${kids// /}
	done
	echo "$pid"
}

progress() { cat "$C/meta/progress" 2>/dev/null || echo 0; }
durable_bytes() { stat -c %s "$C/durable" 2>/dev/null || echo 0; }

guest_goes_on() { # the metadata loop makes 2 more rounds within 60 s
	local n0 t0=$SECONDS
	n0=$(progress)
	until (($(progress) >= n0 + 2)); do
		((SECONDS - t0 < 60)) || { echo "the metadata loop stayed at round $(progress) for 60 s"; return 1; }
		sleep 0.1
	done
}

took_over() { grep -c 'took over its rings' "$DLOG" 2>/dev/null || true; }

one_crash() { # one_crash I
	local i=$1 name old new t0 line
	name=$(printf 'crash-%02d' "$i")
	old=$(serving)
	if [[ -z $old || $old == "$LAUNCHED" ]]; then
		fail "$name" "no serving process below the keeper $LAUNCHED"
		return
	fi
	t0=$SECONDS
	kill -KILL "$old"
	until (($(took_over) >= i)); do
		if ((SECONDS - t0 > 10)); then
			fail "$name" "not taken over within 10 s: $(tail -n 2 "$DLOG" | tr '\n' ' ' | cut -c1-300)"
			return
		fi
		if ! kill -0 "$LAUNCHED" 2>/dev/null; then
			fail "$name" "the daemon ended: $(tail -n 2 "$DLOG" | tr '\n' ' ' | cut -c1-300)"
			return
		fi
		sleep 0.02
	done
	line=$(grep 'took over its rings' "$DLOG" | tail -n 1)
	echo "$i $(sed -n 's/.*the guest waited \([0-9]*\) ms.*/\1/p' <<<"$line")" >>"$PAUSES"
	new=$(serving)
	if [[ $new == "$old" ]]; then
		fail "$name" "the serving process is still $old"
	elif ! why=$(guest_goes_on); then
		fail "$name" "$why"
	else
		pass "$name"
		info "$name: serving process $old killed, $new took over; the guest waited $(tail -n 1 "$PAUSES" | cut -d' ' -f2) ms"
	fi
}

metrics() { # the daemon's /metrics into the log dir
	curl -s --unix-socket "$CTL" http://volfsd/metrics >"$VMTEST_LOG_DIR/metrics.txt" 2>&1
}

crashes() {
	local i
	sleep 2
	for i in $(seq "$N"); do
		one_crash "$i"
		sleep "$INTERVAL"
	done
	# The requests the last process answered are in its counters by now.
	sleep 2
	metrics || fail metrics "curl: $(cat "$VMTEST_LOG_DIR/metrics.txt")"
	printf 'crashes done\n' >"$C/.stop.tmp" && mv "$C/.stop.tmp" "$C/stop"
}

# virtiofsd: one kill, then what the guest does.
observe() {
	local pid t0 p0 p1 d0 d1 qemu
	pid=$(serving)
	p0=$(progress)
	d0=$(durable_bytes)
	{
		echo "daemon: $("${VMTEST_DAEMON:?}" --version 2>&1 | head -n 1)"
		echo "killed: SIGKILL to $pid at the guest's metadata round $p0"
	} >"$OBSERVED"
	kill -KILL "$pid"
	t0=$SECONDS
	sleep 60
	p1=$(progress)
	d1=$(durable_bytes)
	qemu=$(pgrep -f "qemu-system.*$WORK" | head -n 1)
	{
		echo "60 s later: metadata round $p1 ($((p1 - p0)) rounds since the kill)"
		echo "60 s later: the fsynced records file has $d1 bytes ($((d1 - d0)) more since the kill)"
		echo "60 s later: QEMU $([[ -n $qemu ]] && echo "still runs (pid $qemu)" || echo "has exited")"
		echo "60 s later: the daemon $(kill -0 "$pid" 2>/dev/null && echo runs || echo is gone); nothing restarts it"
		echo "the guest's console since the kill:"
		tr -d '\r' <"$SERIAL" | grep -aE 'crash-monitor|hung|blocked|virtio|fuse' | tail -n 8 | sed 's/^/  /'
		echo "QEMU's log:"
		tail -n 5 "$VMTEST_LOG_DIR/vmm.log" 2>/dev/null | sed 's/^/  /'
	} >>"$OBSERVED"
	info "observed: $(tr '\n' ' ' <"$OBSERVED" | cut -c1-400)"
	[[ -z $qemu ]] || kill "$qemu"
}

step() {
	log "step: $1"
	case "$1" in
	workload-running)
		if "${VMTEST_DAEMON:?}" --version 2>&1 | grep -q virtiofsd; then observe; else crashes; fi
		;;
	*) log "unknown step '$1'" ;;
	esac
}

trap 'exit 0' TERM INT
follow_sync_steps
