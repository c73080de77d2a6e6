#!/usr/bin/env bash
# Host hook of the workloads suite, run by run-vm.sh alongside the guest:
#   workloads.hook.sh SHARED_DIR SERIAL_LOG
# On the guest's "VMTEST SYNC start NAME" and "VMTEST SYNC end NAME" it samples,
# in this order, the host's monotonic clock, the CPU time (utime + stime, in
# clock ticks) of the daemon's whole process tree (the launched process and
# all its descendants: both daemons serve from a sandboxed child) and of QEMU
# (its vCPU threads under TCG included), appends
#   start|end NAME MONOTONIC_S DAEMON_TICKS QEMU_TICKS CLK_TCK
# to $VMTEST_LOG_DIR/workloads-samples.txt, then acks the step in
# SHARE/wl/.acks/start-NAME (end-NAME); the guest waits for that before it
# goes on, so each workload runs between its two samples.
# With VMTEST_WORKLOADS_METRICS=CTL_SOCKET (volfsd with --control-socket; for
# profiling, not in the bench's runs) it also keeps volfsd's /metrics at each
# sample in $VMTEST_LOG_DIR/workloads-metrics/STEP-NAME.prom.
set -uo pipefail

S=${1:?usage: workloads.hook.sh SHARED_DIR SERIAL_LOG}
# shellcheck disable=SC2034 # SERIAL, HOOK_NAME and FAILS are hook-lib.sh's
SERIAL=${2:?usage: workloads.hook.sh SHARED_DIR SERIAL_LOG}
LAUNCHED=${VMTEST_DAEMON_LAUNCHED_PID:?}
SAMPLES=$VMTEST_LOG_DIR/workloads-samples.txt
RESULTS=$VMTEST_LOG_DIR/workloads-hook-results.log
TCK=$(getconf CLK_TCK)
: >"$SAMPLES"
: >"$RESULTS"
FAILS=""

# shellcheck disable=SC2034
HOOK_NAME=workloads-hook
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"

# tree_pids PID: PID and all its descendants (children of every thread)
tree_pids() {
	local pid=$1 kid kids
	echo "$pid"
	kids=$(cat /proc/"$pid"/task/*/children 2>/dev/null || true)
	for kid in $kids; do
		tree_pids "$kid"
	done
}

# cpu_ticks PID...: utime + stime of those processes (all their threads),
# fields 14 and 15 of /proc/PID/stat, counted after the command name's ")"
cpu_ticks() {
	local pid s total=0
	for pid in "$@"; do
		s=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
		s=${s##*) }
		read -r -a f <<<"$s"
		total=$((total + f[11] + f[12]))
	done
	echo "$total"
}

monotonic() { awk '{print $1}' /proc/uptime; }

step() {
	local what=${1%% *} name=${1#* } t dt qt qemu pids
	case "$what" in start | end) ;; *) log "unknown step '$1'"; return ;; esac
	# shellcheck disable=SC2034
	FAILS=""
	qemu=$(cat "$VMTEST_WORK/vmm.pid" 2>/dev/null || true)
	t=$(monotonic)
	mapfile -t pids < <(tree_pids "$LAUNCHED")
	dt=$(cpu_ticks "${pids[@]}")
	qt=0
	[[ -z $qemu ]] || qt=$(cpu_ticks "$qemu")
	echo "$what $name $t $dt $qt $TCK" >>"$SAMPLES"
	if [[ -n ${VMTEST_WORKLOADS_METRICS:-} ]]; then
		mkdir -p "$VMTEST_LOG_DIR/workloads-metrics"
		"$VMTEST_DAEMON" ctl metrics --control-socket "$VMTEST_WORKLOADS_METRICS" \
			>"$VMTEST_LOG_DIR/workloads-metrics/$what-$name.prom" 2>&1 || true
	fi
	log "$what $name: daemon $dt ticks, qemu $qt ticks"
	ack_in "$S/wl" "$what-$name"
}

trap 'exit 0' TERM INT
follow_sync_steps
