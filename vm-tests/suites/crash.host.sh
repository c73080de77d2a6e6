#!/usr/bin/env bash
# Host side of the crash suite, run by run-vm.sh after the VM exited:
#   crash.host.sh SHARED_DIR
# Reports the hook's checks; then: every kill was taken over and logged, no
# daemon process panicked, the guest's EIO total equals the daemon's count of the
# requests it failed (volfsd_keeper_requests_failed_total), every record the
# guest was told is fsynced is in the file on the host, and the pauses.
set -uo pipefail

S=${1:?usage: crash.host.sh SHARED_DIR}
C=$S/crash
RESULTS=$VMTEST_LOG_DIR/crash-hook-results.log
PAUSES=$VMTEST_LOG_DIR/crash-pauses.txt
DLOG=$VMTEST_LOG_DIR/daemon.log
N=${VMTEST_CRASHES:-20}

if [[ -s $RESULTS ]]; then
	cat "$RESULTS"
else
	echo "VMTEST FAIL host-hook-results: crash.hook.sh left no results in $RESULTS"
fi
ran=$(grep -cE '^VMTEST (PASS|FAIL) crash-[0-9]+' "$RESULTS" 2>/dev/null || true)
if [[ $ran == "$N" ]]; then
	echo "VMTEST PASS host-all-crashes-ran"
else
	echo "VMTEST FAIL host-all-crashes-ran: $ran crash checks, want $N"
fi
took=$(grep -c 'took over its rings and the guest' "$DLOG" || true)
if [[ $took == "$N" ]]; then
	echo "VMTEST PASS host-keeper-took-over-every-time"
else
	echo "VMTEST FAIL host-keeper-took-over-every-time: $took take-overs in $DLOG, want $N"
fi
if grep -qiE 'panick|panic' "$DLOG"; then
	echo "VMTEST FAIL host-daemon-no-panic: $(grep -iE 'panic' "$DLOG" | head -n 2 | tr '\n' ' ')"
else
	echo "VMTEST PASS host-daemon-no-panic"
fi
metric() { sed -n "s/^$1 //p" "$VMTEST_LOG_DIR/metrics.txt" 2>/dev/null; }
failed=$(metric volfsd_keeper_requests_failed_total)
rerun=$(metric volfsd_keeper_requests_rerun_total)
guest=$(cat "$C/guest-eio" 2>/dev/null)
echo "VMTEST INFO requests in flight at the kills: $rerun run again, $failed answered EIO; the guest got $guest EIO"
if [[ -n $failed && $failed == "$guest" ]]; then
	echo "VMTEST PASS host-guest-eio-matches-the-daemons-count"
else
	echo "VMTEST FAIL host-guest-eio-matches-the-daemons-count: the guest got '$guest' EIO, the daemon failed '$failed' requests"
fi
done_n=$(cat "$C/durable.done" 2>/dev/null || echo 0)
bad=$(python3 - "$C/durable" "$done_n" <<'PY'
import sys
path, n = sys.argv[1], int(sys.argv[2])
data = open(path, "rb").read()
bad = [r for r in range(1, n + 1)
       if not data[r * 64:(r + 1) * 64].startswith(b"record %d " % r)]
print(len(bad), bad[:5])
PY
)
if [[ $done_n -gt 0 && $bad == "0 []" ]]; then
	echo "VMTEST PASS host-every-fsynced-record-is-there"
	echo "VMTEST INFO $done_n records fsynced, every one on the host"
else
	echo "VMTEST FAIL host-every-fsynced-record-is-there: $done_n fsynced, missing or wrong: $bad"
fi
if [[ $(cat "$C/after-crashes" 2>/dev/null) == "crashes done" ]]; then
	echo "VMTEST PASS host-sees-the-guests-last-write"
else
	echo "VMTEST FAIL host-sees-the-guests-last-write: crash/after-crashes is '$(cat "$C/after-crashes" 2>&1)'"
fi
if [[ -s $PAUSES ]]; then
	sort -n -k2 "$PAUSES" | awk '{a[NR] = $2} END {
		printf "VMTEST INFO recovery pauses (ms, from the kill to the rings running again) over %d crashes: min %d p50 %d max %d\n", NR, a[1], a[int((NR + 1) / 2)], a[NR] }'
	echo "VMTEST INFO pauses in order: $(awk '{printf "%s ", $2}' "$PAUSES")"
fi
