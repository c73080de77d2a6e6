#!/usr/bin/env bash
# Host side of the qos suite, run by run-vm.sh after the VM exited:
#   qos.host.sh SHARED_DIR
# Reports qos.hook.sh's checks, and checks the host's copy of what the guest
# wrote to the throttled volume.
set -uo pipefail

S=${1:?usage: qos.host.sh SHARED_DIR}
RESULTS=$VMTEST_LOG_DIR/qos-hook-results.log

if [[ -s $RESULTS ]]; then
	cat "$RESULTS"
else
	echo "VMTEST FAIL host-hook-results: qos.hook.sh left no results in $RESULTS"
fi
for name in host-qa-requests-waited host-qb-never-waited host-nothing-left-waiting \
	host-no-request-failed host-limit-lifted host-nothing-waited-after-lift; do
	grep -qE "^VMTEST (PASS|FAIL) $name(:|$)" "$RESULTS" 2>/dev/null ||
		echo "VMTEST FAIL $name: the hook never ran this check"
done
want=$(cat "$S/qa/w.sha" 2>/dev/null)
got=$(sha256sum "$S/qa/w.bin" 2>/dev/null | cut -d' ' -f1)
if [[ -n $want && $got == "$want" ]]; then
	echo "VMTEST PASS host-throttled-write-landed"
else
	echo "VMTEST FAIL host-throttled-write-landed: host sha '$got', guest wrote '$want'"
fi
if grep -qiE 'panick|panic' "$VMTEST_LOG_DIR/daemon.log"; then
	echo "VMTEST FAIL host-daemon-no-panic: $(grep -iE 'panic' "$VMTEST_LOG_DIR/daemon.log" | head -n 2 | tr '\n' ' ')"
else
	echo "VMTEST PASS host-daemon-no-panic"
fi
