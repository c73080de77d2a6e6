#!/usr/bin/env bash
# Host hook of the qos suite, run by run-vm.sh alongside the guest:
#   qos.hook.sh SHARED_DIR SERIAL_LOG
# On the guest's "VMTEST SYNC STEP" lines:
#   metrics     qa's requests waited (volfsd_qos_throttled_requests_total > 0),
#               qb's never did, nothing waits now, and no request of either
#               volume failed but the guest's expected ENOENT
#   lift        volfsd ctl limit qa --none; GET shows no limit
#   after-lift  no request of qa waited since the lift
# Answers with SHARE/qb/.acks/STEP ("ok" or "fail: ..."); PASS/FAIL lines go
# to $VMTEST_LOG_DIR/qos-hook-results.log (qos.host.sh reports them).
set -uo pipefail

S=${1:?usage: qos.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: qos.hook.sh SHARED_DIR SERIAL_LOG}
W=${VMTEST_WORK:?}
VOLFSD=${VMTEST_DAEMON:?}
SOCK=$W/ctl.sock
RESULTS=$VMTEST_LOG_DIR/qos-hook-results.log
: >"$RESULTS"

HOOK_NAME=qos-hook
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"
ctl() { "$VOLFSD" ctl "$@" --control-socket "$SOCK"; }

ack() { ack_in "$S/qb" "$1"; } # ack STEP: "ok", or the checks of this step that failed

# metric NAME LABELS: the value of one sample (0 if absent)
metric() {
	local v
	v=$(grep -F "$1{$2}" <<<"$METRICS" | awk '{print $2}' | head -n 1)
	echo "${v:-0}"
}

# errors VOLUME: the volume's failed requests, ENOENT (the guest's own checks)
# left out
errors() {
	grep -F "volfsd_request_errors_total{volume=\"$1\"," <<<"$METRICS" |
		grep -v 'errno="ENOENT"' | awk '{s += $2} END {print s + 0}'
}

THROTTLED_AT_LIFT=""

step() {
	FAILS=""
	log "step: $1"
	METRICS=$(ctl metrics 2>&1)
	case "$1" in
	metrics)
		local qa qb waiting errs
		qa=$(metric volfsd_qos_throttled_requests_total 'volume="qa"')
		qb=$(metric volfsd_qos_throttled_requests_total 'volume="qb"')
		waiting=$(metric volfsd_qos_waiting_requests 'volume="qa"')
		info "qa: $qa requests waited, $(metric volfsd_qos_wait_seconds_total 'volume="qa"') s in all; limit $(metric volfsd_qos_limit_requests_per_second 'volume="qa"') requests/s, $(metric volfsd_qos_limit_bytes_per_second 'volume="qa"') bytes/s"
		if awk -v n="$qa" 'BEGIN {exit !(n > 0)}'; then pass host-qa-requests-waited; else fail host-qa-requests-waited "volfsd_qos_throttled_requests_total{volume=\"qa\"} is $qa"; fi
		if [[ $qb == 0 ]]; then pass host-qb-never-waited; else fail host-qb-never-waited "qb: $qb requests waited"; fi
		if [[ $waiting == 0 ]]; then pass host-nothing-left-waiting; else fail host-nothing-left-waiting "qa: $waiting requests waiting"; fi
		errs=$(( $(errors qa) + $(errors qb) ))
		if [[ $errs == 0 ]]; then pass host-no-request-failed; else fail host-no-request-failed "$errs failed requests: $(grep -F volfsd_request_errors_total <<<"$METRICS" | grep -v ' 0$' | tr '\n' ' ')"; fi
		ack "$1"
		;;
	lift)
		THROTTLED_AT_LIFT=$(metric volfsd_qos_throttled_requests_total 'volume="qa"')
		local out
		if out=$(ctl limit qa --none 2>&1) && [[ $out == *unlimited* ]] &&
			! ctl --json stats qa | grep -q rate_limiter; then
			pass host-limit-lifted
		else
			fail host-limit-lifted "volfsd ctl limit qa --none: $out"
		fi
		ack "$1"
		;;
	after-lift)
		local now
		now=$(metric volfsd_qos_throttled_requests_total 'volume="qa"')
		if [[ -n $THROTTLED_AT_LIFT && $now == "$THROTTLED_AT_LIFT" ]]; then
			pass host-nothing-waited-after-lift
		else
			fail host-nothing-waited-after-lift "throttled count $THROTTLED_AT_LIFT at the lift, $now after"
		fi
		ack "$1"
		;;
	*) log "unknown step '$1'" ;;
	esac
}

trap 'exit 0' TERM INT
follow_sync_steps
